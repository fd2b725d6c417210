"""Training live, in a real browser against a real server that trains in worker processes.

Start the induction recipe from /train (600 of its 1,000 steps); watch the loss curve grow and a layer-1
head's induction score pass 0.4 (the figures redrawn from the server as records arrive); scrub the step
slider; open the trained model in the explorer and see an induction head there, on a repeated text.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

pytestmark = pytest.mark.browser

TRAIN_TIMEOUT_S = 180  # the default run takes seconds alone; the machine may be busy

# What Plotly drew in a card (null until it is drawn): its traces' x, y and z.
DRAWN = """(selector) => {
  const el = document.querySelector(selector);
  if (!el || !el._fullLayout || !el.data) return null;
  return el.data.map(t => ({x: t.x ? Array.from(t.x) : null, y: t.y ? Array.from(t.y) : null,
                            z: t.z ? Array.from(t.z, row => Array.from(row)) : null}));
}"""


def drawn(page, selector: str) -> list[dict]:
    page.wait_for_function(f"(selector) => ({DRAWN})(selector) !== null", arg=selector)
    return page.evaluate(DRAWN, selector)


def wait_text(page, selector: str, text: str) -> None:
    """(a function, not an expression string: the pages' CSP forbids eval)"""
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.textContent.trim() === t; }",
        arg=[selector, text],
    )


def status_of(page) -> str:
    return page.inner_text('#run-results [data-run-status] [data-field="status"]').strip()


def test_train_watch_the_induction_head_form_and_explore_it(page, live_server):
    page.goto(live_server + "/train")
    page.uncheck('input[name="control"]')  # the default run alone: the control has its own API test
    # 600 of the recipe's 1,000 steps: its layer-1 head passes 0.4 near step 450 (0.61 at 600, 0.73 at 1,000:
    # `python -m core.train induction`), and the rest of the run would only add waiting
    page.fill('input[name="steps"]', "600")
    page.click("button.primary")
    page.wait_for_url("**/train?run=induction-*")
    run_id = parse_qs(urlparse(page.url).query)["run"][0]

    # the loss curve grows while it trains (the run's block is redrawn on every record)
    lengths, deadline = [], time.monotonic() + TRAIN_TIMEOUT_S
    while status_of(page) != "done":
        assert time.monotonic() < deadline, f"still {status_of(page)}"
        try:
            lengths.append(len(drawn(page, "#train-loss .plot")[0]["x"] or []))
        except Exception:  # the block was being swapped: look again
            pass
        time.sleep(0.5)
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), lengths  # new points kept arriving

    # a layer-1 head's induction score passed 0.4: rows are heads L0H0 … L1H3, columns the record steps
    wait_text(page, '#run-results [data-field="status"]', "done")
    heads = np.array(drawn(page, "#train-heads-induction .plot")[0]["z"], dtype=float)
    assert heads.shape[0] == 8 and np.nanmax(heads[4:, -1]) > 0.4 and np.nanmax(heads[4:, 0]) < 0.2

    # scrub the step slider back to the start: the pattern heatmap shows step 0's values at once
    last = np.array(drawn(page, "#train-pattern .plot")[0]["z"], dtype=float)
    page.eval_on_selector(
        "#step-slider", "el => { el.value = 0; el.dispatchEvent(new Event('input', {bubbles: true})); }"
    )
    wait_text(page, "#pattern-step", "0")
    first = np.array(drawn(page, "#train-pattern .plot")[0]["z"], dtype=float)
    assert first.shape == last.shape and not np.allclose(first, last)
    assert parse_qs(urlparse(page.url).query)["step"] == ["0"]  # the scrubbed step is in the URL

    # open it in the explorer: on a repeated text, the chosen layer-1 head attends to what followed the
    # current token last time (the tokens as the page lists them)
    page.click("text=Open in the explorer")
    page.wait_for_url("**/?*model=" + run_id + "*")
    weights = np.array(drawn(page, "#stage-weights .plot")[0]["z"], dtype=float)
    tokens = page.eval_on_selector_all("ol.tokens .tok", "els => els.map(e => e.textContent)")
    n = len(tokens)
    assert weights.shape == (n, n)
    induction = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(1, i):
            induction[i, j] = tokens[j - 1] == tokens[i]
    rows = induction.any(axis=1)
    assert rows.sum() > 5 and (weights * induction).sum(axis=1)[rows].mean() > 0.4
    assert page.watch.page_errors == []


def test_train_an_sae_watch_its_curves_and_open_its_features(page, live_server):
    """The sae recipe from /train: a small top-k SAE on the induction model; its four curves grow as records
    arrive and end as the API's metrics; its page links its features and its SAELens download."""
    page.goto(live_server + "/train?recipe=sae")
    for name, value in (("d_sae", "128"), ("k", "8"), ("steps", "400"), ("batch_size", "64")):
        page.fill(f'input[name="{name}"]', value)
    page.select_option('select[name="hook"]', "blocks.0.hook_resid_post")
    page.click("button.primary")
    page.wait_for_url("**/train?run=sae-*")
    run_id = parse_qs(urlparse(page.url).query)["run"][0]

    lengths, deadline = [], time.monotonic() + TRAIN_TIMEOUT_S
    while status_of(page) != "done":
        assert time.monotonic() < deadline, f"still {status_of(page)}"
        try:
            lengths.append(len(drawn(page, "#train-sae-mse .plot")[0]["x"] or []))
        except Exception:  # the block was being swapped: look again
            pass
        time.sleep(0.3)
    assert lengths == sorted(lengths), lengths  # points only ever arrive
    wait_text(page, '#run-results [data-field="status"]', "done")
    run = page.request.get(f"{live_server}/api/v1/runs/{run_id}").json()
    assert run["sae"] == run_id and run["config"]["k"] == 8
    for key in ("mse", "explained_variance", "l0", "dead_fraction"):
        line = drawn(page, f"#train-sae-{key} .plot")[0]
        assert line["x"] == run["metrics"]["step"]
        assert np.allclose(line["y"], run["metrics"][key])
    assert set(drawn(page, "#train-sae-l0 .plot")[0]["y"]) == {8.0}  # top-k: k features a token
    download = page.get_attribute('a[href$="/download"]', "href")
    assert download == f"/api/v1/saes/{run_id}/download"
    assert page.request.get(live_server + download).headers["content-type"] == "application/zip"
    page.click("text=Open its features")
    page.wait_for_url(f"**/features?*sae={run_id}*")
    assert page.locator("text=" + run_id).count() >= 1
    assert page.watch.page_errors == []


def test_choose_jumprelu_on_the_sae_form_and_train_it(page, live_server):
    """The sae form shows the chosen architecture's own settings only: choosing jumprelu hides k and shows its L0
    weight, initial threshold and bandwidth; the run trains with those (k not sent) and draws the four curves."""
    page.goto(live_server + "/train?recipe=sae")
    assert page.is_visible('input[name="k"]') and not page.is_visible('input[name="l0_coefficient"]')
    page.select_option('select[name="architecture"]', "jumprelu")
    assert not page.is_visible('input[name="k"]') and not page.is_visible('input[name="l1_coefficient"]')
    for name in ("l0_coefficient", "jumprelu_init_threshold", "jumprelu_bandwidth"):
        assert page.is_visible(f'input[name="{name}"]'), name
    assert page.input_value('input[name="jumprelu_init_threshold"]') == "0.01"  # SAELens's default
    for name, value in (("d_sae", "128"), ("steps", "100"), ("batch_size", "64"), ("jumprelu_init_threshold", "0.5")):
        page.fill(f'input[name="{name}"]', value)
    page.select_option('select[name="hook"]', "blocks.0.hook_resid_post")
    page.click("button.primary")
    page.wait_for_url("**/train?run=sae-*")
    run_id = parse_qs(urlparse(page.url).query)["run"][0]
    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    while status_of(page) != "done":
        assert time.monotonic() < deadline, f"still {status_of(page)}"
        time.sleep(0.3)
    wait_text(page, '#run-results [data-field="status"]', "done")
    run = page.request.get(f"{live_server}/api/v1/runs/{run_id}").json()
    assert (run["config"]["architecture"], run["config"]["k"], run["config"]["jumprelu_init_threshold"]) == (
        "jumprelu",
        None,
        0.5,
    )
    for key in ("mse", "explained_variance", "l0", "dead_fraction"):
        line = drawn(page, f"#train-sae-{key} .plot")[0]
        assert line["x"] == run["metrics"]["step"] and np.allclose(line["y"], run["metrics"][key])
    assert len(set(drawn(page, "#train-sae-l0 .plot")[0]["y"])) > 1  # thresholds, not a fixed k
    assert page.watch.page_errors == []
