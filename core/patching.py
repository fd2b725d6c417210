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
every patched pass whole. A sweep runs its cells in batches (sweep_batches, core.hooks.Batch): the cells
of one layer side by side in one pass's rows, each from its own patched position, so that each weight
matrix is read once for a few hundred rows instead of once per cell; the numbers are one run's per cell.

Frozen attention: every attention pattern downstream of the patch can be held at its value in
the unpatched run (`frozen=True`), so a head's effect through later heads' *patterns* (their
queries and keys: Q- and K-composition) is cut, and what is left is its effect through values and
the direct path. The difference between the frozen and the recomputed grids is the effect through
attention patterns. `ablated_logits` does the same for head ablation.

Needs a causal, pre-norm decoder: the metric reads the next-token prediction at the last position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .cache import ActivationCache, check_position, check_token, run_with_cache
from .config import TransformerConfig
from .errors import InputError
from .functional import softmax
from .hooks import Batch, PassContext
from .i18n import _
from .model import Ablation, Params, ablation_by_layer, norm, per_head_weights, transformer_block, unembedding
from .params import count_params

TARGETS = ("resid_pre", "resid_mid", "resid_post", "attn_head", "attn_head_pos", "pattern", "mlp_out")
DIRECTIONS = ("denoise", "noise")
METRICS = ("logit_diff", "prob")
METHODS = ("exact", "attribution")  # a patched run per cell, or attribution patching's estimate of it
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


class FrozenAttentionEditor:
    """A pass's edit (PassContext's `edit`) that applies `edits` by hook name and, from layer `frozen_from` on,
    replaces each attention output with one made from patterns another run made and this pass's values (its
    attn.hook_v, kept as `_v` on the way): a patched run's (PassEditor) or a steered step's (core/steering.py).
    Subclasses say how, in _frozen_attention(layer)."""

    edits: Mapping[str, Callable[[np.ndarray], np.ndarray]]
    frozen_from: int | None
    _v: np.ndarray | None

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
        raise NotImplementedError


class PassEditor(FrozenAttentionEditor):
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
        batch: Batch | None = None,
    ):
        self.params, self.cfg, self.base, self.start = params, cfg, base, start
        self.edits, self.frozen_from, self.ablate, self.batch = edits, frozen_from, ablate or {}, batch
        self._v = None

    def _frozen_attention(self, layer: int) -> np.ndarray:
        """This layer's output with the unpatched run's patterns: z = pattern @ V for every head (in a batched
        run, of every sequence: the same patterns, each its own values)."""
        cfg, start = self.cfg, self.start
        values = self.base.past_kv.values[layer]  # [n_kv_heads, pos, d_head]
        assert self._v is not None  # recorded by this layer's hook_v, before its attention is frozen
        new_v = self._v.swapaxes(0, 1)  # [n_kv_heads, rows, d_head]
        runs = [(slice(None), start, new_v.shape[1], 1)] if self.batch is None else self.batch.runs()
        z = np.empty((new_v.shape[1], cfg.n_heads, new_v.shape[2]), np.result_type(new_v, values))  # [rows, h, d]
        for rows, first, size, count in runs:
            # [count, n_kv_heads, pos, d_head]: the unpatched run's values before `first`, each sequence's after
            v = np.concatenate(
                [
                    np.broadcast_to(values[:, :first], (count, *values[:, :first].shape)),
                    new_v[:, rows].reshape(new_v.shape[0], count, size, -1).swapaxes(0, 1),
                ],
                axis=2,
            )
            pattern = self.base[f"blocks.{layer}.attn.hook_pattern"][:, first:]  # [n_heads, size, pos]
            zs = pattern.reshape(cfg.n_key_value_heads, cfg.group_size, size, -1) @ v[:, :, None]
            zs = zs.reshape(count, cfg.n_heads, size, -1)  # [count, n_heads, size, d_head]
            for head, how in self.ablate.get(layer, {}).items():
                zs[:, head] = zs[:, head].mean(axis=1, keepdims=True) if how == "mean" else 0.0
            z[rows] = zs.transpose(0, 2, 1, 3).reshape(count * size, cfg.n_heads, -1)
        attn = self.params["blocks"][layer]["attn"]
        out = z.reshape(z.shape[0], -1) @ attn["W_O"]  # [rows, d_model]
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
    batch: Batch | None = None,
) -> np.ndarray:
    """Run the blocks from `layer` on, for positions start, start + 1, ... only, from their residual
    stream x [pos - start, d_model]; the earlier positions' keys and values are `base`'s (their
    activations cannot change under a causal mask). Returns the last position's final stream [d_model].

    batch: x holds several variants of the run, each from its own start (core.hooks.Batch; `start` is then
    the earliest), and the result is each one's last final stream [variants, d_model]; `edits` see the
    activations of every variant's rows, one after the other."""
    # keeps nothing, so the blocks take their fast path (no attention scores or patterns made)
    ctx = PassContext((), edit=PassEditor(params, cfg, base, start, edits or {}, frozen_from, ablate, batch))
    kv = base.past_kv
    for at in range(layer, cfg.n_layers):
        past: tuple[np.ndarray, np.ndarray] | None
        if batch is not None:  # every variant's earlier keys: the unpatched run's, up to the latest start
            past = (kv.keys[at][:, : max(batch.starts)], kv.values[at][:, : max(batch.starts)])
        else:
            past = (kv.keys[at][:, :start], kv.values[at][:, :start]) if start else None
        x, _ = transformer_block(x, params["blocks"][at], cfg, ctx, at, (ablate or {}).get(at), past, batch)
    return x[-1] if batch is None else x[batch.ends()]


def _set_rows(new: np.ndarray, where: list[tuple[int, int]]) -> Callable[[np.ndarray], np.ndarray]:
    """Replace rows of an activation: row r with new[p] for each (r, p) of `where` (a patched position p)."""
    rows = np.array([r for r, _p in where])
    positions = np.array([p for _r, p in where])

    def edit(value: np.ndarray) -> np.ndarray:
        value = value.copy()
        value[rows] = new[positions]
        return value

    return edit


def _add(delta: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    return lambda value: value + delta


def patched_resids(
    params: Params,
    cfg: TransformerConfig,
    base: ActivationCache,
    source: ActivationCache,
    patches: Sequence[Patch],
    frozen: bool = False,
) -> np.ndarray:
    """The last position's final residual stream of `base`'s run with one activation from `source`'s, for each
    patch [len(patches), d_model], in one batched run (core.hooks.Batch) when there are several: the patches
    are of one target at one layer, and each variant runs from its patched position on (a whole head's or
    pattern's from position 0), as one patched run would."""
    n = base.tokens.size
    patches = [check_patch(p, cfg, n) for p in patches]
    target, layer = patches[0].target, patches[0].layer
    assert all(p.target == target and p.layer == layer for p in patches), "one batched run: one target, one layer"
    starts = [0 if p.pos is None else p.pos for p in patches]
    batch = None if len(patches) == 1 else Batch(tuple(starts), tuple(n - s for s in starts))
    offsets = np.cumsum([0] + [n - s for s in starts])  # each variant's first row
    # every row's position, and for each variant the rows (and positions) it patches
    positions = np.concatenate([np.arange(s, n) for s in starts])
    where = [
        (np.arange(offsets[i], offsets[i + 1]) if p.pos is None else np.array([offsets[i]]))
        for i, p in enumerate(patches)
    ]
    b = f"blocks.{layer}."
    x = base[b + "hook_resid_pre"][positions]  # [rows, d_model]
    edits: dict[str, Callable] = {}
    frozen_from = layer + 1  # the patched layer's own attention reads an unpatched stream, except:
    if target == "resid_pre":
        for rows in where:
            x[rows] = source[b + "hook_resid_pre"][positions[rows]]
        frozen_from = layer
    elif target in ("resid_mid", "resid_post", "mlp_out"):
        pairs = [(int(r), int(positions[r])) for rows in where for r in rows]
        edits[b + "hook_" + target] = _set_rows(source[b + "hook_" + target], pairs)
    else:  # a head's output, through its z: attn_out gains (z_new - z) @ W_O[h] at the patched positions
        W_O = per_head_weights(params["blocks"][layer]["attn"], cfg)["W_O"]  # [n_heads, d_head, d_model]
        z_base = base[b + "attn.hook_z"]  # [pos, n_heads, d_head]
        delta = np.zeros(x.shape, dtype=np.result_type(z_base, W_O))  # [rows, d_model]
        for rows, p in zip(where, patches):
            assert p.head is not None  # a head's target names its head (check_patch)
            at = positions[rows]
            if target == "attn_head":
                z_new = source[b + "attn.hook_z"][at, p.head]
            else:  # pattern: the source's pattern over the base run's values
                v = base.past_kv.values[layer][cfg.kv_head(p.head)]  # [pos, d_head]
                z_new = source[b + "attn.hook_pattern"][p.head][at] @ v
            delta[rows] = (z_new - z_base[at, p.head]) @ W_O[p.head]
        if cfg.attn_only or cfg.parallel_attn_mlp:
            # Nothing in this block reads its attention's output (no MLP, or one that reads the block's input):
            # its output is the unpatched run's plus the change, and the run resumes at the next layer.
            x = base[b + "hook_resid_post"][positions] + delta
            if layer + 1 == cfg.n_layers:
                return x[offsets[1:] - 1]
            return _each(
                resume(params, cfg, base, layer + 1, min(starts), x, {}, frozen_from if frozen else None, batch=batch)
            )
        edits[b + "hook_attn_out"] = _add(delta)
    return _each(resume(params, cfg, base, layer, min(starts), x, edits, frozen_from if frozen else None, batch=batch))


def _each(resid: np.ndarray) -> np.ndarray:
    """resume's answer as [variants, d_model], one variant or several."""
    return resid.reshape(-1, resid.shape[-1])


def patched_resid(
    params: Params,
    cfg: TransformerConfig,
    base: ActivationCache,
    source: ActivationCache,
    patch: Patch,
    frozen: bool = False,
) -> np.ndarray:
    """The last position's final residual stream [d_model] of `base`'s run with one activation from `source`'s."""
    return patched_resids(params, cfg, base, source, [patch], frozen)[0]


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
    passes: int  # patched runs made (besides the clean and corrupted runs); 0 for an estimate
    method: str = "exact"  # or "attribution": core/attribution_patching.py's first-order estimate

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


# Rows (variants x positions) of one batched patched run: enough that each weight matrix is read once for a few
# hundred rows (a matrix product's speed), few enough that the run's activations stay small.
BATCH_ROWS = 256


def sweep_batches(cfg: TransformerConfig, n: int, target: str) -> list[list[tuple[int, Patch]]]:
    """The sweep's cells (their index in the grid, row by row, and their patch) in the batches it runs them in:
    one target at one layer each, the cells sorted by their first position, as many as fit BATCH_ROWS rows
    (a cell's rows: its positions from its first patched one on; at least one cell a batch)."""
    _rows, _columns, cells = sweep_cells(cfg, n, target)
    width = len(cells[0])
    by_layer: dict[int, list[tuple[int, Patch]]] = {}
    for r, row in enumerate(cells):
        for c, cell in enumerate(row):
            by_layer.setdefault(cell.layer, []).append((r * width + c, cell))
    batches: list[list[tuple[int, Patch]]] = []
    for layer_cells in by_layer.values():
        layer_cells.sort(key=lambda item: item[1].pos or 0)
        rows = BATCH_ROWS
        for item in layer_cells:
            size = n - (item[1].pos or 0)
            if rows + size > BATCH_ROWS:
                batches.append([])
                rows = 0
            batches[-1].append(item)
            rows += size
    return batches


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
    _rows, _columns, cells = sweep_cells(cfg, n, target)
    return whole + sum(tail(c.layer, c.pos or 0) for row in cells for c in row)


def check_sweep(
    cfg: TransformerConfig, clean, corrupted, answer: int, wrong: int, target: str, direction: str, metric: str
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """What any sweep (exact, or attribution patching's estimate) checks before it runs."""
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
    return clean, corrupted, answer, wrong


def check_difference(metric: str, clean_metric: float, corrupted_metric: float) -> None:
    """A sweep normalises by the two runs' difference: there must be one."""
    if clean_metric == corrupted_metric:
        raise InputError(
            _(
                "the clean and corrupted texts give the same {metric} "
                "({clean_metric:.6g}): there is no difference for a patch to restore; "
                "change the corrupted text where it matters, or choose other answer and "
                "wrong tokens"
            ).format(metric=metric, clean_metric=clean_metric)
        )


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
    batched: bool = True,
) -> PatchingResult:
    """Patch every cell of a target's grid, one patched run per cell (see the module docstring), several cells
    to a batched run (sweep_batches; batched=False: one run each, the same numbers to rounding)."""
    clean, corrupted, answer, wrong = check_sweep(cfg, clean, corrupted, answer, wrong, target, direction, metric)
    clean_run = run_for_patching(params, cfg, clean, target, frozen)
    corrupted_run = run_for_patching(params, cfg, corrupted, target, frozen)
    columns = metric_columns(metric, answer, wrong)

    def measure(resids: np.ndarray) -> np.ndarray:  # final streams [k, d_model] -> metrics [k]
        return metric_values(last_logits(params, cfg, resids, columns), metric, answer, wrong)

    # every cell's final stream, then the final norm and unembedding of all of them at once, the two runs' first
    # (so that a cell that restores a run exactly gives its metric exactly)
    clean_metric, corrupted_metric = map(float, measure(np.stack([final_resid(clean_run), final_resid(corrupted_run)])))
    check_difference(metric, clean_metric, corrupted_metric)
    base, source = (corrupted_run, clean_run) if direction == "denoise" else (clean_run, corrupted_run)
    rows, cols, cells = sweep_cells(cfg, clean.size, target)
    streams = np.empty((2 + len(rows) * len(cols), cfg.d_model), final_resid(clean_run).dtype)
    streams[0], streams[1] = final_resid(clean_run), final_resid(corrupted_run)
    if batched:
        for batch in sweep_batches(cfg, clean.size, target):
            index = [2 + i for i, _cell in batch]
            streams[index] = patched_resids(params, cfg, base, source, [cell for _i, cell in batch], frozen)
    else:
        streams[2:] = [patched_resid(params, cfg, base, source, cell, frozen) for row in cells for cell in row]
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
