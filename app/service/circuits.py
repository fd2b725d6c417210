"""Circuits (/circuits and /api/v1/analysis/{patching,qk-circuit,composition,ov-circuit}): why a head attends and
what it causes. Activation patching between a clean and a corrupted text (core/patching.py), one score's QK
decomposition, the heads' composition scores and a head's OV circuit (core/circuits.py). Each view is prepared
once through ModelViews, like the Inspect views, and priced before anything runs: a sweep is one patched run
per cell, counted against settings.patching_max_passes and, with its work, against the cost limits.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.models import pretrained
from app.models.catalog import Model
from app.service import capabilities
from app.service.results import ModelResult, TokenRef
from app.service.spec import Prepared, RunSpec, Setup
from app.service.views import ModelViews
from core import InputError, forward, run_with_cache
from core.attribution_patching import Comparison, attribution_sweep, compare, require_gradients
from core.circuits import (
    Composition,
    OVCircuit,
    QKDecomposition,
    composition_scores,
    composition_work,
    ov_circuit,
    ov_work,
    qk_decomposition,
    qk_hooks,
)
from core.i18n import _
from core.params import forward_work
from core.patching import (
    DIRECTIONS,
    METHODS,
    METRICS,
    TARGETS,
    PatchingResult,
    check_pair,
    check_target,
    induction_example,
    sweep,
    sweep_passes,
    sweep_work,
)

# How the pages and the API show whitespace inside a token (app/pages/figures.py, core/checkpoints/tokenizer.py).
VISIBLE_WHITESPACE = str.maketrans({"␣": " ", "↵": "\n", "⇥": "\t", "␍": "\r"})

__all__ = ["DIRECTIONS", "METHODS", "METRICS", "TARGETS", "CircuitViews", "Comparison", "Prefill"]


# Attribution patching's price in forward passes: the base run's logits (for a probability's gradient), then
# both runs forward and backward (a backward pass about two forwards' work).
ATTRIBUTION_FORWARDS = 7


# ------------------------------------------------------------------ what the page opens on, per model


@dataclass(frozen=True)
class Prefill:
    """A clean and a corrupted text of the same length, and the answer and wrong tokens (None: the model's
    own top predictions), chosen so that the patching view shows something on this model."""

    clean: str
    corrupted: str
    answer: str | None
    wrong: str | None
    target: str = "resid_pre"
    direction: str = "denoise"


def _shift(text: str) -> str:
    """Every letter moved one along the alphabet (case kept, z -> a): the same characters' count, none of the
    same words."""
    out = []
    for c in text:
        if "a" <= c <= "z" or "A" <= c <= "Z":
            base = ord("a") if c.islower() else ord("A")
            c = chr(base + (ord(c) - base + 1) % 26)
        out.append(c)
    return "".join(out)


# The induction recipe's example: a random sequence of letters repeated, and the same with its first half
# resampled (core.patching.induction_example); 24 letters fit its 64-token context twice, and this seed's
# L0H2 -> L1H0 path is the guided walk's (tests/api/test_circuits.py checks it).
INDUCTION_PREFILL = Prefill(
    *induction_example(string.ascii_lowercase, 24, seed=0), target="attn_head", direction="noise"
)
# The spec's vocabulary (" aeiklmns") has no room for a shifted text: "kasi " (same letters) predicts no "l".
SPEC_PREFILL = Prefill("nasi ", "kasi ", "l", None)
# python-docs-induction (natural text, both heads): a docs sentence said again up to "over the e", and the same
# with the first copy's letters shifted. Only the first copy says "l" comes next ("x" is the corrupted run's
# guess: "the ex..."); noising the previous-token head L0H3 or the induction head L1H0 takes the lead away, and
# so does noising the stream at the first copy's "e" in layer 0 or its "l" in layer 1 (where L0H3 has written
# "e came before me"): tests/api/test_circuits.py.
DOCS_SENTENCE = "The for statement is used to iterate over the elements of a sequence."
DOCS_INDUCTION_PREFILL = Prefill(
    f"{DOCS_SENTENCE} {DOCS_SENTENCE[:47]}",
    f"{_shift(DOCS_SENTENCE)} {DOCS_SENTENCE[:47]}",
    "l",
    "x",
    target="attn_head",
    direction="noise",
)


def prefill(model: Model) -> Prefill:
    """What the patching view opens on for this model: the induction example on an induction model; the spec's
    phrase on its models; a repeated docs sentence on python-docs-induction; else the default text twice, the
    first copy's letters shifted in the corrupted one (so only the copy says what comes next), answer and wrong
    left to the model."""
    recipe = pretrained.trained_recipe(model.loader.spec) if model.loader is not None else None
    if recipe == "induction":
        return INDUCTION_PREFILL
    if recipe == "nasi-lemak" or model.name == "spec-forward":
        return SPEC_PREFILL
    if model.name == "python-docs-induction":
        return DOCS_INDUCTION_PREFILL
    text = model.default_text.strip() or "the cat sat on the mat"
    words = text.split()
    tail = " ".join(words[:-1]) if len(words) > 1 else text[:-1]
    return Prefill(f"{text} {tail}", f"{_shift(text)} {tail}", None, None)


# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class PatchingView(ModelResult):
    """A sweep's grid, raw and normalised (0: the corrupted run, 1: the clean run), for the API and the page."""

    corrupted_encoding_tokens: list[str]
    corrupted_ids: list[int]
    answer: TokenRef
    wrong: TokenRef
    result: PatchingResult

    @property
    def tokens(self) -> dict[str, list[str]]:  # type: ignore[override]
        return {"clean": self.prepared.tokens, "corrupted": self.corrupted_encoding_tokens}

    @property
    def token_ids(self) -> dict[str, list[int]]:  # type: ignore[override]
        return {"clean": list(self.prepared.encoding.ids), "corrupted": self.corrupted_ids}

    def __getattr__(self, name: str):  # target, direction, metric, clean_metric, corrupted_metric, rows, ...
        return getattr(self.result, name)

    @property
    def frozen_attention(self) -> bool:
        return self.result.frozen

    @property
    def grid(self) -> np.ndarray:
        return self.result.normalised

    @property
    def raw_grid(self) -> np.ndarray:
        return self.result.raw


@dataclass(frozen=True)
class Pair:
    query_part: str
    key_part: str
    contribution: float


@dataclass(frozen=True)
class QKView(ModelResult):
    d: QKDecomposition
    weight: float  # the head's attention weight on this key (after the softmax)
    top_key: int  # where this query looks most

    def __getattr__(self, name: str):  # layer, head, query, key, query_parts, key_parts, contributions, ...
        return getattr(self.d, name)

    @property
    def query_token(self) -> str:
        return self.prepared.tokens[self.d.query]

    @property
    def key_token(self) -> str:
        return self.prepared.tokens[self.d.key]

    @property
    def top_pairs(self) -> list[Pair]:
        """The five largest terms by size, largest first."""
        return [Pair(q, k, value) for q, k, value in self.d.top_pairs(5)]


@dataclass(frozen=True)
class CompositionView(ModelResult):
    c: Composition

    def __getattr__(self, name: str):  # heads, q, k, v, baseline, baseline_std
        return getattr(self.c, name)


@dataclass(frozen=True)
class TopLogit:
    token: str
    id: int
    logit: float


@dataclass(frozen=True)
class OVSource:
    token: str
    id: int
    self_rank: int  # where the token itself ranks among the outputs it raises (0: first)
    top: list[TopLogit]


@dataclass(frozen=True)
class OVView(ModelResult):
    ov: OVCircuit
    sources: list[OVSource]

    @property
    def layer(self) -> int:
        return self.ov.layer

    @property
    def head(self) -> int:
        return self.ov.head

    @property
    def copying_score(self) -> float:
        return self.ov.copying_score

    @property
    def eigenvalues(self) -> list[list[float]]:
        """[[real, imaginary], ...], largest |λ| first."""
        return [[float(e.real), float(e.imag)] for e in self.ov.eigenvalues]


# ------------------------------------------------------------------ the views


class CircuitViews:
    """The circuits views of one request, on its ModelViews' preparation and limits."""

    def __init__(self, views: ModelViews):
        self.views = views
        self.limits = views.limits
        self.settings = views.settings

    def prefill(self, model_name: str) -> Prefill:
        return prefill(self.views.model(model_name))

    # ---------------------------------------------------------------- activation patching

    def _setup_pair(self, spec: RunSpec, corrupted: str) -> tuple[Setup, list[int], list[str]]:
        """The clean text's setup and the corrupted text's tokens: a causal decoder, the same number of tokens."""
        st = self.views.setup(spec)
        capabilities.require(capabilities.patching(st.model, st.cfg))
        encoding = st.model.reader.encode(corrupted)
        self.limits.check_count(
            _("the corrupted text"), len(encoding.ids), self.settings.max_tokens, _("use a shorter text")
        )
        check_pair(st.encoding.ids, encoding.ids)
        return st, list(encoding.ids), list(encoding.tokens)

    def patching(
        self,
        spec: RunSpec,
        corrupted: str,
        answer: str | None,
        wrong: str | None,
        target: str,
        direction: str = "denoise",
        metric: str = "logit_diff",
        frozen: tuple[bool, ...] = (False,),
        method: str = "exact",
    ) -> list[PatchingView]:
        """One sweep per entry of `frozen` (the page asks for both), from one preparation of the model.
        answer None: the clean run's most likely next token; wrong None: the corrupted run's (or, if that is
        the answer, the clean run's second). method "attribution": attribution patching's estimate of the
        sweep with attention recomputed (core/attribution_patching.py), one forward and backward pass."""
        st, corrupted_ids, corrupted_tokens = self._setup_pair(spec, corrupted)
        cfg, n = st.cfg, st.n
        check_target(target, cfg)
        if direction not in DIRECTIONS or metric not in METRICS or method not in METHODS:
            raise InputError(
                _("direction must be one of {directions}, metric one of {metrics} and method one of {methods}").format(
                    directions=", ".join(DIRECTIONS), metrics=", ".join(METRICS), methods=", ".join(METHODS)
                )
            )
        if method == "attribution":
            return self._attribution(
                st, corrupted_ids, corrupted_tokens, answer, wrong, target, direction, metric, frozen
            )
        passes = sweep_passes(cfg, n, target) * len(frozen)
        if passes > (most := self.settings.patching_max_passes):
            what = (
                _("{n_layers} layers × {n_heads} heads × {n} positions")
                if target == "attn_head_pos"
                else _("{n_layers} layers × {n_heads} heads")
                if target in ("attn_head", "pattern")
                else _("{n_layers} layers × {n} positions")
            ).format(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n=n)
            what += _(" × 2 (frozen and not)") if len(frozen) > 1 else ""
            raise InputError(
                _(
                    "this sweep asks for {passes:,} patched runs ({what}), more than this "
                    "server's limit of {most:,}: use a shorter text, or sweep heads "
                    "(attn_head) instead of heads by position"
                ).format(passes=passes, what=what, most=most)
            )
        guess = answer is None or wrong is None
        work = sweep_work(cfg, n, target, metric) * len(frozen) + (2 * forward_work(cfg, n) if guess else 0)
        p = self.views.load(
            st,
            work,
            cfg.d_vocab + cfg.n_layers * cfg.n_heads * n * n,
            _("the texts' length (or choose a sweep with fewer cells)"),
        )
        given_a = None if answer is None else token_id(st, answer, _("answer"), corrupted_tokens, corrupted_ids)
        given_w = None if wrong is None else token_id(st, wrong, _("wrong"), corrupted_tokens, corrupted_ids)
        a, w = self._guess(p, corrupted_ids, given_a, given_w) if guess else (given_a, given_w)
        assert a is not None and w is not None  # both given, or guessed
        results = [
            sweep(p.params, cfg, p.ids, corrupted_ids, a, w, target, direction=direction, metric=metric, frozen=f)
            for f in frozen
        ]
        ref = lambda i: TokenRef(p.token_str(i), i)  # noqa: E731
        return [PatchingView(p, corrupted_tokens, corrupted_ids, ref(a), ref(w), r) for r in results]

    def _attribution(
        self,
        st: Setup,
        corrupted_ids: list[int],
        corrupted_tokens: list[str],
        answer: str | None,
        wrong: str | None,
        target: str,
        direction: str,
        metric: str,
        frozen: tuple[bool, ...],
    ) -> list[PatchingView]:
        """Attribution patching's estimate, priced as ATTRIBUTION_FORWARDS forward passes (no patched runs)."""
        cfg, n = st.cfg, st.n
        if any(frozen):
            raise InputError(
                _(
                    "attribution patching estimates the sweep with every later attention pattern recomputed: "
                    "frozen_attention needs method exact"
                )
            )
        require_gradients(cfg)
        guess = answer is None or wrong is None
        work = (ATTRIBUTION_FORWARDS + (2 if guess else 0)) * forward_work(cfg, n)
        p = self.views.load(st, work, cfg.d_vocab + cfg.n_layers * cfg.n_heads * n * n, _("the texts' length"))
        given_a = None if answer is None else token_id(st, answer, _("answer"), corrupted_tokens, corrupted_ids)
        given_w = None if wrong is None else token_id(st, wrong, _("wrong"), corrupted_tokens, corrupted_ids)
        a, w = self._guess(p, corrupted_ids, given_a, given_w) if guess else (given_a, given_w)
        assert a is not None and w is not None  # both given, or guessed
        result = attribution_sweep(
            p.params, cfg, p.ids, corrupted_ids, a, w, target, direction=direction, metric=metric
        )
        ref = lambda i: TokenRef(p.token_str(i), i)  # noqa: E731
        return [PatchingView(p, corrupted_tokens, corrupted_ids, ref(a), ref(w), result)]

    @staticmethod
    def compare(exact: PatchingView, estimate: PatchingView) -> Comparison:
        """The estimate beside the exact sweep: their rank correlation and where they disagree (core computes)."""
        return compare(exact.result, estimate.result)

    @staticmethod
    def _guess(p: Prepared, corrupted_ids: list[int], answer: int | None, wrong: int | None) -> tuple[int, int]:
        clean_logits = forward(p.params, p.cfg, p.ids)[0][-1]
        ranked = np.argsort(-clean_logits, kind="stable")
        answer = int(ranked[0]) if answer is None else answer
        if wrong is None:
            wrong = int(np.argmax(forward(p.params, p.cfg, np.asarray(corrupted_ids))[0][-1]))
            if wrong == answer:  # the corrupted text predicts the answer too: the clean run's next best
                wrong = int(next(t for t in ranked if t != answer))
        return answer, wrong

    # ---------------------------------------------------------------- circuits

    def qk_circuit(self, spec: RunSpec, layer: int, head: int, query: int, key: int | None) -> QKView:
        """One score of one head split into query part × key part terms; key None: where the query looks most."""
        st = self.views.setup(spec)
        cfg, n = st.cfg, st.n
        self._check_head(st, layer, head)
        capabilities.require(capabilities.qk_circuit(st.model, cfg))
        for name, pos in (("query", query), ("key", key)):
            if pos is not None and not -n <= pos < n:
                raise InputError(
                    _("{name}={pos} is outside the text's {n} tokens: use 0 … {last}, or -1 for the last").format(
                        name=name, pos=pos, n=n, last=n - 1
                    )
                )
        n_parts = 3 + cfg.n_layers * (cfg.n_heads + 3) + 1
        p = self.views.load(
            st,
            forward_work(cfg, n, logits=False) + 2 * n_parts * cfg.d_model * cfg.d_head,
            max(2 * n_parts * cfg.d_model, cfg.n_heads * n * n),
        )
        pattern = f"blocks.{layer}.attn.hook_pattern"
        _logits, cache = run_with_cache(p.params, cfg, p.ids, names=qk_hooks(cfg, layer) + [pattern], logits=False)
        query = query % n
        row = cache[pattern][head, query]
        top_key = int(np.argmax(row))
        key = top_key if key is None else key % n
        d = qk_decomposition(cache, layer, head, query, key)
        return QKView(p, d, float(row[key]), top_key)

    def composition(self, spec: RunSpec) -> CompositionView:
        """Q-, K- and V-composition between every pair of heads in different layers, and a random baseline (the
        weights alone: a text, by default the model's own, only sizes a model whose shape follows its text)."""
        st = self.views.setup(self._with_text(spec))
        if st.cfg.n_layers < 2:
            raise InputError(
                _(
                    "composition needs heads in two layers; {model!r} has {n_layers}: choose a model with more layers"
                ).format(model=st.model.name, n_layers=st.cfg.n_layers)
            )
        H = st.cfg.n_layers * st.cfg.n_heads
        p = self.views.load(
            st, composition_work(st.cfg), 3 * H * H + H * st.cfg.d_head * st.cfg.d_model, _("n_layers or n_heads")
        )
        return CompositionView(p, composition_scores(p.params, p.cfg))

    def ov_circuit(self, spec: RunSpec, layer: int, head: int, top_k: int, first: int | None = None) -> OVView:
        """The head's OV circuit read through the unembedding, for the text's distinct tokens as sources (by default
        the model's own text's; `first`: only that many of them, in the text's order)."""
        st = self.views.setup(self._with_text(spec))
        cfg = st.cfg
        self._check_head(st, layer, head)
        capabilities.require(capabilities.ov_circuit(st.model, cfg))
        sources = list(dict.fromkeys(st.encoding.ids))[:first]
        if len(sources) > (most := self.settings.ov_max_sources):
            raise InputError(
                _(
                    "the text has {n} distinct tokens, more than the {most} sources one request lists: "
                    "use a shorter text"
                ).format(n=len(sources), most=most)
            )
        p = self.views.load(
            st,
            ov_work(cfg, len(sources)),
            max(len(sources), cfg.d_head) * cfg.d_vocab,
            _("the number of distinct tokens in the text"),
        )
        ov = ov_circuit(p.params, cfg, layer, head, sources)
        ids, logits = ov.top(top_k)
        rows = [
            OVSource(
                p.token_str(s),
                int(s),
                int(rank),
                [TopLogit(p.token_str(int(i)), int(i), float(v)) for i, v in zip(row_ids, row_logits)],
            )
            for s, rank, row_ids, row_logits in zip(sources, ov.self_rank, ids, logits)
        ]
        return OVView(p, ov, rows)

    def _with_text(self, spec: RunSpec) -> RunSpec:
        return spec if spec.text else spec.replace(text=self.views.model(spec.model).default_text)

    @staticmethod
    def _check_head(st: Setup, layer: int, head: int) -> None:
        if layer >= st.cfg.n_layers or head >= st.cfg.n_heads:
            raise InputError(
                _(
                    "layer {layer}, head {head} does not exist: {model!r} has {n_layers} layer(s) of "
                    "{n_heads} head(s), counted from 0"
                ).format(layer=layer, head=head, model=st.model.name, n_layers=st.cfg.n_layers, n_heads=st.cfg.n_heads)
            )


def token_id(
    st: Setup, given: str, role: str, corrupted_tokens: Sequence[str] = (), corrupted_ids: Sequence[int] = ()
) -> int:
    """A token string as the model's id (the patching answers, attribution's target and contrast): one of the
    texts' tokens as shown (whitespace as ␣ ↵ ⇥ or as
    itself), or a text that is one token."""
    shown = dict(zip(st.encoding.tokens, st.encoding.ids)) | dict(zip(corrupted_tokens, corrupted_ids))
    raw = given.translate(VISIBLE_WHITESPACE)
    for text in dict.fromkeys((given, raw)):
        if text in shown:
            return int(shown[text])
    tokenizer = st.model.reader
    for text in dict.fromkeys((raw, given)):
        try:
            ids = tokenizer.encode(text).ids
        except InputError as exc:
            raise InputError(
                _("{role} {given!r} is not a token of {model!r}: {error}").format(
                    role=role, given=given, model=st.model.name, error=exc
                )
            ) from None
        if len(ids) == 2 and ids[0] == st.encoding.ids[0] and len(st.encoding.ids) > 1:
            ids = ids[1:]  # a tokenizer that starts every text with <s>
        if len(ids) == 1:
            return int(ids[0])
    pieces = tokenizer.encode(raw).ids
    raise InputError(
        _(
            "{role} {given!r} is {n} tokens for {model!r} ({pieces}): give one token, such as one of the texts' own"
        ).format(
            role=role,
            given=given,
            n=len(pieces),
            model=st.model.name,
            pieces=" ".join(repr(tokenizer.token_str(i)) for i in pieces),
        )
    )
