"""XSS in a real browser: twenty payloads typed into every text input of every page and put in
URLs, in headless Chromium against a live server. None may run (each would set window.__xss or
open a dialog), none may become markup (no element with an event handler, no script, no frame),
the browser must report no CSP violation (so escaping, not only the CSP, stopped them), each is
shown as text, and every request the pages make goes to the server on 127.0.0.1.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

import pytest

from tests.browser.conftest import browser, live_server  # noqa: F401  (shared fixtures)

pytestmark = pytest.mark.browser

PAYLOADS = [
    "<script>window.__xss=1;alert(1)</script>",
    '<img src=x onerror="window.__xss=2;alert(2)">',
    '<svg onload="window.__xss=3">',
    "<svg><script>window.__xss=4</script></svg>",
    "javascript:window.__xss=5",
    '<a href="javascript:window.__xss=6">click me</a>',
    '"><script>window.__xss=7</script>',
    "'><img src=x onerror=window.__xss=8>",
    '<iframe srcdoc="<script>parent.__xss=9</script>"></iframe>',
    "<body onload=window.__xss=10>",
    "<details open ontoggle=window.__xss=11>",
    "<b onmouseover=window.__xss=12>bold</b> <i>it</i> <br> <sub>2</sub>",  # Plotly's label markup
    '<a href="javascript:window.__xss=13" target="_blank">plotly link</a>',
    "{{7*7}} {{constructor.constructor('window.__xss=14')()}}",
    "${7*7} ${window.__xss=15}",
    '<math><mi xlink:href="javascript:window.__xss=16">m</mi></math>',
    "<input autofocus onfocus=window.__xss=17>",
    "</textarea></title><script>window.__xss=18</script>",
    '<div hx-get="/healthz" hx-trigger="load" hx-on::after-request="window.__xss=19">h</div>',
    '<img src="http://203.0.113.7/x.png" onerror=window.__xss=20>',
]
assert len(PAYLOADS) == 20

# Markup a payload could have become; the pages themselves contain none of it.
INJECTED = """() => document.querySelectorAll(
  'script:not([src]), iframe, object, embed, body [onload], [onerror], [onmouseover], [ontoggle], ' +
  '[onfocus], [onclick], [*|href^="javascript:" i], [hx-on\\\\:\\\\:after-request]').length"""

SETTLED = "() => !document.querySelector('.htmx-request, .htmx-settling, .htmx-swapping')"

PAGES = [
    "/",
    "/inspect?view=compare",
    "/lessons/attention",
    "/lessons/causal",
    "/lessons/multihead",
    "/lessons/forward",
    "/params",
]
TEXT_INPUTS = "textarea:not([disabled]), input[type=text]:not([disabled]), input:not([type]):not([disabled])"


class Watch:
    """What a tab did: requests, dialogs, CSP reports, page errors."""

    def __init__(self, page) -> None:
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.csp: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("dialog", self._dialog)
        page.on("console", lambda m: self.csp.append(m.text) if "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()


@pytest.fixture(scope="module")
def tab(browser, live_server):  # noqa: F811
    page = browser.new_page()
    page.set_default_timeout(20_000)
    page.watch = Watch(page)
    yield page
    page.close()
    # Everything any page loaded, in every test of this module, came from the live server.
    origin = urlsplit(live_server)
    foreign = [
        u
        for u in page.watch.requests
        if not u.startswith(("data:", "blob:"))
        and (urlsplit(u).hostname != "127.0.0.1" or urlsplit(u).port != origin.port)
    ]
    assert page.watch.requests and not foreign, foreign


def assert_harmless(page, where: str) -> None:
    page.wait_for_function(SETTLED)
    assert page.evaluate("window.__xss") is None, f"payload ran at {where}"
    assert not page.watch.dialogs, (where, page.watch.dialogs)
    assert page.evaluate(INJECTED) == 0, f"payload became markup at {where}"
    assert not page.watch.csp, (where, page.watch.csp)  # escaping stopped it, not just the CSP


def squash(s: str) -> str:
    """Text as the pages show tokens: spaces may be drawn as ␣ and chips are separate boxes."""
    return re.sub(r"[\s␣]+", "", s)


@pytest.mark.parametrize("path", PAGES)
def test_payloads_typed_into_every_text_input(tab, live_server, path):  # noqa: F811
    tab.goto(live_server + path)
    tab.wait_for_function(SETTLED)
    inputs = [el.get_attribute("id") for el in tab.query_selector_all(TEXT_INPUTS) if el.is_visible()]
    if path == "/params":
        assert inputs == [], "a text input appeared on /params: add its payload checks"
        assert_harmless(tab, path)
        return
    assert inputs, f"no text input found on {path}"
    for input_id in inputs:
        for payload in PAYLOADS:
            if tab.locator(f"#{input_id}").count() == 0:  # an error view replaced the controls
                tab.goto(live_server + path)
                tab.wait_for_function(SETTLED)
            box = tab.locator(f"#{input_id}")
            with tab.expect_response(lambda r: urlsplit(r.url).path == urlsplit(live_server + path).path):
                box.fill(payload)
                box.press("Tab")  # inputs without their own trigger update on the form's "change"
            where = f"{path} #{input_id} <- {payload!r}"
            assert_harmless(tab, where)
            if tab.locator(f"#{input_id}").count():
                assert tab.locator(f"#{input_id}").input_value() == payload, where
            else:  # the input's error replaced the view; it quotes (part of) the input as text
                shown = squash(tab.locator("body").inner_text())
                assert any(squash(word) in shown for word in payload.split()), where
            if path == "/" and input_id == "text":
                # The explorer shows each character of the text as a token chip.
                chips = "".join(tab.locator(".tokens .tok").all_text_contents())
                assert squash(chips) == squash(payload), where


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(1, 21))
def test_payloads_in_urls(tab, live_server, payload):  # noqa: F811
    q = quote(payload, safe="")
    # The explorer: the payload is the text, drawn as token chips and heatmap labels.
    tab.goto(f"{live_server}/?text={q}")
    assert_harmless(tab, f"/?text={payload!r}")
    assert squash("".join(tab.locator(".tokens .tok").all_text_contents())) == squash(payload)

    # A lesson whose tokens are the payload's words, drawn as axis labels (written by explorer.js
    # from the figure's escaped tick labels): <b>, <a href> and <br> would become markup if the
    # labels were not escaped.
    tab.goto(f"{live_server}/lessons/attention?text={q}")
    assert_harmless(tab, f"/lessons/attention?text={payload!r}")
    tab.wait_for_function("() => document.querySelector('.plot .axis-labels .x-label')")
    ticks = tab.locator(".plot .axis-labels .x-label").all_text_contents()
    words = payload.split()
    assert ticks[: len(words)] == words, (payload, ticks)

    # Invalid values that the error message repeats back.
    tab.goto(f"{live_server}/?model={q}&n_heads={q}")
    assert_harmless(tab, f"/?model={payload!r}")
    assert squash(payload) in squash(tab.locator("body").inner_text()), "the error should quote the input as text"


def test_the_detectors_catch_real_markup(tab, live_server):  # noqa: F811
    """The checks above can fail: markup put into the page for real is counted, and its inline
    handler is blocked by the CSP and reported."""
    tab.goto(live_server + "/")
    tab.wait_for_function(SETTLED)
    tab.evaluate("""() => { const d = document.createElement('div');
        d.innerHTML = '<img src="/static/none.png" onerror="window.__xss=99">'; document.body.append(d); }""")
    tab.wait_for_function("() => window.__xss === 99 || document.readyState === 'complete'")
    assert tab.evaluate(INJECTED) == 1
    tab.wait_for_timeout(500)  # the failed image load fires onerror, which the CSP refuses
    assert tab.evaluate("window.__xss") is None  # the CSP alone would have stopped this one
    assert any("inline event handler" in m or "script-src" in m for m in tab.watch.csp), tab.watch.csp
    tab.watch.csp.clear()
