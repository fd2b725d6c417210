"""Activation patching: what would change if one activation came from another run.

Two texts of the same length: a *clean* one, where the model does something (predicts the answer),
and a *corrupted* one, where it cannot. Run both; then run one of them again with a single
activation taken from the other, and measure the prediction at the last position:

    denoise: the corrupted run, one activation from the clean run. How much of the clean behaviour
             does that activation bring back on its own?
    noise:   the clean run, one activation from the corrupted run. How much does the behaviour
             depend on it?

The metric is the logit difference between an `answer` and a `wrong` token (or the answer's
probability), reported raw and normalised so that 0 is the corrupted run and 1 the clean run.
A sweep patches every cell of a grid (TransformerLens names each after what it patches:
get_act_patch_resid_pre, get_act_patch_attn_head_out_all_pos, ...):

    resid_pre, resid_mid, resid_post, mlp_out   layer × position
    attn_head                                   layer × head, the head's output at every position
    attn_head_pos                               (layer, head) × position, one position's output
    pattern                                     layer × head, the head's whole attention pattern

A patched run goes through the model's own blocks (core.model.transformer_block) with a pass context
whose edit replaces what the patch changes (core.hooks.PassContext); nothing here re-implements a
block. It shares what it can with the run it patches: a patch at layer l starts at layer l from that
run's residual stream, and a patch at position p computes positions p, p+1, ... only, with the
earlier positions' keys and values from that run as a KV cache (the causal mask means they cannot
change). A full sweep of a layer × position grid is then about a quarter of the work of running
every patched pass whole.

Frozen attention: every attention pattern downstream of the patch can be held at its value in
the unpatched run (`frozen=True`), so a head's effect through later heads' *patterns* (their
queries and keys: Q- and K-composition) is cut, and what is left is its effect through values and
the direct path. The difference between the frozen and the recomputed grids is the effect through
attention patterns. `ablated_logits` does the same for head ablation.

Needs a causal, pre-norm decoder: the metric reads the next-token prediction at the last position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .attention import merge_heads
from .cache import ActivationCache, check_position, check_token, run_with_cache
from .config import TransformerConfig
from .errors import InputError
from .functional import softmax
from .hooks import PassContext
from .i18n import _
from .model import Ablation, Params, ablation_by_layer, norm, per_head_weights, transformer_block, unembedding
from .params import count_params

TARGETS = ("resid_pre", "resid_mid", "resid_post", "attn_head", "attn_head_pos", "pattern", "mlp_out")
DIRECTIONS = ("denoise", "noise")
METRICS = ("logit_diff", "prob")
POSITION_TARGETS = ("resid_pre", "resid_mid", "resid_post", "mlp_out")  # grids of layer × position
HEAD_TARGETS = ("attn_head", "pattern")  # grids of layer × head


@dataclass(frozen=True)
class Patch:
    """One activation to patch. `head` for attn_head and pattern; `pos` None: every position
    (for pattern: every query row)."""

    target: str  # one of TARGETS except attn_head_pos (that is attn_head with a position)
    layer: int
    head: int | None = None
    pos: int | None = None


# ------------------------------------------------------------------ checks


def require_causal_decoder(cfg: TransformerConfig, what: str | None = None) -> None:
    if cfg.block_type != "pre_norm" or not cfg.causal:
        message = (
            _(
                "{what} measures the next-token prediction at the last position, which needs a causal pre-norm "
                "decoder: this model is an encoder (post-norm, bidirectional)"
            )
            if cfg.block_type != "pre_norm"
            else _(
                "{what} measures the next-token prediction at the last position, which needs a causal "
                "pre-norm decoder: this model is running without the causal mask; turn causal back on"
            )
        )
        raise InputError(message.format(what=what or _("activation patching")))


def check_target(target: str, cfg: TransformerConfig) -> None:
    if target not in TARGETS:
        raise InputError(
            _("target {target!r} is not one of {choices}").format(target=target, choices=", ".join(TARGETS))
        )
    if cfg.attn_only and target in ("resid_mid", "mlp_out"):
        raise InputError(
            _("this model is attention-only: it has no MLP, so no {target}; choose {choices}").format(
                target=target, choices=", ".join(t for t in TARGETS if t not in ("resid_mid", "mlp_out"))
            )
        )


def check_pair(clean, corrupted) -> tuple[np.ndarray, np.ndarray]:
    clean, corrupted = np.asarray(clean), np.asarray(corrupted)
    if clean.shape != corrupted.shape:
        raise InputError(
            _(
                "the clean text has {clean} tokens and the corrupted text {corrupted}: patching swaps "
                "activations position by position, so both need the same number of tokens"
            ).format(clean=clean.size, corrupted=corrupted.size)
        )
    return clean, corrupted


def check_patch(patch: Patch, cfg: TransformerConfig, n: int) -> Patch:
    target = "attn_head" if patch.target == "attn_head_pos" else patch.target
    check_target(target, cfg)
    if not (isinstance(patch.layer, (int, np.integer)) and 0 <= patch.layer < cfg.n_layers):
        raise InputError(
            _("layer {layer!r} does not exist: the model has {n_layers} layer(s), counted from 0").format(
                layer=patch.layer, n_layers=cfg.n_layers
            )
        )
    head = patch.head
    if target in ("attn_head", "pattern"):
        if not (isinstance(head, (int, np.integer)) and 0 <= head < cfg.n_heads):
            raise InputError(
                _("head {head!r} does not exist: each layer has {n_heads} head(s), counted from 0").format(
                    head=head, n_heads=cfg.n_heads
                )
            )
        head = int(head)
    pos = None if patch.pos is None else check_position(patch.pos, n)
    return Patch(target, int(patch.layer), head, pos)


# ------------------------------------------------------------------ the two runs


def patching_hooks(cfg: TransformerConfig, target: str | None = None, frozen: bool = False) -> list[str]:
    """What a run must keep to be patched or patched from, for one target (None: every target).
    Keys and values come with every run (ActivationCache.past_kv)."""
    names = []
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        names.append(b + "hook_resid_pre")
        if target in (None, "attn_head", "attn_head_pos", "pattern"):
            names.append(b + "attn.hook_z")
        if frozen or target in (None, "pattern"):
            names.append(b + "attn.hook_pattern")
        if not cfg.attn_only:
            names += [b + "hook_resid_mid", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    return names


def run_for_patching(
    params: Params, cfg: TransformerConfig, tokens, target: str | None = None, frozen: bool = False
) -> ActivationCache:
    """One whole run keeping what `patching_hooks` names (no logits: the metric reads the last stream)."""
    require_causal_decoder(cfg)
    return run_with_cache(params, cfg, tokens, names=patching_hooks(cfg, target, frozen), logits=False)[1]


def last_logits(params: Params, cfg: TransformerConfig, resid: np.ndarray, columns=None) -> np.ndarray:
    """The final norm and the unembedding of one residual vector: [d_model] -> [d_vocab] (or just `columns`)."""
    W_U, b_U = unembedding(params)
    x = norm(resid, params.get("ln_final", {}), cfg)
    if columns is None:
        return x @ W_U if b_U is None else x @ W_U + b_U
    out = x @ W_U[:, columns]
    return out if b_U is None else out + b_U[columns]


def metric_columns(metric: str, answer: int, wrong: int) -> list[int] | None:
    """The logits a metric reads: two columns for a logit difference; the whole row for a probability."""
    return [answer, wrong] if metric == "logit_diff" else None


def metric_values(logits: np.ndarray, metric: str, answer: int, wrong: int) -> np.ndarray:
    """The metric of every row of what last_logits gave for metric_columns(metric, ...): the answer's logit
    minus the wrong token's, or the answer's probability.  # logits [k, columns] -> [k] (float64)"""
    if metric == "logit_diff":
        return (logits[:, 0] - logits[:, 1]).astype(np.float64)
    return softmax(logits.copy(), axis=-1)[:, answer].astype(np.float64)


def final_resid(cache: ActivationCache) -> np.ndarray:
    return cache[f"blocks.{cache.cfg.n_layers - 1}.hook_resid_post"][-1]


# ------------------------------------------------------------------ one patched run


class PassEditor:
    """The edit of a resumed run (PassContext's `edit`): replaces the activations a patch changes (`edits`,
    by hook name) and, from layer `frozen_from` on, recomputes each attention output from the unpatched
    run's patterns and this run's values."""

    def __init__(
        self,
        params: Params,
        cfg: TransformerConfig,
        base: ActivationCache,
        start: int,
        edits: Mapping[str, Callable[[np.ndarray], np.ndarray]],
        frozen_from: int | None,
        ablate: Mapping[int, Mapping[int, Ablation]] | None = None,
    ):
        self.params, self.cfg, self.base, self.start = params, cfg, base, start
        self.edits, self.frozen_from, self.ablate = edits, frozen_from, ablate or {}
        self._v: np.ndarray | None = None

    def __call__(self, name: str, value: np.ndarray) -> np.ndarray:
        if self.frozen_from is not None and name.startswith("blocks."):
            layer = int(name.split(".", 2)[1])
            if layer >= self.frozen_from:
                if name.endswith("attn.hook_v"):
                    self._v = value  # [new pos, n_kv_heads, d_head]
                elif name.endswith(".hook_attn_out"):
                    value = self._frozen_attention(layer)
        edit = self.edits.get(name)
        return value if edit is None else edit(value)

    def _frozen_attention(self, layer: int) -> np.ndarray:
        """This layer's output with the unpatched run's patterns: z = pattern @ V for every head."""
        cfg, start = self.cfg, self.start
        past_v = self.base.past_kv.values[layer][:, :start]  # [n_kv_heads, start, d_head]
        assert self._v is not None  # recorded by this layer's hook_v, before its attention is frozen
        v = np.concatenate([past_v, self._v.swapaxes(0, 1)], axis=1)  # [n_kv_heads, pos, d_head]
        pattern = self.base[f"blocks.{layer}.attn.hook_pattern"][:, start:]  # [n_heads, new pos, pos]
        n_new = pattern.shape[1]
        z = pattern.reshape(cfg.n_key_value_heads, cfg.group_size, n_new, -1) @ v[:, None]
        z = z.reshape(cfg.n_heads, n_new, -1)  # [n_heads, new pos, d_head]
        for head, how in self.ablate.get(layer, {}).items():
            z[head] = z[head].mean(axis=0) if how == "mean" else 0.0
        attn = self.params["blocks"][layer]["attn"]
        out = merge_heads(z) @ attn["W_O"]  # [new pos, d_model]
        return out + attn["b_O"] if "b_O" in attn else out


def resume(
    params: Params,
    cfg: TransformerConfig,
    base: ActivationCache,
    layer: int,
    start: int,
    x: np.ndarray,
    edits: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
    frozen_from: int | None = None,
    ablate: Mapping[int, Mapping[int, Ablation]] | None = None,
) -> np.ndarray:
    """Run the blocks from `layer` on, for positions start, start + 1, ... only, from their residual
    stream x [pos - start, d_model]; the earlier positions' keys and values are `base`'s (their
    activations cannot change under a causal mask). Returns the last position's final stream [d_model]."""
    # keeps nothing, so the blocks take their fast path (no attention scores or patterns made)
    ctx = PassContext((), edit=PassEditor(params, cfg, base, start, edits or {}, frozen_from, ablate))
    kv = base.past_kv
    for at in range(layer, cfg.n_layers):
        past = (kv.keys[at][:, :start], kv.values[at][:, :start]) if start else None
        x, _ = transformer_block(x, params["blocks"][at], cfg, ctx, at, (ablate or {}).get(at), past)
    return x[-1]


def _set_rows(new: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Replace the first len(new) rows (the patched positions) of an activation."""

    def edit(value: np.ndarray) -> np.ndarray:
        value = value.copy()
        value[: len(new)] = new
        return value

    return edit


def _add(delta: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    return lambda value: value + delta


def patched_resid(
    params: Params,
    cfg: TransformerConfig,
    base: ActivationCache,
    source: ActivationCache,
    patch: Patch,
    frozen: bool = False,
) -> np.ndarray:
    """The last position's final residual stream [d_model] of `base`'s run with one activation from `source`'s."""
    n = base.tokens.size
    patch = check_patch(patch, cfg, n)
    target, layer, head, pos = patch.target, patch.layer, patch.head, patch.pos
    start = 0 if pos is None else pos
    rows = slice(None) if pos is None else slice(pos, pos + 1)  # the patched positions
    b = f"blocks.{layer}."
    x = base[b + "hook_resid_pre"][start:]
    edits: dict[str, Callable] = {}
    frozen_from = layer + 1  # the patched layer's own attention reads an unpatched stream, except:
    if target == "resid_pre":
        x = _set_rows(source[b + "hook_resid_pre"][rows])(x)
        frozen_from = layer
    elif target in ("resid_mid", "resid_post", "mlp_out"):
        edits[b + "hook_" + target] = _set_rows(source[b + "hook_" + target][rows])
    else:  # a head's output, through its z: attn_out gains (z_new - z) @ W_O[h] at the patched positions
        assert head is not None  # a head's target names its head (check_patch)
        W_O = per_head_weights(params["blocks"][layer]["attn"], cfg)["W_O"][head]  # [d_head, d_model]
        z_base = base[b + "attn.hook_z"][rows, head]  # [pos, d_head]
        if target == "attn_head":
            z_new = source[b + "attn.hook_z"][rows, head]
        else:  # pattern: the source's pattern over the base run's values
            v = base.past_kv.values[layer][cfg.kv_head(head)]  # [pos, d_head]
            z_new = source[b + "attn.hook_pattern"][head][rows] @ v
        delta = np.zeros((n - start, W_O.shape[1]), dtype=np.result_type(z_new, W_O))
        delta[: len(z_new)] = (z_new - z_base) @ W_O
        if cfg.attn_only or cfg.parallel_attn_mlp:
            # Nothing in this block reads its attention's output (no MLP, or one that reads the block's input):
            # its output is the unpatched run's plus the change, and the run resumes at the next layer.
            x = base[b + "hook_resid_post"][start:] + delta
            if layer + 1 == cfg.n_layers:
                return x[-1]
            return resume(params, cfg, base, layer + 1, start, x, {}, frozen_from if frozen else None)
        edits[b + "hook_attn_out"] = _add(delta)
    return resume(params, cfg, base, layer, start, x, edits, frozen_from if frozen else None)


# ------------------------------------------------------------------ sweeps


@dataclass(frozen=True)
class PatchingResult:
    target: str
    direction: str
    metric: str
    frozen: bool
    clean_metric: float
    corrupted_metric: float
    raw: np.ndarray  # [rows, columns], the metric of each patched run
    rows: list[str]  # "L0", "L1", ... (attn_head_pos: "L0H0", "L0H1", ...)
    columns: list[str]  # positions "0", "1", ... or heads "H0", "H1", ...
    passes: int  # patched runs made (besides the clean and corrupted runs)

    @property
    def normalised(self) -> np.ndarray:
        """0: the corrupted run's metric; 1: the clean run's.  # [rows, columns]"""
        return (self.raw - self.corrupted_metric) / (self.clean_metric - self.corrupted_metric)


def sweep_cells(cfg: TransformerConfig, n: int, target: str) -> tuple[list[str], list[str], list[list[Patch]]]:
    """The grid a sweep fills: row labels, column labels and the patch of every cell."""
    check_target(target, cfg)
    layers, heads, positions = range(cfg.n_layers), range(cfg.n_heads), range(n)
    if target in POSITION_TARGETS:
        return (
            [f"L{la}" for la in layers],
            [str(p) for p in positions],
            [[Patch(target, la, None, p) for p in positions] for la in layers],
        )
    if target in HEAD_TARGETS:
        return (
            [f"L{la}" for la in layers],
            [f"H{h}" for h in heads],
            [[Patch(target, la, h) for h in heads] for la in layers],
        )
    return (
        [f"L{la}H{h}" for la in layers for h in heads],
        [str(p) for p in positions],
        [[Patch("attn_head", la, h, p) for p in positions] for la in layers for h in heads],
    )


def sweep_passes(cfg: TransformerConfig, n: int, target: str) -> int:
    """Patched runs in a sweep: one per cell."""
    check_target(target, cfg)
    if target in POSITION_TARGETS:
        return cfg.n_layers * n
    if target in HEAD_TARGETS:
        return cfg.n_layers * cfg.n_heads
    return cfg.n_layers * cfg.n_heads * n


def sweep_work(cfg: TransformerConfig, n: int, target: str, metric: str = "logit_diff") -> int:
    """Multiply-adds of a sweep as done here, the two whole runs included: each cell runs its layers from
    the patched one on, its positions from the patched one on (all of them for a whole head or pattern),
    then the last position's unembedding (two columns for a logit difference)."""
    per_block = count_params(cfg).per_block
    attend = cfg.n_heads * cfg.d_head

    def tail(layer: int, start: int) -> int:  # the work of one cell
        new, work = n - start, 0
        for at in range(layer, cfg.n_layers):
            window = cfg.window(at)
            visible = n if window is None else min(n, window)
            work += new * per_block + 3 * new * visible * attend  # blocks; QKᵀ, pattern @ V (+ frozen's)
        return work + cfg.d_model * (2 if metric == "logit_diff" else cfg.d_vocab)

    whole = 2 * (n * per_block * cfg.n_layers + 2 * n * n * attend * cfg.n_layers)
    rows, _, cells = sweep_cells(cfg, n, target)
    return whole + sum(tail(c.layer, c.pos or 0) for row in cells for c in row)


def sweep(
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
    frozen: bool = False,
) -> PatchingResult:
    """Patch every cell of a target's grid, one patched run per cell (see the module docstring)."""
    require_causal_decoder(cfg)
    clean, corrupted = check_pair(clean, corrupted)
    check_target(target, cfg)
    if direction not in DIRECTIONS:
        raise InputError(
            _("direction {direction!r} is not one of {choices}").format(
                direction=direction, choices=", ".join(DIRECTIONS)
            )
        )
    if metric not in METRICS:
        raise InputError(
            _("metric {metric!r} is not one of {choices}").format(metric=metric, choices=", ".join(METRICS))
        )
    answer, wrong = check_token(answer, cfg), check_token(wrong, cfg)
    if metric == "logit_diff" and answer == wrong:
        raise InputError(
            _(
                "the answer and the wrong token are the same token: their logit "
                "difference is always 0; choose a different wrong token"
            )
        )
    clean_run = run_for_patching(params, cfg, clean, target, frozen)
    corrupted_run = run_for_patching(params, cfg, corrupted, target, frozen)
    columns = metric_columns(metric, answer, wrong)

    def measure(resids: np.ndarray) -> np.ndarray:  # final streams [k, d_model] -> metrics [k]
        return metric_values(last_logits(params, cfg, resids, columns), metric, answer, wrong)

    # every cell's final stream, then the final norm and unembedding of all of them at once, the two runs' first
    # (so that a cell that restores a run exactly gives its metric exactly)
    clean_metric, corrupted_metric = map(float, measure(np.stack([final_resid(clean_run), final_resid(corrupted_run)])))
    if clean_metric == corrupted_metric:
        raise InputError(
            _(
                "the clean and corrupted texts give the same {metric} "
                "({clean_metric:.6g}): there is no difference for a patch to restore; "
                "change the corrupted text where it matters, or choose other answer and "
                "wrong tokens"
            ).format(metric=metric, clean_metric=clean_metric)
        )
    base, source = (corrupted_run, clean_run) if direction == "denoise" else (clean_run, corrupted_run)
    rows, cols, cells = sweep_cells(cfg, clean.size, target)
    streams = np.stack(
        [final_resid(clean_run), final_resid(corrupted_run)]
        + [patched_resid(params, cfg, base, source, cell, frozen) for row in cells for cell in row]
    )
    values = measure(streams)
    clean_metric, corrupted_metric = float(values[0]), float(values[1])
    raw = values[2:].reshape(len(cells), len(cells[0]))
    return PatchingResult(target, direction, metric, frozen, clean_metric, corrupted_metric, raw, rows, cols, raw.size)


# ------------------------------------------------------------------ ablation, frozen or recomputed


def ablated_logits(
    params: Params, cfg: TransformerConfig, tokens, ablate: Mapping[tuple[int, int], Ablation], *, frozen: bool = False
) -> np.ndarray:
    """The last position's logits [d_vocab] with heads ablated ({(layer, head): "zero"|"mean"}, as
    core.model.forward's `ablate`), every later attention pattern recomputed (frozen=False: the same
    numbers as forward(ablate=...)) or held at the unablated run's (frozen=True: only the ablated heads'
    direct and value paths act)."""
    require_causal_decoder(cfg, _("ablation's effect on the prediction"))
    by_layer = ablation_by_layer(ablate, cfg)
    first = min(by_layer, default=cfg.n_layers)
    names = [f"blocks.{first}.hook_resid_pre"] if first < cfg.n_layers else []
    if frozen:
        names += [f"blocks.{layer}.attn.hook_pattern" for layer in range(first, cfg.n_layers)]
    names.append(f"blocks.{cfg.n_layers - 1}.hook_resid_post")
    _logits, base = run_with_cache(params, cfg, tokens, names=names, logits=False)
    if first == cfg.n_layers:
        return last_logits(params, cfg, final_resid(base))
    resid = resume(
        params, cfg, base, first, 0, base[f"blocks.{first}.hook_resid_pre"], None, first if frozen else None, by_layer
    )
    return last_logits(params, cfg, resid)


# ------------------------------------------------------------------ the induction example


def induction_example(alphabet: str, length: int, seed: int = 0) -> tuple[str, str, str, str]:
    """A clean text whose end only induction predicts, and its corrupted twin: (clean, corrupted, answer, wrong).

    clean = s + s[:-1] for a random s of `length` characters: the next character is s[-1], found by
    looking up what followed s[-2] last time. corrupted = r + s[:-1], the first half resampled, so
    nothing earlier says what comes next; its own first half ends in `wrong` = r[-1], where a copier
    that lost track would land instead."""
    if length < 2 or len(alphabet) < 2:
        raise InputError(
            _("an induction example needs at least 2 characters of at least 2 kinds, got {length} of {kinds}").format(
                length=length, kinds=len(alphabet)
            )
        )
    rng = np.random.default_rng(seed)
    letters = list(alphabet)
    s = "".join(rng.choice(letters, length))
    r = "".join(rng.choice(letters, length))
    while r[-1] == s[-1]:
        r = r[:-1] + str(rng.choice(letters))
    return s + s[:-1], r + s[:-1], s[-1], r[-1]
