"""A configurable Transformer, read top to bottom: parameters, hook names, block, forward.

Parameters are plain nested dicts of arrays whose keys are TransformerLens' names.
The attention projections are stored fused, as GPT-2 stores them (`W_QKV` with columns
[Q of every head | K | V]), so one matrix multiply yields every head's queries, keys and
values; `per_head_weights` gives TransformerLens' per-head views of the same numbers.

The forward pass works on one sequence of token ids ([pos], no batch axis) so shapes
read exactly as the spec prints them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import numpy as np

from .attention import merge_heads, scaled_dot_product_attention, split_heads
from .config import TransformerConfig
from .functional import ACTIVATIONS, layer_norm, softmax
from .positions import apply_rotary, sinusoidal

Params = dict
Ablation = Literal["zero", "mean"]


# ---------------------------------------------------------------------------- parameters

def init_params(cfg: TransformerConfig, seed: int = 0, dtype=np.float64) -> Params:
    """Random weights: N(0, 1/fan_in) matrices (as the spec initialises), zero biases, unit gains.

    Scaling by 1/√fan_in keeps activations near unit size at every width, so attention
    patterns of a random model are neither uniform nor one-hot.
    """
    rng = np.random.default_rng(seed)
    d, h, dh, dm = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp

    def matrix(fan_in: int, *shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(dtype)

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def norm() -> dict:
        return {"w": np.ones(d, dtype=dtype), "b": zeros(d)} if cfg.normalization_type == "LN" else {}

    params: Params = {"embed": {"W_E": matrix(d, cfg.d_vocab, d)}}
    if cfg.positional_embedding_type == "learned":
        params["pos_embed"] = {"W_pos": matrix(d, cfg.n_ctx, d)}
    if cfg.n_token_types:
        params["token_type_embed"] = {"W_token_type": matrix(d, cfg.n_token_types, d)}
    if cfg.block_type == "post_norm":
        params["ln_embed"] = norm()
    blocks = []
    for _ in range(cfg.n_layers):
        attn = {"W_QKV": matrix(d, d, 3 * h * dh), "W_O": matrix(h * dh, h * dh, d)}
        mlp = {"W_in": matrix(d, d, dm), "W_out": matrix(dm, dm, d)}
        if cfg.bias:
            attn |= {"b_QKV": zeros(3 * h * dh), "b_O": zeros(d)}
            mlp |= {"b_in": zeros(dm), "b_out": zeros(d)}
        blocks.append({"ln1": norm(), "attn": attn} if cfg.attn_only else
                      {"ln1": norm(), "attn": attn, "ln2": norm(), "mlp": mlp})
    params["blocks"] = blocks
    if cfg.block_type == "pre_norm":
        params["ln_final"] = norm()
    if not cfg.tied_embeddings:
        params["unembed"] = {"W_U": matrix(d, d, cfg.d_vocab)}
        if cfg.bias:
            params["unembed"]["b_U"] = zeros(cfg.d_vocab)
    return params


def iter_arrays(params: Mapping | list, prefix: str = "") -> Iterable[tuple[str, np.ndarray]]:
    """Every array the model holds, with its dotted name ("blocks.0.attn.W_QKV")."""
    items = enumerate(params) if isinstance(params, list) else params.items()
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, np.ndarray):
            yield name, value
        else:
            yield from iter_arrays(value, name + ".")


def unembedding(params: Params) -> tuple[np.ndarray, np.ndarray | None]:
    """W_U [d_model, d_vocab] (W_E transposed when tied: a view, no copy) and b_U."""
    if "unembed" in params:
        return params["unembed"]["W_U"], params["unembed"].get("b_U")
    return params["embed"]["W_E"].T, None


def per_head_weights(attn: Mapping, cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """TransformerLens' per-head views of the fused weights (views where the layout allows).

    W_Q, W_K, W_V: [n_heads, d_model, d_head]; W_O: [n_heads, d_head, d_model].
    """
    h, dh = cfg.n_heads, cfg.d_head
    W_Q, W_K, W_V = (w.reshape(-1, h, dh).transpose(1, 0, 2) for w in np.split(attn["W_QKV"], 3, axis=-1))
    return {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": attn["W_O"].reshape(h, dh, -1)}


# ---------------------------------------------------------------------------- hook names

def hook_names(cfg: TransformerConfig) -> list[str]:
    """The activation names a full run caches, in the order the forward pass makes them."""
    names = ["hook_embed"]
    if cfg.positional_embedding_type in ("learned", "sinusoidal"):
        names.append("hook_pos_embed")
    if cfg.n_token_types:
        names.append("hook_token_type_embed")
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        names += [b + "hook_resid_pre", b + "attn.hook_q", b + "attn.hook_k", b + "attn.hook_v"]
        if cfg.positional_embedding_type == "rotary":
            names += [b + "attn.hook_rot_q", b + "attn.hook_rot_k"]
        names += [b + "attn.hook_attn_scores", b + "attn.hook_pattern", b + "attn.hook_z", b + "hook_attn_out"]
        if not cfg.attn_only:  # an attention-only block adds attn_out straight to resid_post (as TransformerLens)
            names += [b + "hook_resid_mid", b + "mlp.hook_pre", b + "mlp.hook_post", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    if cfg.block_type == "pre_norm":
        names.append("ln_final.hook_normalized")
    return names


# Shapes of each hook, in TransformerLens' axis names (no batch axis here).
HOOK_SHAPES = {
    "hook_embed": "[pos, d_model]",
    "hook_pos_embed": "[pos, d_model]",
    "hook_token_type_embed": "[pos, d_model]",
    "hook_resid_pre": "[pos, d_model]",
    "attn.hook_q": "[pos, head_index, d_head]",
    "attn.hook_k": "[pos, head_index, d_head]",
    "attn.hook_v": "[pos, head_index, d_head]",
    "attn.hook_rot_q": "[pos, head_index, d_head]",
    "attn.hook_rot_k": "[pos, head_index, d_head]",
    "attn.hook_attn_scores": "[head_index, query_pos, key_pos]",
    "attn.hook_pattern": "[head_index, query_pos, key_pos]",
    "attn.hook_z": "[pos, head_index, d_head]",
    "hook_attn_out": "[pos, d_model]",
    "hook_resid_mid": "[pos, d_model]",
    "mlp.hook_pre": "[pos, d_mlp]",
    "mlp.hook_post": "[pos, d_mlp]",
    "hook_mlp_out": "[pos, d_model]",
    "hook_resid_post": "[pos, d_model]",
    "ln_final.hook_normalized": "[pos, d_model]",
}


def hook_shape(name: str) -> str:
    """The axis names of a hook: "blocks.3.attn.hook_q" -> "[pos, head_index, d_head]"."""
    key = name.split(".", 2)[2] if name.startswith("blocks.") else name
    return HOOK_SHAPES[key]


# ---------------------------------------------------------------------------- forward pass

class _Recorder:
    """Collects activations by hook name; keeps references (no copies), only those asked for."""

    def __init__(self, names: Iterable[str] | None):
        self.wanted = None if names is None else set(names)
        self.cache: dict[str, np.ndarray] = {}

    def wants(self, name: str) -> bool:
        return self.wanted is None or name in self.wanted

    def __call__(self, name: str, value: np.ndarray) -> np.ndarray:
        if self.wants(name):
            self.cache[name] = value
        return value


def _norm(x: np.ndarray, ln: Mapping, cfg: TransformerConfig) -> np.ndarray:
    return layer_norm(x, ln.get("w"), ln.get("b"), cfg.eps)


def attention_block(
    x: np.ndarray,  # [pos, d_model], the sub-layer's (normalised) input
    attn: Mapping,
    cfg: TransformerConfig,
    hook: Callable[[str, np.ndarray], np.ndarray],
    prefix: str,
    ablate: Mapping[int, Ablation] | None = None,
) -> np.ndarray:  # -> [pos, d_model]
    qkv = x @ attn["W_QKV"]  # [pos, 3 * n_heads * d_head]
    if "b_QKV" in attn:
        qkv += attn["b_QKV"]
    q, k, v = (split_heads(m, cfg.n_heads) for m in np.split(qkv, 3, axis=-1))  # each [n_heads, pos, d_head]
    for name, m in (("q", q), ("k", k), ("v", v)):
        hook(f"{prefix}attn.hook_{name}", m.swapaxes(0, 1))  # stored as [pos, head_index, d_head]
    if cfg.positional_embedding_type == "rotary":
        q, k = apply_rotary(q), apply_rotary(k)
        hook(f"{prefix}attn.hook_rot_q", q.swapaxes(0, 1))
        hook(f"{prefix}attn.hook_rot_k", k.swapaxes(0, 1))
    # The [n_heads, pos, pos] scores and pattern are the largest activations: build them only
    # when a hook keeps them (a hook without `wants` is assumed to want everything).
    wants = getattr(hook, "wants", None)
    keep = wants is None or wants(f"{prefix}attn.hook_attn_scores") or wants(f"{prefix}attn.hook_pattern")
    scores, pattern, z = scaled_dot_product_attention(
        q, k, v, causal=cfg.causal, scale=cfg.use_attn_scale, temperature=cfg.attn_temperature, keep=keep
    )  # [n_heads, query_pos, key_pos] twice (None unless kept), z [n_heads, pos, d_head]
    if keep:
        hook(f"{prefix}attn.hook_attn_scores", scores)
        hook(f"{prefix}attn.hook_pattern", pattern)
    for head, how in (ablate or {}).items():
        z[head] = z[head].mean(axis=0) if how == "mean" else 0.0  # this head writes nothing (or its mean)
    hook(f"{prefix}attn.hook_z", z.swapaxes(0, 1))
    out = merge_heads(z) @ attn["W_O"]  # [pos, d_model]
    if "b_O" in attn:
        out += attn["b_O"]
    return out


def mlp_block(x: np.ndarray, mlp: Mapping, cfg: TransformerConfig, hook, prefix: str) -> np.ndarray:
    pre = x @ mlp["W_in"]  # [pos, d_mlp]
    if "b_in" in mlp:
        pre += mlp["b_in"]
    hook(f"{prefix}mlp.hook_pre", pre)
    post = hook(f"{prefix}mlp.hook_post", ACTIVATIONS[cfg.act_fn](pre))
    out = post @ mlp["W_out"]  # [pos, d_model]
    if "b_out" in mlp:
        out += mlp["b_out"]
    return out


def transformer_block(x, block: Mapping, cfg: TransformerConfig, hook, layer: int, ablate=None) -> np.ndarray:
    """Pre-norm (GPT-2): x + attn(ln1(x)), then + mlp(ln2(x)).
    Post-norm (BERT): ln1(x + attn(x)), then ln2(x + mlp(x)); hook_resid_mid and
    hook_resid_post are then the normalised hidden states the next sub-layer receives."""
    p = f"blocks.{layer}."
    hook(p + "hook_resid_pre", x)
    if cfg.attn_only:  # no MLP: the attention sub-layer is the whole block
        pre = cfg.block_type == "pre_norm"
        attn_out = hook(p + "hook_attn_out", attention_block(_norm(x, block["ln1"], cfg) if pre else x, block["attn"],
                                                             cfg, hook, p, ablate))
        return hook(p + "hook_resid_post", x + attn_out if pre else _norm(x + attn_out, block["ln1"], cfg))
    if cfg.block_type == "pre_norm":
        attn_out = hook(p + "hook_attn_out", attention_block(_norm(x, block["ln1"], cfg), block["attn"], cfg, hook, p, ablate))
        x = hook(p + "hook_resid_mid", x + attn_out)
        mlp_out = hook(p + "hook_mlp_out", mlp_block(_norm(x, block["ln2"], cfg), block["mlp"], cfg, hook, p))
        return hook(p + "hook_resid_post", x + mlp_out)
    attn_out = hook(p + "hook_attn_out", attention_block(x, block["attn"], cfg, hook, p, ablate))
    x = hook(p + "hook_resid_mid", _norm(x + attn_out, block["ln1"], cfg))
    mlp_out = hook(p + "hook_mlp_out", mlp_block(x, block["mlp"], cfg, hook, p))
    return hook(p + "hook_resid_post", _norm(x + mlp_out, block["ln2"], cfg))


def check_tokens(tokens: np.ndarray, cfg: TransformerConfig) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"expected a non-empty 1-D sequence of token ids, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() >= cfg.d_vocab:
        raise ValueError(f"token ids must lie in [0, {cfg.d_vocab}), got {tokens.min()}..{tokens.max()}")
    if cfg.positional_embedding_type == "learned" and tokens.size > cfg.n_ctx:
        raise ValueError(f"{tokens.size} tokens is longer than the model's context of n_ctx={cfg.n_ctx}")
    return tokens


def embed(params: Params, cfg: TransformerConfig, tokens: np.ndarray, hook, token_types=None) -> np.ndarray:
    """Token embedding plus position (and, for BERT, segment) embeddings.  # [pos] -> [pos, d_model]"""
    W_E = params["embed"]["W_E"]
    x = hook("hook_embed", W_E[tokens])  # row indexing is the embedding lookup
    n = tokens.size
    if cfg.positional_embedding_type == "learned":
        x = x + hook("hook_pos_embed", params["pos_embed"]["W_pos"][:n])
    elif cfg.positional_embedding_type == "sinusoidal":
        x = x + hook("hook_pos_embed", sinusoidal(n, cfg.d_model).astype(W_E.dtype))
    if cfg.n_token_types:
        types = np.zeros(n, dtype=np.int64) if token_types is None else np.asarray(token_types)
        x = x + hook("hook_token_type_embed", params["token_type_embed"]["W_token_type"][types])
    if cfg.block_type == "post_norm":
        x = _norm(x, params["ln_embed"], cfg)
    return x


def run_with_cache(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: bool = True,
) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
    """Run the model on token ids [pos]; return logits [pos, d_vocab] and the activation cache.

    names: keep only these hook names (None keeps all). ablate: {(layer, head): "zero"|"mean"}
    replaces that head's output z before W_O. logits=False skips the unembedding (encoders,
    or when only activations are wanted).
    """
    tokens = check_tokens(tokens, cfg)
    hook = _Recorder(names)
    by_layer: dict[int, dict[int, Ablation]] = {}
    for (layer, head), how in (ablate or {}).items():
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise ValueError(f"cannot ablate layer {layer} head {head}: the model has "
                             f"{cfg.n_layers} layers of {cfg.n_heads} heads")
        if how not in ("zero", "mean"):
            raise ValueError(f"ablation must be 'zero' or 'mean', got {how!r}")
        by_layer.setdefault(layer, {})[head] = how
    x = embed(params, cfg, tokens, hook, token_types)
    for layer, block in enumerate(params["blocks"]):
        x = transformer_block(x, block, cfg, hook, layer, by_layer.get(layer))
    if cfg.block_type == "pre_norm":
        x = hook("ln_final.hook_normalized", _norm(x, params["ln_final"], cfg))
    if not logits:
        return None, hook.cache
    W_U, b_U = unembedding(params)
    out = x @ W_U  # [pos, d_vocab]
    if b_U is not None:
        out += b_U
    return out, hook.cache


def next_token_probs(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities of the token after the last position.  # [pos, d_vocab] -> [d_vocab]"""
    return softmax(logits[-1] / temperature)
