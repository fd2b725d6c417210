"""/api/v1/params and /api/v1/kv-cache: the spec's counts, and sizes checked independently; the other
families' presets against transformers' own counts (tests/fixtures/families/presets.json)."""

import json
from pathlib import Path

import pytest


def test_spec_parameter_counts(client):
    # the spec's printed table: toy and GPT-2 small
    for preset, expected in (("toy", (8_256, 49_984, 108_352)), ("gpt2-small", (39_383_808, 7_087_872, 124_439_808))):
        p = client.get("/api/v1/params", params={"preset": preset}).json()
        assert (p["embeddings"], p["per_block"], p["total"]) == expected


def test_breakdown_names_every_component_and_says_what_is_counted(client):
    p = client.get("/api/v1/params", params={"preset": "gpt2-small"}).json()
    by_name = {e["name"]: e for e in p["breakdown"]}
    assert by_name["embed.W_E"]["shape"] == [50257, 768] and by_name["embed.W_E"]["counted"]
    tied = by_name["unembed.W_U"]
    assert not tied["counted"] and tied["total"] == 0 and "tied" in tied["note"]
    assert not by_name["blocks.{l}.attn.mask"]["counted"]
    assert by_name["blocks.{l}.attn.W_QKV"]["total"] == 12 * 768 * 3 * 768
    assert sum(e["total"] for e in p["breakdown"]) == p["total"]


def test_explicit_sizes_replace_the_preset(client):
    d, V, n_ctx, L = 100, 1000, 32, 3
    p = client.get("/api/v1/params", params={"d_vocab": V, "n_ctx": n_ctx, "d_model": d, "n_layers": L}).json()
    block = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # attention, MLP (d_mlp = 4d) with biases, 2 norms
    assert p["embeddings"] == V * d + n_ctx * d
    assert p["per_block"] == block
    assert p["total"] == V * d + n_ctx * d + L * block + 2 * d
    untied = client.get("/api/v1/params", params={"preset": "toy", "tied_embeddings": "false"}).json()
    assert untied["total"] == 108_352 + 64 * 65 + 65  # an output matrix and its bias


@pytest.mark.parametrize("dtype,size", [("float32", 4), ("float16", 2), ("bfloat16", 2), ("int8", 1)])
def test_kv_cache_bytes(client, dtype, size):
    k = client.get("/api/v1/kv-cache", params={"preset": "gpt2-small", "dtype": dtype, "batch": 2}).json()
    assert k["bytes"] == 2 * 12 * 2 * 1024 * 768 * size
    assert k["terms"] == {
        "n_layers": 12,
        "batch": 2,
        "seq_len": 1024,
        "n_heads": 12,
        "n_key_value_heads": 12,
        "d_head": 64,
        "dtype_bytes": size,
    }
    assert "n_layers" in k["formula"]


def test_kv_cache_sizes(client):
    k = client.get("/api/v1/kv-cache", params={"n_layers": 4, "d_model": 256, "n_heads": 8, "seq_len": 100}).json()
    assert k["bytes"] == 2 * 4 * 1 * 100 * 256 * 4


# ------------------------------------------------------------------ other families' shapes

PRESETS_JSON = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "families" / "presets.json").read_text())
FAMILY_PRESETS = sorted(PRESETS_JSON["presets"])


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_family_presets_count_what_transformers_counts(client, preset):
    recorded = PRESETS_JSON["presets"][preset]  # transformers' num_parameters() for the model's config.json
    p = client.get("/api/v1/params", params={"preset": preset}).json()
    assert p["total"] == recorded["num_parameters"]
    c = recorded["config"]
    heads = c.get("num_attention_heads") or c["num_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    d_head = c.get("head_dim") or c["hidden_size"] // heads
    layers = c.get("num_hidden_layers") or c["num_layers"]
    k = client.get("/api/v1/kv-cache", params={"preset": preset, "seq_len": 4096, "dtype": "bfloat16"}).json()
    assert k["bytes"] == 2 * layers * 4096 * kv_heads * d_head * 2  # the key/value heads only
    assert k["terms"]["n_heads"] == heads and k["terms"]["n_key_value_heads"] == kv_heads


def test_grouped_query_attention_shrinks_the_keys_values_and_their_cache(client):
    d, L, h = 768, 12, 12  # GPT-2 small, its 12 heads of 64 sharing 4 key/value heads
    full = client.get("/api/v1/params", params={"preset": "gpt2-small"}).json()
    gqa = client.get("/api/v1/params", params={"preset": "gpt2-small", "n_key_value_heads": 4}).json()
    # W_K and W_V shrink from d × d to d × 4·64, their biases from d to 4·64
    assert full["total"] - gqa["total"] == L * 2 * (d * d + d - (d * 4 * 64 + 4 * 64))
    names = {e["name"]: e["shape"] for e in gqa["breakdown"]}
    assert names["blocks.{l}.attn.W_K"] == [d, 4 * 64] and names["blocks.{l}.attn.W_Q"] == [d, d]
    k = client.get("/api/v1/kv-cache", params={"preset": "gpt2-small", "n_key_value_heads": 4}).json()
    assert k["bytes"] == 2 * L * 1024 * 4 * 64 * 4 and "n_key_value_heads" in k["formula"]
    assert h % 4 == 0


def test_gated_mlp_rms_norm_and_rotary_change_the_count_array_by_array(client):
    d, L, m, V = 64, 2, 256, 65  # the toy
    base = client.get("/api/v1/params").json()["total"]
    gated = client.get("/api/v1/params", params={"gated_mlp": True}).json()["total"]
    assert gated - base == L * (d * m + m)  # W_gate and its bias
    rms = client.get("/api/v1/params", params={"normalization_type": "RMS"}).json()["total"]
    assert base - rms == (2 * L + 1) * d  # every norm loses its bias
    rotary = client.get("/api/v1/params", params={"positional_embedding_type": "rotary"}).json()["total"]
    assert base - rotary == 64 * d  # the position table (n_ctx 64) is gone
    llama_like = client.get(
        "/api/v1/params",
        params={"gated_mlp": True, "normalization_type": "RMS", "bias": False, "positional_embedding_type": "rotary"},
    ).json()
    assert llama_like["total"] == V * d + L * (4 * d * d + 3 * d * m + 2 * d) + d
    qk = client.get("/api/v1/params", params={"use_qk_norm": True}).json()["total"]
    assert qk - base == L * 2 * (d // 4)  # a gain of d_head for queries and keys
    qkv = client.get("/api/v1/params", params={"bias": False, "qkv_bias": True}).json()["total"]
    nobias = client.get("/api/v1/params", params={"bias": False}).json()["total"]
    assert qkv - nobias == L * 3 * d


@pytest.mark.parametrize(
    "query, says",
    [
        ({"preset": "smollm2-135m", "n_key_value_heads": 2}, "n_heads=9 is not divisible by n_key_value_heads=2"),
        ({"n_key_value_heads": 0}, "n_key_value_heads"),
        ({"d_head": 10**6}, "d_head"),
        ({"normalization_type": "batch"}, "normalization_type"),
    ],
)
def test_bad_shapes_are_422_saying_what_to_change(client, query, says):
    for path in ("/api/v1/params", "/api/v1/kv-cache"):
        if path.endswith("kv-cache") and ("normalization_type" in query):
            continue
        r = client.get(path, params=query)
        assert r.status_code == 422 and says in r.text, (path, r.text)
