"""Two ASGI middlewares that protect every response and the CPU.

- `SecurityHeadersMiddleware` adds a strict Content-Security-Policy and the usual hardening headers
  to every response (pages, JSON, static files, errors), so an XSS that slipped past the templates'
  escaping still could not run script or send data elsewhere.
- `ComputeLimitMiddleware` lets at most `max_concurrent_compute` heavy requests (the ones that run
  a model or a lesson) be in flight per process; the next one waits its turn for at most
  `compute_queue_s`, then gets 503 + Retry-After, so a burst of clicks is served in order while a
  classroom cannot pile up unbounded work, and cheap routes such as /healthz keep answering.

Both are plain ASGI (not BaseHTTPMiddleware): they never buffer a body and add no task per request.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.language import _
from core.threads import lend

# Why each directive:
# - script-src 'self': only our static files run; no inline <script>, no eval (the pages draw
#   figures from data- attributes with static/js, see ARCHITECTURE.md).
# - style-src 'unsafe-inline': Plotly positions its SVG through style attributes and injects a
#   <style> element for its modebar; style cannot run code, so this is the one relaxation.
# - img-src data: blob:: Plotly's "download as PNG" builds the image as a data:/blob: URL.
# - connect-src 'self': htmx and fetch may only talk to this server (no exfiltration).
# - frame-ancestors 'self' (and X-Frame-Options SAMEORIGIN for old browsers): no other site can frame a page
#   (no clickjacking); this site's own can, as a live class's student page frames the teacher's view.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'self'",
        "base-uri 'self'",
        "form-action 'self'",
    ]
)

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "SAMEORIGIN",
}

# The routes that compute (run a model, a lesson, an analysis or a generation): the explorer page "/" itself,
# the circuits page, and these prefixes (the JSON routes and the pages that show them). A generation streamed
# as events holds its slot until its last token. Everything else -- health, static files, docs, the model
# list, the parameter and KV-cache arithmetic, the Write page's form (it checks, the API generates) -- is
# cheap and never limited.
COMPUTE_PATHS = ("/", "/api/v1/run", "/api/v1/generate", "/circuits", "/features", "/attribution")
COMPUTE_PREFIXES = ("/api/v1/lessons/", "/api/v1/analysis/", "/lessons/", "/inspect")


def is_compute(path: str) -> bool:
    """(Training is not limited here: it runs in its own processes, app/training/scheduler.py, and a request only
    queues it; /api/v1/runs... reads files.)"""
    return path in COMPUTE_PATHS or path.startswith(COMPUTE_PREFIXES) or _is_feature_dashboard(path)


def _is_feature_dashboard(path: str) -> bool:
    """GET /api/v1/saes/{name}/features/{index}: its first request scans the SAE's corpus (many model runs)
    and each re-runs the model over its top examples' contexts, so it takes a compute slot."""
    parts = path.split("/")
    return len(parts) == 7 and path.startswith("/api/v1/saes/") and parts[5] == "features"


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                # A route that sets its own value (e.g. a stricter CSP) keeps it.
                extra = [(k, v) for k, v in self._raw if k not in present]
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ComputeLimitMiddleware:
    """At most `limit` compute requests computing at once; the next ones wait, first come first served, for at
    most `queue_s` each, and whoever is still waiting then gets 503 + Retry-After.

    A slot is taken when the request arrives (or its turn comes) and given back when its response starts (or it
    fails); given back while someone waits, it passes straight to the longest waiting, so a newcomer never
    overtakes the queue. Turning the next one away at once refused most of a burst that a moment's wait serves
    (the figures: app/settings.py `compute_queue_s`; tests/security/test_compute_queue.py).

    The count and the queue live in this process and are only touched on the event loop, so they need no lock;
    with several uvicorn workers each has its own limit, which matches each having its own CPU share.
    """

    def __init__(self, app: ASGIApp, limit: int, retry_after_s: int, queue_s: float, lend: int = 1) -> None:
        self.app = app
        self.limit = limit
        self.lend = lend  # threads a request computing alone may use (core.threads.lend; settings.lend_threads)
        self.retry_after_s = retry_after_s
        self.queue_s = queue_s
        self.in_flight = 0
        # Each waiting request's turn: set True when a slot passes to it, False when its wait is over.
        self.waiting: deque[asyncio.Future[bool]] = deque()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_compute(scope["path"]):
            await self.app(scope, receive, send)
            return
        if not await self._take():
            await self._busy(scope, send)
            return
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._give_back()

        async def send_releasing(message: Message) -> None:
            # The computing is over once the response starts (bodies are built, and gzipped, before
            # that): a client that reads its answer slowly must not keep a compute slot.
            if message["type"] == "http.response.start":
                release()
            await send(message)

        # Alone when it starts: its long passes may use the cores nobody else is computing on (a second request
        # arriving meanwhile runs beside it on one thread; the team's pieces are shared out as threads free up).
        try:
            with lend(self.lend if self.in_flight == 1 else 1):
                await self.app(scope, receive, send_releasing)
        finally:
            release()

    async def _take(self) -> bool:
        """A slot now if one is free, else the next one given back within `queue_s`; False if none was."""
        if self.in_flight < self.limit:
            self.in_flight += 1
            return True
        if self.queue_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[bool] = loop.create_future()
        self.waiting.append(turn)

        def give_up() -> None:
            if not turn.done():
                turn.set_result(False)
                self.waiting.remove(turn)

        timer = loop.call_later(self.queue_s, give_up)
        try:
            return await turn
        except asyncio.CancelledError:  # the client went away while waiting
            if turn.done() and not turn.cancelled() and turn.result():
                self._give_back()  # its slot had just passed to it: hand it on
            elif turn in self.waiting:
                self.waiting.remove(turn)
            raise
        finally:
            timer.cancel()

    def _give_back(self) -> None:
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():  # (one cancelled with its request is skipped)
                turn.set_result(True)  # the slot passes on: in_flight stays the same
                return
        self.in_flight -= 1

    async def _busy(self, scope: Scope, send: Send) -> None:
        msg = _(
            "The server is busy: {limit} computations are already running. Please try again in {seconds} s."
        ).format(limit=self.limit, seconds=self.retry_after_s)
        if scope["path"].startswith("/api/"):
            # The same shape as FastAPI's validation errors, so clients read every error alike.
            body = json.dumps({"detail": [{"msg": msg, "type": "server_busy"}]}).encode()
            content_type = b"application/json"
        else:
            body = msg.encode()
            content_type = b"text/plain; charset=utf-8"
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(self.retry_after_s).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def busy_description(limit: int, queue_s: float, retry_after_s: int) -> str:
    """What a compute route's 503 means, as its OpenAPI states it (app/main.py writes it into every one)."""
    return (
        f"The server is busy: all {limit} compute slots (EXPLORER_MAX_CONCURRENT_COMPUTE) stayed taken while this "
        f"request waited its turn for {queue_s:g} s (EXPLORER_COMPUTE_QUEUE_S); try again after Retry-After "
        f"({retry_after_s} s)"
    )


def client_address(request: Request) -> str:
    """Who asked, by address (behind a proxy, the forwarded one: uvicorn's proxy headers): what the
    per-client training limits count by."""
    return request.client.host if request.client else "unknown"
