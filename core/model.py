"""A configurable Transformer, read top to bottom: parameters, hook names, block, forward.

Parameters are plain nested dicts of arrays whose keys are TransformerLens' names.
The attention projections are stored fused, as GPT-2 stores them (`W_QKV` with columns
[Q of every head | K | V]), so one matrix multiply yields every head's queries, keys and
values; `per_head_weights` gives TransformerLens' per-head views of the same numbers.

The forward pass works on one sequence of token ids ([pos], no batch axis) so shapes
read exactly as the spec prints them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .attention import merge_heads, scaled_dot_product_attention, split_heads
from .config import TransformerConfig
from .errors import InputError
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
        blocks.append({"ln1": norm(), "attn": attn, "ln2": norm(), "mlp": mlp})
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
        names += [b + "attn.hook_attn_scores", b + "attn.hook_pattern", b + "attn.hook_z",
                  b + "hook_attn_out", b + "hook_resid_mid", b + "mlp.hook_pre", b + "mlp.hook_post",
                  b + "hook_mlp_out", b + "hook_resid_post"]
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


def hook_dims(name: str, cfg: TransformerConfig, n_tokens: int) -> list[int]:
    """A hook's concrete shape for a run of n_tokens: "blocks.0.attn.hook_pattern" -> [n_heads, n, n]."""
    sizes = {"pos": n_tokens, "query_pos": n_tokens, "key_pos": n_tokens, "head_index": cfg.n_heads,
             "d_head": cfg.d_head, "d_model": cfg.d_model, "d_mlp": cfg.d_mlp, "d_vocab": cfg.d_vocab}
    return [sizes[axis.strip()] for axis in hook_shape(name).strip("[]").split(",")]


# ---------------------------------------------------------------------------- forward pass

class _Recorder:
    """Collects activations by hook name; keeps references (no copies), only those asked for.

    `empty` gives the memory for an activation about to be made. A kept activation of some size is
    a slice of a 32 MiB block starting on a 2 MiB boundary, for which NumPy asks the kernel for huge
    pages: keeping every activation then costs a page fault per 2 MiB instead of one per 4 KiB
    (GPT-2 small at 512 tokens: ~45,000 faults, most of what a full capture cost beyond the
    logits-only pass, whose freed temporaries are reused without faults)."""

    BLOCK_BYTES = 32 << 20
    HUGE_PAGE = 2 << 20
    SMALL_BYTES = 64 << 10  # below this an activation comes from the heap as usual

    def __init__(self, names: Iterable[str] | None):
        self.wanted = None if names is None else set(names)
        self.cache: dict[str, np.ndarray] = {}
        self._block, self._used = np.empty(0, np.uint8), 0

    def wants(self, name: str) -> bool:
        return self.wanted is None or name in self.wanted

    def empty(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.wants(name) or not self.SMALL_BYTES <= nbytes <= self.BLOCK_BYTES // 2:
            return np.empty(shape, dtype)  # a temporary (freed memory is reused), small, or big enough alone
        if self._used + nbytes > self._block.size:
            self._block = np.empty(self.BLOCK_BYTES + self.HUGE_PAGE, np.uint8)
            self._used = -self._block.ctypes.data % self.HUGE_PAGE  # start on a huge-page boundary
        out = self._block[self._used:self._used + nbytes].view(dtype).reshape(shape)
        self._used += -(-nbytes // 64) * 64  # the next one starts 64-byte aligned
        return out

    def __call__(self, name: str, value: np.ndarray) -> np.ndarray:
        if self.wants(name):
            self.cache[name] = value
        return value


def _no_hook(name: str, value: np.ndarray) -> np.ndarray:
    return value


def _empty(hook, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Memory for the activation `name` (the recorder's, when the hook is one)."""
    alloc = getattr(hook, "empty", None)
    return alloc(name, shape, dtype) if alloc else np.empty(shape, dtype)


def norm(x: np.ndarray, ln: Mapping, cfg: TransformerConfig) -> np.ndarray:
    """The model's layer norm: with gain and bias for "LN", scale-free for "LNPre" (an empty dict)."""
    return layer_norm(x, ln.get("w"), ln.get("b"), cfg.eps)


@dataclass(frozen=True)
class KVCache:
    """Every layer's keys and values of the tokens seen so far (keys already rotated, for rotary).

    A pass given `past_kv` computes q, k, v for its new tokens only, appends k and v here and lets
    the new queries attend to every cached key: the same numbers as re-running the whole sequence.
    """

    keys: tuple[np.ndarray, ...]  # per layer [n_heads, pos, d_head]
    values: tuple[np.ndarray, ...]  # per layer [n_heads, pos, d_head]

    @classmethod
    def empty(cls, cfg: TransformerConfig, dtype) -> KVCache:
        none = np.zeros((cfg.n_heads, 0, cfg.d_head), dtype=dtype)
        return cls((none,) * cfg.n_layers, (none,) * cfg.n_layers)

    @property
    def n_tokens(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))


def attention_block(
    x: np.ndarray,  # [pos, d_model], the sub-layer's (normalised) input
    attn: Mapping,
    cfg: TransformerConfig,
    hook: Callable[[str, np.ndarray], np.ndarray],
    prefix: str,
    ablate: Mapping[int, Ablation] | None = None,
    past: tuple[np.ndarray, np.ndarray] | None = None,  # this layer's cached K, V [n_heads, past, d_head]
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:  # -> [pos, d_model], (K, V) including this pass
    W_QKV = attn["W_QKV"]
    qkv = np.matmul(x, W_QKV, out=_empty(hook, f"{prefix}attn.hook_q", (x.shape[0], W_QKV.shape[1]),
                                         np.result_type(x, W_QKV)))  # [pos, 3 * n_heads * d_head]
    if "b_QKV" in attn:
        qkv += attn["b_QKV"]
    q, k, v = (split_heads(m, cfg.n_heads) for m in np.split(qkv, 3, axis=-1))  # each [n_heads, pos, d_head]
    for name, m in (("q", q), ("k", k), ("v", v)):
        hook(f"{prefix}attn.hook_{name}", m.swapaxes(0, 1))  # stored as [pos, head_index, d_head]
    start = 0 if past is None else past[0].shape[1]  # the new tokens' first position
    if cfg.positional_embedding_type == "rotary":
        positions = np.arange(start, start + x.shape[0])
        q, k = apply_rotary(q, positions), apply_rotary(k, positions)
        hook(f"{prefix}attn.hook_rot_q", q.swapaxes(0, 1))
        hook(f"{prefix}attn.hook_rot_k", k.swapaxes(0, 1))
    if past is not None:  # the new queries see every cached key, then their own
        k, v = np.concatenate([past[0], k], axis=1), np.concatenate([past[1], v], axis=1)
    # The [n_heads, pos, pos] scores and pattern are the largest activations: build them only
    # when a hook keeps them (a hook without `wants` is assumed to want everything).
    wants = getattr(hook, "wants", None)
    keep = wants is None or wants(f"{prefix}attn.hook_attn_scores") or wants(f"{prefix}attn.hook_pattern")
    z = _empty(hook, f"{prefix}attn.hook_z", q.shape[:-1] + v.shape[-1:], np.result_type(q, k, v))
    scores, pattern, z = scaled_dot_product_attention(
        q, k, v, causal=cfg.causal, scale=cfg.use_attn_scale, temperature=cfg.attn_temperature, keep=keep, out=z
    )  # [n_heads, query_pos, key_pos] twice (None unless kept), z [n_heads, pos, d_head]
    if keep:
        hook(f"{prefix}attn.hook_attn_scores", scores)
        hook(f"{prefix}attn.hook_pattern", pattern)
    for head, how in (ablate or {}).items():
        z[head] = z[head].mean(axis=0) if how == "mean" else 0.0  # this head writes nothing (or its mean)
    hook(f"{prefix}attn.hook_z", z.swapaxes(0, 1))
    W_O = attn["W_O"]
    out = np.matmul(merge_heads(z), W_O, out=_empty(hook, f"{prefix}hook_attn_out", (x.shape[0], W_O.shape[1]),
                                                     np.result_type(z, W_O)))  # [pos, d_model]
    if "b_O" in attn:
        out += attn["b_O"]
    return out, (k, v)


def mlp_block(x: np.ndarray, mlp: Mapping, cfg: TransformerConfig, hook, prefix: str) -> np.ndarray:
    W_in = mlp["W_in"]
    pre = np.matmul(x, W_in, out=_empty(hook, f"{prefix}mlp.hook_pre", (x.shape[0], W_in.shape[1]),
                                        np.result_type(x, W_in)))  # [pos, d_mlp]
    if "b_in" in mlp:
        pre += mlp["b_in"]
    hook(f"{prefix}mlp.hook_pre", pre)
    post = hook(f"{prefix}mlp.hook_post", ACTIVATIONS[cfg.act_fn](pre))
    W_out = mlp["W_out"]
    out = np.matmul(post, W_out, out=_empty(hook, f"{prefix}hook_mlp_out", (x.shape[0], W_out.shape[1]),
                                            np.result_type(post, W_out)))  # [pos, d_model]
    if "b_out" in mlp:
        out += mlp["b_out"]
    return out


def transformer_block(x, block: Mapping, cfg: TransformerConfig, hook, layer: int, ablate=None, past=None
                      ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Pre-norm (GPT-2): x + attn(ln1(x)), then + mlp(ln2(x)).
    Post-norm (BERT): ln1(x + attn(x)), then ln2(x + mlp(x)); hook_resid_mid and
    hook_resid_post are then the normalised hidden states the next sub-layer receives.
    Returns the block's output and this layer's keys and values (with `past`'s before them)."""
    p = f"blocks.{layer}."
    hook(p + "hook_resid_pre", x)
    if cfg.block_type == "pre_norm":
        attn_out, kv = attention_block(norm(x, block["ln1"], cfg), block["attn"], cfg, hook, p, ablate, past)
        mid = _empty(hook, p + "hook_resid_mid", x.shape, np.result_type(x, attn_out))
        x = hook(p + "hook_resid_mid", np.add(x, hook(p + "hook_attn_out", attn_out), out=mid))
        mlp_out = hook(p + "hook_mlp_out", mlp_block(norm(x, block["ln2"], cfg), block["mlp"], cfg, hook, p))
        post = _empty(hook, p + "hook_resid_post", x.shape, np.result_type(x, mlp_out))
        return hook(p + "hook_resid_post", np.add(x, mlp_out, out=post)), kv
    attn_out, kv = attention_block(x, block["attn"], cfg, hook, p, ablate, past)
    x = hook(p + "hook_resid_mid", norm(x + hook(p + "hook_attn_out", attn_out), block["ln1"], cfg))
    mlp_out = hook(p + "hook_mlp_out", mlp_block(x, block["mlp"], cfg, hook, p))
    return hook(p + "hook_resid_post", norm(x + mlp_out, block["ln2"], cfg)), kv


def check_tokens(tokens: np.ndarray, cfg: TransformerConfig, start: int = 0) -> np.ndarray:
    """Token ids [pos] that this model can read at positions start, start + 1, ..."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise InputError(f"expected a non-empty 1-D sequence of token ids, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() >= cfg.d_vocab:
        raise InputError(f"token ids must lie in [0, {cfg.d_vocab}), got {tokens.min()}..{tokens.max()}")
    if cfg.positional_embedding_type == "learned" and start + tokens.size > cfg.n_ctx:
        raise InputError(f"{start + tokens.size} tokens is longer than the model's context of n_ctx={cfg.n_ctx}")
    return tokens


def embed(params: Params, cfg: TransformerConfig, tokens: np.ndarray, hook, token_types=None,
          start: int = 0) -> np.ndarray:
    """Token embedding plus position (and, for BERT, segment) embeddings.  # [pos] -> [pos, d_model]

    `start` is the first token's position (after a KV cache's tokens)."""
    W_E = params["embed"]["W_E"]
    x = hook("hook_embed", W_E[tokens])  # row indexing is the embedding lookup
    n = tokens.size
    if cfg.positional_embedding_type == "learned":
        x = x + hook("hook_pos_embed", params["pos_embed"]["W_pos"][start:start + n])
    elif cfg.positional_embedding_type == "sinusoidal":
        x = x + hook("hook_pos_embed", sinusoidal(start + n, cfg.d_model)[start:].astype(W_E.dtype))
    if cfg.n_token_types:
        types = np.zeros(n, dtype=np.int64) if token_types is None else np.asarray(token_types)
        x = x + hook("hook_token_type_embed", params["token_type_embed"]["W_token_type"][types])
    if cfg.block_type == "post_norm":
        x = norm(x, params["ln_embed"], cfg)
    return x


def ablation_by_layer(ablate: Mapping[tuple[int, int], Ablation] | None, cfg: TransformerConfig
                      ) -> dict[int, dict[int, Ablation]]:
    """{(layer, head): how} checked against the model, as {layer: {head: how}}."""
    by_layer: dict[int, dict[int, Ablation]] = {}
    for (layer, head), how in (ablate or {}).items():
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise InputError(f"cannot ablate layer {layer} head {head}: the model has "
                             f"{cfg.n_layers} layers of {cfg.n_heads} heads")
        if how not in ("zero", "mean"):
            raise InputError(f"ablation must be 'zero' or 'mean', got {how!r}")
        by_layer.setdefault(layer, {})[head] = how
    return by_layer


def forward(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: bool = True,
    past_kv: KVCache | None = None,
) -> tuple[np.ndarray | None, dict[str, np.ndarray], KVCache]:
    """Run the model on token ids [pos]: logits [pos, d_vocab], the activations asked for, and K, V.

    names: keep only these hook names (None keeps all). ablate: {(layer, head): "zero"|"mean"}
    replaces that head's output z before W_O. logits=False skips the unembedding (encoders,
    or when only activations are wanted). past_kv: the keys and values of earlier tokens; the
    tokens given then continue that sequence (queries attend to the cached keys too), and the
    returned KVCache holds them all. Without it, the returned KVCache holds this pass's.
    core.cache.run_with_cache wraps this in an ActivationCache that answers questions about the run.
    """
    start = 0 if past_kv is None else past_kv.n_tokens
    if past_kv is not None and not cfg.causal:
        raise InputError("a KV cache needs causal attention: in a bidirectional model every new token "
                         "changes the earlier positions too, so nothing can be reused")
    tokens = check_tokens(tokens, cfg, start)
    hook = _Recorder(names)
    by_layer = ablation_by_layer(ablate, cfg)
    x = embed(params, cfg, tokens, hook, token_types, start)
    keys, values = [], []
    for layer, block in enumerate(params["blocks"]):
        past = None if past_kv is None else (past_kv.keys[layer], past_kv.values[layer])
        x, (k, v) = transformer_block(x, block, cfg, hook, layer, by_layer.get(layer), past)
        keys.append(k)
        values.append(v)
    if cfg.block_type == "pre_norm":
        x = hook("ln_final.hook_normalized", norm(x, params["ln_final"], cfg))
    kv = KVCache(tuple(keys), tuple(values))
    if not logits:
        return None, hook.cache, kv
    W_U, b_U = unembedding(params)
    out = x @ W_U  # [pos, d_vocab]
    if b_U is not None:
        out += b_U
    return out, hook.cache, kv


def next_token_probs(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities of the token after the last position.  # [pos, d_vocab] -> [d_vocab]"""
    return softmax(logits[-1] / temperature)


# ---------------------------------------------------------------------------- generation, stepped

@dataclass(frozen=True)
class KVStep:
    pos: int
    token: int  # the token fed in at this step
    generated: bool  # False while reading the prompt, True for tokens the model chose
    k_shape: tuple[int, int, int]  # every layer's K: [n_heads, pos + 1, d_head]
    v_shape: tuple[int, int, int]  # every layer's V: [n_heads, pos + 1, d_head]
    cache_bytes: int  # all layers' K and V
    logits: np.ndarray  # [d_vocab], the prediction for the next token


@dataclass(frozen=True)
class KVRun:
    steps: list[KVStep]
    tokens: np.ndarray  # [pos], prompt then generated
    kv: KVCache  # every layer's final K and V


def run_with_kv_cache(params: Params, cfg: TransformerConfig, prompt, n_new: int = 0) -> KVRun:
    """Feed the prompt one token at a time, then greedily generate `n_new` tokens, keeping K and V.

    Each step is one `forward` of one token with `past_kv`: q, k, v for the new token only,
    appended to every layer's cache, the new query attending to all cached keys. The same
    numbers as re-running the whole sequence, at a cost per step that grows with the length
    instead of its square. Only a causal model can be cached.
    """
    if not cfg.causal:
        raise InputError("a KV cache needs causal attention: in a bidirectional model every new token "
                         "changes the earlier positions too, so nothing can be reused")
    prompt = check_tokens(prompt, cfg)
    if not isinstance(n_new, (int, np.integer)) or n_new < 0:
        raise InputError(f"n_new must be a non-negative integer, got {n_new!r}")
    if cfg.positional_embedding_type == "learned" and prompt.size + n_new > cfg.n_ctx:
        raise InputError(f"{prompt.size} prompt tokens + {n_new} new ones exceed the model's context "
                         f"of n_ctx={cfg.n_ctx}")
    kv = KVCache.empty(cfg, params["embed"]["W_E"].dtype)
    tokens, steps = list(prompt), []
    pos = 0
    while pos < len(tokens):
        logits, _, kv = forward(params, cfg, np.array([tokens[pos]]), names=(), past_kv=kv)
        steps.append(KVStep(pos, int(tokens[pos]), pos >= prompt.size, kv.keys[0].shape, kv.values[0].shape, kv.nbytes,
                            logits[0]))
        if pos == len(tokens) - 1 and len(tokens) < prompt.size + n_new:
            tokens.append(int(np.argmax(logits[0])))  # greedy: the most probable next token
        pos += 1
    return KVRun(steps, np.array(tokens), kv)
