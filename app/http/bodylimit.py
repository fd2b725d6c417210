"""Requests too large to serve, refused with a JSON answer the client can read.

- `BodySizeLimitMiddleware` (plain ASGI): a body over settings.max_body_bytes gets 413. A declared
  Content-Length over the limit is refused before any byte is read; a body without one (chunked)
  is read up to the limit and refused as soon as it passes it, so a client cannot make the server
  buffer more than the limit.
- `UrlLengthLimitMiddleware` (plain ASGI): a URL (path and query string) over settings.max_url_bytes
  gets 414.
- `HttpToolsProtocol`: uvicorn's httptools protocol, changed so that an over-long URL reaches the
  middleware above instead of being answered by uvicorn itself (see the class).

Why the 413 reads the rest of the body before it ends: a client such as urllib or `requests` sends
its whole body before it reads the answer. If the server closed the socket with those bytes still
unread, the kernel would answer them with a TCP reset, and the client would see "connection reset"
instead of the 413. So the answer is sent at once, then the body is read and dropped (up to
LINGER_BYTES, for at most LINGER_S, as nginx's lingering close does), and only then is the response
ended and the connection closed. A client that asked `Expect: 100-continue` has sent no body yet:
reading would invite it to, so it is answered and closed at once.
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornHttpToolsProtocol

from app.http.jsonio import dumps
from app.http.language import _
from app.settings import get_settings

# The protocol class for uvicorn's `http` option (an import string, so worker processes load it too).
HTTP_PROTOCOL = "app.http.bodylimit:HttpToolsProtocol"
# How much of a refused body is read and dropped so the client can read the 413 (see above); a
# client sending more, or for longer, may see a reset.
LINGER_BYTES = 64 * 2**20
LINGER_S = 10.0
# Scope extension set by HttpToolsProtocol: the URL's real length, when it was over the limit.
URL_TOO_LONG = "explorer.url_too_long"


def _error(msg: str, loc: str, type_: str) -> bytes:
    return dumps({"detail": [{"loc": [loc], "msg": msg, "type": type_}]})


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive) -> None:
    """Read and drop what is left of the request body, within LINGER_BYTES and LINGER_S."""
    dropped = 0
    with anyio.move_on_after(LINGER_S):
        while dropped <= LINGER_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            dropped += len(message.get("body", b""))


class BodySizeLimitMiddleware:
    """`larger`: paths that take bigger bodies than max_bytes (a text to train on), with their limits."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = larger or {}

    def limit(self, scope: Scope) -> int:
        return self.larger.get(scope["path"], self.max_bytes)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, body_done: bool = False) -> None:
        msg = _(
            "the request body is larger than this server's limit of {limit:,} bytes: send a shorter text or "
            "fewer hook names"
        ).format(limit=self.limit(scope))
        body = _error(msg, "body", "body_too_large")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        # See the module's docstring: the whole answer now, then the rest of the body is dropped.
        await send({"type": "http.response.body", "body": body, "more_body": True})
        waiting = dict(scope["headers"]).get(b"expect", b"").lower() == b"100-continue"
        if not (body_done or waiting):
            await _drain(receive)
        await send({"type": "http.response.body", "body": b""})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.limit(scope):
                return await self._refuse(scope, receive, send)
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        # No length declared: read the body here, up to the limit, then replay it.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit(scope):
                return await self._refuse(scope, receive, send, body_done=not message.get("more_body", False))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def url_bytes(scope: Scope) -> int:
    """The length of the request target as the client sent it: path, "?" and query string."""
    too_long = scope.get("extensions", {}).get(URL_TOO_LONG)
    if too_long is not None:
        return too_long
    query = scope.get("query_string", b"")
    return len(scope.get("raw_path") or scope["path"].encode()) + (1 + len(query) if query else 0)


class UrlLengthLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            n = url_bytes(scope)
            if n > self.max_bytes:
                msg = _(
                    "the URL is {n:,} bytes, more than this server's limit of {limit:,}: shorten the text, or "
                    "send it in the JSON body of a POST to the /api/v1 endpoint (see /docs)"
                ).format(n=n, limit=self.max_bytes)
                return await _send_json(send, 414, _error(msg, "query", "url_too_long"))
        await self.app(scope, receive, send)


class HttpToolsProtocol(_UvicornHttpToolsProtocol):
    """uvicorn's httptools protocol, with a bound on the URL it keeps.

    uvicorn would buffer a URL of any length and, past 65,535 bytes, answer "Invalid HTTP request
    received." in plain text without calling the app. Here the URL is counted as it arrives; past
    settings.max_url_bytes only the start of its path is kept (no query), and the app gets the real
    length in scope["extensions"], so UrlLengthLimitMiddleware answers 414 in JSON with the
    security headers and an access-log line, like every other refusal.
    """

    KEPT_PATH_BYTES = 1024  # of an over-long URL, for the access log

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._url_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes <= get_settings().max_url_bytes:
            super().on_url(url)
        elif len(self.url) < self.KEPT_PATH_BYTES:
            self.url += url[: self.KEPT_PATH_BYTES - len(self.url)]

    def on_headers_complete(self) -> None:
        if self._url_bytes > get_settings().max_url_bytes:
            self.url = self.url.split(b"?", 1)[0][: self.KEPT_PATH_BYTES] or b"/"
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[URL_TOO_LONG] = self._url_bytes
        super().on_headers_complete()
