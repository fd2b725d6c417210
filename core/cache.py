"""`run_with_cache` and the ActivationCache it returns: one run's activations, and the questions asked of them.

As in TransformerLens, a caller asks the cache a question instead of re-deriving the answer
from raw hooks: the four stages of one head's attention, the residual stream's norms, the
decomposition of the residual stream with direct logit attribution, the logit lens, head
detector scores, attention rollout, stacked activations. Each question needs some hooks;
the `*_hooks` functions name them, so a run can keep only those:

    names = stage_hooks(cfg, layer=0) + residual_hooks(cfg)
    logits, cache = run_with_cache(params, cfg, tokens, names=names)
    cache.attention_stages(0, head=2).weights          # [query_pos, key_pos]

The formulas themselves live in core/analysis.py as pure functions on arrays. ARCHITECTURE.md lists
where each number the app shows is computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np

from . import analysis
from .attention import attention_scale
from .cell import HeadVectors
from .config import TransformerConfig
from .errors import InputError
from .functional import softmax
from .i18n import _
from .model import Ablation, KVCache, Params, forward, per_head_weights


# The logits are there unless logits=False: the type checker is told which (an @overload each).
@overload
def run_with_cache(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: Literal[True] = True,
    past_kv: KVCache | None = None,
) -> tuple[np.ndarray, ActivationCache]: ...


@overload
def run_with_cache(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: Literal[False],
    past_kv: KVCache | None = None,
    stop_at_layer: int | None = None,
) -> tuple[None, ActivationCache]: ...


@overload
def run_with_cache(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: bool,
    past_kv: KVCache | None = None,
    stop_at_layer: int | None = None,
) -> tuple[np.ndarray | None, ActivationCache]: ...


def run_with_cache(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: bool = True,
    past_kv: KVCache | None = None,
    stop_at_layer: int | None = None,
) -> tuple[np.ndarray | None, ActivationCache]:
    """Run the model on token ids [pos]; return logits [pos, d_vocab] and the activation cache.

    The arguments are core.model.forward's: names keeps only those hooks (None keeps all),
    ablate replaces heads' outputs, logits=False stops before the unembedding, past_kv
    continues a sequence whose keys and values are cached (cache.past_kv then holds them all),
    stop_at_layer (with logits=False) runs only that many blocks (hooks.layers_needed(names)).
    """
    out, activations, kv = forward(
        params,
        cfg,
        tokens,
        names=names,
        ablate=ablate,
        token_types=token_types,
        logits=logits,
        past_kv=past_kv,
        stop_at_layer=stop_at_layer,
    )
    return out, ActivationCache(activations, params, cfg, np.asarray(tokens), out, kv)


# ------------------------------------------------------------------ what each question needs


def stage_hooks(cfg: TransformerConfig, layer: int) -> list[str]:
    """The hooks `attention_stages` needs for one layer: queries and keys (rotated, for rotary),
    scores and pattern."""
    b = f"blocks.{layer}.attn."
    qk = ("hook_rot_q", "hook_rot_k") if cfg.positional_embedding_type == "rotary" else ("hook_q", "hook_k")
    return [b + qk[0], b + qk[1], b + "hook_attn_scores", b + "hook_pattern"]


def residual_hooks(cfg: TransformerConfig) -> list[str]:
    """The hooks `residual_norms` needs: the embedding, and each layer's stream and what it adds."""
    names = ["hook_embed"]
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        names += [b + "hook_resid_pre", b + "hook_attn_out"]
        if not cfg.attn_only:
            names += [b + "hook_resid_mid", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    return names


def pattern_hooks(cfg: TransformerConfig) -> list[str]:
    """Every layer's attention pattern: what `stack_activation("attn.hook_pattern")`, the head
    detectors and rollout need."""
    return [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]


def decomposition_hooks(cfg: TransformerConfig) -> list[str]:
    """What `decompose_resid` needs: the embeddings, every head's z and MLP output, the last stream."""
    names = ["hook_embed", "hook_pos_embed", "hook_token_type_embed"]
    for layer in range(cfg.n_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        if not cfg.attn_only:
            names.append(f"blocks.{layer}.mlp.hook_post")
    return names + [f"blocks.{cfg.n_layers - 1}.hook_resid_post"]


# ------------------------------------------------------------------ answers


@dataclass(frozen=True)
class AttentionStages:
    """One head's attention, stage by stage.  Every array is [query_pos, key_pos]."""

    raw: np.ndarray  # Q Kᵀ
    scaled: np.ndarray  # raw / (√d_head · temperature)
    mask: np.ndarray  # True where forbidden
    masked: np.ndarray  # scaled with -inf where forbidden (hook_attn_scores)
    weights: np.ndarray  # softmax of each row (hook_pattern)


@dataclass(frozen=True)
class ResidualNorms:
    stream_names: list[str]  # "hook_embed", "0 resid_pre", "0 resid_mid", "0 resid_post", "1 resid_pre", ...
    stream: np.ndarray  # [pos, len(stream_names)], ‖x‖ of each token at each point of the stream
    writes_names: list[str]  # "0 attn_out", "0 mlp_out", ...
    writes: np.ndarray  # [pos, len(writes_names)], ‖what each sub-layer adds‖ per token


class ActivationCache(Mapping):
    """The activations of one run by hook name (a read-only mapping), with the run's parameters,
    config, tokens and logits, so that it can answer questions about the run."""

    def __init__(
        self,
        activations: dict[str, np.ndarray],
        params: Params,
        cfg: TransformerConfig,
        tokens: np.ndarray,
        logits: np.ndarray | None,
        past_kv: KVCache,
    ):
        self._activations = activations
        self.params = params
        self.cfg = cfg
        self.tokens = tokens  # [pos]
        self.logits = logits  # [pos, d_vocab], or None when the run stopped before the unembedding
        self.past_kv = past_kv  # every layer's keys and values, for continuing the sequence

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._activations[name]
        except KeyError:
            raise KeyError(f"{name!r} was not kept by this run: pass it in run_with_cache(names=...)") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    def stack_activation(self, name: str) -> np.ndarray:
        """One activation of every layer, stacked: stack_activation("attn.hook_pattern") ->
        [n_layers, head_index, query_pos, key_pos]."""
        return np.stack([self[f"blocks.{layer}.{name}"] for layer in range(self.cfg.n_layers)])

    def _check_head(self, layer: int, head: int) -> None:
        cfg = self.cfg
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise InputError(
                _(
                    "layer {layer}, head {head} does not exist: the model has {n_layers} "
                    "layer(s) of {n_heads} head(s), counted from 0"
                ).format(layer=layer, head=head, n_layers=cfg.n_layers, n_heads=cfg.n_heads)
            )

    def attention_stages(self, layer: int, head: int) -> AttentionStages:
        """Raw, scaled and masked scores and the weights of one query head (needs `stage_hooks`).

        Under grouped-query attention the keys are those of the head's key/value head, cfg.kv_head(head)."""
        cfg = self.cfg
        self._check_head(layer, head)
        q_name, k_name, scores_name, pattern_name = stage_hooks(cfg, layer)
        q = self[q_name][:, head]  # [pos, d_head]
        k = self[k_name][:, cfg.kv_head(head)]  # the key/value head this query head shares with its group
        raw = q @ k.T  # [query_pos, key_pos]
        scaled = raw / attention_scale(cfg.d_head, cfg.use_attn_scale, cfg.attn_temperature)
        masked = self[scores_name][head]
        return AttentionStages(raw, scaled, np.isneginf(masked), masked, self[pattern_name][head])

    def head_vectors(self, layer: int, head: int) -> HeadVectors:
        """One query head's q, k, v and z, [pos, d_head] each (needs `stage_hooks` and `core.cell.cell_hooks`):
        the queries and keys its scores use (rotated, for rotary, with the unrotated ones beside them), and
        the keys and values of its key/value head under grouped-query attention."""
        self._check_head(layer, head)
        cfg, b = self.cfg, f"blocks.{layer}.attn."
        q_name, k_name = stage_hooks(cfg, layer)[:2]
        kv = cfg.kv_head(head)
        rotary = cfg.positional_embedding_type == "rotary"
        one = lambda name, h: np.ascontiguousarray(self[name][:, h])  # noqa: E731  a copy: not the layer's array
        return HeadVectors(
            layer,
            head,
            kv,
            one(q_name, head),
            one(k_name, kv),
            one(b + "hook_v", kv),
            one(b + "hook_z", head),
            one(b + "hook_q", head) if rotary else None,
            one(b + "hook_k", kv) if rotary else None,
        )

    def residual_norms(self) -> ResidualNorms:
        """Per-token L2 norms along the residual stream and of what each sub-layer adds (needs `residual_hooks`)."""
        stream_names, stream = ["hook_embed"], [self["hook_embed"]]
        writes_names, writes = [], []
        attn_only = self.cfg.attn_only  # no resid_mid and no MLP: the block is its attention
        for layer in range(self.cfg.n_layers):
            b = f"blocks.{layer}."
            for point in ("resid_pre", "resid_post") if attn_only else ("resid_pre", "resid_mid", "resid_post"):
                stream_names.append(f"{layer} {point}")
                stream.append(self[b + "hook_" + point])
            for part in ("attn_out",) if attn_only else ("attn_out", "mlp_out"):
                writes_names.append(f"{layer} {part}")
                writes.append(self[b + "hook_" + part])
        norms = lambda arrays: np.stack([np.linalg.norm(a, axis=-1) for a in arrays], axis=-1)  # noqa: E731  [pos, n]
        return ResidualNorms(stream_names, norms(stream), writes_names, norms(writes))

    def decompose_resid(self, token: int, pos: int = -1) -> analysis.ResidualDecomposition:
        """Split the last residual stream at `pos` into what each component added, and attribute
        `token`'s logit to the parts (needs `decomposition_hooks` and the logits).

        In a pre-norm model every sub-layer adds its output to the residual stream, so the final
        stream is exactly the sum of the embeddings, every head's z[h] @ W_O[h], every attention
        bias b_O, every MLP's post @ W_out and every MLP bias b_out.
        """
        cfg, params = self.cfg, self.params
        require_pre_norm(cfg, _("the residual-stream decomposition"))
        pos, token = check_position(pos, self.tokens.size), check_token(token, cfg)
        if self.logits is None:
            raise ValueError(_("decompose_resid needs the logits: run with logits=True"))
        labels, parts = ["embed"], [self["hook_embed"][pos]]
        for name, label in (("hook_pos_embed", "pos_embed"), ("hook_token_type_embed", "token_type_embed")):
            if name in self:
                labels.append(label)
                parts.append(self[name][pos])
        for layer, block in enumerate(params["blocks"]):
            W_O = per_head_weights(block["attn"], cfg)["W_O"]  # [n_heads, d_head, d_model]
            z = self[f"blocks.{layer}.attn.hook_z"][pos]  # [n_heads, d_head]
            labels += [f"L{layer}H{h}" for h in range(cfg.n_heads)]
            parts += list(np.einsum("hd,hdm->hm", z, W_O))  # each head's write [d_model]
            if "b_O" in block["attn"]:
                labels.append(f"L{layer} attn bias")
                parts.append(block["attn"]["b_O"])
            if cfg.attn_only:
                continue  # no MLP writes to the stream
            labels.append(f"L{layer} mlp")
            parts.append(self[f"blocks.{layer}.mlp.hook_post"][pos] @ block["mlp"]["W_out"])  # [d_model]
            if "b_out" in block["mlp"]:
                labels.append(f"L{layer} mlp bias")
                parts.append(block["mlp"]["b_out"])
        parts_arr = np.stack(parts)  # [n_parts, d_model]
        resid = self[f"blocks.{cfg.n_layers - 1}.hook_resid_post"][pos]  # [d_model]
        direct_logit, logit_bias, scale = analysis.direct_logit_attribution(parts_arr, resid, token, params, cfg)
        return analysis.ResidualDecomposition(
            pos, token, labels, parts_arr, direct_logit, logit_bias, scale, float(self.logits[pos, token])
        )

    def logit_lens(self, k: int = 5) -> analysis.LogitLens:
        """Decode every point of `analysis.lens_points` as if it were the last (needs those hooks).

        One point at a time, so the largest array is [pos, d_vocab] rather than
        [n_points, pos, d_vocab] (GPT-2's vocabulary is 50,257 wide). The last point is the
        model's own output."""
        cfg = self.cfg
        require_pre_norm(cfg, _("the logit lens"))
        if not isinstance(k, (int, np.integer)) or not 1 <= k <= cfg.d_vocab:
            raise InputError(
                _("k={k!r} must be between 1 and the vocabulary size {d_vocab}").format(k=k, d_vocab=cfg.d_vocab)
            )
        points = analysis.lens_points(cfg)
        n = self.tokens.size
        top_ids = np.empty((len(points), n, k), dtype=np.int64)
        top_probs = np.empty((len(points), n, k))
        for i, point in enumerate(points):
            probs = softmax(analysis.lens_logits(self.params, cfg, self[point]))  # [pos, d_vocab]
            top_ids[i] = top_k_ids(probs, k)
            top_probs[i] = np.take_along_axis(probs, top_ids[i], axis=-1)
        return analysis.LogitLens(points, top_ids, top_probs)

    def head_detector_scores(self) -> dict[str, np.ndarray]:
        """Previous-token, duplicate-token and induction scores of every head on this run's tokens
        (needs `pattern_hooks`).  # -> {name: [n_layers, n_heads]}"""
        return analysis.head_detector_scores(self.stack_activation("attn.hook_pattern"), self.tokens)

    def rollout(self) -> np.ndarray:
        """Attention rollout after every layer (needs `pattern_hooks`).  # -> [n_layers, query_pos, key_pos]"""
        return analysis.attention_rollout(self.stack_activation("attn.hook_pattern"))


def top_k_ids(probs: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries of each row, largest first, ties to the lower id: a full stable argsort's
    first k, without sorting the whole vocabulary (a 150,000-token row takes 30× longer to sort than
    to partition).  # [pos, d_vocab] -> [pos, k]"""
    if k >= probs.shape[-1]:
        return np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    kth = -np.partition(-probs, k - 1, axis=-1)[:, k - 1]  # each row's k-th largest value
    out = np.empty((probs.shape[0], k), dtype=np.int64)
    for row, (p, cut) in enumerate(zip(probs, kth)):
        candidates = np.flatnonzero(p >= cut)  # ascending ids: k of them, more if the k-th value is tied
        out[row] = candidates[np.argsort(-p[candidates], kind="stable")[:k]]
    return out


# ------------------------------------------------------------------ checks


def require_pre_norm(cfg: TransformerConfig, what: str) -> None:
    if cfg.block_type != "pre_norm":
        raise InputError(
            _(
                "{what} needs a pre-norm model (GPT-2 style, with a final layer norm); "
                "this model is {block_type}, whose residual stream is re-normalised in "
                "every block"
            ).format(what=what, block_type=cfg.block_type)
        )


def check_position(pos: int, n: int) -> int:
    if not isinstance(pos, (int, np.integer)) or not -n <= pos < n:
        raise InputError(
            _("position {pos!r} is outside the text's {n} tokens (use 0..{last}, or -1 for the last)").format(
                pos=pos, n=n, last=n - 1
            )
        )
    return int(pos) % n


def check_token(token: int, cfg: TransformerConfig) -> int:
    if not isinstance(token, (int, np.integer)) or not 0 <= token < cfg.d_vocab:
        raise InputError(
            _("token id {token!r} is outside the vocabulary 0..{last}").format(token=token, last=cfg.d_vocab - 1)
        )
    return int(token)
