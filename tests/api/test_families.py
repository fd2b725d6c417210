"""Every decoder family through the API and the pages: Llama (grouped- and multi-query), Mistral and Qwen2
(sliding windows), Qwen3 (q/k norms; also bfloat16 shards), GPT-NeoX (parallel and sequential) and
GPT-Neo (local layers), served from EXPLORER_MODELS_DIR as a user's own folders would be.

Expected numbers come from outside the app: the `transformers` references recorded beside each tiny
checkpoint in tests/fixtures/families/ (token ids, every block's input, the last block's output, every
query head's pattern, the logits; float32, hence 1e-4), the folder's own config.json and tensors (read
here with safetensors), and the definitions written out below. Invariants: the decomposition's parts sum
to the transformers residual stream and logit, the lens ends on the prediction, the cached steps equal
the recomputation, rollout rows sum to 1, the KV cache's bytes count the key/value heads only.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.models import pretrained
from app.settings import Settings
from core.checkpoints import FAMILIES as FAMILY_MODULES
from tests.pages.figure_data import cards

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
FOLDERS = sorted(p.name for p in FAMILIES.iterdir() if p.is_dir())
ATOL = 1e-4  # float32 weights, as tests/core/test_family_parity.py


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for folder in FOLDERS:
        shutil.copytree(FAMILIES / folder, models / folder)
    with TestClient(create_app(Settings(models_dir=models, access_log=False)), raise_server_exceptions=True) as c:
        yield c


class Family:
    """One fixture checkpoint: its reference, its config.json and its tensors, read without the app."""

    def __init__(self, folder: str):
        self.name = folder
        self.ref = np.load(FAMILIES / f"{folder}.npz")
        self.raw = json.loads((FAMILIES / folder / "config.json").read_text())
        c = self.raw
        self.model_type = c["model_type"]
        self.n_layers = c.get("num_hidden_layers", c.get("num_layers"))
        self.n_heads = c.get("num_attention_heads", c.get("num_heads"))
        self.n_kv = c.get("num_key_value_heads") or self.n_heads
        self.d_head = c.get("head_dim") or c["hidden_size"] // self.n_heads
        self.text, self.ids = str(self.ref["case0_text"]), self.ref["case0_token_ids"].tolist()
        self.logits = self.ref["case0_logits"]  # [pos, d_vocab]
        self.patterns = self.ref["case0_attentions"]  # [n_layers, n_heads, pos, pos]
        self.local = bool(c.get("sliding_window") and c.get("use_sliding_window", True)) or "attention_layers" in c

    def tensor(self, name: str) -> np.ndarray:
        """A tensor as stored (float32, float16 or bfloat16), as float64."""
        index = FAMILIES / self.name / "model.safetensors.index.json"
        file = (
            FAMILIES
            / self.name
            / (json.loads(index.read_text())["weight_map"][name] if index.is_file() else "model.safetensors")
        )
        raw = file.read_bytes()  # safetensors' layout: header length, JSON header, then the raw tensors
        n = int.from_bytes(raw[:8], "little")
        info = json.loads(raw[8 : 8 + n])[name]
        begin, end = info["data_offsets"]
        data = raw[8 + n + begin : 8 + n + end]
        if info["dtype"] == "BF16":  # NumPy has no bfloat16: its 16 bits are a float32's top half
            array = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(data, {"F32": np.float32, "F16": np.float16}[info["dtype"]])
        return array.reshape(info["shape"]).astype(np.float64)

    def final_norm_and_unembed(self, x: np.ndarray) -> np.ndarray:
        """transformers' last steps, from the checkpoint's own tensors: [pos, d_model] -> logits."""
        c = self.raw
        if self.model_type == "gpt_neox":
            norm, eps, W = "gpt_neox.final_layer_norm", c["layer_norm_eps"], "embed_out.weight"
            tied = "gpt_neox.embed_in.weight"
        elif self.model_type == "gpt_neo":
            norm, eps, W, tied = "transformer.ln_f", c["layer_norm_epsilon"], "lm_head.weight", "transformer.wte.weight"
        else:
            norm, eps, W, tied = "model.norm", c["rms_norm_eps"], "lm_head.weight", "model.embed_tokens.weight"
        if self.model_type in ("gpt_neox", "gpt_neo"):
            x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
            x = x * self.tensor(norm + ".weight") + self.tensor(norm + ".bias")
        else:
            x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * self.tensor(norm + ".weight")
        return x @ self.tensor(tied if c.get("tie_word_embeddings") else W).T


@pytest.fixture(scope="module", params=FOLDERS)
def fam(request) -> Family:
    return Family(request.param)


def post(client, fam: Family, path: str, **body) -> dict:
    r = client.post(f"/api/v1/{path}", json={"model": fam.name, "text": fam.text} | body)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_every_supported_family_has_a_default_text():
    assert set(FAMILY_MODULES) <= set(pretrained.DEFAULT_TEXT)


def test_every_family_is_listed_runnable_with_its_own_default_text(client):
    models = {m["name"]: m for m in client.get("/api/v1/models").json()["models"]}
    for folder in FOLDERS:
        m = models[folder]
        assert m["runnable"] and not m["is_encoder"] and m["default_text"], folder
        # a sliding window is only defined under the causal mask: those models do not offer to turn it off
        assert ("causal" in m["toggles"]) == (not Family(folder).local), folder
    texts = {models[f]["config"]["d_vocab"]: models[f]["default_text"] for f in FOLDERS}
    assert "Once upon a time" in models["gpt-neo-local"]["default_text"]  # TinyStories' kind of text
    assert len(set(texts.values())) > 1


def test_run_tokens_prediction_and_hooks_with_kv_heads(client, fam):
    hooks = ["blocks.0.attn.hook_k", "blocks.0.attn.hook_q", "blocks.1.attn.hook_pattern", "blocks.1.hook_resid_pre"]
    r = post(client, fam, "run", hooks=hooks, top_k=5)
    assert r["token_ids"] == fam.ids
    n = len(fam.ids)
    grouped = fam.n_kv != fam.n_heads
    assert r["hook_shapes"]["blocks.0.attn.hook_k"] == {
        "axes": "[pos, kv_head_index, d_head]" if grouped else "[pos, head_index, d_head]",
        "dims": [n, fam.n_kv, fam.d_head],
    }
    assert r["hook_shapes"]["blocks.0.attn.hook_q"]["dims"] == [n, fam.n_heads, fam.d_head]
    np.testing.assert_allclose(r["hooks"]["blocks.1.attn.hook_pattern"], fam.patterns[1], atol=ATOL)
    np.testing.assert_allclose(r["hooks"]["blocks.1.hook_resid_pre"], fam.ref["case0_resid_pre"][1], atol=ATOL)
    probs = softmax(fam.logits[-1].astype(np.float64))
    np.testing.assert_allclose([t["prob"] for t in r["top_k"]], np.sort(probs)[::-1][:5], atol=ATOL)
    assert probs[r["top_k"][0]["id"]] == pytest.approx(probs.max(), abs=ATOL)
    # the hook list says the same axes
    listed = {h["name"]: h["shape"] for h in client.get("/api/v1/hooks", params={"model": fam.name}).json()["hooks"]}
    assert listed["blocks.0.attn.hook_k"] == r["hook_shapes"]["blocks.0.attn.hook_k"]["axes"]


def test_ablating_a_head_changes_the_prediction_and_reports_it(client, fam):
    r = post(client, fam, "run", top_k=3, ablate=[{"layer": fam.n_layers - 1, "head": fam.n_heads - 1}])
    effect = r["ablation_effect"]
    probs = softmax(fam.logits[-1].astype(np.float64))
    np.testing.assert_allclose([t["prob"] for t in effect["baseline_top_k"]], np.sort(probs)[::-1][:3], atol=ATOL)
    assert any(abs(c["delta"]) > 1e-6 for c in effect["changes"])
    r = client.post(
        "/api/v1/run", json={"model": fam.name, "text": fam.text, "ablate": [{"layer": fam.n_layers, "head": 0}]}
    )
    assert r.status_code == 422 and f"{fam.n_layers} layer(s)" in r.text


def test_decompose_parts_sum_to_the_transformers_stream_and_logit(client, fam):
    d = post(client, fam, "analysis/decompose", pos=-1)
    target = d["target"]["id"]
    assert d["logit"] == pytest.approx(fam.logits[-1, target], abs=ATOL)
    assert sum(d["direct_logit"]) + d["logit_bias"] == pytest.approx(d["logit"], abs=ATOL)
    np.testing.assert_allclose(np.sum(d["parts"], axis=0), fam.ref["case0_resid_post"][-1], atol=ATOL)
    heads = [label for label in d["labels"] if re.fullmatch(r"L\d+H\d+", label)]
    assert len(heads) == fam.n_layers * fam.n_heads  # one part per query head
    assert ("pos_embed" in d["labels"]) == (fam.model_type == "gpt_neo")  # rotary families have no table
    ablated = post(client, fam, "analysis/decompose", ablate=[{"layer": 0, "head": 0}])
    assert sum(ablated["direct_logit"]) + ablated["logit_bias"] == pytest.approx(ablated["logit"], abs=ATOL)


def test_logit_lens_reads_each_stream_through_the_checkpoints_own_final_norm(client, fam):
    lens = post(client, fam, "analysis/logit-lens", top_k=3)
    assert len(lens["points"]) == 2 * fam.n_layers + 1
    final = softmax(fam.logits.astype(np.float64))  # [pos, d_vocab]
    assert [cell[0]["prob"] for cell in lens["top_k"][-1]] == pytest.approx(final.max(-1).tolist(), abs=ATOL)
    layer = fam.n_layers - 1  # the last block's input, decoded as if that block were deleted
    probs = softmax(fam.final_norm_and_unembed(fam.ref["case0_resid_pre"][layer].astype(np.float64)))
    cells = lens["top_k"][lens["points"].index(f"blocks.{layer}.hook_resid_pre")]
    np.testing.assert_allclose([cell[0]["prob"] for cell in cells], probs.max(-1), atol=ATOL)


def _score(patterns: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mean attention on the keys a detector looks for, over the queries that have such a key."""
    rows = keys.any(axis=1)
    return np.array(
        [
            [patterns[layer, h][rows][keys[rows]].sum() / rows.sum() for h in range(patterns.shape[1])]
            for layer in range(patterns.shape[0])
        ]
    )


def test_head_detectors_score_the_transformers_patterns(client, fam):
    r = post(client, fam, "analysis/detectors", random_length=6)
    ids, n = np.array(fam.ids), len(fam.ids)
    earlier = np.tril(np.ones((n, n), bool), -1)
    keys = {
        "previous_token": np.eye(n, k=-1, dtype=bool),
        "duplicate_token": (ids[:, None] == ids[None, :]) & earlier,
        "induction": np.pad(ids[:, None] == ids[None, :-1], ((0, 0), (1, 0))) & earlier,
    }
    for name, k in keys.items():
        assert k.any(), name  # the text repeats " sat on the": every detector has keys
        np.testing.assert_allclose(
            np.array(r["detectors"][name]["text"], dtype=float), _score(fam.patterns, k), atol=ATOL, err_msg=name
        )
    assert np.array(r["detectors"]["induction"]["random"], dtype=float).shape == (fam.n_layers, fam.n_heads)
    assert len(r["random_tokens"]) == 12 and all(r["random_tokens"])  # every id named, padded rows too
    scores = [f["score"] for f in r["flagged"]]
    assert scores == sorted(scores, reverse=True) and all(s >= r["threshold"] for s in scores)


def test_kv_cache_steps_keep_the_key_value_heads_and_match_transformers(client, fam):
    n_new = 4
    r = post(client, fam, "analysis/kv-cache", n_new=n_new)
    n, steps = len(fam.ids), r["steps"]
    # cached = recomputed, up to float32 rounding of logits as large as 30 (Qwen2's fixture)
    tol = 1e-5 * float(np.abs(fam.logits).max())
    assert len(steps) == n + n_new and r["max_abs_diff"] < tol
    for s in steps[:n]:  # each prompt step predicts what transformers does at that position
        assert fam.logits[s["pos"], s["top"]["id"]] == pytest.approx(fam.logits[s["pos"]].max(), abs=tol)
    per_token = 2 * fam.n_layers * fam.n_kv * fam.d_head * 4  # K and V of the key/value heads, float32
    assert [s["cache_bytes"] for s in steps] == [(s["pos"] + 1) * per_token for s in steps]
    assert all(s["k_shape"] == s["v_shape"] == [fam.n_kv, s["pos"] + 1, fam.d_head] for s in steps)
    assert (
        f"n_key_value_heads {fam.n_kv}" in r["bytes_formula"] and f"{per_token:,} bytes per token" in r["bytes_formula"]
    )
    for before, after in zip(steps[n - 1 :], steps[n:]):  # greedy generation
        assert after["generated"] and after["id"] == before["top"]["id"]


def test_compare_two_texts_shows_transformers_patterns_on_both_sides(client, fam):
    layer, head = fam.n_layers - 1, fam.n_heads - 1
    other = str(fam.ref["case1_text"])
    r = post(client, fam, "analysis/compare", layer=layer, head=head, other={"text": other})
    np.testing.assert_allclose(r["a"]["pattern"], fam.patterns[layer, head], atol=ATOL)
    np.testing.assert_allclose(r["b"]["pattern"], fam.ref["case1_attentions"][layer, head], atol=ATOL)
    flipped = client.post(
        "/api/v1/analysis/compare", json={"model": fam.name, "text": fam.text, "other": {"causal": False}}
    )
    if fam.local:
        assert flipped.status_code == 422 and "sliding-window" in flipped.text
    else:
        b = np.array(flipped.json()["b"]["pattern"])
        assert flipped.status_code == 200 and np.triu(b, 1).sum() > 0.1
        np.testing.assert_allclose(b.sum(-1), 1.0, atol=1e-5)


def test_rollout_is_the_product_of_the_averaged_transformers_patterns(client, fam):
    roll = np.array(post(client, fam, "analysis/rollout")["rollout"])
    n = len(fam.ids)
    expected, current = [], np.eye(n)
    for layer in range(fam.n_layers):
        current = ((fam.patterns[layer].mean(0) + np.eye(n)) / 2) @ current
        expected.append(current)
    np.testing.assert_allclose(roll, np.array(expected), atol=ATOL)
    np.testing.assert_allclose(roll.sum(-1), 1.0, atol=1e-5)


# ------------------------------------------------------------------ the pages


def test_explorer_page_labels_the_kv_head_of_every_query_head(client, fam):
    r = client.get("/", params={"model": fam.name, "text": fam.text, "layer": 1, "head": fam.n_heads - 1})
    assert r.status_code == 200
    page = html.unescape(r.text)
    labels = re.findall(
        r'<span class="head-name">head (\d+)(?: <span class="head-kv"[^>]*>KV (\d+)</span>)?</span>', page
    )
    assert [int(h) for h, _ in labels] == list(range(fam.n_heads))
    group = fam.n_heads // fam.n_kv
    if fam.n_kv != fam.n_heads:
        assert [int(kv) for _, kv in labels] == [h // group for h in range(fam.n_heads)]
        shared = f"{fam.n_heads} query heads share {fam.n_kv} K/V head{'s' if fam.n_kv > 1 else ''}"
        assert shared in page
    else:
        assert all(kv == "" for _, kv in labels) and f"{fam.n_heads} heads × d_head" in page
    # the chosen head's weights are transformers' pattern
    z = cards(r.text)["stage-weights"]["data"][0]["z"]
    np.testing.assert_allclose(np.array(z, dtype=float), fam.patterns[1, fam.n_heads - 1], atol=ATOL)
    # the residual stream's norms end on transformers' last block output
    norms = np.array(cards(r.text)["residual"]["data"][0]["z"], dtype=float)  # [pos, stream points]
    np.testing.assert_allclose(norms[:, -1], np.linalg.norm(fam.ref["case0_resid_post"], axis=-1), rtol=1e-4)


@pytest.mark.parametrize(
    "view, marker",
    [
        ("decompose", 'id="decompose-sum"'),
        ("lens", 'id="lens-final"'),
        ("detectors", 'id="flagged"'),
        ("kvcache", 'id="kv-check"'),
        ("compare", 'id="compare-difference"'),
    ],
)
def test_every_inspect_view_renders(client, fam, view, marker):
    r = client.get("/inspect", params={"view": view, "model": fam.name, "text": fam.text})
    assert r.status_code == 200 and marker in r.text, html.unescape(r.text)[-600:]
    assert fam.name in r.text and 'id="not-applicable"' not in r.text
    if view == "compare":  # the layer and head inputs go as far as this model's (not the toys' limits)
        assert f'id="cmp-layer" name="layer" value="0" min="0" max="{fam.n_layers - 1}"' in r.text
        assert f'id="cmp-head" name="head" value="0" min="0" max="{fam.n_heads - 1}"' in r.text


def test_padded_embedding_rows_are_named_not_refused(client):
    """GPT-NeoX pads its embedding past the tokenizer (Pythia: 50,304 rows for 50,277 tokens); the
    fixture has 384 rows for 330 tokens. A padding row can be a target or a prediction: it has a name."""
    fam = Family("gpt-neox-parallel")
    d_vocab = json.loads((FAMILIES / fam.name / "config.json").read_text())["vocab_size"]
    tokens = json.loads((FAMILIES / fam.name / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(tokens) < d_vocab
    d = post(client, fam, "analysis/decompose", target=d_vocab - 1)
    assert d["target"] == {"token": f"<unused {d_vocab - 1}>", "id": d_vocab - 1}
    assert d["logit"] == pytest.approx(fam.logits[-1, d_vocab - 1], abs=ATOL)
    r = client.post("/api/v1/analysis/decompose", json={"model": fam.name, "text": fam.text, "target": d_vocab})
    assert r.status_code == 422 and f"0 … {d_vocab - 1}" in r.text


def test_the_schema_states_the_pretrained_work_limit(client):
    s = Settings()
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("RunRequest", "LogitLensRequest", "KVStepsRequest", "CompareRequest"):
        described = schemas[name]["properties"]["model"]["description"]
        assert f"{s.max_pretrained_work:,} on a pretrained model" in described
        assert f"{s.max_work:,} multiply-adds" in described
