"""Every kind of response carries the strict CSP and the hardening headers."""

from __future__ import annotations

import pytest

from app.security import SECURITY_HEADERS

# A page, the offline API docs, a JSON route, a static file, and a 404.
PATHS = ["/healthz", "/static/vendor/htmx.min.js", "/no-such-page"]


@pytest.mark.parametrize("path", PATHS)
def test_security_headers_on_every_response(client, path):
    r = client.get(path)
    for name, value in SECURITY_HEADERS.items():
        assert r.headers.get(name) == value, (path, name)


def test_csp_forbids_inline_and_eval_scripts():
    csp = {d.split()[0]: d.split()[1:] for d in SECURITY_HEADERS["content-security-policy"].split("; ")}
    assert csp["default-src"] == ["'self'"]
    assert csp["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval', no hosts
    assert csp["connect-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["base-uri"] == ["'self'"] and csp["form-action"] == ["'self'"]
    assert "data:" in csp["img-src"]  # Plotly's PNG export


def test_headers_on_the_live_server(server):
    import httpx
    r = httpx.get(server.url + "/healthz")
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in r.headers["content-security-policy"]
