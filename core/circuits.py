"""Why a head attends, what it writes, and how heads compose ("A Mathematical Framework for Transformer
Circuits", Elhage et al., 2021).

QK circuit of one score. A head's pre-softmax score for query position i and key position j is
q_i · k_j / divisor, where q_i is read from the residual stream at i (through the layer's norm and
W_Q) and k_j from the stream at j. In a pre-norm model the stream before layer l is exactly the sum
of what wrote it: the token and position embeddings, each earlier head's output z_h W_O[h], each
attention bias b_O, each earlier MLP's output. Freezing each norm's scale σ at the run's value (as
the residual decomposition does, core/analysis.py direct_logit_attribution), the norm is linear in
that sum, and so are W_Q and W_K: the score splits exactly into query part × key part terms, plus
terms with the biases (the norm's bias b times W_Q, and b_Q; likewise for keys). Qwen3's per-head
query and key norms are frozen the same way. Rotary positions rotate the query by its position and
the key by its own: a rotation is linear, so each part's query (or key) vector is rotated by the
position of the query (or key) it belongs to, and the products still sum to the score.

OV circuit and copying. A head that copies raises, at the query, the logit of the token it attends
to: its full OV circuit W_E W_V W_O W_U [d_vocab, d_vocab] has large diagonal entries and positive
eigenvalues. The copying score is Σλ / Σ|λ| over its eigenvalues, which are those of the small
d_head × d_head matrix W_O W_U W_E W_V (the nonzero eigenvalues of AB and BA are equal), so the
vocabulary-square matrix is never formed (TransformerLens' FactoredMatrix does the same).

Composition. A later head reads an earlier head's output through its queries (Q-composition), keys
(K-composition) or values (V-composition). Each score is ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F) with W_A
the earlier head's W_OV = W_V W_O and W_B the later head's W_QK = W_Q W_Kᵀ (Q), W_QKᵀ (K) or W_OV (V),
in the row-vector convention (x W), as TransformerLens computes them. Every norm is computed from
the d_head × d_head factors, never from the d_model × d_model products. The baseline is the same
score for random matrices of the same shapes.

Weights are read as TransformerLens' fold_ln would give them: each norm's gain (w) is folded into
the matrices that read its output, and for a layer norm, which centres what it reads, the writing
matrices (W_O, the embeddings) are centred. The norms' scales and all biases are left out of the OV
and composition scores, which are properties of the weights alone; rotary positions are left out
of W_QK (it then depends on the distance between query and key).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .attention import attention_scale
from .cache import ActivationCache, check_position, require_pre_norm
from .config import TransformerConfig
from .errors import InputError
from .i18n import _
from .model import Params, per_head_weights, unembedding
from .positions import rotary

# ------------------------------------------------------------------ what wrote the residual stream


def resid_parts_hooks(cfg: TransformerConfig, layer: int) -> list[str]:
    """What `resid_parts` needs to split the stream before `layer`."""
    names = ["hook_embed", "hook_pos_embed", "hook_token_type_embed"]
    for at in range(layer):
        names.append(f"blocks.{at}.attn.hook_z")
        if not cfg.attn_only:
            names.append(f"blocks.{at}.mlp.hook_post")
    return names + [f"blocks.{layer}.hook_resid_pre"]


def resid_parts(cache: ActivationCache, layer: int, pos: int) -> tuple[list[str], np.ndarray]:
    """The residual stream entering `layer` at `pos` as the parts that wrote it: labels and [n_parts, d_model],
    summing to blocks.{layer}.hook_resid_pre[pos] (labels as decompose_resid's: embed, pos_embed, L0H3,
    L0 attn bias, L0 mlp, L0 mlp bias)."""
    cfg, params = cache.cfg, cache.params
    labels, parts = ["embed"], [cache["hook_embed"][pos]]
    for name, label in (("hook_pos_embed", "pos_embed"), ("hook_token_type_embed", "token_type_embed")):
        if name in cache:
            labels.append(label)
            parts.append(cache[name][pos])
    for at in range(layer):
        block = params["blocks"][at]
        W_O = per_head_weights(block["attn"], cfg)["W_O"]  # [n_heads, d_head, d_model]
        labels += [f"L{at}H{h}" for h in range(cfg.n_heads)]
        parts += list(np.einsum("hd,hdm->hm", cache[f"blocks.{at}.attn.hook_z"][pos], W_O))
        if "b_O" in block["attn"]:
            labels.append(f"L{at} attn bias")
            parts.append(block["attn"]["b_O"])
        if cfg.attn_only:
            continue
        labels.append(f"L{at} mlp")
        parts.append(cache[f"blocks.{at}.mlp.hook_post"][pos] @ block["mlp"]["W_out"])
        if "b_out" in block["mlp"]:
            labels.append(f"L{at} mlp bias")
            parts.append(block["mlp"]["b_out"])
    return labels, np.stack(parts)


def _norm_scale(x: np.ndarray, cfg: TransformerConfig) -> float:
    """σ of the model's norm for one vector: its standard deviation (LN) or root mean square (RMS), with eps."""
    if cfg.normalization_type in ("RMS", "RMSPre"):
        return float(np.sqrt(np.mean(x * x) + cfg.eps))
    return float(np.sqrt(x.var() + cfg.eps))


def _through_norm(
    parts: np.ndarray, resid: np.ndarray, ln: dict, cfg: TransformerConfig
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each part as the norm passes it with σ frozen at `resid`'s: (parts [n, d_model], the norm's bias or None)."""
    centred = parts if cfg.normalization_type in ("RMS", "RMSPre") else parts - parts.mean(-1, keepdims=True)
    out = centred / _norm_scale(resid, cfg)
    return (out * ln["w"] if "w" in ln else out), ln.get("b")


# ------------------------------------------------------------------ QK circuit of one score


@dataclass(frozen=True)
class QKDecomposition:
    """One pre-softmax score as a sum over query-side parts × key-side parts.

    contributions.sum() == total ≈ score (the model's own, hook_attn_scores). The last part of a side
    is "bias" when that side has one (the norm's bias through W_Q or W_K, plus b_Q or b_K)."""

    layer: int
    head: int
    query: int  # positions
    key: int
    query_parts: list[str]
    key_parts: list[str]
    contributions: np.ndarray  # [n_query_parts, n_key_parts]
    score: float  # the model's scaled score (before the mask and softmax)
    query_scale: float  # the layer norm's σ at the query, frozen from the run
    key_scale: float

    @property
    def total(self) -> float:
        return float(self.contributions.sum())

    @property
    def bias_terms(self) -> dict[str, float]:
        """The terms that involve a bias, summed by kind (0 where the model has none)."""
        q_bias, k_bias = self.query_parts[-1] == "bias", self.key_parts[-1] == "bias"
        c = self.contributions
        return {
            "query bias × key parts": float(c[-1, : len(self.key_parts) - k_bias].sum()) if q_bias else 0.0,
            "query parts × key bias": float(c[: len(self.query_parts) - q_bias, -1].sum()) if k_bias else 0.0,
            "query bias × key bias": float(c[-1, -1]) if q_bias and k_bias else 0.0,
        }

    def top_pairs(self, k: int = 3) -> list[tuple[str, str, float]]:
        """The k largest terms by size: (query part, key part, contribution)."""
        order = np.argsort(-np.abs(self.contributions), axis=None, kind="stable")[:k]
        rows, cols = np.unravel_index(order, self.contributions.shape)
        return [(self.query_parts[r], self.key_parts[c], float(self.contributions[r, c])) for r, c in zip(rows, cols)]


def qk_hooks(cfg: TransformerConfig, layer: int) -> list[str]:
    """What `qk_decomposition` needs from a run."""
    return resid_parts_hooks(cfg, layer) + [f"blocks.{layer}.attn.hook_attn_scores"]


def _side(
    parts: np.ndarray, resid: np.ndarray, cfg: TransformerConfig, attn: dict, ln: dict, which: str, head: int, pos: int
) -> tuple[np.ndarray, bool, float]:
    """One side's vectors in the head's query (or key) space, one per part (and the bias last, if any).
    -> ([n, d_head], whether a bias row was added, σ)"""
    w = per_head_weights(attn, cfg)
    W, index = (w["W_Q"], head) if which == "q" else (w["W_K"], cfg.kv_head(head))
    normed, ln_bias = _through_norm(parts, resid, ln, cfg)
    vectors = normed @ W[index]  # [n_parts, d_head]
    bias = np.zeros(W.shape[-1]) if ln_bias is None else ln_bias @ W[index]
    b = _projection_bias(attn, cfg, which, index)
    if b is not None:
        bias = bias + b
    has_bias = ln_bias is not None or b is not None
    if has_bias:
        vectors = np.concatenate([vectors, bias[None]])
    if "q_norm" in attn:  # Qwen3: the head's own RMS norm, its scale frozen at the whole vector's
        total = vectors.sum(0)
        vectors = vectors / np.sqrt(np.mean(total * total) + cfg.eps) * attn[f"{which}_norm"]["w"]
    if cfg.positional_embedding_type == "rotary":  # each part turned by its side's position
        vectors = rotary(
            vectors[:, None, :],
            np.array([pos]),
            rotary_dim=cfg.rotary_dim,
            base=cfg.rotary_base,
            adjacent_pairs=cfg.rotary_adjacent_pairs,
        )[:, 0]
    return vectors, has_bias, _norm_scale(resid, cfg)


def _projection_bias(attn: dict, cfg: TransformerConfig, which: str, index: int) -> np.ndarray | None:
    """b_Q of one query head (or b_K of one key/value head), whatever the layout, or None."""
    h, dh = cfg.n_heads, cfg.d_head
    if "b_QKV" in attn:
        b = attn["b_QKV"]
        if attn["W_QKV"].ndim == 4:  # GPT-NeoX: per head, its q, k and v side by side
            return b.reshape(h, 3, dh)[index, 0 if which == "q" else 1]
        start = 0 if which == "q" else h * dh
        return b[start + index * dh : start + (index + 1) * dh]
    key = "b_Q" if which == "q" else "b_K"
    if key in attn:
        return attn[key][index * dh : (index + 1) * dh]
    return None


def qk_decomposition(cache: ActivationCache, layer: int, head: int, query: int, key: int) -> QKDecomposition:
    """Split head `head` of `layer`'s score for (query, key) into query part × key part terms (needs `qk_hooks`)."""
    cfg, params = cache.cfg, cache.params
    require_pre_norm(cfg, _("the QK decomposition"))
    if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
        raise InputError(
            _(
                "layer {layer}, head {head} does not exist: the model has {n_layers} "
                "layer(s) of {n_heads} head(s), counted from 0"
            ).format(layer=layer, head=head, n_layers=cfg.n_layers, n_heads=cfg.n_heads)
        )
    n = cache.tokens.size
    query, key = check_position(query, n), check_position(key, n)
    score = float(cache[f"blocks.{layer}.attn.hook_attn_scores"][head, query, key])
    if np.isneginf(score):
        why = (
            _("after the query: the causal mask hides it")
            if key > query
            else _("further back than this layer's window of {window} tokens").format(window=cfg.window(layer))
        )
        raise InputError(
            _("key position {key} is {why} (its score is −∞): choose a key the query at {query} can see").format(
                key=key, why=why, query=query
            )
        )
    block = params["blocks"][layer]
    q_labels, q_parts = resid_parts(cache, layer, query)
    k_labels, k_parts = resid_parts(cache, layer, key)
    resid = cache[f"blocks.{layer}.hook_resid_pre"]
    q, q_bias, q_scale = _side(q_parts, resid[query], cfg, block["attn"], block["ln1"], "q", head, query)
    k, k_bias, k_scale = _side(k_parts, resid[key], cfg, block["attn"], block["ln1"], "k", head, key)
    divisor = attention_scale(cfg.d_head, cfg.use_attn_scale, cfg.attn_temperature)
    contributions = (q @ k.T) / divisor  # [n_query_parts, n_key_parts]
    return QKDecomposition(
        layer,
        head,
        query,
        key,
        q_labels + ["bias"] * q_bias,
        k_labels + ["bias"] * k_bias,
        contributions,
        score,
        q_scale,
        k_scale,
    )


# ------------------------------------------------------------------ weights as the circuits read them


def _centre(W: np.ndarray, cfg: TransformerConfig) -> np.ndarray:
    """A writing matrix's output centred across d_model (a layer norm removes the mean of what it reads)."""
    return W if cfg.normalization_type in ("RMS", "RMSPre") else W - W.mean(-1, keepdims=True)


def _gain(ln: dict) -> np.ndarray | float:
    return ln["w"][:, None] if "w" in ln else 1.0


def folded_heads(params: Params, cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """Every head's factors, [n_layers, n_heads, ...], with the reading norm's gain folded in and the
    writing matrices centred (layer norm): W_Q, W_K, W_V [d_model, d_head], W_O [d_head, d_model]
    (grouped-query heads get their key/value head's W_K and W_V)."""
    out: dict[str, list] = {"W_Q": [], "W_K": [], "W_V": [], "W_O": []}
    kv = [cfg.kv_head(h) for h in range(cfg.n_heads)]
    for block in params["blocks"]:
        w = per_head_weights(block["attn"], cfg)
        gain = _gain(block["ln1"])
        out["W_Q"].append(gain * w["W_Q"].astype(np.float64))
        out["W_K"].append(gain * w["W_K"][kv].astype(np.float64))
        out["W_V"].append(gain * w["W_V"][kv].astype(np.float64))
        out["W_O"].append(_centre(w["W_O"].astype(np.float64), cfg))
    return {k: np.stack(v) for k, v in out.items()}


def _root(A: np.ndarray) -> np.ndarray:
    """R [..., r, r] with RᵀR = AᵀA (from the r × r Gram matrix's eigenvectors), so that ‖A X‖_F = ‖R X‖_F
    for any X: a tall d × r factor replaced by an r × r one.  # [..., d, r] -> [..., r, r]"""
    w, V = np.linalg.eigh(np.swapaxes(A, -1, -2) @ A)
    return np.sqrt(np.maximum(w, 0.0))[..., :, None] * np.swapaxes(V, -1, -2)


def composition_score(A1: np.ndarray, B1: np.ndarray, A2: np.ndarray, B2: np.ndarray) -> np.ndarray:
    """‖(A1 B1)(A2 B2)‖_F / (‖A1 B1‖_F ‖A2 B2‖_F) for every pair: the earlier heads' factors A1 [E, d, r], B1 [E, r, d],
    the later heads' A2 [L, d, r], B2 [L, r, d] -> [L, E]. With R1ᵀR1 = A1ᵀA1 and R2ᵀR2 = B2 B2ᵀ (`_root`),
    every Frobenius norm is unchanged with R1 for A1 and R2ᵀ for B2: ‖A1 B1 A2 B2‖ = ‖R1 B1 A2 R2ᵀ‖, so all
    pairs are one matrix product [E·r, d] @ [d, L·r] and never a d × d matrix."""
    P1 = _root(A1) @ B1  # [E, r, d]: ‖P1‖ = ‖A1 B1‖
    P2 = A2 @ np.swapaxes(_root(np.swapaxes(B2, -1, -2)), -1, -2)  # [L, d, r]: ‖P2‖ = ‖A2 B2‖
    (E, r, d), L = P1.shape, P2.shape[0]
    M = P1.reshape(E * r, d) @ P2.transpose(1, 0, 2).reshape(d, L * r)  # [E·r, L·r], block (e, l) = R1 B1 A2 R2ᵀ
    squares = (M * M).reshape(E, r, L, -1).sum(axis=(1, 3)).T  # [L, E]
    norms = np.sqrt((P2 * P2).sum(axis=(1, 2)))[:, None] * np.sqrt((P1 * P1).sum(axis=(1, 2)))[None, :]
    return np.sqrt(squares) / norms


def composition_work(cfg: TransformerConfig) -> int:
    """Multiply-adds of `composition_scores`: per mode, d·r² for each pair of heads in different layers (and
    the factors' QR decompositions and the baseline's samples, small beside it)."""
    H, L, d, r = cfg.n_heads, cfg.n_layers, cfg.d_model, cfg.d_head
    pairs = H * H * L * (L - 1) // 2
    return 3 * pairs * d * r * r + (3 * L * H + BASELINE_SAMPLES) * 4 * d * r * r


@dataclass(frozen=True)
class Composition:
    heads: list[str]  # "L0H0", "L0H1", ..., every head in layer order
    q: np.ndarray  # [later head, earlier head]; NaN where the earlier head is not in an earlier layer
    k: np.ndarray
    v: np.ndarray
    baseline: float  # the mean score of random factors of the same shapes
    baseline_std: float


BASELINE_SAMPLES = 64


@functools.lru_cache(maxsize=64)
def composition_baseline(
    d_model: int, d_head: int, samples: int = BASELINE_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The composition score of Gaussian factors of these shapes: (mean, standard deviation)."""
    rng = np.random.default_rng(seed)
    scores = []
    for _sample in range(samples):
        A1, A2 = rng.standard_normal((2, 1, d_model, d_head))
        B1, B2 = rng.standard_normal((2, 1, d_head, d_model))
        scores.append(composition_score(A1, B1, A2, B2)[0, 0])
    return float(np.mean(scores)), float(np.std(scores))


def composition_scores(params: Params, cfg: TransformerConfig) -> Composition:
    """Q-, K- and V-composition between every pair of heads in different layers (see the module docstring)."""
    w = folded_heads(params, cfg)
    L, H = cfg.n_layers, cfg.n_heads
    flat = {k: v.reshape(L * H, *v.shape[2:]) for k, v in w.items()}
    WV, WO, WQ, WK = flat["W_V"], flat["W_O"], flat["W_Q"], flat["W_K"]
    Kt = np.swapaxes(WK, -1, -2)  # [heads, d_head, d_model]
    Qt = np.swapaxes(WQ, -1, -2)
    scores = {mode: np.full((L * H, L * H), np.nan) for mode in "qkv"}
    for layer in range(1, L):  # later heads of this layer against every head of the layers before
        later, before = slice(layer * H, (layer + 1) * H), slice(0, layer * H)
        A1, B1 = WV[before], WO[before]  # the earlier heads' W_OV = W_V W_O
        scores["q"][later, before] = composition_score(A1, B1, WQ[later], Kt[later])  # W_QK = W_Q W_Kᵀ
        scores["k"][later, before] = composition_score(A1, B1, WK[later], Qt[later])  # W_QKᵀ = W_K W_Qᵀ
        scores["v"][later, before] = composition_score(A1, B1, WV[later], WO[later])
    mean, std = composition_baseline(cfg.d_model, cfg.d_head)
    return Composition(
        [f"L{la}H{h}" for la in range(L) for h in range(H)], scores["q"], scores["k"], scores["v"], mean, std
    )


# ------------------------------------------------------------------ OV circuit and copying


@dataclass(frozen=True)
class OVCircuit:
    layer: int
    head: int
    copying_score: float  # Σλ / Σ|λ| over the eigenvalues of the full OV circuit: 1 = a pure copier
    eigenvalues: np.ndarray  # complex [d_head], largest |λ| first
    sources: np.ndarray  # token ids [n_sources]
    logits: np.ndarray  # [n_sources, d_vocab], the circuit's row for each source token

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each source's k highest output tokens and their logits, highest first.  # -> [n, k] twice"""
        k = min(k, self.logits.shape[-1])
        ids = np.argsort(-self.logits, axis=-1, kind="stable")[:, :k]
        return ids, np.take_along_axis(self.logits, ids, axis=-1)

    @property
    def self_rank(self) -> np.ndarray:
        """Where each source token itself ranks among its own row's outputs (0: top).  # [n_sources]"""
        own = self.logits[np.arange(len(self.sources)), self.sources]
        return (self.logits > own[:, None]).sum(-1)


def ov_work(cfg: TransformerConfig, n_sources: int) -> int:
    """Multiply-adds of `ov_circuit`: the vocabulary through W_V (and W_O, W_U) once, and each source's row."""
    return 2 * cfg.d_vocab * cfg.d_model * cfg.d_head + n_sources * cfg.d_model * cfg.d_vocab


def ov_circuit(params: Params, cfg: TransformerConfig, layer: int, head: int, sources) -> OVCircuit:
    """The head's OV circuit read from the token embeddings to the logits: W_E W_V W_O W_U with the norms'
    gains folded in and layer-norm centring (positions, scales and biases aside; see the module docstring)."""
    require_pre_norm(cfg, _("the OV circuit"))
    if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
        raise InputError(
            _(
                "layer {layer}, head {head} does not exist: the model has {n_layers} "
                "layer(s) of {n_heads} head(s), counted from 0"
            ).format(layer=layer, head=head, n_layers=cfg.n_layers, n_heads=cfg.n_heads)
        )
    sources = np.asarray(sources, dtype=np.int64)
    if sources.ndim != 1 or ((sources < 0) | (sources >= cfg.d_vocab)).any():
        raise InputError(_("source tokens must be ids in 0..{last}").format(last=cfg.d_vocab - 1))
    w = per_head_weights(params["blocks"][layer]["attn"], cfg)
    W_V = _gain(params["blocks"][layer]["ln1"]) * w["W_V"][cfg.kv_head(head)].astype(np.float64)  # [d_model, d_head]
    W_O = _centre(w["W_O"][head].astype(np.float64), cfg)  # [d_head, d_model]
    W_E = _centre(params["embed"]["W_E"].astype(np.float64), cfg)  # [d_vocab, d_model]
    W_U = unembedding(params)[0].astype(np.float64)
    W_U = _gain(params.get("ln_final", {})) * W_U  # [d_model, d_vocab]
    E_V = W_E @ W_V  # [d_vocab, d_head]
    O_U = W_O @ W_U  # [d_head, d_vocab]
    eig = np.linalg.eigvals(O_U @ E_V)  # the nonzero eigenvalues of E_V @ O_U, [d_head]
    eig = eig[np.argsort(-np.abs(eig), kind="stable")]
    copying = float(eig.real.sum() / np.abs(eig).sum()) if np.abs(eig).sum() > 0 else 0.0
    return OVCircuit(layer, head, copying, eig, sources, E_V[sources] @ O_U)
