"""The /features page in Chromium, on a real server whose EXPLORER_SAES_DIR holds a small SAE written here (random
weights at the induction model's blocks.0.hook_resid_post): the heatmap is drawn, a token and a feature open their
panels by click and by keyboard with the URL following, the downloads hold the page's numbers, and axe finds no
WCAG A/AA violation at desktop and phone widths, in English and Malay, with nothing scrolling sideways."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from core.sae import save_sae
from tests.api.test_saes import TEXT, _sae

from .conftest import CHROMIUM, CHROMIUM_ARGS, SERVER_START_TIMEOUT_S, PageWatch, liveserver, require_chromium
from .test_accessibility import AXE, PHONE, RUN_AXE, WCAG_TAGS

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory(prefix="explorer-saes-") as saes, tempfile.TemporaryDirectory() as runs:
        save_sae(_sae(), Path(saes) / "resid0")
        (Path(saes) / "resid0" / "labels.json").write_text(json.dumps([{"index": 3, "label": "a test label"}]))
        env = {"EXPLORER_ACCESS_LOG": "false", "EXPLORER_RUNS_DIR": runs, "EXPLORER_SAES_DIR": saes}
        with liveserver.live_server(env=env, startup_timeout_s=SERVER_START_TIMEOUT_S) as s:
            yield s.url


@pytest.fixture(scope="module")
def context(server):
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


def url(server: str, **extra) -> str:
    from urllib.parse import urlencode

    return server + "/features?" + urlencode({"sae": "resid0", "model": "induction", "text": TEXT, **extra})


def test_click_a_token_then_a_feature(tab, server):
    tab.goto(url(server))
    assert tab.locator("#features-heatmap tbody tr").count() > 0
    tab.locator("#features-heatmap a.tok").nth(2).click()
    tab.wait_for_selector("#features-token-title")
    assert "token=2" in tab.url
    tab.locator("#features-token-title ~ ol a").first.click()
    tab.wait_for_selector("#features-dash-title")
    assert "feature=" in tab.url
    assert tab.locator(".features-examples li").count() > 0
    assert tab.locator("#features-token-title").count() == 1  # the token's panel stays
    tab.go_back()
    tab.wait_for_function("() => !document.querySelector('#features-dash-title')")


def test_the_keyboard_moves_along_the_tokens_and_opens_one(tab, server):
    tab.goto(url(server))
    tab.locator("#features-heatmap a.tok").first.focus()
    tab.keyboard.press("ArrowRight")
    tab.keyboard.press("ArrowRight")
    assert tab.evaluate("() => document.activeElement.dataset.pos") == "2"
    tab.keyboard.press("End")
    last = tab.evaluate("() => document.activeElement.dataset.pos")
    tab.keyboard.press("Enter")
    tab.wait_for_selector("#features-token-title")
    assert f"token={last}" in tab.url


def test_the_csv_download_holds_the_heatmaps_numbers(tab, server, tmp_path):
    tab.goto(url(server))
    with tab.expect_download() as info:
        tab.click("#features-download-csv")
    path = tmp_path / "h.csv"
    info.value.save_as(path)
    lines = path.read_text().splitlines()
    data = json.loads(tab.get_attribute("#features-results", "data-heatmap"))
    assert len(lines) == 1 + len(data["features"])
    first = lines[1].split(",")
    assert int(first[0]) == data["features"][0]
    assert [float(v) for v in first[2:]] == pytest.approx(data["values"][0])


@pytest.mark.parametrize("width", [1400, PHONE["width"]])
@pytest.mark.parametrize("lang", ["en", "ms"])
def test_axe_finds_nothing_and_nothing_scrolls_sideways(tab, server, width, lang):
    tab.set_viewport_size({"width": width, "height": PHONE["height"]})
    tab.goto(url(server, token=1, feature=3, q="test", lang=lang))
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)
    sizes = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"the page is {sizes[0]} px wide in a {sizes[1]} px window"
    assert tab.watch.page_errors == [] and tab.watch.console_errors == []
