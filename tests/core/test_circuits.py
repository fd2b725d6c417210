"""Circuits (core/circuits.py): a score's QK decomposition sums to the score in every family (norms, position
schemes, weight layouts), the composition and copying scores equal their formulas computed the long way,
and the induction model's previous-token head is what its induction head reads through its keys."""

from __future__ import annotations

import numpy as np
import pytest

from core import InputError, TransformerConfig, run_with_cache
from core.checkpoints import load_checkpoint, trained_models
from core.circuits import (
    composition_baseline,
    composition_scores,
    folded_heads,
    ov_circuit,
    qk_decomposition,
    resid_parts,
)
from core.model import per_head_weights, unembedding

from .test_analysis import random_params

TOKENS = np.array([3, 7, 1, 7, 3, 9, 0, 7, 2])
FAMILIES = {
    "LN learned": {},
    "LN sinusoidal": dict(positional_embedding_type="sinusoidal"),
    "LN rotary, adjacent pairs": dict(positional_embedding_type="rotary"),
    "LN rotary, rotate half, partial": dict(
        positional_embedding_type="rotary", rotary_dim=2, rotary_adjacent_pairs=False
    ),
    "LNPre attention-only": dict(attn_only=True, normalization_type="LNPre"),
    "RMS rotary GQA gated (Llama)": dict(
        positional_embedding_type="rotary",
        normalization_type="RMS",
        n_key_value_heads=2,
        gated_mlp=True,
        act_fn="silu",
        bias=False,
    ),
    "RMS qkv bias (Qwen2)": dict(
        normalization_type="RMS",
        bias=False,
        qkv_bias=True,
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
    ),
    "RMS qk norm (Qwen3)": dict(
        normalization_type="RMS", bias=False, use_qk_norm=True, positional_embedding_type="rotary"
    ),
    "parallel (GPT-NeoX)": dict(parallel_attn_mlp=True, positional_embedding_type="rotary", rotary_dim=2),
    "unscaled, temperature, window": dict(
        use_attn_scale=False, attn_temperature=1.7, attn_types=("global", "local", "global"), window_size=4
    ),
}


def model(**variant):
    cfg = TransformerConfig(d_model=16, n_heads=4, n_layers=3, d_vocab=23, n_ctx=16, d_mlp=32, **variant)
    return cfg, random_params(cfg)


def neox_layout(params, cfg):
    """The same weights in GPT-NeoX's fused per-head layout: W_QKV [d_model, n_heads, 3, d_head], b_QKV [n_heads, 3,
    d_head]."""
    for block in params["blocks"]:
        attn = block["attn"]
        w = per_head_weights(attn, cfg)
        bias = attn["b_QKV"].reshape(3, cfg.n_heads, cfg.d_head)
        attn["W_QKV"] = np.stack([w["W_Q"], w["W_K"], w["W_V"]], axis=1).transpose(2, 0, 1, 3).copy()
        attn["b_QKV"] = bias.transpose(1, 0, 2).copy()
    return params


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_parts_sum_to_the_stream_and_the_contributions_to_the_score(family):
    cfg, params = model(**FAMILIES[family])
    _, cache = run_with_cache(params, cfg, TOKENS)
    for layer in range(cfg.n_layers):
        for pos in (0, 4, 8):
            labels, parts = resid_parts(cache, layer, pos)
            assert len(labels) == len(parts)
            np.testing.assert_allclose(parts.sum(0), cache[f"blocks.{layer}.hook_resid_pre"][pos], atol=1e-12)
        for head in range(cfg.n_heads):
            for query, key in ((8, 0), (5, 5), (6, 3), (2, 1)):
                if cfg.window(layer) and query - key >= cfg.window(layer):
                    continue
                d = qk_decomposition(cache, layer, head, query, key)
                assert d.contributions.shape == (len(d.query_parts), len(d.key_parts))
                assert abs(d.total - d.score) < 1e-9, (layer, head, query, key)
                assert d.score == cache[f"blocks.{layer}.attn.hook_attn_scores"][head, query, key]


def test_the_fused_per_head_layout_gives_the_same_decomposition():
    cfg, params = model(positional_embedding_type="rotary", rotary_dim=2, rotary_adjacent_pairs=False)
    _, cache = run_with_cache(params, cfg, TOKENS)
    _, neox = run_with_cache(neox_layout(random_params(cfg), cfg), cfg, TOKENS)
    for layer, head in ((0, 1), (2, 3)):
        a, b = qk_decomposition(cache, layer, head, 7, 2), qk_decomposition(neox, layer, head, 7, 2)
        np.testing.assert_allclose(a.contributions, b.contributions, atol=1e-12)
        assert abs(b.total - b.score) < 1e-9


def test_labels_and_bias_terms():
    cfg, params = model()
    _, cache = run_with_cache(params, cfg, TOKENS)
    d = qk_decomposition(cache, 2, 1, 8, 3)
    assert d.query_parts[:6] == ["embed", "pos_embed", "L0H0", "L0H1", "L0H2", "L0H3"]
    assert d.query_parts[-4:] == ["L1 attn bias", "L1 mlp", "L1 mlp bias", "bias"] and d.key_parts == d.query_parts
    c = d.contributions
    assert d.bias_terms == pytest.approx(
        {
            "query bias × key parts": c[-1, :-1].sum(),
            "query parts × key bias": c[:-1, -1].sum(),
            "query bias × key bias": c[-1, -1],
        }
    )
    (q, k, value), *_ = d.top_pairs(3)
    assert abs(value) == np.abs(c).max()
    bare, bare_params = model(normalization_type="LNPre", bias=False)
    _, cache = run_with_cache(bare_params, bare, TOKENS)
    assert "bias" not in qk_decomposition(cache, 1, 0, 8, 3).query_parts  # nothing to add


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: qk_decomposition(c, 0, 0, 2, 5), "key position 5 is after the query: the causal mask hides it"),
        (lambda c: qk_decomposition(c, 0, 0, 9, 0), "position 9 is outside the text's 9 tokens"),
        (lambda c: qk_decomposition(c, 3, 0, 2, 1), "layer 3, head 0 does not exist"),
    ],
)
def test_a_score_that_is_not_there_is_refused(call, message):
    cfg, params = model()
    with pytest.raises(InputError, match=message):
        call(run_with_cache(params, cfg, TOKENS)[1])


def test_a_key_outside_the_window_and_a_post_norm_model_are_refused():
    cfg, params = model(attn_types=("local", "global", "local"), window_size=3)
    with pytest.raises(InputError, match="further back than this layer's window of 3 tokens"):
        qk_decomposition(run_with_cache(params, cfg, TOKENS)[1], 0, 0, 8, 2)
    bert, bert_params = model(block_type="post_norm", attention_dir="bidirectional")
    with pytest.raises(InputError, match="needs a pre-norm model"):
        qk_decomposition(run_with_cache(bert_params, bert, TOKENS)[1], 0, 0, 2, 5)


# ------------------------------------------------------------------ composition and OV, the long way


@pytest.mark.parametrize("family", ["LN learned", "RMS rotary GQA gated (Llama)", "LNPre attention-only"])
def test_composition_scores_equal_the_formula_on_full_matrices(family):
    cfg, params = model(**FAMILIES[family])
    comp = composition_scores(params, cfg)
    w = folded_heads(params, cfg)
    H = cfg.n_heads

    def score(A, B):
        return np.linalg.norm(A @ B) / (np.linalg.norm(A) * np.linalg.norm(B))

    for later in range(cfg.n_layers * H):
        for earlier in range(cfg.n_layers * H):
            (l2, h2), (l1, h1) = divmod(later, H), divmod(earlier, H)
            if l1 >= l2:
                assert np.isnan(comp.q[later, earlier]) and np.isnan(comp.v[later, earlier])
                continue
            ov1 = w["W_V"][l1, h1] @ w["W_O"][l1, h1]  # d_model x d_model
            qk2 = w["W_Q"][l2, h2] @ w["W_K"][l2, h2].T
            ov2 = w["W_V"][l2, h2] @ w["W_O"][l2, h2]
            assert comp.q[later, earlier] == pytest.approx(score(ov1, qk2), abs=1e-12)
            assert comp.k[later, earlier] == pytest.approx(score(ov1, qk2.T), abs=1e-12)
            assert comp.v[later, earlier] == pytest.approx(score(ov1, ov2), abs=1e-12)
    assert comp.heads[:2] == ["L0H0", "L0H1"] and 0 < comp.baseline < 1


def test_the_folded_weights_are_the_models_with_gains_in_and_writes_centred():
    cfg, params = model()
    w = folded_heads(params, cfg)
    block = params["blocks"][1]
    raw = per_head_weights(block["attn"], cfg)
    np.testing.assert_allclose(w["W_Q"][1, 2], block["ln1"]["w"][:, None] * raw["W_Q"][2])
    np.testing.assert_allclose(w["W_O"][1, 2].sum(-1), 0.0, atol=1e-12)


def test_the_baseline_is_the_score_of_random_matrices_and_shrinks_with_width():
    narrow, wide = composition_baseline(16, 4), composition_baseline(256, 4)
    assert wide[0] < narrow[0]
    assert composition_baseline(16, 4) == narrow  # seeded


@pytest.mark.parametrize("shape", ["test model", "induction"])
def test_the_reported_baseline_is_the_mean_score_of_random_matrices_of_the_models_shapes(shape):
    """The baseline composition_scores reports, against the mean composition score of 2,000 pairs of Gaussian
    matrices of the model's shapes drawn here (another seed than the code's): W_A = A1 B1 and W_B = A2 B2 with
    A [d_model, d_head], B [d_head, d_model], scored the long way, ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F) on the
    d_model × d_model products. The code averages BASELINE_SAMPLES = 64 scores, so the two means may differ by
    sampling alone: the tolerance is 4 standard errors of their difference, sd·√(1/64 + 1/2000); the standard
    deviation it reports is held to 4 standard errors of a 64-sample estimate, sd/√(2·63)."""
    if shape == "induction":
        ckpt = load_checkpoint(trained_models()["induction"])
        cfg, params = ckpt.cfg, ckpt.params
    else:
        cfg, params = model()
    comp = composition_scores(params, cfg)
    rng = np.random.default_rng(2026)
    n, d, r = 2000, cfg.d_model, cfg.d_head
    A1, A2 = rng.standard_normal((2, n, d, r))
    B1, B2 = rng.standard_normal((2, n, r, d))
    W_A, W_B = A1 @ B1, A2 @ B2  # [n, d_model, d_model]
    scores = np.linalg.norm(W_A @ W_B, axis=(1, 2)) / (
        np.linalg.norm(W_A, axis=(1, 2)) * np.linalg.norm(W_B, axis=(1, 2))
    )
    mean, sd = scores.mean(), scores.std()
    assert abs(comp.baseline - mean) < 4 * sd * np.sqrt(1 / 64 + 1 / n), (comp.baseline, mean, sd)
    assert abs(comp.baseline_std - sd) < 4 * sd / np.sqrt(2 * 63), (comp.baseline_std, sd)
    # the tolerance is narrow enough to tell these shapes' baseline from a neighbour's
    assert abs(composition_baseline(2 * d, r)[0] - mean) > 4 * sd * np.sqrt(1 / 64 + 1 / n)


def test_the_ov_circuit_and_its_copying_score_equal_the_full_vocabulary_matrix():
    cfg, params = model()
    ov = ov_circuit(params, cfg, 1, 2, [3, 7, 7])
    block = params["blocks"][1]
    w = per_head_weights(block["attn"], cfg)
    W_E = params["embed"]["W_E"] - params["embed"]["W_E"].mean(-1, keepdims=True)
    W_O = w["W_O"][2] - w["W_O"][2].mean(-1, keepdims=True)
    W_U = params["ln_final"]["w"][:, None] * unembedding(params)[0]
    full = W_E @ (block["ln1"]["w"][:, None] * w["W_V"][2]) @ W_O @ W_U  # [d_vocab, d_vocab]
    np.testing.assert_allclose(ov.logits, full[[3, 7, 7]], atol=1e-12)
    eig = np.linalg.eigvals(full)
    assert ov.copying_score == pytest.approx(eig.real.sum() / np.abs(eig).sum(), abs=1e-9)
    ids, logits = ov.top(3)
    assert ids.shape == (3, 3) and (np.diff(logits, axis=-1) <= 0).all()
    assert ov.self_rank[0] == (full[3] > full[3, 3]).sum()
    with pytest.raises(InputError, match="source tokens must be ids in 0..22"):
        ov_circuit(params, cfg, 1, 2, [23])


# ------------------------------------------------------------------ the induction model


def test_the_induction_head_reads_the_previous_token_head_through_its_keys():
    ckpt = load_checkpoint(trained_models()["induction"])
    cfg, params, tok = ckpt.cfg, ckpt.params, ckpt.tokenizer
    comp = composition_scores(params, cfg)
    l1h0, l0h2 = comp.heads.index("L1H0"), comp.heads.index("L0H2")
    assert int(np.nanargmax(comp.k[l1h0])) == l0h2  # L1H0's strongest K-composition is with L0H2
    assert comp.k[l1h0, l0h2] > comp.baseline + 10 * comp.baseline_std  # well above random matrices
    # One score: the second "w" (position 22) looking at what followed the first "w" (position 11). The
    # largest term pairs the query's own token with L0H2's output at the key: "the token before me was w".
    text = "mntyadvygiwlmntyadvygiw"
    _, cache = run_with_cache(params, cfg, np.array(tok.encode(text).ids))
    d = qk_decomposition(cache, 1, 0, 22, 11)
    assert abs(d.total - d.score) < 1e-4  # float32 weights
    assert d.top_pairs(1)[0][:2] == ("embed", "L0H2")
    # and both induction heads copy: the token they attend to is the one they raise
    assert ov_circuit(params, cfg, 1, 0, tok.encode("abc").ids).copying_score > 0.9
