"""Training's forward and backward pass: a batch of token ids in, the loss and every gradient out.

core/model.py runs one sequence and records activations by hook name for a reader; this module
runs a batch ([batch, pos]) and keeps, layer by layer, exactly what the backward pass needs. Both
are built from the same primitives (layer_norm, scaled_dot_product_attention's steps, the
activations, rotary), and a test holds the logits here equal to run_with_cache's, sequence by sequence.

The backward pass is the forward pass read from the bottom up: each step calls the *_backward
function that sits beside its forward function (core/functional.py, core/attention.py) and turns
the gradient of the loss with respect to a step's output into the gradient with respect to its
input and its parameters. Matrices meet the chain rule as
y = x @ W  =>  dx = dy @ Wᵀ, dW = xᵀ @ dy (summed over batch and positions, which share W).

    logits, saved = forward(params, cfg, tokens)               # tokens [batch, pos]
    loss, grads = loss_and_grads(params, cfg, tokens, targets)  # grads: the shape of params

What training supports is declared once, field by field of TransformerConfig, in TRAINABLE below:
pre-norm blocks (GPT-2's, or GPT-NeoX's parallel ones), with or without an MLP, every position
scheme (rotary with any base, part of the head or all of it, either pair layout), LN or LNPre,
each bias switch on its own, tied or untied unembedding, global and local layers, any mask, scale
and temperature. check_trainable is computed from that table and refuses every other configuration
with an InputError that says what to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

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
from .errors import InputError
from .functional import (
    ACTIVATION_BACKWARDS,
    ACTIVATIONS,
    cross_entropy,
    cross_entropy_backward,
    layer_norm,
    layer_norm_backward,
    softmax,
)
from .i18n import N_, _
from .model import Params, unembedding
from .positions import rotary, sinusoidal

# ---------------------------------------------------------------------------- what training supports

ANY = "any value"  # every value TransformerConfig itself accepts


@dataclass(frozen=True)
class Only:
    """The values of one config field that the forward and backward pass below implement, and why no others.

    values: a tuple, or a function of the config for a field whose one supported value depends on
    another (one key/value head per query head: n_key_value_heads == n_heads)."""

    values: tuple | Callable[[TransformerConfig], tuple]
    why: str

    def allowed(self, cfg: TransformerConfig) -> tuple:
        return self.values(cfg) if callable(self.values) else self.values


# Every field of TransformerConfig, classified: ANY, or Only(the values this module implements).
# check_trainable is computed from this table alone, and tests/core/test_backprop.py fails when
# TransformerConfig gains a field that is not classified here, so a new switch can never train
# through a backward pass that ignores it: until it is classified it is accepted only at its default.
TRAINABLE: dict[str, Only | str] = {
    # Sizes: every array's shape follows them.
    "d_model": ANY,
    "n_layers": ANY,
    "n_heads": ANY,
    "d_vocab": ANY,
    "n_ctx": ANY,
    "d_head": ANY,
    "d_mlp": ANY,
    "act_fn": Only(tuple(ACTIVATION_BACKWARDS), N_("core.functional has no backward pass for it")),
    "normalization_type": Only(("LN", "LNPre"), N_("the backward pass has layer norm's gradient, not RMS norm's")),
    "positional_embedding_type": ANY,
    "attention_dir": ANY,
    "use_attn_scale": ANY,
    "attn_temperature": ANY,
    "block_type": Only(
        ("pre_norm",), N_("the backward pass follows a pre-norm block; post-norm (BERT) is not implemented")
    ),
    "bias": ANY,  # resolved into the four switches below, each implemented on its own
    "tied_embeddings": ANY,
    "n_token_types": Only((0,), N_("segment embeddings (BERT) receive no gradient here")),
    "eps": ANY,
    "attn_only": ANY,
    "n_key_value_heads": Only(
        lambda cfg: (cfg.n_heads,),
        N_("grouped-query attention's shared keys and values are not implemented in the backward pass"),
    ),
    "gated_mlp": Only((False,), N_("the gated (SwiGLU) MLP has no backward pass here")),
    "rotary_dim": ANY,
    "rotary_base": ANY,
    "rotary_adjacent_pairs": ANY,
    "parallel_attn_mlp": ANY,
    "window_size": ANY,
    "attn_types": ANY,
    "use_qk_norm": Only((False,), N_("the query and key norms are RMS norms, which have no backward pass here")),
    "qkv_bias": ANY,
    "attn_out_bias": ANY,
    "mlp_bias": ANY,
    "unembed_bias": ANY,
}


def _choices(values: tuple) -> str:
    words = [str(v) if isinstance(v, str) else repr(v) for v in values]
    return words[0] if len(words) == 1 else _("{values} or {last}").format(values=", ".join(words[:-1]), last=words[-1])


def check_trainable(cfg: TransformerConfig) -> None:
    """Raise InputError, saying what to change, for a configuration training does not support: one
    that sets a field TRAINABLE limits to a value outside its Only, or a field TRAINABLE does not
    classify away from its default."""
    problems = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        support = TRAINABLE.get(f.name)
        if isinstance(support, str):  # ANY
            continue
        if support is None:  # a field newer than this table: refused until the backward pass is checked
            if value != f.default:
                problems.append(
                    _("{name}={value!r} (the backward pass does not implement it yet): leave it at {default!r}").format(
                        name=f.name, value=value, default=f.default
                    )
                )
            continue
        allowed = support.allowed(cfg)
        if value not in allowed:
            problems.append(
                _("{name}={value!r} ({why}): choose {choices}").format(
                    name=f.name, value=value, why=_(support.why), choices=_choices(allowed)
                )
            )
    if problems:
        raise InputError(_("training does not support {problems}").format(problems=_("; nor ").join(problems)))


@dataclass
class LayerSaved:
    """What one block's backward pass needs from its forward pass."""

    resid_pre: np.ndarray  # [batch, pos, d_model], the input of ln1
    ln1_out: np.ndarray  # [batch, pos, d_model], the input of W_QKV
    q: np.ndarray  # [batch, n_heads, pos, d_head] (rotated, with rotary positions)
    k: np.ndarray  # [batch, n_heads, pos, d_head]
    v: np.ndarray  # [batch, n_heads, pos, d_head]
    pattern: np.ndarray  # [batch, n_heads, query_pos, key_pos], the attention weights
    z: np.ndarray  # [batch, pos, n_heads * d_head], the heads' outputs side by side (the input of W_O)
    ln2_in: np.ndarray | None = None  # [batch, pos, d_model]: resid_mid, or resid_pre in a parallel block
    # (None when attn_only)
    ln2_out: np.ndarray | None = None  # [batch, pos, d_model], the input of W_in
    mlp_pre: np.ndarray | None = None  # [batch, pos, d_mlp], before the activation
    mlp_post: np.ndarray | None = None  # [batch, pos, d_mlp], after it (the input of W_out)
    attn_out: np.ndarray | None = None  # [batch, pos, d_model], kept only for gradients(hooks=True)
    mlp_out: np.ndarray | None = None  # [batch, pos, d_model], likewise


@dataclass
class Saved:
    tokens: np.ndarray  # [batch, pos]
    layers: list[LayerSaved]
    resid_final: np.ndarray  # [batch, pos, d_model], the input of ln_final
    ln_final_out: np.ndarray  # [batch, pos, d_model], the input of the unembedding


def _ln(x: np.ndarray, ln: dict, cfg: TransformerConfig) -> np.ndarray:
    return layer_norm(x, ln.get("w"), ln.get("b"), cfg.eps)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w + b over [batch, pos, d_in] -> [batch, pos, d_out], as one [batch * pos, d_in] product
    (NumPy would otherwise multiply sequence by sequence: one small BLAS call per batch row)."""
    out = x.reshape(-1, x.shape[-1]) @ w
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], w.shape[-1])


def _rotary(x: np.ndarray, cfg: TransformerConfig, sign: int = 1) -> np.ndarray:
    """The model's rotation of queries or keys [batch, n_heads, pos, d_head] (its base, rotated
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


# ---------------------------------------------------------------------------- forward


def forward(
    params: Params, cfg: TransformerConfig, tokens: np.ndarray, *, keep_outputs: bool = False
) -> tuple[np.ndarray, Saved]:
    """Logits [batch, pos, d_vocab] of token ids [batch, pos], and what backward needs (keep_outputs: each
    block's attention and MLP outputs too, which gradients() reports and training does not need)."""
    check_trainable(cfg)
    tokens = np.asarray(tokens)
    n_pos = tokens.shape[-1]
    W_E = params["embed"]["W_E"]
    x = W_E[tokens]  # [batch, pos, d_model]
    if cfg.positional_embedding_type == "learned":
        x += params["pos_embed"]["W_pos"][:n_pos]
    elif cfg.positional_embedding_type == "sinusoidal":
        x += sinusoidal(n_pos, cfg.d_model).astype(W_E.dtype)
    layers = []
    for layer, block in enumerate(params["blocks"]):
        x, saved = _block_forward(x, block, cfg, cfg.window(layer), keep_outputs)
        layers.append(saved)
    resid_final = x
    x = _ln(x, params["ln_final"], cfg)  # [batch, pos, d_model]
    W_U, b_U = unembedding(params)
    logits = _linear(x, W_U, b_U)  # [batch, pos, d_vocab]
    return logits, Saved(tokens, layers, resid_final, x)


def _block_forward(
    x: np.ndarray, block: dict, cfg: TransformerConfig, window: int | None = None, keep_outputs: bool = False
) -> tuple[np.ndarray, LayerSaved]:
    """x + attn(ln1(x)), then (unless attn_only) + mlp(ln2(·)) of that sum, or of x itself in a
    parallel block (GPT-NeoX).  # [batch, pos, d_model] -> same"""
    attn = block["attn"]
    h = _ln(x, block["ln1"], cfg)
    qkv = _linear(h, attn["W_QKV"], attn.get("b_QKV"))  # [batch, pos, 3 * n_heads * d_head]
    q, k, v = (split_heads(m, cfg.n_heads) for m in np.split(qkv, 3, axis=-1))  # each [batch, n_heads, pos, d_head]
    if cfg.positional_embedding_type == "rotary":
        q, k = _rotary(q, cfg), _rotary(k, cfg)
    pattern, z = attention(q, k, v, cfg, window)
    z = merge_heads(z)  # [batch, pos, n_heads * d_head]
    saved = LayerSaved(x, h, q, k, v, pattern, z)
    resid_pre = x
    attn_out = _linear(z, attn["W_O"], attn.get("b_O"))
    if keep_outputs:
        saved.attn_out = attn_out
    x = x + attn_out
    if cfg.attn_only:
        return x, saved
    mlp = block["mlp"]
    saved.ln2_in = resid_pre if cfg.parallel_attn_mlp else x
    saved.ln2_out = h = _ln(saved.ln2_in, block["ln2"], cfg)
    saved.mlp_pre = _linear(h, mlp["W_in"], mlp.get("b_in"))  # [batch, pos, d_mlp]
    saved.mlp_post = ACTIVATIONS[cfg.act_fn](saved.mlp_pre)
    mlp_out = _linear(saved.mlp_post, mlp["W_out"], mlp.get("b_out"))
    if keep_outputs:
        saved.mlp_out = mlp_out
    return x + mlp_out, saved


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: TransformerConfig, window: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(Q Kᵀ / divisor + mask) V for a batch: the pattern [batch, n_heads, query_pos, key_pos] and
    z [batch, n_heads, pos, d_head]. window: a local layer's span (cfg.window(layer); None: global).

    The steps of core.attention.scaled_dot_product_attention, in its order and with its functions (a
    test holds the two equal), done for a few sequences at a time (BATCH_BLOCK_SCORES) so that one
    block's scores stay in the CPU cache through scale, mask and softmax; the pattern is written in
    place of the scores, which training does not keep.
    """
    n_batch, n_heads, n_pos, d_head = q.shape
    divisor = attention_scale(d_head, cfg.use_attn_scale, cfg.attn_temperature)
    mask = causal_mask(n_pos) if cfg.causal else None
    if window is not None:  # a local layer also hides the keys `window` or more positions back
        mask = local_mask(n_pos, n_pos, window) if mask is None else mask | local_mask(n_pos, n_pos, window)
    pattern = np.empty((n_batch, n_heads, n_pos, n_pos), dtype=np.result_type(q, k))
    z = np.empty((n_batch, n_heads, n_pos, v.shape[-1]), dtype=np.result_type(pattern, v))
    # The mask as -inf and 0 to add: the same scores as writing -inf where it is True (a finite score plus 0
    # is itself), in one plain pass instead of a masked copy, the slowest step of this loop.
    minus_inf = None if mask is None else np.where(mask, -np.inf, 0.0).astype(pattern.dtype)
    block = max(1, BATCH_BLOCK_SCORES // (n_heads * n_pos * n_pos))  # sequences per block
    for i in range(0, n_batch, block):
        b = slice(i, i + block)
        s = np.matmul(q[b], np.swapaxes(k[b], -1, -2), out=pattern[b])  # [block, n_heads, query_pos, key_pos]
        s /= divisor
        if minus_inf is not None:
            s += minus_inf
        softmax(s, out=s)
        np.matmul(s, v[b], out=z[b])
    return pattern, z


# ---------------------------------------------------------------------------- backward


def _linear_backward(
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


def _ln_backward(dy: np.ndarray, x: np.ndarray, ln: dict, cfg: TransformerConfig) -> tuple[np.ndarray, dict]:
    dx, dw, db = layer_norm_backward(dy, x, ln.get("w"), cfg.eps)
    return dx, ({"w": dw, "b": db} if "w" in ln else {})


def _named(weights: dict[str, dict], biases: dict[str, dict]) -> dict:
    """{"W_in": g["w"], ...} then {"b_in": g["b"], ...} for each bias the layer has: a layer's biases are
    switched on and off one by one (qkv_bias without attn_out_bias, say), so each is looked up on its own."""
    return {name: g["w"] for name, g in weights.items() if "w" in g} | {
        name: g["b"] for name, g in biases.items() if "b" in g
    }


@dataclass
class _Wanted:
    """What one backward pass computes besides dL/d(its input): the parameters' gradients (params=False skips
    them), and, when `hooks` is a dict, each activation's gradient written into it by hook name."""

    params: bool = True
    hooks: dict[str, np.ndarray] | None = None

    def keep(self, name: str, grad: np.ndarray) -> None:
        if self.hooks is not None:
            self.hooks[name] = grad


def backward(params: Params, cfg: TransformerConfig, saved: Saved, dlogits: np.ndarray) -> Params:
    """Every parameter's gradient, in a dict shaped like params, from dL/dlogits [batch, pos, d_vocab]."""
    return _backward(params, cfg, saved, dlogits, _Wanted())[0]


def _backward(
    params: Params, cfg: TransformerConfig, saved: Saved, dlogits: np.ndarray, want: _Wanted
) -> tuple[Params, np.ndarray]:
    """The parameters' gradients (empty unless want.params) and dL/d(the embedded tokens) [batch, pos, d_model],
    the sum the first block reads (W_E[tokens] plus positions), whose gradient is each term's."""
    grads: Params = {}
    W_U, b_U = unembedding(params)
    # Unembedding: logits = ln_final_out @ W_U (+ b_U).
    dx, g = _linear_backward(dlogits, saved.ln_final_out, W_U, b_U is not None, want.params)
    dx, ln_final = _ln_backward(dx, saved.resid_final, params["ln_final"], cfg)  # [batch, pos, d_model]

    block_grads = []
    for layer in reversed(range(len(saved.layers))):
        want.keep(f"blocks.{layer}.hook_resid_post", dx)
        dx, bg = _block_backward(dx, params["blocks"][layer], saved.layers[layer], cfg, want, f"blocks.{layer}.")
        want.keep(f"blocks.{layer}.hook_resid_pre", dx)
        block_grads.append(bg)
    if not want.params:
        return grads, dx

    grads["ln_final"] = ln_final
    grads["blocks"] = block_grads[::-1]
    if cfg.tied_embeddings:
        dW_E = np.ascontiguousarray(g["w"].T)  # W_U is W_E transposed: its gradient lands in the token table
    else:
        dW_E = np.zeros_like(params["embed"]["W_E"])
        grads["unembed"] = {"W_U": g["w"]} | ({"b_U": g["b"]} if "b" in g else {})
    # Embeddings: x = W_E[tokens] + W_pos[:pos]. Every occurrence of a token adds its row's gradient.
    dW_E += embedding_backward(dx, saved.tokens, dW_E.shape[0])
    grads["embed"] = {"W_E": dW_E}
    if cfg.positional_embedding_type == "learned":
        dW_pos = np.zeros_like(params["pos_embed"]["W_pos"])
        dW_pos[: dx.shape[-2]] = dx.sum(axis=0)  # position p's row is shared by every sequence of the batch
        grads["pos_embed"] = {"W_pos": dW_pos}
    return grads, dx


def _block_backward(
    dx: np.ndarray, block: dict, s: LayerSaved, cfg: TransformerConfig, want: _Wanted, prefix: str
) -> tuple[np.ndarray, dict]:
    """From dL/d(resid_post) to dL/d(resid_pre) and the block's parameter gradients."""
    g: dict = {}
    d_parallel = None  # a parallel block's MLP read resid_pre: its gradient joins at the end
    if not cfg.attn_only:
        # resid_post = resid_mid + mlp(ln2(ln2_in)): the residual passes dx through unchanged.
        assert s.mlp_post is not None and s.mlp_pre is not None and s.ln2_out is not None and s.ln2_in is not None
        want.keep(prefix + "hook_mlp_out", dx)
        mlp = block["mlp"]
        dpost, w_out = _linear_backward(dx, s.mlp_post, mlp["W_out"], "b_out" in mlp, want.params)
        dpre = ACTIVATION_BACKWARDS[cfg.act_fn](dpost, s.mlp_pre, s.mlp_post)  # [batch, pos, d_mlp]
        dh, w_in = _linear_backward(dpre, s.ln2_out, mlp["W_in"], "b_in" in mlp, want.params)
        dmid, g["ln2"] = _ln_backward(dh, s.ln2_in, block["ln2"], cfg)
        if cfg.parallel_attn_mlp:
            d_parallel = dmid
        else:
            dx = dx + dmid
        want.keep(prefix + "hook_resid_mid", dx)
        g["mlp"] = _named({"W_in": w_in, "W_out": w_out}, {"b_in": w_in, "b_out": w_out})

    # resid_mid = resid_pre + W_O(attention(ln1(resid_pre))).
    want.keep(prefix + "hook_attn_out", dx)
    attn = block["attn"]
    dz, o = _linear_backward(dx, s.z, attn["W_O"], "b_O" in attn, want.params)  # dz [batch, pos, n_heads * d_head]
    want.keep(prefix + "attn.hook_z", dz.reshape(*dz.shape[:-1], cfg.n_heads, -1))
    dpattern = None if want.hooks is None else np.empty_like(s.pattern)
    dq, dk, dv = scaled_dot_product_attention_backward(
        split_heads(dz, cfg.n_heads),
        s.q,
        s.k,
        s.v,
        s.pattern,
        scale=cfg.use_attn_scale,
        temperature=cfg.attn_temperature,
        dweights=dpattern,
    )  # each [batch, n_heads, pos, d_head]
    if dpattern is not None:
        want.keep(prefix + "attn.hook_pattern", dpattern)
    if cfg.positional_embedding_type == "rotary":
        dq, dk = _rotary(dq, cfg, sign=-1), _rotary(dk, cfg, sign=-1)
    n_batch, n_heads, n_pos, d_head = dq.shape
    dqkv = np.empty((n_batch, n_pos, 3, n_heads, d_head), dtype=dq.dtype)  # W_QKV's column order: [Q | K | V] by head
    for i, part in enumerate((dq, dk, dv)):
        dqkv[:, :, i] = part.swapaxes(1, 2)  # [batch, pos, n_heads, d_head]
    dqkv = dqkv.reshape(n_batch, n_pos, -1)  # [batch, pos, 3 * n_heads * d_head]
    dh, qkv = _linear_backward(dqkv, s.ln1_out, attn["W_QKV"], "b_QKV" in attn, want.params)
    dpre, g["ln1"] = _ln_backward(dh, s.resid_pre, block["ln1"], cfg)
    g["attn"] = _named({"W_QKV": qkv, "W_O": o}, {"b_QKV": qkv, "b_O": o})
    dx = dx + dpre
    return (dx if d_parallel is None else dx + d_parallel), g


def embedding_backward(dx: np.ndarray, tokens: np.ndarray, d_vocab: int) -> np.ndarray:
    """dL/dW_E for x = W_E[tokens]: each row sums the gradients at every position holding that token.

    dx [..., d_model], tokens [...] -> [d_vocab, d_model]. Equivalent to np.add.at(dW_E, tokens, dx),
    computed by sorting the positions by token and summing each run (np.add.reduceat), which is
    several times faster and adds in a fixed order (so results are reproducible bit for bit).
    """
    tokens = tokens.reshape(-1)
    dx = dx.reshape(tokens.size, -1)  # [batch * pos, d_model]
    order = np.argsort(tokens, kind="stable")
    ordered = tokens[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # where each token's run begins
    dW_E = np.zeros((d_vocab, dx.shape[-1]), dtype=dx.dtype)
    dW_E[ordered[starts]] = np.add.reduceat(dx[order], starts, axis=0)
    return dW_E


# ---------------------------------------------------------------------------- loss


def loss_and_grads(
    params: Params, cfg: TransformerConfig, tokens: np.ndarray, targets: np.ndarray
) -> tuple[float, Params]:
    """Mean cross-entropy of predicting targets [batch, pos] from tokens [batch, pos], and its gradients."""
    logits, saved = forward(params, cfg, tokens)
    loss, probs = cross_entropy(logits, targets)
    return loss, backward(params, cfg, saved, cross_entropy_backward(probs, targets))


def loss(params: Params, cfg: TransformerConfig, tokens: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy of targets given tokens, both [batch, pos] (no gradients)."""
    return cross_entropy(forward(params, cfg, tokens)[0], targets)[0]


# ---------------------------------------------------------------------------- gradients of any metric


class Hooked(NamedTuple):
    """One activation of a batch of runs and the gradient of the metric with respect to it (same shape)."""

    value: np.ndarray
    grad: np.ndarray


@dataclass
class Gradients:
    """What gradients() returns beside the logits.

    params: every parameter's gradient, shaped like params (None when not asked for).
    embed: [batch, pos, d_model], d metric / d W_E[tokens]: the token embedding before positions are added
        (the input of Captum's embedding-layer attributions: saliency, input × gradient, integrated gradients).
    activations: by core's hook names (core/hooks.py), batch first, the value and the gradient of each
        activation patching can patch (core/patching.py's targets):
            blocks.{l}.hook_resid_pre, hook_resid_mid, hook_resid_post   [batch, pos, d_model]
            blocks.{l}.hook_attn_out, hook_mlp_out                        [batch, pos, d_model]
            blocks.{l}.attn.hook_z        [batch, pos, head_index, d_head]  (a head's output, before W_O)
            blocks.{l}.attn.hook_pattern  [batch, head_index, query_pos, key_pos]
        (no hook_resid_mid or hook_mlp_out in an attention-only model). Attribution patching's estimate of
        patching activation `name` from a corrupted run into a clean one is then
        ((corrupt.value − clean.value) * clean.grad), summed over the axes a patch covers.
    """

    params: Params | None
    embed: np.ndarray
    activations: dict[str, Hooked]


def _check_batch(cfg: TransformerConfig, tokens, dlogits) -> tuple[np.ndarray, np.ndarray]:
    tokens, dlogits = np.asarray(tokens), np.asarray(dlogits)
    if tokens.ndim != 2 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(
            _("expected token ids as a non-empty integer array [batch, pos], got shape {shape} of {dtype}").format(
                shape=tokens.shape, dtype=tokens.dtype
            )
        )
    if tokens.min() < 0 or tokens.max() >= cfg.d_vocab:
        raise InputError(
            _("token ids must lie in [0, {d_vocab}), got {low}..{high}").format(
                d_vocab=cfg.d_vocab, low=tokens.min(), high=tokens.max()
            )
        )
    if cfg.positional_embedding_type == "learned" and tokens.shape[1] > cfg.n_ctx:
        raise InputError(
            _("{n} tokens is longer than the model's context of n_ctx={n_ctx}").format(
                n=tokens.shape[1], n_ctx=cfg.n_ctx
            )
        )
    if dlogits.shape != (*tokens.shape, cfg.d_vocab):
        raise InputError(
            _("the metric's gradient must be shaped like the logits, {expected}, got {shape}").format(
                expected=(*tokens.shape, cfg.d_vocab), shape=dlogits.shape
            )
        )
    return tokens, dlogits


def gradients(
    params: Params, cfg: TransformerConfig, tokens, dlogits, *, hooks: bool = True, param_grads: bool = True
) -> tuple[np.ndarray, Gradients]:
    """The logits [batch, pos, d_vocab] of token ids [batch, pos], and the gradients of a scalar metric of them.

    dlogits [batch, pos, d_vocab] is d metric / d logits: one-hot at (b, position, target) for the target's
    logit there, or +1 and −1 at the target and a contrast token for their difference; a loss's gradient
    (cross_entropy_backward) gives the training gradients. The metric being linear in the logits is not
    assumed: any dlogits is pulled back through the same pass (for a non-linear metric, compute the logits
    first and its gradient from them). hooks=False leaves `activations` empty (nothing extra is kept);
    param_grads=False skips the parameters' gradients (`params` None), about a third of the work.
    Computed in the parameters' dtype; the configurations core/backprop.TRAINABLE accepts.
    """
    check_trainable(cfg)
    tokens, dlogits = _check_batch(cfg, tokens, dlogits)
    logits, saved = forward(params, cfg, tokens, keep_outputs=hooks)
    want = _Wanted(params=param_grads, hooks={} if hooks else None)
    grads, dembed = _backward(params, cfg, saved, dlogits.astype(logits.dtype, copy=False), want)
    activations: dict[str, Hooked] = {}
    if want.hooks is not None:
        posts = [s.resid_pre for s in saved.layers[1:]] + [saved.resid_final]
        for layer, (s, post) in enumerate(zip(saved.layers, posts)):
            assert s.attn_out is not None
            p = f"blocks.{layer}."
            values = {
                "hook_resid_pre": s.resid_pre,
                "attn.hook_z": s.z.reshape(*s.z.shape[:-1], cfg.n_heads, -1),
                "attn.hook_pattern": s.pattern,
                "hook_attn_out": s.attn_out,
            }
            if not cfg.attn_only:
                assert s.mlp_out is not None and s.ln2_in is not None
                mid = s.resid_pre + s.attn_out if cfg.parallel_attn_mlp else s.ln2_in
                values |= {"hook_resid_mid": mid, "hook_mlp_out": s.mlp_out}
            values["hook_resid_post"] = post
            activations |= {p + name: Hooked(value, want.hooks[p + name]) for name, value in values.items()}
    return logits, Gradients(grads if param_grads else None, dembed, activations)


# ---------------------------------------------------------------------------- a metric of given token embeddings
# For token attribution (core/attribution.py): the forward and backward passes above, fed token embeddings
# instead of token ids (integrated gradients scales them, occlusion zeroes one), read at one position through
# one direction of the unembedding instead of the whole vocabulary.


def metric_gradients(
    params: Params,
    cfg: TransformerConfig,
    embeds: np.ndarray,
    position: int,
    readout: np.ndarray,
    bias: float = 0.0,
    *,
    grad: bool = True,
) -> tuple[np.ndarray, np.ndarray | None]:
    """metric[b] = ln_final(resid_final[b, position]) · readout + bias, for token embeddings embeds
    [batch, pos, d_model] (W_E[tokens] for the text itself: positions are added here, as forward adds them),
    and d metric / d embeds [batch, pos, d_model] (None with grad=False: the forward pass alone).

    readout [d_model] is W_U's column of the target (minus the contrast's): the metric is that logit (or
    logit difference) without making the [batch, pos, d_vocab] logits. The parameters' gradients are
    not computed (the backward pass's `_Wanted(params=False)`, as gradients(param_grads=False))."""
    check_trainable(cfg)
    n_pos = embeds.shape[1]
    x = np.array(embeds, dtype=np.result_type(embeds, params["embed"]["W_E"]))  # a copy: positions are added in place
    if cfg.positional_embedding_type == "learned":
        x += params["pos_embed"]["W_pos"][:n_pos]
    elif cfg.positional_embedding_type == "sinusoidal":
        x += sinusoidal(n_pos, cfg.d_model).astype(x.dtype)
    layers = []
    for layer, block in enumerate(params["blocks"]):
        x, saved = _block_forward(x, block, cfg, cfg.window(layer))
        layers.append(saved)
    last = x[:, position]  # [batch, d_model]
    metric = _ln(last, params["ln_final"], cfg) @ readout + bias  # [batch]
    if not grad:
        return metric, None
    dlast, _ = _ln_backward(np.broadcast_to(readout.astype(x.dtype), last.shape), last, params["ln_final"], cfg)
    dx = np.zeros_like(x)
    dx[:, position] = dlast
    want = _Wanted(params=False)
    for layer in reversed(range(len(layers))):
        dx, _ = _block_backward(dx, params["blocks"][layer], layers[layer], cfg, want, f"blocks.{layer}.")
    return metric, dx
