"""The model views: a run's raw activations (the API's /run), the explorer page's every figure, and the
preparation both share (tokenise, configure, price, load the weights once). app/service/inspect.py
builds the Inspect views on the same preparation."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from app.models.catalog import Catalog, Model
from app.service import capabilities
from app.service.limits import Limits, explorer_view_hooks, explorer_view_values
from app.service.results import (
    AblationEffect,
    ExplorerView,
    HookInfo,
    HookList,
    ProbabilityChange,
    RunResult,
    ShapeRow,
    TopToken,
)
from app.service.spec import Prepared, RunSpec, Setup, ablation_map, check_toggles, configure
from app.settings import Settings
from core import InputError, TransformerConfig, hook_names, hook_shape, run_with_cache
from core.analysis import lens_logits
from core.cache import ActivationCache, stage_hooks
from core.hooks import hook_dims
from core.i18n import _
from core.model import next_token_probs
from core.params import count_params, forward_work, largest_array
from core.patching import ablated_logits


class ModelViews:
    """Runs of one model on one text, prepared once per view, for the API and the explorer."""

    def __init__(self, catalog: Catalog, settings: Settings, limits: Limits):
        self.catalog = catalog
        self.settings = settings
        self.limits = limits
        self.preparations = 0  # models prepared (weights loaded) for this request: one per view

    def models(self) -> Mapping[str, Model]:
        """Every model this server knows, runnable or not, by name."""
        return self.catalog

    def model(self, name: str) -> Model:
        """A model that can run (InputError saying why not, or listing the known names)."""
        model = self.catalog.get_model(name)
        if model.error:
            raise InputError(_("model {name!r} cannot run: {error}").format(name=name, error=model.error))
        return model

    def hooks(self, name: str, n_layers: int | None = None, positional_embedding_type: str | None = None) -> HookList:
        model = self.model(name)
        check_toggles(model, {"n_layers": n_layers, "positional_embedding_type": positional_embedding_type})
        cfg = model.cfg
        if n_layers is not None:
            cfg = cfg.replace(n_layers=n_layers)
        if positional_embedding_type is not None:
            cfg = cfg.replace(positional_embedding_type=positional_embedding_type)
        return HookList(model.name, cfg, [HookInfo(n, hook_shape(n, cfg)) for n in hook_names(cfg)])

    def setup(self, spec: RunSpec, n_tokens_for: int | None = None, *, page: bool = False) -> Setup:
        """Tokenise and configure a spec; refuse what this model cannot do, cheaply, before loading.
        page=True: the explorer page's token limit (explorer_token_limit) and its message."""
        model = self.model(spec.model)
        encoding = model.reader.encode(spec.text)
        n = len(encoding.ids)
        if page and n > (limit := self.limits.explorer_token_limit(model)):
            n_ctx = model.configure({}, limit).n_ctx
            context = (
                _("{model}'s context is {limit} tokens").format(model=model.name, limit=limit)
                if limit == n_ctx
                else _(
                    "a longer text's view of {model} would keep more than this server's limit of {values:,} numbers"
                ).format(model=model.name, values=self.settings.explorer_max_values)
                if limit < self.settings.explorer_max_tokens
                else _("the API at /api/v1/run takes up to {limit}").format(limit=self.settings.max_tokens)
            )
            raise InputError(
                _("the text has {n:,} tokens; the explorer draws up to {limit:,} ({context}): shorten the text").format(
                    n=n, limit=limit, context=context
                )
            )
        self.limits.check_count(_("the text"), n, self.settings.max_tokens, _("use a shorter text"))
        cfg = configure(model, spec, len(encoding.ids) if n_tokens_for is None else n_tokens_for)
        seed = spec.seed if spec.seed is not None else model.default_seed
        return Setup(model, cfg, encoding, ablation_map(spec.ablate, cfg), seed)

    def load(self, st: Setup, work: int, largest: int = 0, reduce: str | None = None) -> Prepared:
        """Check the cost of `work` multiply-adds (plus drawing the weights), then load the weights.

        Drawn weights count towards the work and the largest array; a checkpoint's are loaded once and
        kept (app/models/pretrained.py's memory budget), so its requests are priced by their own arrays, against
        the pretrained work limit."""
        s = self.settings
        reduce = reduce or _("the text's length, d_model, n_layers or n_heads")
        drawn = count_params(st.cfg).total if st.model.draws_weights else 0
        if st.model.draws_weights and drawn > s.max_params:
            raise InputError(
                _(
                    "a model of this size has {drawn:,} parameters, more than the limit of {max_params:,}: "
                    "reduce d_model or n_layers"
                ).format(drawn=drawn, max_params=s.max_params)
            )
        self.limits.check_cost(
            drawn + work,
            max(largest, largest_array(st.cfg, st.n, weights=st.model.draws_weights)),
            reduce,
            pretrained=not st.model.draws_weights,
        )
        self.preparations += 1
        params = st.model.weights(st.cfg, st.seed, st.encoding)
        return Prepared(st.model, st.cfg, st.encoding, st.ablate, st.seed, params)

    def _resolve_hooks(self, wanted: list[str], cfg: TransformerConfig, model_name: str) -> list[str]:
        names = hook_names(cfg)
        known = set(names)
        unknown = [h for h in wanted if h not in known]
        if unknown:
            raise InputError(
                _(
                    "unknown hook name {hook!r} for model {model!r} with {n_layers} layer(s): hooks look "
                    "like {example!r}; GET /api/v1/hooks?model={model} lists all {n}"
                ).format(hook=unknown[0], model=model_name, n_layers=cfg.n_layers, example=names[-4], n=len(names))
            )
        return list(dict.fromkeys(wanted))  # drop repeats, keep the order asked

    def checked_hooks(self, st: Setup, hooks: list[str]) -> list[str]:
        """The hooks a run returns: known to this model, each once, and within the response's limit."""
        hooks = self._resolve_hooks(hooks, st.cfg, st.model.name)
        self.limits.check_hook_values(
            sum(math.prod(hook_dims(h, st.cfg, st.n)) for h in hooks),
            _(
                "the hooks asked for hold {values} numbers, more than the limit of {limit} "
                "per response: ask for fewer hooks or use a shorter text"
            ),
        )
        return hooks

    def top_tokens(self, p: Prepared, probs: np.ndarray, k: int) -> list[TopToken]:
        """The k most probable tokens, most probable first (ties: the lower id first).  # probs [d_vocab]"""
        best = np.argsort(-probs, kind="stable")[: min(k, probs.size)]
        return [TopToken(p.token_str(int(i)), int(i), float(probs[i])) for i in best]

    @staticmethod
    def _run_last(p: Prepared, names: list[str], ablate: Mapping | None) -> tuple[np.ndarray, ActivationCache]:
        """One pass keeping `names`, with the logits of the last position only: [1, d_vocab].

        Only the next-token prediction needs logits, and every position's would be the largest array
        of a run on a real vocabulary (128 tokens × 151,936 for Qwen) and a fifth of its work. In a
        pre-norm model the last position's logits are the final norm and unembedding of the last
        residual stream: core's lens_logits at the last point, the same operations as the forward pass."""
        cfg = p.cfg
        if cfg.block_type != "pre_norm":
            logits, cache = run_with_cache(p.params, cfg, p.ids, names=names, ablate=ablate)
            return logits[-1:], cache
        last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
        _, cache = run_with_cache(p.params, cfg, p.ids, names=[*names, last], ablate=ablate, logits=False)
        return lens_logits(p.params, cfg, cache[last][-1:]), cache

    @staticmethod
    def _pass_work(cfg: TransformerConfig, n: int, decoder: bool) -> int:
        """The work of `_run_predicting`: the blocks over n tokens, and a decoder's unembedding for one."""
        return forward_work(cfg, n, logits=False) + (cfg.d_model * cfg.d_vocab if decoder else 0)

    def _run_predicting(
        self, p: Prepared, names: list[str], top_k: int, decoder: bool
    ) -> tuple[ActivationCache, list[TopToken], AblationEffect | None]:
        """One pass keeping `names`; a decoder's next-token top-k and, with ablations, their effect."""
        if not decoder:
            return run_with_cache(p.params, p.cfg, p.ids, names=names, ablate=p.ablate, logits=False)[1], [], None
        logits, cache = self._run_last(p, names, p.ablate)
        return cache, *self._prediction(p, logits, top_k)

    def _prediction(self, p: Prepared, logits: np.ndarray, top_k: int) -> tuple[list[TopToken], AblationEffect | None]:
        """The next-token top-k of a run and, with ablations, how it differs from the same run without them
        (one more forward pass, priced by the caller)."""
        probs = next_token_probs(logits)  # [d_vocab]
        top = self.top_tokens(p, probs, top_k) if top_k else []
        if not p.ablate:
            return top, None
        baseline = next_token_probs(self._run_last(p, [], None)[0])  # [d_vocab]
        before = self.top_tokens(p, baseline, top_k) if top_k else []
        return top, AblationEffect(
            before,
            [ProbabilityChange(t.token, t.id, t.prob, float(probs[t.id]), float(probs[t.id]) - t.prob) for t in before],
        )

    # ---------------------------------------------------------------- run (the API's raw view)

    def run(self, spec: RunSpec, hooks: list[str], top_k: int) -> RunResult:
        """Run a model on a text: tokens, next-token top-k and the chosen activations.

        With ablations on a decoder, the same text also runs without them, so the result says how
        the prediction changed (two forward passes, priced as such)."""
        st = self.setup(spec)
        cfg, n = st.cfg, st.n
        hooks = self.checked_hooks(st, hooks)
        decoder = capabilities.predicts_next_token(st.model)
        baseline = bool(st.ablate) and decoder
        p = self.load(st, self._pass_work(cfg, n, decoder) * (2 if baseline else 1), cfg.d_vocab if decoder else 0)
        cache, top, effect = self._run_predicting(p, hooks, top_k, decoder)
        return RunResult(p, {h: cache[h] for h in hooks}, top, effect)

    # ---------------------------------------------------------------- the explorer page

    def explorer(
        self, spec: RunSpec, layer: int, head: int, *, compare: bool, rollout: bool, top_k: int
    ) -> ExplorerView:
        """Every figure of the explorer from one preparation of the model: the chosen head's four stages,
        its layer's patterns, the mask flipped (compare), the residual stream, the prediction (and the
        ablation's effect on it), rollout, and every array's shape. Layer and head are clamped."""
        st = self.setup(spec, page=True)
        cfg, n = st.cfg, st.n
        s = self.settings
        layer = min(layer, cfg.n_layers - 1)
        head = min(head, cfg.n_heads - 1)
        hooks = explorer_view_hooks(cfg, layer, rollout)
        # The activations the view keeps, for every model: a learner's sizes, and a checkpoint's width and
        # depth times the text (SmolLM2-135M keeps 11.5 million numbers at 128 tokens, 107 million at 1,024).
        values = explorer_view_values(cfg, n, layer, rollout)
        if values > s.explorer_max_values:
            remedy = (
                _("use a shorter text, fewer layers, a smaller d_model, fewer heads or no attention rollout")
                if st.model.draws_weights and rollout
                else _("use a shorter text, fewer layers, a smaller d_model, fewer heads")
                if st.model.draws_weights
                else _("use a shorter text or no attention rollout")
                if rollout
                else _("use a shorter text")
            )
            raise InputError(
                _(
                    "this view would keep {values:,} numbers ({n:,} tokens, {n_layers} layers, {n_heads} "
                    "heads), more than this server's limit of {limit:,}: {remedy}"
                ).format(
                    values=values,
                    n=n,
                    n_layers=cfg.n_layers,
                    n_heads=cfg.n_heads,
                    limit=s.explorer_max_values,
                    remedy=remedy,
                )
            )
        decoder = capabilities.predicts_next_token(st.model)
        compare = compare and "causal" in st.model.toggles
        # ablations on a model that can be patched (a causal pre-norm decoder): the prediction with later
        # attention frozen too (one more pass)
        frozen = bool(st.ablate) and capabilities.patching(st.model, cfg) is None
        passes = 1 + (bool(st.ablate) and decoder) + compare + frozen
        p = self.load(st, self._pass_work(cfg, n, decoder) * passes, cfg.d_vocab if decoder else 0)
        cache, top, effect = self._run_predicting(p, hooks, top_k, decoder)
        frozen_ablation = None
        if frozen and effect is not None:
            probs = next_token_probs(ablated_logits(p.params, cfg, p.ids, p.ablate, frozen=True)[None])  # [d_vocab]
            frozen_ablation = [
                ProbabilityChange(
                    c.token, c.id, c.baseline_prob, float(probs[c.id]), float(probs[c.id]) - c.baseline_prob
                )
                for c in effect.changes
            ]
        other = None
        if compare:  # the same weights with the mask flipped: attention toggles never change them
            flipped = cfg.replace(attention_dir="bidirectional" if cfg.causal else "causal")
            _logits, flipped_cache = run_with_cache(
                p.params, flipped, p.ids, names=stage_hooks(flipped, layer), ablate=p.ablate, logits=False
            )
            other = flipped_cache.attention_stages(layer, head)
        return ExplorerView(
            p,
            layer,
            head,
            cache.attention_stages(layer, head),
            cache[f"blocks.{layer}.attn.hook_pattern"],
            other,
            cache.residual_norms(),
            top,
            effect,
            cache.rollout()[layer] if rollout else None,
            self._shape_rows(cfg, n, decoder),
            frozen_ablation,
            vectors=cache.head_vectors(layer, head),
        )

    @staticmethod
    def _shape_rows(cfg: TransformerConfig, n: int, decoder: bool) -> list[ShapeRow]:
        """Every activation of a run in forward order, with its axes and dims."""
        rows = [ShapeRow("tokens", "[pos]", [n], False)]
        rows += [
            ShapeRow(name, hook_shape(name, cfg), list(hook_dims(name, cfg, n)), name.endswith("hook_resid_pre"))
            for name in hook_names(cfg)
        ]
        if decoder:
            rows.append(ShapeRow("logits", "[pos, d_vocab]", [n, cfg.d_vocab], True))
        return rows
