"""app/http/sse.py: the bytes of an event stream, read back as a browser's EventSource reads them
(the WHATWG "interpret an event stream" steps), its headers, keep-alive comments and where a client
resumes (Last-Event-ID, or `since` for a new connection)."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.http import sse


def parse(stream: str) -> tuple[list[dict], int, int | None]:
    """Events as EventSource dispatches them ({"id", "event", "data"}; `id` is the last event id then in
    force), the number of comment lines, and the retry it was told."""
    events, comments, retry = [], 0, None
    last_id, name, data = "", "", []
    for line in re.split(r"\r\n|\r|\n", stream):
        if line == "":
            if data:
                events.append({"id": last_id, "event": name or "message", "data": "\n".join(data)})
            name, data = "", []
        elif line.startswith(":"):
            comments += 1
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value
            elif field == "id":
                last_id = value
            elif field == "retry":
                retry = int(value)
    return events, comments, retry


async def _collect(events, **kwargs) -> str:
    return b"".join([chunk async for chunk in sse.framed(events, **kwargs)]).decode()


def collect(events, **kwargs) -> str:
    return asyncio.run(_collect(events, **kwargs))


async def listed(items, pause_s: float = 0.0):
    for item in items:
        if pause_s:
            await asyncio.sleep(pause_s)
        yield item


def test_json_data_ids_and_names_come_back_as_they_were_sent():
    sent = [("1", "start", {"a": [1, 2], "masked": float("-inf")}), (None, "step", np.arange(3)), ("3", "end", {})]
    events, comments, retry = parse(collect(listed(sent)))
    assert [e["event"] for e in events] == ["start", "step", "end"]
    # an event without an id keeps the last one in force (what the client would resume from)
    assert [e["id"] for e in events] == ["1", "1", "3"]
    assert [json.loads(e["data"]) for e in events] == [{"a": [1, 2], "masked": None}, [0, 1, 2], {}]
    assert comments == 0 and retry is None


@pytest.mark.parametrize("text", ["one line", "two\nlines", "cr\rand crlf\r\nends", "trailing\n", "\n\nblank lines\n"])
def test_text_data_with_line_breaks_arrives_whole(text):
    [event], _, _ = parse(collect(listed([("7", "note", text)])))
    # each of \r\n, \r, \n is one line break to the client: it gets the text back with \n for each
    assert event["data"] == re.sub(r"\r\n|\r", "\n", text) and event["id"] == "7" and event["event"] == "note"


def test_the_exact_frame():
    assert sse.frame("5", "step", {"x": 1}) == b'id: 5\nevent: step\ndata: {"x":1}\n\n'
    assert sse.frame(None, "end", "a\nb") == b"event: end\ndata: a\ndata: b\n\n"


def test_retry_comes_first():
    body = collect(listed([("1", "a", 1)]), retry_ms=1000)
    assert body.startswith("retry: 1000\n\n") and parse(body)[2] == 1000


def test_a_quiet_source_gets_keep_alive_comments_and_is_not_cut_short():
    # each event comes after 0.25 s of quiet; a keep-alive every 0.1 s: about two before each event
    body = collect(listed([("1", "a", 1), ("2", "b", 2)], pause_s=0.25), keepalive_s=0.1)
    events, comments, _ = parse(body)
    assert [e["data"] for e in events] == ["1", "2"]  # the step waited for was never cancelled
    assert 3 <= comments <= 5, body
    assert body.index(": keep-alive") < body.index("event: a")


def test_a_busy_source_gets_no_keep_alive():
    _, comments, _ = parse(collect(listed([(str(i), "a", i) for i in range(50)]), keepalive_s=0.5))
    assert comments == 0


def test_a_stream_closed_early_stops_the_source():
    stopped = []

    async def endless():
        try:
            i = 0
            while True:
                i += 1
                yield str(i), "tick", i
                await asyncio.sleep(0)
        finally:
            stopped.append(True)

    async def read_two():
        stream = sse.framed(endless())
        chunks = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return chunks

    chunks = asyncio.run(read_two())
    assert [e["data"] for e in parse(b"".join(chunks).decode())[0]] == ["1", "2"] and stopped == [True]


@pytest.fixture
def client():
    app = FastAPI()

    @app.get("/events")
    async def events(resume: sse.ResumeFrom):
        async def source():
            yield "resumed", "from", resume or ""

        return sse.event_stream(source())

    return TestClient(app)


def test_an_event_stream_answers_with_its_headers(client):
    r = client.get("/events")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"


@pytest.mark.parametrize(
    "headers, params, resumed",
    [
        ({}, {}, ""),
        ({"Last-Event-ID": "12"}, {}, "12"),  # EventSource reconnecting
        ({}, {"since": "9"}, "9"),  # a new connection
        ({"Last-Event-ID": "12"}, {"since": "9"}, "12"),  # the reconnect's own id wins over the URL's
    ],
)
def test_a_client_resumes_from_last_event_id_or_since(client, headers, params, resumed):
    [event], _, _ = parse(client.get("/events", headers=headers, params=params).text)
    assert event["data"] == resumed


def test_a_resume_id_has_a_stated_limit(client):
    r = client.get("/events", params={"since": "x" * 65})
    assert r.status_code == 422
    schema = client.get("/openapi.json").json()["paths"]["/events"]["get"]["parameters"]
    assert {(p["name"], p["in"], p["schema"]["anyOf"][0]["maxLength"]) for p in schema} == {
        ("since", "query", 64),
        ("last-event-id", "header", 64),
    }
