"""Bahasa Melayu in a real browser: a learner switches to BM, types, opens a lesson and trains, and the
language stays through htmx's swaps, Back, a copied URL (in a browser without the cookie) and the
training page's live updates; the Malay pages are axe-clean with lang="ms" and fit a 390 px phone."""

from __future__ import annotations

import time

import pytest

from .test_accessibility import AXE, PHONE, RUN_AXE, SETTLED, WCAG_TAGS, context, tab  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

# One Malay page of each kind; the axe and 390 px check reads every page of tests/pages/test_languages.py too.
MALAY_PAGES = [
    "/lessons/attention?lang=ms",
    "/params?lang=ms",
    "/glossary?lang=ms",
    "/train?lang=ms",
    "/inspect?view=detectors&lang=ms",
    "/generate?lang=ms",
    "/circuits?lang=ms",
]
TRAIN_TIMEOUT_S = 120
# SETTLED waits for the Write page's status to say it has finished, in English; in Malay too
SETTLED_MS = SETTLED.replace("(Done|Stopped)", "(Done|Stopped|Selesai|Dihentikan)")
assert SETTLED_MS != SETTLED


def html_lang(page) -> str:
    return page.evaluate("() => document.documentElement.lang")


def _every_other_page() -> list[str]:
    from tests.pages.test_languages import ALL_PAGES

    return [
        p + ("&" if "?" in p else "?") + "lang=ms"
        for p in ALL_PAGES
        if p + ("&" if "?" in p else "?") + "lang=ms" not in MALAY_PAGES
    ]


@pytest.mark.parametrize("path", MALAY_PAGES + _every_other_page())
def test_a_malay_page_is_axe_clean_and_fits_a_phone(tab, live_server, path):  # noqa: F811
    tab.set_viewport_size({"width": PHONE["width"], "height": PHONE["height"]})
    tab.goto(live_server + path)
    tab.wait_for_function(SETTLED_MS)
    assert html_lang(tab) == "ms"
    sizes = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"{path} is {sizes[0]} px wide in a {sizes[1]} px window"
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)


def test_switch_to_malay_type_go_back_share_the_url_and_train(tab, context, live_server):  # noqa: F811
    context.clear_cookies()  # the pages above chose Malay: this learner starts with the browser's default
    tab.goto(live_server + "/lessons/attention")
    tab.wait_for_function(SETTLED)
    assert html_lang(tab) == "en"

    # the switch: this page, in Malay
    tab.click('.language-switch a[data-language="ms"]')
    tab.wait_for_function("() => document.documentElement.lang === 'ms'")
    assert "lang=ms" in tab.url and tab.locator("#controls-title").inner_text() == "Tetapan"

    # type: htmx swaps the results and pushes a URL that keeps the language
    tab.fill("#text", "Ali makan nasi goreng")
    tab.wait_for_function("() => location.search.includes('goreng')")
    tab.wait_for_function(SETTLED)
    assert "lang=ms" in tab.url
    assert tab.locator("#numbers-title").inner_text().startswith("Pemberat perhatian")
    typed = tab.url

    # Back: the page before the edit, still in Malay
    tab.go_back()
    tab.wait_for_function("() => !location.search.includes('goreng')")
    tab.wait_for_function(SETTLED)
    assert html_lang(tab) == "ms" and "lang=ms" in tab.url

    # a copied URL, opened where there is no cookie: Malay, from the URL alone
    other = context.browser.new_context()
    try:
        shared = other.new_page()
        shared.goto(typed)
        assert html_lang(shared) == "ms" and "goreng" in shared.locator("#weights-table").inner_text()
    finally:
        other.close()

    # a lesson from the nav, then training: every page in Malay, the live status too
    tab.click('.lesson-nav a[href^="/lessons/causal"]')
    tab.wait_for_function("() => location.pathname === '/lessons/causal'")
    assert html_lang(tab) == "ms" and "lang=ms" in tab.url
    tab.click('.site-header nav a[href^="/train"]')
    tab.wait_for_function("() => location.pathname === '/train'")
    tab.click('.tabs a[href*="recipe=nasi-lemak"]')
    tab.wait_for_function("() => location.search.includes('nasi-lemak')")
    tab.fill("#train-steps", "60")
    tab.click("button.primary")
    tab.wait_for_function("() => location.search.includes('run=')")
    assert html_lang(tab) == "ms" and "lang=ms" in tab.url
    malay_status = {"dalam baris gilir", "sedang berjalan", "selesai"}
    seen, deadline = set(), time.monotonic() + TRAIN_TIMEOUT_S
    while "selesai" not in seen:
        assert time.monotonic() < deadline, f"the run did not finish: {seen}"
        try:
            seen.add(tab.inner_text('#run-results [data-run-status] [data-field="status"]').strip())
        except Exception:  # the block was being swapped: look again
            pass
        time.sleep(0.3)
    assert seen <= malay_status, seen  # every status the live updates wrote was Malay
    tab.wait_for_function(SETTLED)
    assert html_lang(tab) == "ms" and tab.locator("#run-title").inner_text().startswith("Larian")
    assert tab.watch.page_errors == [] and tab.watch.console_errors == []


def test_what_the_write_pages_script_writes_is_malay(tab, live_server):  # noqa: F811
    """static/js/generate.js writes the status, a token's story, its table and the heads' readouts from the page's
    words (app/pages/generate.py script_words): after a generation and a click, no English is left on the page."""
    from tests.pages.test_languages import english_left

    tab.goto(live_server + "/generate?model=toy&text=Ali+makan+nasi&max_new_tokens=6&top_k=20&top_p=0.9&seed=3&lang=ms")
    tab.wait_for_function(SETTLED_MS)
    assert tab.text_content("#gen-status").startswith("Selesai: 6 token baharu")
    tab.click("#gen-output button.gen-tok[data-index='2']")
    tab.wait_for_function("() => document.querySelector('#gen-detail-title').textContent.includes('token baharu 3')")
    header = tab.eval_on_selector_all("#gen-dist thead th", "els => els.map(e => e.textContent)")
    assert header == ["tempat", "token", "model", "selepas top-k", "selepas top-p"]
    assert tab.text_content("#gen-summary").startswith("Model memberinya kebarangkalian")
    assert tab.get_attribute("#gen-output button.gen-tok[data-index='2']", "aria-label").startswith("token baharu 3: ")
    assert english_left(tab.content()) == []
    tab.fill("#gen-max", "3")
    tab.click("#gen-go")
    tab.wait_for_function("() => /^Selesai: 3 token baharu/.test(document.querySelector('#gen-status').textContent)")
    assert html_lang(tab) == "ms" and "lang=ms" in tab.url
    assert english_left(tab.content()) == []
    assert tab.watch.page_errors == [] and tab.watch.console_errors == []


def test_a_request_the_server_cannot_answer_is_said_in_malay(tab, live_server):  # noqa: F811
    """static/js/explorer-main.js's messages for a failed htmx request come from base.html's data-request-words."""
    tab.goto(live_server + "/lessons/attention?lang=ms")
    tab.wait_for_function(SETTLED)
    tab.route("**/lessons/attention?*", lambda route: route.fulfill(status=500, body="broken"))
    tab.fill("#text", "Ali makan roti")
    tab.wait_for_selector(".request-error")
    assert tab.inner_text(".request-error").startswith("Pelayan menjawab 500")
    tab.unroute("**/lessons/attention?*")
    tab.route("**/lessons/attention?*", lambda route: route.abort())
    tab.fill("#text", "Ali makan roti canai")
    tab.wait_for_function("() => document.querySelector('.request-error').textContent.startsWith('Pelayan tidak')")
    assert tab.inner_text(".request-error") == "Pelayan tidak dapat dihubungi. Adakah ia masih berjalan?"
