"""Long inputs in the figures: image matrices, float32 from FLOAT32_MIN_TOKENS, pooled
thumbnails, and what the explorer page sends at 1,024 tokens."""

from __future__ import annotations

import base64
import html
import json
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


def naive_pool(matrix: np.ndarray, mask: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Block by block with Python loops: each block's largest value ignoring NaN, masked when all are."""
    n = matrix.shape[0]
    f = -(-n // size)
    blocks = range(0, n, f)
    values = np.full((len(blocks), len(blocks)), np.nan)
    masked = np.zeros((len(blocks), len(blocks)), dtype=bool)
    for a, i in enumerate(blocks):
        for b, j in enumerate(blocks):
            block = matrix[i:i + f, j:j + f]
            finite = [v for v in block.ravel() if not np.isnan(v)]
            values[a, b] = max(finite) if finite else np.nan
            masked[a, b] = bool(mask[i:i + f, j:j + f].all())
    return values, masked


@pytest.mark.parametrize("n", [129, 300, 1024])
def test_a_long_thumbnail_is_max_pooled_block_by_block(n):
    rng = np.random.default_rng(n)
    mask = causal_mask(n)
    scores = np.where(mask, -np.inf, rng.normal(size=(n, n)))
    fig = figures.attention_heatmap(scores, ["a"] * n, kind="scores", mask=mask, small=True)
    pooled = np.asarray(fig["data"][0]["z"], dtype=np.float64)
    want, want_mask = naive_pool(np.where(mask, np.nan, scores), mask, figures.THUMB_MAX_CELLS)
    assert pooled.shape[0] <= figures.THUMB_MAX_CELLS
    np.testing.assert_allclose(pooled, want, rtol=1e-6)  # float32 from FLOAT32_MIN_TOKENS
    overlay = next(t for t in fig["data"] if t["type"] == "scatter")
    rows = int(np.round(overlay["y"][2::6].max() + 0.5))  # the overlay covers exactly the pooled mask
    assert rows == want_mask.any(axis=1).nonzero()[0].max() + 1
    assert fig["export"]["pooled"] == -(-n // figures.THUMB_MAX_CELLS)
    assert fig["export"]["draw"] == "image"


@pytest.mark.parametrize(("n", "draw", "dtype"), [(20, None, np.float64), (figures.IMAGE_MIN_TOKENS, "image", np.float64),
                                                  (figures.FLOAT32_MIN_TOKENS, "image", np.float32)])
def test_a_matrix_is_an_image_and_float32_from_its_thresholds(n, draw, dtype):
    weights = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    fig = figures.attention_heatmap(weights, ["x"] * n, kind="weights", mask=causal_mask(n))
    assert fig["export"].get("draw") == draw
    assert fig["data"][0]["z"].dtype == dtype
    np.testing.assert_allclose(fig["data"][0]["z"], weights, rtol=1e-7 if dtype == np.float32 else 0)
    assert fig["data"][0]["xgap"] == 0 or draw is None


def test_the_1024_token_page_sends_the_weights_and_pooled_thumbnails(client):
    text = ("the cat sat on the mat. " * 43)[:1024]
    r = client.get("/", params={"model": "toy", "text": text}, headers=HX)
    assert r.status_code == 200
    found = dict(re.findall(r'data-figure="([^"]*)" data-plot-key="([\w-]+)"', r.text))
    cards = {key: load_figure(html.unescape(value)) for value, key in found.items()}
    assert "stage-weights" in cards and "stage-raw" not in cards  # scores stages on request from 256 tokens
    assert len(cards["stage-weights"]["data"][0]["z"]) == 1024
    for h in range(4):
        assert len(cards[f"thumb-{h}"]["data"][0]["z"]) == figures.THUMB_MAX_CELLS
    assert len(r.content) < 8_000_000  # measured 6.6 MB: the weights at 5.6 MB, thumbnails 0.5 MB
    assert 1024 >= STAGES_ON_REQUEST_TOKENS
    r = client.get("/", params={"model": "toy", "text": text, "stages": "1"}, headers=HX)
    assert all(f'data-plot-key="stage-{k}"' in r.text for k in ("raw", "scaled", "masked", "weights"))
    assert r.headers["HX-Push-Url"].endswith("&stages=1")


def test_a_matrix_travels_in_its_own_precision_and_the_attribute_is_escaped_as_autoescape_would():
    fig = {"z": np.array([[0.1, np.nan]]), "z32": np.array([[0.1, np.nan]], dtype=np.float32),
           "label": "<b>\"it's\" & more</b>"}
    out = figure_json(fig)
    assert str(out) == str(escape(json.dumps(json.loads(html.unescape(out)), separators=(",", ":"),
                                             ensure_ascii=False)))
    packed = json.loads(html.unescape(out))
    assert packed["z"]["dtype"] == "f8" and packed["z32"]["dtype"] == "f4"
    assert np.frombuffer(base64.b64decode(packed["z32"]["bdata"]), "<f4")[0] == np.float32(0.1)


def test_the_page_draws_up_to_a_models_own_context_where_it_is_shorter(client):
    # core/trained/induction: learned positions, n_positions 64 in its config.json
    r = client.get("/", params={"model": "induction", "text": "ab" * 32})
    assert r.status_code == 200 and "Up to 64 tokens." in r.text
    r = client.get("/", params={"model": "induction", "text": "ab" * 32 + "a"}, headers=HX)
    assert r.status_code == 422
    assert "the explorer draws up to 64 (induction's context is 64 tokens)" in html.unescape(r.text)
    # the toy's context is the API's limit: the page takes all of it
    assert "Up to 1,024 tokens." in client.get("/", params={"model": "toy", "text": "ab"}).text
