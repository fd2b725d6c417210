"""The backward pass against central finite differences (float64), and the batched forward against core.model.

Every parameter's gradient from core.backprop is compared with (L(θ + h) − L(θ − h)) / 2h, element by
element, over random small decoders drawn by hypothesis: layers, heads, attention-only or not,
LN/LNPre, the three activations, tied/untied, every position scheme, biases, temperature and scale,
causal or bidirectional. The error is measured per parameter array as ‖analytic − numeric‖ / ‖numeric‖.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import TransformerConfig, init_params, run_with_cache
from core import backprop
from core.functional import (cross_entropy, cross_entropy_backward, gelu, gelu_backward, gelu_new,
                             gelu_new_backward, layer_norm, layer_norm_backward, relu, relu_backward, softmax,
                             softmax_backward)
from core.model import iter_arrays
from core.positions import apply_rotary, apply_rotary_backward

REL_TOL = 1e-6
H = 1e-5  # central differences: truncation ~h², rounding ~1e-16/h, both far below REL_TOL here


@st.composite
def small_decoders(draw):
    n_heads = draw(st.integers(1, 2))
    d_head = draw(st.sampled_from([2, 4]))
    if n_heads * d_head < 4:  # a layer norm over 2 numbers outputs ±1 whatever its input: no gradient to check
        d_head = 4
    cfg = TransformerConfig(
        d_model=n_heads * d_head, n_heads=n_heads, n_layers=draw(st.integers(1, 2)),
        d_vocab=draw(st.integers(3, 6)), n_ctx=5, d_mlp=draw(st.integers(2, 6)),
        attn_only=draw(st.booleans()), normalization_type=draw(st.sampled_from(["LN", "LNPre"])),
        act_fn=draw(st.sampled_from(["gelu_new", "gelu", "relu"])), tied_embeddings=draw(st.booleans()),
        positional_embedding_type=draw(st.sampled_from(["learned", "sinusoidal", "rotary", "none"])),
        attention_dir=draw(st.sampled_from(["causal", "bidirectional"])), bias=draw(st.booleans()),
        use_attn_scale=draw(st.booleans()), attn_temperature=draw(st.sampled_from([1.0, 0.7, 2.0])),
    )
    return cfg, draw(st.integers(0, 2**31)), draw(st.integers(1, 2)), draw(st.integers(2, 4))


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
    scale = np.linalg.norm(numeric)
    return float(np.linalg.norm(analytic - numeric) / scale) if scale > 0 else float(np.abs(analytic).max())


@settings(max_examples=12, deadline=None)
@given(small_decoders())
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


@settings(max_examples=20, deadline=None)
@given(small_decoders())
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


@pytest.mark.parametrize("act, act_backward", [(gelu_new, gelu_new_backward), (gelu, gelu_backward),
                                               (relu, relu_backward)])
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


def test_rotary_backward_is_the_inverse_rotation():
    rng = np.random.default_rng(3)
    _check_primitive(apply_rotary, lambda dy, x: apply_rotary_backward(dy), rng.standard_normal((2, 5, 6)), rng)


def test_cross_entropy_value_and_gradient():
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((2, 3, 5)) * 3, rng.integers(0, 5, (2, 3))
    loss, probs = cross_entropy(logits, targets)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # the textbook formula, naively
    assert loss == pytest.approx(-np.mean(np.log(np.take_along_axis(p, targets[..., None], -1))), rel=1e-12)
    numeric = numeric_grad(lambda: cross_entropy(logits, targets)[0], logits)
    assert relative_error(cross_entropy_backward(probs, targets), numeric) <= REL_TOL


def test_training_refuses_post_norm_with_a_message():
    cfg = TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_vocab=5, n_ctx=4, block_type="post_norm")
    with pytest.raises(ValueError, match="pre_norm"):
        backprop.forward(init_params(cfg), cfg, np.zeros((1, 3), dtype=np.int64))


@pytest.mark.parametrize("causal", [True, False])
def test_batched_attention_gives_scaled_dot_product_attention_exactly(causal):
    from core.attention import scaled_dot_product_attention

    cfg = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_vocab=5, attn_temperature=1.5,
                            attention_dir="causal" if causal else "bidirectional")
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
    np.testing.assert_array_equal(cache["blocks.0.hook_resid_post"],
                                  cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"])
