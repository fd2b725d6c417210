"""POST /api/v1/run, /api/v1/models and /api/v1/hooks."""

import numpy as np
import pytest

from app.models.catalog import PARAMS_CACHE_SIZE
from core import hook_names

from .conftest import messages


def run(client, **body):
    r = client.post("/api/v1/run", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_models_lists_the_built_in_toys(client):
    models = {m["name"]: m for m in client.get("/api/v1/models").json()["models"]}
    assert {"toy", "spec-forward"} <= set(models)
    toy = models["toy"]
    assert toy["runnable"] and toy["error"] is None and not toy["is_encoder"]
    assert toy["config"]["n_layers"] == 2 and toy["config"]["n_heads"] == 4 and toy["config"]["d_model"] == 64
    assert set(toy["toggles"]) >= {
        "causal",
        "scale",
        "positional_embedding_type",
        "n_heads",
        "n_layers",
        "d_model",
        "seed",
    }
    assert "n_layers" not in models["spec-forward"]["toggles"]


def test_spec_forward_reproduces_the_spec(client):
    r = run(client, model="spec-forward", text="nasi ", top_k=9)
    assert r["tokens"] == list("nasi ") and r["seed"] == 42
    probs = {t["token"]: round(t["prob"], 3) for t in r["top_k"]}
    assert probs == {
        " ": 0.211,
        "a": 0.115,
        "e": 0.112,
        "i": 0.123,
        "k": 0.062,
        "l": 0.151,
        "m": 0.076,
        "n": 0.09,
        "s": 0.06,
    }
    assert [t["prob"] for t in r["top_k"]] == sorted((t["prob"] for t in r["top_k"]), reverse=True)


def test_toy_run_hooks_shapes_and_masked_nulls(client):
    hooks = ["hook_embed", "blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern", "blocks.0.attn.hook_q"]
    r = run(client, model="toy", text="Ali makan", hooks=hooks, top_k=3)
    T = len("Ali makan")
    assert r["tokens"] == list("Ali makan") and len(r["token_ids"]) == T
    assert list(r["hooks"]) == hooks
    scores = r["hooks"]["blocks.1.attn.hook_attn_scores"]
    assert np.array(r["hooks"]["blocks.1.attn.hook_pattern"]).shape == (4, T, T)
    assert np.array(r["hooks"]["blocks.0.attn.hook_q"]).shape == (T, 4, 16)
    assert r["hook_shapes"]["blocks.0.attn.hook_q"] == {"axes": "[pos, head_index, d_head]", "dims": [T, 4, 16]}
    upper = np.triu(np.ones((T, T), bool), 1)
    for head in scores:  # null exactly where the causal mask forbids
        assert [[v is None for v in row] for row in head] == upper.tolist()
    pattern = np.array(r["hooks"]["blocks.1.attn.hook_pattern"])
    np.testing.assert_allclose(pattern.sum(-1), 1.0)
    assert len(r["top_k"]) == 3


def test_toggles_change_the_computation(client):
    base = dict(model="toy", text="the cat", hooks=["blocks.0.attn.hook_pattern"])
    causal = np.array(run(client, **base)["hooks"]["blocks.0.attn.hook_pattern"])
    bidir = np.array(run(client, **base, causal=False)["hooks"]["blocks.0.attn.hook_pattern"])
    assert np.all(causal[:, np.triu(np.ones((7, 7), bool), 1)] == 0)
    assert np.all(bidir > 0)
    small = run(client, **base, n_heads=2, n_layers=1, d_model=32, positional_embedding_type="rotary", seed=5)
    assert small["config"]["n_heads"] == 2 and small["config"]["d_model"] == 32 and small["seed"] == 5
    assert np.array(small["hooks"]["blocks.0.attn.hook_pattern"]).shape == (2, 7, 7)
    hot = run(client, **base, temperature=0.1)["hooks"]["blocks.0.attn.hook_pattern"]
    assert np.max(hot) > np.max(causal[:, 1:])  # a low temperature sharpens the pattern


def test_same_seed_same_weights_and_position_toggle_keeps_weights(client):
    a = run(client, model="toy", text="abc", hooks=["hook_embed"], seed=7)
    b = run(client, model="toy", text="abc", hooks=["hook_embed"], seed=7, positional_embedding_type="none")
    c = run(client, model="toy", text="abc", hooks=["hook_embed"], seed=8)
    assert a["hooks"] == b["hooks"] and a["hooks"] != c["hooks"]


def test_toy_params_are_drawn_once_per_config_and_seed(client):
    run(client, model="toy", text="abc", seed=11)
    cache = client.app.state.catalog.toy_cache
    key = next(k for k in cache._items if k[1] == 11)
    first = cache._items[key]
    run(client, model="toy", text="xyz", seed=11, causal=False)
    assert cache._items[key] is first  # reused, not redrawn
    for seed in range(20, 20 + PARAMS_CACHE_SIZE + 2):
        run(client, model="toy", text="a", seed=seed)
    assert len(cache) == PARAMS_CACHE_SIZE


def test_toy_accepts_any_unicode(client):
    text = "héllo 🙂 مرحبا e\u0301"
    r = run(client, model="toy", text=text, top_k=1)
    assert r["tokens"] == list(text)
    unk = len(client.app.state.catalog["toy"].tokenizer.vocab) - 1
    assert r["token_ids"][1] == unk and r["token_ids"][0] == ord("h") - 32


def test_hooks_endpoint(client):
    h = client.get(
        "/api/v1/hooks", params={"model": "toy", "n_layers": 3, "positional_embedding_type": "rotary"}
    ).json()
    names = [x["name"] for x in h["hooks"]]
    assert names == hook_names(
        client.app.state.catalog["toy"].cfg.replace(n_layers=3, positional_embedding_type="rotary")
    )
    assert "blocks.2.attn.hook_rot_q" in names
    assert {x["name"]: x["shape"] for x in h["hooks"]}[
        "blocks.0.attn.hook_pattern"
    ] == "[head_index, query_pos, key_pos]"


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"model": "gpt-9", "text": "a"}, "unknown model 'gpt-9'"),
        (
            {"model": "toy", "text": "a", "hooks": ["blocks.7.attn.hook_pattern"]},
            "unknown hook name 'blocks.7.attn.hook_pattern'",
        ),
        ({"model": "toy", "text": "a", "n_heads": 5}, "d_model=64 is not divisible by n_heads=5"),
        ({"model": "spec-forward", "text": "nasi goreng"}, "'gor' are not in the vocabulary"),
        ({"model": "spec-forward", "text": "nasi", "n_layers": 2}, "does not accept n_layers"),
        (
            {"model": "toy", "text": "ab", "positional_embedding_type": "rotary", "d_model": 48, "n_heads": 16},
            "need an even d_head",
        ),
    ],
)
def test_run_errors_are_422_with_an_actionable_message(client, body, fragment):
    r = client.post("/api/v1/run", json=body)
    assert r.status_code == 422
    assert fragment in messages(r)


def test_a_masked_row_of_a_one_token_text(client):
    r = run(client, model="toy", text="x", hooks=["blocks.0.attn.hook_pattern"], top_k=0)
    assert r["hooks"]["blocks.0.attn.hook_pattern"] == [[[1.0]]] * 4 and r["top_k"] == []
