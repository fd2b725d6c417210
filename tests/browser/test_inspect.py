"""Looking inside in a real browser: one ablation click in the explorer, and one compare view.

What Plotly drew (each plot element's `data`) is compared with the JSON API's numbers, fetched
from the same server by the page itself.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

pytestmark = pytest.mark.browser

# The traces Plotly drew in one card, or null while it is not drawn (figures draw near the viewport).
DRAWN = """(id) => {
  const el = document.querySelector('#' + id + ' .plot');
  if (!el || !el._fullLayout || !el.data) return null;
  const plain = rows => Array.from(rows, row => Array.from(row, v => Number.isNaN(v) ? null : v));
  return el.data.map(t => ({name: t.name || null, x: t.x ? Array.from(t.x) : null, z: t.z ? plain(t.z) : null}));
}"""

API = """async ([path, body]) => {
  const r = await fetch('/api/v1/' + path, {method: 'POST', headers: {'Content-Type': 'application/json'},
                                            body: JSON.stringify(body)});
  return await r.json();
}"""


def drawn(page, card_id: str, n_traces: int) -> list[dict]:
    """Scroll the card into view and wait until Plotly has drawn n_traces traces in it."""
    page.locator(f"#{card_id}").scroll_into_view_if_needed()
    page.wait_for_function(f"() => {{ const d = ({DRAWN})({card_id!r}); return d && d.length === {n_traces}; }}")
    return page.evaluate(DRAWN, card_id)


def test_one_ablation_click_updates_the_prediction_and_later_layers(page, live_server):
    text = "the cat sat"
    page.goto(f"{live_server}/?text=the+cat+sat")
    before = drawn(page, "next-token", 1)[0]["x"]

    page.locator("#ablate-0-1").check()  # one click: ablate layer 0, head 1
    page.wait_for_selector("#ablation-effect")
    assert parse_qs(urlparse(page.url).query)["ablate"] == ["0.1"]
    bars = {t["name"]: t["x"] for t in drawn(page, "next-token", 2)}
    ablated = page.evaluate(API, ["run", {"text": text, "top_k": 10, "ablate": [{"layer": 0, "head": 1}]}])
    assert bars["without ablation"] == before  # the same tokens' probabilities before ...
    assert bars["with ablation"] == [c["prob"] for c in ablated["ablation_effect"]["changes"]]  # ... and after
    assert bars["with ablation"] != before
    effect = page.locator("#ablation-effect").text_content()
    assert "L0H1" in effect and f"{ablated['ablation_effect']['changes'][0]['prob']:.4f}" in effect

    # downstream: layer 1's pattern is the ablated model's, not the original's
    page.locator("label[for=layer-1]").click()
    page.wait_for_function("() => document.querySelector('#attn-title').textContent.includes('layer 1')")
    assert page.locator("input[name=ablate][value='0.1']").count() == 1  # kept while layer 1 is shown
    weights = np.array(drawn(page, "stage-weights", 2)[0]["z"], dtype=float)
    hook = "blocks.1.attn.hook_pattern"
    with_ablation = page.evaluate(API, ["run", {"text": text, "hooks": [hook], "ablate": [{"layer": 0, "head": 1}]}])
    without = page.evaluate(API, ["run", {"text": text, "hooks": [hook]}])
    np.testing.assert_allclose(weights, with_ablation["hooks"][hook][0], rtol=1e-12)
    assert np.abs(weights - np.array(without["hooks"][hook][0])).max() > 1e-6
    assert not page.watch.page_errors


def test_compare_view_draws_both_patterns_and_their_difference(page, live_server):
    page.goto(f"{live_server}/?text=the+cat+sat")
    page.locator(".inspect-links a", has_text="Compare").click()
    page.wait_for_url("**/inspect?view=compare*")
    page.locator("#b_causal").select_option("0")  # B: the same head without the causal mask
    page.wait_for_function("() => new URL(location.href).searchParams.get('b_causal') === '0'")
    a = np.array(drawn(page, "compare-a", 2)[0]["z"], dtype=float)  # heatmap + the mask's hatching
    b = np.array(drawn(page, "compare-b", 1)[0]["z"], dtype=float)
    diff = np.array(drawn(page, "compare-difference", 1)[0]["z"], dtype=float)
    r = page.evaluate(API, ["analysis/compare", {"text": "the cat sat", "other": {"causal": False}}])
    np.testing.assert_array_equal(a, r["a"]["pattern"])
    np.testing.assert_array_equal(b, r["b"]["pattern"])
    np.testing.assert_allclose(diff, b - a, atol=1e-15)
    future = np.triu_indices(len(a), 1)
    assert np.all(a[future] == 0) and np.all(b[future] > 0)  # only B sees the future

    page.locator("#b_text").fill("the dogs sat")  # one token more: no difference, and the page says why
    page.wait_for_selector("p#compare-difference")
    assert "11 and 12 tokens" in page.locator("#compare-difference").text_content()
    assert not page.watch.page_errors and not page.watch.console_errors
