"""Long inputs in the figures: painted matrices, their colour levels on the explorer (and float32 from
FLOAT32_MIN_TOKENS elsewhere), pooled thumbnails, and what the explorer page sends at 1,024 tokens."""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
import re

import numpy as np
import pytest
from markupsafe import escape

from app.pages import figures
from app.pages.explorer import STAGES_ON_REQUEST_TOKENS
from app.pages.web import figure_json
from core import causal_mask

from .figure_data import load_figure

HX = {"HX-Request": "true"}
LONG = ("the cat sat on the mat. " * 43)[:1024]  # the toy reads one token per character
UPDATE_BUDGET_BYTES = 1.5 * 2**20  # a 1,024-token update as sent (issue 24: it was 6.3 MB)


def level(value: float, lo: float, hi: float) -> int:
    """The colour a value is painted in, counted here: the nearest of 256 steps from lo to hi, half up."""
    return min(255, max(0, math.floor((value - lo) * (255 / (hi - lo)) + 0.5)))


def naive_levels(matrix: np.ndarray, mask: np.ndarray | None, lo: float, hi: float) -> list[int]:
    """Row by row, the level of every cell the mask leaves (and that has a value)."""
    return [
        level(v, lo, hi)
        for i, row in enumerate(matrix)
        for j, v in enumerate(row)
        if not (mask is not None and mask[i, j]) and np.isfinite(v)
    ]


def naive_pool(matrix: np.ndarray, mask: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Block by block with Python loops: each block's largest value ignoring NaN, masked when all are."""
    n = matrix.shape[0]
    f = -(-n // size)
    blocks = range(0, n, f)
    values = np.full((len(blocks), len(blocks)), np.nan)
    masked = np.zeros((len(blocks), len(blocks)), dtype=bool)
    for a, i in enumerate(blocks):
        for b, j in enumerate(blocks):
            block = matrix[i : i + f, j : j + f]
            finite = [v for v in block.ravel() if not np.isnan(v)]
            values[a, b] = max(finite) if finite else np.nan
            masked[a, b] = bool(mask[i : i + f, j : j + f].all())
    return values, masked


def runs(mask: np.ndarray) -> list[list[int]]:
    """[row, first masked key, the key after the last] of every run of masked keys, row by row."""
    out = []
    for i, row in enumerate(mask):
        j = 0
        while j < len(row):
            if row[j]:
                k = j
                while k < len(row) and row[k]:
                    k += 1
                out.append([i, j, k])
                j = k
            else:
                j += 1
    return out


def weights_like(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((n, n)) ** 4)
    return w / w.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n", [129, 300, 1024])
def test_long_thumbnails_are_max_pooled_block_by_block_and_painted_from_levels(n):
    mask = causal_mask(n)
    heads = np.stack([weights_like(n, n + h) for h in range(2)])
    figs = figures.head_thumbnails(heads, ["a"] * n, mask=mask, export_names=["h0", "h1"])
    for weights, fig in zip(heads, figs):
        want, want_mask = naive_pool(weights, mask, figures.THUMB_MAX_CELLS)
        cells = want.shape[0]
        assert cells <= figures.THUMB_MAX_CELLS and fig["export"]["shape"] == [cells, cells]
        assert fig["export"]["levels"].tolist() == naive_levels(want, want_mask, 0.0, 1.0)
        assert fig["export"]["mask"]["runs"].tolist() == runs(want_mask)
        assert fig["export"]["pooled"] == -(-n // figures.THUMB_MAX_CELLS)
        assert fig["export"]["draw"] == "image" and "z" not in fig["data"][0]
        assert [t["type"] for t in fig["data"]] == ["heatmap"]  # no overlay: the mask is painted from its runs


def test_pooling_keeps_a_score_only_where_its_block_has_one():
    n = 300
    mask = causal_mask(n)
    scores = np.where(mask, np.nan, np.random.default_rng(3).normal(size=(n, n)))
    pooled, pooled_mask = figures._max_pool(scores, mask, figures.THUMB_MAX_CELLS)
    want, want_mask = naive_pool(scores, mask, figures.THUMB_MAX_CELLS)
    np.testing.assert_array_equal(pooled, want)
    np.testing.assert_array_equal(pooled_mask, want_mask)


@pytest.mark.parametrize(
    ("n", "draw", "dtype"),
    [
        (20, None, np.float64),
        (figures.IMAGE_MIN_TOKENS, "image", np.float64),
        (figures.FLOAT32_MIN_TOKENS, "image", np.float32),
    ],
)
def test_off_the_explorer_a_matrix_travels_as_its_values_float32_from_its_threshold(n, draw, dtype):
    weights = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    fig = figures.attention_heatmap(weights, ["x"] * n, kind="weights", mask=causal_mask(n))
    assert fig["export"].get("draw") == draw and "levels" not in fig["export"]
    assert fig["data"][0]["z"].dtype == dtype
    np.testing.assert_allclose(fig["data"][0]["z"], weights, rtol=1e-7 if dtype == np.float32 else 0)


@pytest.mark.parametrize("kind", ["weights", "scores"])
def test_a_read_matrix_is_painted_from_its_levels_from_64_tokens(kind):
    n = figures.IMAGE_MIN_TOKENS
    mask = causal_mask(n)
    matrix = (
        weights_like(n, 1)
        if kind == "weights"
        else np.where(mask, -np.inf, np.random.default_rng(2).normal(size=(n, n)))
    )
    fig = figures.attention_heatmap(matrix, ["x"] * n, kind=kind, mask=mask, read="stage-x")
    ex, trace = fig["export"], fig["data"][0]
    assert "z" not in trace and ex["read"] == "stage-x" and ex["shape"] == [n, n] and ex["draw"] == "image"
    assert ex["levels"].dtype == np.uint8 and ex["levels"].tolist() == naive_levels(
        matrix, mask, trace["zmin"], trace["zmax"]
    )
    assert ex["mask"]["runs"].tolist() == runs(mask) and "gaps" not in ex
    overlay = fig["data"][1]  # the legend's "masked" entry only: its cells are painted
    assert overlay["name"] == figures.MASKED_NAME and len(overlay["x"]) == 0
    # below IMAGE_MIN_TOKENS the values stay (Plotly draws each cell, and hover reads them)
    small = figures.attention_heatmap(matrix[:20, :20], ["x"] * 20, kind=kind, mask=mask[:20, :20], read="stage-x")
    assert "levels" not in small["export"] and "read" not in small["export"] and small["data"][0]["z"].shape == (20, 20)


def test_a_cell_without_a_value_that_is_not_masked_is_a_gap():
    n = figures.IMAGE_MIN_TOKENS
    m = weights_like(n, 4)
    m[5, 2] = np.nan
    fig = figures.attention_heatmap(m, ["x"] * n, kind="weights", mask=causal_mask(n), read="r")
    assert fig["export"]["gaps"].tolist() == [[5, 2, 3]]
    assert len(fig["export"]["levels"]) == n * (n + 1) // 2 - 1


def update(client, **params):
    return client.get("/", params={"model": "toy", "text": LONG, **params}, headers=HX | {"Accept-Encoding": "gzip"})


def test_a_1024_token_update_is_under_its_byte_budget_as_sent(client):
    r = update(client)
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    sent = r.num_bytes_downloaded
    assert sent <= UPDATE_BUDGET_BYTES, f"{sent:,} bytes as sent"
    assert len(gzip.compress(r.content, 1)) <= UPDATE_BUDGET_BYTES  # whatever the client's own decoding
    found = dict(re.findall(r'data-figure="([^"]*)" data-plot-key="([\w-]+)"', r.text))
    cards = {key: load_figure(html.unescape(value)) for value, key in found.items()}
    assert "stage-weights" in cards and "stage-raw" not in cards  # scores stages on request from 256 tokens
    weights = cards["stage-weights"]["export"]
    assert weights["shape"] == [1024, 1024] and len(weights["levels"]) == 1024 * 1025 // 2 and weights["read"]
    for h in range(4):
        assert cards[f"thumb-{h}"]["export"]["shape"] == [figures.THUMB_MAX_CELLS] * 2
    # a click on another head reads its levels: gzip too (they are mostly 0)
    url = html.unescape(re.search(r'data-values="([^"]*)"', r.text).group(1))
    head = client.get(url + "&levels=head-1", headers={"Accept-Encoding": "gzip"})
    assert head.headers["content-encoding"] == "gzip" and len(head.content) == 1024 * 1025 // 2
    assert head.num_bytes_downloaded < len(head.content) / 2
    assert 1024 >= STAGES_ON_REQUEST_TOKENS
    r = update(client, stages="1")
    assert all(f'data-plot-key="stage-{k}"' in r.text for k in ("raw", "scaled", "masked", "weights"))
    assert r.headers["HX-Push-Url"].endswith("&stages=1")


def test_a_matrix_travels_in_its_own_precision_and_the_attribute_is_escaped_as_autoescape_would():
    fig = {
        "z": np.array([[0.1, np.nan]]),
        "z32": np.array([[0.1, np.nan]], dtype=np.float32),
        "levels": np.array([0, 255], dtype=np.uint8),
        "label": '<b>"it\'s" & more</b>',
    }
    out = figure_json(fig)
    assert str(out) == str(
        escape(json.dumps(json.loads(html.unescape(out)), separators=(",", ":"), ensure_ascii=False))
    )
    packed = json.loads(html.unescape(out))
    assert packed["z"]["dtype"] == "f8" and packed["z32"]["dtype"] == "f4" and packed["levels"]["dtype"] == "u1"
    assert np.frombuffer(base64.b64decode(packed["z32"]["bdata"]), "<f4")[0] == np.float32(0.1)
    assert base64.b64decode(packed["levels"]["bdata"]) == b"\x00\xff" and packed["levels"]["shape"] == "2"


def test_the_page_draws_up_to_a_models_own_context_where_it_is_shorter(client):
    # core/trained/induction: learned positions, n_positions 64 in its config.json
    r = client.get("/", params={"model": "induction", "text": "ab" * 32})
    assert r.status_code == 200 and "Up to 64 tokens." in r.text
    r = client.get("/", params={"model": "induction", "text": "ab" * 32 + "a"}, headers=HX)
    assert r.status_code == 422
    assert "the explorer draws up to 64 (induction's context is 64 tokens)" in html.unescape(r.text)
    # the toy's context is the API's limit: the page takes all of it
    assert "Up to 1,024 tokens." in client.get("/", params={"model": "toy", "text": "ab"}).text
