"""The backward pass against central finite differences (float64), and the batched forward against core.model.

Every parameter's gradient from core.backprop is compared with (L(θ + h) − L(θ − h)) / 2h, element by
element, over random small decoders drawn by hypothesis from every switch core.backprop.TRAINABLE says
training supports: layers, heads, widths, attention-only or not, parallel blocks, the norms and
activations it has backward passes for, tied/untied, every position scheme (rotary with any base,
rotated width and pair layout), each bias switch on its own, temperature and scale, causal,
bidirectional or local attention. The error is measured per parameter array as
‖analytic − numeric‖ / ‖numeric‖. Configurations outside TRAINABLE are refused, saying what to change.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core import TransformerConfig, backprop, init_params, run_with_cache
from core.errors import InputError
from core.functional import (
    ACTIVATION_BACKWARDS,
    ACTIVATIONS,
    cross_entropy,
    cross_entropy_backward,
    gelu,
    gelu_backward,
    gelu_new,
    gelu_new_backward,
    layer_norm,
    layer_norm_backward,
    relu,
    relu_backward,
    rms_norm,
    rms_norm_backward,
    silu,
    silu_backward,
    softmax,
    softmax_backward,
)
from core.model import iter_arrays
from core.positions import apply_rotary, apply_rotary_backward

REL_TOL = 1e-6
H = 1e-5  # central differences: truncation ~h², rounding ~1e-16/h, both far below REL_TOL here


@st.composite
def decoder_fields(draw) -> dict:
    """TransformerConfig keyword arguments of a small model: every field TRAINABLE calls ANY, drawn (decoders
    of every family's switches, and post-norm encoders with segment embeddings)."""
    n_heads = draw(st.sampled_from([1, 2, 4]))
    n_key_value_heads = draw(st.sampled_from([d for d in (1, 2, 4) if n_heads % d == 0]))
    d_head = draw(st.sampled_from([2] if n_heads == 4 else [2, 4]))  # at most 8 wide: every element is differenced
    if n_heads * d_head < 4:  # a layer norm over 2 numbers outputs ±1 whatever its input: no gradient to check
        d_head = 4
    n_layers = draw(st.integers(1, 2))
    post_norm = draw(st.integers(0, 2)) == 0  # a third post-norm (BERT's blocks), which cannot be parallel
    parallel = not post_norm and draw(st.booleans())
    attention_dir = draw(st.sampled_from(["causal", "bidirectional"]))
    local = attention_dir == "causal" and draw(st.booleans())  # local layers need causal attention
    return dict(
        d_model=n_heads * d_head + draw(st.sampled_from([0, 2])),  # W_O need not map back from d_model columns
        n_heads=n_heads,
        d_head=d_head,
        n_layers=n_layers,
        d_vocab=draw(st.integers(3, 6)),
        n_ctx=5,
        d_mlp=draw(st.integers(2, 6)),
        attn_only=draw(st.booleans()),
        parallel_attn_mlp=parallel,
        normalization_type=draw(st.sampled_from(["LN", "LNPre", "RMS", "RMSPre"])),
        act_fn=draw(st.sampled_from(sorted(ACTIVATIONS))),
        n_key_value_heads=n_key_value_heads,
        gated_mlp=draw(st.booleans()),
        use_qk_norm=draw(st.booleans()),
        block_type="post_norm" if post_norm else "pre_norm",
        n_token_types=draw(st.sampled_from([0, 0, 2])),
        eps=draw(st.sampled_from([1e-5, 1e-3])),
        tied_embeddings=draw(st.booleans()),
        positional_embedding_type=draw(st.sampled_from(["learned", "sinusoidal", "rotary", "none"])),
        rotary_dim=draw(st.sampled_from([None, 2])),
        rotary_base=draw(st.sampled_from([10000.0, 500.0, 3.0])),
        rotary_adjacent_pairs=draw(st.booleans()),
        attention_dir=attention_dir,
        use_attn_scale=draw(st.booleans()),
        attn_temperature=draw(st.sampled_from([1.0, 0.7, 2.0])),
        window_size=draw(st.integers(1, 3)) if local else None,
        attn_types=("local", "global")[:n_layers] if local else None,
        bias=draw(st.booleans()),  # and each switch on its own: None follows `bias`
        **{
            name: draw(st.sampled_from([None, True, False]))
            for name in ("qkv_bias", "attn_out_bias", "mlp_bias", "unembed_bias")
        },
    )


@st.composite
def small_decoders(draw):
    cfg = TransformerConfig(**draw(decoder_fields()))
    return cfg, draw(st.integers(0, 2**31)), draw(st.integers(1, 2)), draw(st.integers(2, 4))


# The two configurations the hand-written guard let through wrong: rotary positions with a base of
# 500 (the training forward rotated with 10,000), and Q, K, V biases without W_O's (the backward
# looked for b_O's gradient whenever b_QKV existed).
ROTARY_BASE_500 = TransformerConfig(
    d_model=8, n_heads=2, n_layers=2, d_vocab=5, n_ctx=5, d_mlp=4, positional_embedding_type="rotary", rotary_base=500.0
)
QKV_BIAS_ONLY = TransformerConfig(
    d_model=8, n_heads=2, n_layers=1, d_vocab=5, n_ctx=5, d_mlp=4, qkv_bias=True, attn_out_bias=False
)


def random_model(cfg: TransformerConfig, seed: int):
    """init_params, then every array (gains and biases too) moved off its initial value, so each term matters."""
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed)
    for _, a in iter_arrays(params):
        a += rng.normal(0.0, 0.3, a.shape)
    return params, rng


def get(tree, name: str):
    for key in name.split("."):
        tree = tree[int(key)] if key.isdigit() else tree[key]
    return tree


def numeric_grad(f, a: np.ndarray) -> np.ndarray:
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + H
        plus = f()
        a[i] = old - H
        minus = f()
        a[i] = old
        g[i] = (plus - minus) / (2 * H)
    return g


def relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """‖analytic − numeric‖ / ‖numeric‖, the scale floored at 1e-4: a gradient that is truly 0 (a query norm's
    gain where each query sees one key, a window of 1) differences to rounding noise, ~1e-16 / H = 1e-11."""
    return float(np.linalg.norm(analytic - numeric) / max(np.linalg.norm(numeric), 1e-4))


@settings(max_examples=25, deadline=None)
@given(small_decoders())
@example((ROTARY_BASE_500, 0, 2, 4))
@example((QKV_BIAS_ONLY, 1, 2, 4))
@example(
    (
        QKV_BIAS_ONLY.replace(
            qkv_bias=False, attn_out_bias=True, mlp_bias=False, unembed_bias=True, tied_embeddings=False
        ),
        2,
        2,
        4,
    )
)
@example((ROTARY_BASE_500.replace(rotary_dim=2, rotary_adjacent_pairs=False, parallel_attn_mlp=True), 3, 2, 4))
def test_every_parameter_gradient_matches_finite_differences(case):
    cfg, seed, batch, n_pos = case
    params, rng = random_model(cfg, seed)
    tokens = rng.integers(0, cfg.d_vocab, (batch, n_pos))
    targets = rng.integers(0, cfg.d_vocab, (batch, n_pos))
    loss, grads = backprop.loss_and_grads(params, cfg, tokens, targets)
    names = [name for name, _ in iter_arrays(params)]
    assert sorted(name for name, _ in iter_arrays(grads)) == sorted(names)  # one gradient per parameter
    for name, a in iter_arrays(params):
        numeric = numeric_grad(lambda: backprop.loss(params, cfg, tokens, targets), a)
        assert get(grads, name).shape == a.shape
        assert relative_error(get(grads, name), numeric) <= REL_TOL, name


@settings(max_examples=40, deadline=None)
@given(small_decoders())
@example((ROTARY_BASE_500, 0, 2, 4))
@example((QKV_BIAS_ONLY, 1, 2, 4))
def test_batched_forward_gives_run_with_cache_logits_sequence_by_sequence(case):
    cfg, seed, batch, n_pos = case
    params, rng = random_model(cfg, seed)
    tokens = rng.integers(0, cfg.d_vocab, (batch + 1, n_pos))
    logits, _ = backprop.forward(params, cfg, tokens)
    for row, seq in zip(logits, tokens):
        np.testing.assert_allclose(row, run_with_cache(params, cfg, seq)[0], rtol=1e-12, atol=1e-12)


def test_float32_in_float32_out():
    cfg = TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_vocab=5, n_ctx=4, d_mlp=8)
    params = init_params(cfg, 0, dtype=np.float32)
    tokens = np.array([[0, 1, 2], [3, 4, 0]])
    _, grads = backprop.loss_and_grads(params, cfg, tokens, tokens)
    assert {a.dtype for _, a in iter_arrays(grads)} == {np.dtype(np.float32)}


# ------------------------------------------------------------------ primitives on their own


def _check_primitive(forward, backward, x, rng):
    """dL/dx of L = Σ dy · forward(x) for a random dy, against finite differences."""
    dy = rng.standard_normal(forward(x).shape)
    numeric = numeric_grad(lambda: float(np.sum(dy * forward(x))), x)
    assert relative_error(backward(dy, x), numeric) <= REL_TOL


def test_every_activation_has_its_backward_pass():
    assert set(ACTIVATION_BACKWARDS) == set(ACTIVATIONS)


@pytest.mark.parametrize(
    "act, act_backward",
    [(gelu_new, gelu_new_backward), (gelu, gelu_backward), (relu, relu_backward), (silu, silu_backward)],
)
@pytest.mark.parametrize("given_output", [True, False])
def test_activation_backward(act, act_backward, given_output):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7)) * 2
    if act is not relu:  # (ReLU has its kink there: no derivative to compare)
        x[0, 0] = 0.0  # gelu_new_backward recovers tanh from y / x: x = 0 is its special case
    backward = (lambda dy, x: act_backward(dy, x, act(x))) if given_output else act_backward
    _check_primitive(act, backward, x, rng)


def test_softmax_backward():
    rng = np.random.default_rng(1)
    _check_primitive(softmax, lambda dy, x: softmax_backward(dy, softmax(x)), rng.standard_normal((2, 3, 5)), rng)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_for_input_gain_and_bias(affine):
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 3, 6)), rng.standard_normal(6), rng.standard_normal(6)
    dy = rng.standard_normal(x.shape)
    ln = (lambda: layer_norm(x, w, b)) if affine else (lambda: layer_norm(x))
    dx, dw, db = layer_norm_backward(dy, x, w if affine else None)
    assert relative_error(dx, numeric_grad(lambda: float(np.sum(dy * ln())), x)) <= REL_TOL
    if affine:
        assert relative_error(dw, numeric_grad(lambda: float(np.sum(dy * ln())), w)) <= REL_TOL
        assert relative_error(db, numeric_grad(lambda: float(np.sum(dy * ln())), b)) <= REL_TOL
    else:
        assert dw is None and db is None


@pytest.mark.parametrize("gain", [True, False])
def test_rms_norm_backward_for_input_and_gain(gain):
    rng = np.random.default_rng(12)
    x, w = rng.standard_normal((2, 3, 6)), rng.standard_normal(6)
    dy = rng.standard_normal(x.shape)
    f = (lambda: rms_norm(x, w, 1e-3)) if gain else (lambda: rms_norm(x, eps=1e-3))
    dx, dw = rms_norm_backward(dy, x, w if gain else None, 1e-3)
    assert relative_error(dx, numeric_grad(lambda: float(np.sum(dy * f())), x)) <= REL_TOL
    if gain:
        assert relative_error(dw, numeric_grad(lambda: float(np.sum(dy * f())), w)) <= REL_TOL
    else:
        assert dw is None


def test_rotary_backward_is_the_inverse_rotation():
    rng = np.random.default_rng(3)
    _check_primitive(apply_rotary, lambda dy, x: apply_rotary_backward(dy), rng.standard_normal((2, 5, 6)), rng)


@pytest.mark.parametrize("base", [10000.0, 500.0])
@pytest.mark.parametrize("rotary_dim", [2, 6])
@pytest.mark.parametrize("adjacent_pairs", [True, False])
def test_training_rotary_backward_for_each_base_width_and_layout(base, rotary_dim, adjacent_pairs):
    cfg = TransformerConfig(
        d_model=12,
        n_heads=2,
        positional_embedding_type="rotary",
        rotary_base=base,
        rotary_dim=rotary_dim,
        rotary_adjacent_pairs=adjacent_pairs,
    )
    rng = np.random.default_rng(6)
    _check_primitive(
        lambda x: backprop.rotate(x, cfg),
        lambda dy, x: backprop.rotate(dy, cfg, sign=-1),
        rng.standard_normal((2, 2, 5, 6)),
        rng,
    )


def test_training_rotary_at_the_defaults_is_apply_rotary_bit_for_bit():
    """Models trained with rotary positions before the switches were honoured retrain to the same bits."""
    cfg = TransformerConfig(d_model=12, n_heads=2, positional_embedding_type="rotary")
    x = np.random.default_rng(7).standard_normal((2, 2, 9, 6)).astype(np.float32)
    assert backprop.rotate(x, cfg).tobytes() == apply_rotary(x).tobytes()
    assert backprop.rotate(x, cfg, sign=-1).tobytes() == apply_rotary_backward(x).tobytes()


def test_cross_entropy_value_and_gradient():
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((2, 3, 5)) * 3, rng.integers(0, 5, (2, 3))
    loss, probs = cross_entropy(logits, targets)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # the textbook formula, naively
    assert loss == pytest.approx(-np.mean(np.log(np.take_along_axis(p, targets[..., None], -1))), rel=1e-12)
    numeric = numeric_grad(lambda: cross_entropy(logits, targets)[0], logits)
    assert relative_error(cross_entropy_backward(probs, targets), numeric) <= REL_TOL


# ------------------------------------------------------------------ what training supports


def test_every_config_field_is_classified_for_training():
    """A new TransformerConfig field fails here until TRAINABLE says whether the backward pass implements it."""
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert set(backprop.TRAINABLE) == fields, (
        f"unclassified: {sorted(fields - set(backprop.TRAINABLE))}, stale: {sorted(set(backprop.TRAINABLE) - fields)}"
    )
    assert all(s is backprop.ANY or isinstance(s, backprop.Only) for s in backprop.TRAINABLE.values())


@settings(max_examples=1, deadline=None)
@given(decoder_fields())
def test_the_gradient_check_draws_every_field_training_supports(fields):
    """Whatever TRAINABLE calls ANY is varied by small_decoders, so it is held to finite differences."""
    assert {name for name, s in backprop.TRAINABLE.items() if s is backprop.ANY} <= set(fields)


BASE = dict(d_model=8, n_layers=1, n_heads=2, d_vocab=5, n_ctx=4, d_mlp=4)


def test_every_family_switch_trains():
    """Every field of the table is ANY: RMS norm, gated MLPs, grouped-query attention, query/key norms,
    post-norm and segment embeddings all have their backward pass."""
    assert all(s is backprop.ANY for s in backprop.TRAINABLE.values())
    cfg = TransformerConfig(
        **BASE | dict(n_heads=4, d_model=8),
        normalization_type="RMS",
        act_fn="silu",
        gated_mlp=True,
        n_key_value_heads=1,
        use_qk_norm=True,
    )
    assert backprop.check_trainable(cfg) is None


def test_a_field_limited_by_the_table_is_refused_saying_what_to_choose(monkeypatch):
    """The table can still limit a field (the next switch whose backward pass is not yet written)."""
    monkeypatch.setitem(backprop.TRAINABLE, "gated_mlp", backprop.Only((False,), "not written yet"))
    monkeypatch.setitem(backprop.TRAINABLE, "normalization_type", backprop.Only(("LN", "LNPre"), "nor this"))
    cfg = TransformerConfig(**BASE, gated_mlp=True, normalization_type="RMS")
    with pytest.raises(InputError, match="^training does not support ") as info:
        backprop.forward(init_params(cfg), cfg, np.zeros((1, 3), dtype=np.int64))
    assert "gated_mlp=True (not written yet): choose False" in str(info.value)
    assert "normalization_type='RMS' (nor this): choose LN or LNPre" in str(info.value)
    assert backprop.check_trainable(TransformerConfig(**BASE)) is None  # the base itself trains


def test_a_field_the_table_does_not_know_trains_only_at_its_default(monkeypatch):
    monkeypatch.delitem(backprop.TRAINABLE, "rotary_base")
    backprop.check_trainable(ROTARY_BASE_500.replace(rotary_base=10000.0))
    with pytest.raises(
        InputError,
        match=r"rotary_base=500.0 \(the backward pass does not implement it yet\): "
        r"leave it at 10000.0",
    ):
        backprop.check_trainable(ROTARY_BASE_500)


@pytest.mark.parametrize("causal", [True, False])
def test_batched_attention_gives_scaled_dot_product_attention_exactly(causal):
    from core.attention import scaled_dot_product_attention

    cfg = TransformerConfig(
        d_model=8,
        n_heads=2,
        n_layers=1,
        d_vocab=5,
        attn_temperature=1.5,
        attention_dir="causal" if causal else "bidirectional",
    )
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((3, 2, 7, 4)).astype(np.float32) for _ in range(3))
    pattern, z = backprop.attention(q, k, v, cfg)
    ref = scaled_dot_product_attention(q, k, v, causal=causal, temperature=1.5)
    np.testing.assert_array_equal(pattern, ref.weights)
    np.testing.assert_array_equal(z, ref.output)


# ------------------------------------------------------------------ attention-only models


def test_an_attention_only_model_has_no_mlp_anywhere():
    from core import hook_names
    from core.params import count_params

    cfg = TransformerConfig(d_model=8, n_layers=2, n_heads=2, d_vocab=5, n_ctx=6, attn_only=True)
    params = init_params(cfg)
    assert all(set(block) == {"ln1", "attn"} for block in params["blocks"])
    assert count_params(cfg).total == sum(a.size for _, a in iter_arrays(params))
    names = hook_names(cfg)
    assert not [n for n in names if "mlp" in n or "resid_mid" in n]
    _, cache = run_with_cache(params, cfg, np.array([1, 2, 3]))
    assert list(cache) == names
    # resid_post is resid_pre plus what attention wrote, exactly
    np.testing.assert_array_equal(
        cache["blocks.0.hook_resid_post"], cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"]
    )


# ------------------------------------------------------------------ gradients of any metric (backprop.gradients)

GRADIENT_CASES = {
    "gpt2": TransformerConfig(d_model=8, n_heads=2, n_layers=2, d_vocab=16, n_ctx=6, d_mlp=12, act_fn="gelu_new"),
    "rotary-parallel-untied": TransformerConfig(
        d_model=8,
        n_heads=2,
        n_layers=2,
        d_vocab=16,
        n_ctx=6,
        d_mlp=12,
        positional_embedding_type="rotary",
        parallel_attn_mlp=True,
        tied_embeddings=False,
        bias=True,
    ),
    "llama-gqa-qk-norm": TransformerConfig(
        d_model=8,
        n_heads=4,
        n_key_value_heads=2,
        n_layers=2,
        d_vocab=16,
        n_ctx=6,
        d_mlp=12,
        normalization_type="RMS",
        act_fn="silu",
        gated_mlp=True,
        use_qk_norm=True,
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        tied_embeddings=False,
        bias=False,
    ),
    "bert-post-norm": TransformerConfig(
        d_model=8,
        n_heads=2,
        n_layers=2,
        d_vocab=16,
        n_ctx=6,
        d_mlp=12,
        act_fn="gelu",
        block_type="post_norm",
        attention_dir="bidirectional",
        n_token_types=2,
    ),
    "attn-only-local": TransformerConfig(
        d_model=8,
        n_heads=2,
        n_layers=2,
        d_vocab=16,
        n_ctx=6,
        attn_only=True,
        window_size=2,
        attn_types=("local", "global"),
    ),
}


def _metric_with_edit(params, cfg, seq, dlogits, name, delta) -> float:
    """Σ dlogits · logits of one sequence through core.model's own blocks (the single-sequence forward, not
    backprop's), with `delta` added to the activation `name` as it is made."""
    from core.hooks import PassContext
    from core.model import embed, norm, transformer_block, unembedding

    ctx = PassContext((), edit=lambda n, v: v + delta if n == name else v)
    x = embed(params, cfg, seq, ctx)
    for layer, block in enumerate(params["blocks"]):
        x, _ = transformer_block(x, block, cfg, ctx, layer)
    W_U, b_U = unembedding(params)
    if cfg.block_type == "pre_norm":
        x = norm(x, params["ln_final"], cfg)
    logits = x @ W_U + (0.0 if b_U is None else b_U)
    return float(np.sum(dlogits * logits))


def _gradient_case(name: str):
    cfg = GRADIENT_CASES[name]
    params, rng = random_model(cfg, 11)
    tokens = rng.permutation(cfg.d_vocab)[:10].reshape(2, 5)  # no token twice: each W_E row feeds one position
    dlogits = rng.standard_normal((2, 5, cfg.d_vocab))
    return cfg, params, rng, tokens, dlogits


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_gradients_at_every_hook_match_central_differences_through_core_model(case):
    """The directional derivative of the metric along a random direction, by central differences through
    core.model's blocks (which edit an activation where it is made), equals ⟨gradient, direction⟩."""
    cfg, params, rng, tokens, dlogits = _gradient_case(case)
    logits, g = backprop.gradients(params, cfg, tokens, dlogits)
    for b, seq in enumerate(tokens):
        np.testing.assert_allclose(logits[b], run_with_cache(params, cfg, seq)[0], rtol=1e-12, atol=1e-12)
    expected = {"hook_resid_pre", "attn.hook_z", "attn.hook_pattern", "hook_attn_out", "hook_resid_post"}
    if not cfg.attn_only:
        expected |= {"hook_resid_mid", "hook_mlp_out"}
    assert set(g.activations) == {f"blocks.{layer}.{n}" for layer in range(cfg.n_layers) for n in expected}
    checked = {"hook_embed": g.embed} | {n: h.grad for n, h in g.activations.items() if "pattern" not in n}
    for name, grad in checked.items():
        b = int(rng.integers(2))
        assert grad.shape[0] == 2 and (name == "hook_embed" or g.activations[name].value.shape == grad.shape)
        direction = rng.standard_normal(grad.shape[1:])
        plus = _metric_with_edit(params, cfg, tokens[b], dlogits[b], name, H * direction)
        minus = _metric_with_edit(params, cfg, tokens[b], dlogits[b], name, -H * direction)
        numeric = (plus - minus) / (2 * H)
        assert abs(float(np.sum(grad[b] * direction)) - numeric) <= REL_TOL * max(1.0, abs(numeric)), name


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_gradients_values_are_core_model_activations_and_pattern_gradient_is_dz_vT(case):
    from core.attention import split_heads

    cfg, params, _, tokens, dlogits = _gradient_case(case)
    _, g = backprop.gradients(params, cfg, tokens, dlogits, param_grads=False)
    assert g.params is None
    for b, seq in enumerate(tokens):
        cache = run_with_cache(params, cfg, seq)[1]
        for name, hooked in g.activations.items():
            np.testing.assert_allclose(hooked.value[b], cache[name], rtol=1e-12, atol=1e-12, err_msg=name)
    _, saved = backprop.forward(params, cfg, tokens)
    for layer, s in enumerate(saved.layers):
        dz = split_heads(g.activations[f"blocks.{layer}.attn.hook_z"].grad.reshape(2, 5, -1), cfg.n_heads)
        np.testing.assert_allclose(
            g.activations[f"blocks.{layer}.attn.hook_pattern"].grad,
            dz @ np.swapaxes(np.repeat(s.v, cfg.group_size, axis=1), -1, -2),
            rtol=1e-12,
        )


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_gradients_of_the_loss_are_the_training_gradients(case):
    cfg, params, rng, tokens, _ = _gradient_case(case)
    targets = rng.integers(0, cfg.d_vocab, tokens.shape)
    logits, saved = backprop.forward(params, cfg, tokens)
    dlogits = cross_entropy_backward(cross_entropy(logits, targets)[1], targets)
    _, g = backprop.gradients(params, cfg, tokens, dlogits, hooks=False)
    _, expected = backprop.loss_and_grads(params, cfg, tokens, targets)
    assert g.activations == {} and g.params is not None
    for name, a in iter_arrays(expected):
        np.testing.assert_allclose(get(g.params, name), a, rtol=1e-12, atol=1e-15, err_msg=name)


def test_gradients_refuse_bad_shapes_saying_what_was_expected():
    cfg, params, _, tokens, dlogits = _gradient_case("gpt2")
    with pytest.raises(InputError, match=r"\[batch, pos\]"):
        backprop.gradients(params, cfg, tokens[0], dlogits[0])
    with pytest.raises(InputError, match="shaped like the logits"):
        backprop.gradients(params, cfg, tokens, dlogits[:, :3])
    with pytest.raises(InputError, match="must lie in"):
        backprop.gradients(params, cfg, tokens + cfg.d_vocab, dlogits)
    with pytest.raises(InputError, match="segment embeddings"):
        backprop.gradients(params, cfg, tokens, dlogits, token_types=np.zeros_like(tokens))
    bert, params, _, tokens, dlogits = _gradient_case("bert-post-norm")
    with pytest.raises(InputError, match=r"segment ids must lie in \[0, 2\)"):
        backprop.gradients(params, bert, tokens, dlogits, token_types=np.full_like(tokens, 2))


def test_float32_gelu_backward_is_the_derivative_of_float32_gelu():
    """The float32 path (Φ from the forward's output, the true density) gives the polynomial's derivative
    (erf_backward) to its accuracy, ~1e-6, and the true derivative (float64) to float32's."""
    from core.functional import erf, erf_backward

    rng = np.random.default_rng(13)
    x = (rng.standard_normal((64, 48)) * 3).astype(np.float32)
    x[0, :3] = 0.0, 1e-30, -40.0  # 0, a denormal-sized input and a far tail
    dy = rng.standard_normal(x.shape).astype(np.float32)
    got = gelu_backward(dy, x, gelu(x))
    assert got.dtype == np.float32
    r = np.float32(1 / np.sqrt(2))
    separate = dy * (0.5 * (1 + erf(x * r)) + 0.5 * r * x * erf_backward(x * r))
    np.testing.assert_allclose(got, separate, rtol=0, atol=3e-6 * np.abs(dy).max())
    exact = gelu_backward(dy.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=0, atol=2e-6 * np.abs(dy).max() * 3)
