"""One function per section of the spec, each reproducing that section's printed output.

The defaults are the spec's: the same seeds, the same random draws in the same order, so
`attention()` prints the spec's table. Every parameter the spec's snippet hard-codes can
be changed. These functions build on the library (core.attention, core.model), so the
spec's numbers are also a check on the library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .attention import AttentionResult, causal_mask, merge_heads, multi_head_attention, reference_attention, split_heads
from .cache import run_with_cache
from .config import TransformerConfig
from .errors import InputError
from .functional import softmax
from .i18n import _
from .model import next_token_probs
from .params import gpt_params
from .positions import sinusoidal
from .tokenizers import CharTokenizer, word_tokens

DEFAULT_TEXT = "Ali makan nasi lemak"


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(_("{name} must be a positive integer, got {value!r}").format(name=name, value=value))


# ------------------------------------------------------------------ queries, keys, values


@dataclass
class AttentionLesson:
    tokens: list[str]
    X: np.ndarray  # [pos, d_model]
    W_q: np.ndarray  # [d_model, d_k]
    W_k: np.ndarray
    W_v: np.ndarray
    Q: np.ndarray  # [pos, d_k]
    K: np.ndarray
    V: np.ndarray
    raw_scores: np.ndarray  # [query_pos, key_pos], Q Kᵀ before scaling and masking
    mask: np.ndarray  # [query_pos, key_pos], True where forbidden (all False unless causal)
    result: AttentionResult  # scores (scaled, masked), weights, output


def attention(
    text: str = DEFAULT_TEXT, seed: int = 0, d_model: int = 8, d_k: int = 4, causal: bool = False, scale: bool = True
) -> AttentionLesson:
    """ "Scaled dot-product attention": four tokens, random projections, one head.

    The spec seeds NumPy's legacy global generator; RandomState(seed) is the same stream
    without touching global state. With causal=True this is the "Causal masks" section
    (its snippet draws W_q and W_k first, exactly as here).
    """
    _check_positive(d_model=d_model, d_k=d_k)
    tokens = word_tokens(text)
    rs = np.random.RandomState(seed)
    X = rs.randn(len(tokens), d_model)  # one row per token (embeddings)
    W_q = rs.randn(d_model, d_k) / np.sqrt(d_model)  # small, as at initialisation
    W_k = rs.randn(d_model, d_k) / np.sqrt(d_model)
    W_v = rs.randn(d_model, d_k) / np.sqrt(d_model)
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    result = reference_attention(Q, K, V, causal=causal, scale=scale)  # the plain reference, as the spec writes it
    mask = causal_mask(len(tokens)) if causal else np.zeros((len(tokens),) * 2, dtype=bool)
    return AttentionLesson(tokens, X, W_q, W_k, W_v, Q, K, V, Q @ K.T, mask, result)


# ------------------------------------------------------------------ why divide by √d_k


@dataclass
class ScalingRow:
    d: int
    std: float  # standard deviation of the raw dot products q·k
    top_weight_unscaled: float  # mean over queries of the largest softmax weight
    top_weight_scaled: float

    @property
    def sqrt_d(self) -> float:  # what std grows like, and what the scaled scores are divided by
        return math.sqrt(self.d)


def scaling(
    dims: tuple[int, ...] = (4, 64, 512), n_queries: int = 1000, n_keys: int = 16, seed: int = 42
) -> list[ScalingRow]:
    """Random queries and keys: unscaled scores grow like √d and the softmax collapses."""
    _check_positive(n_queries=n_queries, n_keys=n_keys, **{f"d={d}": d for d in dims})
    rng = np.random.default_rng(seed)
    rows = []
    for d in dims:
        q = rng.standard_normal((n_queries, d))  # random queries
        k = rng.standard_normal((n_queries, n_keys, d))  # n_keys random keys for each
        raw = np.einsum("nd,nkd->nk", q, k)  # [n_queries, n_keys] dot products
        rows.append(
            ScalingRow(
                d=int(d),
                std=float(raw.std()),
                top_weight_unscaled=float(softmax(raw).max(axis=1).mean()),
                top_weight_scaled=float(softmax(raw / math.sqrt(d)).max(axis=1).mean()),
            )
        )
    return rows


# ------------------------------------------------------------------ causal mask


def causal(text: str = DEFAULT_TEXT, seed: int = 0, d_model: int = 8, d_k: int = 4) -> AttentionLesson:
    """ "Causal masks": the attention lesson with the future forbidden."""
    return attention(text, seed, d_model, d_k, causal=True)


# ------------------------------------------------------------------ multiple heads


@dataclass
class MultiHeadLesson:
    tokens: list[str]
    n_heads: int
    d_head: int
    X: np.ndarray  # [pos, d_model]
    W_qkv: np.ndarray  # [d_model, 3 * d_model]
    W_o: np.ndarray  # [d_model, d_model]
    Q: np.ndarray  # [n_heads, pos, d_head]
    K: np.ndarray
    V: np.ndarray
    result: AttentionResult  # per head: scores, weights [n_heads, pos, pos], heads [n_heads, pos, d_head]
    concat: np.ndarray  # [pos, d_model]
    output: np.ndarray  # [pos, d_model]


def multihead(
    text: str = DEFAULT_TEXT,
    seed: int = 1,
    d_model: int = 8,
    n_heads: int = 2,
    causal: bool = False,
    scale: bool = True,
) -> MultiHeadLesson:
    """ "Multi-head attention": one QKV matrix for all heads, heads as a batch axis."""
    _check_positive(d_model=d_model, n_heads=n_heads)
    if d_model % n_heads:
        raise InputError(
            _(
                "d_model={d_model} is not divisible by n_heads={n_heads}: each head gets d_model / n_heads dimensions"
            ).format(d_model=d_model, n_heads=n_heads)
        )
    tokens = word_tokens(text)
    rs = np.random.RandomState(seed)
    X = rs.randn(len(tokens), d_model)
    W_qkv = rs.randn(d_model, 3 * d_model) / np.sqrt(d_model)  # all heads at once
    W_o = rs.randn(d_model, d_model) / np.sqrt(d_model)
    output, result = multi_head_attention(X, W_qkv, W_o, n_heads, causal=causal, scale=scale)
    Q, K, V = (split_heads(m, n_heads) for m in np.split(X @ W_qkv, 3, axis=-1))
    return MultiHeadLesson(
        tokens, n_heads, d_model // n_heads, X, W_qkv, W_o, Q, K, V, result, merge_heads(result.output), output
    )


# ------------------------------------------------------------------ positions

SPEC_POSITION_PAIRS = ((10, 10), (10, 11), (10, 12), (10, 15), (10, 30), (30, 35))


@dataclass
class PositionsLesson:
    encoding: np.ndarray  # [n_pos, d]
    dots: list[tuple[int, int, float]] = field(default_factory=list)  # (i, j, pe[i] · pe[j])


def positions(
    n_pos: int = 50, d: int = 16, pairs: tuple[tuple[int, int], ...] = SPEC_POSITION_PAIRS
) -> PositionsLesson:
    """ "Where am I?": sinusoidal encodings, whose dot products depend only on the gap."""
    _check_positive(n_pos=n_pos, d=d)
    pe = sinusoidal(n_pos, d)
    for i, j in pairs:
        if not (0 <= i < n_pos and 0 <= j < n_pos):
            raise InputError(
                _("position pair ({i}, {j}) lies outside 0..{last}: raise n_pos or pick closer pairs").format(
                    i=i, j=j, last=n_pos - 1
                )
            )
    return PositionsLesson(pe, [(int(i), int(j), float(pe[i] @ pe[j])) for i, j in pairs])


# ------------------------------------------------------------------ counting parameters

SPEC_PARAM_MODELS = {"toy": (65, 64, 64, 2), "GPT-2 small": (50257, 1024, 768, 12)}


def parameter_count(models: dict[str, tuple[int, ...]] | None = None) -> dict[str, tuple[int, int, int]]:
    """ "Counting parameters": (embeddings, per block, total) by the spec's formula."""
    return {name: gpt_params(*cfg) for name, cfg in (models or SPEC_PARAM_MODELS).items()}


# ------------------------------------------------------------------ a full forward pass


@dataclass
class ForwardLesson:
    vocab: list[str]
    prompt: str
    token_ids: np.ndarray  # [pos]
    cfg: TransformerConfig
    params: dict
    steps: list[tuple[str, tuple[int, ...]]]  # the spec's printed (name, shape) lines
    logits: np.ndarray  # [pos, d_vocab]
    cache: Mapping[str, np.ndarray]  # the run's ActivationCache, by hook name
    next_token_probs: dict[str, float]


def forward(
    text: str = "nasi lemak",
    prompt: str = "nasi ",
    seed: int = 42,
    d_model: int = 16,
    n_heads: int = 2,
    d_mlp: int = 64,
) -> ForwardLesson:
    """ "A full forward pass": a one-block, two-head, character-level toy with random weights.

    The weights are drawn exactly as the spec's snippet draws them, then loaded into the
    library's model (scale-free layer norms, no biases, ReLU, tied unembedding), which
    therefore must reproduce the spec's probabilities.
    """
    _check_positive(d_model=d_model, n_heads=n_heads, d_mlp=d_mlp)
    tokenizer = CharTokenizer.from_text(text)  # the vocabulary: sorted characters of text
    ids = np.array(tokenizer.encode(prompt))
    V, T, d = len(tokenizer.vocab), len(ids), d_model
    cfg = TransformerConfig(
        d_model=d,
        n_layers=1,
        n_heads=n_heads,
        d_vocab=V,
        n_ctx=T,
        d_mlp=d_mlp,
        act_fn="relu",
        normalization_type="LNPre",
        positional_embedding_type="learned",
        bias=False,
        tied_embeddings=True,
    )
    rng = np.random.default_rng(seed)
    P = lambda *shape: rng.standard_normal(shape) * 0.1  # noqa: E731  small random weights, the spec's P
    tok_emb, pos_emb = P(V, d), P(T, d)
    W_qkv, W_o, W_1, W_2 = P(d, 3 * d), P(d, d), P(d, d_mlp), P(d_mlp, d)
    params = {
        "embed": {"W_E": tok_emb},
        "pos_embed": {"W_pos": pos_emb},
        "blocks": [{"ln1": {}, "attn": {"W_QKV": W_qkv, "W_O": W_o}, "ln2": {}, "mlp": {"W_in": W_1, "W_out": W_2}}],
        "ln_final": {},
    }
    logits, cache = run_with_cache(params, cfg, ids)
    steps = [
        ("embed", cache["blocks.0.hook_resid_pre"].shape),
        ("qkv", (T, 3 * d)),
        ("scores", cache["blocks.0.attn.hook_attn_scores"].shape),
        ("after attn", cache["blocks.0.hook_resid_mid"].shape),
        ("after mlp", cache["blocks.0.hook_resid_post"].shape),
        ("logits", logits.shape),
    ]
    probs = next_token_probs(logits)
    return ForwardLesson(
        list(tokenizer.vocab),
        prompt,
        ids,
        cfg,
        params,
        steps,
        logits,
        cache,
        {c: float(p) for c, p in zip(tokenizer.vocab, probs)},
    )


__all__ = ["attention", "scaling", "causal", "multihead", "positions", "parameter_count", "forward"]
