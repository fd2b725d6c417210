"""Steering: push the residual stream along a direction and see what the model says then.

A steer adds `coefficient × direction` to one residual-stream hook (`blocks.{l}.hook_resid_pre`,
`hook_resid_mid` or `hook_resid_post`) at some positions (activation addition), or, given a sparse
autoencoder (core/sae.py) and one of its features, clamps that feature: the stream becomes the SAE's
reconstruction with the feature's activation set to `coefficient`, plus what the SAE does not reconstruct
(its error), as "Scaling Monosemanticity" clamps a feature:

    add:    x ← x + c · d                           d: a vector, or a feature's decoder row
    clamp:  x ← x + (c − a_i(x)) · W_dec[i]          = decode(a with a_i = c) + (x − decode(a)),  a = encode(x)
    clamp a vector (no SAE):  x ← x + (c − x·d / d·d) · d     x's component along d set to c units of d

With `frozen_attention`, every attention pattern from the first steered layer on is the unsteered run's:
the steer then reaches the output only through values and the direct path, not through where later heads
look (the comparison practitioners ask for; core/patching.py freezes patterns the same way).

The run starts from the unsteered run's stream at the first steered layer (nothing before it changes) and
goes on through core/model.py's blocks with the steers as PassContext edits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .cache import ActivationCache, run_with_cache
from .config import TransformerConfig
from .errors import InputError
from .hooks import PassContext, hook_names
from .i18n import _
from .model import Params, check_tokens, embed, transformer_block
from .patching import FrozenAttentionEditor, PassEditor, last_logits
from .sae import SAE
from .threads import team_for

Mode = Literal["add", "clamp"]
MODES = ("add", "clamp")
MAX_COEFFICIENT = 1000.0  # |coefficient| of one steer (a GPT-2 stream's norm is ~100; beyond this only noise)
STEERABLE = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|mid|post)$")


@dataclass(frozen=True)
class Steer:
    """One push. `direction` [d_model]: the vector added per unit of coefficient (for a feature, its decoder
    row); `positions`: the token positions it applies at (None: every one; negative counts from the end)."""

    hook: str
    direction: np.ndarray
    coefficient: float
    mode: Mode = "add"
    positions: tuple[int, ...] | None = None
    sae: SAE | None = None  # clamp: the SAE that reads the feature
    feature: int | None = None

    @classmethod
    def of_feature(
        cls,
        sae: SAE,
        feature: int,
        coefficient: float,
        mode: Mode = "add",
        positions: Sequence[int] | None = None,
        hook: str | None = None,
    ) -> Steer:
        """A steer along one SAE feature, at the SAE's own hook."""
        return cls(
            hook=hook or sae.cfg.hook_name,
            direction=sae.feature_direction(feature),
            coefficient=coefficient,
            mode=mode,
            positions=None if positions is None else tuple(positions),
            sae=sae,
            feature=feature,
        )


def steer_layer(steer: Steer, cfg: TransformerConfig) -> tuple[int, int]:
    """(the layer whose stream it changes, the first layer whose attention then reads a changed stream),
    checking the hook: a residual-stream hook of this model."""
    m = STEERABLE.match(steer.hook)
    if m is None or steer.hook not in hook_names(cfg):
        raise InputError(
            _("{hook!r} cannot be steered: use blocks.<layer>.hook_resid_pre, _mid or _post of this model").format(
                hook=steer.hook
            )
        )
    layer = int(m.group(1))
    return layer, layer if m.group(2) == "pre" else layer + 1


def check_steer(steer: Steer, cfg: TransformerConfig, n: int) -> Steer:
    steer_layer(steer, cfg)
    if steer.mode not in MODES:
        raise InputError(_("mode {mode!r}: choose add or clamp").format(mode=steer.mode))
    direction = np.asarray(steer.direction)
    if direction.shape != (cfg.d_model,):
        raise InputError(
            _("a steering vector for this model has d_model={d_model} numbers, not {got}").format(
                d_model=cfg.d_model, got=direction.size
            )
        )
    if not np.all(np.isfinite(direction)) or not np.isfinite(steer.coefficient):
        raise InputError(_("a steering vector and its coefficient must be finite numbers"))
    if abs(steer.coefficient) > MAX_COEFFICIENT:
        raise InputError(
            _("coefficient {c:g} is beyond ±{most:g}: choose a smaller push").format(
                c=steer.coefficient, most=MAX_COEFFICIENT
            )
        )
    if steer.mode == "clamp" and steer.sae is None and not np.any(direction):
        raise InputError(_("clamp sets the stream's component along the vector: give a vector that is not all zeros"))
    if steer.sae is not None and steer.sae.cfg.d_in != cfg.d_model:
        raise InputError(
            _("this SAE reads {d_in} numbers, the model's stream has {d_model}").format(
                d_in=steer.sae.cfg.d_in, d_model=cfg.d_model
            )
        )
    for pos in steer.positions or ():
        if not -n <= pos < n:
            raise InputError(
                _("pos={pos} is outside the text's {n} tokens: use 0 … {last}, or -1 for the last").format(
                    pos=pos, n=n, last=n - 1
                )
            )
    return steer


def _rows(steer: Steer, n: int, start: int = 0) -> np.ndarray | slice:
    """The rows of an activation of positions start, start + 1, ... (of a text of n tokens) the steer pushes."""
    if steer.positions is None:
        return slice(None)
    return np.array([p - start for p in sorted({p % n for p in steer.positions}) if p >= start], dtype=np.intp)


def _edit(steers: Sequence[Steer], n: int, start: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """The change the steers at one hook make to its activation [pos - start, d_model] (the positions start,
    start + 1, ... of a text of n tokens), in their order."""

    def edit(value: np.ndarray) -> np.ndarray:
        value = value.copy()
        for s in steers:
            rows = _rows(s, n, start)
            if isinstance(rows, np.ndarray) and rows.size == 0:
                continue  # none of its positions is among these rows
            direction = np.asarray(s.direction, dtype=value.dtype)
            if s.mode == "add":
                value[rows] += value.dtype.type(s.coefficient) * direction
            elif s.sae is None:  # clamp along a vector: its component, in units of the vector, set to c
                now = value[rows] @ direction / (direction @ direction)  # [rows]
                value[rows] += (value.dtype.type(s.coefficient) - now)[:, None] * direction
            else:
                assert s.sae is not None and s.feature is not None  # check_steer
                now = s.sae.encode(value[rows])[..., s.feature].astype(value.dtype)  # [rows]
                value[rows] += (value.dtype.type(s.coefficient) - now)[:, None] * direction
        return value

    return edit


@dataclass(frozen=True)
class SteeredRun:
    logits: np.ndarray  # [d_vocab]: the last position's, steered
    cache: dict[str, np.ndarray]  # the hooks asked for, from the steered run (from its first steered layer on)
    first_layer: int  # the first layer the steers change


def steered_run(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    steers: Sequence[Steer],
    *,
    frozen_attention: bool = False,
    names: Sequence[str] = (),
    base: ActivationCache | None = None,
) -> SteeredRun:
    """The model on `tokens` [pos] with every steer applied. `base`: the unsteered run's cache, if made
    already with every layer's resid_pre, keys and values, and (for frozen attention) patterns."""
    tokens = np.asarray(tokens)
    n = tokens.size
    steers = [check_steer(s, cfg, n) for s in steers]
    if not steers:
        raise InputError(_("steering needs at least one steer"))
    layers = [steer_layer(s, cfg) for s in steers]
    first = min(layer for layer, _ in layers)
    frozen_from = min(reads for _, reads in layers) if frozen_attention else None
    if base is None:
        wanted = [f"blocks.{first}.hook_resid_pre"]
        if frozen_attention:
            wanted += [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
        _logits, base = run_with_cache(params, cfg, tokens, names=wanted, logits=False)
    by_hook: dict[str, list[Steer]] = {}
    for s in steers:
        by_hook.setdefault(s.hook, []).append(s)
    edits: Mapping[str, Callable] = {hook: _edit(group, n) for hook, group in by_hook.items()}
    ctx = PassContext(names, edit=PassEditor(params, cfg, base, 0, edits, frozen_from))
    x = base[f"blocks.{first}.hook_resid_pre"]
    for layer in range(first, cfg.n_layers):
        x, _kv = transformer_block(x, params["blocks"][layer], cfg, ctx, layer)
    return SteeredRun(logits=last_logits(params, cfg, x[-1]), cache=ctx.cache, first_layer=first)


class SteeredDecoder:
    """Steered generation's state, a token at a time: the keys and values of every token so far, so that each new
    token costs a pass over itself alone (core.generate.generate_steered), the same numbers as a steered run
    (`steered_run`) of the whole text each time.

    Two runs are cached. The unsteered one, as far as the first steered layer (with frozen attention, through
    every layer: its patterns are the ones the steered run uses); the steered one, from the first steered layer
    on, from the unsteered stream there. Under a causal mask a token's activations never change once made, so
    a steered token's keys and values, cached, are those a whole steered run would make again; and the
    unsteered run's cache, over the same tokens (the steered text), gives the patterns frozen attention holds.

    `steers`' positions must be non-negative (they name tokens of the text, and stay on them as it grows);
    None pushes every token fed, each new one too."""

    def __init__(self, params: Params, cfg: TransformerConfig, steers: Sequence[Steer], frozen_attention: bool = False):
        if not steers:
            raise InputError(_("steering needs at least one steer"))
        assert all(p >= 0 for s in steers for p in s.positions or ()), "positions made non-negative first"
        self.params, self.cfg, self.steers = params, cfg, list(steers)
        layers = [steer_layer(s, cfg) for s in steers]
        self.first = min(layer for layer, _ in layers)
        self.frozen_from = min(reads for _, reads in layers) if frozen_attention else None
        self.by_hook: dict[str, list[Steer]] = {}
        for s in self.steers:
            self.by_hook.setdefault(s.hook, []).append(s)
        # the unsteered run's layers (up to the first steered one; every one if frozen), the steered run's
        self.base_layers = range(cfg.n_layers if frozen_attention else self.first)
        self.steered_layers = range(self.first, cfg.n_layers)
        empty = np.zeros((cfg.n_key_value_heads, 0, cfg.d_head), dtype=params["embed"]["W_E"].dtype)
        self.base_kv: list[tuple[np.ndarray, np.ndarray]] = [(empty, empty)] * len(self.base_layers)
        self.kv: list[tuple[np.ndarray, np.ndarray]] = [(empty, empty)] * len(self.steered_layers)
        self.n_tokens = 0

    def _frozen(self, layer: int) -> bool:
        return self.frozen_from is not None and layer >= self.frozen_from

    def feed(self, tokens) -> tuple[np.ndarray, np.ndarray]:
        """Read the next tokens [m] of the text: the steered logits after the last one [d_vocab], and its row of
        every layer's attention pattern [n_layers, n_heads, n_keys] (where attention is frozen, the unsteered
        pattern it used; before the first steered layer the unsteered run's, the same)."""
        cfg, params, start = self.cfg, self.params, self.n_tokens
        tokens = check_tokens(tokens, cfg, start)
        n = start + tokens.size
        pattern = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
        resume = f"blocks.{self.first}.hook_resid_pre"
        base_names = [
            resume,
            *(pattern[layer] for layer in self.base_layers if layer < self.first or self._frozen(layer)),
        ]
        with team_for(tokens.size) as team:
            ctx = PassContext(base_names, team)
            x = embed(params, cfg, tokens, ctx, start=start)
            for layer in self.base_layers:
                block = params["blocks"][layer]
                x, self.base_kv[layer] = transformer_block(x, block, cfg, ctx, layer, None, self.base_kv[layer])
            patterns = {layer: ctx.cache[pattern[layer]] for layer in self.base_layers if pattern[layer] in ctx.cache}
            if self.first in self.base_layers:  # frozen: the unsteered run went on past it
                x = ctx.cache[resume]
            editor = _StepEditor(self, start, n, patterns)
            ctx = PassContext(
                [pattern[layer] for layer in self.steered_layers if not self._frozen(layer)], team, editor
            )
            for i, layer in enumerate(self.steered_layers):
                editor.past_values = self.kv[i][1]
                x, self.kv[i] = transformer_block(x, params["blocks"][layer], cfg, ctx, layer, None, self.kv[i])
            used = [ctx.cache[name] if name in ctx.cache else patterns[layer] for layer, name in enumerate(pattern)]
            rows = np.stack([p[:, -1] for p in used])  # [n_layers, n_heads, n]
            logits = last_logits(params, cfg, x[-1])
        self.n_tokens = n
        return logits, rows


class _StepEditor(FrozenAttentionEditor):
    """The steered pass's edit (PassContext's `edit`) over the rows of positions start ... n - 1: the steers at
    their hooks; where attention is frozen, the output made from the unsteered pattern and this pass's values."""

    def __init__(self, decoder: SteeredDecoder, start: int, n: int, patterns: Mapping[int, np.ndarray]):
        self.decoder, self.patterns = decoder, patterns
        self.edits = {hook: _edit(group, n, start) for hook, group in decoder.by_hook.items()}
        self.frozen_from = decoder.frozen_from
        self.past_values: np.ndarray | None = None  # this layer's cached values [n_kv_heads, start, d_head]
        self._v = None

    def _frozen_attention(self, layer: int) -> np.ndarray:
        """z = the unsteered pattern of the new rows [n_heads, rows, n] @ every token's steered values, through W_O."""
        cfg = self.decoder.cfg
        assert self._v is not None and self.past_values is not None
        values = np.concatenate([self.past_values, self._v.swapaxes(0, 1)], axis=1)  # [n_kv_heads, n, d_head]
        pattern = self.patterns[layer]  # [n_heads, rows, n]
        rows = pattern.shape[1]
        z = pattern.reshape(cfg.n_key_value_heads, cfg.group_size, rows, -1) @ values[:, None]  # [kv, group, rows, d]
        attn = self.decoder.params["blocks"][layer]["attn"]
        out = z.reshape(cfg.n_heads, rows, -1).transpose(1, 0, 2).reshape(rows, -1) @ attn["W_O"]  # [rows, d_model]
        return out + attn["b_O"] if "b_O" in attn else out


def difference_of_means(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> np.ndarray:
    """[d_model]: the mean over every token of the texts `a` minus the same over `b` (each [pos, d_model])
    — activation addition's steering vector from two sets of texts (Turner et al.; Rimsky et al.)."""
    if not a or not b:
        raise InputError(_("a steering vector needs texts on both sides"))

    def mean(texts: Sequence[np.ndarray]) -> np.ndarray:  # over every token of every text
        return np.concatenate([np.asarray(x, dtype=np.float64) for x in texts]).mean(axis=0)

    return mean(a) - mean(b)
