"""Gzip off the event loop, static files compressed once, caching headers (app/http/compression.py)."""

import gzip

import orjson

from app.http import compression


def test_big_run_response_is_gzipped_and_decodes_to_the_same_json(client):
    body = {"model": "toy", "text": "x" * 150, "hooks": ["blocks.0.attn.hook_pattern"]}
    plain = client.post("/api/v1/run", json=body, headers={"accept-encoding": "identity"})
    zipped = client.post("/api/v1/run", json=body, headers={"accept-encoding": "gzip"})
    assert plain.status_code == zipped.status_code == 200
    assert len(plain.content) >= compression.THREAD_THRESHOLD  # so this one was compressed off the loop
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert orjson.loads(zipped.content) == orjson.loads(plain.content)  # httpx decodes the gzip


def test_static_files_are_compressed_once_at_the_highest_level(client):
    path = "/static/vendor/htmx.min.js"
    first = client.get(path, headers={"accept-encoding": "gzip"})
    assert first.headers["content-encoding"] == "gzip"
    raw = client.get(path, headers={"accept-encoding": "identity"}).content
    assert first.content == raw
    assert int(first.headers["content-length"]) == len(gzip.compress(raw, compression.STATIC_LEVEL))
    assert first.headers["cache-control"] == "public, max-age=86400"
    assert "accept-encoding" in first.headers["vary"].lower()


def test_own_assets_revalidate_and_ranges_stay_uncompressed(client):
    css = client.get("/static/css/explorer.css", headers={"accept-encoding": "gzip"})
    assert css.headers["cache-control"] == "no-cache"
    again = client.get("/static/css/explorer.css", headers={"if-none-match": css.headers["etag"]})
    assert again.status_code == 304
    part = client.get("/static/vendor/htmx.min.js", headers={"accept-encoding": "gzip", "range": "bytes=0-99"})
    assert part.status_code == 206 and "content-encoding" not in part.headers and len(part.content) == 100
