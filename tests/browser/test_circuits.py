"""The circuits page in a real browser: the patching sweeps it draws are the API's grids, and a click on a head
shows that head's QK decomposition (the API's terms), with the state in the URL.

What Plotly drew (each plot element's `data`) is compared with the JSON API's numbers, fetched from the same
server by the page itself.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from app.service.circuits import INDUCTION_PREFILL

pytestmark = pytest.mark.browser

DRAWN = """(id) => {
  const el = document.querySelector('#' + id + ' .plot');
  if (!el || !el._fullLayout || !el.data) return null;
  const plain = rows => Array.from(rows, row => Array.from(row, v => Number.isNaN(v) ? null : v));
  return {z: plain(el.data[0].z), x: Array.from(el.data[0].x), y: Array.from(el.data[0].y)};
}"""

# The pixel at the centre of cell (i, j) of a card's heatmap, in the page's coordinates.
CELL = """([id, i, j]) => {
  const el = document.querySelector('#' + id + ' .plot');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
  return [r.left + xa._offset + xa.l2p(j), r.top + ya._offset + ya.l2p(i)];
}"""

API = """async ([path, body]) => {
  const r = await fetch('/api/v1/analysis/' + path, {method: 'POST', headers: {'Content-Type': 'application/json'},
                                                     body: JSON.stringify(body)});
  return await r.json();
}"""

BODY = {
    "model": "induction",
    "clean": INDUCTION_PREFILL.clean,
    "corrupted": INDUCTION_PREFILL.corrupted,
    "answer": INDUCTION_PREFILL.answer,
    "wrong": INDUCTION_PREFILL.wrong,
    "target": "attn_head",
    "direction": "noise",
}


def click_cell(page, card_id: str, i: int, j: int) -> None:
    """Click cell (i, j) of a card's heatmap once circuits.js listens to it (it does once the plot is drawn)."""
    page.locator(f"#{card_id}").scroll_into_view_if_needed()
    page.wait_for_function(
        "(id) => { const el = document.querySelector('#' + id + ' .plot');"
        " return el && el._fullLayout && el._circuitsPick; }",
        arg=card_id,
    )
    x, y = page.evaluate(CELL, [card_id, i, j])
    page.mouse.click(x, y)


def drawn(page, card_id: str) -> dict:
    page.locator(f"#{card_id}").scroll_into_view_if_needed()
    page.wait_for_function(f"() => ({DRAWN})({card_id!r}) !== null")
    return page.evaluate(DRAWN, card_id)


def test_the_sweeps_drawn_are_the_apis_and_a_head_click_shows_its_qk_circuit(page, live_server):
    page.goto(f"{live_server}/circuits?model=induction")
    for card, frozen in (("patching-recomputed", False), ("patching-frozen", True)):
        fig = drawn(page, card)
        api = page.evaluate(API, ["patching", BODY | {"frozen_attention": frozen}])
        np.testing.assert_array_equal(np.array(fig["z"], dtype=float), np.array(api["grid"], dtype=float))
        assert fig["y"] == api["rows"] and fig["x"] == api["columns"]
    assert "L0H2's output removes" in page.locator("#walk").text_content()

    # a click on the cell of layer 0, head 2 picks that head: its QK decomposition, the API's terms
    click_cell(page, "patching-recomputed", 0, 2)
    page.wait_for_function("() => document.querySelector('#qk-title').textContent.includes('L0H2')")
    query = parse_qs(urlparse(page.url).query)
    assert query["layer"] == ["0"] and query["head"] == ["2"] and "query" not in query
    qk = page.evaluate(API, ["qk-circuit", {"model": "induction", "text": BODY["clean"], "layer": 0, "head": 2}])
    page.wait_for_function(
        f"() => {{ const d = ({DRAWN})('qk-circuit'); return d && d.y.length === "
        f"{len(qk['query_parts'])} && d.x.length === {len(qk['key_parts'])}; }}"
    )
    fig = drawn(page, "qk-circuit")
    # the model's weights are float32: so are the terms, which JSON writes as float32's shortest digits
    np.testing.assert_array_equal(np.array(fig["z"], dtype=np.float32), np.array(qk["contributions"], dtype=np.float32))
    assert fig["y"] == qk["query_parts"] and fig["x"] == qk["key_parts"]
    assert f"score {qk['score']:.4f}" in page.locator("#qk-summary").text_content()

    # and a row of the K-composition grid picks that later head: layer 1, head 0 (its first cell: the
    # top right ones lie under Plotly's mode bar once the pointer is over the plot)
    click_cell(page, "composition-k", 0, 0)
    page.wait_for_function("() => document.querySelector('#qk-title').textContent.includes('L1H0')")
    assert "L0H2 through its keys" in page.locator("#composition-summary").text_content()
    assert not page.watch.page_errors and not page.watch.console_errors


def test_a_bad_setting_is_said_in_place_and_the_model_switch_brings_its_own_texts(page, live_server):
    page.goto(f"{live_server}/circuits?model=induction")
    page.locator("#c-corrupted").fill("abc")
    page.locator("#c-corrupted").dispatch_event("change")
    page.wait_for_selector("#patching-error")
    assert "corrupted text 3" in page.locator("#patching-error").text_content()
    page.locator("#c-model").select_option("toy")
    page.wait_for_function("() => document.querySelector('#c-clean').value.startsWith('Ali makan')")
    page.wait_for_selector("#patching-recomputed")
    assert page.locator("#c-model").input_value() == "toy" and "makan" in page.locator("#c-corrupted").input_value()
    # the browser logs the 422 the error came with (htmx swaps it in place); nothing else
    assert not page.watch.page_errors and all("status of 422" in e for e in page.watch.console_errors)


BARS = """(id) => {
  const el = document.querySelector('#' + id + ' .plot');
  if (!el || !el._fullLayout || !el.data) return null;
  return el.data.map(t => ({name: t.name, x: Array.from(t.x)}));
}"""


def test_the_explorers_ablation_draws_both_and_its_head_picker_opens_the_heads_circuits(page, live_server):
    """The explorer on the induction example with L0H2 ablated: the next-token chart with later attention recomputed
    and the one with it frozen, side by side in the same panel (the repeat's 'a' collapses in the first, not in
    the second); then the head picker's link opens /circuits on the same model and head."""
    page.goto(f"{live_server}/?model=induction&text={INDUCTION_PREFILL.clean}&ablate=0.2&layer=0&head=2")
    charts = {}
    for card in ("next-token", "next-token-frozen"):
        page.locator(f"#{card}").scroll_into_view_if_needed()
        page.wait_for_function(f"() => ({BARS})({card!r}) !== null")
        charts[card] = {t["name"]: t["x"] for t in page.evaluate(BARS, card)}
    before = charts["next-token"]["without ablation"]
    assert charts["next-token-frozen"]["without ablation"] == before
    assert charts["next-token"]["with ablation"][0] < 0.5 * before[0] < charts["next-token-frozen"]["with ablation"][0]
    frozen_text = page.locator("#ablation-frozen").text_content()
    assert f"{charts['next-token-frozen']['with ablation'][0]:.4f}" in frozen_text

    page.locator("#head-circuits").click()
    page.wait_for_url("**/circuits?*")
    query = parse_qs(urlparse(page.url).query)
    assert query["model"] == ["induction"] and query["layer"] == ["0"] and query["head"] == ["2"]
    assert "L0H2" in page.locator("#qk-title").text_content()
    drawn(page, "patching-recomputed")
    assert not page.watch.page_errors and not page.watch.console_errors


# The boxes of a plot's visible tick labels on one axis, in page pixels.
TICK_BOXES = """([id, axis]) => {
  const el = document.querySelector('#' + id + ' .plot');
  return Array.from(el.querySelectorAll('.' + axis + 'tick text'), t => t.getBoundingClientRect())
    .filter(r => r.width > 0 && r.height > 0)
    .map(r => [r.left, r.top, r.right, r.bottom]);
}"""


def test_no_heatmaps_tick_labels_run_into_each_other(page, live_server):
    """The QK circuit's key-side labels ("embed", "pos_embed", "L0H0", ...) were drawn upright under columns
    narrower than they are, running together ("embedpos_embed"); every card's labels are now apart."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server}/circuits?model=induction")
    cards = page.eval_on_selector_all("main figure.figure[id] .plot", "els => els.map(e => e.closest('figure').id)")
    assert "qk-circuit" in cards and len(cards) >= 4
    for card in cards:
        drawn(page, card)
        for axis in ("x", "y"):
            boxes = page.evaluate(TICK_BOXES, [card, axis])
            assert boxes, (card, axis)
            overlaps = [
                (a, b)
                for k, a in enumerate(boxes)
                for b in boxes[k + 1 :]
                if min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5
            ]
            assert not overlaps, (card, axis, overlaps)
    assert page.watch.page_errors == []


def test_the_attribution_estimate_is_drawn_beside_the_sweep_with_their_rank_correlation(page, live_server):
    """The estimate's heatmap is the API's `method: attribution` grid; the rank correlation printed beside it is
    Spearman's of that grid and the recomputed sweep's (ranked here by NumPy), and each cell named as a
    disagreement differs by at least 0.1 between the two."""
    page.goto(f"{live_server}/circuits?model=induction&target=attn_head&direction=noise")
    fig = drawn(page, "patching-attribution")
    estimate = page.evaluate(API, ["patching", BODY | {"method": "attribution"}])
    exact = page.evaluate(API, ["patching", BODY])
    np.testing.assert_array_equal(np.array(fig["z"], dtype=float), np.array(estimate["grid"], dtype=float))
    assert fig["y"] == estimate["rows"] == exact["rows"] and fig["x"] == estimate["columns"]
    a, b = (np.array(g, dtype=float).ravel() for g in (exact["grid"], estimate["grid"]))
    ra, rb = (np.argsort(np.argsort(g)).astype(float) for g in (a, b))  # no ties in these grids
    rho = float(np.corrcoef(ra, rb)[0, 1])
    assert f"{rho:.3f}" in page.locator("#attribution-spearman").text_content()
    rows, columns = estimate["rows"], estimate["columns"]
    for item in page.locator("#attribution-disagreements li").all_text_contents():
        cell, numbers = item.split(": ", 1)
        row, column = cell.split(", ")
        i, j = rows.index(row), columns.index(column)
        assert abs(a[i * len(columns) + j] - b[i * len(columns) + j]) >= 0.1
        assert f"{a[i * len(columns) + j]:.3f}" in numbers and f"{b[i * len(columns) + j]:.3f}" in numbers
