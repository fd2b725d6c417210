"""Scaled dot-product attention, the causal mask, and heads as a batch axis.

Axis names follow TransformerLens: patterns and scores are [head_index, query_pos, key_pos],
rows are queries, columns are keys. Leading axes (a batch, or heads) broadcast through.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .errors import InputError
from .functional import softmax, softmax_backward
from .i18n import _
from .threads import SERIAL, Team


class AttentionResult(NamedTuple):
    scores: np.ndarray  # [..., query_pos, key_pos], scaled and masked (-inf above the diagonal if causal)
    weights: np.ndarray  # [..., query_pos, key_pos], softmax of scores; each row sums to 1
    output: np.ndarray  # [..., query_pos, d_v]


class BlockedAttention(NamedTuple):
    """What scaled_dot_product_attention returns: an AttentionResult whose scores and weights are None
    unless they were kept (keep=True)."""

    scores: np.ndarray | None
    weights: np.ndarray | None
    output: np.ndarray


def causal_mask(n_query: int, n_key: int | None = None) -> np.ndarray:
    """Boolean [query_pos, key_pos], True where the key comes after the query (forbidden).

    With n_key > n_query (a KV cache holding earlier tokens), the queries are the last
    n_query positions, so query i sits at absolute position n_key - n_query + i.
    """
    n_key = n_query if n_key is None else n_key
    return np.triu(np.ones((n_query, n_key), dtype=bool), k=1 + n_key - n_query)


def local_mask(n_query: int, n_key: int, window: int) -> np.ndarray:
    """Boolean [query_pos, key_pos], True where the key lies `window` or more positions before
    the query (too far back for a local attention layer, which sees only the last `window` tokens,
    itself included: GPT-Neo's local layers and Mistral's sliding window).

    The queries are the last n_query of n_key positions, as in causal_mask.
    """
    return np.tril(np.ones((n_query, n_key), dtype=bool), k=n_key - n_query - window)


def attention_scale(d_head: int, scale: bool = True, temperature: float = 1.0) -> float:
    """The divisor of QKᵀ: √d_head when scaling is on, times the softmax temperature."""
    return (math.sqrt(d_head) if scale else 1.0) * temperature


def reference_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    scale: bool = True,
    temperature: float = 1.0,
    window: int | None = None,
) -> AttentionResult:
    """softmax(Q Kᵀ / √d_k + mask) V, in the fewest lines: the formula as the spec writes it.

    The reference that the lessons teach from and that scaled_dot_product_attention, the blocked
    and in-place version the models run, is tested against (tests/core/test_functional.py).
    q: [..., query_pos, d_head], k: [..., key_pos, d_head], v: [..., key_pos, d_v].
    window: a local layer's span (keys further back than that are -inf too).
    """
    scores = q @ np.swapaxes(k, -1, -2) / attention_scale(q.shape[-1], scale, temperature)  # [..., query_pos, key_pos]
    if causal:
        scores = np.where(causal_mask(q.shape[-2], k.shape[-2]), -np.inf, scores)  # the future is -inf
    if window is not None:
        scores = np.where(local_mask(q.shape[-2], k.shape[-2], window), -np.inf, scores)  # the distant past too
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
    window: int | None = None,
    out: np.ndarray | None = None,  # [..., query_pos, d_v], where to write the output
    team: Team = SERIAL,
) -> BlockedAttention:
    """softmax(Q Kᵀ / √d_k + mask) V, returning scores, weights and output.

    The mask is additive -inf: after the softmax those weights are exactly 0.
    keep=False returns only the output (scores and weights None, and no arrays for them).
    When causal, each block of queries skips the keys none of its rows can see: half the work
    of QKᵀ, softmax and weights @ V at long inputs. The skipped entries are exactly the -inf
    scores and 0 weights, so every number is the same whether or not scores are kept.
    window: a local layer's span; each block then also skips the keys that lie `window` or more
    positions before all of its queries.
    Grouped-query attention needs no copies: give q as [n_kv_heads, group, query_pos, d_head] and
    k, v as [n_kv_heads, 1, key_pos, d_head], and the matrix products broadcast each key head
    over its group of query heads.
    team (core/threads.py): the query blocks, by groups of the first leading axis (heads), are shared
    among its threads; each block's numbers are the same on any thread.
    """
    if temperature <= 0 or not math.isfinite(temperature):
        raise InputError(
            _("temperature must be a positive finite number, got {temperature}").format(temperature=temperature)
        )
    if window is not None and not (causal and window >= 1):
        raise InputError(
            _("a local attention window ({window}) needs causal attention and a span of at least 1").format(
                window=window
            )
        )
    n_query, n_key = q.shape[-2], k.shape[-2]
    divisor = attention_scale(q.shape[-1], scale, temperature)
    # A divisor that is a power of two (√64 = 8, √16 = 4, or 1) scales exactly: each product and each partial
    # sum of (Q / divisor) Kᵀ is that of QKᵀ divided by it, so the queries are scaled instead of the scores.
    exact_scale = math.frexp(divisor)[0] == 0.5 and q.dtype.kind == "f"
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])  # e.g. (n_heads,)
    k_t = np.swapaxes(k, -1, -2)  # [..., d_head, key_pos], a view: BLAS reads it transposed
    output = np.empty((*lead, n_query, v.shape[-1]), dtype=np.result_type(q, k, v)) if out is None else out
    scores = weights = None
    if keep:
        scores = team.empty((*lead, n_query, n_key), np.result_type(q, k))
        weights = team.empty(scores.shape, scores.dtype)

    spare: list[np.ndarray] = []  # scores nobody keeps: memory for a block's, handed from piece to piece

    def attend(piece: tuple[slice, int, int]) -> None:
        heads, start, stop = piece  # heads: a range of the first leading axis (all of it when serial)
        part = lambda a: a[heads] if a.ndim == len(lead) + 2 and a.shape[0] > 1 else a  # noqa: E731
        rows = stop - start
        # Keys this block's queries may see: with a KV cache the queries are the last n_query
        # positions, so query i sits at position n_key - n_query + i and sees keys up to it.
        seen = max(1, n_key - n_query + stop) if causal else n_key
        # ...and, in a local layer, none before the first query's window.
        first = 0 if window is None else max(0, n_key - n_query + start - window + 1)
        if keep:
            s = part(scores)[..., start:stop, first:seen]
        else:
            memory = spare.pop() if spare else np.empty((*block_lead, QUERY_BLOCK, n_key), np.result_type(q, k))
            s = (memory[: heads.stop - heads.start] if split else memory)[..., :rows, : seen - first]
        q_block = part(q)[..., start:stop, :]
        if exact_scale and divisor != 1:  # (Q / divisor) Kᵀ: QKᵀ / divisor's numbers, from 64 rows, not the scores
            q_block = np.multiply(q_block, q_block.dtype.type(1 / divisor))
        np.matmul(q_block, part(k_t)[..., first:seen], out=s)  # [..., block, seen - first]
        if not exact_scale:
            s /= divisor
        if causal:  # the keys [first, seen) as seen from the block's queries, the last of n_key - first keys
            if seen - first >= rows:  # the future lies among the block's last `rows` keys: mask only those
                np.copyto(s[..., -rows:], -np.inf, where=causal_mask(rows))
            else:
                np.copyto(s, -np.inf, where=causal_mask(rows, seen - first))
        if window is not None:
            np.copyto(s, -np.inf, where=local_mask(rows, seen - first, window))
        if keep:
            part(scores)[..., start:stop, seen:] = -np.inf  # keys after the block's last query
            part(weights)[..., start:stop, seen:] = 0.0
            part(scores)[..., start:stop, :first] = -np.inf  # keys before the block's window
            part(weights)[..., start:stop, :first] = 0.0
            w = softmax(s, out=part(weights)[..., start:stop, first:seen])
        else:
            w = softmax(s, out=s)  # nobody keeps the scores: overwrite them with the weights
        np.matmul(w, part(v)[..., first:seen, :], out=part(output)[..., start:stop, :])
        if not keep:
            spare.append(memory)

    blocks = [(start, min(start + QUERY_BLOCK, n_query)) for start in range(0, n_query, QUERY_BLOCK)]
    split = team.width > 1 and bool(lead) and lead[0] > 1
    if split:  # about as many head groups as threads, whole heads each
        count = min(lead[0], team.width)
        groups = [slice(lead[0] * i // count, lead[0] * (i + 1) // count) for i in range(count)]
        block_lead = (max(g.stop - g.start for g in groups), *lead[1:])
    else:
        groups, block_lead = [slice(None)], lead
    pieces = [(g, start, stop) for start, stop in blocks for g in groups]
    if causal and team.width > 1:  # the longest rows first, so that no thread is left with one at the end
        pieces.reverse()
    team.each(attend, pieces)
    return BlockedAttention(scores, weights, output)


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """[..., pos, n_heads * d_head] -> [..., n_heads, pos, d_head] (a view, no copy)."""
    *lead, pos, width = x.shape
    if width % n_heads:
        raise InputError(_("width {width} is not divisible by n_heads={n_heads}").format(width=width, n_heads=n_heads))
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


# ---------------------------------------------------------------------------- backward pass

# Training works on batches, whose [batch, head, query_pos, key_pos] arrays are megabytes. Done for a
# few sequences (rows of the first axis) at a time, about this many scores, each step's arrays stay
# in the CPU's cache instead of streaming through memory: the backward pass measured 2.5x faster at
# batch 32, 128 tokens. (core/backprop.py's forward pass uses the same blocks.)
BATCH_BLOCK_SCORES = 1 << 18


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """x summed over the axes that `shape` broadcast (size 1 there): the gradient of a broadcast input."""
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def scaled_dot_product_attention_backward(
    dz: np.ndarray,  # [..., query_pos, d_v], gradient of the loss with respect to the output
    q: np.ndarray,  # [..., query_pos, d_head]
    k: np.ndarray,  # [..., key_pos, d_head]
    v: np.ndarray,  # [..., key_pos, d_v]
    weights: np.ndarray,  # [..., query_pos, key_pos], the forward pass's softmax (0 on masked keys)
    *,
    scale: bool = True,
    temperature: float = 1.0,
    dweights: np.ndarray | None = None,  # [..., query_pos, key_pos]: where to write dL/dweights, if wanted
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # -> dq, dk, dv, shaped like q, k, v
    """Gradients of softmax(Q Kᵀ / divisor + mask) V with respect to Q, K and V (all with the same leading axes).

    Step by step, backwards: output = A V gives dA = dz Vᵀ and dV = Aᵀ dz; A = softmax(S) gives
    dS = A ⊙ (dA − rowsum(dA ⊙ A)); S = Q Kᵀ / divisor gives dQ = dS K / divisor and
    dK = dSᵀ Q / divisor. The causal mask needs no step of its own: a masked score had weight
    exactly 0, so its dS is 0 and no gradient reaches the key it hid.
    Grouped-query attention, as the forward pass takes it: q [..., n_kv_heads, group, query_pos, d_head]
    against k, v [..., n_kv_heads, 1, key_pos, d_head]; a shared key's gradient is the sum of what each
    query head of its group sends it (so are a value's).
    dweights: an array shaped like weights to receive dA, the gradient with respect to the pattern
    itself (attribution patching of a head's pattern reads it); otherwise dA is overwritten by dS.
    """
    divisor = attention_scale(q.shape[-1], scale, temperature)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    shared = k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]
    rows = weights.shape[0] if weights.ndim > 2 else 1
    block = max(1, BATCH_BLOCK_SCORES * rows // weights.size)  # rows of the first axis per block
    for start in range(0, rows, block):
        i = slice(start, start + block) if weights.ndim > 2 else slice(None)
        a = weights[i]
        if shared:  # keys and values shared by a group of query heads: each gets the sum of its group's
            dv[i] = _sum_to(np.swapaxes(a, -1, -2) @ dz[i], dv[i].shape)
        else:
            np.matmul(np.swapaxes(a, -1, -2), dz[i], out=dv[i])  # [..., key_pos, d_v]
        da = np.matmul(dz[i], np.swapaxes(v[i], -1, -2), out=None if dweights is None else dweights[i])
        # da: [..., query_pos, key_pos]; the gradient of the scaled, masked scores, in its place unless it is kept
        ds = softmax_backward(da, a, out=da if dweights is None else None)
        np.matmul(ds, k[i], out=dq[i])  # [..., query_pos, d_head]
        if shared:
            dk[i] = _sum_to(np.swapaxes(ds, -1, -2) @ q[i], dk[i].shape)
        else:
            np.matmul(np.swapaxes(ds, -1, -2), q[i], out=dk[i])  # [..., key_pos, d_head]
    # Through the division by the divisor (√d_head, times the temperature): dividing the
    # [..., pos, d_head] results is cheaper than the [..., pos, pos] scores, and the same numbers.
    dq /= divisor
    dk /= divisor
    return dq, dk, dv
