"""Scaled dot-product attention, the causal mask, and heads as a batch axis.

Axis names follow TransformerLens: patterns and scores are [head_index, query_pos, key_pos],
rows are queries, columns are keys. Leading axes (a batch, or heads) broadcast through.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .errors import InputError
from .functional import softmax


class AttentionResult(NamedTuple):
    scores: np.ndarray | None  # [..., query_pos, key_pos], scaled and masked (-inf above the diagonal if causal)
    weights: np.ndarray | None  # [..., query_pos, key_pos], softmax of scores; each row sums to 1
    output: np.ndarray  # [..., query_pos, d_v]


def causal_mask(n_query: int, n_key: int | None = None) -> np.ndarray:
    """Boolean [query_pos, key_pos], True where the key comes after the query (forbidden).

    With n_key > n_query (a KV cache holding earlier tokens), the queries are the last
    n_query positions, so query i sits at absolute position n_key - n_query + i.
    """
    n_key = n_query if n_key is None else n_key
    return np.triu(np.ones((n_query, n_key), dtype=bool), k=1 + n_key - n_query)


def attention_scale(d_head: int, scale: bool = True, temperature: float = 1.0) -> float:
    """The divisor of QKᵀ: √d_head when scaling is on, times the softmax temperature."""
    return (math.sqrt(d_head) if scale else 1.0) * temperature


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False, scale: bool = True,
                        temperature: float = 1.0) -> AttentionResult:
    """softmax(Q Kᵀ / √d_k + mask) V, in the fewest lines: the formula as the spec writes it.

    The reference that the lessons teach from and that scaled_dot_product_attention, the blocked
    and in-place version the models run, is tested against (tests/core/test_functional.py).
    q: [..., query_pos, d_head], k: [..., key_pos, d_head], v: [..., key_pos, d_v].
    """
    scores = q @ np.swapaxes(k, -1, -2) / attention_scale(q.shape[-1], scale, temperature)  # [..., query_pos, key_pos]
    if causal:
        scores = np.where(causal_mask(q.shape[-2], k.shape[-2]), -np.inf, scores)  # the future is -inf
    weights = softmax(scores)  # each row sums to 1
    return AttentionResult(scores, weights, weights @ v)  # output [..., query_pos, d_v]


# Queries are attended to in blocks of this many rows: one block's scores, [..., 64, key_pos],
# stay in the CPU cache through scale, mask, softmax and the product with V, where a whole
# [heads, pos, pos] array at 1024 tokens (48 MB) would stream through memory at every step.
# Inputs of up to QUERY_BLOCK tokens (every toy and lesson) take exactly one block.
QUERY_BLOCK = 64


def scaled_dot_product_attention(
    q: np.ndarray,  # [..., query_pos, d_head]
    k: np.ndarray,  # [..., key_pos, d_head]
    v: np.ndarray,  # [..., key_pos, d_v]
    *,
    causal: bool = False,
    scale: bool = True,
    temperature: float = 1.0,
    keep: bool = True,
    out: np.ndarray | None = None,  # [..., query_pos, d_v], where to write the output
) -> AttentionResult:
    """softmax(Q Kᵀ / √d_k + mask) V, returning scores, weights and output.

    The mask is additive -inf: after the softmax those weights are exactly 0.
    keep=False returns only the output (scores and weights None, and no arrays for them).
    When causal, each block of queries skips the keys none of its rows can see: half the work
    of QKᵀ, softmax and weights @ V at long inputs. The skipped entries are exactly the -inf
    scores and 0 weights, so every number is the same whether or not scores are kept.
    """
    if temperature <= 0 or not math.isfinite(temperature):
        raise InputError(f"temperature must be a positive finite number, got {temperature}")
    n_query, n_key = q.shape[-2], k.shape[-2]
    divisor = attention_scale(q.shape[-1], scale, temperature)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])  # e.g. (n_heads,)
    k_t = np.swapaxes(k, -1, -2)  # [..., d_head, key_pos], a view: BLAS reads it transposed
    output = np.empty((*lead, n_query, v.shape[-1]), dtype=np.result_type(q, k, v)) if out is None else out
    scores = weights = None
    if keep:
        scores = np.empty((*lead, n_query, n_key), dtype=np.result_type(q, k))
        weights = np.empty_like(scores)
    for start in range(0, n_query, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, n_query)
        # Keys this block's queries may see: with a KV cache the queries are the last n_query
        # positions, so query i sits at position n_key - n_query + i and sees keys up to it.
        seen = max(1, n_key - n_query + stop) if causal else n_key
        s = np.matmul(q[..., start:stop, :], k_t[..., :seen],
                      out=None if scores is None else scores[..., start:stop, :seen])  # [..., block, seen]
        s /= divisor
        if causal:
            np.copyto(s, -np.inf, where=causal_mask(stop - start, seen))
        if keep:
            scores[..., start:stop, seen:] = -np.inf  # keys after the block's last query
            weights[..., start:stop, seen:] = 0.0
            w = softmax(s, out=weights[..., start:stop, :seen])
        else:
            w = softmax(s, out=s)  # nobody keeps the scores: overwrite them with the weights
        np.matmul(w, v[..., :seen, :], out=output[..., start:stop, :])
    return AttentionResult(scores, weights, output)


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """[..., pos, n_heads * d_head] -> [..., n_heads, pos, d_head] (a view, no copy)."""
    *lead, pos, width = x.shape
    if width % n_heads:
        raise InputError(f"width {width} is not divisible by n_heads={n_heads}")
    return np.swapaxes(x.reshape(*lead, pos, n_heads, width // n_heads), -2, -3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """[..., n_heads, pos, d_head] -> [..., pos, n_heads * d_head] (concatenate the heads)."""
    *lead, n_heads, pos, d_head = x.shape
    return np.swapaxes(x, -2, -3).reshape(*lead, pos, n_heads * d_head)


def multi_head_attention(
    x: np.ndarray,  # [pos, d_model]
    W_QKV: np.ndarray,  # [d_model, 3 * n_heads * d_head], columns [Q heads | K heads | V heads]
    W_O: np.ndarray,  # [n_heads * d_head, d_model]
    n_heads: int,
    *,
    b_QKV: np.ndarray | None = None,
    b_O: np.ndarray | None = None,
    causal: bool = False,
    scale: bool = True,
    temperature: float = 1.0,
) -> tuple[np.ndarray, AttentionResult]:
    """All heads at once with one QKV matrix multiply; no Python loop over heads.

    Returns the projected output [pos, d_model] and the per-head AttentionResult
    (scores and weights [n_heads, pos, pos], output z [n_heads, pos, d_head]).
    """
    qkv = x @ W_QKV  # [pos, 3 * n_heads * d_head]
    if b_QKV is not None:
        qkv += b_QKV
    q, k, v = (split_heads(m, n_heads) for m in np.split(qkv, 3, axis=-1))  # each [n_heads, pos, d_head]
    result = reference_attention(q, k, v, causal=causal, scale=scale, temperature=temperature)
    out = merge_heads(result.output) @ W_O  # [pos, d_model]
    if b_O is not None:
        out += b_O
    return out, result
