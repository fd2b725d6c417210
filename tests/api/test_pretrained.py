"""Pretrained models through the API: the bundled MiniLM and folders put in EXPLORER_MODELS_DIR,
listed (broken ones with their reason), run, loaded once under concurrency, within a memory budget."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from app.models import pretrained
from core import count_params
from core.checkpoints import read_spec

from .conftest import half_precision_copy, messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ATOL = 1e-4  # as in tests/core/test_parity.py: the API must not lose precision on the way


@pytest.fixture
def models_dir(tmp_path):
    """An EXPLORER_MODELS_DIR with a GPT-2 and a BERT fixture and three folders that cannot run."""
    root = tmp_path / "models"
    for name in ("gpt2-tiny", "bert-tiny"):
        shutil.copytree(FIXTURES / name, root / name)
    shutil.copytree(FIXTURES / "gpt2-tiny", root / "no-tokenizer")
    (root / "no-tokenizer" / "tokenizer.json").unlink()
    shutil.copytree(FIXTURES / "gpt2-tiny", root / "llama-ish")
    config = root / "llama-ish" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"model_type": "llama"}))
    shutil.copytree(FIXTURES / "gpt2-tiny", root / "toy")  # a built-in model's name
    return root


@pytest.fixture
def dir_client(client_with, models_dir):
    """The app started with EXPLORER_MODELS_DIR set to `models_dir`."""
    return client_with(models_dir=models_dir)


def listed(client) -> dict[str, dict]:
    r = client.get("/api/v1/models")
    assert r.status_code == 200
    return {m["name"]: m for m in r.json()["models"]}


def test_models_lists_minilm_and_the_folders(dir_client, models_dir):
    models = listed(dir_client)
    minilm = models[pretrained.MINILM_NAME]
    assert minilm["kind"] == "pretrained" and minilm["runnable"] and minilm["is_encoder"]
    assert minilm["config"]["n_layers"] == 6 and minilm["config"]["d_model"] == 384
    assert "causal" not in minilm["toggles"] and "n_heads" not in minilm["toggles"]
    gpt2 = models["gpt2-tiny"]
    assert gpt2["runnable"] and not gpt2["is_encoder"] and "causal" in gpt2["toggles"]
    assert gpt2["config"]["n_heads"] == read_spec(FIXTURES / "gpt2-tiny").cfg.n_heads
    assert models["bert-tiny"]["runnable"] and models["bert-tiny"]["is_encoder"]
    assert not models["no-tokenizer"]["runnable"] and "tokenizer.json" in models["no-tokenizer"]["error"]
    assert not models["llama-ish"]["runnable"] and "'llama'" in models["llama-ish"]["error"]
    assert models["toy"]["kind"] == "toy"  # the built-in keeps its name...
    assert "taken" in models["EXPLORER_MODELS_DIR/toy"]["error"]  # ...and the folder says why it is not used


def test_minilm_runs_at_parity_through_the_api(client):
    ref = np.load(FIXTURES / "minilm_reference.npz")
    r = client.post(
        "/api/v1/run",
        json={
            "model": pretrained.MINILM_NAME,
            "text": str(ref["case0_text"]),
            "hooks": ["blocks.0.attn.hook_pattern", "blocks.5.hook_resid_post"],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token_ids"] == ref["case0_token_ids"].tolist()
    assert body["tokens"][0] == "[CLS]" and body["tokens"][-1] == "[SEP]"
    assert body["top_k"] == []  # an encoder predicts no next token
    np.testing.assert_allclose(body["hooks"]["blocks.0.attn.hook_pattern"], ref["case0_attentions"][0], atol=ATOL)
    np.testing.assert_allclose(body["hooks"]["blocks.5.hook_resid_post"], ref["case0_hidden_states"][-1], atol=ATOL)


def test_gpt2_folder_runs_at_parity_through_the_api(dir_client, models_dir):
    ref = np.load(FIXTURES / "gpt2-tiny.npz")
    r = dir_client.post(
        "/api/v1/run",
        json={
            "model": "gpt2-tiny",
            "text": str(ref["case1_text"]),
            "top_k": 5,
            "hooks": ["blocks.1.attn.hook_pattern"],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token_ids"] == ref["case1_token_ids"].tolist()
    assert "↵" in body["tokens"] and any(t.startswith("␣") for t in body["tokens"])
    np.testing.assert_allclose(body["hooks"]["blocks.1.attn.hook_pattern"], ref["case1_attentions"][1], atol=ATOL)
    logits = ref["case1_logits"][-1].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    best = np.argsort(-probs)[:5]
    assert [t["id"] for t in body["top_k"]] == best.tolist()
    np.testing.assert_allclose([t["prob"] for t in body["top_k"]], probs[best], atol=ATOL)


def test_gpt2_attention_toggles_apply(dir_client, models_dir):
    hook = "blocks.0.attn.hook_pattern"
    req = {"model": "gpt2-tiny", "text": "The cat sat", "hooks": [hook]}
    causal = np.array(dir_client.post("/api/v1/run", json=req).json()["hooks"][hook])
    both = np.array(dir_client.post("/api/v1/run", json=req | {"causal": False}).json()["hooks"][hook])
    assert np.all(np.triu(causal, k=1) == 0) and np.any(np.triu(both, k=1) > 0)


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (pretrained.MINILM_NAME, "causal", True),  # an encoder has no causal toggle
        ("gpt2-tiny", "n_heads", 2),  # trained weights have the sizes they have
        ("gpt2-tiny", "seed", 3),
    ],
)
def test_toggles_a_pretrained_model_refuses(dir_client, models_dir, model, field, value):
    r = dir_client.post("/api/v1/run", json={"model": model, "text": "The cat", field: value})
    assert r.status_code == 422 and field in messages(r)


def test_broken_and_too_long_are_422(dir_client, models_dir):
    r = dir_client.post("/api/v1/run", json={"model": "no-tokenizer", "text": "The cat"})
    assert r.status_code == 422 and "tokenizer.json" in messages(r)
    n_ctx = read_spec(FIXTURES / "gpt2-tiny").cfg.n_ctx
    r = dir_client.post("/api/v1/run", json={"model": "gpt2-tiny", "text": "a " * (2 * n_ctx)})
    assert r.status_code == 422 and f"n_ctx={n_ctx}" in messages(r)


def test_weights_broken_beyond_config_become_the_listed_reason(client_with, models_dir):
    """config.json can look fine while model.safetensors is not: the first run finds out and
    from then on the listing says why."""
    bad = models_dir / "truncated"
    shutil.copytree(FIXTURES / "gpt2-tiny", bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    dir_client = client_with(models_dir=models_dir)
    assert listed(dir_client)["truncated"]["runnable"]  # its config.json is fine
    r = dir_client.post("/api/v1/run", json={"model": "truncated", "text": "The cat"})
    assert r.status_code == 422 and "model.safetensors" in messages(r)
    after = listed(dir_client)["truncated"]
    assert not after["runnable"] and "model.safetensors" in after["error"]


# ---------------------------------------------------------------------------- loading: once, within budget


def make_catalog(mb: int) -> pretrained.Checkpoints:
    return pretrained.Checkpoints(FIXTURES, mb * 2**20)


def test_concurrent_first_requests_load_once():
    # MiniLM: its load takes long enough (reading 87 MB, fusing Q, K, V) that threads overlap.
    loader = make_catalog(256).entries[pretrained.MINILM_NAME]
    barrier = threading.Barrier(4)
    got = []

    def first_request():
        barrier.wait()
        got.append(loader.params())

    threads = [threading.Thread(target=first_request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.loads == 1 and len(got) == 4 and all(p is got[0] for p in got)


def test_memory_budget_charges_upcast_weights_and_not_mapped_ones(tmp_path):
    """float32 files are memory-mapped (shared page cache): a worker's budget charges nothing for them.
    float16 ones are upcast into the worker's own memory: 4 bytes a parameter, known from the file's
    header before anything is read."""
    half_precision_copy(FIXTURES / "gpt2-tiny", tmp_path / "gpt2-half")
    shutil.copytree(FIXTURES / "gpt2-tiny", tmp_path / "gpt2-tiny")
    n_params = count_params(read_spec(FIXTURES / "gpt2-tiny").cfg).total
    half_spec = read_spec(tmp_path / "gpt2-half")
    estimate = pretrained.upcast_nbytes(half_spec)
    assert estimate >= 4 * n_params  # every stored tensor, GPT-2's attn.bias buffers included
    catalog = pretrained.Checkpoints(tmp_path, estimate)  # room for the upcast copy
    mapped, half = catalog.entries["gpt2-tiny"], catalog.entries["gpt2-half"]
    assert pretrained.upcast_nbytes(mapped.spec) == 0
    mapped.params()
    assert mapped.private_bytes == 0 and catalog.budget.used == 0 and catalog.budget.loaded() == ["gpt2-tiny"]
    half.params()
    assert half.private_bytes == 4 * n_params and catalog.budget.used == 4 * n_params
    assert catalog.budget.loaded() == ["gpt2-tiny", "gpt2-half"]  # the mapped one takes no room: both stay


def test_memory_budget_drops_the_least_recently_used(tmp_path):
    for name in ("gpt2-tiny", "bert-tiny"):
        half_precision_copy(FIXTURES / name, tmp_path / name)
    sizes = {name: 4 * count_params(read_spec(FIXTURES / name).cfg).total for name in ("gpt2-tiny", "bert-tiny")}
    # room for one: each estimate (every stored tensor) fits, both loaded do not
    catalog = pretrained.Checkpoints(
        tmp_path,
        max(pretrained.upcast_nbytes(e.spec) for e in (pretrained.Checkpoints(tmp_path, 0).entries[n] for n in sizes)),
    )
    assert catalog.budget.max_bytes < sum(sizes.values())
    gpt2, bert = catalog.entries["gpt2-tiny"], catalog.entries["bert-tiny"]
    gpt2.params()
    assert catalog.budget.loaded() == ["gpt2-tiny"]
    bert.params()
    assert catalog.budget.loaded() == ["bert-tiny"] and catalog.budget.used <= catalog.budget.max_bytes
    gpt2.params()  # dropped before, so read again
    assert gpt2.loads == 2 and bert.loads == 1


def test_a_model_larger_than_the_budget_says_so(tmp_path):
    half_precision_copy(FIXTURES / "gpt2-tiny", tmp_path / "gpt2-half")
    shutil.copytree(FIXTURES / "gpt2-tiny", tmp_path / "gpt2-tiny")
    catalog = pretrained.Checkpoints(tmp_path, 1024)  # 1 KB: the upcast copy needs about 48
    with pytest.raises(ValueError, match="EXPLORER_PRETRAINED_MEMORY_MB"):
        catalog.entries["gpt2-half"].params()
    assert catalog.entries["gpt2-half"].loads == 0  # refused from the header, before reading the weights
    catalog.entries["gpt2-tiny"].params()  # memory-mapped: within any budget
    catalog.entries[pretrained.MINILM_NAME].params()  # 87 MB, mapped too
