"""/docs works offline: every asset it loads is served by this app, and no script is inline."""

import re

from app.paths import STATIC_DIR


def test_docs_page_loads_only_local_assets(client):
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert not re.search(r"https?://", html)  # no CDN, no external link
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)  # every <script> has a src: CSP-friendly
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert set(assets) == {
        "/static/vendor/swagger-ui.css",
        "/static/vendor/swagger-ui-bundle.js",
        "/static/js/docs.js",
        "/static/css/docs.css",
    }  # docs.css: Swagger UI's colours raised to WCAG AA contrast
    for url in assets:
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    assert 'data-openapi-url="/openapi.json"' in html


def test_swagger_ui_bundle_is_the_real_one(client):
    bundle = client.get("/static/vendor/swagger-ui-bundle.js")
    assert b"SwaggerUIBundle" in bundle.content and len(bundle.content) > 500_000
    init = (STATIC_DIR / "js" / "docs.js").read_text()
    assert "validatorUrl: null" in init  # Swagger UI would otherwise send the schema to validator.swagger.io


def test_openapi_json(client):
    spec = client.get("/openapi.json").json()
    for path in (
        "/api/v1/lessons/attention",
        "/api/v1/lessons/scaling",
        "/api/v1/lessons/multihead",
        "/api/v1/lessons/positions",
        "/api/v1/lessons/forward",
        "/api/v1/params",
        "/api/v1/kv-cache",
        "/api/v1/models",
        "/api/v1/run",
        "/api/v1/hooks",
    ):
        assert path in spec["paths"]


def test_large_responses_are_gzipped(client):
    r = client.get("/api/v1/lessons/positions", headers={"accept-encoding": "gzip"})
    assert r.headers.get("content-encoding") == "gzip"
    small = client.get("/healthz", headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in small.headers  # under minimum_size
