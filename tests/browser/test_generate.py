"""Writing with a model in a real browser against a real server: the text streamed onto the page equals
what POST /api/v1/generate answers for the same settings, Stop stops it, a click on a token shows its
distribution and its attention, and bad settings are said in place.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from app.pages.figures import visible
from app.pages.generate import WRITING_MODEL

pytestmark = pytest.mark.browser

API = """async (body) => {
  const r = await fetch('/api/v1/generate', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                             body: JSON.stringify(body)});
  return await r.json();
}"""
SHOWN = "() => Array.from(document.querySelectorAll('#gen-output button.gen-tok'), b => b.textContent)"
STATUS = "#gen-status"


def wait_done(page) -> None:
    page.wait_for_function("() => /^(Done|Stopped)/.test(document.querySelector('#gen-status').textContent)")


def test_the_streamed_text_is_the_apis_and_a_click_shows_how_a_token_was_chosen(page, live_server):
    settings = {
        "model": "toy",
        "text": "Ali makan nasi",
        "max_new_tokens": 12,
        "temperature": 0.8,
        "top_k": 20,
        "top_p": 0.9,
        "seed": 7,
    }
    page.goto(f"{live_server}/generate?{urlencode(settings)}")
    wait_done(page)
    expected = page.evaluate(API, settings)
    assert page.evaluate(SHOWN) == expected["generated"]["tokens"]
    assert len(expected["generated"]["tokens"]) == 12
    prompt = page.eval_on_selector_all("#gen-output .gen-prompt", "els => els.map(e => e.textContent)")
    assert prompt == expected["tokens"]
    assert page.text_content(STATUS).startswith("Done: 12 new tokens")

    # a click on the fourth token: its distribution, the drawn token marked, the cut-off where the API says
    page.click("#gen-output button.gen-tok[data-index='3']")
    step = expected["steps"][3]
    page.wait_for_function("() => document.querySelector('#gen-detail-title').textContent.includes('new token 4')")
    assert page.get_attribute("#gen-output button.gen-tok[data-index='3']", "aria-pressed") == "true"
    header = page.eval_on_selector_all("#gen-dist thead th", "els => els.map(e => e.textContent)")
    assert header == ["rank", "token", "the model", "after temperature", "after top-k", "after top-p"]
    rows = page.eval_on_selector_all("#gen-dist tbody tr:not(.cutoff)", "els => els.map(e => e.cells[1].textContent)")
    assert [r.replace(" ★", "") for r in rows] == [visible(c["token"]) for c in step["top"]]
    drawn = page.eval_on_selector("#gen-dist tr.drawn", "e => e.cells[1].textContent")
    assert drawn == visible(step["token"]) + " ★"
    cutoff = page.text_content("#gen-dist tr.cutoff")
    assert f"{step['kept_count']} tokens kept" in cutoff
    assert parse_qs(urlparse(page.url).query)["step"] == ["3"]

    # its attention row for layer 1, head 2, over the prompt and the three new tokens before it
    page.select_option("#gen-layer", "1")
    page.select_option("#gen-head", "2")
    page.wait_for_function("() => document.querySelector('#gen-strip-title').textContent.includes('L1H2')")
    keys = page.eval_on_selector_all("#gen-strip .key", "els => els.map(e => e.textContent)")
    assert keys == [visible(t) for t in expected["tokens"] + expected["generated"]["tokens"][:3]]
    row = step["attention"][1][2]
    best = max(range(len(row)), key=row.__getitem__)
    assert f"most weight on key {best} " in page.text_content("#gen-readout")
    # every head's row as a small multiple; a click on one picks it
    assert page.locator("#gen-heads button.gen-head").count() == 2 * 4
    sinks = {f"L{s['layer']}H{s['head']}" for s in step["sink_heads"]}
    marked = set(
        page.eval_on_selector_all(
            "#gen-heads button.sink", "els => els.map(e => e.dataset.layer + '.' + e.dataset.head)"
        )
    )
    assert marked == {f"{s['layer']}.{s['head']}" for s in step["sink_heads"]} and len(marked) == len(sinks)
    page.click("#gen-heads button.gen-head[data-layer='0'][data-head='1']")
    page.wait_for_function("() => document.querySelector('#gen-strip-title').textContent.includes('L0H1')")
    query = parse_qs(urlparse(page.url).query)
    assert "layer" not in query and query["head"] == ["1"]  # layer 0 is the default

    # the downloads: the whole generation as the API gives it, and this token's distribution
    with page.expect_download() as got:
        page.click("#gen-download-json")
    saved = json.loads(Path(got.value.path()).read_text())
    assert saved["steps"] == expected["steps"] and saved["generated"] == expected["generated"]
    with page.expect_download() as got:
        page.click("#gen-download-csv")
    rows = list(csv.reader(Path(got.value.path()).read_text().splitlines()))
    assert rows[0] == ["rank", "token", "id", "model", "temperature", "top_k", "top_p", "kept", "cut_by", "drawn"]
    assert [int(r[2]) for r in rows[1:]] == [c["id"] for c in step["top"]]

    # the keyboard: → moves to the next token
    page.focus("#gen-output button.gen-tok[data-index='3']")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.activeElement.dataset.index === '4'")
    assert page.watch.page_errors == [] and page.watch.console_errors == []


def test_the_page_opens_on_natural_text_and_its_table_shows_a_space_as_the_explorer_does(page, live_server):
    """The first page writes with a model trained on natural text; a space token in a token's table is ␣
    (figures.visible, as the explorer's labels), not a blank cell."""
    page.goto(f"{live_server}/generate")
    wait_done(page)
    body = json.loads(page.get_attribute("#generate-results", "data-request"))
    assert body["model"] == WRITING_MODEL
    expected = page.evaluate(API, body)
    assert page.evaluate(SHOWN) == expected["generated"]["tokens"]
    # a token whose candidates hold whitespace (natural text: the space between words)
    index = next(i for i, s in enumerate(expected["steps"]) if any(" " in c["token"] for c in s["top"]))
    page.click(f"#gen-output button.gen-tok[data-index='{index}']")
    page.wait_for_function(
        f"() => document.querySelector('#gen-detail-title').textContent.includes('new token {index + 1}')"
    )
    shown = page.eval_on_selector_all("#gen-dist tbody tr:not(.cutoff) span.tok", "els => els.map(e => e.textContent)")
    assert shown == [visible(c["token"]) for c in expected["steps"][index]["top"]]
    assert all(t.strip() for t in shown) and any("␣" in t for t in shown)
    assert page.watch.page_errors == [] and page.watch.console_errors == []


def test_stop_stops_the_text_growing(page, live_server):
    settings = {"model": "toy", "text": "The", "max_new_tokens": 200, "seed": 3}
    page.goto(f"{live_server}/generate?{urlencode(settings)}")
    page.wait_for_function("() => document.querySelectorAll('#gen-output button.gen-tok').length >= 3")
    page.click("#gen-stop-button")
    wait_done(page)
    assert page.text_content(STATUS).startswith("Stopped after")
    shown = page.evaluate(SHOWN)
    page.wait_for_timeout(400)
    assert page.evaluate(SHOWN) == shown and 3 <= len(shown) < 200  # nothing more appears
    assert page.is_disabled("#gen-stop-button")
    expected = page.evaluate(API, settings)["generated"]["tokens"]
    assert shown == expected[: len(shown)]  # what was shown is the generation's beginning


def test_bad_settings_are_said_in_place(page, live_server):
    page.goto(f"{live_server}/generate?model=toy&text=Ali&temperature=-1")
    assert "temperature must be 0 (greedy) or a positive number" in page.text_content("#gen-error")
    page.goto(f"{live_server}/generate?model=all-MiniLM-L6-v2&text=Ali")
    assert "encoder" in page.text_content("#gen-error")
    # the form's Generate swaps the results in place: a top-p of 0 is refused there too
    page.goto(f"{live_server}/generate?model=toy&text=Ali&max_new_tokens=3")
    wait_done(page)
    page.eval_on_selector("#gen-top-p", "el => { el.min = 0; el.value = 0; }")
    page.click("#gen-go")
    page.wait_for_selector("#gen-error")
    assert "top_p must lie in (0, 1]" in page.text_content("#gen-error")
    assert page.watch.page_errors == []
