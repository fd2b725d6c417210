"""The Inspect pages and the explorer's ablation and rollout, server side: the figures hold the API's
numbers, links carry the explorer's state, and what does not apply says why."""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from tests.pages.figure_data import cards

HX = {"HX-Request": "true"}
MINILM = "all-MiniLM-L6-v2"


def api(client, path, **body):
    r = client.post(f"/api/v1/{path}", json=body)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def test_explorer_links_to_every_inspect_view_with_its_state(client):
    page = client.get("/", params={"text": "the cat", "causal": 0, "layer": 1, "ablate": "0.2"}).text
    links = [html.unescape(u) for u in re.findall(r'<a href="(/inspect\?[^"]+)"', page)]
    assert [parse_qs(urlparse(u).query)["view"][0] for u in links] == [
        "decompose",
        "lens",
        "detectors",
        "kvcache",
        "compare",
    ]
    for url in links:
        q = parse_qs(urlparse(url).query)
        assert q["text"] == ["the cat"] and q["causal"] == ["0"] and q["layer"] == ["1"] and q["ablate"] == ["0.2"]


def test_ablating_in_the_explorer_shows_the_apis_change(client):
    page = client.get("/", params={"text": "the cat sat", "ablate": ["1.3", "0.0"], "layer": 1}).text
    effect = api(
        client, "run", text="the cat sat", top_k=10, ablate=[{"layer": 0, "head": 0}, {"layer": 1, "head": 3}]
    )["ablation_effect"]
    bars = cards(page)["next-token"]["data"]
    assert [t["name"] for t in bars] == ["without ablation", "with ablation"]
    assert bars[0]["x"] == [c["baseline_prob"] for c in effect["changes"]]
    assert bars[1]["x"] == [c["prob"] for c in effect["changes"]]
    assert 'id="ablate-1-3" checked' in page and 'id="ablate-1-0" checked' not in page
    assert '<input type="hidden" name="ablate" value="0.0">' in page  # another layer's ablation is kept
    assert "ablation-effect" in page


def test_heads_that_no_longer_exist_are_dropped_from_the_url(client):
    r = client.get("/", params={"text": "abc", "ablate": ["0.3", "0.1"], "n_heads": 2}, headers=HX)
    assert r.status_code == 200 and parse_qs(urlparse(r.headers["hx-push-url"]).query)["ablate"] == ["0.1"]


def test_rollout_option_draws_the_rollout_of_the_chosen_layer(client):
    figure = cards(client.get("/", params={"text": "the cat", "rollout": 1, "layer": 1}).text)["rollout"]
    expected = api(client, "analysis/rollout", text="the cat")["rollout"][1]
    np.testing.assert_array_equal(np.array(figure["data"][0]["z"], dtype=float), expected)


def test_decompose_page_is_the_apis_decomposition(client):
    page = client.get("/inspect", params={"view": "decompose", "text": "the cat", "pos": 2, "target": 40}).text
    d = api(client, "analysis/decompose", text="the cat", pos=2, target=40)
    bars = cards(page)["decompose-waterfall"]["data"][0]
    assert bars["y"][:-2] == d["direct_logit"] and bars["y"][-2] == d["logit_bias"] and bars["y"][-1] == d["logit"]
    # each floating bar starts where the previous one ended, and the last step lands on the logit
    assert bars["base"][-2] + bars["y"][-2] == pytest.approx(d["logit"], abs=1e-9)


def test_lens_page_labels_cells_with_the_apis_top_tokens(client):
    fig = cards(client.get("/inspect", params={"view": "lens", "text": "abc"}).text)["lens-heatmap"]
    lens = api(client, "analysis/logit-lens", text="abc", top_k=5)
    assert fig["data"][0]["z"] == [[cell[0]["prob"] for cell in point] for point in lens["top_k"]]
    assert fig["data"][0]["text"] == [
        [html.escape(cell[0]["token"], quote=False) for cell in point] for point in lens["top_k"]
    ]


def test_detectors_page_has_a_heatmap_per_detector_and_sequence(client):
    figs = cards(client.get("/inspect", params={"view": "detectors", "text": "abcabc", "random_length": 6}).text)
    r = api(client, "analysis/detectors", text="abcabc", random_length=6)
    for name, by in r["detectors"].items():
        for on, grid in by.items():
            assert figs[f"detector-{name}-{on}"]["data"][0]["z"] == grid


def test_kv_cache_page_shows_every_step(client):
    page = client.get("/inspect", params={"view": "kvcache", "text": "Ali", "n_new": 4}).text
    rows = re.findall(r"<tr[^>]*>\s*<td>(\d+)</td>", page.split('id="kv-steps"')[1])
    assert rows == [str(i) for i in range(7)]
    assert len(cards(page)["kv-bytes"]["data"]) == 2  # reading, then generating


def test_compare_page_draws_both_sides_and_their_difference(client):
    page = client.get(
        "/inspect", params={"view": "compare", "text": "the cat", "layer": 1, "head": 2, "b_causal": 0}
    ).text
    figs = cards(page)
    r = api(client, "analysis/compare", text="the cat", layer=1, head=2, other={"causal": False})
    assert figs["compare-a"]["data"][0]["z"] == r["a"]["pattern"]
    assert figs["compare-b"]["data"][0]["z"] == r["b"]["pattern"]
    assert figs["compare-difference"]["data"][0]["z"] == r["difference"]
    same_length = cards(client.get("/inspect", params={"view": "compare", "text": "the cat", "b_text": "a dog!!"}).text)
    assert {"compare-a", "compare-b", "compare-difference"} <= set(same_length)
    unequal = client.get("/inspect", params={"view": "compare", "text": "the cat", "b_text": "the dogs"}).text
    assert "7 and 8 tokens" in unequal


def test_views_that_do_not_apply_say_why(client):
    models = client.app.state.catalog
    if MINILM not in models or models[MINILM].error:
        pytest.skip(f"{MINILM} is not runnable here")
    for view in ("decompose", "lens", "kvcache"):
        page = client.get("/inspect", params={"view": view, "model": MINILM})
        assert page.status_code == 200 and 'id="not-applicable"' in page.text and "encoder" in page.text
        assert "data-figure" not in page.text
    page = client.get("/inspect", params={"view": "kvcache", "causal": 0}).text
    assert 'id="not-applicable"' in page and "causal mask" in page


def test_bad_inspect_input_is_a_422_in_place(client):
    r = client.get("/inspect", params={"view": "decompose", "text": "abc", "pos": 9})
    assert r.status_code == 422 and "outside the text" in r.text
    r = client.get("/inspect", params={"view": "nope"}, headers=HX)
    assert r.status_code == 422 and "is not one of" in r.text and "<html" not in r.text


def test_the_compare_view_of_an_encoder_compares_the_scaling(client):
    """MiniLM has no causal toggle: with nothing chosen, side B is the same run without the 1/√d_head scale
    (flipping the mask, the decoders' default, would be refused)."""
    page = client.get("/inspect", params={"view": "compare", "model": "all-MiniLM-L6-v2", "text": "the cat sat"})
    assert page.status_code == 200, page.text[:300]
    figs = cards(page.text)
    r = client.post(
        "/api/v1/analysis/compare", json={"model": "all-MiniLM-L6-v2", "text": "the cat sat", "other": {"scale": False}}
    )
    assert r.status_code == 200, r.text[:300]
    # MiniLM runs in float32: the same float32 numbers (JSON writes them short, the figure as float64)
    np.testing.assert_array_equal(
        np.array(figs["compare-b"]["data"][0]["z"], dtype=np.float32),
        np.array(r.json()["b"]["pattern"], dtype=np.float32),
    )
