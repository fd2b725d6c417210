"""One block of core/backprop.py's batched pass, forward and backward, for every family core.model runs.

core/backprop.py runs the embeddings, the blocks and the unembedding; this module is one block read in
both directions: norms (layer norm or RMS norm, with or without their gains), the attention sub-layer
(Q, K and V in any of core.model's three weight layouts, grouped-query attention's shared key/value heads,
Qwen3's per-head query and key RMS norms, rotary positions of any base, width and pair layout, local
windows) and the MLP (plain or gated, any activation), arranged pre-norm (GPT-2, Llama), parallel
(GPT-NeoX) or post-norm (BERT). Each step of the backward pass calls the *_backward function beside its
forward function (core/functional.py, core/attention.py), in the opposite order.

Arrays are batch first: the residual stream [batch, pos, d_model]; queries [batch, n_heads, pos, d_head],
keys and values [batch, n_key_value_heads, pos, d_head].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .attention import (
    BATCH_BLOCK_SCORES,
    attention_scale,
    causal_mask,
    local_mask,
    merge_heads,
    scaled_dot_product_attention_backward,
    split_heads,
)
from .config import TransformerConfig
from .functional import (
    ACTIVATION_BACKWARDS,
    ACTIVATIONS,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
    softmax,
)
from .positions import rotary


@dataclass
class Wanted:
    """What one backward pass computes besides dL/d(its input): the parameters' gradients (params=False skips
    them), and, when `hooks` is a dict, each activation's gradient written into it by hook name."""

    params: bool = True
    hooks: dict[str, np.ndarray] | None = None

    def keep(self, name: str, grad: np.ndarray) -> None:
        if self.hooks is not None:
            self.hooks[name] = grad


UNSET = np.empty(0)  # what every block has, until its forward pass sets it


@dataclass
class LayerSaved:
    """What one block's backward pass needs from its forward pass (None: not in this family's block)."""

    resid_pre: np.ndarray  # [batch, pos, d_model], the block's input
    ln1_out: np.ndarray = field(
        default_factory=lambda: UNSET
    )  # the attention's input: ln1(resid_pre), or resid_pre itself (post-norm)
    q_pre: np.ndarray | None = None  # [batch, n_heads, pos, d_head], before the query norm (use_qk_norm)
    k_pre: np.ndarray | None = None  # [batch, n_kv_heads, pos, d_head], before the key norm
    q: np.ndarray = field(
        default_factory=lambda: UNSET
    )  # [batch, n_heads, pos, d_head], normed and rotated: what met the keys
    k: np.ndarray = field(default_factory=lambda: UNSET)  # [batch, n_kv_heads, pos, d_head]
    v: np.ndarray = field(default_factory=lambda: UNSET)  # [batch, n_kv_heads, pos, d_head]
    pattern: np.ndarray = field(
        default_factory=lambda: UNSET
    )  # [batch, n_heads, query_pos, key_pos], the attention weights
    z: np.ndarray = field(
        default_factory=lambda: UNSET
    )  # [batch, pos, n_heads * d_head], the heads' outputs side by side (W_O's input)
    attn_out: np.ndarray | None = None  # [batch, pos, d_model] (kept for gradients(hooks=True) only)
    sum1: np.ndarray | None = None  # post-norm: resid_pre + attn_out, ln1's input
    resid_mid: np.ndarray | None = None  # [batch, pos, d_model], the stream between the sub-layers
    ln2_in: np.ndarray | None = None  # pre-norm: resid_mid, or resid_pre in a parallel block
    mlp_in: np.ndarray | None = None  # the MLP's input: ln2(ln2_in), or resid_mid (post-norm)
    mlp_pre: np.ndarray | None = None  # [batch, pos, d_mlp], the activation's input (the gate's, when gated)
    mlp_act: np.ndarray | None = None  # its output
    up: np.ndarray | None = None  # gated: x @ W_in + b_in, multiplied by the activation
    mlp_post: np.ndarray | None = None  # [batch, pos, d_mlp], W_out's input
    mlp_out: np.ndarray | None = None  # [batch, pos, d_model] (kept for gradients(hooks=True) only)
    sum2: np.ndarray | None = None  # post-norm: resid_mid + mlp_out, ln2's input


# ---------------------------------------------------------------------------- parts


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w + b over [batch, pos, d_in] -> [batch, pos, d_out], as one [batch * pos, d_in] product
    (NumPy would otherwise multiply sequence by sequence: one small BLAS call per batch row)."""
    out = x.reshape(-1, x.shape[-1]) @ w
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], w.shape[-1])


def linear_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, has_bias: bool, weights: bool = True
) -> tuple[np.ndarray, dict]:
    """For y = x @ w + b over [batch, pos, ...]: dx, and {"w": dw, "b": db} summed over batch and positions
    (an empty dict when weights=False: a third of the backward pass's work, which attribution does not need)."""
    dy2 = dy.reshape(-1, dy.shape[-1])  # [batch * pos, d_out]
    grads = {}
    if weights:
        grads["w"] = x.reshape(-1, x.shape[-1]).T @ dy2  # [d_in, d_out]
        if has_bias:
            grads["b"] = dy2.sum(axis=0)
    return (dy2 @ w.T).reshape(*dy.shape[:-1], w.shape[0]), grads


def norm(x: np.ndarray, ln: dict, cfg: TransformerConfig) -> np.ndarray:
    """core.model.norm over a batch: layer norm ("LN" with gain and bias, "LNPre" without) or RMS norm
    ("RMS" with a gain, "RMSPre" without)."""
    if cfg.normalization_type in ("RMS", "RMSPre"):
        return rms_norm(x, ln.get("w"), cfg.eps)
    return layer_norm(x, ln.get("w"), ln.get("b"), cfg.eps)


def norm_backward(dy: np.ndarray, x: np.ndarray, ln: dict, cfg: TransformerConfig) -> tuple[np.ndarray, dict]:
    """dL/dx of norm(x, ln), and its gain's and bias's gradients as a dict shaped like ln."""
    if cfg.normalization_type in ("RMS", "RMSPre"):
        dx, dw = rms_norm_backward(dy, x, ln.get("w"), cfg.eps)
        return dx, ({"w": dw} if "w" in ln else {})
    dx, dw, db = layer_norm_backward(dy, x, ln.get("w"), cfg.eps)
    return dx, ({"w": dw, "b": db} if "w" in ln else {})


def named(weights: dict[str, dict], biases: dict[str, dict]) -> dict:
    """{"W_in": g["w"], ...} then {"b_in": g["b"], ...} for each bias the layer has: a layer's biases are
    switched on and off one by one (qkv_bias without attn_out_bias, say), so each is looked up on its own."""
    return {name: g["w"] for name, g in weights.items() if "w" in g} | {
        name: g["b"] for name, g in biases.items() if "b" in g
    }


def rotate(x: np.ndarray, cfg: TransformerConfig, sign: int = 1) -> np.ndarray:
    """The model's rotation of queries or keys [batch, heads, pos, d_head] (its base, rotated
    dimensions and pair layout); sign=-1 turns each pair back by the same angle, which is the
    backward pass: a rotation's transpose is its inverse, and the angle is linear in the position."""
    positions = np.arange(x.shape[-2])
    return rotary(
        x,
        positions if sign > 0 else -positions,
        rotary_dim=cfg.rotary_dim,
        base=cfg.rotary_base,
        adjacent_pairs=cfg.rotary_adjacent_pairs,
    )


# ---------------------------------------------------------------------------- Q, K and V in each layout


def project(h: np.ndarray, attn: dict, cfg: TransformerConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries [batch, n_heads, pos, d_head], keys and values [batch, n_kv_heads, pos, d_head] of the
    attention's input h [batch, pos, d_model], from whichever layout core.model.project_qkv reads."""
    nb, n, H, kv, dh = h.shape[0], h.shape[1], cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
    W = attn.get("W_QKV")
    if W is not None and W.ndim == 4:  # GPT-NeoX: [d_model, n_heads, 3, d_head]
        b = attn["b_QKV"].reshape(-1) if "b_QKV" in attn else None
        qkv = linear(h, W.reshape(W.shape[0], -1), b).reshape(nb, n, H, 3, dh)
        return tuple(qkv[:, :, :, i].swapaxes(1, 2) for i in range(3))  # type: ignore[return-value]
    if W is not None:  # columns [Q heads | K heads | V heads]
        qkv = linear(h, W, attn.get("b_QKV"))
        parts = [qkv[..., : H * dh], qkv[..., H * dh : (H + kv) * dh], qkv[..., (H + kv) * dh :]]
    else:
        parts = [linear(h, attn[f"W_{m}"], attn.get(f"b_{m}")) for m in "QKV"]
    return split_heads(parts[0], H), split_heads(parts[1], kv), split_heads(parts[2], kv)


def project_backward(
    dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, h: np.ndarray, attn: dict, want: Wanted
) -> tuple[np.ndarray, dict]:
    """dL/dh and the projections' gradients, in the layout (and under the names) the weights are stored in."""
    nb, n = h.shape[:2]
    W = attn.get("W_QKV")
    if W is not None and W.ndim == 4:
        d_model, H, _three, dh = W.shape
        dqkv = np.empty((nb, n, H, 3, dh), dtype=dq.dtype)  # each head's q, k, v side by side
        for i, part in enumerate((dq, dk, dv)):
            dqkv[:, :, :, i] = part.swapaxes(1, 2)
        dh_, g = linear_backward(dqkv.reshape(nb, n, -1), h, W.reshape(d_model, -1), "b_QKV" in attn, want.params)
        fused = {"W_QKV": g["w"].reshape(W.shape)} if "w" in g else {}
        if "b" in g:
            fused["b_QKV"] = g["b"].reshape(attn["b_QKV"].shape)
        return dh_, fused
    if W is not None:
        dqkv = np.concatenate([merge_heads(m) for m in (dq, dk, dv)], axis=-1)  # [batch, pos, (H + 2 kv) d_head]
        dh_, g = linear_backward(dqkv, h, W, "b_QKV" in attn, want.params)
        return dh_, named({"W_QKV": g}, {"b_QKV": g})
    dh_ = np.zeros(h.shape, dtype=dq.dtype)
    grads: dict = {}
    for m, part in zip("QKV", (dq, dk, dv)):
        dx, g = linear_backward(merge_heads(part), h, attn[f"W_{m}"], f"b_{m}" in attn, want.params)
        dh_ += dx
        grads |= named({f"W_{m}": g}, {f"b_{m}": g})
    return dh_, grads


# ---------------------------------------------------------------------------- attention


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: TransformerConfig, window: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(Q Kᵀ / divisor + mask) V for a batch: the pattern [batch, n_heads, query_pos, key_pos] and
    z [batch, n_heads, pos, d_head], from q [batch, n_heads, pos, d_head] and k, v [batch, n_kv_heads, ...].
    window: a local layer's span (cfg.window(layer); None: global).

    The steps of core.attention.scaled_dot_product_attention, in its order and with its functions (a
    test holds the two equal), done for a few sequences at a time (BATCH_BLOCK_SCORES) so that one
    block's scores stay in the CPU cache through scale, mask and softmax; the pattern is written in
    place of the scores, which training does not keep. Grouped-query attention: each key/value head's
    group of query heads is one taller stack of queries, [batch, n_kv_heads, group * pos, d_head], against
    its keys [batch, n_kv_heads, pos, d_head]: one product per key/value head (no key is copied), whose
    backward pass then sums a shared key's gradient over its group inside the product itself.
    """
    n_batch, n_heads, n_pos, d_head = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    q4 = q.reshape(n_batch, n_kv, group * n_pos, d_head)  # head kv_head * group + i: rows i * pos, ...
    divisor = attention_scale(d_head, cfg.use_attn_scale, cfg.attn_temperature)
    mask = causal_mask(n_pos) if cfg.causal else None
    if window is not None:  # a local layer also hides the keys `window` or more positions back
        mask = local_mask(n_pos, n_pos, window) if mask is None else mask | local_mask(n_pos, n_pos, window)
    pattern = np.empty((*q4.shape[:-1], n_pos), dtype=np.result_type(q, k))
    z = np.empty((*q4.shape[:-1], v.shape[-1]), dtype=np.result_type(pattern, v))
    # The mask as -inf and 0 to add: the same scores as writing -inf where it is True (a finite score plus 0
    # is itself), in one plain pass instead of a masked copy, the slowest step of this loop.
    minus_inf = None if mask is None else np.tile(np.where(mask, -np.inf, 0.0).astype(pattern.dtype), (group, 1))
    block = max(1, BATCH_BLOCK_SCORES // (n_heads * n_pos * n_pos))  # sequences per block
    for i in range(0, n_batch, block):
        b = slice(i, i + block)
        s = np.matmul(q4[b], np.swapaxes(k[b], -1, -2), out=pattern[b])  # [block, kv, group * query, key]
        s /= divisor
        if minus_inf is not None:
            s += minus_inf
        softmax(s, out=s)
        np.matmul(s, v[b], out=z[b])
    return pattern.reshape(n_batch, n_heads, n_pos, n_pos), z.reshape(n_batch, n_heads, n_pos, -1)


def attention_forward(
    h: np.ndarray, attn: dict, cfg: TransformerConfig, window: int | None, s: LayerSaved, keep_outputs: bool
) -> np.ndarray:
    """The attention sub-layer of its input h [batch, pos, d_model]: [batch, pos, d_model]; saves into s."""
    q, k, v = project(h, attn, cfg)
    if "q_norm" in attn:  # Qwen3: each head's query and key RMS-normalised (gain over d_head) before rotary
        s.q_pre, s.k_pre = q, k
        q, k = rms_norm(q, attn["q_norm"]["w"], cfg.eps), rms_norm(k, attn["k_norm"]["w"], cfg.eps)
    if cfg.positional_embedding_type == "rotary":
        q, k = rotate(q, cfg), rotate(k, cfg)
    s.q, s.k, s.v = q, k, v
    s.pattern, z = attention(q, k, v, cfg, window)
    s.z = merge_heads(z)  # [batch, pos, n_heads * d_head]
    out = linear(s.z, attn["W_O"], attn.get("b_O"))
    if keep_outputs:
        s.attn_out = out
    return out


def attention_backward(
    dout: np.ndarray, attn: dict, s: LayerSaved, cfg: TransformerConfig, want: Wanted, prefix: str
) -> tuple[np.ndarray, dict]:
    """dL/d(the attention's input) from dL/d(its output), and its parameters' gradients."""
    dz, o = linear_backward(dout, s.z, attn["W_O"], "b_O" in attn, want.params)  # [batch, pos, n_heads * d_head]
    want.keep(prefix + "attn.hook_z", dz.reshape(*dz.shape[:-1], cfg.n_heads, -1))
    n_batch, n_heads, n_pos, d_head = s.q.shape
    n_kv, group = cfg.n_key_value_heads, cfg.group_size
    dpattern = None if want.hooks is None else np.empty(s.pattern.shape, s.pattern.dtype)
    stacked = (n_batch, n_kv, group * n_pos)  # each key/value head's query heads stacked, as attention() has them
    dq, dk, dv = scaled_dot_product_attention_backward(
        split_heads(dz, n_heads).reshape(*stacked, -1),
        s.q.reshape(*stacked, d_head),
        s.k,
        s.v,
        s.pattern.reshape(*stacked, n_pos),
        scale=cfg.use_attn_scale,
        temperature=cfg.attn_temperature,
        dweights=None if dpattern is None else dpattern.reshape(*stacked, n_pos),
    )  # dq [batch, kv, group * pos, d_head]; dk, dv [batch, kv, pos, d_head], summed over the group by the products
    if dpattern is not None:
        want.keep(prefix + "attn.hook_pattern", dpattern)
    dq = dq.reshape(s.q.shape)
    if cfg.positional_embedding_type == "rotary":
        dq, dk = rotate(dq, cfg, sign=-1), rotate(dk, cfg, sign=-1)
    grads: dict = {}
    if s.q_pre is not None and s.k_pre is not None:  # the query and key norms
        dq, dwq = rms_norm_backward(dq, s.q_pre, attn["q_norm"]["w"], cfg.eps)
        dk, dwk = rms_norm_backward(dk, s.k_pre, attn["k_norm"]["w"], cfg.eps)
        if want.params:
            grads = {"q_norm": {"w": dwq}, "k_norm": {"w": dwk}}
    dh, proj = project_backward(dq, dk, dv, s.ln1_out, attn, want)
    return dh, proj | grads | named({"W_O": o}, {"b_O": o})


# ---------------------------------------------------------------------------- MLP


def mlp_forward(x: np.ndarray, mlp: dict, cfg: TransformerConfig, s: LayerSaved, keep_outputs: bool) -> np.ndarray:
    """act(x W_in + b_in) W_out + b_out; gated: (act(x W_gate + b_gate) * (x W_in + b_in)) W_out + b_out."""
    act = ACTIVATIONS[cfg.act_fn]
    s.mlp_in = x
    if "W_gate" in mlp:
        s.mlp_pre = linear(x, mlp["W_gate"], mlp.get("b_gate"))  # [batch, pos, d_mlp]
        s.up = linear(x, mlp["W_in"], mlp.get("b_in"))
        s.mlp_act = act(s.mlp_pre)
        s.mlp_post = s.mlp_act * s.up
    else:
        s.mlp_pre = linear(x, mlp["W_in"], mlp.get("b_in"))
        s.mlp_act = s.mlp_post = act(s.mlp_pre)
    out = linear(s.mlp_post, mlp["W_out"], mlp.get("b_out"))
    if keep_outputs:
        s.mlp_out = out
    return out


def mlp_backward(dout: np.ndarray, mlp: dict, s: LayerSaved, cfg: TransformerConfig, want: Wanted):
    """dL/d(the MLP's input) from dL/d(its output), and its parameters' gradients."""
    assert s.mlp_in is not None and s.mlp_pre is not None and s.mlp_act is not None and s.mlp_post is not None
    act_backward = ACTIVATION_BACKWARDS[cfg.act_fn]
    dpost, w_out = linear_backward(dout, s.mlp_post, mlp["W_out"], "b_out" in mlp, want.params)  # [.., d_mlp]
    if "W_gate" not in mlp:
        dpre = act_backward(dpost, s.mlp_pre, s.mlp_act)
        dx, w_in = linear_backward(dpre, s.mlp_in, mlp["W_in"], "b_in" in mlp, want.params)
        return dx, named({"W_in": w_in, "W_out": w_out}, {"b_in": w_in, "b_out": w_out})
    assert s.up is not None
    dup = dpost * s.mlp_act  # post = act(gate) * up
    dpost *= s.up  # now dL/d act(gate)
    dgate = act_backward(dpost, s.mlp_pre, s.mlp_act)
    dx, w_in = linear_backward(dup, s.mlp_in, mlp["W_in"], "b_in" in mlp, want.params)
    dx_gate, w_gate = linear_backward(dgate, s.mlp_in, mlp["W_gate"], "b_gate" in mlp, want.params)
    dx += dx_gate
    weights = {"W_gate": w_gate, "W_in": w_in, "W_out": w_out}
    return dx, named(weights, {"b_gate": w_gate, "b_in": w_in, "b_out": w_out})


# ---------------------------------------------------------------------------- the block


def block_forward(
    x: np.ndarray, block: dict, cfg: TransformerConfig, window: int | None = None, keep_outputs: bool = False
) -> tuple[np.ndarray, LayerSaved]:
    """core.model.transformer_block over a batch: [batch, pos, d_model] -> same, and what backward needs.

    pre-norm: x + attn(ln1(x)), then + mlp(ln2(·)); parallel: x + attn(ln1(x)) + mlp(ln2(x));
    post-norm: ln1(x + attn(x)), then ln2(· + mlp(·)); attention-only: the first addition alone."""
    s = LayerSaved(resid_pre=x)
    post_norm = cfg.block_type == "post_norm"
    s.ln1_out = x if post_norm else norm(x, block["ln1"], cfg)
    attn_out = attention_forward(s.ln1_out, block["attn"], cfg, window, s, keep_outputs)
    if post_norm:
        s.sum1 = x + attn_out
        x = norm(s.sum1, block["ln1"], cfg)
        if cfg.attn_only:
            return x, s
        s.resid_mid = x
        s.sum2 = x + mlp_forward(x, block["mlp"], cfg, s, keep_outputs)
        return norm(s.sum2, block["ln2"], cfg), s
    mid = x + attn_out
    if cfg.attn_only:
        return mid, s
    s.resid_mid = mid
    s.ln2_in = x if cfg.parallel_attn_mlp else mid
    return mid + mlp_forward(norm(s.ln2_in, block["ln2"], cfg), block["mlp"], cfg, s, keep_outputs), s


def block_backward(
    dx: np.ndarray, block: dict, s: LayerSaved, cfg: TransformerConfig, want: Wanted, prefix: str
) -> tuple[np.ndarray, dict]:
    """From dL/d(resid_post) to dL/d(resid_pre) and the block's parameter gradients (shaped like block)."""
    g: dict = {}
    if cfg.block_type == "post_norm":
        if not cfg.attn_only:
            dsum2, g["ln2"] = norm_backward(dx, s.sum2, block["ln2"], cfg)  # type: ignore[arg-type]
            want.keep(prefix + "hook_mlp_out", dsum2)
            dx, g["mlp"] = mlp_backward(dsum2, block["mlp"], s, cfg, want)
            dx += dsum2  # resid_mid reaches ln2 directly and through the MLP
            want.keep(prefix + "hook_resid_mid", dx)
        dsum1, g["ln1"] = norm_backward(dx, s.sum1, block["ln1"], cfg)  # type: ignore[arg-type]
        want.keep(prefix + "hook_attn_out", dsum1)
        dh, g["attn"] = attention_backward(dsum1, block["attn"], s, cfg, want, prefix)
        dh += dsum1
        return dh, _order(g, block, want)
    d_parallel = None  # a parallel block's MLP read resid_pre: its gradient joins at the end
    if not cfg.attn_only:
        # resid_post = resid_mid + mlp(ln2(ln2_in)): the residual passes dx through unchanged.
        want.keep(prefix + "hook_mlp_out", dx)
        dh, g["mlp"] = mlp_backward(dx, block["mlp"], s, cfg, want)
        dmid, g["ln2"] = norm_backward(dh, s.ln2_in, block["ln2"], cfg)  # type: ignore[arg-type]
        if cfg.parallel_attn_mlp:
            d_parallel = dmid
        else:
            dx = dx + dmid
        want.keep(prefix + "hook_resid_mid", dx)
    # resid_mid = resid_pre + W_O(attention(ln1(resid_pre))).
    want.keep(prefix + "hook_attn_out", dx)
    dh, g["attn"] = attention_backward(dx, block["attn"], s, cfg, want, prefix)
    dpre, g["ln1"] = norm_backward(dh, s.resid_pre, block["ln1"], cfg)
    dpre += dx
    if d_parallel is not None:
        dpre += d_parallel
    return dpre, _order(g, block, want)


def _order(g: dict, block: dict, want: Wanted) -> dict:
    """The block's gradients in the block's own key order (empty when the parameters' are not wanted)."""
    return {key: g[key] for key in block if key in g} if want.params else {}
