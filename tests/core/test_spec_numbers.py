"""Acceptance: every number the spec page prints, at its printed precision.

The expected values below are copied from ../shared/spec/transformers-in-depth.txt; the
code under test draws its own random numbers from the spec's seeds.
"""

import numpy as np
import pytest

from core import PRESETS, count_params, lessons


def rounded(a, decimals):
    return np.round(np.asarray(a, dtype=float), decimals)


class TestAttention:
    def test_shapes(self):
        a = lessons.attention()
        assert a.tokens == ["Ali", "makan", "nasi", "lemak"]
        assert a.Q.shape == a.K.shape == a.V.shape == (4, 4)
        assert a.result.output.shape == (4, 4)

    def test_weights_table(self):
        w = lessons.attention().result.weights
        expected = [
            [0.89, 0.02, 0.08, 0.01],
            [0.51, 0.15, 0.21, 0.13],
            [0.09, 0.17, 0.59, 0.15],
            [0.96, 0.03, 0.01, 0.00],
        ]
        np.testing.assert_array_equal(rounded(w, 2), expected)
        np.testing.assert_array_equal(rounded(w.sum(axis=1), 2), [1.0] * 4)

    def test_scores_for_lemak(self):
        a = lessons.attention()
        np.testing.assert_array_equal(rounded(a.result.scores[3], 2), [4.15, 0.69, -0.52, -2.84])


def test_scaling_table():
    rows = lessons.scaling()
    assert [r.d for r in rows] == [4, 64, 512]
    assert [round(r.std, 1) for r in rows] == [2.0, 8.0, 22.5]
    assert [round(r.top_weight_unscaled, 2) for r in rows] == [0.43, 0.84, 0.95]
    assert [round(r.top_weight_scaled, 2) for r in rows] == [0.24, 0.24, 0.25]


def test_causal_table():
    c = lessons.causal()
    np.testing.assert_array_equal(c.mask.astype(int), [[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(
        rounded(c.result.weights, 2),
        [[1.0, 0.0, 0.0, 0.0], [0.78, 0.22, 0.0, 0.0], [0.11, 0.2, 0.69, 0.0], [0.96, 0.03, 0.01, 0.0]],
    )


def test_multihead_rows():
    m = lessons.multihead()
    assert m.Q.shape == (2, 4, 4) and m.result.weights.shape == (2, 4, 4) and m.output.shape == (4, 8)
    np.testing.assert_array_equal(rounded(m.result.weights[0, -1], 2), [0.27, 0.18, 0.26, 0.28])
    np.testing.assert_array_equal(rounded(m.result.weights[1, -1], 2), [0.21, 0.23, 0.36, 0.2])


def test_sinusoidal_rows_and_dots():
    p = lessons.positions()
    np.testing.assert_array_equal(
        rounded(p.encoding[:3, :6], 2),
        [[0.0, 1.0, 0.0, 1.0, 0.0, 1.0], [0.84, 0.54, 0.31, 0.95, 0.1, 1.0], [0.91, -0.42, 0.59, 0.81, 0.2, 0.98]],
    )
    dots = {(i, j): round(d, 2) for i, j, d in p.dots}
    assert dots == {(10, 10): 8.0, (10, 11): 7.49, (10, 12): 6.37, (10, 15): 6.14, (10, 30): 5.78, (30, 35): 6.14}


def test_parameter_counts():
    counts = lessons.parameter_count()
    assert counts["toy"] == (8_256, 49_984, 108_352)
    assert counts["GPT-2 small"] == (39_383_808, 7_087_872, 124_439_808)
    # the library's per-array breakdown agrees with the spec's closed formula
    for preset, spec_name in (("toy", "toy"), ("gpt2-small", "GPT-2 small")):
        c = count_params(PRESETS[preset])
        assert (c.embeddings, c.per_block, c.total) == counts[spec_name]


def test_forward_pass_shapes_and_probabilities():
    f = lessons.forward()
    assert f.steps == [
        ("embed", (5, 16)),
        ("qkv", (5, 48)),
        ("scores", (2, 5, 5)),
        ("after attn", (5, 16)),
        ("after mlp", (5, 16)),
        ("logits", (5, 9)),
    ]
    assert {c: round(p, 3) for c, p in f.next_token_probs.items()} == {
        " ": 0.211,
        "a": 0.115,
        "e": 0.112,
        "i": 0.123,
        "k": 0.062,
        "l": 0.151,
        "m": 0.076,
        "n": 0.09,
        "s": 0.06,
    }


@pytest.mark.parametrize("seed", [0, 7])
def test_forward_pass_equals_the_spec_snippet_line_by_line(seed):
    """An independent transcription of the spec's forward-pass snippet, for any seed."""
    rng = np.random.default_rng(seed)
    text, prompt = "nasi lemak", "nasi "
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    V, T, d, H, d_ff = len(vocab), 5, 16, 2, 64
    P = lambda *shape: rng.standard_normal(shape) * 0.1  # noqa: E731
    tok_emb, pos_emb = P(V, d), P(T, d)
    W_qkv, W_o, W_1, W_2 = P(d, 3 * d), P(d, d), P(d, d_ff), P(d_ff, d)

    def ln(x, eps=1e-5):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)

    def sm(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    ids = np.array([stoi[c] for c in prompt])
    x = tok_emb[ids] + pos_emb[:T]
    h = ln(x) @ W_qkv
    q, k, v = (m.reshape(T, H, d // H).transpose(1, 0, 2) for m in np.split(h, 3, -1))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d // H)
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    a = (sm(s) @ v).transpose(1, 0, 2).reshape(T, d)
    x = x + a @ W_o
    x = x + np.maximum(0, ln(x) @ W_1) @ W_2
    logits = ln(x) @ tok_emb.T

    f = lessons.forward(seed=seed)
    np.testing.assert_allclose(f.logits, logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(f.cache["blocks.0.attn.hook_attn_scores"], s, rtol=1e-12, atol=1e-12)
