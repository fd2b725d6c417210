"""Which tokens made the model say this: token attribution, and direct logit attribution by head and source token.

The metric is the target token's logit at one position, or its difference with a contrast token's:
    metric(x) = logit_target(x) − logit_contrast(x)   at `position`
a function of the token embeddings x [pos, d_model] = W_E[tokens], before positions are added (the input of
Captum's embedding-layer attributions: LayerIntegratedGradients on the token-embedding module, or its
Saliency and IntegratedGradients on `inputs_embeds`). Each method gives every position i a score:

    saliency              ‖∂metric/∂x_i‖₂ over d_model (Simonyan et al. 2014; Captum's Saliency is |∂metric/∂x|)
    input_x_gradient      Σ_d x_i · ∂metric/∂x_i
    integrated_gradients  Σ_d x_i · Σ_k w_k ∂metric/∂x_i (α_k x), from the zero baseline, with α_k and w_k the
                          Gauss–Legendre nodes and weights on [0, 1] (Sundararajan et al. 2017; Captum's default
                          method, "gausslegendre"). Completeness: Σ_i scores = metric(x) − metric(0) up to the
                          quadrature's error, which `convergence_delta` reports (Captum's delta, the same sign)
    occlusion             metric(x) − metric(x with x_i = 0) (Zeiler & Fergus 2014; Captum's FeatureAblation
                          with each token's d_model numbers one feature, baseline 0)

The gradients come from core/backprop.py (metric_gradients: the backward pass training uses, for the
configurations its TRAINABLE table accepts), the integral's steps and the occluded texts as rows of one
batch. Under the causal mask the tokens after `position` cannot change the metric: they are left out of
the passes and score exactly 0.

direct_logit needs no gradient. With the final norm's scale σ frozen at the run's value (as
ActivationCache.decompose_resid does, core/analysis.py), the final residual stream maps linearly to the
metric, and the stream at `position` is the sum of what wrote it. A head's write is
    z[position, h] W_O[h] = Σ_j pattern[h, position, j] · v[j, h] W_O[h]
so what head h moved from source token j into the metric is pattern[h, position, j] · v[j, h] W_O[h] · r,
with r the metric's direction through the frozen norm (v includes b_V: the values' bias travels with each
source's weight). With the embeddings', each MLP's and each bias's parts (and the final norm's bias and b_U,
which no part writes) the heads' shares sum to the metric exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import backprop
from .cache import ActivationCache
from .config import TransformerConfig
from .errors import InputError
from .i18n import _
from .model import Params, per_head_weights, unembedding

GRADIENT_METHODS = ("saliency", "input_x_gradient", "integrated_gradients")
METHODS = (*GRADIENT_METHODS, "occlusion", "direct_logit")
DEFAULT_STEPS = 50  # integrated gradients' default number of steps: Captum's n_steps
MAX_STEPS = 512  # the most steps a request may ask for (its cost is priced besides: steps × a backward pass)
BATCH_VALUES = 2**25  # numbers one batch of passes may keep for its backward pass (256 MB in float64)


# ------------------------------------------------------------------ the metric


@dataclass(frozen=True)
class Readout:
    """The metric read from the final residual stream: ln_final(resid) · direction + bias."""

    target: int
    contrast: int | None
    direction: np.ndarray  # [d_model]: W_U[:, target] − W_U[:, contrast]
    bias: float  # b_U[target] − b_U[contrast] (0 without b_U)

    def of_logits(self, logits: np.ndarray) -> np.ndarray:
        """The metric from logits [..., d_vocab]."""
        return logits[..., self.target] - (0.0 if self.contrast is None else logits[..., self.contrast])


def readout(params: Params, cfg: TransformerConfig, target: int, contrast: int | None = None) -> Readout:
    """The metric's direction in the final norm's output: the target's unembedding column (minus the contrast's)."""
    for name, token in ((_("target"), target), (_("contrast"), contrast)):
        if token is not None and not 0 <= token < cfg.d_vocab:
            raise InputError(
                _("the {name} token id {token} is outside the vocabulary 0 … {last}").format(
                    name=name, token=token, last=cfg.d_vocab - 1
                )
            )
    if contrast is not None and contrast == target:
        raise InputError(
            _("the contrast token is the target itself, so the metric would be 0 everywhere: choose another token")
        )
    W_U, b_U = unembedding(params)
    direction = W_U[:, target] - (0.0 if contrast is None else W_U[:, contrast])
    bias = 0.0 if b_U is None else float(b_U[target] - (0.0 if contrast is None else b_U[contrast]))
    return Readout(target, contrast, np.ascontiguousarray(direction), bias)


def gauss_legendre(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Captum's "gausslegendre" rule on [0, 1]: nodes α_k = (1 + x_k) / 2 and weights w_k / 2, from the
    Legendre nodes x_k and weights w_k on [−1, 1]; exact for polynomials of degree up to 2·steps − 1."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return 0.5 * (1.0 + x), 0.5 * w


def check_steps(steps: int) -> int:
    if not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_STEPS:
        raise InputError(
            _("steps={steps!r}: integrated gradients takes 1 … {most} steps").format(steps=steps, most=MAX_STEPS)
        )
    return int(steps)


# ------------------------------------------------------------------ token attribution


def gradient_support(params: Params, cfg: TransformerConfig) -> str | None:
    """Why core/backprop.py cannot give this model's metric gradients, or None: its TRAINABLE table, and
    a final norm to read the metric through (a pre-norm decoder's)."""
    try:
        backprop.check_trainable(cfg)
    except InputError as refused:
        return str(refused)
    if cfg.block_type != "pre_norm":
        return _("the metric is read through the final norm of a pre-norm decoder; this model is {block_type}").format(
            block_type=cfg.block_type
        )
    return None


@dataclass(frozen=True)
class TokenAttribution:
    method: str
    position: int
    scores: np.ndarray  # [pos]; 0 after `position` under the causal mask
    metric: float  # the metric of the text itself
    baseline_metric: float  # the metric with every token embedding zero (positions kept): the baseline
    steps: int | None = None  # integrated gradients' steps
    convergence_delta: float | None = None  # integrated gradients: Σ scores − (metric − baseline_metric)


def values_per_row(cfg: TransformerConfig, n: int) -> int:
    """About how many numbers one row of a batch keeps for the backward pass (core/backprop.py's LayerSaved:
    the stream, the norms' outputs, q, k, v, z, the pattern, the MLP's two activations)."""
    heads = cfg.n_heads * cfg.d_head
    mlp = 0 if cfg.attn_only else 2 * cfg.d_model + 2 * cfg.d_mlp
    return n + cfg.n_layers * (n * (2 * cfg.d_model + 4 * heads + mlp) + cfg.n_heads * n * n)


def passes(method: str, steps: int, n: int) -> int:
    """Rows of the passes a method makes (its cost in passes over the text): the gradient methods one pass
    with its backward (integrated gradients one per step) and the baseline's forward; occlusion one forward
    per token besides the text's and the baseline's."""
    return {"integrated_gradients": steps + 1, "occlusion": n + 2}.get(method, 2)


def token_attribution(
    params: Params,
    cfg: TransformerConfig,
    tokens: np.ndarray,
    position: int,
    read: Readout,
    method: str,
    steps: int = DEFAULT_STEPS,
) -> TokenAttribution:
    """Every token's score for the metric at `position` by `method` (one of GRADIENT_METHODS or occlusion)."""
    if method not in (*GRADIENT_METHODS, "occlusion"):
        raise InputError(_("method {method!r} is not a token attribution method").format(method=method))
    if reason := gradient_support(params, cfg):
        raise InputError(_("{method} needs the model's gradients: {reason}").format(method=method, reason=reason))
    tokens = np.asarray(tokens)
    n = tokens.size
    if not -n <= position < n:
        raise InputError(
            _("position {pos} is outside the text's {n} tokens: use 0 … {last}, or -1 for the last").format(
                pos=position, n=n, last=n - 1
            )
        )
    position %= n
    seen = position + 1 if cfg.causal else n  # the tokens the metric can depend on
    x = params["embed"]["W_E"][tokens[:seen]]  # [seen, d_model]
    rows = max(1, BATCH_VALUES // values_per_row(cfg, seen))

    def run(embeds: np.ndarray, grad: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """metric [batch] (and gradients [batch, seen, d_model]) of a batch of embeddings, `rows` at a time."""
        metrics, grads = [], []
        for i in range(0, len(embeds), rows):
            m, g = backprop.metric_gradients(
                params, cfg, embeds[i : i + rows], position, read.direction, read.bias, grad=grad
            )
            metrics.append(m)
            grads.append(g)
        return np.concatenate(metrics), (np.concatenate(grads) if grad else None)  # type: ignore[arg-type]

    scores = np.zeros(n)
    zero = np.zeros_like(x)
    delta, used_steps = None, None
    if method == "occlusion":
        batch = np.repeat(x[None], seen + 2, axis=0)  # the text, the baseline, then the text without token i
        batch[1] = 0.0
        batch[np.arange(2, seen + 2), np.arange(seen)] = 0.0
        m = run(batch, grad=False)[0]
        metric, baseline = float(m[0]), float(m[1])
        scores[:seen] = m[0] - m[2:]
    elif method == "integrated_gradients":
        used_steps = check_steps(steps)
        alphas, weights = gauss_legendre(used_steps)
        g = run(alphas.astype(x.dtype)[:, None, None] * x, grad=True)[1]
        assert g is not None
        m = run(np.stack([x, zero]), grad=False)[0]
        metric, baseline = float(m[0]), float(m[1])
        mean_grad = np.tensordot(weights, g, axes=1)  # Σ_k w_k ∂metric/∂x (α_k x)  [seen, d_model]
        scores[:seen] = (x * mean_grad).sum(axis=-1)
        delta = float(scores.sum() - (metric - baseline))
    else:
        m, g = run(x[None], grad=True)
        assert g is not None
        metric, baseline = float(m[0]), float(run(zero[None], grad=False)[0][0])
        scores[:seen] = np.linalg.norm(g[0], axis=-1) if method == "saliency" else (x * g[0]).sum(axis=-1)
    return TokenAttribution(method, position, scores, metric, baseline, used_steps, delta)


# ------------------------------------------------------------------ direct logit attribution by head and source


def direct_logit_hooks(cfg: TransformerConfig) -> list[str]:
    """The activations direct_logit_by_source reads."""
    names = ["hook_embed", "hook_pos_embed"]
    for layer in range(cfg.n_layers):
        names += [f"blocks.{layer}.attn.hook_v", f"blocks.{layer}.attn.hook_pattern"]
        if not cfg.attn_only:
            names.append(f"blocks.{layer}.mlp.hook_post")
    return names + [f"blocks.{cfg.n_layers - 1}.hook_resid_post"]


@dataclass(frozen=True)
class DirectLogit:
    """The metric at `position` split into what wrote the final residual stream there, through the final norm
    with its scale frozen: sum(heads) + sum(part values) == metric."""

    position: int
    heads: np.ndarray  # [n_layers, n_heads, pos]: what each head moved from each source token (0 after position)
    parts: list[tuple[str, float]]  # embed, pos_embed, "L0 attn bias", "L0 mlp", "L0 mlp bias", ..., "final bias"
    scale: float  # the final norm's σ at position, frozen from the run
    metric: float  # the model's own metric (its logits'), which the parts sum to

    @property
    def by_source(self) -> np.ndarray:  # [pos]: every head's share from each source token
        return self.heads.sum(axis=(0, 1))


def direct_logit_by_source(cache: ActivationCache, position: int, read: Readout) -> DirectLogit:
    """What each head moved from each source token into the metric at `position`, and the other parts
    (needs direct_logit_hooks and the logits)."""
    cfg, params = cache.cfg, cache.params
    if cfg.block_type != "pre_norm":
        raise InputError(
            _("direct logit attribution needs a pre-norm model with a final norm; this model is {block_type}").format(
                block_type=cfg.block_type
            )
        )
    assert cache.logits is not None, "run with logits=True"
    n = cache.tokens.size
    resid = cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"][position]  # [d_model]
    rms = cfg.normalization_type in ("RMS", "RMSPre")
    scale = float(np.sqrt(np.mean(resid * resid) + cfg.eps)) if rms else float(np.sqrt(resid.var() + cfg.eps))
    ln = params.get("ln_final", {})
    r = (read.direction * ln["w"] if "w" in ln else read.direction) / scale  # [d_model]
    if not rms:
        r = r - r.mean()  # a layer norm centres its input: (p − p̄)·r = p·(r − r̄), part by part
    parts: list[tuple[str, float]] = [("embed", float(cache["hook_embed"][position] @ r))]
    if "hook_pos_embed" in cache:
        parts.append(("pos_embed", float(cache["hook_pos_embed"][position] @ r)))
    heads = np.zeros((cfg.n_layers, cfg.n_heads, n))
    for layer, block in enumerate(params["blocks"]):
        b = f"blocks.{layer}."
        W_O = per_head_weights(block["attn"], cfg)["W_O"]  # [n_heads, d_head, d_model]
        v = cache[b + "attn.hook_v"]  # [pos, n_key_value_heads, d_head]
        v = np.repeat(v, cfg.group_size, axis=1)  # [pos, n_heads, d_head]: head h reads key/value head h // group
        pattern = cache[b + "attn.hook_pattern"][:, position]  # [n_heads, key_pos]
        heads[layer] = pattern * np.einsum("jhd,hd->hj", v, W_O @ r)  # [n_heads, pos]
        if "b_O" in block["attn"]:
            parts.append((f"L{layer} attn bias", float(block["attn"]["b_O"] @ r)))
        if cfg.attn_only:
            continue
        mlp = block["mlp"]
        parts.append((f"L{layer} mlp", float(cache[b + "mlp.hook_post"][position] @ (mlp["W_out"] @ r))))
        if "b_out" in mlp:
            parts.append((f"L{layer} mlp bias", float(mlp["b_out"] @ r)))
    final_bias = read.bias + (float(ln["b"] @ read.direction) if "b" in ln else 0.0)
    parts.append(("final bias", final_bias))
    metric = float(read.of_logits(cache.logits[position]))
    return DirectLogit(position, heads, parts, scale, metric)
