"""Every page for every reader: axe-core finds no WCAG 2.0/2.1 A or AA violation, no page scrolls
sideways on a phone, and the explorer works from the keyboard alone.

axe-core is pinned in package.json (a devDependency: it is read from node_modules by these tests and
never served). Playwright injects it into each page; the context bypasses the page's CSP for that
injection only (the app's own scripts run under the CSP as always).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from app.pages.web import INSPECT_VIEWS

from .conftest import CHROMIUM, CHROMIUM_ARGS, PageWatch, require_chromium

pytestmark = pytest.mark.browser

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
PHONE = {"width": 390, "height": 844}  # a current phone, in CSS pixels
LESSONS = ["attention", "scaling", "causal", "multihead", "positions", "params", "forward"]
PAGES = (
    [
        "/",
        "/?view=compare&rollout=1",
        "/?model=all-MiniLM-L6-v2",
        "/?model=induction&ablate=0.2",
        "/lessons",
        "/params",
        "/docs",
        "/generate",
        "/circuits?model=induction",
    ]
    + [f"/lessons/{name}" for name in LESSONS]
    + [f"/inspect?view={view}" for view in INSPECT_VIEWS]
)

# Waits until every figure of the page is drawn (or the page has none), Swagger UI has rendered and a
# generation has finished.
SETTLED = """() => {
  if (location.pathname === '/docs') return !!document.querySelector('.swagger-ui .opblock');
  if (location.pathname === '/generate') return /^(Done|Stopped)/.test(document.querySelector('#gen-status').textContent);
  const figures = [...document.querySelectorAll('[data-figure]')];
  return figures.every(el => el._fullLayout && !el._explorerPending) && !document.querySelector('.htmx-request');
}"""

RUN_AXE = """async (tags) => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                       nodes: v.nodes.slice(0, 5).map(n => n.target.join(' '))}));
}"""


@pytest.fixture(scope="module")
def context(live_server):
    """A browser context that lets the test inject axe-core despite the pages' CSP."""
    require_chromium()
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run make setup (npm ci installs axe-core)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_context(bypass_csp=True, viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


@pytest.fixture
def tab(context):
    page = context.new_page()
    page.watch = PageWatch(page)
    page.set_default_timeout(20_000)
    try:
        yield page
    finally:
        page.close()


def open_settled(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function(SETTLED)


@pytest.mark.parametrize("path", PAGES)
def test_no_wcag_a_or_aa_violation(tab, live_server, path):
    open_settled(tab, live_server + path)
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)


@pytest.mark.parametrize("path", ["/", "/?model=induction&ablate=0.2", "/generate", "/circuits?model=induction"])
def test_no_wcag_a_or_aa_violation_on_a_phone(tab, live_server, path):
    """What a narrow window changes: lists that scroll (a scrolled region must take the keyboard's focus),
    controls that wrap."""
    tab.set_viewport_size(PHONE)
    open_settled(tab, live_server + path)
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)


# Every page at a current phone's width; the narrowest and widest phones on the widest pages.
PHONE_CASES = [(path, PHONE["width"]) for path in PAGES] + [
    (path, width)
    for path in ("/?view=compare&rollout=1", "/lessons/positions", "/inspect?view=kvcache", "/generate")
    for width in (360, 430)
]


@pytest.mark.parametrize(("path", "width"), PHONE_CASES)
def test_no_sideways_scrolling_on_a_phone(tab, live_server, path, width):
    tab.set_viewport_size({"width": width, "height": PHONE["height"]})
    open_settled(tab, live_server + path)
    sizes = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"{path} is {sizes[0]} px wide in a {sizes[1]} px window"
    # the figures fit the width too (a plot wider than the window would be cut off, not scrolled)
    widest = tab.evaluate(
        "() => Math.max(0, ...[...document.querySelectorAll('.plot')].map(p => p.getBoundingClientRect().right))"
    )
    assert widest <= sizes[1] + 0.5


def test_on_a_phone_the_controls_come_before_the_figures(tab, live_server):
    tab.set_viewport_size(PHONE)
    open_settled(tab, live_server + "/")
    text_box = tab.locator("#text").bounding_box()
    heatmap = tab.locator("#stage-weights").bounding_box()
    assert text_box["y"] + text_box["height"] <= heatmap["y"]
    nav = tab.locator(".site-header nav a").all()
    assert all(a.is_visible() for a in nav)  # the navigation is not cut off
    assert all(a.bounding_box()["x"] + a.bounding_box()["width"] <= PHONE["width"] for a in nav)


def focus_by_tab(page, selector: str, limit: int = 200) -> None:
    """Press Tab until the element matching `selector` has the focus (it must be reachable)."""
    for _ in range(limit):
        if page.evaluate(f"() => document.activeElement?.matches({selector!r})"):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"{selector} was not reached with Tab")


def test_the_explorer_from_the_keyboard_alone(tab, live_server):
    open_settled(tab, live_server + "/?text=the+cat+sat")
    # a layer chip: reached with Tab, chosen with an arrow key
    focus_by_tab(tab, "input[name=layer]")
    tab.keyboard.press("ArrowRight")
    tab.wait_for_function("() => document.querySelector('#attn-title').textContent.includes('layer 1')")
    assert parse_qs(urlparse(tab.url).query)["layer"] == ["1"]
    # the heads: one radio group; the arrow keys move the choice and the four stages follow
    focus_by_tab(tab, "input[name=head]")
    tab.keyboard.press("ArrowRight")
    tab.wait_for_function("() => document.querySelector('#attn-title').textContent.includes('head 1')")
    # an ablation checkbox, toggled with the space bar
    focus_by_tab(tab, "input[name=ablate]")
    tab.keyboard.press("Space")
    tab.wait_for_selector("#ablation-effect")
    assert parse_qs(urlparse(tab.url).query)["ablate"]
    # the weights heatmap: focused with Tab, its cells walked with the arrow keys and read out
    tab.wait_for_function(SETTLED)
    focus_by_tab(tab, "#stage-weights [data-figure]")
    tab.keyboard.press("ArrowDown")  # the first key selects the first cell
    tab.keyboard.press("ArrowDown")
    tab.keyboard.press("ArrowRight")
    readout = tab.locator("#stage-weights .cell-readout")
    assert readout.get_attribute("aria-live") == "polite"
    text = readout.text_content()
    weights = tab.evaluate("() => document.querySelector('#stage-weights [data-figure]').data[0].z[1][1]")
    # the cell, then where its query looks most (in a long text, the cell a reader would hunt for)
    assert re.fullmatch(
        r"query 1 h → key 1 h: weight \d\.\d\d · this row's largest weight: key \d+ \S+ \(\d\.\d\d\)", text
    ), text
    assert text.split(" · ")[0].endswith(f"{weights:.2f}")
    tab.keyboard.press("End")
    assert tab.locator("#stage-weights .cell-readout").text_content().startswith("query 1 h → key 10 t:")
    assert tab.watch.page_errors == [] and tab.watch.console_errors == []


def test_a_click_on_a_cell_reads_it_out(tab, live_server):
    open_settled(tab, live_server + "/?text=abc")
    plot = tab.locator("#stage-weights [data-figure]")
    box = tab.evaluate("""() => { const el = document.querySelector('#stage-weights [data-figure]');
      const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis;
      return {x: xa._offset + xa.l2p(0), y: ya._offset + ya.l2p(2)}; }""")
    plot.click(position=box)
    tab.wait_for_function("() => document.querySelector('#stage-weights .cell-readout').textContent !== ''")
    assert tab.locator("#stage-weights .cell-readout").text_content().startswith("query 2 c → key 0 a: weight ")
