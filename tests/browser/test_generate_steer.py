"""The /generate page's steer in a real browser against a real server: the unsteered and steered continuations
side by side (attention recomputed and frozen) are the API's with the page's seed, the steer editor works from
the keyboard and keeps its state in the URL, and axe finds nothing at 1,400 and 390 px in English and Malay with
nothing scrolling sideways."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from .test_accessibility import AXE, PHONE, RUN_AXE, WCAG_TAGS, context  # noqa: F401  (context: a fixture)

pytestmark = pytest.mark.browser

TEXT = "ali makan nasi. ali makan"
STEER = {
    "model": "induction",
    "text": TEXT,
    "max_new_tokens": 8,
    "temperature": 0.8,
    "seed": 5,
    "steer": "means",
    "steer_hook": "blocks.1.hook_resid_pre",
    "steer_a": "ali ali ali\nali makan",
    "steer_b": "nasi nasi",
    "steer_coef": 6,
}
POST = """async ([path, body]) => {
  const r = await fetch(path, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  return await r.json();
}"""
# the stream below the columns has ended (in either language): Stop is off again, and tokens were written
SETTLED = """() => document.querySelector('#gen-stop-button').disabled
  && document.querySelectorAll('#gen-output button.gen-tok').length > 0 && !document.querySelector('.htmx-request')"""
COLUMN = "(key) => Array.from(document.querySelectorAll(`[data-steer-column='${key}'] .gen-tok`), e => e.textContent)"


@pytest.fixture
def tab(context):  # noqa: F811
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    yield page
    page.close()


def test_the_columns_are_the_apis_continuations_and_the_editor_keeps_the_url(tab, live_server):
    tab.goto(f"{live_server}/generate?{urlencode(STEER | {'lang': 'en'})}")
    tab.wait_for_function(SETTLED)
    vector = tab.evaluate(
        POST,
        [
            "/api/v1/analysis/steering-vector",
            {
                "model": "induction",
                "hook": STEER["steer_hook"],
                "texts_a": ["ali ali ali", "ali makan"],
                "texts_b": ["nasi nasi"],
            },
        ],
    )["vector"]
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 8, "temperature": 0.8, "seed": 5}
    steer = [{"hook": STEER["steer_hook"], "vector": vector, "coefficient": 6}]
    for key, extra in (
        ("unsteered", {}),
        ("recomputed", {"steer": steer}),
        ("frozen", {"steer": steer, "frozen_attention": True}),
    ):
        api = tab.evaluate(POST, ["/api/v1/generate", body | extra])
        assert tab.evaluate(COLUMN, key) == api["generated"]["tokens"], key
    # the stream below is the steered one, attention recomputed
    streamed = tab.eval_on_selector_all("#gen-output button.gen-tok", "els => els.map(e => e.textContent)")
    assert streamed == tab.evaluate(COLUMN, "recomputed")
    # differing tokens are marked beyond colour (underlined), and the columns sit side by side
    assert tab.locator("[data-steer-column='recomputed'] .gen-tok.differs").count() >= 1
    tops = tab.eval_on_selector_all("[data-steer-column]", "els => els.map(e => e.getBoundingClientRect().top)")
    assert len(set(tops)) == 1

    # the keyboard: open nothing by mouse, change the coefficient, submit with Enter; the URL follows
    tab.focus("#steer-coef")
    tab.keyboard.press("Control+A")
    tab.keyboard.type("-3")
    tab.keyboard.press("Enter")
    tab.wait_for_function("() => location.search.includes('steer_coef=-3')")
    tab.wait_for_function(SETTLED)
    query = parse_qs(urlparse(tab.url).query)
    assert query["steer"] == ["means"] and query["steer_hook"] == ["blocks.1.hook_resid_pre"]
    api = tab.evaluate(POST, ["/api/v1/generate", body | {"steer": [steer[0] | {"coefficient": -3}]}])
    assert tab.evaluate(COLUMN, "recomputed") == api["generated"]["tokens"]
    # "No steer" by the keyboard: the columns go
    tab.focus("input[name='steer'][value='']")
    tab.keyboard.press("Space")
    tab.focus("#gen-go")
    tab.keyboard.press("Enter")
    tab.wait_for_function("() => !document.querySelector('[data-steer-column]') && !location.search.includes('steer=')")
    assert tab.errors == []


@pytest.mark.parametrize("width", [1400, PHONE["width"]])
@pytest.mark.parametrize("lang", ["en", "ms"])
def test_axe_finds_nothing_and_nothing_scrolls_sideways(tab, live_server, width, lang):
    """With two steers, the editor open, and a third row added (steering nothing yet)."""
    tab.set_viewport_size({"width": width, "height": PHONE["height"]})
    tab.goto(f"{live_server}/generate?{urlencode(STEER | SECOND | {'lang': lang})}")
    tab.wait_for_function(SETTLED)
    assert tab.locator("[data-steer-column]").count() == 3
    tab.click("#steer-add")
    assert tab.locator("[data-steer-row]").count() == 3
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)
    sizes = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"the page is {sizes[0]} px wide in a {sizes[1]} px window"
    assert tab.errors == []


def test_the_explorers_steered_bars_from_the_generate_pages_link(tab, live_server):
    """The side-by-side panel's link opens the explorer with the steer: both bar charts drawn (recomputed and
    frozen), axe finds nothing, and editing the text keeps the steer in the URL."""
    tab.goto(f"{live_server}/generate?{urlencode(STEER | {'lang': 'en'})}")  # the context may hold lang=ms
    tab.wait_for_function(SETTLED)
    tab.click("text=The explorer's next-token bars under this steer")
    figures = """() => [...document.querySelectorAll('[data-figure]')].every(el => el._fullLayout && !el._explorerPending)
      && !document.querySelector('.htmx-request')"""
    tab.wait_for_function(figures)
    assert "steered" in tab.text_content("#next-token h3")
    assert tab.locator("#next-token-frozen .js-plotly-plot, #next-token-frozen [data-figure]").count() >= 1
    tab.add_script_tag(path=str(AXE))
    violations = tab.evaluate(RUN_AXE, WCAG_TAGS)
    assert violations == [], "\n".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}" for v in violations)
    tab.fill("#text", "ali makan nasi")
    tab.wait_for_function(
        "() => { const q = new URLSearchParams(location.search); return q.get('text') === 'ali makan nasi' && "
        "q.get('steer') === 'means' && q.get('steer_coef') === '6.0'; }"
    )
    tab.wait_for_function(figures)
    assert "steered" in tab.text_content("#next-token h3")
    assert tab.errors == []


SECOND = {
    "steer2": "means",
    "steer2_hook": "blocks.0.hook_resid_post",
    "steer2_a": "nasi",
    "steer2_b": "makan",
    "steer2_coef": -2.5,
    "steer2_pos": "0, -1",
}


def test_a_second_steer_added_and_removed_from_the_keyboard(tab, live_server):
    """Add a steer (its row takes the focus, its fields are the URL's steer2…), fill it in by the keyboard and
    generate: the columns are the API's with both steers; a problem of that steer is said under its row after
    the next Generate (and the panel names it); removing it by the keyboard leaves the first steer alone."""
    tab.goto(f"{live_server}/generate?{urlencode(STEER | {'lang': 'en'})}")
    tab.wait_for_function(SETTLED)
    assert tab.locator("[data-steer-row]").count() == 1
    tab.focus("#steer-add")
    tab.keyboard.press("Enter")
    assert tab.locator("[data-steer-row]").count() == 2
    assert tab.evaluate("() => document.activeElement.id") == "steer2-means"
    assert tab.text_content("#steer-announce") == "Steer 2 added"
    assert tab.text_content("#steer-rows [data-steer-row]:nth-child(2) legend") == "Steer 2"
    for selector, value in (
        ("#steer2-a", "nasi"),
        ("#steer2-b", "makan"),
        ("#steer2-coef", "-2.5"),
        ("#steer2-pos", "0, -1"),
    ):
        tab.focus(selector)
        tab.keyboard.press("Control+A")
        tab.keyboard.type(value)
    tab.select_option("#steer2-hook", "blocks.0.hook_resid_post")
    tab.focus("#gen-go")
    tab.keyboard.press("Enter")
    tab.wait_for_function("() => new URLSearchParams(location.search).get('steer2_pos') === '0, -1'")
    tab.wait_for_function(SETTLED)
    query = parse_qs(urlparse(tab.url).query)
    assert query["steer2"] == ["means"] and query["steer2_hook"] == ["blocks.0.hook_resid_post"]
    first = tab.evaluate(
        POST,
        [
            "/api/v1/analysis/steering-vector",
            {
                "model": "induction",
                "hook": STEER["steer_hook"],
                "texts_a": ["ali ali ali", "ali makan"],
                "texts_b": ["nasi nasi"],
            },
        ],
    )["vector"]
    second = tab.evaluate(
        POST,
        [
            "/api/v1/analysis/steering-vector",
            {"model": "induction", "hook": "blocks.0.hook_resid_post", "texts_a": ["nasi"], "texts_b": ["makan"]},
        ],
    )["vector"]
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 8, "temperature": 0.8, "seed": 5}
    steer = [
        {"hook": STEER["steer_hook"], "vector": first, "coefficient": 6},
        {"hook": "blocks.0.hook_resid_post", "vector": second, "coefficient": -2.5, "positions": [0, -1]},
    ]
    api = tab.evaluate(POST, ["/api/v1/generate", body | {"steer": steer}])
    assert tab.evaluate(COLUMN, "recomputed") == api["generated"]["tokens"]

    # a problem of the second steer: under its row, after htmx swapped the results
    tab.focus("#steer2-pos")
    tab.keyboard.press("Control+A")
    tab.keyboard.type("40")
    tab.focus("#gen-go")
    tab.keyboard.press("Enter")
    tab.wait_for_selector("#steer2-error:not([hidden])")
    assert "pos=40 is outside" in tab.text_content("#steer2-error")
    assert tab.is_hidden("#steer-error")
    assert tab.get_attribute("#steer2-pos", "aria-invalid") == "true"
    assert "steer 2: pos=40 is outside" in tab.text_content("#gen-error")

    # removed by the keyboard: the first steer alone again, and the problem goes with the row
    tab.focus("#steer-rows [data-steer-row]:nth-child(2) [data-steer-remove]")
    tab.keyboard.press("Enter")
    assert tab.locator("[data-steer-row]").count() == 1
    assert tab.text_content("#steer-announce") == "Steer 2 removed"
    assert tab.evaluate("() => document.activeElement.id") == "steer-means"
    tab.focus("#gen-go")
    tab.keyboard.press("Enter")
    tab.wait_for_function("() => !location.search.includes('steer2') && location.search.includes('steer=means')")
    tab.wait_for_function(SETTLED)
    api = tab.evaluate(POST, ["/api/v1/generate", body | {"steer": steer[:1]}])
    assert tab.evaluate(COLUMN, "recomputed") == api["generated"]["tokens"]
    assert tab.errors == []
