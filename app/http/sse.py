"""Server-Sent Events: every event stream of the app framed one way (a training run's progress, a
generation's steps, and whatever streams next).

A route hands `event_stream` an async iterator of `(id, event, data)` and gets a StreamingResponse:

    async def source():
        yield "7", "step", {"token": "the"}      # id: 7 / event: step / data: {"token":"the"}
        yield None, "end", {}                    # an event without an id leaves the client's last id as it was

    return event_stream(source())

`data` that is a `str` is written as it is, one `data:` line per line (the client joins them with
newlines); anything else is written as JSON (app/http/jsonio.py: NumPy arrays, -inf and NaN as null).
Every stream carries the same headers: no caching, and no buffering by a proxy (nginx's
`X-Accel-Buffering: no`; Caddy flushes event streams by itself), so each event reaches the client
when it is written. When the source has been quiet for `keepalive_s`, a comment line keeps proxies
and load balancers from closing the connection as idle.

Where a client resumes is one dependency, `ResumeFrom`: the `Last-Event-ID` header EventSource sends
when it reconnects, or, for a new connection (which cannot set that header), the `since` query.
The source decides when to stop (a client gone, the run finished); the stream closes the source when
the response ends.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterable, AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Query
from fastapi.responses import StreamingResponse

from app.http.jsonio import dumps

MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE_S = 15.0  # under the idle timeouts of common proxies (nginx's 60 s, AWS load balancers' 60 s)
KEEPALIVE = b": keep-alive\n\n"

Event = tuple[str | None, str, object]  # (id or None, event name, data)

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what the SSE parser splits a stream on


def frame(id: str | None, event: str, data: object) -> bytes:
    """One event as the stream's bytes. The id and the name are the server's own words (a counter, a
    cursor, an event's name), never a user's text: a line break in them could not be framed."""
    if isinstance(data, str):
        # split as the client splits (\r\n, \r or \n), so each line comes back, a trailing empty one too
        body = b"".join(b"data: %s\n" % line.encode() for line in _LINE_BREAK.split(data))
    else:
        body = b"data: %s\n" % dumps(data)  # JSON has no raw line break
    head = b"id: %s\n" % id.encode() if id is not None else b""
    return head + b"event: %s\n" % event.encode() + body + b"\n"


_END = object()


async def _next(events: AsyncIterator[Event]) -> object:
    try:
        return await anext(events)
    except StopAsyncIteration:
        return _END


async def framed(
    events: AsyncIterable[Event], *, retry_ms: int | None = None, keepalive_s: float = KEEPALIVE_S
) -> AsyncIterator[bytes]:
    """The stream's bytes: `retry` first when given (how long EventSource waits before reconnecting), then
    each event framed, and a keep-alive comment whenever `keepalive_s` passes without one. The next event
    is awaited in a task that a keep-alive does not interrupt, so the source is never cancelled mid-step."""
    source = aiter(events)
    if retry_ms is not None:
        yield b"retry: %d\n\n" % retry_ms
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next(source))
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                yield KEEPALIVE
                continue
            item, pending = pending.result(), None
            if item is _END:
                return
            yield frame(*item)
    finally:
        if pending is not None:  # the response ended early (the client left): stop the source's step
            pending.cancel()
        elif hasattr(source, "aclose"):
            await source.aclose()


def event_stream(
    events: AsyncIterable[Event], *, retry_ms: int | None = None, keepalive_s: float = KEEPALIVE_S
) -> StreamingResponse:
    """A StreamingResponse of the events, with the headers every event stream carries."""
    return StreamingResponse(
        framed(events, retry_ms=retry_ms, keepalive_s=keepalive_s), media_type=MEDIA_TYPE, headers=HEADERS
    )


LastEventId = Annotated[
    str | None, Header(max_length=64, description="what EventSource sends when it reconnects: the last event id it saw")
]
Since = Annotated[
    str | None,
    Query(max_length=64, description="an event id: start after it (what Last-Event-ID does, for a new connection)"),
]


def resume_from(last_event_id: LastEventId = None, since: Since = None) -> str | None:
    """The event id a client has seen: the reconnecting EventSource's header first, else the new connection's query."""
    return last_event_id or since


ResumeFrom = Annotated[str | None, Depends(resume_from)]
