"""Every figure of the explorer, the Inspect views, the lessons and the calculator, checked by value.

Each page is fetched as HTML (TestClient); its Plotly figures are the JSON in the `data-figure`
attributes. The expected numbers come from the JSON API (or from core for what the API does not
return), turned into what the figure should show by the definitions written out here: Q Kᵀ from
the returned queries and keys, norms as square roots of sums of squares, dot products of the
returned encoding, the parameter and KV-cache formulas. Each page's test also lists every figure
card the page has, so a figure added later without a value check fails here.
"""

from __future__ import annotations

import math
from html.parser import HTMLParser

import numpy as np
import pytest

from core import lessons
from tests.pages.figure_data import cards, load_figure

TEXT = "the cat sat"
LAYER, HEAD = 1, 2


def every_figure(page: str) -> int:
    return page.count("data-figure=")


def z(figure: dict) -> np.ndarray:
    """A heatmap's values, null (masked) as NaN."""
    return np.array([[np.nan if v is None else v for v in row] for row in figure["data"][0]["z"]], dtype=float)


def api(client, path: str, method: str = "get", **kw) -> dict:
    r = client.request(method, f"/api/v1/{path}", **kw)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def norms(x) -> np.ndarray:
    """Each row's Euclidean length.  # [pos, d] -> [pos]"""
    x = np.asarray(x, dtype=float)
    return np.sqrt((x * x).sum(axis=-1))


def null_as_nan(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def same(actual: np.ndarray, expected: np.ndarray, atol: float = 1e-12) -> None:
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol, equal_nan=True)


# ------------------------------------------------------------------ the explorer


def run_hooks(client, n_layers: int, **toggles) -> dict:
    hooks = ["hook_embed"] + [
        f"blocks.{l}.{h}"
        for l in range(n_layers)
        for h in (
            "hook_resid_pre",
            "hook_resid_mid",
            "hook_resid_post",
            "hook_attn_out",
            "hook_mlp_out",
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_attn_scores",
            "attn.hook_pattern",
        )
    ]
    return api(client, "run", "post", json={"model": "toy", "text": TEXT, "hooks": hooks, "top_k": 10, **toggles})


class _Thumbs(HTMLParser):
    """The head thumbnails: {head: figure} from each <label for="head-h"> holding a data-figure."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[int, dict] = {}
        self._head: int | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "label" and (a.get("for") or "").startswith("head-"):
            self._head = int(a["for"].removeprefix("head-"))
        elif self._head is not None and "data-figure" in a:
            self.figures[self._head] = load_figure(a["data-figure"])
            self._head = None


def thumbnails(page: str) -> dict[int, dict]:
    p = _Thumbs()
    p.feed(page)
    return p.figures


def test_every_explorer_figure_holds_the_apis_numbers(client):
    page = client.get("/", params={"text": TEXT, "layer": LAYER, "head": HEAD}).text
    figs, thumbs = cards(page), thumbnails(page)
    run = run_hooks(client, 2)
    cfg, h = run["config"], run["hooks"]
    b = f"blocks.{LAYER}."
    q = np.array(h[b + "attn.hook_q"])[:, HEAD]  # [pos, d_head]
    k = np.array(h[b + "attn.hook_k"])[:, HEAD]
    raw = q @ k.T  # [query_pos, key_pos]
    same(z(figs["stage-raw"]), raw)
    same(z(figs["stage-scaled"]), raw / math.sqrt(cfg["d_head"]))
    scores = null_as_nan(h[b + "attn.hook_attn_scores"][HEAD])
    same(z(figs["stage-masked"]), scores)
    assert (
        np.isnan(scores).tolist() == np.triu(np.ones_like(raw, bool), 1).tolist()
    )  # causal: masked above the diagonal
    pattern = np.array(h[b + "attn.hook_pattern"])  # [head_index, query_pos, key_pos]
    same(z(figs["stage-weights"]), pattern[HEAD])
    assert sorted(thumbs) == list(range(cfg["n_heads"]))
    for head, fig in thumbs.items():
        same(z(fig), pattern[head])
    # the residual stream's size: the token embedding, then each block's input, middle and output
    stream = ["hook_embed"] + [f"blocks.{l}.hook_resid_{p}" for l in range(2) for p in ("pre", "mid", "post")]
    same(z(figs["residual"]), np.stack([norms(h[name]) for name in stream], axis=1))
    assert figs["residual"]["export"]["x"] == ["hook_embed"] + [
        f"{l} {p}" for l in range(2) for p in ("pre", "mid", "post")
    ]
    writes = [f"blocks.{l}.hook_{w}_out" for l in range(2) for w in ("attn", "mlp")]
    same(z(figs["writes"]), np.stack([norms(h[name]) for name in writes], axis=1))
    assert figs["writes"]["export"]["x"] == [f"{l} {w}_out" for l in range(2) for w in ("attn", "mlp")]
    bars = figs["next-token"]
    assert bars["data"][0]["x"] == [t["prob"] for t in run["top_k"]]
    assert bars["export"]["x"] == [t["token"] for t in run["top_k"]]
    # every figure of the page was checked above
    assert set(figs) == {
        "stage-raw",
        "stage-scaled",
        "stage-masked",
        "stage-weights",
        "residual",
        "writes",
        "next-token",
    }
    assert every_figure(page) == len(figs) + len(thumbs)


def test_the_compare_view_draws_the_pattern_with_and_without_the_mask(client):
    page = client.get("/", params={"text": TEXT, "layer": LAYER, "head": HEAD, "view": "compare"}).text
    figs = cards(page)
    hook = f"blocks.{LAYER}.attn.hook_pattern"
    for causal, card in ((True, "compare-causal"), (False, "compare-bidirectional")):
        pattern = api(client, "run", "post", json={"model": "toy", "text": TEXT, "hooks": [hook], "causal": causal})
        same(z(figs[card]), np.array(pattern["hooks"][hook])[HEAD])
    assert np.triu(z(figs["compare-causal"]), 1).sum() == 0 and np.triu(z(figs["compare-bidirectional"]), 1).sum() > 0


def test_the_compare_view_of_an_unmasked_run(client):
    """Turned the other way: the page's own run is bidirectional, the comparison causal."""
    figs = cards(client.get("/", params={"text": TEXT, "view": "compare", "causal": 0}).text)
    hook = "blocks.0.attn.hook_pattern"
    causal = api(client, "run", "post", json={"model": "toy", "text": TEXT, "hooks": [hook]})["hooks"][hook]
    same(z(figs["compare-causal"]), np.array(causal)[0])


class _Shapes(HTMLParser):
    """Rows of <table class="shapes">: [activation, axes, shape]."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_table = self._in_body = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and "shapes" in (dict(attrs).get("class") or ""):
            self._in_table = True
        elif self._in_table and tag == "tbody":
            self._in_body = True
        elif self._in_body and tag == "tr":
            self.rows.append([])
        elif self._in_body and tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._in_table = self._in_body = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.mark.parametrize("toggles", [{}, {"positional_embedding_type": "rotary", "n_layers": 3}])
def test_the_shapes_table_is_the_shape_of_every_array_the_api_returns(client, toggles):
    parser = _Shapes()
    parser.feed(client.get("/", params={"text": TEXT, **toggles}).text)
    rows = parser.rows
    hooks = api(client, "hooks", params={"model": "toy", **toggles})["hooks"]  # every hook name, with its axes
    run = api(
        client,
        "run",
        "post",
        json={"model": "toy", "text": TEXT, "hooks": [x["name"] for x in hooks], "top_k": 1, **toggles},
    )
    n = len(run["tokens"])
    expected = [["tokens", "[pos]", str((n,))]]
    expected += [[x["name"], x["shape"], str(np.array(run["hooks"][x["name"]], dtype=object).shape)] for x in hooks]
    expected.append(["logits", "[pos, d_vocab]", str((n, run["config"]["d_vocab"]))])
    assert rows == expected


# ------------------------------------------------------------------ the Inspect views (others: test_inspect_page.py)


def test_the_kv_cache_chart_is_the_apis_bytes_per_step(client):
    page = client.get("/inspect", params={"view": "kvcache", "text": "Ali", "n_new": 4}).text
    figs = cards(page)
    steps = api(client, "analysis/kv-cache", "post", json={"model": "toy", "text": "Ali", "n_new": 4})["steps"]
    reading, generating = figs["kv-bytes"]["data"]
    for series, generated in ((reading, False), (generating, True)):
        chosen = [s for s in steps if s["generated"] == generated]
        assert series["x"] == [s["pos"] + 1 for s in chosen] and series["y"] == [s["cache_bytes"] for s in chosen]
    assert set(figs) == {"kv-bytes"} and every_figure(page) == 1


def test_the_decomposition_waterfall_stacks_each_part_on_the_last(client):
    page = client.get("/inspect", params={"view": "decompose", "text": TEXT, "pos": 1}).text
    figs = cards(page)
    d = api(client, "analysis/decompose", "post", json={"model": "toy", "text": TEXT, "pos": 1})
    bars = figs["decompose-waterfall"]["data"][0]
    steps = d["direct_logit"] + [d["logit_bias"]]
    same(np.array(bars["y"]), np.array(steps + [d["logit"]]))
    same(np.array(bars["base"]), np.concatenate([[0.0], np.cumsum(steps)[:-1], [0.0]]), atol=1e-9)
    assert set(figs) == {"decompose-waterfall"} and every_figure(page) == 1


# ------------------------------------------------------------------ the lessons and the calculator


def series(fig: dict) -> dict[str, tuple[list, list]]:
    return {t["name"]: (t["x"], t["y"]) for t in fig["data"]}


@pytest.mark.parametrize("causal", [False, True])
def test_attention_lesson_figures(client, causal):
    query = {"text": "the cat sat on the mat", "seed": 3, "causal": str(causal).lower()}
    page = client.get("/lessons/attention", params=query).text
    figs = cards(page)
    a = api(client, "lessons/attention", params=query)
    same(z(figs["fig-scores"]), null_as_nan(a["scores"]))
    same(z(figs["fig-weights"]), np.array(a["weights"]))
    assert set(figs) == {"fig-scores", "fig-weights"} and every_figure(page) == 2


def test_scaling_lesson_figures(client):
    query = {"dims": "3,16,100", "n_queries": 500, "n_keys": 8, "seed": 2}
    page = client.get("/lessons/scaling", params=query).text
    figs = cards(page)
    rows = api(client, "lessons/scaling", params=query)["rows"]
    dims = [3.0, 16.0, 100.0]
    top = series(figs["fig-top-weight"])
    assert list(top.values()) == [
        (dims, [r["top_weight_unscaled"] for r in rows]),
        (dims, [r["top_weight_scaled"] for r in rows]),
        (dims, [1 / 8] * 3),
    ]
    std = series(figs["fig-std"])
    assert list(std.values()) == [(dims, [r["std"] for r in rows]), (dims, [math.sqrt(d) for d in dims])]
    assert set(figs) == {"fig-top-weight", "fig-std"} and every_figure(page) == 2


def test_causal_lesson_figures(client):
    page = client.get("/lessons/causal", params={"text": "x y z w v", "seed": 4}).text
    figs = cards(page)
    for causal, card in ((False, "fig-without-mask"), (True, "fig-with-mask")):
        a = api(client, "lessons/attention", params={"text": "x y z w v", "seed": 4, "causal": str(causal).lower()})
        same(z(figs[card]), np.array(a["weights"]))
    assert set(figs) == {"fig-without-mask", "fig-with-mask"} and every_figure(page) == 2


def test_multihead_lesson_figures(client):
    query = {"n_heads": 4, "d_model": 12, "seed": 3, "causal": "true"}
    page = client.get("/lessons/multihead", params=query).text
    figs = cards(page)
    heads = api(client, "lessons/multihead", params=query)["heads"]
    assert len(heads) == 4
    for h, head in enumerate(heads):
        same(z(figs[f"fig-head-{h}"]), np.array(head["weights"]))
    assert set(figs) == {f"fig-head-{h}" for h in range(4)} and every_figure(page) == 4


def test_positions_lesson_figures(client):
    query = {"n_pos": 40, "d": 8, "pairs": "1:4,20:23,1:9"}
    page = client.get("/lessons/positions", params=query).text
    figs = cards(page)
    encoding = np.array(api(client, "lessons/positions", params=query)["encoding"])  # [n_pos, d]
    same(z(figs["fig-encoding"]), encoding)
    lines = series(figs["fig-dot-vs-gap"])
    assert list(lines) == ["from position 1", "from position 20"]  # each pair's first position, once
    for start in (1, 20):
        gaps, dots = lines[f"from position {start}"]
        assert gaps == [float(g) for g in range(40 - start)]
        same(np.array(dots), np.array([encoding[start] @ encoding[start + g] for g in range(40 - start)]))
    assert set(figs) == {"fig-encoding", "fig-dot-vs-gap"} and every_figure(page) == 2


def gpt2_small_components(d=768, vocab=50257, n_ctx=1024, layers=12, d_mlp=3072) -> dict[str, tuple[int, bool]]:
    """GPT-2 small's parameters by component, from the architecture (Radford et al., 2019): (count, counted)."""
    return {
        "token table": (vocab * d, True),
        "position table": (n_ctx * d, True),
        "layer norms (gain + bias)": ((2 * layers + 1) * 2 * d, True),
        "attention weights": (layers * 4 * d * d, True),
        "attention biases": (layers * 4 * d, True),
        "MLP weights": (layers * 2 * d * d_mlp, True),
        "MLP biases": (layers * (d_mlp + d), True),
        "causal mask buffers": (layers * n_ctx * n_ctx, False),
        "unembedding (tied)": (d * vocab, False),
    }


def breakdown(fig: dict) -> dict[str, tuple[int, bool]]:
    bars = fig["data"][0]
    names = fig["layout"]["yaxis"]["ticktext"]
    counted = [shape == "" for shape in bars["marker"]["pattern"]["shape"]]  # not counted: hatched
    return {name: (size, c) for name, size, c in zip(names, bars["x"], counted)}


@pytest.mark.parametrize("path", ["/lessons/params", "/params"])
def test_parameter_breakdowns_are_gpt2_smalls_components(client, path):
    page = client.get(path).text
    figs = cards(page)
    shown = breakdown(figs["fig-breakdown"])
    assert shown == gpt2_small_components()
    total = api(client, "params", params={"preset": "gpt2-small"})["total"]
    assert sum(size for size, counted in shown.values() if counted) == total == 124_439_808
    assert set(figs) == ({"fig-breakdown", "fig-kv-cache"} if path == "/params" else {"fig-breakdown"})
    assert every_figure(page) == len(figs)


def test_kv_cache_chart_is_the_formula_for_every_dtype(client):
    query = {"preset": "gpt2-medium", "batch": 3, "seq_len": 3000}
    figs = cards(client.get("/params", params=query).text)
    d, layers = 1024, 24  # GPT-2 medium
    element = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
    lines = series(figs["fig-kv-cache"])
    assert [name.split()[0] for name in lines] == list(element)
    for name, (lengths, sizes) in lines.items():
        assert 3000.0 in lengths and 1024.0 in lengths  # the asked length and n_ctx
        assert sizes == [2.0 * layers * 3 * n * d * element[name.split()[0]] for n in lengths]  # K and V
    api_bytes = api(client, "kv-cache", params=query | {"dtype": "int8"})["bytes"]
    assert dict(zip(*lines["int8 (1 byte)"]))[3000.0] == api_bytes


def test_forward_lesson_figures(client):
    query = {"text": "hello world", "prompt": "low", "seed": 5, "d_model": 8, "n_heads": 4, "d_mlp": 16}
    page = client.get("/lessons/forward", params=query).text
    figs = cards(page)
    probs = api(client, "lessons/forward", params=query)["next_token_probs"]
    bars = figs["fig-next-char"]
    assert bars["export"]["x"] == list(probs) and bars["data"][0]["x"] == list(probs.values())
    f = lessons.forward(query["text"], query["prompt"], 5, 8, 4, 16)  # the API returns no patterns: core does
    pattern = f.cache["blocks.0.attn.hook_pattern"]
    for h in range(4):
        same(z(figs[f"fig-head-{h}"]), pattern[h])
    assert set(figs) == {"fig-next-char"} | {f"fig-head-{h}" for h in range(4)} and every_figure(page) == 5
