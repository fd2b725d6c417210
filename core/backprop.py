"""Training's forward and backward pass, and the gradients of any metric: a batch of token ids in, every gradient out.

core/model.py runs one sequence and records activations by hook name for a reader; this module
runs a batch ([batch, pos]) and keeps, layer by layer, exactly what the backward pass needs. Both
are built from the same primitives (the norms, scaled_dot_product_attention's steps, the activations,
rotary), and a test holds the logits here equal to run_with_cache's, sequence by sequence. One block,
forward and backward, is core/backprop_blocks.py.

The backward pass is the forward pass read from the bottom up: each step calls the *_backward
function that sits beside its forward function (core/functional.py, core/attention.py) and turns
the gradient of the loss with respect to a step's output into the gradient with respect to its
input and its parameters. Matrices meet the chain rule as
y = x @ W  =>  dx = dy @ Wᵀ, dW = xᵀ @ dy (summed over batch and positions, which share W).

    logits, saved = forward(params, cfg, tokens)               # tokens [batch, pos]
    loss, grads = loss_and_grads(params, cfg, tokens, targets)  # grads: the shape of params
    logits, g = gradients(params, cfg, tokens, dlogits)         # any metric: g.params, g.embed, g.activations

Every family core.model runs has its backward pass: layer norm and RMS norm (with or without gains),
plain and gated MLPs with every activation, grouped- and multi-query attention, per-head query and key
norms, rotary positions of any base, width and pair layout, learned and sinusoidal positions, parallel
blocks, local windows, post-norm blocks (BERT) with segment embeddings, each bias switch on its own, tied
or untied unembedding, every weight layout core.model reads. tests/core/test_backward_families.py holds
the gradients equal to torch autograd's on checkpoints of each family. What training supports is still
declared once, field by field of TransformerConfig, in TRAINABLE below, so that a new field refuses to
train (saying so) until its backward pass is written and checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .backprop_blocks import (
    LayerSaved,
    Wanted,
    attention,
    block_backward,
    block_forward,
    linear,
    linear_backward,
    norm,
    norm_backward,
    rotate,
)
from .config import TransformerConfig
from .errors import InputError
from .functional import cross_entropy, cross_entropy_backward
from .i18n import _
from .model import Params, unembedding
from .positions import sinusoidal

__all__ = ["attention", "rotate"]  # re-exported: the batched attention and rotation tests call them here

# ---------------------------------------------------------------------------- what training supports

ANY = "any value"  # every value TransformerConfig itself accepts


@dataclass(frozen=True)
class Only:
    """The values of one config field that the forward and backward pass implement, and why no others.

    values: a tuple, or a function of the config for a field whose supported values depend on another."""

    values: tuple | Callable[[TransformerConfig], tuple]
    why: str

    def allowed(self, cfg: TransformerConfig) -> tuple:
        return self.values(cfg) if callable(self.values) else self.values


# Every field of TransformerConfig, classified: ANY, or Only(the values this module implements).
# check_trainable is computed from this table alone, and tests/core/test_backprop.py fails when
# TransformerConfig gains a field that is not classified here, so a new switch can never train
# through a backward pass that ignores it: until it is classified it is accepted only at its default.
# Every field is ANY today: each value has its backward pass, checked against finite differences
# (tests/core/test_backprop.py) and torch autograd (tests/core/test_backward_families.py).
TRAINABLE: dict[str, Only | str] = dict.fromkeys(
    (
        # sizes: every array's shape follows them
        "d_model",
        "n_layers",
        "n_heads",
        "d_vocab",
        "n_ctx",
        "d_head",
        "d_mlp",
        "act_fn",  # core.functional.ACTIVATION_BACKWARDS has each of ACTIVATIONS (a test holds them equal)
        "normalization_type",  # layer_norm_backward, rms_norm_backward
        "positional_embedding_type",
        "attention_dir",
        "use_attn_scale",
        "attn_temperature",
        "block_type",  # pre-norm, and post-norm (BERT)
        "bias",  # resolved into the four switches below, each implemented on its own
        "tied_embeddings",
        "n_token_types",  # segment embeddings: their table's gradient
        "eps",
        "attn_only",
        "n_key_value_heads",  # grouped-query attention: each key/value head's gradient summed over its group
        "gated_mlp",
        "rotary_dim",
        "rotary_base",
        "rotary_adjacent_pairs",
        "parallel_attn_mlp",
        "window_size",
        "attn_types",
        "use_qk_norm",  # per-head RMS norms of queries and keys
        "qkv_bias",
        "attn_out_bias",
        "mlp_bias",
        "unembed_bias",
    ),
    ANY,
)


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
class Saved:
    tokens: np.ndarray  # [batch, pos]
    token_types: np.ndarray | None  # [batch, pos], segment ids (n_token_types > 0)
    embed_sum: np.ndarray | None  # post-norm: token + position (+ segment) embeddings, ln_embed's input
    layers: list[LayerSaved]
    resid_final: np.ndarray  # [batch, pos, d_model], the last block's output
    ln_final_out: np.ndarray  # [batch, pos, d_model], the input of the unembedding


# ---------------------------------------------------------------------------- forward


def forward(
    params: Params, cfg: TransformerConfig, tokens: np.ndarray, *, token_types=None, keep_outputs: bool = False
) -> tuple[np.ndarray, Saved]:
    """Logits [batch, pos, d_vocab] of token ids [batch, pos], and what backward needs (keep_outputs: each
    block's attention and MLP outputs too, which gradients() reports and training does not need).
    token_types [batch, pos]: BERT's segment ids (None: all 0, as core.model.embed)."""
    check_trainable(cfg)
    tokens = np.asarray(tokens)
    n_pos = tokens.shape[-1]
    W_E = params["embed"]["W_E"]
    x = W_E[tokens]  # [batch, pos, d_model]
    if cfg.positional_embedding_type == "learned":
        x += params["pos_embed"]["W_pos"][:n_pos]
    elif cfg.positional_embedding_type == "sinusoidal":
        x += sinusoidal(n_pos, cfg.d_model).astype(W_E.dtype)
    types = None
    if cfg.n_token_types:
        types = np.zeros(tokens.shape, dtype=np.int64) if token_types is None else np.asarray(token_types)
        x += params["token_type_embed"]["W_token_type"][types]
    embed_sum = None
    if cfg.block_type == "post_norm":
        embed_sum, x = x, norm(x, params["ln_embed"], cfg)
    layers = []
    for layer, block in enumerate(params["blocks"]):
        x, saved = block_forward(x, block, cfg, cfg.window(layer), keep_outputs)
        layers.append(saved)
    resid_final = x
    if cfg.block_type == "pre_norm":
        x = norm(x, params["ln_final"], cfg)  # [batch, pos, d_model]
    W_U, b_U = unembedding(params)
    logits = linear(x, W_U, b_U)  # [batch, pos, d_vocab]
    return logits, Saved(tokens, types, embed_sum, layers, resid_final, x)


# ---------------------------------------------------------------------------- backward


def backward(params: Params, cfg: TransformerConfig, saved: Saved, dlogits: np.ndarray) -> Params:
    """Every parameter's gradient, in a dict shaped like params, from dL/dlogits [batch, pos, d_vocab]."""
    return _backward(params, cfg, saved, dlogits, Wanted())[0]


def _backward(
    params: Params, cfg: TransformerConfig, saved: Saved, dlogits: np.ndarray, want: Wanted
) -> tuple[Params, np.ndarray]:
    """The parameters' gradients (empty unless want.params) and dL/d(the token embeddings W_E[tokens])
    [batch, pos, d_model]: the gradient of the embeddings' sum, each of whose terms receives it."""
    grads: Params = {}
    W_U, b_U = unembedding(params)
    # Unembedding: logits = ln_final_out @ W_U (+ b_U).
    dx, g = linear_backward(dlogits, saved.ln_final_out, W_U, b_U is not None, want.params)
    if cfg.block_type == "pre_norm":
        dx, grads["ln_final"] = norm_backward(dx, saved.resid_final, params["ln_final"], cfg)

    block_grads = []
    for layer in reversed(range(len(saved.layers))):
        want.keep(f"blocks.{layer}.hook_resid_post", dx)
        dx, bg = block_backward(dx, params["blocks"][layer], saved.layers[layer], cfg, want, f"blocks.{layer}.")
        want.keep(f"blocks.{layer}.hook_resid_pre", dx)
        block_grads.append(bg)
    if saved.embed_sum is not None:  # post-norm: the embeddings' sum went through ln_embed
        dx, grads["ln_embed"] = norm_backward(dx, saved.embed_sum, params["ln_embed"], cfg)
    if not want.params:
        return {}, dx

    grads["blocks"] = block_grads[::-1]
    # Embeddings: x = W_E[tokens] + W_pos[:pos] (+ W_token_type[types]). Every occurrence adds its row's gradient.
    if cfg.tied_embeddings:  # W_U is W_E transposed: its gradient lands in the token table too
        dW_E = embedding_backward(dx, saved.tokens, g["w"].shape[1], out=g["w"].T)  # a view: no [d_vocab, d] copy
    else:
        dW_E = embedding_backward(dx, saved.tokens, params["embed"]["W_E"].shape[0])
        grads["unembed"] = {"W_U": g["w"]} | ({"b_U": g["b"]} if "b" in g else {})
    grads["embed"] = {"W_E": dW_E}
    if cfg.positional_embedding_type == "learned":
        dW_pos = np.zeros(params["pos_embed"]["W_pos"].shape, dtype=dx.dtype)
        dW_pos[: dx.shape[-2]] = dx.sum(axis=0)  # position p's row is shared by every sequence of the batch
        grads["pos_embed"] = {"W_pos": dW_pos}
    if saved.token_types is not None:
        table = params["token_type_embed"]["W_token_type"]
        grads["token_type_embed"] = {"W_token_type": embedding_backward(dx, saved.token_types, table.shape[0])}
    return {key: grads[key] for key in params if key in grads}, dx


def embedding_backward(dx: np.ndarray, tokens: np.ndarray, d_vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """dL/dW_E for x = W_E[tokens]: each row sums the gradients at every position holding that token
    (added into `out` [d_vocab, d_model] if given: a row no token holds is left as it is).

    dx [..., d_model], tokens [...] -> [d_vocab, d_model]. Equivalent to np.add.at(dW_E, tokens, dx),
    computed by sorting the positions by token and summing each run (np.add.reduceat), which is
    several times faster and adds in a fixed order (so results are reproducible bit for bit).
    """
    tokens = tokens.reshape(-1)
    dx = dx.reshape(tokens.size, -1)  # [batch * pos, d_model]
    order = np.argsort(tokens, kind="stable")
    ordered = tokens[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # where each token's run begins
    if out is None:
        out = np.zeros((d_vocab, dx.shape[-1]), dtype=dx.dtype)
        out[ordered[starts]] = np.add.reduceat(dx[order], starts, axis=0)
    else:
        out[ordered[starts]] += np.add.reduceat(dx[order], starts, axis=0)
    return out


# ---------------------------------------------------------------------------- loss


def loss_and_grads(
    params: Params, cfg: TransformerConfig, tokens: np.ndarray, targets: np.ndarray
) -> tuple[float, Params]:
    """Mean cross-entropy of predicting targets [batch, pos] from tokens [batch, pos], and its gradients."""
    logits, saved = forward(params, cfg, tokens)
    loss, probs = cross_entropy(logits, targets)
    return loss, backward(params, cfg, saved, cross_entropy_backward(probs, targets, out=probs))


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


def _check_token_types(cfg: TransformerConfig, tokens: np.ndarray, token_types) -> np.ndarray | None:
    if token_types is None:
        return None
    types = np.asarray(token_types)
    if not cfg.n_token_types or types.shape != tokens.shape or not np.issubdtype(types.dtype, np.integer):
        raise InputError(
            _(
                "segment ids (token_types) need a model with segment embeddings and integers shaped like the "
                "token ids, {shape}; this model has {n} segment types, and got shape {got}"
            ).format(shape=tokens.shape, n=cfg.n_token_types, got=types.shape)
        )
    if types.min() < 0 or types.max() >= cfg.n_token_types:
        raise InputError(
            _("segment ids must lie in [0, {n}), got {low}..{high}").format(
                n=cfg.n_token_types, low=types.min(), high=types.max()
            )
        )
    return types


def gradients(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    dlogits,
    *,
    token_types=None,
    hooks: bool = True,
    param_grads: bool = True,
) -> tuple[np.ndarray, Gradients]:
    """The logits [batch, pos, d_vocab] of token ids [batch, pos], and the gradients of a scalar metric of them.

    dlogits [batch, pos, d_vocab] is d metric / d logits: one-hot at (b, position, target) for the target's
    logit there, or +1 and −1 at the target and a contrast token for their difference; a loss's gradient
    (cross_entropy_backward) gives the training gradients. The metric being linear in the logits is not
    assumed: any dlogits is pulled back through the same pass (for a non-linear metric, compute the logits
    first and its gradient from them). hooks=False leaves `activations` empty (nothing extra is kept);
    param_grads=False skips the parameters' gradients (`params` None), about a third of the work.
    token_types [batch, pos]: BERT's segment ids (None: all 0). An encoder's logits are what core.model
    gives it: the last block's output times W_E transposed (BERT's masked-LM head is not loaded).
    Computed in the parameters' dtype.
    """
    check_trainable(cfg)
    tokens, dlogits = _check_batch(cfg, tokens, dlogits)
    token_types = _check_token_types(cfg, tokens, token_types)
    logits, saved = forward(params, cfg, tokens, token_types=token_types, keep_outputs=hooks)
    want = Wanted(params=param_grads, hooks={} if hooks else None)
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
                assert s.mlp_out is not None and s.resid_mid is not None
                values |= {"hook_resid_mid": s.resid_mid, "hook_mlp_out": s.mlp_out}
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
    not computed (the backward pass's `Wanted(params=False)`, as gradients(param_grads=False))."""
    check_trainable(cfg)
    n_pos = embeds.shape[1]
    x = np.array(embeds, dtype=np.result_type(embeds, params["embed"]["W_E"]))  # a copy: positions are added in place
    if cfg.positional_embedding_type == "learned":
        x += params["pos_embed"]["W_pos"][:n_pos]
    elif cfg.positional_embedding_type == "sinusoidal":
        x += sinusoidal(n_pos, cfg.d_model).astype(x.dtype)
    layers = []
    for layer, block in enumerate(params["blocks"]):
        x, saved = block_forward(x, block, cfg, cfg.window(layer))
        layers.append(saved)
    last = x[:, position]  # [batch, d_model]
    metric = norm(last, params["ln_final"], cfg) @ readout + bias  # [batch]
    if not grad:
        return metric, None
    dlast, _ = norm_backward(np.broadcast_to(readout.astype(x.dtype), last.shape), last, params["ln_final"], cfg)
    dx = np.zeros_like(x)
    dx[:, position] = dlast
    want = Wanted(params=False)
    for layer in reversed(range(len(layers))):
        dx, _ = block_backward(dx, params["blocks"][layer], layers[layer], cfg, want, f"blocks.{layer}.")
    return metric, dx
