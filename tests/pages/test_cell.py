"""The explorer's "This cell" panel and its download (`/?…&cell=QUERY,KEY`, app/pages/explorer_cell.py).

The download's numbers are checked against /api/v1/run's hooks for the same run, on the toy, the trained
induction model, the toy with rotary positions and grouped-query Llama and GPT-Neo (no √d_head) checkpoints
from tests/fixtures/families: q and k are the (rotated) query and key of the head (the key/value head's, under
grouped-query attention), their products sum to stage 1's score, which ÷ the model's divisor is stage 2's and
the run's hook_attn_scores, the weight and row are hook_pattern's, v is hook_v's and the weighted values sum to
hook_z's row for the query.
"""

from __future__ import annotations

import html
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
FIELDS = ["layer", "head", "query", "key", "q", "k", "products", "score", "scaled", "masked", "weight", "row_weights"]
FIELDS += ["v", "output"]

# (model, text, toggles, layer, head, query, key, divisor)
CASES = [
    ("toy", "ali makan nasi", {}, 0, 1, 9, 4, None),
    ("toy", "ali makan nasi", {"causal": True}, 1, 0, 3, 7, None),  # a masked cell
    ("induction", "Ali makan nasi lemak. Ali makan nasi lemak.", {}, None, None, None, None, None),  # below
    ("toy", "rotary positions", {"positional_embedding_type": "rotary"}, 0, 2, 11, 5, None),
    ("llama-gqa", "the cat sat on the mat", {}, 1, 3, 5, 2, None),
    ("gpt-neo-local", "the cat sat on the mat", {}, 0, 1, 4, 1, 1.0),  # GPT-Neo does not scale its scores
]


@pytest.fixture(scope="module")
def app_client(client_with, tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for folder in ("llama-gqa", "gpt-neo-local"):
        shutil.copytree(FAMILIES / folder, models / folder)
    return client_with(models_dir=models, access_log=False)


@pytest.fixture(scope="module")
def client_with():  # module-scoped twin of tests/conftest.py's client_with
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    opened = []

    def make(**changes):
        c = TestClient(create_app(Settings(**changes)), raise_server_exceptions=True)
        opened.append(c.__enter__())
        return opened[-1]

    yield make
    for c in opened:
        c.__exit__(None, None, None)


def run_hooks(client, model, text, toggles, layer):
    b = f"blocks.{layer}.attn."
    hooks = [b + h for h in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern")]
    cfg = client.get("/api/v1/hooks", params={"model": model}).json()
    rotary = toggles.get("positional_embedding_type") == "rotary" or any(
        "hook_rot_q" in h["name"] for h in cfg["hooks"]
    )
    if rotary:
        hooks += [b + "hook_rot_q", b + "hook_rot_k"]
    body = {"model": model, "hooks": hooks, "top_k": 0, **toggles}
    if text is not None:
        body["text"] = text
    r = client.post("/api/v1/run", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    return out, {k: np.array(v, dtype=float) if k != b + "hook_attn_scores" else v for k, v in out["hooks"].items()}


def page_params(model, text, toggles, layer, head, query, key):
    params = {"model": model, "layer": layer, "head": head, "cell": f"{query},{key}"}
    if text is not None:
        params["text"] = text
    for k, v in toggles.items():
        params[k] = int(v) if isinstance(v, bool) else v
    return params


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_download_is_the_runs_own_numbers(app_client, case):
    model, text, toggles, layer, head, query, key, divisor = case
    if layer is None:  # the model's own head, the one the explorer opens on: the induction head
        layer, head = app_client.app.state.catalog[model].default_head
    out, hooks = run_hooks(app_client, model, text, toggles, layer)
    cfg = out["config"]
    n = len(out["tokens"])
    b = f"blocks.{layer}.attn."
    pattern = hooks[b + "hook_pattern"][head]  # [query_pos, key_pos]
    if query is None:  # the induction head's strongest look back, at the text's last token
        query = n - 1
        key = int(np.argmax(pattern[query]))
    query, key = min(query, n - 1), min(key, n - 1)  # a tokeniser's few tokens
    r = app_client.get("/", params=page_params(model, text, toggles, layer, head, query, key) | {"part": "cell.json"})
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"].startswith("attachment")
    d = r.json()
    assert list(d) == FIELDS
    assert (d["layer"], d["head"], d["query"], d["key"]) == (layer, head, query, key)
    kv = head // (cfg["n_heads"] // cfg["n_key_value_heads"])
    rotary = cfg["positional_embedding_type"] == "rotary"
    q_hook, k_hook = (b + "hook_rot_q", b + "hook_rot_k") if rotary else (b + "hook_q", b + "hook_k")
    q, k = np.array(d["q"]), np.array(d["k"])
    np.testing.assert_array_equal(q, hooks[q_hook][query, head])  # every bit
    np.testing.assert_array_equal(k, hooks[k_hook][key, kv])
    if rotary:  # the rotation moved them
        assert not np.allclose(q, hooks[b + "hook_q"][query, head]) or query == 0
    np.testing.assert_allclose(np.array(d["products"]), q * k, rtol=1e-6)  # float32 runs multiply in float32
    score = float(np.sum(q * k))
    scale = divisor if divisor is not None else math.sqrt(cfg["d_head"]) * cfg.get("attn_temperature", 1.0)
    tol = 1e-5 * max(1.0, abs(score))  # checkpoints and trained models compute in float32
    assert d["score"] == pytest.approx(score, abs=tol)
    assert d["scaled"] == pytest.approx(d["score"] / scale, abs=tol)
    api_score = out["hooks"][b + "hook_attn_scores"][head][query][key]  # null where masked
    if api_score is None:
        assert d["masked"] is None and d["weight"] == 0.0
    else:
        assert d["masked"] == d["scaled"] == pytest.approx(api_score, abs=tol)
    assert d["weight"] == pattern[query, key]
    np.testing.assert_array_equal(np.array(d["row_weights"]), pattern[query])
    v = np.array(d["v"])
    np.testing.assert_array_equal(v, hooks[b + "hook_v"][:, kv])
    np.testing.assert_array_equal(np.array(d["output"]), hooks[b + "hook_z"][query, head])
    np.testing.assert_allclose(np.array(d["row_weights"]) @ v, d["output"], atol=1e-5)


def test_the_panel_opens_with_the_page_and_says_each_stage(app_client):
    r = app_client.get(
        "/", params={"model": "llama-gqa", "text": "the cat sat on the mat", "layer": 1, "head": 3, "cell": "4,2"}
    )
    assert r.status_code == 200
    page = html.unescape(r.text)
    said = re.search(r'<p class="cell-said" id="cell-said" aria-live="polite">([^<]*)</p>', page).group(1)
    assert said.startswith("Query 4") and "key 2" in said and "÷ √d_head = √8" in said
    assert "key/value head 1, shared by query heads 2–3" in page  # grouped-query: 4 query heads, 2 K/V heads
    assert "after their rotation by position" in page and "before rotation (hook_q, hook_k)" in page
    assert 'name="cell" value="4,2"' in page
    assert "Download this cell (JSON)" in page and "part=cell.json" in page
    # the fragment a move asks for is the same panel
    frag = app_client.get(
        "/",
        params={
            "model": "llama-gqa",
            "text": "the cat sat on the mat",
            "layer": 1,
            "head": 3,
            "cell": "4,2",
            "part": "cell",
        },
    )
    assert frag.status_code == 200 and said in html.unescape(frag.text)
    assert "<html" not in frag.text


def test_no_cell_a_hint_and_a_bad_cell_a_clear_message(app_client):
    page = app_client.get("/", params={"model": "toy"}).text
    assert 'id="cell-panel"' in page and "Select a cell of any of the four heatmaps" in page
    bad = app_client.get("/", params={"model": "toy", "cell": "two,0"})
    assert bad.status_code == 422 and "cell=&#39;two,0&#39; is not QUERY,KEY" in bad.text
    far = app_client.get("/", params={"model": "toy", "text": "abc", "cell": "9,0", "part": "cell.json"})
    assert far.status_code == 422 and "outside the text's 3 tokens" in far.text
    none = app_client.get("/", params={"model": "toy", "part": "cell.json"})
    assert none.status_code == 422 and "cell=QUERY,KEY is missing" in none.text
    # a link whose cell the text no longer reaches opens the view with the panel closed
    closed = app_client.get("/", params={"model": "toy", "text": "abc", "cell": "9,0"})
    assert closed.status_code == 200 and 'name="cell" value=""' in closed.text


def test_moving_the_cell_runs_no_model(app_client, monkeypatch):
    """The page keeps the head it drew: a move is answered from it, no model loaded or run again."""
    from app.service.views import ModelViews

    params = {"model": "toy", "text": "x" * 128, "layer": 0, "head": 0}
    assert app_client.get("/", params=params).status_code == 200
    loads = []
    original = ModelViews.load
    monkeypatch.setattr(ModelViews, "load", lambda self, *a, **k: loads.append(1) or original(self, *a, **k))
    for cell in ("127,3", "127,4", "126,4"):
        assert app_client.get("/", params=params | {"cell": cell, "part": "cell"}).status_code == 200
    assert loads == []
    # another view (not drawn yet) is run once, and kept for its next move
    other = params | {"head": 1}
    for cell in ("127,3", "127,4"):
        assert app_client.get("/", params=other | {"cell": cell, "part": "cell.json"}).status_code == 200
    assert loads == [1]


def test_the_attention_lesson_opens_the_spec_cell_as_its_products(app_client):
    """The spec prints "scores for lemak: [ 4.15 ...]" and lemak's weight 0.96 on Ali: the lesson opens that
    cell, its four products adding up to the score that ÷ √4 is the printed 4.15."""
    page = html.unescape(app_client.get("/lessons/attention").text)
    panel = page[page.index('id="lesson-cell"') :]
    panel = panel[: panel.index("</section>")]
    assert "query <b>lemak</b> → key <b>Ali</b>" in panel
    assert "the 4.15 printed in “scores for lemak”" in panel and "the weight 0.96 in the table" in panel
    row = lambda label: [  # noqa: E731
        float(x.replace("−", "-"))
        for x in re.findall(
            r"<td [^>]*>([^<]*)</td>", re.search(rf'<th scope="row">{label}</th>(.*?)</tr>', panel).group(1)
        )
    ]
    q, k, products = row("q"), row("k"), row("q × k")
    assert len(q) == len(k) == len(products) == 4  # d_k
    np.testing.assert_allclose(products, np.array(q) * np.array(k), atol=2e-3)  # as printed, 3 decimals
    assert sum(products) / 2 == pytest.approx(4.15, abs=5e-3)
    # the same numbers as the lesson's API
    api = app_client.get("/api/v1/lessons/attention").json()
    assert api["weights"][3][0] == pytest.approx(0.96, abs=5e-3) and api["scores"][3][0] == pytest.approx(
        4.15, abs=5e-3
    )
