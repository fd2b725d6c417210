"""Every limit a view is checked against before it computes: the work and the largest array of a
request, token counts, what a lesson page can draw, what one explorer view may keep. The numbers are
the injected settings' (app/settings.py); the messages say what to reduce."""

from __future__ import annotations

import functools
import math

from app.models.catalog import Model
from app.settings import Settings
from core import InputError, TransformerConfig
from core.cache import pattern_hooks, residual_hooks, stage_hooks
from core.cell import cell_hooks
from core.hooks import hook_dims
from core.i18n import _


def _fmt(n: int | float) -> str:
    return f"{n:,.0f}"


def explorer_view_hooks(cfg: TransformerConfig, layer: int = 0, rollout: bool = False) -> list[str]:
    """The activations one explorer view keeps: every layer's residual stream, the chosen layer's
    stages (q, k, scores, pattern) and what opens one of its cells (v, z; rotary's unrotated q, k),
    and every layer's pattern with rollout."""
    hooks = residual_hooks(cfg) + stage_hooks(cfg, layer) + cell_hooks(cfg, layer)
    if rollout:
        hooks += [h for h in pattern_hooks(cfg) if h not in hooks]
    return hooks


def explorer_view_values(cfg: TransformerConfig, n: int, layer: int = 0, rollout: bool = False) -> int:
    """How many numbers that view keeps for a text of n tokens (settings.explorer_max_values bounds it)."""
    return sum(math.prod(hook_dims(h, cfg, n)) for h in explorer_view_hooks(cfg, layer, rollout))


@functools.lru_cache(maxsize=256)
def longest_fitting_text(cfg: TransformerConfig, limit: int, max_values: int) -> int:
    """The longest text, up to `limit` tokens, whose default view keeps at most max_values numbers
    (asked for twice per explorer page of a model: its text box and its check; sizes are fixed)."""
    if explorer_view_values(cfg, limit) <= max_values:
        return limit
    fits, too_many = 0, limit  # a view keeps more numbers the longer the text: bisect the boundary
    while too_many - fits > 1:
        mid = (fits + too_many) // 2
        fits, too_many = (mid, too_many) if explorer_view_values(cfg, mid) <= max_values else (fits, mid)
    return max(fits, 1)


class Limits:
    """The settings' limits, as checks that raise InputError naming what to reduce."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def check_cost(self, work: int, largest: int, reduce: str, *, pretrained: bool = False) -> None:
        """Refuse a request whose work or largest array exceeds the limits, naming what to reduce.

        A pretrained model (weights loaded, not drawn) has its own work limit: a real model's one pass
        is tens of billions of multiply-adds where a toy's is millions."""
        s = self.settings
        limit = s.max_pretrained_work if pretrained else s.max_work
        if work > limit:
            message = (
                _(
                    "this request needs about {work} multiply-adds, more than this server's limit of {limit} "
                    "for a pretrained model: reduce {reduce}"
                )
                if pretrained
                else _(
                    "this request needs about {work} multiply-adds, more than this server's limit of {limit}: "
                    "reduce {reduce}"
                )
            )
            raise InputError(message.format(work=_fmt(work), limit=_fmt(limit), reduce=reduce))
        if largest > s.max_elements:
            raise InputError(
                _(
                    "this request needs an array of {largest} numbers, more than this server's limit of "
                    "{limit}: reduce {reduce}"
                ).format(largest=_fmt(largest), limit=_fmt(s.max_elements), reduce=reduce)
            )

    @staticmethod
    def check_count(what: str, n: int, limit: int, hint: str) -> None:
        if n > limit:
            # what and hint: said through _() by the caller ("the text", "use a shorter text")
            raise InputError(
                _("{what} has {n:,} tokens, more than the limit of {limit:,}: {hint}").format(
                    what=what, n=n, limit=limit, hint=hint
                )
            )

    def check_drawable(self, n: int, prompt: bool = False) -> None:
        """A lesson page lays out T × T tables; beyond lesson_max_tokens they stop being legible
        (the JSON API still takes up to max_tokens). `prompt`: count the prompt's characters, not the
        text's words."""
        s = self.settings
        if n > s.lesson_max_tokens:
            message = (
                _(
                    "the prompt has {n} characters; this page draws up to {limit} (the API takes up to "
                    "{api_limit}): shorten it"
                )
                if prompt
                else _(
                    "the text has {n} words; this page draws up to {limit} (the API takes up to {api_limit}): "
                    "shorten it"
                )
            )
            raise InputError(message.format(n=n, limit=s.lesson_max_tokens, api_limit=s.max_tokens))

    def explorer_token_limit(self, model: Model) -> int:
        """Tokens the explorer draws for this model: explorer_max_tokens, or the model's context
        (n_ctx) where that is shorter (a model configured per text, the spec's, has no such bound),
        or, for a model of fixed sizes (a checkpoint, a trained model), the longest text whose default
        view keeps at most explorer_max_values numbers, so that the text box states the real limit. A
        learner's sizes (a toy's) are checked per view instead: that message names what to reduce."""
        s = self.settings
        cfg = model.configure({}, s.explorer_max_tokens)
        limit = min(s.explorer_max_tokens, cfg.n_ctx)
        return limit if model.draws_weights else longest_fitting_text(cfg, limit, s.explorer_max_values)

    def check_hook_values(self, values: int, advice: str) -> None:
        if values > self.settings.max_hook_values:
            # advice: a message through _() with {values} and {limit} (app/service/inspect.py, views.py)
            raise InputError(advice.format(values=f"{values:,}", limit=f"{self.settings.max_hook_values:,}"))
