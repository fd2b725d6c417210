"""/api/v1/params and /api/v1/kv-cache: the spec's counts, and sizes checked independently."""

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
    assert k["terms"] == {"n_layers": 12, "batch": 2, "seq_len": 1024, "n_heads": 12, "d_head": 64, "dtype_bytes": size}
    assert "n_layers" in k["formula"]


def test_kv_cache_sizes(client):
    k = client.get("/api/v1/kv-cache", params={"n_layers": 4, "d_model": 256, "n_heads": 8, "seq_len": 100}).json()
    assert k["bytes"] == 2 * 4 * 1 * 100 * 256 * 4
