"""Every /api/v1/analysis/* endpoint on a pretrained decoder: the tiny GPT-2 fixture checkpoint, served
from EXPLORER_MODELS_DIR as a user's own GPT-2 folder would be.

Expected numbers come from outside the app: the Hugging Face `transformers` references recorded in
tests/fixtures/gpt2-tiny.npz (float64; the app runs the float32 weights, hence 1e-4), the
checkpoint's own tensors read with safetensors, and the definitions (rollout, detector scores)
written out here. Invariants: the parts sum to the logit, the last lens point is the prediction,
the cached steps equal the full recomputation, every rollout row sums to 1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load_file

from app.main import create_app
from app.settings import get_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODEL = "gpt2-tiny"
REF = np.load(FIXTURES / "gpt2-tiny.npz")
TEXT = str(REF["case0_text"])  # "The cat sat on the mat."
IDS = REF["case0_token_ids"].tolist()
LOGITS = REF["case0_logits"]  # [pos, d_vocab], transformers in float64
HIDDEN = REF["case0_hidden_states"]  # [n_layers + 1, pos, d_model]: inputs of each block, then after ln_f
PATTERNS = REF["case0_attentions"]  # [n_layers, n_heads, pos, pos]
ATOL = 1e-4  # float32 weights, as in tests/core/test_parity.py
N_LAYERS, N_HEADS = PATTERNS.shape[:2]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The app built with EXPLORER_MODELS_DIR holding the GPT-2 fixture (and the variable kept set
    while the module runs, for code that reads the settings per request)."""
    models = tmp_path_factory.mktemp("models")
    shutil.copytree(FIXTURES / MODEL, models / MODEL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXPLORER_MODELS_DIR", str(models))
        get_settings.cache_clear()
        try:
            with TestClient(create_app(), raise_server_exceptions=True) as c:
                yield c
        finally:
            get_settings.cache_clear()
    get_settings.cache_clear()


def post(client, path: str, **body) -> dict:
    r = client.post(f"/api/v1/{path}", json={"model": MODEL, "text": TEXT} | body)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_checkpoint_is_served_and_tokenises_as_transformers_did(client):
    listed = {m["name"]: m for m in client.get("/api/v1/models").json()["models"]}
    assert listed[MODEL]["runnable"] and not listed[MODEL]["is_encoder"]
    run = post(client, "run", top_k=3)
    assert run["token_ids"] == IDS


@pytest.mark.parametrize("pos, target", [(-1, None), (3, 41), (0, 7)])
def test_decompose_parts_sum_to_the_transformers_logit(client, pos, target):
    d = post(client, "analysis/decompose", pos=pos, **({} if target is None else {"target": target}))
    p = pos % len(IDS)
    expected_target = int(np.argmax(LOGITS[p])) if target is None else target  # default: the model's prediction
    assert d["pos"] == p and d["target"]["id"] == expected_target
    assert d["logit"] == pytest.approx(LOGITS[p, expected_target], abs=ATOL)
    assert sum(d["direct_logit"]) + d["logit_bias"] == pytest.approx(d["logit"], abs=ATOL)
    # the parts are the residual stream at that position, split: they add up to the last block's output,
    # each layer's heads and attention bias to what attention wrote, its MLP and MLP bias to what the MLP wrote
    hooks = [f"blocks.{N_LAYERS - 1}.hook_resid_post"] + [
        f"blocks.{l}.hook_{w}_out" for l in range(N_LAYERS) for w in ("attn", "mlp")
    ]
    run = {k: np.array(v)[p] for k, v in post(client, "run", hooks=hooks)["hooks"].items()}
    parts = dict(zip(d["labels"], np.array(d["parts"])))
    assert d["labels"][:2] == ["embed", "pos_embed"] and len(parts) == len(d["direct_logit"])
    np.testing.assert_allclose(sum(parts.values()), run[hooks[0]], atol=ATOL)
    for l in range(N_LAYERS):
        heads = [parts[f"L{l}H{h}"] for h in range(N_HEADS)]
        np.testing.assert_allclose(sum(heads) + parts[f"L{l} attn bias"], run[f"blocks.{l}.hook_attn_out"], atol=ATOL)
        np.testing.assert_allclose(
            parts[f"L{l} mlp"] + parts[f"L{l} mlp bias"], run[f"blocks.{l}.hook_mlp_out"], atol=ATOL
        )


def test_decompose_with_an_ablated_head_still_sums(client):
    d = post(client, "analysis/decompose", ablate=[{"layer": 1, "head": 2}])
    assert sum(d["direct_logit"]) + d["logit_bias"] == pytest.approx(d["logit"], abs=ATOL)
    assert d["logit"] != pytest.approx(LOGITS[-1, d["target"]["id"]], abs=ATOL)  # the ablation changed it


def test_logit_lens_reads_each_block_input_through_ln_f_and_ends_on_the_prediction(client):
    lens = post(client, "analysis/logit-lens", top_k=5)
    assert len(lens["points"]) == 2 * N_LAYERS + 1 and lens["points"][-1] == f"blocks.{N_LAYERS - 1}.hook_resid_post"
    # the last point is the model's own prediction at every position
    for position, cell in enumerate(lens["top_k"][-1]):
        probs = softmax(LOGITS[position])
        best = np.argsort(-probs)[:5]
        assert [c["id"] for c in cell] == best.tolist()
        np.testing.assert_allclose([c["prob"] for c in cell], probs[best], atol=ATOL)
    # a block's input, decoded with the checkpoint's own ln_f and tied unembedding (read with safetensors)
    w = load_file(str(FIXTURES / MODEL / "model.safetensors"))
    eps = 1e-5  # the fixture's layer_norm_epsilon
    for layer in range(N_LAYERS):
        point = lens["points"].index(f"blocks.{layer}.hook_resid_pre")
        x = HIDDEN[layer]  # [pos, d_model]
        normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
        probs = softmax((normed * w["ln_f.weight"] + w["ln_f.bias"]) @ w["wte.weight"].T.astype(np.float64))
        top = [[c["id"] for c in cell][0] for cell in lens["top_k"][point]]
        assert top == probs.argmax(-1).tolist(), layer
        np.testing.assert_allclose([cell[0]["prob"] for cell in lens["top_k"][point]], probs.max(-1), atol=ATOL)


def _score(patterns: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mean attention on the keys a detector looks for, over the queries that have such a key."""
    rows = keys.any(axis=1)
    return np.array(
        [
            [patterns[l, h][rows][keys[rows]].reshape(-1).sum() / rows.sum() for h in range(patterns.shape[1])]
            for l in range(patterns.shape[0])
        ]
    )


def test_head_detectors_score_the_transformers_patterns(client):
    text = TEXT + " The cat sat on the mat."  # a repeat, so duplicate and induction heads have keys
    r = client.post("/api/v1/analysis/detectors", json={"model": MODEL, "text": text, "random_length": 8})
    assert r.status_code == 200, r.text
    r = r.json()
    run = post(client, "run", text=text, hooks=[f"blocks.{l}.attn.hook_pattern" for l in range(N_LAYERS)])
    ids = np.array(run["token_ids"])
    patterns = np.stack([np.array(run["hooks"][f"blocks.{l}.attn.hook_pattern"]) for l in range(N_LAYERS)])
    n = len(ids)
    earlier = np.tril(np.ones((n, n), bool), -1)
    keys = {
        "previous_token": np.eye(n, k=-1, dtype=bool),
        "duplicate_token": (ids[:, None] == ids[None, :]) & earlier,
        "induction": np.pad(ids[:, None] == ids[None, :-1], ((0, 0), (1, 0))) & earlier,
    }
    for name, k in keys.items():
        np.testing.assert_allclose(
            np.array(r["detectors"][name]["text"], dtype=float), _score(patterns, k), atol=1e-6, err_msg=name
        )  # float32 sums
    # on the first tokens, the patterns are transformers' own: the previous-token score from them
    head = _score(PATTERNS, np.eye(len(IDS), k=-1, dtype=bool))
    short = post(client, "analysis/detectors", random_length=8)
    np.testing.assert_allclose(np.array(short["detectors"]["previous_token"]["text"], dtype=float), head, atol=ATOL)
    random_ids = r["random_token_ids"]
    assert len(random_ids) == 16 and random_ids[:8] == random_ids[8:]
    assert np.array(r["detectors"]["induction"]["random"], dtype=float).shape == (N_LAYERS, N_HEADS)


def test_kv_cache_steps_equal_the_recomputation_and_transformers(client):
    n_new = 6
    r = post(client, "analysis/kv-cache", n_new=n_new)
    steps, cfg = r["steps"], r["config"]
    assert len(steps) == len(IDS) + n_new and [s["id"] for s in steps[: len(IDS)]] == IDS
    assert r["max_abs_diff"] < ATOL  # cached = recomputed
    # each cached step's prediction is transformers' at that position (margins here are > 0.1)
    assert [s["top"]["id"] for s in steps[: len(IDS)]] == LOGITS.argmax(-1).tolist()
    assert steps[len(IDS)]["id"] == int(LOGITS[-1].argmax())  # the first generated token
    for before, after in zip(steps[len(IDS) - 1 :], steps[len(IDS) :]):  # greedy
        assert after["id"] == before["top"]["id"] and after["generated"]
    per_token = 2 * N_LAYERS * N_HEADS * (cfg["d_model"] // N_HEADS) * 4  # K and V, float32
    assert [s["cache_bytes"] for s in steps] == [(s["pos"] + 1) * per_token for s in steps]


def test_compare_the_mask_on_and_off(client):
    layer, head = 1, 2
    r = post(client, "analysis/compare", layer=layer, head=head, other={"causal": False})
    a, b = np.array(r["a"]["pattern"]), np.array(r["b"]["pattern"])
    np.testing.assert_allclose(a, PATTERNS[layer, head], atol=ATOL)  # transformers' causal pattern
    np.testing.assert_allclose(b.sum(-1), 1.0, atol=1e-6)
    assert np.triu(b, 1).sum() > 0.1 and np.triu(a, 1).sum() == 0
    np.testing.assert_allclose(np.array(r["difference"]), b - a, atol=1e-7)  # subtracted in float32


def test_rollout_is_the_product_of_averaged_patterns_and_rows_sum_to_one(client):
    roll = np.array(post(client, "analysis/rollout")["rollout"])
    n = len(IDS)
    expected, current = [], np.eye(n)
    for layer in range(N_LAYERS):  # Abnar & Zuidema: (mean over heads + I) / 2, multiplied layer by layer
        current = ((PATTERNS[layer].mean(0) + np.eye(n)) / 2) @ current
        expected.append(current)
    np.testing.assert_allclose(roll, np.array(expected), atol=ATOL)
    np.testing.assert_allclose(roll.sum(-1), 1.0, atol=1e-6)
