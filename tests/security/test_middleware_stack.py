"""The middleware stack, pinned: its order, and what each layer adds to each kind of answer.

Outermost first: the access log (every answer logged, bytes as sent), the security headers (on every
answer, a bug's 500 included), the 500 for a bug (JSON, no internals), the URL and body size limits
(414, 413: refused before a compute slot is taken), the compute limiter (503 + Retry-After), gzip.
A test app is built with create_app() and two routes of its own (one that holds the only compute
slot, one that raises), with small limits set through the environment, and called in-process.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging

import httpx
import pytest
from fastapi.testclient import TestClient

from app.http.security import SECURITY_HEADERS
from app.main import create_app
from app.settings import get_settings

HOLD = "/api/v1/analysis/test-hold"  # a compute path (the limiter counts /api/v1/analysis/...)
BOOM = "/test-boom"
SECRET = "secret-internal-detail-7f3a"
LIMITS = {
    "EXPLORER_MAX_CONCURRENT_COMPUTE": "1",
    "EXPLORER_COMPUTE_QUEUE_S": "0",  # turned away at once: the order of the layers is what is checked
    "EXPLORER_RETRY_AFTER_S": "7",
    "EXPLORER_MAX_URL_BYTES": "2048",
    "EXPLORER_MAX_BODY_BYTES": "4096",
    "EXPLORER_ACCESS_LOG": "true",
}


@pytest.fixture
def stack(monkeypatch):
    """(app, release event, started list): the app with the limits above and the two test routes."""
    for name, value in LIMITS.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        app = create_app()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    release, started = asyncio.Event(), []

    async def hold():
        started.append(1)
        await release.wait()
        return {"held": True}

    def boom():
        raise RuntimeError(f"a bug, with {SECRET} in its message")

    app.add_api_route(HOLD, hold)
    app.add_api_route(BOOM, boom)
    return app, release, started


@pytest.fixture
def access_lines():
    """What the access logger writes (as the app's JSON lines)."""
    from app.http.observability import JsonFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("app.access")
    logger.addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)


def test_the_order_of_the_layers():
    names = [m.cls.__name__ for m in create_app().user_middleware]  # outermost first
    assert names == [
        "AccessLogMiddleware",
        "SecurityHeadersMiddleware",
        "LanguageMiddleware",
        "ServerErrorMiddleware",
        "UrlLengthLimitMiddleware",
        "BodySizeLimitMiddleware",
        "ComputeLimitMiddleware",
        "GZipMiddleware",
    ]


def _has_security_headers(r: httpx.Response) -> bool:
    return all(r.headers.get(name) == value for name, value in SECURITY_HEADERS.items())


def _detail(r: httpx.Response) -> dict:
    assert r.headers["content-type"] == "application/json"
    (detail,) = r.json()["detail"]
    return detail


def test_what_each_layer_adds(stack, access_lines):
    app, release, started = stack

    async def scenario():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
            held = asyncio.create_task(c.get(HOLD))
            while not started:  # the only compute slot is taken
                await asyncio.sleep(0.01)
            busy = await c.post("/api/v1/run", json={"model": "toy", "text": "abc"})
            too_large = await c.post(
                "/api/v1/run", content=b"{" + b" " * 4095 + b"}", headers={"content-type": "application/json"}
            )
            too_long = await c.get("/api/v1/lessons/attention", params={"text": "a" * 2048})
            gzipped = await c.get("/openapi.json", headers={"accept-encoding": "gzip"})
            bug = await c.get(BOOM)
            release.set()
            return busy, too_large, too_long, gzipped, bug, await held

    busy, too_large, too_long, gzipped, bug, held = asyncio.run(scenario())
    answers = [busy, too_large, too_long, gzipped, bug, held]
    # security headers: on every answer, refusals and the bug's 500 included
    assert all(_has_security_headers(r) for r in answers), [
        r.status_code for r in answers if not _has_security_headers(r)
    ]
    # compute limiter: the second compute request is turned away at once
    assert busy.status_code == 503 and busy.headers["retry-after"] == "7" and _detail(busy)["type"] == "server_busy"
    # size limits sit outside the limiter: refused for their size while the slot is taken, not 503
    assert too_large.status_code == 413 and _detail(too_large)["type"] == "body_too_large"
    assert too_long.status_code == 414 and "limit of 2,048" in _detail(too_long)["msg"]
    # gzip: a large JSON answer is compressed
    assert gzipped.status_code == 200 and gzipped.headers["content-encoding"] == "gzip"
    # a bug: JSON 500 that says so, and nothing of its internals
    assert bug.status_code == 500 and _detail(bug)["type"] == "internal_error"
    assert SECRET not in bug.text and "RuntimeError" not in bug.text and "Traceback" not in bug.text
    assert held.status_code == 200 and held.json() == {"held": True}
    # access log: outermost, one line per answer with its status, and the bytes as sent (compressed)
    logged = {(e["path"], e["status"]): e for e in access_lines()}
    for path, r in [
        ("/api/v1/run", busy),
        ("/api/v1/run", too_large),
        ("/api/v1/lessons/attention", too_long),
        ("/openapi.json", gzipped),
        (BOOM, bug),
        (HOLD, held),
    ]:
        assert (path, r.status_code) in logged, (path, r.status_code)
    assert logged[("/openapi.json", 200)]["bytes"] == int(gzipped.headers["content-length"]) < len(gzipped.content)


def test_a_bug_is_logged_with_its_traceback_and_still_fails_a_test_client(stack, caplog):
    app, _, _ = stack
    with caplog.at_level(logging.ERROR, logger="app.http.errors"):
        r = TestClient(app, raise_server_exceptions=False).get(BOOM)
    assert r.status_code == 500 and _has_security_headers(r)
    (record,) = [rec for rec in caplog.records if rec.name == "app.http.errors"]  # logged once, with the cause
    assert record.exc_info and SECRET in str(record.exc_info[1])
    with pytest.raises(RuntimeError, match=SECRET):  # tests still see the bug itself
        TestClient(app).get(BOOM)


@pytest.mark.parametrize("extra, status", [(0, 200), (1, 413)])
def test_the_body_limit_is_exact(extra, status):
    """A body of exactly max_body_bytes runs; one byte more is refused (declared length and chunked)."""
    limit = get_settings().max_body_bytes
    body = json.dumps({"model": "toy", "text": "abc", "top_k": 1}).encode()
    body += b" " * (limit + extra - len(body))  # JSON may end in whitespace
    with TestClient(create_app()) as client:
        declared = client.post("/api/v1/run", content=body, headers={"content-type": "application/json"})
        chunked = client.post(
            "/api/v1/run",
            content=iter([body[: limit // 2], body[limit // 2 :]]),
            headers={"content-type": "application/json"},
        )
    assert "content-length" not in chunked.request.headers  # really sent without a declared length
    for r in (declared, chunked):
        assert r.status_code == status, r.text[:300]
        if status == 413:
            assert _detail(r)["type"] == "body_too_large" and f"limit of {limit:,}" in _detail(r)["msg"]
        else:
            assert r.json()["tokens"] == ["a", "b", "c"]
