"""The attribution page in Chromium: a click on one of the explorer's next-token bars opens it for that token; the
method picker swaps the results and the URL follows; the arrow keys move along the shaded tokens and Enter explains
the prediction after one; the CSV holds the page's numbers; axe finds no WCAG A/AA violation at desktop and phone
widths, in English and Malay, with nothing scrolling sideways."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from .conftest import CHROMIUM, CHROMIUM_ARGS, PageWatch, require_chromium
from .test_accessibility import AXE, PHONE, RUN_AXE, WCAG_TAGS

pytestmark = pytest.mark.browser

TEXT = "Ali makan nasi lemak. Ali makan nasi"

# The pixel at the middle of bar i of a card's horizontal bar chart, in the page's coordinates.
BAR = """([id, i]) => {
  const el = document.querySelector('#' + id + ' .plot');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
  return [r.left + xa._offset + xa.l2p(el.data[0].x[i] / 2), r.top + ya._offset + ya.l2p(i)];
}"""


@pytest.fixture(scope="module")
def context(live_server):
    """A context that lets axe-core be injected despite the pages' CSP, and takes downloads."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_context(bypass_csp=True, viewport={"width": 1400, "height": 1000}, accept_downloads=True)
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


def url(server: str, **params) -> str:
    return server + "/attribution?" + urlencode({"model": "induction", "text": TEXT, **params})


def query(page) -> dict:
    return parse_qs(urlparse(page.url).query)


def test_a_click_on_a_next_token_bar_explains_that_token(tab, live_server):
    tab.goto(live_server + "/?" + urlencode({"model": "induction", "text": TEXT}))
    tab.locator("#next-token").scroll_into_view_if_needed()
    tab.wait_for_function(
        "() => { const el = document.querySelector('#next-token .plot'); return el && el._explainClick; }"
    )
    tokens = json.loads(tab.get_attribute("#next-token .plot", "data-figure"))["export"]["x"]
    x, y = tab.evaluate(BAR, ["next-token", 1])
    tab.mouse.click(x, y)
    tab.wait_for_url("**/attribution?**")
    tab.wait_for_selector("#attribution-text")
    assert query(tab)["target"] == [tokens[1]] and query(tab)["text"] == [TEXT]
    data = json.loads(tab.get_attribute("#attribution-results", "data-attribution"))
    assert data["target"] == tokens[1] and data["position"] == len(data["tokens"]) - 1
    assert f"“{tokens[1]}”" in tab.locator("#attribution-results-title").text_content()
    assert not tab.watch.page_errors and not tab.watch.console_errors


def test_the_method_picker_swaps_the_results_and_the_url_follows(tab, live_server):
    tab.goto(url(live_server))
    tab.wait_for_selector("#attribution-text")
    tab.locator("#a-method").select_option("direct_logit")
    tab.wait_for_selector("#attribution-heads .plot")
    assert query(tab)["method"] == ["direct_logit"]
    tab.wait_for_function(
        "() => { const el = document.querySelector('#attribution-heads .plot'); return el && el._fullLayout; }"
    )
    assert json.loads(tab.get_attribute("#attribution-results", "data-attribution"))["method"] == "direct_logit"
    tab.locator("#a-position").fill("99")
    tab.locator("#a-position").dispatch_event("change")
    tab.wait_for_selector("#attribution-error")
    assert "99" in tab.locator("#attribution-error").text_content() and query(tab)["position"] == ["99"]
    tab.go_back()
    tab.wait_for_selector("#attribution-heads")
    assert not tab.watch.page_errors and all("status of 422" in e for e in tab.watch.console_errors)


def test_the_keyboard_moves_along_the_tokens_and_explains_one(tab, live_server):
    tab.goto(url(live_server, method="saliency"))
    tab.locator("#attribution-text a.tok").first.focus()
    tab.keyboard.press("ArrowRight")
    tab.keyboard.press("ArrowRight")
    assert tab.evaluate("() => document.activeElement.dataset.pos") == "2"
    tab.keyboard.press("End")
    tab.keyboard.press("ArrowLeft")
    at = tab.evaluate("() => document.activeElement.dataset.pos")
    tab.keyboard.press("Enter")
    tab.wait_for_url(f"**position={at}**")
    tab.wait_for_selector("#attribution-text a.tok.explained")
    assert tab.locator("#attribution-text a.tok.explained").get_attribute("data-pos") == at
    assert query(tab)["method"] == ["saliency"]


def test_the_csv_download_holds_the_pages_numbers(tab, live_server, tmp_path):
    tab.goto(url(live_server))
    with tab.expect_download() as info:
        tab.click("#attribution-download-csv")
    path = tmp_path / "scores.csv"
    info.value.save_as(path)
    lines = path.read_text().splitlines()
    data = json.loads(tab.get_attribute("#attribution-results", "data-attribution"))
    assert lines[0] == "position,token,token_id,score" and len(lines) == 1 + len(data["tokens"])
    assert [float(line.rsplit(",", 1)[1]) for line in lines[1:]] == pytest.approx(data["scores"])


@pytest.mark.parametrize("width", [1400, PHONE["width"]])
@pytest.mark.parametrize("lang", ["en", "ms"])
@pytest.mark.parametrize("path", ["/attribution", "/lessons/attribution"])
def test_axe_finds_nothing_and_nothing_scrolls_sideways(tab, live_server, path, width, lang):
    tab.set_viewport_size({"width": width, "height": PHONE["height"]})
    # no target or contrast: the predictions' table is open, its links read too
    params = {"model": "induction", "text": TEXT, "method": "direct_logit"} if path == "/attribution" else {}
    tab.goto(live_server + path + "?" + urlencode({**params, "lang": lang}))
    tab.wait_for_function("() => [...document.querySelectorAll('[data-figure]')].every(el => el._fullLayout)")
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)
    sizes = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"the page is {sizes[0]} px wide in a {sizes[1]} px window"
    assert tab.watch.page_errors == [] and tab.watch.console_errors == []
