"""The switches of other decoder families, checked against independent references.

Grouped-query attention against multi-head attention with repeated K/V heads; local attention and
rotary variants against plain formulas; the KV cache against recomputation on every family's
checkpoint; the ActivationCache's questions (stages, decomposition, lens, detectors, rollout,
ablation) on a grouped-query and a parallel-block model; config validation messages.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import (
    InputError,
    KVCache,
    TransformerConfig,
    forward,
    hook_names,
    init_params,
    iter_arrays,
    kv_cache_bytes,
    reference_attention,
    run_with_cache,
    run_with_kv_cache,
    scaled_dot_product_attention,
)
from core.attention import QUERY_BLOCK, local_mask
from core.cache import decomposition_hooks, stage_hooks
from core.checkpoints import load_checkpoint
from core.functional import rms_norm, silu
from core.hooks import hook_dims, hook_shape
from core.model import per_head_weights
from core.positions import rotary

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
FOLDERS = sorted(p.name for p in FAMILIES.iterdir() if p.is_dir())
bounded = settings(max_examples=25, deadline=None)

# Random models with each family's switches (random weights, float64: exact comparisons).
LLAMA = TransformerConfig(
    d_model=24,
    n_layers=2,
    n_heads=6,
    n_key_value_heads=2,
    d_vocab=17,
    n_ctx=32,
    d_mlp=20,
    normalization_type="RMS",
    gated_mlp=True,
    act_fn="silu",
    positional_embedding_type="rotary",
    rotary_adjacent_pairs=False,
    rotary_base=500.0,
    bias=False,
    qkv_bias=True,
    use_qk_norm=True,
    tied_embeddings=False,
)
NEOX = TransformerConfig(
    d_model=16,
    n_layers=2,
    n_heads=2,
    d_vocab=13,
    n_ctx=32,
    act_fn="gelu",
    positional_embedding_type="rotary",
    rotary_dim=4,
    rotary_adjacent_pairs=False,
    parallel_attn_mlp=True,
    tied_embeddings=False,
    unembed_bias=False,
)
NEO = TransformerConfig(
    d_model=16,
    n_layers=2,
    n_heads=4,
    d_vocab=13,
    n_ctx=32,
    use_attn_scale=False,
    attn_types=("global", "local"),
    window_size=3,
    qkv_bias=False,
)


def params_of(cfg: TransformerConfig, seed: int = 0):
    """init_params with every gain and bias drawn too, so that none of them can be silently ignored."""
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for _, a in iter_arrays(params):
        if a.ndim == 1:
            a += rng.normal(0, 0.2, a.shape)
    return params


# ---------------------------------------------------------------------------- functions


def test_rms_norm_and_silu_against_their_formulas():
    x = np.random.default_rng(0).normal(size=(5, 7))
    w = np.linspace(0.5, 2, 7)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(rms_norm(x, w, 1e-6), expected, rtol=1e-12)
    np.testing.assert_allclose(silu(x), x / (1 + np.exp(-x)), rtol=1e-12, atol=1e-15)
    assert np.all(np.isfinite(silu(np.array([-1e4, 1e4]))))  # no overflow at the extremes
    assert silu(np.ones(2, np.float32)).dtype == np.float32 and rms_norm(x.astype(np.float32)).dtype == np.float32


@bounded
@given(st.integers(1, 8), st.integers(0, 12), st.sampled_from([2, 4, 6, 8]), st.booleans(), st.integers(0, 99))
def test_rotary_layouts_are_one_rotation_up_to_a_permutation(n_pos, start, rotary_dim, full, seed):
    """The half-split layout on x equals the adjacent-pairs layout on x with its first rotary_dim
    dimensions interleaved (i, i + r/2) -> (2i, 2i + 1); the rest pass through."""
    d_head = rotary_dim if full else rotary_dim + 4
    x = np.random.default_rng(seed).normal(size=(3, n_pos, d_head))
    positions = np.arange(start, start + n_pos)
    half = rotary_dim // 2
    perm = np.concatenate(
        [np.stack([np.arange(half), np.arange(half) + half], -1).ravel(), np.arange(rotary_dim, d_head)]
    )  # half-split order -> adjacent order
    by_halves = rotary(x, positions, rotary_dim=rotary_dim, base=77.0, adjacent_pairs=False)
    by_pairs = rotary(x[..., perm], positions, rotary_dim=rotary_dim, base=77.0, adjacent_pairs=True)
    np.testing.assert_allclose(by_halves[..., perm], by_pairs, atol=1e-12)
    np.testing.assert_array_equal(by_halves[..., rotary_dim:], x[..., rotary_dim:])  # untouched
    np.testing.assert_allclose(np.linalg.norm(by_halves, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)


@pytest.mark.parametrize("adjacent_pairs", [True, False])
def test_rotary_scores_depend_only_on_the_offset_in_both_layouts(adjacent_pairs):
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(1, 12)), rng.normal(size=(1, 12))
    kw = dict(rotary_dim=8, base=1000.0, adjacent_pairs=adjacent_pairs)

    def score(m, n):
        return (rotary(q, np.array([m]), **kw) @ rotary(k, np.array([n]), **kw).T).item()

    assert score(7, 3) == pytest.approx(score(24, 20), abs=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-6)


@bounded
@given(st.integers(1, 150), st.integers(0, 40), st.integers(1, 10), st.integers(0, 99))
def test_blocked_local_attention_equals_the_plain_reference(n_query, n_past, window, seed):
    """Across query blocks (n_query > 64) and after cached keys, with grouped query heads."""
    rng = np.random.default_rng(seed)
    n_key = n_query + n_past
    q = rng.normal(size=(2, 3, n_query, 4))  # [n_kv_heads, group, query_pos, d_head]
    k, v = rng.normal(size=(2, 1, n_key, 4)), rng.normal(size=(2, 1, n_key, 5))
    fast = scaled_dot_product_attention(q, k, v, causal=True, window=window)
    slow = reference_attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), causal=True, window=window)
    np.testing.assert_allclose(fast.weights, slow.weights, atol=1e-12)
    np.testing.assert_allclose(fast.output, slow.output, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(fast.scores), np.isneginf(slow.scores))
    # each query sees exactly min(window, its position + 1) keys
    visible = (fast.weights > 0).sum(-1)
    np.testing.assert_array_equal(visible[0, 0], np.minimum(window, n_past + np.arange(n_query) + 1))
    assert QUERY_BLOCK == 64  # the sizes above cross a block boundary


def test_local_mask_hides_keys_window_or_more_back():
    np.testing.assert_array_equal(
        local_mask(4, 4, 2), np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    )
    with pytest.raises(InputError, match="causal"):
        scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), window=1)


# ---------------------------------------------------------------------------- grouped-query attention


def as_multi_head(params, cfg: TransformerConfig):
    """The same model with every key/value head repeated for each query head of its group: a
    plain multi-head model, computed without any broadcasting."""
    mha = cfg.replace(n_key_value_heads=cfg.n_heads)
    out = copy.deepcopy(params)
    for block in out["blocks"]:
        attn = block["attn"]
        for m in "KV":
            w = attn[f"W_{m}"].reshape(cfg.d_model, cfg.n_key_value_heads, cfg.d_head)
            attn[f"W_{m}"] = np.repeat(w, cfg.group_size, axis=1).reshape(cfg.d_model, -1)
            if f"b_{m}" in attn:
                attn[f"b_{m}"] = np.repeat(attn[f"b_{m}"].reshape(-1, cfg.d_head), cfg.group_size, 0).ravel()
    return out, mha


def test_grouped_query_attention_equals_multi_head_attention_with_repeated_kv_heads():
    params = params_of(LLAMA)
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    logits, cache = run_with_cache(params, LLAMA, tokens)
    mha_params, mha = as_multi_head(params, LLAMA)
    mha_logits, mha_cache = run_with_cache(mha_params, mha, tokens)
    np.testing.assert_allclose(logits, mha_logits, rtol=1e-10, atol=1e-10)
    for layer in range(LLAMA.n_layers):
        np.testing.assert_allclose(
            cache[f"blocks.{layer}.attn.hook_pattern"], mha_cache[f"blocks.{layer}.attn.hook_pattern"], atol=1e-12
        )
        k, k_mha = cache[f"blocks.{layer}.attn.hook_rot_k"], mha_cache[f"blocks.{layer}.attn.hook_rot_k"]
        assert k.shape == (8, 2, 4) and k_mha.shape == (8, 6, 4)  # [pos, kv heads, d_head]
        np.testing.assert_allclose(np.repeat(k, 3, axis=1), k_mha, atol=1e-12)


def test_attention_stages_use_the_query_heads_kv_head():
    params = params_of(LLAMA)
    _, cache = run_with_cache(params, LLAMA, np.arange(7), names=stage_hooks(LLAMA, 1))
    for head in range(LLAMA.n_heads):
        kv = LLAMA.kv_head(head)
        assert kv == head // 3
        stages = cache.attention_stages(1, head)
        q, k = cache["blocks.1.attn.hook_rot_q"][:, head], cache["blocks.1.attn.hook_rot_k"][:, kv]
        np.testing.assert_allclose(stages.raw, q @ k.T, rtol=1e-12)
        np.testing.assert_allclose(stages.weights, cache["blocks.1.attn.hook_pattern"][head])
        np.testing.assert_allclose(stages.masked[~stages.mask], stages.scaled[~stages.mask])


def test_per_head_weights_are_views_in_every_layout():
    for cfg in (LLAMA, NEOX, NEO):
        attn = init_params(cfg)["blocks"][0]["attn"]
        heads = per_head_weights(attn, cfg)
        assert heads["W_Q"].shape == (cfg.n_heads, cfg.d_model, cfg.d_head)
        assert heads["W_K"].shape == (cfg.n_key_value_heads, cfg.d_model, cfg.d_head)
        for w in heads.values():
            assert not w.flags.owndata  # a view of the stored matrix
    neox = load_checkpoint(FAMILIES / "gpt-neox-parallel")
    attn = neox.params["blocks"][0]["attn"]
    assert attn["W_QKV"].ndim == 4  # [d_model, n_heads, 3, d_head], a view of query_key_value.weight
    x = np.random.default_rng(0).normal(size=(3, neox.cfg.d_model)).astype(np.float32)
    heads = per_head_weights(attn, neox.cfg)
    fused = x @ attn["W_QKV"].reshape(neox.cfg.d_model, -1)  # [pos, n_heads * 3 * d_head]
    np.testing.assert_allclose(
        np.einsum("pd,hde->phe", x, heads["W_K"]), fused.reshape(3, neox.cfg.n_heads, 3, -1)[:, :, 1], atol=1e-5
    )


def test_ablating_one_query_head_leaves_its_group_mates_alone():
    params = params_of(LLAMA)
    tokens = np.arange(6)
    _, base = run_with_cache(params, LLAMA, tokens)
    logits, ablated = run_with_cache(params, LLAMA, tokens, ablate={(0, 4): "zero"})
    z, z0 = ablated["blocks.0.attn.hook_z"], base["blocks.0.attn.hook_z"]
    np.testing.assert_array_equal(z[:, 4], 0.0)
    np.testing.assert_array_equal(z[:, [3, 5]], z0[:, [3, 5]])  # heads 3, 4, 5 share key/value head 1
    np.testing.assert_array_equal(ablated["blocks.0.attn.hook_k"], base["blocks.0.attn.hook_k"])
    assert not np.allclose(ablated["blocks.0.hook_attn_out"], base["blocks.0.hook_attn_out"])


@pytest.mark.parametrize("cfg", [LLAMA, NEOX, NEO], ids=["gqa-gated-qknorm", "neox-parallel", "neo-local"])
def test_every_hook_has_its_declared_shape(cfg):
    n = 5
    logits, cache = run_with_cache(params_of(cfg), cfg, np.arange(n))
    assert list(cache) == hook_names(cfg)
    for name, value in cache.items():
        assert value.shape == hook_dims(name, cfg, n), name
    if cfg.n_key_value_heads != cfg.n_heads:
        assert hook_shape("blocks.0.attn.hook_v", cfg) == "[pos, kv_head_index, d_head]"
        assert hook_shape("blocks.0.attn.hook_v") == "[pos, head_index, d_head]"
    assert ("blocks.0.mlp.hook_pre_linear" in cache) == cfg.gated_mlp


def test_gated_mlp_hooks_follow_transformer_lens():
    params = params_of(LLAMA)
    _, cache = run_with_cache(params, LLAMA, np.arange(4))
    mlp = params["blocks"][0]["mlp"]
    x = rms_norm(cache["blocks.0.hook_resid_mid"], params["blocks"][0]["ln2"]["w"], LLAMA.eps)
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_pre"], x @ mlp["W_gate"], rtol=1e-12)
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_pre_linear"], x @ mlp["W_in"], rtol=1e-12)
    np.testing.assert_allclose(
        cache["blocks.0.mlp.hook_post"], silu(cache["blocks.0.mlp.hook_pre"]) * cache["blocks.0.mlp.hook_pre_linear"]
    )


def test_a_parallel_block_feeds_the_mlp_the_blocks_input():
    params = params_of(NEOX)
    _, cache = run_with_cache(params, NEOX, np.arange(5))
    from core.functional import layer_norm

    ln2 = params["blocks"][1]["ln2"]
    x = layer_norm(cache["blocks.1.hook_resid_pre"], ln2["w"], ln2["b"], NEOX.eps)
    np.testing.assert_allclose(
        cache["blocks.1.mlp.hook_pre"],
        x @ params["blocks"][1]["mlp"]["W_in"] + params["blocks"][1]["mlp"]["b_in"],
        rtol=1e-10,
    )
    np.testing.assert_allclose(
        cache["blocks.1.hook_resid_post"],
        cache["blocks.1.hook_resid_pre"] + cache["blocks.1.hook_attn_out"] + cache["blocks.1.hook_mlp_out"],
        rtol=1e-12,
    )


# ---------------------------------------------------------------------------- the KV cache, every family


def as_float64(params):
    if isinstance(params, dict):
        return {k: as_float64(v) for k, v in params.items()}
    if isinstance(params, list):
        return [as_float64(v) for v in params]
    return np.asarray(params, dtype=np.float64)


@pytest.mark.parametrize("folder", FOLDERS)
def test_cached_steps_equal_the_full_recomputation_on_every_family(folder):
    """Token by token with the KV cache (windows, GQA, rotary offsets, learned positions) gives the
    logits of one pass over the whole text, and so does continuing from a split point: exactly in
    float64; in float32 within its rounding (relative to the logits' size)."""
    ckpt = load_checkpoint(FAMILIES / folder)
    cfg = ckpt.cfg
    tokens = np.array(ckpt.tokenizer.encode("The cat sat on the mat, and the dog sat.").ids)
    for params, atol in ((as_float64(ckpt.params), 1e-10), (ckpt.params, None)):
        full, _, kv_full = forward(params, cfg, tokens)
        atol = atol or 1e-5 * np.abs(full).max()
        run = run_with_kv_cache(params, cfg, tokens)
        np.testing.assert_allclose(np.stack([s.logits for s in run.steps]), full, atol=atol)
        split = 5
        _, _, kv = forward(params, cfg, tokens[:split], names=())
        rest, _, kv_all = forward(params, cfg, tokens[split:], past_kv=kv)
        np.testing.assert_allclose(rest, full[split:], atol=atol)
        np.testing.assert_allclose(kv_all.keys[-1], kv_full.keys[-1], atol=atol)
    for k in kv_all.keys:
        assert k.shape == (cfg.n_key_value_heads, tokens.size, cfg.d_head)
    assert kv_all.nbytes == kv_cache_bytes(cfg, int(tokens.size)).bytes  # float32, as the formula assumes


def test_an_empty_kv_cache_has_the_kv_heads():
    kv = KVCache.empty(LLAMA, np.float32)
    assert kv.keys[0].shape == (2, 0, 4) and kv.n_tokens == 0


# ---------------------------------------------------------------------------- the cache's questions


@pytest.mark.parametrize("folder", ["llama-gqa", "gpt-neox-parallel", "qwen2-sliding"])
def test_decomposition_sums_to_the_residual_and_the_logit(folder):
    """RMS norm (no centring) and layer norm, grouped heads and parallel blocks alike: the parts add
    up to the last residual stream, and their direct logits plus the bias to the model's logit."""
    ckpt = load_checkpoint(FAMILIES / folder)
    tokens = np.array(ckpt.tokenizer.encode("Ali makan nasi lemak.").ids)
    logits, cache = run_with_cache(ckpt.params, ckpt.cfg, tokens, names=decomposition_hooks(ckpt.cfg))
    token = int(np.argmax(logits[-1]))
    d = cache.decompose_resid(token)
    assert len(d.labels) == d.parts.shape[0] and sum(lab.startswith("L0H") for lab in d.labels) == ckpt.cfg.n_heads
    _, full = run_with_cache(ckpt.params, ckpt.cfg, tokens)
    np.testing.assert_allclose(d.parts.sum(0), full[f"blocks.{ckpt.cfg.n_layers - 1}.hook_resid_post"][-1], atol=1e-4)
    assert d.direct_logit.sum() + d.logit_bias == pytest.approx(d.logit, abs=1e-3)


@pytest.mark.parametrize("folder", ["llama-gqa", "gpt-neox-parallel"])
def test_lens_detectors_rollout_and_norms_on_other_families(folder):
    ckpt = load_checkpoint(FAMILIES / folder)
    cfg = ckpt.cfg
    tokens = np.tile(np.arange(3, 9), 2)
    logits, cache = run_with_cache(ckpt.params, cfg, tokens)
    lens = cache.logit_lens(k=3)
    np.testing.assert_array_equal(lens.top_tokens[-1, :, 0], np.argmax(logits, axis=-1))  # the last point is the model
    scores = cache.head_detector_scores()
    assert all(s.shape == (cfg.n_layers, cfg.n_heads) and np.all((s >= 0) & (s <= 1 + 1e-6)) for s in scores.values())
    rollout = cache.rollout()
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-5)
    norms = cache.residual_norms()
    np.testing.assert_allclose(
        norms.stream[:, -1], np.linalg.norm(cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"], axis=-1), rtol=1e-6
    )


# ---------------------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"n_heads": 4, "n_key_value_heads": 3}, "n_heads=4 is not divisible by n_key_value_heads=3"),
        ({"n_key_value_heads": 0}, "n_key_value_heads must be a positive integer"),
        ({"positional_embedding_type": "rotary", "rotary_dim": 3}, "rotary_dim=3 must be an even number"),
        ({"positional_embedding_type": "rotary", "rotary_dim": 32}, "between 2 and d_head=16"),
        ({"positional_embedding_type": "rotary", "rotary_base": 0.5}, "rotary_base"),
        ({"attn_types": ("global", "local")}, "need a window_size"),
        ({"attn_types": ("local",), "window_size": 4}, "one entry per layer"),
        ({"attn_types": ("global", "nearby"), "window_size": 4}, "'nearby' is not one of global, local"),
        ({"attn_types": ("local", "local"), "window_size": 4, "attention_dir": "bidirectional"}, "need causal"),
        ({"window_size": 0}, "window_size must be a positive number"),
        ({"parallel_attn_mlp": True, "block_type": "post_norm"}, "pre-norm"),
        ({"qkv_bias": "yes"}, "qkv_bias must be true, false or null"),
        ({"normalization_type": "ScaleNorm"}, "normalization_type='ScaleNorm' is not one of LN, LNPre, RMS, RMSPre"),
    ],
)
def test_bad_family_switches_say_what_to_change(changes, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TransformerConfig(**({"d_model": 64, "n_heads": 4, "n_layers": 2} | changes))


def test_replace_keeps_the_meaning_of_derived_switches():
    mha = TransformerConfig(n_heads=4, positional_embedding_type="rotary")
    assert mha.replace(n_heads=8).n_key_value_heads == 8  # one K/V head per query head, still
    assert mha.replace(n_heads=8).rotary_dim == 8  # the whole (now narrower) head, still
    gqa = LLAMA.replace(n_layers=3)
    assert gqa.n_key_value_heads == 2
    assert NEO.replace(n_layers=5).attn_types == ("global", "local", "global", "local", "global")
    assert TransformerConfig(bias=False).replace(bias=True).qkv_bias is True
    with pytest.raises(InputError, match="not divisible by n_key_value_heads"):
        LLAMA.replace(n_heads=3, d_model=12)  # 2 key/value heads cannot split 3 query heads
