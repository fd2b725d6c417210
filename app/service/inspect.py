"""Looking inside a run (/inspect and /api/v1/analysis): the residual stream decomposed with each
part's direct logit, the logit lens, the head detectors, KV-cache stepping, two settings compared, and
attention rollout. Each view is prepared once through ModelViews, like the explorer's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np

from app.service import capabilities
from app.service.results import (
    ComparedSide,
    Comparison,
    Decomposition,
    Detectors,
    FlaggedHead,
    KVStepRow,
    KVSteps,
    Lens,
    Rollout,
    TokenRef,
    TopToken,
)
from app.service.spec import RunSpec, ablation_map, configure
from app.service.views import ModelViews
from core import InputError, run_with_cache
from core.analysis import HEAD_DETECTORS, lens_points, repeated_random_tokens
from core.attention import causal_mask
from core.cache import decomposition_hooks, pattern_hooks
from core.functional import softmax
from core.i18n import _
from core.model import KVRun, run_with_kv_cache
from core.params import forward_work, largest_array
from core.tokenizers import Encoding


class InspectViews:
    """The Inspect views of one request, on its ModelViews' preparation and limits."""

    def __init__(self, views: ModelViews):
        self.views = views
        self.limits = views.limits

    def reason(self, view: str, spec: RunSpec) -> str | None:
        """Why an Inspect view does not apply to this model and setting, or None."""
        model = self.views.catalog.get_model(spec.model)
        causal = model.cfg.causal if spec.causal is None else spec.causal
        cfg = model.cfg.replace(attention_dir="causal" if causal else "bidirectional")
        if view == "decompose":
            return capabilities.decomposition(model, cfg, _("the residual-stream decomposition"))
        if view == "lens":
            return capabilities.decomposition(model, cfg, _("the logit lens"))
        if view == "kvcache":
            return capabilities.kv_cache(model, cfg)
        return None

    def decompose(self, spec: RunSpec, pos: int, target: int | None, n_targets: int = 10) -> Decomposition:
        """The residual stream at `pos` split into its parts, each part's direct logit for the target token."""
        st = self.views.setup(spec)
        capabilities.require(capabilities.decomposition(st.model, st.cfg, _("the residual-stream decomposition")))
        if not -st.n <= pos < st.n:
            raise InputError(
                _("pos={pos} is outside the text's {n} tokens: use 0 … {last}, or -1 for the last").format(
                    pos=pos, n=st.n, last=st.n - 1
                )
            )
        if target is not None and target >= st.cfg.d_vocab:
            raise InputError(
                _(
                    "target={target} is not a token id of {model!r}, whose vocabulary is 0 … {last}; leave "
                    "it out to use the model's most likely next token"
                ).format(target=target, model=st.model.name, last=st.cfg.d_vocab - 1)
            )
        n_parts = 3 + st.cfg.n_layers * (st.cfg.n_heads + 3)  # embeddings, then per layer heads, biases, mlp
        p = self.views.load(st, forward_work(st.cfg, st.n), max(n_parts * st.cfg.d_model, st.n * st.cfg.d_vocab))
        logits, cache = run_with_cache(p.params, p.cfg, p.ids, names=decomposition_hooks(p.cfg), ablate=p.ablate)
        probs = softmax(logits[pos])  # [d_vocab], the prediction at pos (the default target)
        token = target if target is not None else int(np.argmax(probs))
        d = cache.decompose_resid(token, pos)
        order = np.argsort(-np.abs(d.direct_logit), kind="stable")[:5]
        return Decomposition(
            p,
            d,
            TopToken(p.token_str(token), token, float(probs[token])),
            self.views.top_tokens(p, probs, n_targets),
            [(d.labels[i], float(d.direct_logit[i])) for i in order],
        )

    def logit_lens(self, spec: RunSpec, top_k: int) -> Lens:
        """Every resid_pre / resid_mid (and the last resid_post) decoded through ln_final and W_U."""
        st = self.views.setup(spec)
        capabilities.require(capabilities.decomposition(st.model, st.cfg, _("the logit lens")))
        cfg, n = st.cfg, st.n
        points = lens_points(cfg)
        k = min(top_k, cfg.d_vocab)
        self.limits.check_hook_values(
            len(points) * n * k,
            _(
                "the lens table holds {values} cells, more than the "
                "limit of {limit}: reduce top_k or use a shorter text"
            ),
        )
        lens_work = len(points) * n * cfg.d_model * cfg.d_vocab  # each point's unembedding
        p = self.views.load(st, forward_work(cfg, n, logits=False) + lens_work, n * cfg.d_vocab)
        _logits, cache = run_with_cache(p.params, cfg, p.ids, names=points, ablate=p.ablate, logits=False)
        lens = cache.logit_lens(k)
        return Lens(p, lens, {int(t): p.token_str(int(t)) for t in np.unique(lens.top_tokens)})

    def detectors(self, spec: RunSpec, random_length: int, random_seed: int, threshold: float) -> Detectors:
        """Previous-token, duplicate-token and induction scores of every head, on the text and on a
        repeated random sequence (where only induction can predict the second half)."""
        st = self.views.setup(spec)
        model, cfg = st.model, st.cfg
        random_ids = repeated_random_tokens(cfg.d_vocab, random_length, 2, random_seed)
        n_random = random_ids.size
        self.limits.check_count(
            _("the repeated random sequence"), n_random, self.limits.settings.max_tokens, _("reduce random_length")
        )
        # The random run uses the weights this model has for a text of that length (the same weights,
        # except for spec-forward, whose position table is drawn per prompt length).
        random_cfg = configure(model, spec, n_random)
        if random_cfg.positional_embedding_type == "learned" and n_random > random_cfg.n_ctx:
            raise InputError(
                _(
                    "the repeated random sequence has {n} tokens, more than the context of {model!r}, "
                    "n_ctx={n_ctx}: reduce random_length"
                ).format(n=n_random, model=model.name, n_ctx=random_cfg.n_ctx)
            )
        ablate_random = ablation_map(spec.ablate, random_cfg)
        random_tokens = [model.reader.token_str(int(t)) for t in random_ids]
        longest = max(st.n, n_random)
        p = self.views.load(
            st,
            forward_work(cfg, st.n, logits=False) + forward_work(random_cfg, n_random, logits=False),
            max(
                largest_array(random_cfg, n_random, weights=model.draws_weights),
                cfg.n_layers * cfg.n_heads * longest * longest,
            ),
        )
        on_text = run_with_cache(p.params, cfg, p.ids, names=pattern_hooks(cfg), ablate=p.ablate, logits=False)[
            1
        ].head_detector_scores()
        random_params = model.weights(random_cfg, p.seed, Encoding(list(map(int, random_ids)), random_tokens))
        on_random = run_with_cache(
            random_params, random_cfg, random_ids, names=pattern_hooks(random_cfg), ablate=ablate_random, logits=False
        )[1].head_detector_scores()
        on_what: tuple[Literal["text", "random"], ...] = ("text", "random")
        scores = {name: dict(zip(on_what, (on_text[name], on_random[name]))) for name in HEAD_DETECTORS}
        flagged = [
            FlaggedHead(name, on, int(layer), int(head), float(grid[layer, head]))
            for name, by in scores.items()
            for on, grid in by.items()
            for layer, head in zip(*np.nonzero(np.nan_to_num(grid, nan=-1.0) >= threshold))
        ]
        flagged.sort(key=lambda f: -f.score)
        return Detectors(p, list(map(int, random_ids)), random_tokens, scores, threshold, flagged)

    def kv_steps(self, spec: RunSpec, n_new: int) -> KVSteps:
        """Generate token by token with a KV cache, and check every step against a full recomputation."""
        s = self.limits.settings
        st = self.views.setup(spec)
        model, cfg, n = st.model, st.cfg, st.n
        capabilities.require(capabilities.kv_cache(model, cfg))
        total = n + n_new
        self.limits.check_count(
            _("the text plus the generated tokens"), total, s.max_tokens, _("reduce n_new or shorten the text")
        )
        if cfg.positional_embedding_type == "learned" and total > cfg.n_ctx:
            raise InputError(
                _(
                    "{n} tokens of text + n_new={n_new} exceed the context of {model!r}, n_ctx={n_ctx} "
                    "learned positions: reduce n_new to at most {most}"
                ).format(n=n, n_new=n_new, model=model.name, n_ctx=cfg.n_ctx, most=max(cfg.n_ctx - n, 0))
            )
        # stepping costs about one full pass over all tokens; the check recomputes them all once more
        p = self.views.load(
            st,
            2 * forward_work(cfg, total),
            2 * total * cfg.d_vocab,
            _("n_new, the text's length, d_model, n_layers or n_heads"),
        )
        kv: KVRun = run_with_kv_cache(p.params, cfg, p.ids, n_new=n_new)
        full, _kv = run_with_cache(p.params, cfg, kv.tokens, names=())  # [total, d_vocab]
        cached = np.stack([step.logits for step in kv.steps])  # [total, d_vocab]
        diff = np.abs(cached - full).max(axis=-1)  # [total]
        strs = p.tokens + [p.token_str(int(t)) for t in kv.tokens[n:]]
        rows = []
        for step, d in zip(kv.steps, diff):
            top = int(np.argmax(step.logits))
            rows.append(
                KVStepRow(
                    step.pos,
                    strs[step.pos],
                    step.token,
                    step.generated,
                    list(step.k_shape),
                    list(step.v_shape),
                    step.cache_bytes,
                    float(d),
                    TokenRef(p.token_str(top), top),
                )
            )
        itemsize = kv.kv.keys[0].dtype.itemsize
        return KVSteps(
            p,
            rows,
            "".join(strs[n:]),
            str(kv.kv.keys[0].dtype),
            2 * cfg.n_layers * cfg.n_key_value_heads * cfg.d_head * itemsize,
            itemsize,
            float(diff.max()),
        )

    def _pattern(self, spec: RunSpec, layer: int, head: int) -> ComparedSide:
        st = self.views.setup(spec)
        if layer >= st.cfg.n_layers or head >= st.cfg.n_heads:
            raise InputError(
                _(
                    "layer {layer}, head {head} does not exist: {model!r} has {n_layers} layer(s) of "
                    "{n_heads} head(s), counted from 0"
                ).format(layer=layer, head=head, model=st.model.name, n_layers=st.cfg.n_layers, n_heads=st.cfg.n_heads)
            )
        p = self.views.load(st, forward_work(st.cfg, st.n, logits=False))
        name = f"blocks.{layer}.attn.hook_pattern"
        _logits, cache = run_with_cache(p.params, p.cfg, p.ids, names=[name], ablate=p.ablate, logits=False)
        return ComparedSide(p, cache[name][head], causal_mask(st.n) if p.cfg.causal else None)

    def compare(self, spec: RunSpec, other: Mapping[str, object], layer: int, head: int) -> Comparison:
        """One head's pattern under two settings (`other` changes the first side's), and b − a."""
        a = self._pattern(spec, layer, head)
        b = self._pattern(spec.replace(**{k: v for k, v in other.items() if v is not None}), layer, head)
        if a.pattern.shape != b.pattern.shape:
            return Comparison(
                a,
                b,
                layer,
                head,
                None,
                f"the two texts have {a.pattern.shape[0]} and {b.pattern.shape[0]} tokens: a "
                "difference needs texts of the same number of tokens",
            )
        return Comparison(a, b, layer, head, b.pattern - a.pattern, None)

    def rollout(self, spec: RunSpec) -> Rollout:
        """Attention rollout after every layer (core.analysis.attention_rollout); works on any model."""
        st = self.views.setup(spec)
        cfg, n = st.cfg, st.n
        self.limits.check_hook_values(
            cfg.n_layers * n * n,
            _("the rollout holds {values} numbers, more than the limit of {limit}: use a shorter text"),
        )
        p = self.views.load(
            st, forward_work(cfg, n, logits=False) + cfg.n_layers * n**3, cfg.n_layers * cfg.n_heads * n * n
        )
        _logits, cache = run_with_cache(p.params, cfg, p.ids, names=pattern_hooks(cfg), ablate=p.ablate, logits=False)
        return Rollout(p, cache.rollout())
