"""app/pages/figures.py: figure dicts that Plotly draws as the conventions say (pure functions, no browser)."""

import json

import numpy as np
import pytest

from app.pages import figures
from core import causal_mask


def _cells_covered(overlay: dict, n: int) -> np.ndarray:
    """Which [row, col] cells the hatched overlay's rectangles cover."""
    covered = np.zeros((n, n), dtype=bool)
    xs, ys = overlay["x"], overlay["y"]
    for start in range(0, len(xs), 6):  # each rectangle: 5 corners then a None break
        x0, x1 = xs[start], xs[start + 1]
        y0, y1 = ys[start], ys[start + 2]
        covered[int(y0 + 0.5) : int(y1 + 0.5), int(x0 + 0.5) : int(x1 + 0.5)] = True
    return covered


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_causal_overlay_covers_exactly_the_masked_cells(n):
    mask = causal_mask(n)
    scores = np.where(mask, -np.inf, np.arange(n * n, dtype=float).reshape(n, n))
    fig = figures.attention_heatmap(scores, list("abcdefghi"[:n]), kind="scores", mask=mask)
    overlays = [t for t in fig["data"] if t["type"] == "scatter"]
    if n == 1:
        assert overlays == []  # nothing is masked for a single token
        return
    (overlay,) = overlays
    assert (_cells_covered(overlay, n) == mask).all()
    assert overlay["fillpattern"]["shape"]  # hatched, not a colour of the scale
    z = fig["data"][0]["z"]  # NaN where masked: "no value" (null in JSON, a gap in Plotly)
    assert (np.isnan(z) == mask).all()


def test_an_irregular_mask_is_covered_exactly():
    rng = np.random.default_rng(0)
    mask = rng.random((7, 7)) < 0.4
    fig = figures.attention_heatmap(np.zeros((7, 7)), list("abcdefg"), kind="weights", mask=mask)
    assert (_cells_covered(fig["data"][1], 7) == mask).all()


def test_scores_are_diverging_and_centred_on_zero_weights_sequential():
    s = figures.attention_heatmap(np.array([[1.0, -3.0], [2.0, 0.5]]), ["a", "b"], kind="scores")["data"][0]
    assert s["zmid"] == 0 and s["zmin"] == -3.0 and s["zmax"] == 3.0
    assert s["colorscale"] == figures.SCORES_COLORSCALE
    w = figures.attention_heatmap(np.full((2, 2), 0.5), ["a", "b"], kind="weights")["data"][0]
    assert (w["zmin"], w["zmax"]) == (0.0, 1.0) and w["colorscale"] == figures.WEIGHTS_COLORSCALE


def test_axes_are_named_and_repeated_tokens_keep_their_own_rows():
    fig = figures.attention_heatmap(np.eye(3), ["a", "b", "a"], kind="weights")
    assert fig["layout"]["xaxis"]["title"]["text"] == "key token (column)"
    assert fig["layout"]["yaxis"]["title"]["text"] == "query token (row)"
    assert fig["layout"]["yaxis"]["ticktext"] == ["a", "b", "a"]
    assert fig["layout"]["yaxis"]["tickvals"] == [0, 1, 2]


def test_user_text_is_escaped_in_every_label():
    evil = "<img/src=x/onerror=alert(1)>&"
    fig = figures.attention_heatmap(np.eye(2), [evil, " "], kind="weights")
    text = json.dumps(fig["layout"])
    assert "<img" not in text and "&lt;img/src=x/onerror=alert(1)&gt;&amp;" in text
    assert fig["layout"]["xaxis"]["ticktext"][1] == "␣"  # whitespace made visible
    assert fig["export"]["x"] == [evil, " "]  # downloads keep the raw tokens
    bars = figures.probability_bars([evil], [0.5])
    assert "<img" not in json.dumps([bars["layout"], bars["data"][0]["customdata"]])


def test_a_matrix_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"\[3, 3\]"):
        figures.attention_heatmap(np.zeros((2, 3)), ["a", "b", "c"], kind="scores")
