"""A configurable Transformer, read top to bottom: parameters; norm, attention, MLP, block; embedding, forward.

Parameters are plain nested dicts of arrays whose keys are TransformerLens' names.
The attention projections come in one of three layouts, whichever the weights were stored in,
so that a checkpoint's arrays can be used as they lie in the file (memory-mapped, no copies):
  W_QKV [d_model, 3 * n_heads * d_head]        fused, columns [Q of every head | K | V] (GPT-2, the toys)
  W_QKV [d_model, n_heads, 3, d_head]          fused per head, each head's q, k, v side by side (GPT-NeoX)
  W_Q [d_model, n_heads * d_head], W_K and W_V [d_model, n_key_value_heads * d_head]   separate
                                               (Llama, Qwen, Mistral, GPT-Neo, BERT; grouped-query attention)
Any of them yields every head's queries, keys and values in one matrix multiply each;
`per_head_weights` gives TransformerLens' per-head views of the same numbers.

The forward pass works on one sequence of token ids ([pos], no batch axis) so shapes
read exactly as the spec prints them; a block can also run several sequences' rows side by side
(core/hooks.py Batch: activation patching's variants of one run). Activation names and what a pass records under them
(the hooks, the thread team, the memory: PassContext) are in core/hooks.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

from .attention import scaled_dot_product_attention, split_heads
from .config import TransformerConfig
from .errors import InputError
from .functional import ACTIVATIONS, layer_norm, rms_norm, softmax
from .hooks import Batch, PassContext
from .i18n import _
from .positions import rotary, sinusoidal
from .threads import SERIAL, Team, team_for

Params = dict
Ablation = Literal["zero", "mean"]


# ---------------------------------------------------------------------------- parameters


def init_params(cfg: TransformerConfig, seed: int = 0, dtype=np.float64) -> Params:
    """Random weights: N(0, 1/fan_in) matrices (as the spec initialises), zero biases, unit gains.

    Scaling by 1/√fan_in keeps activations near unit size at every width, so attention
    patterns of a random model are neither uniform nor one-hot. Q, K and V are fused into one
    W_QKV when every query head has its own key/value head, and separate (W_Q, W_K, W_V) under
    grouped-query attention; core.params.param_entries lists the same arrays.
    """
    rng = np.random.default_rng(seed)
    d, h, kv, dh, dm = cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_mlp

    def matrix(fan_in: int, *shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(dtype)

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def norm(width: int = d) -> dict:
        gain = {"w": np.ones(width, dtype=dtype)}
        return {"LN": gain | {"b": zeros(width)}, "RMS": gain}.get(cfg.normalization_type, {})

    params: Params = {"embed": {"W_E": matrix(d, cfg.d_vocab, d)}}
    if cfg.positional_embedding_type == "learned":
        params["pos_embed"] = {"W_pos": matrix(d, cfg.n_ctx, d)}
    if cfg.n_token_types:
        params["token_type_embed"] = {"W_token_type": matrix(d, cfg.n_token_types, d)}
    if cfg.block_type == "post_norm":
        params["ln_embed"] = norm()
    blocks = []
    for _layer in range(cfg.n_layers):
        attn: dict[str, Any]  # arrays, and the q and k norms' dicts
        if kv == h:
            attn = {"W_QKV": matrix(d, d, 3 * h * dh)}
            if cfg.qkv_bias:
                attn["b_QKV"] = zeros(3 * h * dh)
        else:
            attn = {"W_Q": matrix(d, d, h * dh), "W_K": matrix(d, d, kv * dh), "W_V": matrix(d, d, kv * dh)}
            if cfg.qkv_bias:
                attn |= {"b_Q": zeros(h * dh), "b_K": zeros(kv * dh), "b_V": zeros(kv * dh)}
        if cfg.use_qk_norm:
            attn |= {"q_norm": {"w": np.ones(dh, dtype=dtype)}, "k_norm": {"w": np.ones(dh, dtype=dtype)}}
        attn["W_O"] = matrix(h * dh, h * dh, d)
        if cfg.attn_out_bias:
            attn["b_O"] = zeros(d)
        mlp = {"W_in": matrix(d, d, dm), "W_out": matrix(dm, dm, d)}
        if cfg.gated_mlp:
            mlp = {"W_gate": matrix(d, d, dm)} | mlp
        if cfg.mlp_bias:
            mlp |= {"b_in": zeros(dm), "b_out": zeros(d)} | ({"b_gate": zeros(dm)} if cfg.gated_mlp else {})
        blocks.append(
            {"ln1": norm(), "attn": attn} if cfg.attn_only else {"ln1": norm(), "attn": attn, "ln2": norm(), "mlp": mlp}
        )
    params["blocks"] = blocks
    if cfg.block_type == "pre_norm":
        params["ln_final"] = norm()
    if not cfg.tied_embeddings:
        params["unembed"] = {"W_U": matrix(d, d, cfg.d_vocab)}
        if cfg.unembed_bias:
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
    """TransformerLens' per-head views of the attention weights, whatever their layout (views, no copies).

    W_Q: [n_heads, d_model, d_head]; W_K, W_V: [n_key_value_heads, d_model, d_head];
    W_O: [n_heads, d_head, d_model].
    """
    h, kv, dh = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head

    def heads(w: np.ndarray, n: int) -> np.ndarray:  # [d_model, n * d_head] -> [n, d_model, d_head]
        return w.reshape(-1, n, dh).transpose(1, 0, 2)

    if "W_QKV" in attn and attn["W_QKV"].ndim == 4:  # [d_model, n_heads, 3, d_head]
        W = attn["W_QKV"]
        W_Q, W_K, W_V = (W[:, :, i].transpose(1, 0, 2) for i in range(3))
    elif "W_QKV" in attn:
        W = attn["W_QKV"]
        W_Q, W_K, W_V = (
            heads(W[:, : h * dh], h),
            heads(W[:, h * dh : (h + kv) * dh], kv),
            heads(W[:, (h + kv) * dh :], kv),
        )
    else:
        W_Q, W_K, W_V = heads(attn["W_Q"], h), heads(attn["W_K"], kv), heads(attn["W_V"], kv)
    return {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": attn["W_O"].reshape(h, dh, -1)}


# ---------------------------------------------------------------------------- forward pass
# The parts (norm, linear, add) take a thread team and can be called alone; the attention and MLP sub-layers,
# the block and the embedding take `ctx` (core/hooks.py PassContext), the one object that carries what a pass
# records: the hook every activation passes through, the thread team, and the memory activations are made in.


def norm(x: np.ndarray, ln: Mapping, cfg: TransformerConfig, team: Team = SERIAL) -> np.ndarray:
    """The model's norm: layer norm with gain and bias for "LN", scale-free for "LNPre" (an empty
    dict); RMS norm with a gain for "RMS", without for "RMSPre". Row by row, so the team shares the rows."""
    out = np.empty(x.shape, x.dtype)
    if cfg.normalization_type in ("RMS", "RMSPre"):
        team.rows(lambda s: rms_norm(x[s], ln.get("w"), cfg.eps, out=out[s]), x.shape[0])
    else:
        team.rows(lambda s: layer_norm(x[s], ln.get("w"), ln.get("b"), cfg.eps, out=out[s]), x.shape[0])
    return out


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, out: np.ndarray, team: Team = SERIAL) -> np.ndarray:
    """x @ w + b written into out, the team sharing the rows.  # [pos, d_in], [d_in, d_out] -> [pos, d_out]"""

    def rows(s: slice) -> None:
        np.matmul(x[s], w, out=out[s])
        if b is not None:
            out[s] += b

    team.rows(rows, x.shape[0])
    return out


def add(x: np.ndarray, y: np.ndarray, out: np.ndarray, team: Team = SERIAL) -> np.ndarray:
    """x + y written into out (the residual stream's sums), the team sharing the rows."""
    team.rows(lambda s: np.add(x[s], y[s], out=out[s]), x.shape[0])
    return out


def _hooked_linear(ctx: PassContext, name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The activation `name` = x @ w + b, made in the memory the pass keeps it in, then hooked."""
    out = ctx.empty(name, (x.shape[0], w.shape[1]), np.result_type(x, w))
    return ctx.hook(name, linear(x, w, b, out, ctx.team))


def project_qkv(
    x: np.ndarray, attn: Mapping, cfg: TransformerConfig, ctx: PassContext, prefix: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [pos, d_model] -> q, k, v
    """Queries [n_heads, pos, d_head], keys and values [n_key_value_heads, pos, d_head], from
    whichever layout the weights are stored in (see the module docstring), every head in one product
    (or one each for Q, K and V); views of it, not copies. A fused product is made where the pass keeps
    hook_q (q, k and v are views of it)."""
    h, kv, dh, n = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, x.shape[0]
    W = attn.get("W_QKV")
    if W is not None and W.ndim == 4:  # GPT-NeoX: [d_model, n_heads, 3, d_head]
        W = W.reshape(W.shape[0], -1)  # [d_model, n_heads * 3 * d_head]; the reshape is a view
        b = attn["b_QKV"].reshape(-1) if "b_QKV" in attn else None
        qkv = linear(x, W, b, np.empty((n, W.shape[1]), np.result_type(x, W)), ctx.team).reshape(n, h, 3, dh)
        return (
            qkv[:, :, 0].swapaxes(0, 1),
            qkv[:, :, 1].swapaxes(0, 1),
            qkv[:, :, 2].swapaxes(0, 1),
        )  # [n_heads, pos, d_head]
    if W is not None:  # columns [Q heads | K heads | V heads]
        out = ctx.empty(prefix + "attn.hook_q", (n, W.shape[1]), np.result_type(x, W))
        qkv = linear(x, W, attn.get("b_QKV"), out, ctx.team)  # [pos, (n_heads + 2 n_key_value_heads) * d_head]
        parts = [qkv[:, : h * dh], qkv[:, h * dh : (h + kv) * dh], qkv[:, (h + kv) * dh :]]
    else:
        parts = []
        for m in "QKV":  # Q [pos, n_heads * d_head], K and V [pos, n_key_value_heads * d_head]
            w = attn[f"W_{m}"]
            parts.append(linear(x, w, attn.get(f"b_{m}"), np.empty((n, w.shape[1]), np.result_type(x, w)), ctx.team))
    return split_heads(parts[0], h), split_heads(parts[1], kv), split_heads(parts[2], kv)


def _rotate(
    m: np.ndarray, positions: np.ndarray, cfg: TransformerConfig, out: np.ndarray, team: Team = SERIAL
) -> np.ndarray:
    """The model's rotary turn of queries or keys m [heads, pos, d_head], written into out
    [pos, heads, d_head] (the hook's layout); returns out as [heads, pos, d_head], a view."""
    turned = out.swapaxes(0, 1)
    dim, base, adjacent = cfg.rotary_dim, cfg.rotary_base, cfg.rotary_adjacent_pairs
    team.rows(
        lambda s: rotary(m[:, s], positions[s], out=turned[:, s], rotary_dim=dim, base=base, adjacent_pairs=adjacent),
        m.shape[1],
    )
    return turned


def attention_block(
    x: np.ndarray,  # [pos, d_model], the sub-layer's (normalised) input
    attn: Mapping,
    cfg: TransformerConfig,
    ctx: PassContext,
    prefix: str,  # "blocks.{layer}."
    ablate: Mapping[int, Ablation] | None = None,
    past: tuple[np.ndarray, np.ndarray] | None = None,  # this layer's cached K, V [n_kv_heads, past, d_head]
    window: int | None = None,  # a local layer's span in tokens (None: a global layer)
    batch: Batch | None = None,  # several sequences' rows in x (see transformer_block)
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:  # -> [pos, d_model], (K, V) including this pass
    q, k, v = project_qkv(x, attn, cfg, ctx, prefix)
    # q [n_heads, pos, d_head], K and V [n_key_value_heads, pos, d_head]
    if "q_norm" in attn:  # Qwen3: each head's query and key RMS-normalised before rotary
        q, k = rms_norm(q, attn["q_norm"]["w"], cfg.eps), rms_norm(k, attn["k_norm"]["w"], cfg.eps)
    for name, m in (("q", q), ("k", k), ("v", v)):
        ctx.hook(f"{prefix}attn.hook_{name}", m.swapaxes(0, 1))  # stored as [pos, head_index, d_head]
    start = 0 if past is None else past[0].shape[1]  # the new tokens' first position
    n_q = x.shape[0]
    if cfg.positional_embedding_type == "rotary":
        positions = np.arange(start, start + n_q) if batch is None else batch.positions()
        q, k = (
            _rotate(
                m, positions, cfg, ctx.empty(f"{prefix}attn.hook_rot_{name}", m.swapaxes(0, 1).shape, m.dtype), ctx.team
            )
            for name, m in (("q", q), ("k", k))
        )
        ctx.hook(f"{prefix}attn.hook_rot_q", q.swapaxes(0, 1))
        ctx.hook(f"{prefix}attn.hook_rot_k", k.swapaxes(0, 1))
    if batch is not None:
        return _batched_attention(q, k, v, attn, cfg, ctx, prefix, ablate, past, window, batch)
    if past is not None:  # the new queries see every cached key, then their own
        k, v = np.concatenate([past[0], k], axis=1), np.concatenate([past[1], v], axis=1)
    # The [n_heads, pos, pos] scores and pattern are the largest activations: build them only when kept.
    keep = ctx.wants(f"{prefix}attn.hook_attn_scores") or ctx.wants(f"{prefix}attn.hook_pattern")
    # Grouped-query attention: query heads [n_kv_heads, group, pos, d_head] against K, V
    # [n_kv_heads, 1, pos, d_head], broadcast over each group (a view; no key is copied).
    n_kv, group, d_v = cfg.n_key_value_heads, cfg.group_size, v.shape[-1]
    # z is kept as the hook shows it, [pos, head_index, d_head]: its rows side by side are W_O's input
    z = ctx.empty(f"{prefix}attn.hook_z", (n_q, cfg.n_heads, d_v), np.result_type(q, k, v))
    scores, pattern, _ = scaled_dot_product_attention(
        q.reshape(n_kv, group, n_q, cfg.d_head),
        k[:, None],
        v[:, None],
        causal=cfg.causal,
        scale=cfg.use_attn_scale,
        temperature=cfg.attn_temperature,
        keep=keep,
        window=window,
        out=z.reshape(n_q, n_kv, group, d_v).transpose(1, 2, 0, 3),  # a view: z's head = kv_head * group + i
        team=ctx.team,
    )  # [n_kv, group, query_pos, key_pos] twice (None unless kept); z written in place
    if scores is not None and pattern is not None:  # kept
        ctx.hook(f"{prefix}attn.hook_attn_scores", scores.reshape(cfg.n_heads, n_q, -1))
        ctx.hook(f"{prefix}attn.hook_pattern", pattern.reshape(cfg.n_heads, n_q, -1))
    for head, how in (ablate or {}).items():
        z[:, head] = z[:, head].mean(axis=0) if how == "mean" else 0.0  # this head writes nothing (or its mean)
    z = ctx.hook(f"{prefix}attn.hook_z", z)
    # the heads' outputs side by side (a view) through W_O: [pos, n_heads * d_head] -> [pos, d_model]
    out = _hooked_linear(ctx, f"{prefix}hook_attn_out", z.reshape(n_q, -1), attn["W_O"], attn.get("b_O"))
    return out, (k, v)


def _batched_attention(
    q: np.ndarray,  # [n_heads, rows, d_head], k and v [n_key_value_heads, rows, d_head]: every sequence's rows
    k: np.ndarray,
    v: np.ndarray,
    attn: Mapping,
    cfg: TransformerConfig,
    ctx: PassContext,
    prefix: str,
    ablate: Mapping[int, Ablation] | None,
    past: tuple[np.ndarray, np.ndarray] | None,  # [n_kv_heads, past, d_head], shared by the sequences
    window: int | None,
    batch: Batch,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:  # -> [rows, d_model], the new rows' K, V
    """attention_block's attention for a Batch: each sequence attends to `past`'s first `start` keys and its own
    (sequences alike, one after the other, in one call with a leading batch axis). Keeps no scores or patterns."""
    n_kv, group, d_head, d_v = cfg.n_key_value_heads, cfg.group_size, cfg.d_head, v.shape[-1]
    z = ctx.empty(f"{prefix}attn.hook_z", (q.shape[1], cfg.n_heads, d_v), np.result_type(q, k, v))
    for rows, start, size, count in batch.runs():
        # [heads, count * size, d] -> [count, heads, size, d]
        qs, ks, vs = (m[:, rows].reshape(m.shape[0], count, size, -1).swapaxes(0, 1) for m in (q, k, v))
        if start:
            assert past is not None  # a sequence that continues a past has one
            ks, vs = (
                np.concatenate([np.broadcast_to(p[:, :start], (count, *p[:, :start].shape)), m], axis=2)
                for p, m in zip(past, (ks, vs))
            )
        scaled_dot_product_attention(
            qs.reshape(count, n_kv, group, size, d_head),
            ks[:, :, None],
            vs[:, :, None],
            causal=cfg.causal,
            scale=cfg.use_attn_scale,
            temperature=cfg.attn_temperature,
            keep=False,
            window=window,
            out=z[rows].reshape(count, size, n_kv, group, d_v).transpose(0, 2, 3, 1, 4),
            team=ctx.team,
        )
        per_sequence = z[rows].reshape(count, size, cfg.n_heads, d_v)
        for head, how in (ablate or {}).items():
            per_sequence[:, :, head] = per_sequence[:, :, head].mean(axis=1, keepdims=True) if how == "mean" else 0.0
    z = ctx.hook(f"{prefix}attn.hook_z", z)
    out = _hooked_linear(ctx, f"{prefix}hook_attn_out", z.reshape(z.shape[0], -1), attn["W_O"], attn.get("b_O"))
    return out, (k, v)


def mlp_block(x: np.ndarray, mlp: Mapping, cfg: TransformerConfig, ctx: PassContext, prefix: str) -> np.ndarray:
    """act(x W_in + b_in) W_out + b_out; gated (SwiGLU): (act(x W_gate + b_gate) * (x W_in + b_in)) W_out + b_out."""
    act, n, p = ACTIVATIONS[cfg.act_fn], x.shape[0], prefix
    post = ctx.empty(p + "mlp.hook_post", (n, mlp["W_in"].shape[1]), np.result_type(x, mlp["W_in"]))  # [pos, d_mlp]
    if "W_gate" in mlp:
        gate = _hooked_linear(ctx, p + "mlp.hook_pre", x, mlp["W_gate"], mlp.get("b_gate"))  # [pos, d_mlp]
        up = _hooked_linear(ctx, p + "mlp.hook_pre_linear", x, mlp["W_in"], mlp.get("b_in"))

        def gated(s: slice) -> None:
            act(gate[s], out=post[s])
            post[s] *= up[s]

        ctx.team.rows(gated, n)
    else:
        pre = _hooked_linear(ctx, p + "mlp.hook_pre", x, mlp["W_in"], mlp.get("b_in"))  # [pos, d_mlp]
        ctx.team.rows(lambda s: act(pre[s], out=post[s]), n)
    post = ctx.hook(p + "mlp.hook_post", post)
    return _hooked_linear(ctx, p + "hook_mlp_out", post, mlp["W_out"], mlp.get("b_out"))  # [pos, d_model]


def transformer_block(
    x: np.ndarray,  # [pos, d_model], the residual stream
    block: Mapping,
    cfg: TransformerConfig,
    ctx: PassContext,
    layer: int,
    ablate: Mapping[int, Ablation] | None = None,
    past: tuple[np.ndarray, np.ndarray] | None = None,
    batch: Batch | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Two residual additions: each sub-layer reads the stream and adds what it writes to it.

        pre-norm (GPT-2, Llama):   x = x + attn(ln1(x));  x = x + mlp(ln2(x))
        parallel (GPT-NeoX):       x + attn(ln1(x)) + mlp(ln2(x)), both sub-layers reading the block's input
        post-norm (BERT):          x = ln1(x + attn(x));  x = ln2(x + mlp(x))
        attention-only:            the first addition alone (it is hook_resid_post, as in TransformerLens)

    hook_resid_mid is the stream between the two: under parallel, x + attn(ln1(x)), a partial sum the MLP
    does not read; under post-norm, the normalised sum the MLP receives. Returns the block's output
    [pos, d_model] and this layer's keys and values (with `past`'s before them).

    batch: x holds several sequences' rows one after the other (a Batch: each continues `past`'s first
    `start` positions); every step but attention works row by row over all of them, and attention attends
    within each sequence. K and V come back for the new rows only. Variants of one run (activation
    patching's cells) then share each weight matrix's read."""
    p = f"blocks.{layer}."
    x = ctx.hook(p + "hook_resid_pre", x)
    post_norm = cfg.block_type == "post_norm"

    def ln(h: np.ndarray, which: str) -> np.ndarray:
        return norm(h, block[which], cfg, ctx.team)

    def mlp(h: np.ndarray) -> np.ndarray:  # -> hook_mlp_out [pos, d_model]
        return mlp_block(h, block["mlp"], cfg, ctx, p)

    def plus(a: np.ndarray, b: np.ndarray, name: str | None = None) -> np.ndarray:  # a + b, made as activation `name`
        dtype = np.result_type(a, b)
        return add(a, b, np.empty(a.shape, dtype) if name is None else ctx.empty(name, a.shape, dtype), ctx.team)

    first = p + ("hook_resid_post" if cfg.attn_only else "hook_resid_mid")  # the stream after the first addition
    attn_out, kv = attention_block(
        x if post_norm else ln(x, "ln1"), block["attn"], cfg, ctx, p, ablate, past, cfg.window(layer), batch
    )  # hook_attn_out [pos, d_model]
    if post_norm:
        x = ctx.hook(first, ln(plus(x, attn_out), "ln1"))  # x = ln1(x + attn(x))
        if not cfg.attn_only:
            x = ctx.hook(p + "hook_resid_post", ln(plus(x, mlp(x)), "ln2"))  # x = ln2(x + mlp(x))
        return x, kv
    mid = ctx.hook(first, plus(x, attn_out, first))  # x + attn(ln1(x))
    if cfg.attn_only:
        return mid, kv
    mlp_in = x if cfg.parallel_attn_mlp else mid  # parallel: the MLP reads the block's input too
    return ctx.hook(p + "hook_resid_post", plus(mid, mlp(ln(mlp_in, "ln2")), p + "hook_resid_post")), kv


def check_tokens(tokens: np.ndarray, cfg: TransformerConfig, start: int = 0) -> np.ndarray:
    """Token ids [pos] that this model can read at positions start, start + 1, ..."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise InputError(
            _("expected a non-empty 1-D sequence of token ids, got shape {shape}").format(shape=tokens.shape)
        )
    if not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(_("token ids must be integers, got dtype {dtype}").format(dtype=tokens.dtype))
    if tokens.min() < 0 or tokens.max() >= cfg.d_vocab:
        raise InputError(
            _("token ids must lie in [0, {d_vocab}), got {low}..{high}").format(
                d_vocab=cfg.d_vocab, low=tokens.min(), high=tokens.max()
            )
        )
    if cfg.positional_embedding_type == "learned" and start + tokens.size > cfg.n_ctx:
        raise InputError(
            _("{n} tokens is longer than the model's context of n_ctx={n_ctx}").format(
                n=start + tokens.size, n_ctx=cfg.n_ctx
            )
        )
    return tokens


def embed(
    params: Params, cfg: TransformerConfig, tokens: np.ndarray, ctx: PassContext, token_types=None, start: int = 0
) -> np.ndarray:
    """Token embedding plus position (and, for BERT, segment) embeddings.  # [pos] -> [pos, d_model]

    `start` is the first token's position (after a KV cache's tokens)."""
    W_E = params["embed"]["W_E"]
    x = ctx.hook("hook_embed", W_E[tokens])  # row indexing is the embedding lookup
    n = tokens.size
    if cfg.positional_embedding_type == "learned":
        x = x + ctx.hook("hook_pos_embed", params["pos_embed"]["W_pos"][start : start + n])
    elif cfg.positional_embedding_type == "sinusoidal":
        x = x + ctx.hook("hook_pos_embed", sinusoidal(start + n, cfg.d_model)[start:].astype(W_E.dtype))
    if cfg.n_token_types:
        types = np.zeros(n, dtype=np.int64) if token_types is None else np.asarray(token_types)
        x = x + ctx.hook("hook_token_type_embed", params["token_type_embed"]["W_token_type"][types])
    if cfg.block_type == "post_norm":
        x = norm(x, params["ln_embed"], cfg)
    return x


def ablation_by_layer(
    ablate: Mapping[tuple[int, int], Ablation] | None, cfg: TransformerConfig
) -> dict[int, dict[int, Ablation]]:
    """{(layer, head): how} checked against the model, as {layer: {head: how}}."""
    by_layer: dict[int, dict[int, Ablation]] = {}
    for (layer, head), how in (ablate or {}).items():
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise InputError(
                _("cannot ablate layer {layer} head {head}: the model has {n_layers} layers of {n_heads} heads").format(
                    layer=layer, head=head, n_layers=cfg.n_layers, n_heads=cfg.n_heads
                )
            )
        if how not in ("zero", "mean"):
            raise InputError(_("ablation must be 'zero' or 'mean', got {how!r}").format(how=how))
        by_layer.setdefault(layer, {})[head] = how
    return by_layer


@dataclass(frozen=True)
class KVCache:
    """Every layer's keys and values of the tokens seen so far (keys already rotated, for rotary).

    A pass given `past_kv` computes q, k, v for its new tokens only, appends k and v here and lets
    the new queries attend to every cached key: the same numbers as re-running the whole sequence.
    Under grouped-query attention only the key/value heads are cached; a local layer's cache keeps
    every token too (its mask hides those beyond the window), so the bytes are kv_cache_bytes'.
    """

    keys: tuple[np.ndarray, ...]  # per layer [n_key_value_heads, pos, d_head]
    values: tuple[np.ndarray, ...]  # per layer [n_key_value_heads, pos, d_head]

    @classmethod
    def empty(cls, cfg: TransformerConfig, dtype) -> KVCache:
        none = np.zeros((cfg.n_key_value_heads, 0, cfg.d_head), dtype=dtype)
        return cls((none,) * cfg.n_layers, (none,) * cfg.n_layers)

    @property
    def n_tokens(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))


# The logits are there unless logits=False: the type checker is told which (an @overload each).
@overload
def forward(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    *,
    names: Iterable[str] | None = None,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
    token_types=None,
    logits: Literal[True] = True,
    past_kv: KVCache | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray], KVCache]: ...


@overload
def forward(
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
) -> tuple[None, dict[str, np.ndarray], KVCache]: ...


@overload
def forward(
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
) -> tuple[np.ndarray | None, dict[str, np.ndarray], KVCache]: ...


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
    stop_at_layer: int | None = None,
) -> tuple[np.ndarray | None, dict[str, np.ndarray], KVCache]:
    """Run the model on token ids [pos]: logits [pos, d_vocab], the activations asked for, and K, V.

    names: keep only these hook names (None keeps all). ablate: {(layer, head): "zero"|"mean"}
    replaces that head's output z before W_O. logits=False skips the unembedding (encoders,
    or when only activations are wanted). past_kv: the keys and values of earlier tokens; the
    tokens given then continue that sequence (queries attend to the cached keys too), and the
    returned KVCache holds them all. Without it, the returned KVCache holds this pass's.
    stop_at_layer (TransformerLens's name, with logits=False): run only the first that many blocks, no final
    norm; the activations of what was run, and the keys and values of those blocks (hooks.layers_needed says
    how many blocks a set of hooks needs).
    core.cache.run_with_cache wraps this in an ActivationCache that answers questions about the run.
    """
    if stop_at_layer is not None and (logits or not 0 <= stop_at_layer <= cfg.n_layers):
        raise ValueError(
            _("stop_at_layer={stop} needs logits=False and a layer from 0 to {n_layers}").format(
                stop=stop_at_layer, n_layers=cfg.n_layers
            )
        )
    start = 0 if past_kv is None else past_kv.n_tokens
    if past_kv is not None and not cfg.causal:
        raise InputError(
            _(
                "a KV cache needs causal attention: in a bidirectional model every new "
                "token changes the earlier positions too, so nothing can be reused"
            )
        )
    tokens = check_tokens(tokens, cfg, start)
    by_layer = ablation_by_layer(ablate, cfg)
    with team_for(tokens.size) as team:  # a long text on a BLAS of several threads: a team shares each step
        ctx = PassContext(names, team)
        x = embed(params, cfg, tokens, ctx, token_types, start)  # [pos, d_model]
        keys, values = [], []
        for layer, block in enumerate(params["blocks"][:stop_at_layer]):
            past = None if past_kv is None else (past_kv.keys[layer], past_kv.values[layer])
            x, (k, v) = transformer_block(x, block, cfg, ctx, layer, by_layer.get(layer), past)
            keys.append(k)
            values.append(v)
        if stop_at_layer is not None:
            if stop_at_layer < cfg.n_layers:  # the stream entering the next block is made: it is the one it stops on
                ctx.hook(f"blocks.{stop_at_layer}.hook_resid_pre", x)
            return None, ctx.cache, KVCache(tuple(keys), tuple(values))
        if cfg.block_type == "pre_norm":
            x = ctx.hook("ln_final.hook_normalized", norm(x, params["ln_final"], cfg, team))
        kv = KVCache(tuple(keys), tuple(values))
        if not logits:
            return None, ctx.cache, kv
        W_U, b_U = unembedding(params)
        out = team.empty((x.shape[0], W_U.shape[1]), np.result_type(x, W_U))  # [pos, d_vocab]

        def columns(c: slice) -> None:  # the team shares the vocabulary: W_U is read once, x is small
            np.matmul(x, W_U[:, c], out=out[:, c])
            if b_U is not None:
                out[:, c] += b_U[c]

        team.each(columns, team.ranges(W_U.shape[1], smallest=1024))
    return out, ctx.cache, kv


def next_token_probs(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities of the token after the last position.  # [pos, d_vocab] -> [d_vocab]"""
    return softmax(logits[-1] / temperature)


# ---------------------------------------------------------------------------- generation, stepped


@dataclass(frozen=True)
class KVStep:
    pos: int
    token: int  # the token fed in at this step
    generated: bool  # False while reading the prompt, True for tokens the model chose
    k_shape: tuple[int, int, int]  # every layer's K: [n_key_value_heads, pos + 1, d_head]
    v_shape: tuple[int, int, int]  # every layer's V: [n_key_value_heads, pos + 1, d_head]
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
        raise InputError(
            _(
                "a KV cache needs causal attention: in a bidirectional model every new "
                "token changes the earlier positions too, so nothing can be reused"
            )
        )
    prompt = check_tokens(prompt, cfg)
    if not isinstance(n_new, (int, np.integer)) or n_new < 0:
        raise InputError(_("n_new must be a non-negative integer, got {n_new!r}").format(n_new=n_new))
    if cfg.positional_embedding_type == "learned" and prompt.size + n_new > cfg.n_ctx:
        raise InputError(
            _("{n} prompt tokens + {n_new} new ones exceed the model's context of n_ctx={n_ctx}").format(
                n=prompt.size, n_new=n_new, n_ctx=cfg.n_ctx
            )
        )
    kv = KVCache.empty(cfg, params["embed"]["W_E"].dtype)
    tokens, steps = list(prompt), []
    pos = 0
    while pos < len(tokens):
        logits, _cache, kv = forward(params, cfg, np.array([tokens[pos]]), names=(), past_kv=kv)
        steps.append(
            KVStep(
                pos, int(tokens[pos]), pos >= prompt.size, kv.keys[0].shape, kv.values[0].shape, kv.nbytes, logits[0]
            )
        )
        if pos == len(tokens) - 1 and len(tokens) < prompt.size + n_new:
            tokens.append(int(np.argmax(logits[0])))  # greedy: the most probable next token
        pos += 1
    return KVRun(steps, np.array(tokens), kv)
