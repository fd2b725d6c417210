"""Steering (`steer` on POST /api/v1/run and /api/v1/generate, the /generate page, the explorer's bars;
POST /api/v1/analysis/steering-vector): a request's steers made core's (core/steering.py `Steer`), each
checked against the model with the reason when it does not fit, and a steered run of a text.

A steer names a vector [d_model] or a feature of an SAE of EXPLORER_SAES_DIR (app/models/saes.py): that SAE
must read this model, at the steer's own hook, and have the feature. Everything is checked before any weight is
loaded, and priced: a steered run is the unsteered pass (what the steered one starts from, its patterns and its
prediction) and the steered pass, plus the SAE's encoding for each clamped feature.

A steering vector is the difference of means of two sets of texts at a residual-stream hook
(core.steering.difference_of_means: the mean over every token of every text of a, minus the same over b).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.service import capabilities
from app.service.features import FeatureViews
from app.service.results import AblationEffect, ModelResult, ProbabilityChange, RunResult
from app.service.spec import Prepared, RunSpec, Setup, Steering
from app.service.views import ModelViews
from core import InputError, TransformerConfig, run_with_cache
from core.i18n import _
from core.model import next_token_probs
from core.params import forward_work
from core.patching import last_logits
from core.steering import MAX_COEFFICIENT, STEERABLE, Steer, check_steer, difference_of_means, steer_layer, steered_run

__all__ = ["MAX_COEFFICIENT", "SteeringVector", "SteeringViews"]


@dataclass(frozen=True)
class SteeringVector(ModelResult):
    hook: str
    vector: np.ndarray  # [d_model]: mean over a's tokens − mean over b's
    norm: float
    tokens_a: int  # tokens averaged on each side
    tokens_b: int


def _layer(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("blocks.") else None


class SteeringViews:
    """Steered runs and steering vectors for one request, on its ModelViews' preparation and limits."""

    def __init__(self, views: ModelViews):
        self.views = views
        self.settings = views.settings
        self.features = FeatureViews(views)

    # ---------------------------------------------------------------- a request's steers, checked

    def steers(self, st: Setup, steering: Steering, n: int | None = None) -> list[Steer]:
        """core's steers for this setup (InputError naming the steer and the reason); `n`: the tokens its
        positions must lie within (default: the text's)."""
        capabilities.require(capabilities.steering(st.model, st.cfg))
        if st.ablate:
            raise InputError(
                _("steer and ablate cannot be combined in one request: steer, or ablate heads, not both at once")
            )
        if len(steering.steers) > self.settings.max_steers:
            raise InputError(
                _("{n} steers given, more than this server's limit of {limit}").format(
                    n=len(steering.steers), limit=self.settings.max_steers
                )
            )
        return [self._steer(i, s, st, st.n if n is None else n) for i, s in enumerate(steering.steers)]

    def _steer(self, i: int, s, st: Setup, n: int) -> Steer:
        cfg, model = st.cfg, st.model
        try:
            if (s.vector is None) == (s.sae is None):
                raise InputError(_("give either a vector or a feature (its SAE and index), not both or neither"))
            if s.vector is not None:
                if len(s.vector) != cfg.d_model:
                    raise InputError(
                        _(
                            "the vector has {got} numbers; the residual stream of {model!r} has d_model={d_model}: "
                            "give {d_model} numbers"
                        ).format(got=len(s.vector), model=model.name, d_model=cfg.d_model)
                    )
                steer = Steer(s.hook, np.asarray(s.vector, dtype=np.float64), s.coefficient, s.mode, s.positions)
            else:
                steer = self._feature(s, st)
            return check_steer(steer, cfg, n)
        except InputError as e:
            raise InputError(_("steer[{i}]: {problem}").format(i=i, problem=e)) from None

    def _feature(self, s, st: Setup) -> Steer:
        entry = self.features.saes.get_entry(s.sae)  # unknown: the names there are
        if (problem := self.features.problem(entry)) is not None:
            raise InputError(_("SAE {name!r} cannot be used: {problem}").format(name=s.sae, problem=problem))
        sae_cfg = entry.known_cfg
        if sae_cfg.model_name != st.model.name:
            raise InputError(
                _("SAE {sae!r} reads model {its!r}, not {model!r}: choose an SAE of {model!r}").format(
                    sae=s.sae, its=sae_cfg.model_name, model=st.model.name
                )
            )
        if sae_cfg.hook_name != s.hook:
            raise InputError(
                _("SAE {sae!r} reads {its}, not {hook}: steer at {its}, or choose an SAE of {hook}").format(
                    sae=s.sae, its=sae_cfg.hook_name, hook=s.hook
                )
            )
        if (problem := self.features._hook_problem(entry, st.cfg, st.model.name)) is not None:
            raise InputError(_("SAE {sae!r} does not fit this run: {problem}").format(sae=s.sae, problem=problem))
        if not 0 <= s.feature < sae_cfg.d_sae:
            raise InputError(
                _("feature {index} is not in SAE {sae!r}: it has features 0 to {last}").format(
                    index=s.feature, sae=s.sae, last=sae_cfg.d_sae - 1
                )
            )
        return Steer.of_feature(entry.load(), s.feature, s.coefficient, s.mode, s.positions, s.hook)

    @staticmethod
    def encode_work(steers: list[Steer], n: int) -> int:
        """Multiply-adds of the SAE encodings a clamped feature needs at one pass over n tokens."""
        return sum(n * s.sae.cfg.d_in * s.sae.cfg.d_sae for s in steers if s.sae is not None and s.mode == "clamp")

    # ---------------------------------------------------------------- a steered run (POST /api/v1/run)

    def run(self, spec: RunSpec, hooks: list[str], top_k: int) -> RunResult:
        """The run with its steers: the hooks asked for from the steered run (before the first steered layer
        they are the unsteered run's, the same; with frozen attention a frozen layer's hook_pattern is the
        unsteered pattern it used), the steered next-token top-k, and the unsteered top-k beside it."""
        assert spec.steering is not None
        st = self.views.setup(spec)
        cfg, n = st.cfg, st.n
        hooks = self.views.checked_hooks(st, hooks)
        steers = self.steers(st, spec.steering)
        if "ln_final.hook_normalized" in hooks:
            raise InputError(
                _(
                    "a steered run does not return ln_final.hook_normalized: ask for blocks.{last}.hook_resid_post, "
                    "the stream the final norm reads"
                ).format(last=cfg.n_layers - 1)
            )
        p = self.views.load(st, self.work(cfg, n, steers), cfg.d_vocab)
        logits, base_logits, cache = self.steered(p, steers, spec.steering.frozen_attention, hooks)
        probs, before = next_token_probs(logits[None]), next_token_probs(base_logits[None])
        top = self.views.top_tokens(p, probs, top_k) if top_k else []
        baseline = self.views.top_tokens(p, before, top_k) if top_k else []
        effect = AblationEffect(
            baseline,
            [
                ProbabilityChange(t.token, t.id, t.prob, float(probs[t.id]), float(probs[t.id]) - t.prob)
                for t in baseline
            ],
        )
        return RunResult(p, cache, top, None, effect)

    def work(self, cfg: TransformerConfig, n: int, steers: list[Steer]) -> int:
        """Two passes over the text (unsteered, steered) with two tokens' logits, and the SAEs' encodings."""
        return 2 * (forward_work(cfg, n, logits=False) + cfg.d_model * cfg.d_vocab) + self.encode_work(steers, n)

    @staticmethod
    def steered(
        p: Prepared, steers: list[Steer], frozen: bool, hooks: list[str]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(steered last logits [d_vocab], unsteered last logits, the hooks asked for, steered)."""
        cfg = p.cfg
        first = min(steer_layer(s, cfg)[0] for s in steers)
        frozen_from = min(steer_layer(s, cfg)[1] for s in steers) if frozen else None
        last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
        wanted = {f"blocks.{first}.hook_resid_pre", last, *hooks}
        if frozen:
            wanted |= {f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)}
        _logits, base = run_with_cache(p.params, cfg, p.ids, names=sorted(wanted), logits=False)
        later = [h for h in hooks if (layer := _layer(h)) is not None and layer >= first]
        run = steered_run(p.params, cfg, p.ids, steers, frozen_attention=frozen, names=later, base=base)

        def steered_or_used(name: str) -> np.ndarray:
            layer = _layer(name)
            if name not in run.cache:
                return base[name]  # before the first steered layer: the same in both runs
            if frozen_from is not None and layer is not None and layer >= frozen_from and "hook_pattern" in name:
                return base[name]  # the pattern the frozen layer used
            return run.cache[name]

        return run.logits, last_logits(p.params, cfg, base[last][-1]), {h: steered_or_used(h) for h in hooks}

    # ---------------------------------------------------------------- a steering vector

    def vector(self, spec: RunSpec, hook: str, texts_a: list[str], texts_b: list[str]) -> SteeringVector:
        """The mean of hook's activation over every token of texts_a minus the same over texts_b, one
        preparation of the model for all the texts (configured for the longest)."""
        limit = self.settings.steer_max_texts
        for side in (texts_a, texts_b):
            if not side or len(side) > limit:
                raise InputError(
                    _("a steering vector takes 1 to {limit} texts on each side, got {n}").format(
                        limit=limit, n=len(side)
                    )
                )
        setups = [self.views.setup(spec.replace(text=t)) for t in (*texts_a, *texts_b)]
        longest = max(st.n for st in setups)
        setups = [self.views.setup(spec.replace(text=t), longest) for t in (*texts_a, *texts_b)]
        st = setups[0]
        cfg = st.cfg
        capabilities.require(capabilities.steering(st.model, cfg))
        if STEERABLE.match(hook) is None:
            raise InputError(
                _("{hook!r} cannot be steered: use blocks.<layer>.hook_resid_pre, _mid or _post of this model").format(
                    hook=hook
                )
            )
        steer_layer(Steer(hook, np.zeros(cfg.d_model), 0.0), cfg)  # a residual-stream hook of this model
        work = sum(forward_work(cfg, s.n, logits=False) for s in setups)
        p = self.views.load(st, work, 0, _("the texts' number and length"))
        acts = [
            run_with_cache(p.params, cfg, np.asarray(s.encoding.ids), names=[hook], logits=False)[1][hook]
            for s in setups
        ]
        a, b = acts[: len(texts_a)], acts[len(texts_a) :]
        v = difference_of_means(a, b)
        return SteeringVector(p, hook, v, float(np.linalg.norm(v)), sum(len(x) for x in a), sum(len(x) for x in b))
