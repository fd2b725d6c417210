"""Integration: the whole forward pass — cache names, permutation symmetry, dtypes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import InputError, TransformerConfig, hook_names, hook_shape, init_params, run_with_cache

bounded = settings(max_examples=20, deadline=None)


def test_cache_holds_exactly_these_names_for_a_2_layer_default_model():
    cfg = TransformerConfig(n_layers=2)
    _, cache = run_with_cache(init_params(cfg), cfg, np.array([1, 2, 3]))
    assert list(cache) == [
        "hook_embed",
        "hook_pos_embed",
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_q",
        "blocks.0.attn.hook_k",
        "blocks.0.attn.hook_v",
        "blocks.0.attn.hook_attn_scores",
        "blocks.0.attn.hook_pattern",
        "blocks.0.attn.hook_z",
        "blocks.0.hook_attn_out",
        "blocks.0.hook_resid_mid",
        "blocks.0.mlp.hook_pre",
        "blocks.0.mlp.hook_post",
        "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_pre",
        "blocks.1.attn.hook_q",
        "blocks.1.attn.hook_k",
        "blocks.1.attn.hook_v",
        "blocks.1.attn.hook_attn_scores",
        "blocks.1.attn.hook_pattern",
        "blocks.1.attn.hook_z",
        "blocks.1.hook_attn_out",
        "blocks.1.hook_resid_mid",
        "blocks.1.mlp.hook_pre",
        "blocks.1.mlp.hook_post",
        "blocks.1.hook_mlp_out",
        "blocks.1.hook_resid_post",
        "ln_final.hook_normalized",
    ]
    assert list(cache) == hook_names(cfg)


@pytest.mark.parametrize("positions", ["none", "sinusoidal", "learned", "rotary"])
@pytest.mark.parametrize("block_type", ["pre_norm", "post_norm"])
def test_every_cached_activation_has_its_declared_shape(positions, block_type):
    cfg = TransformerConfig(
        d_model=12,
        n_heads=3,
        n_layers=2,
        d_vocab=10,
        n_ctx=8,
        d_mlp=20,
        positional_embedding_type=positions,
        block_type=block_type,
    )
    pos = 5
    logits, cache = run_with_cache(init_params(cfg), cfg, np.arange(pos))
    assert list(cache) == hook_names(cfg)
    sizes = {"pos": pos, "query_pos": pos, "key_pos": pos, "head_index": 3, "d_head": 4, "d_model": 12, "d_mlp": 20}
    for name, value in cache.items():
        axes = hook_shape(name).strip("[]").split(", ")
        assert value.shape == tuple(sizes[a] for a in axes), name
    assert logits.shape == (pos, 10)


@st.composite
def permutation_case(draw):
    n_heads = draw(st.integers(1, 3))
    cfg = TransformerConfig(
        d_model=n_heads * draw(st.integers(1, 4)),
        n_heads=n_heads,
        n_layers=draw(st.integers(1, 3)),
        d_vocab=draw(st.integers(2, 12)),
        d_mlp=draw(st.integers(1, 16)),
        positional_embedding_type="none",
        attention_dir="bidirectional",
        block_type=draw(st.sampled_from(["pre_norm", "post_norm"])),
        act_fn=draw(st.sampled_from(["gelu_new", "gelu", "relu"])),
        bias=draw(st.booleans()),
    )
    n = draw(st.integers(2, 8))
    tokens = np.array(draw(st.lists(st.integers(0, cfg.d_vocab - 1), min_size=n, max_size=n)))
    perm = np.array(draw(st.permutations(range(n))))
    return cfg, tokens, perm, draw(st.integers(0, 1000))


@bounded
@given(permutation_case())
def test_without_positions_permuting_the_tokens_permutes_the_model_output(case):
    """With no positions and no mask, a Transformer sees a set: position i's output depends on
    token i and on the others only as a bag."""
    cfg, tokens, perm, seed = case
    params = init_params(cfg, seed=seed)
    logits, cache = run_with_cache(params, cfg, tokens)
    permuted_logits, permuted_cache = run_with_cache(params, cfg, tokens[perm])
    np.testing.assert_allclose(permuted_logits, logits[perm], rtol=1e-9, atol=1e-9)
    # and each pattern is permuted along both its query and key axes
    last = f"blocks.{cfg.n_layers - 1}.attn.hook_pattern"
    np.testing.assert_allclose(permuted_cache[last], cache[last][:, perm][:, :, perm], rtol=1e-9, atol=1e-12)


def test_with_positions_permuting_the_tokens_does_change_the_output():
    """The control for the test above: positions break the symmetry."""
    cfg = TransformerConfig(
        d_model=8,
        n_heads=2,
        n_layers=1,
        d_vocab=6,
        n_ctx=6,
        attention_dir="bidirectional",
        positional_embedding_type="learned",
    )
    params, tokens, perm = init_params(cfg), np.array([0, 1, 2, 3]), np.array([3, 2, 1, 0])
    a, _ = run_with_cache(params, cfg, tokens)
    b, _ = run_with_cache(params, cfg, tokens[perm])
    assert not np.allclose(b, a[perm])


@pytest.mark.parametrize("positions", ["none", "sinusoidal", "learned", "rotary"])
@pytest.mark.parametrize("act_fn", ["gelu_new", "gelu", "relu"])
@pytest.mark.parametrize("block_type", ["pre_norm", "post_norm"])
def test_float32_in_gives_float32_out_through_the_whole_forward_pass(positions, act_fn, block_type):
    cfg = TransformerConfig(
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_vocab=11,
        n_ctx=8,
        n_token_types=2,
        positional_embedding_type=positions,
        act_fn=act_fn,
        block_type=block_type,
        tied_embeddings=False,
    )
    params = init_params(cfg, dtype=np.float32)
    logits, cache = run_with_cache(params, cfg, np.arange(6), ablate={(1, 0): "mean"})
    promoted = {name: v.dtype for name, v in cache.items() if v.dtype != np.float32}
    assert promoted == {}
    assert logits.dtype == np.float32


@pytest.mark.parametrize(
    "tokens, message",
    [
        (np.array([], dtype=int), "non-empty 1-D"),
        (np.array([[1, 2]]), "non-empty 1-D"),
        (np.array([0.5, 1.0]), "must be integers"),
        (np.array([0, 99]), r"must lie in \[0, 5\)"),
        (np.arange(9) % 5, "longer than the model's context"),  # longer than n_ctx with learned positions
    ],
)
def test_bad_tokens_are_rejected_with_a_message(tokens, message):
    """Bad input is an InputError (the app's 422), never a bare ValueError or TypeError (a 500)."""
    cfg = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_vocab=5, n_ctx=8)
    with pytest.raises(InputError, match=message):
        run_with_cache(init_params(cfg), cfg, tokens)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_stop_at_layer_makes_the_same_activations_as_the_whole_pass_and_runs_only_those_blocks(positions):
    """forward's stop_at_layer (what an SAE on an early layer's hook runs, app/service/features.py): every hook of
    the blocks it runs equals the whole pass's (the same operations on the same numbers); the blocks after it
    and the final norm are not run; layers_needed names how many blocks a set of hooks needs."""
    from core.hooks import layers_needed
    from core.params import forward_work

    cfg = TransformerConfig(
        d_model=16, n_layers=3, n_heads=2, d_vocab=11, n_ctx=12, positional_embedding_type=positions
    )
    params = init_params(cfg, 3)
    ids = np.arange(9) % 11
    _logits, whole = run_with_cache(params, cfg, ids, logits=False)
    for stop in range(cfg.n_layers + 1):
        _none, part = run_with_cache(params, cfg, ids, logits=False, stop_at_layer=stop)
        ran = [
            n
            for n in hook_names(cfg)
            if not n.startswith(("blocks.", "ln_final")) or (n.startswith("blocks.") and int(n.split(".")[1]) < stop)
        ]
        if stop < cfg.n_layers:
            ran.append(f"blocks.{stop}.hook_resid_pre")  # the stream it stops on, entering the next block
        assert sorted(part.keys()) == sorted(ran)
        for name in ran:
            np.testing.assert_array_equal(part[name], whole[name])
        assert len(part.past_kv.keys) == stop
        assert forward_work(cfg, 9, stop_at_layer=stop) < forward_work(cfg, 9, logits=False) or stop == cfg.n_layers
    assert layers_needed(["hook_embed"], cfg) == layers_needed(["blocks.0.hook_resid_pre"], cfg) == 0
    assert layers_needed(["blocks.2.hook_resid_pre"], cfg) == 2
    assert layers_needed(["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"], cfg) == 2
    assert layers_needed(["ln_final.hook_normalized"], cfg) == cfg.n_layers
    with pytest.raises(ValueError, match="stop_at_layer"):
        run_with_cache(params, cfg, ids, logits=True, stop_at_layer=1)
    with pytest.raises(ValueError, match="stop_at_layer"):
        run_with_cache(params, cfg, ids, logits=False, stop_at_layer=4)
