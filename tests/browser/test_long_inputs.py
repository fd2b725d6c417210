"""Long texts in the explorer, in a real browser against a real server: 128 and 1,024 tokens.

From IMAGE_MIN_TOKENS on, an attention matrix travels as its colour levels and is painted by explorer.js
into a canvas under Plotly's axes; its exact values are read from the server when they are read. These
tests read what the page holds and what it painted, and check them against the JSON API's numbers and
against the colour scale computed here: the levels held are the API's pattern's, a drag zooms into a
window of queries × keys and "Reset zoom" goes back, the token labels never overlap (their boxes are
measured), hover and the selected cell say the cell's tokens and the API's value to the digits they print,
the downloads hold the API's numbers (every bit), a click on a head repaints its whole pattern, and the
text box's limit still answers in place past 1,024 tokens.
"""

from __future__ import annotations

import base64
import csv
import json
import math
from decimal import ROUND_HALF_UP, Decimal
from urllib.parse import urlencode

import numpy as np
import pytest

from app.pages.figures import (
    IMAGE_MIN_TOKENS,
    MASK_FILL,
    THUMB_MAX_CELLS,
    WEIGHTS_COLORSCALE,
    token_label,
    weights_levels,
)
from app.settings import get_settings

pytestmark = pytest.mark.browser

SENTENCE = "the cat sat on the mat, then the cat sat on the mat again. "


def long_text(n: int) -> str:
    """n characters (the toy reads one token per character), a repeated sentence."""
    return (SENTENCE * (n // len(SENTENCE) + 1))[:n]


# At 1,024 tokens the toy runs with 2 heads: a layer's patterns are then 2 × 1,024² numbers, which the
# JSON API returns (its max_hook_values); with 4 heads it would refuse them.
CASES = {128: {"model": "toy"}, 1024: {"model": "toy", "n_heads": "2"}}

# The weights figure as the page holds it: its colour levels (base64 of the bytes), its shape and the
# drawn axes' windows.
HELD = """() => {
  const el = document.querySelector('#stage-weights .plot');
  const f = el._explorerShown, full = el._fullLayout, levels = f.export.levels;
  let s = '';
  for (let i = 0; i < levels.length; i += 32768) s += String.fromCharCode.apply(null, levels.subarray(i, i + 32768));
  return {b64: btoa(s), shape: f.export.shape, draw: f.export.draw, values: !!f.data[0].z,
          x: full.xaxis.range.slice(), y: full.yaxis.range.slice(),
          canvas: !!el.querySelector('canvas.matrix-image'), traces: el.data.map(t => t.type)};
}"""

LABEL_BOXES = """(id) => {
  const el = document.querySelector('#' + id + ' .plot');
  const box = s => { const r = s.getBoundingClientRect(); return [+s.dataset.index, r.left, r.top, r.right, r.bottom]; };
  return {y: [...el.querySelectorAll('.axis-labels .y-label')].map(box),
          x: [...el.querySelectorAll('.axis-labels .x-label')].map(box)};
}"""

# The plot area's corners on the page and a cell's centre in the visible canvas' pixels.
GEOMETRY = """() => {
  const el = document.querySelector('#stage-weights .plot');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
  return {left: r.left + xa._offset, top: r.top + ya._offset, width: xa._length, height: ya._length};
}"""

PIXELS = """(cells) => {
  const el = document.querySelector('#stage-weights .plot');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis;
  const canvas = el.querySelector('canvas.matrix-image');
  const ratio = canvas.width / xa._length;
  const ctx = canvas.getContext('2d');
  return cells.map(([i, j]) => Array.from(ctx.getImageData(Math.floor(xa.l2p(j) * ratio), Math.floor(ya.l2p(i) * ratio), 1, 1).data));
}"""


def api_pattern(
    page, live_server, params: dict, text: str, head: int = 0, hook: str = "blocks.0.attn.hook_pattern"
) -> np.ndarray:
    """Layer 0's pattern (or another hook of its), one head, from the JSON API (float64, null as nan):
    [query_pos, key_pos]."""
    body = {"model": params["model"], "text": text, "hooks": [hook], "top_k": 0}
    if "n_heads" in params:
        body["n_heads"] = int(params["n_heads"])
    r = page.request.post(live_server + "/api/v1/run", data=body, timeout=120_000)
    assert r.status == 200, r.text()[:300]
    return np.array(r.json()["hooks"][hook][head], dtype=np.float64)


def shown(value: float) -> str:
    """A weight as the page prints it (JavaScript's toFixed(2): the nearest, a tie upwards; weights are >= 0)."""
    return str(Decimal(value).quantize(Decimal("0.01"), ROUND_HALF_UP))


def held_levels(held: dict) -> list[int]:
    return list(base64.b64decode(held["b64"]))


def causal(n: int) -> np.ndarray:
    return np.triu(np.ones((n, n), dtype=bool), 1)  # the toy is causal


def expected_colour(value: float | None, i: int, j: int) -> tuple[int, int, int]:
    """The colour a weight is painted, computed here from app/pages/figures.py's scale: 256 steps, linear in
    RGB between the scale's stops; a masked cell grey, its hatch a darker cell every 4th diagonal."""
    if value is None:
        hexa = MASK_FILL["fgcolor"] if (i + j) % 4 == 0 else MASK_FILL["bgcolor"]
        return tuple(int(hexa[k : k + 2], 16) for k in (1, 3, 5))
    t = min(255, max(0, math.floor(value * 255 + 0.5))) / 255  # the nearest of 256 steps, half up
    for (t0, c0), (t1, c1) in zip(WEIGHTS_COLORSCALE, WEIGHTS_COLORSCALE[1:]):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            a = [int(c0[k : k + 2], 16) for k in (1, 3, 5)]
            b = [int(c1[k : k + 2], 16) for k in (1, 3, 5)]
            return tuple(round(x + (y - x) * f) for x, y in zip(a, b))
    raise AssertionError(t)


def assert_labels_apart(boxes: dict, at_least: int) -> None:
    """No two label boxes of an axis overlap (measured as drawn), and the axis shows at least `at_least`."""
    for axis, lo, hi in (("y", 2, 4), ("x", 1, 3)):
        drawn = sorted(boxes[axis], key=lambda b: b[lo])
        assert len(drawn) >= at_least, (axis, len(drawn))
        for a, b in zip(drawn, drawn[1:]):
            assert a[hi] <= b[lo] + 0.5, f"{axis} labels {a[0]} and {b[0]} overlap: {a} {b}"


def open_long(page, live_server, n: int, **extra) -> tuple[str, dict]:
    params = CASES[n] | extra
    text = long_text(n)
    page.goto(live_server + "/?" + urlencode(params | {"text": text}), timeout=120_000)
    page.wait_for_function(
        "() => { const el = document.querySelector('#stage-weights .plot');"
        " return el && el._fullLayout && el.querySelector('canvas.matrix-image'); }",
        timeout=120_000,
    )
    # every figure drawn: none of them moves the page's layout any more
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-figure]')].every(el => el._fullLayout && !el._explorerPending)",
        timeout=120_000,
    )
    return text, params


def drag(page, x0: float, y0: float, x1: float, y1: float) -> None:
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=4)
    page.mouse.move(x1, y1, steps=4)
    page.mouse.up()


@pytest.mark.parametrize("n", [128, 1024])
def test_the_painted_weights_are_the_apis_pattern_and_zoom_goes_there_and_back(page, live_server, n):
    assert n >= IMAGE_MIN_TOKENS
    text, params = open_long(page, live_server, n)
    held = page.evaluate(HELD)
    assert held["draw"] == "image" and held["canvas"] and not held["values"]  # levels only: values are read
    assert "heatmap" not in held["traces"]  # no per-cell Plotly heatmap at this size
    api = api_pattern(page, live_server, params, text)
    assert held["shape"] == [n, n] and api.shape == (n, n)
    # the levels the page paints are the API's pattern's, byte for byte (the cells the mask leaves)
    assert held_levels(held) == weights_levels(api, causal(n)).tolist()
    assert held["x"] == [-0.5, n - 0.5] and held["y"] == [n - 0.5, -0.5]
    assert_labels_apart(page.evaluate(LABEL_BOXES, "stage-weights"), at_least=8)
    reset = page.locator("#stage-weights [data-zoom-reset]")
    assert reset.is_hidden()

    # drag across about 12 × 12 cells in the middle of the diagonal (or 30 px, the least a drag zooms:
    # at 1,024 tokens a second drag inside the first window)
    page.locator("#stage-weights").scroll_into_view_if_needed()
    window = [-0.5, n - 0.5]
    for _ in range(3):
        g = page.evaluate(GEOMETRY)
        cell = g["width"] / (window[1] - window[0])
        side = max(12 * cell, 30)
        x0 = g["left"] + g["width"] / 2 - side / 2
        y0 = g["top"] + g["height"] / 2 - side / 2
        drag(page, x0, y0, x0 + side, y0 + side)
        page.wait_for_function(
            "(w) => document.querySelector('#stage-weights .plot')._fullLayout.xaxis.range[1] < w - 1", arg=window[1]
        )
        zoomed = page.evaluate(HELD)
        window = [min(zoomed["x"]), max(zoomed["x"])]
        if window[1] - window[0] < 20:
            break
    lo_x, hi_x = min(zoomed["x"]), max(zoomed["x"])
    lo_y, hi_y = min(zoomed["y"]), max(zoomed["y"])
    assert hi_x - lo_x < 20 and hi_y - lo_y < 20, zoomed  # a window of queries × keys
    assert abs((lo_x + hi_x) / 2 - n / 2) < 10 and abs((lo_y + hi_y) / 2 - n / 2) < 10  # where the drag was
    reset.wait_for(state="visible")

    # every cell whole in the window: painted in its value's colour, read back from the canvas
    cells = [
        (i, j)
        for i in range(int(np.ceil(lo_y + 0.5)), int(np.floor(hi_y - 0.5)) + 1)
        for j in range(int(np.ceil(lo_x + 0.5)), int(np.floor(hi_x - 0.5)) + 1)
    ]
    assert len(cells) >= 25
    painted = page.evaluate(PIXELS, cells)
    masked = np.triu(np.ones((n, n), dtype=bool), 1)  # the toy is causal
    for (i, j), rgba in zip(cells, painted):
        want = expected_colour(None if masked[i, j] else api[i, j], i, j)
        assert max(abs(a - b) for a, b in zip(rgba[:3], want)) <= 1, ((i, j), rgba, want, api[i, j])

    # zoomed in, every token of the window is labelled, still without overlaps
    boxes = page.evaluate(LABEL_BOXES, "stage-weights")
    rows = sorted(b[0] for b in boxes["y"])
    assert rows == list(range(int(np.ceil(lo_y)), int(np.floor(hi_y)) + 1))
    assert_labels_apart(boxes, at_least=5)

    # hover says the cell's tokens and its weight: the API's value, read from the server, to the digits shown
    i, j = cells[len(cells) // 2]
    g = page.evaluate(GEOMETRY)
    xa = page.evaluate(
        "(j) => { const a = document.querySelector('#stage-weights .plot')._fullLayout.xaxis; return a.l2p(j); }", j
    )
    ya = page.evaluate(
        "(i) => { const a = document.querySelector('#stage-weights .plot')._fullLayout.yaxis; return a.l2p(i); }", i
    )
    page.mouse.move(g["left"] + xa, g["top"] + ya)
    hover = page.locator("#stage-weights .cell-hover")
    hover.wait_for(state="visible")
    words = f"query {i} {token_label(text[i])} → key {j} {token_label(text[j])}: weight "
    value = shown(api[i, j])  # the weights stage: a masked cell weighs 0.00
    page.wait_for_function(
        "(t) => document.querySelector('#stage-weights .cell-hover').textContent === t", arg=words + value, timeout=3000
    )
    # a click selects it: the readout below the figure says the same
    page.mouse.click(g["left"] + xa, g["top"] + ya)
    # ... and where this query looks most: its row's largest weight (the first, on a tie)
    peak = int(np.argmax(api[i]))
    readout = (
        words + value + f" · this row's largest weight: key {peak} {token_label(text[peak])} ({shown(api[i, peak])})"
    )
    page.wait_for_function(
        "(t) => document.querySelector('#stage-weights .cell-readout').textContent === t", arg=readout, timeout=3000
    )

    reset.click()
    page.wait_for_function(
        "(n) => document.querySelector('#stage-weights .plot')._fullLayout.xaxis.range[1] === n - 0.5", arg=n
    )
    back = page.evaluate(HELD)
    assert back["x"] == [-0.5, n - 0.5] and back["y"] == [n - 0.5, -0.5]
    reset.wait_for(state="hidden")

    # A click at once after a drag selects a cell of the new window: Plotly, whose double-click
    # (500 ms) goes back, must not count the drag's press as the first click of one.
    g = page.evaluate(GEOMETRY)
    side = max(12 * g["width"] / n, 30)
    x0, y0 = g["left"] + g["width"] / 2 - side / 2, g["top"] + g["height"] / 2 - side / 2
    page.mouse.move(x0, y0)
    page.mouse.down()  # a quick drag: the click below comes well within Plotly's 500 ms of this press
    page.mouse.move(x0 + side, y0 + side, steps=2)
    page.mouse.up()
    page.mouse.click(x0 + side / 2, y0 + side / 2)
    page.wait_for_timeout(300)  # time for what must not come: a double-click's reset follows it by ~40 ms
    selected = page.evaluate(
        "() => { const el = document.querySelector('#stage-weights .plot');"
        " return [el._selected, el._fullLayout.xaxis.range, el._fullLayout.yaxis.range]; }"
    )
    (sel, xr, yr) = selected
    assert xr[1] - xr[0] < n - 1, selected  # still zoomed
    assert sel and min(xr) < sel["j"] < max(xr) and min(yr) < sel["i"] < max(yr), selected
    # ... while a real double-click still goes back to the figure's window, and stays there when
    # repeated (Plotly's default would then autorange onto the painted matrix's placeholder traces)
    for _ in range(2):
        page.mouse.dblclick(x0 + side / 2, y0 + side / 2)
        page.wait_for_function(
            "(n) => document.querySelector('#stage-weights .plot')._fullLayout.xaxis.range[1] === n - 0.5", arg=n
        )
        page.wait_for_timeout(100)  # a second relayout, if any, has come
        back = page.evaluate(HELD)
        assert back["x"] == [-0.5, n - 0.5] and back["y"] == [n - 0.5, -0.5], (back["x"], back["y"])
        reset.wait_for(state="hidden")
    assert page.watch.page_errors == []


def test_at_1024_tokens_the_thumbnails_show_the_pattern_and_the_scores_stages_come_on_request(page, live_server):
    open_long(page, live_server, 1024)
    # pooled thumbnails (at most 128 cells a side): more than the mask and one colour of cells
    colours = page.evaluate("""() => [...document.querySelectorAll('.plot-thumb')].map(el => {
      const c = el.querySelector('canvas.matrix-image');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      const seen = new Set();
      for (let k = 0; k < d.length; k += 4) seen.add(d[k] + ',' + d[k + 1] + ',' + d[k + 2]);
      return seen.size; })""")
    assert len(colours) == 2 and min(colours) > 10, colours
    assert (
        page.evaluate(
            "() => [...document.querySelectorAll('.plot-thumb')].map(el => el._explorerShown.export.shape[0])"
        )
        == [THUMB_MAX_CELLS] * 2
    )
    assert page.locator("#stage-raw").count() == 0  # only the weights until asked
    page.locator("#all-stages").check()
    page.wait_for_function(
        "() => { const el = document.querySelector('#stage-raw .plot');"
        " return el && el.querySelector('canvas.matrix-image'); }",
        timeout=120_000,
    )
    assert "stages=1" in page.url
    assert page.watch.page_errors == []


def test_the_downloads_hold_the_apis_numbers_every_bit(page, live_server):
    """The levels paint; a download reads the values: the CSV and JSON of the weights and the masked scores
    are the API's float64 numbers (a masked score empty in the CSV, null in the JSON)."""
    text, params = open_long(page, live_server, 128)
    for stage, hook in (("weights", "blocks.0.attn.hook_pattern"), ("masked", "blocks.0.attn.hook_attn_scores")):
        api = api_pattern(page, live_server, params, text, hook=hook)
        card = page.locator(f"#stage-{stage}")
        with page.expect_download() as got:
            card.locator("[data-download=csv]").click()
        with open(got.value.path(), newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert len(rows) == 129 and rows[0][0] == "query token (row) \\ key token (column)"
        values = np.array([[float(c) if c else np.nan for c in row[1:]] for row in rows[1:]])
        np.testing.assert_array_equal(values, api)  # every bit; nan where masked, on both sides
        with page.expect_download() as got:
            card.locator("[data-download=json]").click()
        table = json.loads(open(got.value.path(), encoding="utf-8").read())
        np.testing.assert_array_equal(np.array(table["values"], dtype=np.float64), api)
        assert table["x"] == list(text) and table["value"] == ("weight" if stage == "weights" else "score")
    assert page.watch.page_errors == [] and page.watch.console_errors == []


def test_at_1024_tokens_a_click_on_a_head_paints_its_whole_pattern_before_the_page_comes(page, live_server):
    """Pooled thumbnails are not enough: a click on a head reads that head's levels at once and paints its
    whole matrix, while the page's own answer (held back here) is still on its way."""
    text, params = open_long(page, live_server, 1024)
    held_back = []

    def hold(route):
        if route.request.headers.get("hx-request") == "true":
            held_back.append(route)  # answered below, once the head is painted
        else:
            route.continue_()

    page.route(lambda url: "/?" in url, hold)
    page.locator("label[for=head-1]").click()
    want = weights_levels(api_pattern(page, live_server, params, text, head=1), causal(1024)).tolist()
    page.wait_for_function(
        "(n) => { const f = document.querySelector('#stage-weights .plot')._explorerShown;"
        " return f.export.levels.length === n && f.export.read === null; }",
        arg=len(want),
        timeout=30_000,
    )
    assert held_levels(page.evaluate(HELD)) == want
    assert "head 0" in page.locator("#attn-title").inner_text()  # the page's answer has not come
    for _ in range(100):  # the page's request leaves once the head is painted
        if held_back:
            break
        page.wait_for_timeout(50)
    assert len(held_back) == 1
    page.unroute(lambda url: "/?" in url)
    held_back[0].continue_()
    page.wait_for_function("() => document.querySelector('#attn-title').textContent.includes('head 1')", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelector('#stage-weights .plot')._explorerShown.export.read", timeout=60_000
    )
    assert held_levels(page.evaluate(HELD)) == want
    assert page.watch.page_errors == []


def test_past_the_limit_the_text_box_says_so_in_place_and_comes_back(page, live_server):
    limit = get_settings().explorer_max_tokens
    page.goto(live_server + "/?model=toy")
    page.locator("#text").fill(long_text(limit + 1))
    error = page.locator("#results .error-panel")
    error.wait_for()
    assert f"the explorer draws up to {limit:,}" in error.inner_text()
    assert "Up to 1,024 tokens." in page.locator("#text-help").inner_text()
    page.locator("#text").fill(long_text(100))
    page.wait_for_function(
        "() => { const el = document.querySelector('#stage-weights .plot');"
        " return el && el._explorerShown && el._explorerShown.export.shape[0] === 100; }"
    )
    assert page.watch.page_errors == []
