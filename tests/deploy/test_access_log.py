"""Access logs: one JSON line per request on the `app.access` logger, with method, path, status,
duration and size; at log level warning they are off; the query string (learners' text) is never logged."""

from __future__ import annotations

import io
import json
import logging

import pytest
from fastapi.testclient import TestClient

from app.http.observability import ACCESS_LOGGER, JsonFormatter, configure_access_log
from app.main import create_app
from app.settings import get_settings


@pytest.fixture
def access_lines():
    """Collect what the access logger writes, through the app's own JSON formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app())


def test_one_json_line_per_request(client, access_lines):
    configure_access_log("info")
    client.get("/healthz")
    client.get("/static/vendor/htmx.min.js?text=secret+sentence")
    client.get("/no/such/page")
    lines = access_lines()
    assert [(e["method"], e["path"], e["status"]) for e in lines] == [
        ("GET", "/healthz", 200),
        ("GET", "/static/vendor/htmx.min.js", 200),
        ("GET", "/no/such/page", 404),
    ]
    for entry in lines:
        assert entry["logger"] == ACCESS_LOGGER and entry["level"] == "info"
        assert isinstance(entry["duration_ms"], float) and entry["duration_ms"] >= 0
        assert entry["ts"].endswith("+00:00")
    # bytes on the wire: compressed when the client accepts gzip, as the TestClient does
    sent = client.get("/static/vendor/htmx.min.js", headers={"Accept-Encoding": "gzip"})
    assert lines[1]["bytes"] == int(sent.headers["content-length"]) > 0
    assert "secret" not in json.dumps(lines)


def test_level_warning_silences_access_lines(client, access_lines):
    configure_access_log("warning")
    client.get("/healthz")
    assert access_lines() == []


def test_configuring_twice_adds_one_handler():
    configure_access_log(get_settings().log_level)
    configure_access_log(get_settings().log_level)
    logger = logging.getLogger(ACCESS_LOGGER)
    assert sum(isinstance(h.formatter, JsonFormatter) for h in logger.handlers) == 1
    assert logger.propagate is False


def test_access_log_can_be_turned_off(monkeypatch, access_lines):
    monkeypatch.setenv("EXPLORER_ACCESS_LOG", "false")
    get_settings.cache_clear()
    try:
        app = create_app()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    configure_access_log("info")
    TestClient(app).get("/healthz")
    assert access_lines() == []


def test_an_unhandled_error_is_logged_as_500(access_lines):
    app = create_app()

    @app.get("/boom")
    def boom():
        raise RuntimeError("boom")

    configure_access_log("info")
    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500
    assert [(e["path"], e["status"]) for e in access_lines()] == [("/boom", 500)]
