"""A painted matrix's exact values, read when they are read: the explorer's URL with `values=<figure>&rows=`
answers float64 rows that are the JSON API's numbers, every bit, from the matrices the page kept when it
drew them or by running the view again; `levels=head-<h>` answers another head's colour levels, the
ones its weights figure would carry. Bad reads are 422s that say what to ask for."""

from __future__ import annotations

import html
import re
from urllib.parse import urlencode

import numpy as np
import pytest

from app.pages import figures
from app.pages.explorer import ReadCache, read_cache

from .figure_data import load_figure

HX = {"HX-Request": "true"}
TEXT = ("the cat sat on the mat. " * 8)[:128]  # 128 tokens: painted, every stage sent


def api_hook(client, hook: str, text: str = TEXT, **fields) -> np.ndarray:
    r = client.post("/api/v1/run", json={"model": "toy", "text": text, "hooks": [hook], "top_k": 0, **fields})
    assert r.status_code == 200, r.text
    return np.array(r.json()["hooks"][hook], dtype=np.float64)  # null (masked) -> nan


def at(url: str, **params) -> str:
    """The view's URL with these parameters added (as explorer-values.js adds them)."""
    return url + ("&" if "?" in url else "?") + urlencode(params)


def read(client, url: str, **params) -> np.ndarray | str:
    r = client.get(at(url, **params))
    if r.status_code != 200:
        return f"{r.status_code} {r.text}"
    assert r.headers["content-type"] == "application/octet-stream"
    return np.frombuffer(r.content, dtype="<f8")


def page(client, **params) -> tuple[str, dict]:
    r = client.get("/", params={"model": "toy", "text": TEXT, **params}, headers=HX)
    assert r.status_code == 200
    url = html.unescape(re.search(r'<section id="results"[^>]*data-values="([^"]*)"', r.text).group(1))
    found = dict(re.findall(r'data-figure="([^"]*)" data-plot-key="([\w-]+)"', r.text))
    return url, {key: load_figure(html.unescape(value)) for value, key in found.items()}


@pytest.mark.parametrize("cached", [True, False])
def test_every_row_read_is_the_apis_pattern_and_scores_every_bit(client, cached):
    url, cards = page(client, layer=1, head=2)
    assert cards["stage-weights"]["export"]["read"] == "stage-weights" and "z" not in cards["stage-weights"]["data"][0]
    if not cached:  # gone from the cache (another worker, or evicted): the view runs again
        client.app.state.explorer_reads = ReadCache()
    n = len(TEXT)
    pattern = api_hook(client, "blocks.1.attn.hook_pattern")[2]
    scores = api_hook(client, "blocks.1.attn.hook_attn_scores")[2]  # scaled and masked: null (nan) where masked
    weights = read(client, url, values="stage-weights", rows=f"0-{n}").reshape(n, n)
    masked = read(client, url, values="stage-masked", rows=f"10-{n}").reshape(n - 10, n)
    np.testing.assert_array_equal(weights, pattern)
    np.testing.assert_array_equal(masked, scores[10:])  # NaN where masked, on both sides
    one = read(client, url, values="stage-weights", rows="5-6")
    np.testing.assert_array_equal(one, pattern[5])


def test_a_head_s_levels_are_those_its_weights_figure_would_carry(client):
    text = ("the cat sat on the mat. " * 12)[:200]  # more than THUMB_MAX_CELLS: the thumbnails are pooled
    url, cards = page(client, text=text, n_heads=2)
    assert cards["thumb-1"]["export"]["pooled"] == 2
    r = client.get(at(url, levels="head-1"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    pattern = api_hook(client, "blocks.0.attn.hook_pattern", text=text, n_heads=2)[1]
    mask = np.triu(np.ones((200, 200), dtype=bool), 1)
    assert np.frombuffer(r.content, np.uint8).tolist() == figures.weights_levels(pattern, mask).tolist()
    # the head shown is in the page already; a head that does not exist has no levels
    for key in ("head-0", "head-7", "stage-weights"):
        bad = client.get(at(url, levels=key))
        assert bad.status_code == 422 and "no other head's levels" in bad.text


def test_a_read_that_cannot_be_answered_says_what_to_ask_for(client):
    url, _ = page(client)
    assert read(client, url, values="stage-nothing", rows="0-1").startswith(
        "422 values='stage-nothing': this view paints no such matrix; it paints stage-raw, stage-scaled"
    )
    for rows in ("", "3", "5-5", "0-129", "-1-2", "a-b"):
        assert read(client, url, values="stage-weights", rows=rows).startswith(f"422 rows={rows!r} is not from-to")
    # a view that cannot run says why, as the page would
    assert read(client, "/?model=toy&text=ab&n_heads=3&d_model=8", values="stage-weights", rows="0-1").startswith(
        "422 "
    )
    # below IMAGE_MIN_TOKENS the page holds every value: nothing to read
    assert "it paints none" in read(client, "/?model=toy&text=abc", values="stage-weights", rows="0-1")


def test_the_cache_keeps_the_newest_views_within_its_budget():
    cache = ReadCache(budget=3 * 8 * 64 * 64)
    m = np.zeros((64, 64))
    for k in range(4):
        cache.put(f"/?view={k}", {"stage-weights": m})
    assert cache.get("/?view=0") is None and all(cache.get(f"/?view={k}") is not None for k in (1, 2, 3))
    cache.put("/?big", {"stage-weights": np.zeros((128, 128))})  # more than the whole budget: not kept
    assert cache.get("/?big") is None and cache.get("/?view=3") is not None


def test_each_app_reads_from_its_own_cache(client, client_with):
    other = client_with(explorer_max_tokens=512)
    url, _ = page(client)
    assert read_cache(_request(client)) is not read_cache(_request(other))
    np.testing.assert_array_equal(
        read(other, url, values="stage-weights", rows="0-2"), read(client, url, values="stage-weights", rows="0-2")
    )


def _request(client):
    class Request:  # what read_cache looks at: the app
        app = client.app

    return Request()
