"""The spec's lessons, live (/lessons and /api/v1/lessons): each priced against the limits, then computed
by core.lessons with the spec's own seeds, so each page opens on the spec's printed numbers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.models.catalog import Catalog
from app.service.calculators import ParamsLessonResult, Sizes, params_lesson
from app.service.limits import Limits
from core import InputError, TransformerConfig, lessons
from core.attention import attention_scale
from core.cache import AttentionStages
from core.cell import AttentionCell, HeadVectors, attention_cell
from core.i18n import _
from core.params import count_params, forward_work, largest_array
from core.tokenizers import word_tokens


def _shapes(**arrays: np.ndarray) -> dict[str, list[int]]:
    return {name: list(a.shape) for name, a in arrays.items()}


@dataclass(frozen=True)
class AttentionLessonResult:
    lesson: lessons.AttentionLesson  # tokens, X, W_q.., Q, K, V, raw_scores, mask, result
    scaled_scores: np.ndarray  # [query_pos, key_pos], QKᵀ / √d_k before the mask
    divisor: float  # √d_k, or 1 when scaling is off

    def __getattr__(self, name: str):  # tokens, raw_scores, mask
        return getattr(self.lesson, name)

    def cell(self, query: int | None = None, key: int | None = None) -> AttentionCell:
        """One cell opened (core/cell.py): by default the last token's row at its largest weight, the spec's
        "scores for lemak" and the 0.96 its 4.15 becomes."""
        a = self.lesson
        query = len(a.tokens) - 1 if query is None else query
        key = int(np.argmax(a.result.weights[query])) if key is None else key
        vectors = HeadVectors(0, 0, 0, a.Q, a.K, a.V, a.result.output)
        stages = AttentionStages(a.raw_scores, self.scaled_scores, a.mask, a.result.scores, a.result.weights)
        return attention_cell(vectors, stages, self.divisor, query, key)

    @property
    def scores(self) -> np.ndarray:  # [query_pos, key_pos], scaled and masked
        return self.lesson.result.scores

    @property
    def weights(self) -> np.ndarray:
        return self.lesson.result.weights

    @property
    def output(self) -> np.ndarray:  # [pos, d_k]
        return self.lesson.result.output

    @property
    def shapes(self) -> dict[str, list[int]]:
        a = self.lesson
        return _shapes(
            X=a.X,
            W_q=a.W_q,
            W_k=a.W_k,
            W_v=a.W_v,
            Q=a.Q,
            K=a.K,
            V=a.V,
            scores=a.result.scores,
            weights=a.result.weights,
            output=a.result.output,
        )


@dataclass(frozen=True)
class CausalLessonResult:
    masked: lessons.AttentionLesson
    free: lessons.AttentionLesson  # the same weights without the mask


@dataclass(frozen=True)
class HeadScores:
    scores: np.ndarray  # [query_pos, key_pos]
    weights: np.ndarray


@dataclass(frozen=True)
class MultiheadLessonResult:
    lesson: lessons.MultiHeadLesson
    mask: np.ndarray | None  # [query_pos, key_pos] when causal

    def __getattr__(self, name: str):  # tokens, d_head, output
        return getattr(self.lesson, name)

    @property
    def heads(self) -> list[HeadScores]:
        return [HeadScores(s, w) for s, w in zip(self.lesson.result.scores, self.lesson.result.weights)]

    @property
    def shapes(self) -> dict[str, list[int]]:
        m = self.lesson
        return _shapes(
            X=m.X,
            W_qkv=m.W_qkv,
            W_o=m.W_o,
            Q=m.Q,
            K=m.K,
            V=m.V,
            weights=m.result.weights,
            heads=m.result.output,
            concat=m.concat,
            output=m.output,
        )


@dataclass(frozen=True)
class DotSeries:
    start: int  # pe[start] · pe[start + gap] for every gap to the end
    gaps: list[int]
    dots: list[float]


@dataclass(frozen=True)
class Dot:
    i: int
    j: int
    dot: float  # pe[i] · pe[j]


@dataclass(frozen=True)
class PositionsLessonResult:
    lesson: lessons.PositionsLesson  # encoding [n_pos, d], the chosen pairs' dots
    series: list[DotSeries]  # one per distinct first position of the pairs

    @property
    def encoding(self) -> np.ndarray:  # [n_pos, d]
        return self.lesson.encoding

    @property
    def dots(self) -> list[Dot]:
        return [Dot(i, j, d) for i, j, d in self.lesson.dots]


@dataclass(frozen=True)
class Step:
    name: str
    shape: list[int]


@dataclass(frozen=True)
class ForwardLessonResult:
    lesson: lessons.ForwardLesson
    patterns: np.ndarray  # [head_index, query_pos, key_pos]
    mask: np.ndarray  # [query_pos, key_pos]

    def __getattr__(self, name: str):  # vocab, prompt, token_ids, next_token_probs
        return getattr(self.lesson, name)

    @property
    def tokens(self) -> list[str]:
        return list(self.lesson.prompt)

    @property
    def steps(self) -> list[Step]:
        return [Step(name, list(shape)) for name, shape in self.lesson.steps]

    @property
    def config(self) -> TransformerConfig:
        return self.lesson.cfg


class Lessons:
    """The lessons of one request, checked against its limits."""

    def __init__(self, catalog: Catalog, limits: Limits):
        self.catalog = catalog  # the forward lesson prices itself with spec-forward's config
        self.limits = limits

    def _check_words(self, text: str) -> list[str]:
        tokens = word_tokens(text)
        self.limits.check_count(_("the text"), len(tokens), self.limits.settings.max_tokens, _("use a shorter text"))
        return tokens

    def attention(
        self, text: str, seed: int, d_model: int, d_k: int, causal: bool, scale: bool
    ) -> AttentionLessonResult:
        T = len(self._check_words(text))
        self.limits.check_cost(
            3 * T * d_model * d_k + 2 * T * T * d_k,
            max(T * T, T * d_model, d_model * d_k),
            _("the number of words, d_model or d_k"),
        )
        lesson = lessons.attention(text, seed, d_model, d_k, causal=causal, scale=scale)
        divisor = attention_scale(d_k, scale)
        return AttentionLessonResult(lesson, lesson.raw_scores / divisor, divisor)

    def causal(self, text: str, seed: int, d_model: int, d_k: int, scale: bool) -> CausalLessonResult:
        """The attention lesson with the mask on, and the same weights without it."""
        masked = self.attention(text, seed, d_model, d_k, True, scale).lesson
        return CausalLessonResult(masked, self.attention(text, seed, d_model, d_k, False, scale).lesson)

    def scaling(self, dims: tuple[int, ...], n_queries: int, n_keys: int, seed: int) -> list[lessons.ScalingRow]:
        # every key entry is drawn and multiplied once; the key array of the widest d is the largest
        self.limits.check_cost(
            2 * n_queries * n_keys * sum(dims), n_queries * n_keys * max(dims), _("n_queries, n_keys or the dims")
        )
        return lessons.scaling(dims, n_queries, n_keys, seed)

    def multihead(
        self, text: str, seed: int, d_model: int, n_heads: int, causal: bool, scale: bool
    ) -> MultiheadLessonResult:
        T = len(self._check_words(text))
        self.limits.check_cost(
            4 * T * d_model * d_model + 2 * T * T * d_model,
            max(n_heads * T * T, 3 * d_model * d_model),
            _("the number of words, d_model or n_heads"),
        )
        m = lessons.multihead(text, seed, d_model, n_heads, causal=causal, scale=scale)
        return MultiheadLessonResult(m, np.isneginf(m.result.scores[0]) if causal else None)

    def positions(
        self, n_pos: int, d: int, pairs: tuple[tuple[int, int], ...] | None, series: bool = False
    ) -> PositionsLessonResult:
        """With no pairs given, the spec's pairs that fit inside n_pos. With `series`, the dot product of
        each pair's first position with every later one (the page's chart)."""
        self.limits.check_cost(n_pos * d, n_pos * d, _("n_pos or d"))
        if pairs is None:
            pairs = tuple((i, j) for i, j in lessons.SPEC_POSITION_PAIRS if i < n_pos and j < n_pos)
        p = lessons.positions(n_pos, d, pairs)
        rows = []
        if series:
            for i in list(dict.fromkeys(i for i, _, _ in p.dots)) or [0]:
                dots = [float(p.encoding[i] @ p.encoding[j]) for j in range(i, n_pos)]
                rows.append(DotSeries(i, list(range(n_pos - i)), dots))
        return PositionsLessonResult(p, rows)

    def forward(self, text: str, prompt: str, seed: int, d_model: int, n_heads: int, d_mlp: int) -> ForwardLessonResult:
        self.limits.check_count(
            _("the prompt"), len(prompt), self.limits.settings.max_tokens, _("use a shorter prompt")
        )
        if not text:
            raise InputError(_("the text is empty: its characters are the vocabulary, so type at least one"))
        # the config the lesson will build, to price it first (and to explain d_model/n_heads errors)
        cfg = self.catalog.get_model("spec-forward").cfg.replace(
            d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, d_vocab=len(set(text)), n_ctx=max(len(prompt), 1)
        )
        self.limits.check_cost(
            count_params(cfg).total + forward_work(cfg, len(prompt)),
            largest_array(cfg, len(prompt)),
            _("the prompt, d_model, n_heads or d_mlp"),
        )
        f = lessons.forward(text, prompt, seed, d_model, n_heads, d_mlp)
        return ForwardLessonResult(
            f, f.cache["blocks.0.attn.hook_pattern"], np.isneginf(f.cache["blocks.0.attn.hook_attn_scores"][0])
        )

    @staticmethod
    def params(preset: str, sizes: Sizes) -> ParamsLessonResult:
        """The spec's "Counting parameters": the toy and this model, and the 12 d² rule of thumb."""
        return params_lesson(preset, sizes)
