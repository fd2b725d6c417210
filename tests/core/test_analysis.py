"""Invariants of the look-inside tools: decompositions sum up, lenses end at the output, caches agree."""

import numpy as np
import pytest

from core import TransformerConfig, init_params, kv_cache_bytes, run_with_cache, run_with_kv_cache
from core.analysis import (
    attention_rollout,
    detector_score,
    duplicate_token_keys,
    induction_keys,
    lens_points,
    previous_token_keys,
    repeated_random_tokens,
)


# The questions are asked of a run's ActivationCache (core/cache.py); these run the model first.
def residual_decomposition(params, cfg, tokens, token, pos=-1, ablate=None):
    return run_with_cache(params, cfg, tokens, ablate=ablate)[1].decompose_resid(token, pos)


def logit_lens(params, cfg, tokens, k=5, ablate=None):
    return run_with_cache(params, cfg, tokens, ablate=ablate, logits=False)[1].logit_lens(k)


def head_detector_scores(params, cfg, tokens, ablate=None):
    return run_with_cache(params, cfg, tokens, ablate=ablate, logits=False)[1].head_detector_scores()


POSITIONS = ["none", "sinusoidal", "learned", "rotary"]


def small(**changes):
    base = dict(d_model=16, n_heads=4, n_layers=3, d_vocab=23, n_ctx=16, d_mlp=32)
    return TransformerConfig(**(base | changes))


def random_params(cfg, seed=0, dtype=np.float64):
    """init_params gives zero biases and unit gains; perturb them so every term is really tested."""
    params = init_params(cfg, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)

    def perturb(tree):
        for key, value in tree.items() if isinstance(tree, dict) else enumerate(tree):
            if isinstance(value, np.ndarray):
                if value.ndim == 1:  # biases and gains
                    tree[key] = (value + 0.3 * rng.standard_normal(value.shape)).astype(dtype)
            else:
                perturb(value)

    perturb(params)
    return params


TOKENS = np.array([3, 7, 1, 7, 3, 9, 0, 7, 2])


# ------------------------------------------------------------------ residual decomposition


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize(
    "variant", [{}, {"bias": False}, {"normalization_type": "LNPre"}, {"tied_embeddings": False}, {"n_token_types": 2}]
)
def test_decomposition_sums_to_the_residual_and_to_the_logit(positions, variant):
    cfg = small(positional_embedding_type=positions, **variant)
    params = random_params(cfg)
    logits, cache = run_with_cache(params, cfg, TOKENS)
    for pos, token in ((-1, 5), (3, 0), (0, 22)):
        d = residual_decomposition(params, cfg, TOKENS, token=token, pos=pos)
        np.testing.assert_allclose(d.parts.sum(axis=0), cache["blocks.2.hook_resid_post"][pos], rtol=1e-10, atol=1e-12)
        assert d.logit == logits[pos, token]
        assert abs(d.direct_logit.sum() + d.logit_bias - d.logit) < 1e-5
        assert len(d.labels) == len(d.parts) == len(d.direct_logit)


def test_decomposition_names_every_part_once():
    cfg = small(n_layers=2, n_heads=2)
    d = residual_decomposition(random_params(cfg), cfg, TOKENS, token=1)
    assert d.labels == [
        "embed",
        "pos_embed",
        "L0H0",
        "L0H1",
        "L0 attn bias",
        "L0 mlp",
        "L0 mlp bias",
        "L1H0",
        "L1H1",
        "L1 attn bias",
        "L1 mlp",
        "L1 mlp bias",
    ]


def test_decomposition_of_a_float32_model_sums_to_its_logit():
    cfg = small(positional_embedding_type="rotary")
    params = random_params(cfg, dtype=np.float32)
    d = residual_decomposition(params, cfg, TOKENS, token=4)
    assert abs(d.direct_logit.sum() + d.logit_bias - d.logit) < 1e-5


def test_each_head_part_is_that_heads_share_of_attn_out():
    cfg = small()
    params = random_params(cfg)
    _, cache = run_with_cache(params, cfg, TOKENS)
    d = residual_decomposition(params, cfg, TOKENS, token=0, pos=4)
    layer1 = [i for i, name in enumerate(d.labels) if name.startswith("L1H") or name == "L1 attn bias"]
    np.testing.assert_allclose(d.parts[layer1].sum(axis=0), cache["blocks.1.hook_attn_out"][4], rtol=1e-10, atol=1e-12)
    ablated = residual_decomposition(params, cfg, TOKENS, token=0, pos=4, ablate={(1, 2): "zero"})
    assert np.all(ablated.parts[ablated.labels.index("L1H2")] == 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"token": 23}, "vocabulary"),
        ({"token": 0, "pos": 9}, "position"),
        ({"token": 0, "pos": -10}, "position"),
    ],
)
def test_decomposition_rejects_out_of_range_choices(kwargs, message):
    cfg = small()
    with pytest.raises(ValueError, match=message):
        residual_decomposition(init_params(cfg), cfg, TOKENS, **kwargs)


def test_decomposition_explains_why_post_norm_models_are_not_supported():
    cfg = small(block_type="post_norm")
    with pytest.raises(ValueError, match="pre-norm"):
        residual_decomposition(init_params(cfg), cfg, TOKENS, token=0)


# ------------------------------------------------------------------ logit lens


@pytest.mark.parametrize("positions", POSITIONS)
def test_the_last_lens_point_is_the_models_prediction(positions):
    cfg = small(positional_embedding_type=positions, tied_embeddings=False)
    params = random_params(cfg)
    logits, _ = run_with_cache(params, cfg, TOKENS)
    lens = logit_lens(params, cfg, TOKENS, k=4)
    assert lens.points[-1] == "blocks.2.hook_resid_post"
    assert lens.top_tokens.shape == lens.top_probs.shape == (len(lens_points(cfg)), len(TOKENS), 4)
    np.testing.assert_array_equal(lens.top_tokens[-1, :, 0], logits.argmax(axis=-1))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(lens.top_probs[-1], np.take_along_axis(probs, lens.top_tokens[-1], -1), rtol=1e-10)


def test_lens_points_and_top_k_order():
    cfg = small(n_layers=2)
    assert lens_points(cfg) == [
        "blocks.0.hook_resid_pre",
        "blocks.0.hook_resid_mid",
        "blocks.1.hook_resid_pre",
        "blocks.1.hook_resid_mid",
        "blocks.1.hook_resid_post",
    ]
    lens = logit_lens(random_params(cfg), cfg, TOKENS, k=23)
    assert np.all(np.diff(lens.top_probs, axis=-1) <= 0)  # most probable first
    np.testing.assert_allclose(lens.top_probs.sum(axis=-1), 1.0, rtol=1e-12)  # k = d_vocab: all of it
    with pytest.raises(ValueError, match="k=0"):
        logit_lens(random_params(cfg), cfg, TOKENS, k=0)


def test_the_first_lens_point_reads_only_the_embedding():
    """Before any block, the lens is the embedding decoded directly: no other token matters."""
    cfg = small(positional_embedding_type="none")
    params = random_params(cfg)
    a = logit_lens(params, cfg, TOKENS)
    b = logit_lens(params, cfg, np.array([5, 5, 5, 5, 5, 5, 5, 5, 2]))
    np.testing.assert_array_equal(a.top_tokens[0, -1], b.top_tokens[0, -1])
    assert not np.array_equal(a.top_probs[-1, -1], b.top_probs[-1, -1])


# ------------------------------------------------------------------ head ablation


@pytest.mark.parametrize("how", ["zero", "mean"])
@pytest.mark.parametrize("layer, head", [(0, 0), (1, 3), (2, 1)])
def test_ablating_a_head_changes_nothing_upstream(how, layer, head):
    cfg = small()
    params = random_params(cfg)
    logits, clean = run_with_cache(params, cfg, TOKENS)
    ablated_logits, ablated = run_with_cache(params, cfg, TOKENS, ablate={(layer, head): how})
    upstream = [
        n
        for n in clean
        if n.startswith(tuple(f"blocks.{earlier}." for earlier in range(layer))) or not n.startswith("blocks.")
    ]
    upstream.remove("ln_final.hook_normalized")
    same_layer = [
        f"blocks.{layer}.{n}"
        for n in (
            "hook_resid_pre",
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_v",
            "attn.hook_attn_scores",
            "attn.hook_pattern",
        )
    ]
    for name in upstream + same_layer:
        np.testing.assert_array_equal(ablated[name], clean[name], err_msg=name)
    z, z_clean = ablated[f"blocks.{layer}.attn.hook_z"], clean[f"blocks.{layer}.attn.hook_z"]
    others = [h for h in range(cfg.n_heads) if h != head]
    np.testing.assert_array_equal(z[:, others], z_clean[:, others])
    expected = 0.0 if how == "zero" else z_clean[:, head].mean(axis=0)
    np.testing.assert_array_equal(z[:, head], np.broadcast_to(expected, z[:, head].shape))
    assert not np.allclose(ablated_logits, logits)  # and downstream it does change
    if layer < cfg.n_layers - 1:
        assert not np.allclose(
            ablated[f"blocks.{layer + 1}.attn.hook_pattern"], clean[f"blocks.{layer + 1}.attn.hook_pattern"]
        )


@pytest.mark.parametrize("ablate", [None, {}])
def test_ablating_nothing_changes_nothing(ablate):
    cfg = small()
    params = random_params(cfg)
    logits, clean = run_with_cache(params, cfg, TOKENS)
    again, cache = run_with_cache(params, cfg, TOKENS, ablate=ablate)
    np.testing.assert_array_equal(again, logits)
    assert list(cache) == list(clean)
    for name in clean:
        np.testing.assert_array_equal(cache[name], clean[name])


def test_ablating_a_head_that_does_not_exist_is_refused():
    cfg = small()
    with pytest.raises(ValueError, match="layers of 4 heads"):
        run_with_cache(init_params(cfg), cfg, TOKENS, ablate={(0, 4): "zero"})


# ------------------------------------------------------------------ head detectors


def test_detector_keys_on_a_repeated_sequence():
    tokens = np.array([4, 8, 2, 4, 8, 2])  # A B C A B C
    prev, dup, ind = previous_token_keys(tokens), duplicate_token_keys(tokens), induction_keys(tokens)
    assert [tuple(np.flatnonzero(row)) for row in prev] == [(), (0,), (1,), (2,), (3,), (4,)]
    assert [tuple(np.flatnonzero(row)) for row in dup] == [(), (), (), (0,), (1,), (2,)]
    # the second A looks at what followed the first A (B, position 1), and so on
    assert [tuple(np.flatnonzero(row)) for row in ind] == [(), (), (), (1,), (2,), (3,)]


def test_detector_scores_on_hand_made_patterns():
    n = 6
    tokens = np.array([4, 8, 2, 4, 8, 2])
    previous = np.eye(n, k=-1)
    previous[0, 0] = 1.0  # the first query has nowhere else to look
    uniform_causal = np.tri(n) / np.arange(1, n + 1)[:, None]
    induction = np.zeros((n, n))
    induction[np.arange(n), [0, 0, 1, 1, 2, 3]] = 1.0  # rows 3 and 4 on their induction keys
    patterns = np.stack([previous, uniform_causal, induction])  # [3 heads, pos, pos]
    prev = detector_score(patterns, previous_token_keys(tokens))
    assert prev[0] == 1.0
    np.testing.assert_allclose(prev[1], np.mean(1 / np.arange(2, n + 1)))  # query i gives 1/(i+1) to i-1
    ind = detector_score(patterns, induction_keys(tokens))
    assert ind[2] == 1.0 and ind[0] == 0.0
    assert np.isnan(detector_score(patterns, duplicate_token_keys(np.arange(n)))).all()  # nothing repeats


def previous_token_model(n_ctx=8):
    """One head that attends to the previous token: learned one-hot positions, W_K shifted by one.

    Position i embeds as e_i; after layer norm the query of i is c·(e_i - u)/σ and the key of j
    is c·(e_{j+1} - S u)/σ, so q_i·k_j = big·[j = i - 1] + something independent of j.
    """
    d = n_ctx
    cfg = TransformerConfig(
        d_model=d, n_heads=1, n_layers=1, d_vocab=5, n_ctx=n_ctx, d_mlp=4, normalization_type="LNPre", bias=False
    )
    params = init_params(cfg)
    params["embed"]["W_E"][:] = 0.0  # only positions matter
    params["pos_embed"]["W_pos"][:] = np.eye(d)
    shift = np.eye(d, k=1)  # e_j -> e_{j+1}
    params["blocks"][0]["attn"]["W_QKV"][:] = np.concatenate([10 * np.eye(d), 10 * shift, np.eye(d)], axis=1)
    return cfg, params


def test_a_head_built_to_attend_to_the_previous_token_scores_1():
    cfg, params = previous_token_model()
    tokens = np.array([1, 3, 0, 1, 4, 2, 3, 0])  # repeats, but never of the token just before
    scores = head_detector_scores(params, cfg, tokens)
    assert scores["previous_token"].shape == (1, 1)
    np.testing.assert_allclose(scores["previous_token"], [[1.0]], rtol=0, atol=1e-9)
    np.testing.assert_allclose(scores["duplicate_token"], [[0.0]], rtol=0, atol=1e-9)


def test_head_detector_scores_cover_every_head():
    cfg = small()
    tokens = repeated_random_tokens(cfg.d_vocab, 6, seed=3)
    scores = head_detector_scores(random_params(cfg), cfg, tokens)
    assert set(scores) == {"previous_token", "duplicate_token", "induction"}
    for value in scores.values():
        assert value.shape == (cfg.n_layers, cfg.n_heads)
        assert np.all((value >= 0) & (value <= 1 + 1e-12))


def test_repeated_random_tokens():
    t = repeated_random_tokens(50, 7, n_repeats=3, seed=1)
    assert t.shape == (21,) and t.min() >= 0 and t.max() < 50
    np.testing.assert_array_equal(t[:7], t[7:14])
    np.testing.assert_array_equal(t[:7], t[14:])
    assert not np.array_equal(repeated_random_tokens(50, 7, seed=1), repeated_random_tokens(50, 7, seed=2))
    with pytest.raises(ValueError, match="length"):
        repeated_random_tokens(50, 0)


# ------------------------------------------------------------------ KV cache, stepped


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("block_type", ["pre_norm", "post_norm"])
def test_cached_steps_equal_the_full_recomputation(positions, block_type):
    cfg = small(positional_embedding_type=positions, block_type=block_type, tied_embeddings=False)
    params = random_params(cfg)
    run = run_with_kv_cache(params, cfg, TOKENS[:5], n_new=4)
    assert len(run.steps) == len(run.tokens) == 9
    logits, cache = run_with_cache(params, cfg, run.tokens)
    for step in run.steps:
        np.testing.assert_allclose(step.logits, logits[step.pos], rtol=0, atol=1e-10)
        assert step.k_shape == (cfg.n_heads, step.pos + 1, cfg.d_head)
    # the generated tokens are the full model's greedy choices
    np.testing.assert_array_equal(run.tokens[5:], logits[4:8].argmax(axis=-1))
    assert [s.generated for s in run.steps] == [False] * 5 + [True] * 4
    k_name = "attn.hook_rot_k" if positions == "rotary" else "attn.hook_k"
    for layer in range(cfg.n_layers):
        np.testing.assert_allclose(run.kv.keys[layer], cache[f"blocks.{layer}.{k_name}"].swapaxes(0, 1), atol=1e-12)
        np.testing.assert_allclose(
            run.kv.values[layer], cache[f"blocks.{layer}.attn.hook_v"].swapaxes(0, 1), atol=1e-12
        )


def test_cached_steps_honour_the_attention_settings():
    cfg = small(attn_temperature=1.7, use_attn_scale=False, d_head=6, positional_embedding_type="rotary")
    params = random_params(cfg)
    run = run_with_kv_cache(params, cfg, TOKENS)
    logits, _ = run_with_cache(params, cfg, TOKENS)
    np.testing.assert_allclose(np.stack([s.logits for s in run.steps]), logits, rtol=0, atol=1e-10)


def test_cache_bytes_grow_by_one_row_per_step_and_match_the_formula():
    cfg = small()
    run = run_with_kv_cache(random_params(cfg, dtype=np.float32), cfg, TOKENS[:6])
    for step in run.steps:
        assert step.cache_bytes == kv_cache_bytes(cfg, step.pos + 1, 1, "float32").bytes
        assert step.logits.dtype == np.float32
    growth = np.diff([s.cache_bytes for s in run.steps])
    assert np.all(growth == 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * 4)


@pytest.mark.parametrize(
    "cfg_changes, kwargs, message",
    [
        ({"attention_dir": "bidirectional"}, {}, "causal"),
        ({}, {"n_new": 8}, "n_ctx"),
        ({}, {"n_new": -1}, "n_new"),
    ],
)
def test_kv_cache_refuses_what_it_cannot_do(cfg_changes, kwargs, message):
    cfg = small(**cfg_changes)
    with pytest.raises(ValueError, match=message):
        run_with_kv_cache(init_params(cfg), cfg, TOKENS, **kwargs)


# ------------------------------------------------------------------ attention rollout


def test_rollout_of_a_hand_checked_2_layer_case():
    layer0 = np.array(
        [
            [[1.0, 0.0], [1.0, 0.0]],  # head 0: everyone looks at token 0
            [[1.0, 0.0], [0.0, 1.0]],
        ]
    )  # head 1: everyone looks at itself
    layer1 = np.array([[[1.0, 0.0], [1.0, 0.0]]] * 2)
    rollout = attention_rollout(np.stack([layer0, layer1]))
    # layer 0: heads average to [[1, 0], [.5, .5]]; (A + I) / 2 = [[1, 0], [.25, .75]]
    np.testing.assert_allclose(rollout[0], [[1.0, 0.0], [0.25, 0.75]])
    # layer 1: (A + I) / 2 = [[1, 0], [.5, .5]]; times layer 0 = [[1, 0], [.5 + .125, .375]]
    np.testing.assert_allclose(rollout[1], [[1.0, 0.0], [0.625, 0.375]])


@pytest.mark.parametrize("attention_dir", ["causal", "bidirectional"])
def test_rollout_rows_sum_to_1(attention_dir):
    cfg = small(attention_dir=attention_dir)
    _, cache = run_with_cache(random_params(cfg), cfg, TOKENS)
    rollout = attention_rollout(cache.stack_activation("attn.hook_pattern"))
    assert rollout.shape == (cfg.n_layers, len(TOKENS), len(TOKENS))
    assert np.all(rollout >= 0)
    np.testing.assert_allclose(rollout.sum(axis=-1), 1.0, rtol=1e-12)
    if attention_dir == "causal":  # information never flows backwards
        assert np.all(np.triu(rollout, k=1) == 0)


def test_rollout_rejects_a_pattern_of_the_wrong_shape():
    with pytest.raises(ValueError, match="n_layers"):
        attention_rollout(np.ones((2, 3, 3)))


def test_top_k_ids_are_a_full_stable_sorts_first_k_ties_included():
    """The logit lens's top k without sorting the vocabulary: the same ids, in the same order, as a full
    stable argsort (the lower id first among equal probabilities), including ties at the k-th place."""
    from core.cache import top_k_ids

    rng = np.random.default_rng(0)
    for _ in range(300):
        V = int(rng.integers(1, 40))
        k, n = int(rng.integers(1, V + 1)), int(rng.integers(1, 5))
        probs = rng.integers(0, 4, size=(n, V)).astype(float)  # few values: many ties
        np.testing.assert_array_equal(top_k_ids(probs, k), np.argsort(-probs, axis=-1, kind="stable")[:, :k])
