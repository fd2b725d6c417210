"""Token attribution (POST /api/v1/analysis/attribution, the Attribution page): which tokens of the text made the
model predict a token at one position (saliency, input × gradient, integrated gradients, occlusion), and what each
head moved from each source token into that logit (direct_logit). core/attribution.py computes; this prepares the
model once, resolves the target and contrast tokens, and prices the passes before computing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.service import capabilities
from app.service.circuits import token_id
from app.service.results import ModelResult, TokenRef, TopToken
from app.service.spec import RunSpec, Setup
from app.service.views import ModelViews
from core import InputError, run_with_cache
from core import attribution as core_attribution
from core.i18n import _
from core.params import forward_work

METHODS = core_attribution.METHODS  # the request's choices, its default steps and their limit, from core
DEFAULT_STEPS, MAX_STEPS = core_attribution.DEFAULT_STEPS, core_attribution.MAX_STEPS
PREDICTIONS = 10  # the most likely tokens at the position, listed for choosing a target or a contrast
BACKWARD_PASSES = 3  # a forward and backward pass costs about three forward passes (each product's two gradients)


@dataclass(frozen=True)
class AttributionPart:
    label: str  # "embed", "pos_embed", "L0 attn bias", "L0 mlp", "L0 mlp bias", ..., "final bias"
    value: float


@dataclass(frozen=True)
class Attribution(ModelResult):
    method: str
    position: int
    target: TokenRef
    contrast: TokenRef | None
    metric: float
    baseline_metric: float | None
    scores: list[float]  # [pos]
    steps: int | None
    convergence_delta: float | None
    heads: list[list[list[float]]] | None  # direct_logit: [layer][head][source pos]
    parts: list[AttributionPart] | None  # direct_logit: everything that is not a head's
    predictions: list[TopToken]  # at the position, most likely first


class AttributionViews:
    """Token attribution for one request, on its ModelViews' preparation and limits."""

    def __init__(self, views: ModelViews):
        self.views = views
        self.limits = views.limits

    def reason(self, spec: RunSpec, method: str) -> str | None:
        """Why this model and setting cannot be attributed by `method`, or None (nothing loaded)."""
        st = self.views.setup(spec)
        return self._reason(st, method)

    def _reason(self, st: Setup, method: str) -> str | None:
        if st.model.is_encoder:
            return _(
                "{model!r} is an encoder (BERT-style) without a language-model head: it predicts no token, so "
                "there is no logit to attribute. Choose a decoder such as 'induction' or a GPT-2 checkpoint"
            ).format(model=st.model.name)
        if method == "direct_logit":
            return capabilities.decomposition(st.model, st.cfg, _("direct logit attribution"))
        return None

    def _token(self, st: Setup, given: int | str, role: str) -> int:
        """A token id, or a token's text (as the page shows it, or a text that is one token), as the model's id."""
        if isinstance(given, int):
            if not 0 <= given < st.cfg.d_vocab:
                raise InputError(
                    _("the {role} token id {given} is not in {model!r}'s vocabulary 0 … {last}").format(
                        role=role, given=given, model=st.model.name, last=st.cfg.d_vocab - 1
                    )
                )
            return given
        return token_id(st, given, role)

    def attribute(
        self,
        spec: RunSpec,
        method: str,
        position: int = -1,
        target: int | str | None = None,
        contrast: int | str | None = None,
        steps: int = DEFAULT_STEPS,
    ) -> Attribution:
        st = self.views.setup(spec)
        capabilities.require(self._reason(st, method))
        cfg, n = st.cfg, st.n
        if not -n <= position < n:
            raise InputError(
                _("position {pos} is outside the text's {n} tokens: use 0 … {last}, or -1 for the last").format(
                    pos=position, n=n, last=n - 1
                )
            )
        position %= n
        core_attribution.check_steps(steps)
        target_id = None if target is None else self._token(st, target, _("target"))
        contrast_id = None if contrast is None else self._token(st, contrast, _("contrast"))
        seen = position + 1 if cfg.causal else n
        one = forward_work(cfg, seen, logits=False)  # a pass over the tokens the metric can depend on
        passes = core_attribution.passes(method, steps, seen)
        work = forward_work(cfg, n) + (
            0 if method == "direct_logit" else passes * one * (1 if method == "occlusion" else BACKWARD_PASSES)
        )
        rows = max(1, core_attribution.BATCH_VALUES // core_attribution.values_per_row(cfg, seen))
        largest = max(n * cfg.d_vocab, min(rows, passes) * cfg.n_heads * seen * seen, cfg.n_layers * cfg.n_heads * n)
        p = self.views.load(
            st,
            work,
            largest,
            _("the text's length, or steps") if method == "integrated_gradients" else _("the text's length"),
        )
        if method != "direct_logit" and (why := core_attribution.gradient_support(p.params, p.cfg)):
            raise InputError(
                _("{method} needs the model's gradients, which core does not compute for {model!r} yet: {why}").format(
                    method=method, model=p.model.name, why=why
                )
            )
        names = core_attribution.direct_logit_hooks(cfg) if method == "direct_logit" else ()
        logits, cache = run_with_cache(p.params, p.cfg, p.ids, names=names)
        probs = np.exp(logits[position] - logits[position].max())
        probs /= probs.sum()
        if target_id is None:
            target_id = int(np.argmax(probs))
        read = core_attribution.readout(p.params, p.cfg, target_id, contrast_id)
        heads, parts, baseline, used_steps, delta = None, None, None, None, None
        if method == "direct_logit":
            d = core_attribution.direct_logit_by_source(cache, position, read)
            metric, scores = d.metric, d.by_source
            heads, parts = d.heads.tolist(), [AttributionPart(label, value) for label, value in d.parts]
        else:
            a = core_attribution.token_attribution(p.params, p.cfg, p.ids, position, read, method, steps)
            metric, scores, baseline, used_steps, delta = (
                a.metric,
                a.scores,
                a.baseline_metric,
                a.steps,
                a.convergence_delta,
            )
        return Attribution(
            p,
            method=method,
            position=position,
            target=TokenRef(p.token_str(target_id), target_id),
            contrast=None if contrast_id is None else TokenRef(p.token_str(contrast_id), contrast_id),
            metric=metric,
            baseline_metric=baseline,
            scores=scores.tolist(),
            steps=used_steps,
            convergence_delta=delta,
            heads=heads,
            parts=parts,
            predictions=self.views.top_tokens(p, probs, PREDICTIONS),
        )
