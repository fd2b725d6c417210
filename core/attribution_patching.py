"""Attribution patching: every cell of a patching sweep estimated at once, from one forward and backward pass.

Activation patching (core/patching.py) runs the model again for each cell. Attribution patching (Neel Nanda,
"Attribution Patching: Activation Patching At Industrial Scale", 2023; Kramár et al., "AtP*", 2024) replaces
each patched run by the first-order Taylor estimate of its metric around the run it patches into:

    metric(base with a from source) ≈ metric(base) + (a_source − a_base) · ∂metric/∂a |base

so one pass of the base run that keeps each activation's gradient (core/backprop.py `gradients`), and the
source run's activations, give every cell. The base run is the one the exact sweep patches into: the
corrupted run when denoising, the clean run when noising; the grid is in the exact sweep's units (raw, and
normalised so that 0 is the corrupted run and 1 the clean run). A cell covers what its patch covers:

    resid_pre, resid_mid, resid_post, mlp_out   the product summed over d_model, at one layer and position
    attn_head                                   summed over a head's z at every position
    attn_head_pos                               ... at one position
    pattern                                     summed over a head's whole attention pattern

Where it is wrong: the estimate is linear, so it misses whatever the metric does beyond the first order.
A softmax that is saturated in the base run (an attention pattern, or the answer's probability, near 0 or 1)
has a gradient near zero there, so a patch that moves it a long way is estimated near zero; a patch whose
effect runs through several non-linear steps is estimated by their product of slopes (Kramár et al.'s AtP*
corrects the attention part by recomputing each key's softmax, and is not done here). The exact sweep is
the answer; the estimate says where to look, and its rank correlation with the exact grid how far to trust it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backprop import check_trainable, gradients
from .config import TransformerConfig
from .errors import InputError
from .functional import softmax
from .i18n import _
from .model import Params
from .patching import (
    PatchingResult,
    check_difference,
    check_sweep,
    require_causal_decoder,
    sweep_cells,
)


def require_gradients(cfg: TransformerConfig) -> None:
    """Attribution patching needs core/backprop.py's gradients for this configuration."""
    require_causal_decoder(cfg, _("attribution patching"))
    try:
        check_trainable(cfg)
    except InputError as refused:
        raise InputError(
            _(
                "attribution patching needs the metric's gradient, and core's backward pass does not cover this "
                "model yet ({reason}); use the exact sweep (method exact)"
            ).format(reason=refused)
        ) from None


def metric_gradient(logits: np.ndarray, metric: str, answer: int, wrong: int) -> tuple[float, np.ndarray]:
    """The metric of last-position logits [d_vocab] and its gradient with respect to them [d_vocab] (float64)."""
    logits = logits.astype(np.float64)
    grad = np.zeros_like(logits)
    if metric == "logit_diff":
        grad[answer], grad[wrong] = 1.0, -1.0
        return float(logits[answer] - logits[wrong]), grad
    probs = softmax(logits.copy())
    grad -= probs[answer] * probs  # d p_a / d z = p_a (onehot(a) − p)
    grad[answer] += probs[answer]
    return float(probs[answer]), grad


def attribution_sweep(
    params: Params,
    cfg: TransformerConfig,
    clean,
    corrupted,
    answer: int,
    wrong: int,
    target: str,
    *,
    direction: str = "denoise",
    metric: str = "logit_diff",
) -> PatchingResult:
    """core.patching.sweep's grid, estimated to first order (see the module docstring): one forward pass for
    the base run's logits (a probability's gradient depends on them), then one forward and backward pass of
    both runs side by side ([2, pos]), the metric's gradient taken in the base run only."""
    clean, corrupted, answer, wrong = check_sweep(cfg, clean, corrupted, answer, wrong, target, direction, metric)
    require_gradients(cfg)
    tokens = np.stack([clean, corrupted])  # [2, pos]: 0 the clean run, 1 the corrupted
    b, s = (1, 0) if direction == "denoise" else (0, 1)  # the base run (patched into) and the source
    n = clean.size
    dlogits = np.zeros((2, n, cfg.d_vocab))
    if metric == "logit_diff":  # linear in the logits: its gradient needs none of them
        dlogits[b, -1] = metric_gradient(np.zeros(cfg.d_vocab), metric, answer, wrong)[1]
    else:
        from .model import forward  # the base run's last logits, for the probability's gradient

        dlogits[b, -1] = metric_gradient(forward(params, cfg, tokens[b])[0][-1], metric, answer, wrong)[1]
    logits, grads = gradients(params, cfg, tokens, dlogits, param_grads=False)
    clean_metric = metric_gradient(logits[0, -1], metric, answer, wrong)[0]
    corrupted_metric = metric_gradient(logits[1, -1], metric, answer, wrong)[0]
    check_difference(metric, clean_metric, corrupted_metric)
    rows, columns, _cells = sweep_cells(cfg, n, target)

    def effect(layer: int, name: str) -> np.ndarray:  # (a_source − a_base) · ∂metric/∂a, element by element
        hooked = grads.activations[f"blocks.{layer}.{name}"]
        return (hooked.value[s].astype(np.float64) - hooked.value[b]) * hooked.grad[b]

    layers = range(cfg.n_layers)
    if target in ("resid_pre", "resid_mid", "resid_post", "mlp_out"):
        change = np.stack([effect(la, "hook_" + target).sum(axis=-1) for la in layers])  # [layers, pos]
    elif target == "attn_head":
        change = np.stack([effect(la, "attn.hook_z").sum(axis=(0, 2)) for la in layers])  # [layers, heads]
    elif target == "attn_head_pos":  # [pos, heads, d_head] -> rows (layer, head), columns positions
        change = np.concatenate([effect(la, "attn.hook_z").sum(axis=-1).T for la in layers])
    else:  # pattern: [heads, query_pos, key_pos]
        change = np.stack([effect(la, "attn.hook_pattern").sum(axis=(1, 2)) for la in layers])
    base_metric = (corrupted_metric, clean_metric)[b == 0]
    raw = base_metric + change
    return PatchingResult(
        target, direction, metric, False, clean_metric, corrupted_metric, raw, rows, columns, 0, "attribution"
    )


# ------------------------------------------------------------------ the estimate beside the exact sweep


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of a flat array, ties sharing their average rank (as Spearman's correlation ranks)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    order = np.argsort(values, kind="stable")
    ranked = np.empty(values.size)
    ranked[order] = np.arange(1, values.size + 1)
    _unique, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    for start, count in zip(first, counts):
        if count > 1:
            ranked[order[start : start + count]] = start + (count + 1) / 2
    return ranked


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two grids of the same shape (Pearson's of their ranks); NaN when either
    grid is constant."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = np.sqrt((ra @ ra) * (rb @ rb))
    return float(ra @ rb / scale) if scale > 0 else float("nan")


@dataclass(frozen=True)
class Disagreement:
    row: str
    column: str
    exact: float  # normalised
    estimate: float  # normalised


@dataclass(frozen=True)
class Comparison:
    """Attribution patching's estimate beside the exact sweep of the same grid."""

    spearman: float  # rank correlation of the normalised grids
    disagreements: list[Disagreement]  # the cells where they differ most (by at least DISAGREE), largest first


DISAGREE = 0.1  # a difference of a tenth of the clean-to-corrupted gap, in the normalised units
MOST_DISAGREEMENTS = 3


def compare(exact: PatchingResult, estimate: PatchingResult) -> Comparison:
    """How far the estimate can be trusted on this grid: its rank correlation with the exact sweep, and the cells
    where the two differ by DISAGREE or more (at most MOST_DISAGREEMENTS, the largest first)."""
    assert exact.raw.shape == estimate.raw.shape, "the same target's grid"
    a, b = exact.normalised, estimate.normalised
    gap = np.abs(a - b).ravel()
    worst = [int(i) for i in np.argsort(-gap, kind="stable")[:MOST_DISAGREEMENTS] if gap[i] >= DISAGREE]
    width = a.shape[1]
    return Comparison(
        spearman(a, b),
        [
            Disagreement(exact.rows[i // width], exact.columns[i % width], float(a.flat[i]), float(b.flat[i]))
            for i in worst
        ],
    )
