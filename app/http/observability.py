"""Structured access logs: one JSON line per request, with its duration.

A small ASGI middleware times each HTTP request and writes one line to the `app.access` logger
(the standard logging module), formatted as JSON so a log shipper can parse it without a regex:

    {"ts": "2025-01-01T12:00:00.123+00:00", "level": "info", "logger": "app.access", "msg": "request",
     "method": "GET", "path": "/api/v1/models", "status": 200, "duration_ms": 3.412, "bytes": 512,
     "client": "127.0.0.1"}

The query string is left out on purpose: it carries the learners' typed text.
uvicorn's own access log is turned off in app/__main__.py so each request is logged once.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS_LOGGER = "app.access"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, plus the record's `fields` dict."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_access_log(level: str) -> logging.Logger:
    """Send `app.access` records at `level` and above to stdout as JSON lines (idempotent)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.setLevel(level.upper())
    # create_app() can run more than once in one process (tests); add the handler only once.
    if not any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
    logger.propagate = False  # the root logger may have a plain-text handler; don't print twice
    return logger


class AccessLogMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware, so streaming responses are not buffered)."""

    def __init__(self, app: ASGIApp, logger_name: str = ACCESS_LOGGER) -> None:
        self.app = app
        self.logger = logging.getLogger(logger_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        # If the app raises before it starts a response, the server error middleware answers 500.
        status = 500
        n_bytes = 0

        async def send_and_record(message: Message) -> None:
            nonlocal status, n_bytes
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                n_bytes += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            client = scope.get("client")
            self.logger.info(
                "request",
                extra={
                    "fields": {
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                        "bytes": n_bytes,
                        "client": client[0] if client else None,
                    }
                },
            )
