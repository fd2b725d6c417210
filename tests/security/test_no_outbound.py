"""The server works with every non-loopback connection refused, and never even tries one.

The server runs with scripts/no_outbound/sitecustomize.py, which makes Python's socket layer
refuse (and report) any connect/sendto/name lookup not aimed at a loopback address. We then use
every page (crawled from "/"), every static asset they reference, every GET endpoint of the
OpenAPI schema and a run of every listed model. (The browser side is checked in
test_xss_browser.py, which records every request the pages make.)"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import liveserver
import pytest

# Enough for the crawl to reach every page: with the shipped SAE, /features links each token and feature of its
# default text, and with /attribution the breadth-first crawl reaches /inspect at its 255th URL (160 stopped before).
MAX_PAGES = 320


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src", "hx-get") and value:
                self.urls.append(value)


def _same_origin_links(base: str, page_url: str, html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    out = []
    for raw in parser.urls:
        url = urljoin(page_url, raw).split("#")[0]
        if urlsplit(url).netloc == urlsplit(base).netloc:
            out.append(url)
    return out


@pytest.fixture(scope="module")
def guarded():
    with liveserver.live_server(no_outbound=True) as server:
        yield server


def test_guard_is_really_active(guarded):
    assert liveserver.GUARD_MARK in guarded.log()


def test_every_page_endpoint_and_model_works_offline(guarded):
    base = guarded.url
    seen: dict[str, int] = {}
    with httpx.Client(timeout=120) as client:
        # Pages and their assets, breadth-first from the home page and the docs.
        queue = [base + "/", base + "/docs"]
        while queue and len(seen) < MAX_PAGES:
            url = queue.pop(0)
            if url in seen:
                continue
            r = client.get(url)
            seen[url] = r.status_code
            if r.headers.get("content-type", "").startswith("text/html"):
                queue += [u for u in _same_origin_links(base, url, r.text) if u not in seen]

        # Every GET operation with its defaults, and a run of every model.
        schema = client.get(base + "/openapi.json").json()
        for path, ops in schema["paths"].items():
            if "get" in ops and "{" not in path:
                seen[base + path] = client.get(base + path).status_code
        listing = client.get(base + "/api/v1/models")
        assert listing.status_code == 200 and "post" in schema["paths"]["/api/v1/run"]
        models = _model_names(listing.json())
        runs = {}
        for model in models:
            r = client.post(base + "/api/v1/run", json={"model": model, "text": "nasi lemak"})
            runs[model] = (r.status_code, r.text[:200])

    log = guarded.log()
    assert liveserver.BLOCKED_MARK not in log, log[-4000:]
    assert seen, "nothing was exercised"
    failed = {u: s for u, s in seen.items() if s != 200}
    # Every crawled page/asset must load; GET operations may demand parameters (422) but never fail.
    pages_failed = {u: s for u, s in failed.items() if not urlsplit(u).path.startswith("/api/") or s >= 500}
    assert not pages_failed, pages_failed
    # every model ran, the built-in toys and the bundled pretrained MiniLM among them
    assert {"toy", "spec-forward", "all-MiniLM-L6-v2"} <= set(runs) == set(models), runs
    assert all(status == 200 for status, _ in runs.values()), runs
    assert {base + "/", base + "/docs", base + "/params", base + "/inspect"} <= set(seen)  # the crawl reached the pages
    print(f"offline: {len(seen)} URLs, {len(runs)} model runs, statuses {sorted(set(seen.values()))}")


def _model_names(listing) -> list[str]:
    items = listing.get("models", listing) if isinstance(listing, dict) else listing
    names = [m["name"] for m in items if isinstance(m, dict) and not m.get("error")]
    # A model whose `text` must fit a small vocabulary (spec-forward) still takes "nasi lemak".
    return [n for n in names if re.fullmatch(r"[\w.\-/]+", n)]
