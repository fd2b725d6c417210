"""Every kind of response carries the strict CSP and the hardening headers."""

from __future__ import annotations

import pytest

from app.http.security import SECURITY_HEADERS

# A page, the offline API docs, a JSON route, static files (and, below, a 404 and a 422).
PATHS = ["/", "/docs", "/api/v1/models", "/healthz", "/static/vendor/htmx.min.js", "/static/js/explorer.js"]


@pytest.mark.parametrize("path", PATHS)
def test_pages_docs_json_and_static_files_load(client, path):
    assert client.get(path).status_code == 200


@pytest.mark.parametrize("path", PATHS + ["/no-such-page", "/api/v1/lessons/attention?d_model=-1"])
def test_security_headers_on_every_response(client, path):
    r = client.get(path)
    for name, value in SECURITY_HEADERS.items():
        assert r.headers.get(name) == value, (path, name)


def test_csp_forbids_inline_and_eval_scripts():
    csp = {d.split()[0]: d.split()[1:] for d in SECURITY_HEADERS["content-security-policy"].split("; ")}
    assert csp["default-src"] == ["'self'"]
    assert csp["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval', no hosts
    assert csp["connect-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'self'"]  # a live class's student page frames this site's pages
    assert csp["base-uri"] == ["'self'"] and csp["form-action"] == ["'self'"]
    assert "data:" in csp["img-src"]  # Plotly's PNG export


def test_headers_on_the_live_server(server):
    import httpx

    r = httpx.get(server.url + "/healthz")
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "SAMEORIGIN"
    assert "script-src 'self'" in r.headers["content-security-policy"]
