"""Gzip that never stalls the event loop, and static files compressed once.

Starlette's GZipMiddleware compresses on the event loop: a 27 MB run response took 1.7 s
at level 1, during which /healthz and every other request waited. Here a large body is
compressed in a worker thread instead. Static files are compressed once, at the highest
level, and kept (keyed by path and ETag), so the 1.5 MB plotly.js costs nothing per request
and transfers smaller than level-1 compression would make it.

Responses are buffered whole before compressing; every response of this app is small
enough for that except the largest run responses, which are bounded by max_hook_values.
"""

from __future__ import annotations

import gzip
import os
from collections import OrderedDict

import anyio
from starlette.datastructures import Headers, MutableHeaders
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COMPRESSIBLE = ("text/", "application/json", "application/javascript", "image/svg+xml")
STREAMED = "text/event-stream"  # sent event by event as it is written
MINIMUM_SIZE = 1000  # below this, the gzip header and round trip cost more than they save
THREAD_THRESHOLD = 256 * 1024  # bodies at least this big are compressed off the event loop
DYNAMIC_LEVEL = 1  # measured: level 9 took 17 s on a 27 MB body for 9 % fewer bytes than level 1
STATIC_LEVEL = 9  # paid once per file and worker
STATIC_CACHE_ENTRIES = 64


class GZipMiddleware:
    def __init__(self, app: ASGIApp, static_prefix: str = "/static/") -> None:
        self.app = app
        self.static_prefix = static_prefix
        self.static_cache: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "gzip" not in Headers(scope=scope).get("accept-encoding", ""):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []
        streaming = False  # Server-Sent Events go out as they come, never buffered nor compressed

        async def buffer(message: Message) -> None:
            nonlocal start, streaming
            if message["type"] == "http.response.start":
                start = message
                streaming = Headers(raw=message["headers"]).get("content-type", "").startswith(STREAMED)
                if streaming:
                    await send(message)
            elif streaming:
                await send(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False) and start is not None:  # the start comes first
                    await self._send_whole(scope, start, b"".join(chunks), send)
            else:
                await send(message)

        await self.app(scope, receive, buffer)

    async def _send_whole(self, scope: Scope, start: Message, body: bytes, send: Send) -> None:
        headers = MutableHeaders(raw=start["headers"])
        compressible = headers.get("content-type", "").startswith(COMPRESSIBLE)
        # no-transform: the body says gzip does not pay for it (the explorer's packed figure data,
        # base64 of float64 bits, shrinks by a quarter at a cost of ~30 ms per MB)
        keep = "no-transform" in headers.get("cache-control", "")
        if (
            len(body) < MINIMUM_SIZE
            or not compressible
            or keep
            or "content-encoding" in headers
            or start["status"] != 200
            and start["status"] < 400
        ):  # not a 206 range or a 304
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        body = await self._compress(scope["path"], headers.get("etag"), body)
        headers["content-encoding"] = "gzip"
        headers["content-length"] = str(len(body))
        headers.add_vary_header("Accept-Encoding")
        await send(start)
        await send({"type": "http.response.body", "body": body})

    async def _compress(self, path: str, etag: str | None, body: bytes) -> bytes:
        if path.startswith(self.static_prefix) and etag:
            key = (path, etag)
            if key not in self.static_cache:
                self.static_cache[key] = await anyio.to_thread.run_sync(gzip.compress, body, STATIC_LEVEL)
                if len(self.static_cache) > STATIC_CACHE_ENTRIES:
                    self.static_cache.popitem(last=False)
            self.static_cache.move_to_end(key)
            return self.static_cache[key]
        if len(body) >= THREAD_THRESHOLD:
            return await anyio.to_thread.run_sync(gzip.compress, body, DYNAMIC_LEVEL)
        return gzip.compress(body, DYNAMIC_LEVEL)


class CachedStaticFiles(StaticFiles):
    """Static files with caching headers: front-end libraries are pinned, so browsers may keep
    them a day; the app's own CSS and JS change with the app, so browsers revalidate them
    (a 304 on an unchanged ETag)."""

    def file_response(self, full_path, stat_result, scope, status_code=200):
        response = super().file_response(full_path, stat_result, scope, status_code)
        vendor = os.path.basename(os.path.dirname(full_path)) == "vendor"
        response.headers["Cache-Control"] = "public, max-age=86400" if vendor else "no-cache"
        return response
