"""Properties of attention and position schemes that hold for every input (hypothesis)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core import (
    apply_rotary,
    causal_mask,
    merge_heads,
    multi_head_attention,
    rotary,
    scaled_dot_product_attention,
    sinusoidal,
    split_heads,
)

bounded = settings(max_examples=40, deadline=None)

seeds = st.integers(0, 2**32 - 1)


def gaussian(seed, *shape, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


@st.composite
def qkv(draw, causal=False):
    """Random queries, keys and values with up to two leading (head) axes.

    Causal attention needs at least as many keys as queries (query i sees keys up to
    n_key - n_query + i), else a query would see nothing.
    """
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    n_q = draw(st.integers(1, 7))
    n_k = draw(st.integers(n_q if causal else 1, 7))
    d, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    scale = draw(st.sampled_from([0.1, 1.0, 10.0]))
    rng = np.random.default_rng(draw(seeds))
    q = rng.standard_normal((*lead, n_q, d)) * scale
    k = rng.standard_normal((*lead, n_k, d)) * scale
    v = rng.standard_normal((*lead, n_k, d_v))
    return q, k, v


# ------------------------------------------------------------------------- attention weights


@bounded
@given(
    st.booleans().flatmap(lambda causal: st.tuples(st.just(causal), qkv(causal))), st.booleans(), st.floats(0.25, 4.0)
)
def test_weight_rows_sum_to_1(causal_and_inputs, scale, temperature):
    causal, (q, k, v) = causal_and_inputs
    w = scaled_dot_product_attention(q, k, v, causal=causal, scale=scale, temperature=temperature).weights
    assert np.all(w >= 0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)


@bounded
@given(st.integers(1, 8), st.integers(1, 8), seeds)
def test_causal_weights_are_exactly_0_above_the_diagonal(n, d, seed):
    q, k, v = gaussian(seed, 3, n, d, scale=5.0)
    res = scaled_dot_product_attention(q, k, v, causal=True)
    above = np.triu(np.ones((n, n), dtype=bool), k=1)
    assert np.all(res.weights[above] == 0.0)  # exactly, not approximately
    assert np.all(np.isneginf(res.scores[above]))
    assert np.all(res.weights[~above] > 0)  # nothing else is masked
    # so the first query can only copy the first value
    np.testing.assert_allclose(res.output[0], v[0], rtol=1e-12)


@bounded
@given(st.integers(1, 6), st.integers(0, 5), seeds)
def test_causal_mask_with_cached_keys_hides_only_the_future(n_query, n_past, seed):
    """With n_past cached keys, query i sits at absolute position n_past + i."""
    n_key = n_past + n_query
    mask = causal_mask(n_query, n_key)
    for i in range(n_query):
        for j in range(n_key):
            assert mask[i, j] == (j > n_past + i)


@bounded
@given(st.integers(2, 7), st.integers(1, 6), seeds, st.data())
def test_without_positions_permuting_the_tokens_permutes_the_output(n, d, seed, data):
    q, k, v = gaussian(seed, 3, n, d)
    perm = np.array(data.draw(st.permutations(range(n))))
    out = scaled_dot_product_attention(q, k, v).output
    permuted = scaled_dot_product_attention(q[perm], k[perm], v[perm])
    np.testing.assert_allclose(permuted.output, out[perm], rtol=1e-10, atol=1e-12)
    # permuting only the keys (with their values) changes nothing: attention is a set operation
    np.testing.assert_allclose(scaled_dot_product_attention(q, k[perm], v[perm]).output, out, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------- heads


@bounded
@given(st.integers(1, 6), st.integers(1, 8), st.booleans(), seeds)
def test_one_head_of_width_d_equals_single_head_attention(n, d, causal, seed):
    x, rng = gaussian(seed, n, d), np.random.default_rng(seed + 1)
    W_QKV, W_O = rng.standard_normal((d, 3 * d)), rng.standard_normal((d, d))
    out, res = multi_head_attention(x, W_QKV, W_O, 1, causal=causal)
    W_Q, W_K, W_V = np.split(W_QKV, 3, axis=1)
    single = scaled_dot_product_attention(x @ W_Q, x @ W_K, x @ W_V, causal=causal)
    np.testing.assert_allclose(res.weights[0], single.weights, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out, single.output @ W_O, rtol=1e-10, atol=1e-12)


@bounded
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 4))
def test_split_then_merge_heads_is_the_identity(lead, n_heads, pos, d_head):
    x = np.arange(lead * pos * n_heads * d_head, dtype=float).reshape(lead, pos, n_heads * d_head)
    heads = split_heads(x, n_heads)
    assert heads.shape == (lead, n_heads, pos, d_head)
    for h in range(n_heads):  # head h owns columns [h * d_head, (h + 1) * d_head)
        np.testing.assert_array_equal(heads[:, h], x[:, :, h * d_head : (h + 1) * d_head])
    np.testing.assert_array_equal(merge_heads(heads), x)


def naive_multi_head_attention(x, W_QKV, W_O, b_QKV, b_O, n_heads, causal):
    """The definition, one number at a time: a loop over heads, queries, keys and dimensions."""
    pos, d_model = len(x), len(x[0])
    d_head = len(W_QKV[0]) // (3 * n_heads)

    def project(t, col):
        return sum(x[t][i] * W_QKV[i][col] for i in range(d_model)) + b_QKV[col]

    concat = [[0.0] * (n_heads * d_head) for _ in range(pos)]
    for h in range(n_heads):
        q_cols = [h * d_head + c for c in range(d_head)]  # columns laid out [Q heads | K heads | V heads]
        k_cols = [n_heads * d_head + c for c in q_cols]
        v_cols = [2 * n_heads * d_head + c for c in q_cols]
        for i in range(pos):
            scores = []
            for j in range(pos):
                if causal and j > i:
                    continue
                dot = sum(project(i, qc) * project(j, kc) for qc, kc in zip(q_cols, k_cols))
                scores.append((j, dot / math.sqrt(d_head)))
            top = max(s for _, s in scores)
            exps = [(j, math.exp(s - top)) for j, s in scores]
            total = sum(e for _, e in exps)
            for c, vc in enumerate(v_cols):
                concat[i][h * d_head + c] = sum(e / total * project(j, vc) for j, e in exps)
    return [
        [sum(concat[t][r] * W_O[r][o] for r in range(n_heads * d_head)) + b_O[o] for o in range(d_model)]
        for t in range(pos)
    ]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.booleans(), seeds)
def test_vectorised_multi_head_attention_equals_a_naive_loop(pos, n_heads, d_head, causal, seed):
    rng = np.random.default_rng(seed)
    d_model = n_heads * d_head + rng.integers(0, 3)  # d_model need not equal n_heads * d_head
    x = rng.standard_normal((pos, d_model))
    W_QKV, b_QKV = rng.standard_normal((d_model, 3 * n_heads * d_head)), rng.standard_normal(3 * n_heads * d_head)
    W_O, b_O = rng.standard_normal((n_heads * d_head, d_model)), rng.standard_normal(d_model)
    out, _ = multi_head_attention(x, W_QKV, W_O, n_heads, b_QKV=b_QKV, b_O=b_O, causal=causal)
    expected = naive_multi_head_attention(
        x.tolist(), W_QKV.tolist(), W_O.tolist(), b_QKV.tolist(), b_O.tolist(), n_heads, causal
    )
    np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------- positions

even_widths = st.integers(1, 16).map(lambda k: 2 * k)


@bounded
@given(st.integers(1, 12), even_widths, seeds)
def test_rope_preserves_norms(n_pos, d_head, seed):
    x = gaussian(seed, 2, n_pos, d_head)
    rotated = apply_rotary(x)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(rotated[:, 0], x[:, 0], rtol=0, atol=0)  # position 0 is not rotated


@bounded
@given(even_widths, st.integers(0, 200), st.integers(0, 200), st.integers(-150, 300), seeds)
def test_rope_scores_depend_only_on_the_offset(d_head, m, n, shift, seed):
    q, k = gaussian(seed, 2, d_head)
    m2, n2 = m + abs(shift), n + abs(shift)

    def score(qm, kn):
        return apply_rotary(q[None], np.array([qm]))[0] @ apply_rotary(k[None], np.array([kn]))[0]

    np.testing.assert_allclose(score(m2, n2), score(m, n), rtol=1e-9, atol=1e-9)
    if m == n:  # zero offset: the rotation cancels entirely
        np.testing.assert_allclose(score(m, n), q @ k, rtol=1e-9, atol=1e-9)


@bounded
@given(even_widths, st.integers(0, 60), st.integers(0, 60), st.integers(1, 60))
def test_sinusoidal_dot_products_depend_only_on_the_gap(d, i, j, shift):
    pe = sinusoidal(130, d)
    np.testing.assert_allclose(pe[i] @ pe[j], pe[i + shift] @ pe[j + shift], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pe[i] @ pe[i], d / 2, rtol=1e-12)  # sin² + cos² = 1 for each of d/2 pairs


@bounded
@given(st.integers(1, 8).map(lambda k: 2 * k), st.data(), st.floats(1.5, 1e6), st.booleans(), st.integers(1, 12), seeds)
def test_rotary_at_minus_the_positions_undoes_rotary_for_every_base_width_and_layout(
    d_head, data, base, adjacent_pairs, n_pos, seed
):
    """Training's rotary backward is rotary at −p (core/backprop.py): the transpose of a rotation is its
    inverse, and the angle p · base^(−2i/rotary_dim) is linear in p, whatever the base, the rotated width
    and the pair layout."""
    rotary_dim = 2 * data.draw(st.integers(1, d_head // 2))
    x = gaussian(seed, 2, n_pos, d_head)
    positions = np.arange(n_pos)
    turn = dict(rotary_dim=rotary_dim, base=base, adjacent_pairs=adjacent_pairs)
    rotated = rotary(x, positions, **turn)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_array_equal(rotated[..., rotary_dim:], x[..., rotary_dim:])  # the rest passes unchanged
    np.testing.assert_allclose(rotary(rotated, -positions, **turn), x, rtol=1e-12, atol=1e-12)
