"""Looking inside a model: the formulas, as pure functions on arrays.

These are the definitions behind the questions an ActivationCache answers (core/cache.py):
which keys each head detector looks for and how a head is scored, attention rollout, where the
logit lens reads the residual stream and how it decodes it. None of them runs the model.
Shapes carry no batch axis, as in the rest of core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import TransformerConfig
from .errors import InputError
from .i18n import _
from .model import Params, norm, unembedding

# ------------------------------------------------------------------ residual decomposition


@dataclass(frozen=True)
class ResidualDecomposition:
    """The final residual vector at one position as a sum of the parts that wrote it.

    sum(parts) == blocks.{n_layers-1}.hook_resid_post[pos], and
    sum(direct_logit) + logit_bias == the model's logit for `token` at `pos`.
    """

    pos: int
    token: int  # the token whose logit is attributed
    labels: list[str]  # "embed", "pos_embed", "L0H3", "L0 attn bias", "L0 mlp", "L0 mlp bias", ...
    parts: np.ndarray  # [n_parts, d_model]
    direct_logit: np.ndarray  # [n_parts], each part's direct contribution to the token's logit
    logit_bias: float  # ln_final.b · W_U[:, token] + b_U[token]: written by no part of the residual
    scale: float  # the final norm's σ at pos (standard deviation, or root mean square for RMS), frozen from the run
    logit: float  # the model's actual logit

    @property
    def part_norms(self) -> np.ndarray:  # [n_parts]
        return np.linalg.norm(self.parts, axis=-1)


def direct_logit_attribution(
    parts: np.ndarray, resid: np.ndarray, token: int, params: Params, cfg: TransformerConfig
) -> tuple[np.ndarray, float, float]:
    """Each part's direct contribution to `token`'s logit through the final norm and W_U.

    parts: [n_parts, d_model] summing to resid [d_model]. The final norm is linear except for
    its division by σ; freezing σ at the run's value (as TransformerLens does) makes the logit a
    sum over the parts. A layer norm also centres the vector, which is linear, so it is applied
    to each part; an RMS norm (Llama, Qwen) does not centre, and its σ is the root mean square.
    Returns (direct_logit [n_parts], logit_bias, σ).
    """
    rms = cfg.normalization_type in ("RMS", "RMSPre")
    scale = float(np.sqrt(np.mean(resid * resid) + cfg.eps)) if rms else float(np.sqrt(resid.var() + cfg.eps))
    ln = params.get("ln_final", {})
    W_U, b_U = unembedding(params)
    direction = W_U[:, token] * ln["w"] if "w" in ln else W_U[:, token]  # [d_model]
    centred = parts if rms else parts - parts.mean(axis=-1, keepdims=True)  # centring is linear: per part
    direct_logit = centred @ direction / scale  # [n_parts]
    logit_bias = float(ln["b"] @ W_U[:, token] if "b" in ln else 0.0) + float(0.0 if b_U is None else b_U[token])
    return direct_logit, logit_bias, scale


# ------------------------------------------------------------------ logit lens


def lens_points(cfg: TransformerConfig) -> list[str]:
    """Where the lens reads the residual stream, in order.

    blocks.{l}.hook_resid_post is the same array as blocks.{l+1}.hook_resid_pre, so it is
    listed once, for the last layer only (as TransformerLens' accumulated_resid does).
    """
    points = []
    for layer in range(cfg.n_layers):
        points.append(f"blocks.{layer}.hook_resid_pre")
        if not cfg.attn_only:  # an attention-only block has no point between its attention and an MLP
            points.append(f"blocks.{layer}.hook_resid_mid")
    return points + [f"blocks.{cfg.n_layers - 1}.hook_resid_post"]


@dataclass(frozen=True)
class LogitLens:
    points: list[str]  # hook names, see lens_points
    top_tokens: np.ndarray  # [n_points, pos, k] token ids, most probable first
    top_probs: np.ndarray  # [n_points, pos, k]


def lens_logits(params: Params, cfg: TransformerConfig, resid: np.ndarray) -> np.ndarray:
    """The final layer norm and unembedding applied to any residual stream.  # [..., d_model] -> [..., d_vocab]

    Each point is normalised with its own σ (not the final one), exactly as the model would
    normalise it if the remaining layers were deleted (nostalgebraist, 2020)."""
    W_U, b_U = unembedding(params)
    out = norm(resid, params.get("ln_final", {}), cfg) @ W_U
    return out if b_U is None else out + b_U


# ------------------------------------------------------------------ head detectors


def previous_token_keys(tokens: np.ndarray) -> np.ndarray:
    """[query_pos, key_pos] True where key = query - 1."""
    n = len(tokens)
    return np.eye(n, k=-1, dtype=bool)


def duplicate_token_keys(tokens: np.ndarray) -> np.ndarray:
    """[query_pos, key_pos] True where an earlier key holds the query's own token."""
    tokens = np.asarray(tokens)
    same = tokens[:, None] == tokens[None, :]
    return same & np.tri(len(tokens), k=-1, dtype=bool)


def induction_keys(tokens: np.ndarray) -> np.ndarray:
    """[query_pos, key_pos] True where the key comes right after an earlier occurrence of the query's token.

    In "A B ... A", the second A's induction key is B: the head looks back for what followed
    A last time, so the model can predict B again.
    """
    tokens = np.asarray(tokens)
    n = len(tokens)
    keys = np.zeros((n, n), dtype=bool)
    keys[:, 1:] = tokens[:, None] == tokens[None, :-1]  # key j follows a copy of the query's token
    return keys & np.tri(n, k=-1, dtype=bool)  # only earlier keys: the current token is no memory


HEAD_DETECTORS = {
    "previous_token": previous_token_keys,
    "duplicate_token": duplicate_token_keys,
    "induction": induction_keys,
}


def detector_score(patterns: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mean attention mass on the relevant keys, over the queries that have any.

    patterns: [..., query_pos, key_pos]; keys: [query_pos, key_pos] boolean. For each query
    with at least one relevant key, the score sums its weights on those keys (1.0 when the
    head attends only there, 0.0 when it never does), then averages over those queries.
    Queries with no relevant key (the first token, for previous-token) are left out, so a
    perfect head scores exactly 1.0. NaN when no query has a relevant key (e.g. no repeated
    token for the duplicate and induction detectors).  # -> [...]
    """
    rows = keys.any(axis=-1)  # [query_pos]
    if not rows.any():
        return np.full(patterns.shape[:-2], np.nan)
    mass = (patterns * keys).sum(axis=-1)  # [..., query_pos]
    return mass[..., rows].mean(axis=-1)


def head_detector_scores(patterns: np.ndarray, tokens) -> dict[str, np.ndarray]:
    """Each detector's score for every head.  # patterns [n_layers, n_heads, pos, pos] -> {name: [n_layers, n_heads]}

    previous_token: mass on the token just before. duplicate_token: mass on earlier copies
    of the same token. induction: mass on the tokens that followed earlier copies of the
    current token. Run them on `repeated_random_tokens` to find induction heads.
    """
    return {name: detector_score(patterns, keys(tokens)) for name, keys in HEAD_DETECTORS.items()}


def repeated_random_tokens(d_vocab: int, length: int, n_repeats: int = 2, seed: int = 0) -> np.ndarray:
    """`length` random token ids repeated `n_repeats` times: the second copy is predictable only
    by induction (look up what followed this token last time).  # -> [length * n_repeats]"""
    for name, value in (("d_vocab", d_vocab), ("length", length), ("n_repeats", n_repeats)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(_("{name} must be a positive integer, got {value!r}").format(name=name, value=value))
    half = np.random.default_rng(seed).integers(0, d_vocab, size=length)
    return np.tile(half, n_repeats)


# ------------------------------------------------------------------ attention rollout


def attention_rollout(patterns: np.ndarray) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020): how much each input token flows into each position.

    patterns: [n_layers, head_index, query_pos, key_pos]. Per layer, average the heads, add the
    identity for the residual connection and renormalise the rows (so Ã = (A + I) / 2); then
    multiply the layers: R_0 = Ã_0, R_l = Ã_l R_{l-1}. Returns R_l for every layer
    [n_layers, query_pos, key_pos]; each row of each R_l sums to 1.
    """
    if patterns.ndim != 4 or patterns.shape[-1] != patterns.shape[-2]:
        raise InputError(
            _("expected patterns [n_layers, head_index, pos, pos], got shape {shape}").format(shape=patterns.shape)
        )
    mixed = patterns.mean(axis=1) + np.eye(patterns.shape[-1])  # [n_layers, pos, pos]
    mixed /= mixed.sum(axis=-1, keepdims=True)
    rollout = np.empty_like(mixed)
    current = np.eye(patterns.shape[-1])
    for layer, a in enumerate(mixed):
        current = a @ current
        rollout[layer] = current
    return rollout
