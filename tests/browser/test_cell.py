"""The explorer's "This cell" panel in Chromium: a click on a stage heatmap opens the cell beside the figures,
the arrow keys move it, the URL says which (a link reopens it), the download is the cell's numbers, the panel
is read out, axe finds nothing at a wide desktop's width (where the panel is beside the figures), a laptop's or a phone's
(where it stacks under them), and a
move at 128 tokens updates the panel within 50 ms on a quiet machine (timed in the page: performance.now() from
the selection to the panel swapped in, static/js/explorer-cell.js)."""

from __future__ import annotations

import json
import os
import statistics
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from . import test_accessibility as a11y
from .test_accessibility import AXE, PHONE, RUN_AXE, SETTLED, WCAG_TAGS

context, tab = a11y.context, a11y.tab  # its fixtures: a context that may inject axe-core

pytestmark = pytest.mark.browser

INDUCTION = "/?model=induction"  # its default text repeats a sentence; it opens on its induction head
BUDGET_MS = 50  # issue 36: opening or moving a cell at 128 tokens
TEXT_128 = ("ali makan nasi lemak di kedai. " * 5)[:128]


def said(page) -> str:
    return page.locator("#cell-said").text_content()


def open_settled(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function(SETTLED)


def click_cell(page, card: str, i: int, j: int) -> None:
    box = page.evaluate(
        """([card, i, j]) => { const el = document.querySelector('#' + card + ' [data-figure]');
        const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis;
        return {x: xa._offset + xa.l2p(j), y: ya._offset + ya.l2p(i)}; }""",
        [card, i, j],
    )
    page.locator(f"#{card} [data-figure]").click(position=box)


def cell_of_url(page) -> str:
    return parse_qs(urlparse(page.url).query)["cell"][0]


def test_click_arrow_keys_url_and_download(tab, live_server):
    open_settled(tab, live_server + INDUCTION)
    assert "Select a cell" in tab.locator("#cell-panel").text_content()
    n = tab.locator("ol.tokens li").count()
    click_cell(tab, "stage-weights", n - 3, 5)
    tab.wait_for_function("() => document.querySelector('#cell-said').textContent.startsWith('Query ')")
    i, j = map(int, cell_of_url(tab).split(","))  # the cell under the pointer
    assert abs(i - (n - 3)) <= 1 and abs(j - 5) <= 1
    assert said(tab).startswith(f"Query {i} ") and f"→ key {j} " in said(tab)
    weights = tab.evaluate("() => document.querySelector('#stage-weights [data-figure]')._explorerShown.data[0].z")
    assert f"Weight {weights[i][j]:.3f} of the row" in said(tab)
    # q, q × k and k: one column per dimension of d_head (16), then the four stages and the values
    assert tab.locator("#cell-qk tbody tr").count() == 3
    assert tab.locator("#cell-qk tbody tr:first-child td").count() == 16
    assert tab.locator("#cell-values tr.output td").count() == 16
    # the keyboard: the focused heatmap's arrow keys move the open cell
    tab.locator("#stage-weights [data-figure]").focus()
    tab.keyboard.press("ArrowLeft")
    tab.wait_for_function(f"() => document.querySelector('#cell-said').textContent.includes('→ key {j - 1} ')")
    tab.keyboard.press("ArrowUp")
    i, j = i - 1, j - 1
    tab.wait_for_function(f"() => document.querySelector('#cell-said').textContent.startsWith('Query {i} ')")
    assert cell_of_url(tab) == f"{i},{j}"
    assert tab.locator("#cell-panel input[name=cell]").input_value() == f"{i},{j}"
    # the download: exactly the contract's fields, this cell's weight as the figure has it
    with tab.expect_download() as info:
        tab.locator("#cell-download").click()
    cell = json.loads(open(info.value.path()).read())
    assert list(cell) == ["layer", "head", "query", "key", "q", "k", "products", "score", "scaled", "masked"] + [
        "weight",
        "row_weights",
        "v",
        "output",
    ]
    assert (cell["query"], cell["key"]) == (i, j)
    # the figure carries the float32 run's numbers as float64, the download as float32's shortest text
    assert np.float32(cell["weight"]) == np.float32(weights[i][j])
    np.testing.assert_array_equal(np.float32(cell["row_weights"]), np.float32(weights[i]))
    assert sum(cell["products"]) == pytest.approx(cell["score"], abs=1e-4)
    # the link reopens the same cell, with its mark on the heatmaps
    url = tab.url
    open_settled(tab, url)
    assert said(tab).startswith(f"Query {i} ") and f"→ key {j} " in said(tab)
    # a new view (another head) keeps the cell open
    tab.locator("label[for=head-1]").click()
    tab.wait_for_function("() => document.querySelector('#attn-title').textContent.includes('head 1')")
    tab.wait_for_function("() => document.querySelector('.cell-where').textContent.includes('head 1')")
    assert cell_of_url(tab) == f"{i},{j}"
    assert tab.watch.page_errors == [] and tab.watch.console_errors == []


def test_rotary_shows_the_unrotated_vectors_one_click_away(tab, live_server):
    open_settled(tab, live_server + "/?positional_embedding_type=rotary&text=hello&cell=4,1")
    assert "after their rotation by position" in tab.locator("#cell-rotary").text_content()
    unrotated = tab.locator(".cell-unrotated table")
    assert not unrotated.is_visible()
    tab.locator(".cell-unrotated summary").click()
    assert unrotated.is_visible()


@pytest.mark.parametrize("width", [1700, 1400, PHONE["width"]])
def test_axe_finds_nothing_and_a_phone_stacks_the_panel_under_the_figures(tab, live_server, width):
    tab.set_viewport_size({"width": width, "height": PHONE["height"]})
    open_settled(tab, live_server + INDUCTION + "&cell=40,30")
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)
    panel = tab.locator("#cell-panel").bounding_box()
    figures = tab.locator("#stage-weights").bounding_box()
    if width < 1600:  # under the figures: a laptop's two columns of heatmaps keep their width
        assert panel["y"] >= figures["y"] + figures["height"]
        assert panel["x"] + panel["width"] <= width
        assert tab.evaluate("() => document.scrollingElement.scrollWidth") <= width
    else:
        assert panel["x"] >= figures["x"] + figures["width"]  # beside them


def test_a_move_at_128_tokens_updates_the_panel_within_50_ms(tab, live_server):
    open_settled(tab, live_server + "/?model=toy&text=" + TEXT_128.replace(" ", "+"))
    assert tab.locator("ol.tokens li").count() == 128
    click_cell(tab, "stage-weights", 100, 50)
    tab.wait_for_function("() => window.explorerCellTimings.length === 1")
    i, j = map(int, cell_of_url(tab).split(","))
    tab.locator("#stage-weights [data-figure]").focus()
    for k, key in enumerate(["ArrowLeft"] * 10 + ["ArrowUp"] * 10):
        tab.keyboard.press(key)
        tab.wait_for_function(f"() => window.explorerCellTimings.length === {k + 2}")
    timings = tab.evaluate("() => window.explorerCellTimings")
    # The budget is a quiet machine's (bench/cell.py measures it there); on a machine busier than its cores
    # (these tests share one with others) it stretches by how much busier: the load average per core.
    busy = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    median = statistics.median(timings)
    print(
        f"cell panel at 128 tokens: opened by a click {timings[0]:.1f} ms; 20 arrow-key moves median "
        f"{statistics.median(timings[1:]):.1f} ms, max {max(timings[1:]):.1f} ms; all 21: median {median:.1f} ms; "
        f"load per core {busy:.1f}"
    )
    assert cell_of_url(tab) == f"{i - 10},{j - 10}"
    assert median <= BUDGET_MS * busy, timings
