"""Unit: softmax, layer norm, GELU and erf, checked against their definitions."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from core.attention import QUERY_BLOCK, reference_attention, scaled_dot_product_attention
from core.functional import erf, gelu, gelu_new, layer_norm, linear, relu, softmax

bounded = settings(max_examples=60, deadline=None)

huge_logits = hnp.arrays(
    np.float64, st.integers(1, 12), elements=st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False)
)


@bounded
@given(huge_logits)
def test_softmax_is_stable_for_huge_logits(z):
    """Without the max shift, exp(1e300) overflows to inf and the row becomes nan."""
    p = softmax(z)
    assert np.all(np.isfinite(p))
    assert np.all(p >= 0)
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-12)
    assert p[np.argmax(z)] == p.max()  # the biggest logit gets the biggest weight


@bounded
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 6)), elements=st.floats(-50, 50)))
def test_softmax_matches_its_definition_row_by_row(z):
    p = softmax(z)
    for row, out in zip(z, p):
        e = [math.exp(v) for v in row]
        np.testing.assert_allclose(out, [v / sum(e) for v in e], rtol=1e-12)


def test_softmax_gives_exact_zeros_for_minus_infinity():
    p = softmax(np.array([2.0, -np.inf, 0.5, -np.inf]))
    assert p[1] == 0.0 and p[3] == 0.0
    assert math.isclose(p.sum(), 1.0)


@bounded
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(2, 16)), elements=st.floats(-100, 100)))
def test_layer_norm_gives_mean_0_and_variance_1(x):
    # eps makes the variance v / (v + eps); rows with a real spread are within 1e-3 of 1.
    assume(np.all(x.var(axis=-1) > 1e-2))
    y = layer_norm(x)
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(y.var(axis=-1), 1.0, rtol=1e-3)


@bounded
@given(hnp.arrays(np.float64, st.integers(2, 16), elements=st.floats(-10, 10)), st.floats(0.1, 5), st.floats(-3, 3))
def test_layer_norm_gain_and_bias_are_applied_after_normalising(x, gain, shift):
    assume(x.var() > 1e-2)
    w, b = np.full(x.shape, gain), np.full(x.shape, shift)
    np.testing.assert_allclose(layer_norm(x, w, b), layer_norm(x) * gain + shift, rtol=1e-12, atol=1e-12)


def test_gelu_tanh_form_is_close_to_the_exact_erf_form():
    x = np.linspace(-8, 8, 4001)
    diff = np.abs(gelu_new(x) - gelu(x))
    assert diff.max() < 1e-3  # the tanh approximation's known error is ~5e-4 near |x| ≈ 2
    assert diff.max() > 0  # they are two different functions, not one called twice


def test_gelu_exact_form_matches_math_erf():
    x = np.linspace(-6, 6, 1201)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(gelu(x), exact, rtol=0, atol=1e-15)  # float64: exact
    # float32 uses the polynomial: erf's error bound (2e-7, tested below) scales by 0.5 |x|
    x32 = x.astype(np.float32)
    exact32 = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x32.astype(float)])
    assert np.all(np.abs(gelu(x32) - exact32) <= 0.5 * np.abs(x32) * 2e-7 + 1e-6)


def test_erf_matches_math_erf_on_a_grid():
    x = np.linspace(-6, 6, 24001)
    # float64: tabulated values (Abramowitz & Stegun, table 7.1), to the last printed digit
    np.testing.assert_allclose(
        erf(np.array([0.5, 1.0, 2.0])), [0.5204998778130465, 0.8427007929497149, 0.9953222650189527], rtol=0, atol=1e-16
    )
    np.testing.assert_array_equal(erf(-x), -erf(x))  # odd function
    ours = erf(x.astype(np.float32))
    exact = np.array([math.erf(v) for v in x.astype(np.float32).astype(float)])
    assert ours.dtype == np.float32 and np.abs(ours - exact).max() < 1e-6  # 1.5e-7, plus float32 arithmetic


def test_relu_and_linear():
    np.testing.assert_array_equal(relu(np.array([-2.0, 0.0, 3.0])), [0.0, 0.0, 3.0])
    x, w, b = np.ones((2, 3)), np.arange(12.0).reshape(3, 4), np.array([1.0, 0, 0, -1])
    np.testing.assert_array_equal(linear(x, w, b), [[13, 15, 18, 20]] * 2)


@pytest.mark.parametrize("fn", [softmax, layer_norm, gelu_new, gelu, relu, erf])
def test_float32_in_gives_float32_out(fn):
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    assert fn(x).dtype == np.float32


@pytest.mark.parametrize("n_query, n_key", [(4, 4), (64, 64), (150, 150), (3, 70)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale, temperature", [(True, 1.0), (False, 0.7)])
def test_blocked_attention_equals_the_plain_reference(n_query, n_key, causal, scale, temperature):
    """The models' blocked, in-place attention gives the reference formula's numbers: every score,
    weight and output. Within one block of queries (every lesson) they are equal to the last bit."""
    rng = np.random.default_rng(n_query * 1000 + n_key)
    q, k, v = (
        rng.standard_normal((2, n_query, 8)),
        rng.standard_normal((2, n_key, 8)),
        rng.standard_normal((2, n_key, 5)),
    )
    fast = scaled_dot_product_attention(q, k, v, causal=causal, scale=scale, temperature=temperature)
    plain = reference_attention(q, k, v, causal=causal, scale=scale, temperature=temperature)
    exact = n_query <= QUERY_BLOCK
    for name in ("scores", "weights", "output"):
        a, b = getattr(fast, name), getattr(plain, name)
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=name)
