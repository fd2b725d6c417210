"""The service layer: what the JSON API and the pages both show, prepared once per view.

One `Service` per request (app/deps.py) holds the model catalogue and the settings. Each view has
one method: it takes a typed `RunSpec` (what to run) and the view's own arguments, checks the
cost against the limits *before* computing, prepares the model once (tokens, config, weights),
asks core for the numbers (`run_with_cache` and the ActivationCache's questions) and returns a
plain dataclass with token strings resolved. No JSON, no HTML: the routers format.

Bad input raises core's InputError with a message a learner can act on (app/errors.py: 422);
anything else that escapes is a bug (500). ARCHITECTURE.md follows one request through here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from core import PRESETS, InputError, TransformerConfig, hook_names, hook_shape, lessons, run_with_cache
from core.analysis import (HEAD_DETECTORS, LogitLens, ResidualDecomposition, lens_logits, lens_points,
                           repeated_random_tokens)
from core.attention import attention_scale, causal_mask
from core.cache import (ActivationCache, AttentionStages, ResidualNorms, decomposition_hooks, pattern_hooks,
                        residual_hooks, stage_hooks)
from core.functional import softmax
from core.model import KVRun, Params, hook_dims, next_token_probs, run_with_kv_cache
from core.params import (DTYPE_BYTES, KVCacheSize, ParamCount, count_params, forward_work, gpt_params,
                         kv_cache_bytes, largest_array)
from core.recipes import probe_tokens as recipe_probe_tokens
from core.recipes import settings as train_settings
from core.tokenizers import Encoding, word_tokens

from .catalog import ATTENTION_TOGGLES, SIZE_TOGGLES, Catalog, Model
from .errors import NotFound, Unavailable
from .runs import FINISHED, RunInfo, RunStore, run_id
from .settings import Settings

# ------------------------------------------------------------------ what to run

Method = Literal["zero", "mean"]


@dataclass(frozen=True)
class AblatedHead:
    """A head whose output z is replaced before W_O: by zeros, or by its mean over the positions."""

    layer: int
    head: int
    method: Method = "zero"


@dataclass(frozen=True)
class RunSpec:
    """A model, a text and the toggles: what every model view runs. None keeps the model's default.

    Built once from a request (app/schemas.py `ModelRequest.spec()`) or from a page's URL."""

    model: str
    text: str
    causal: bool | None = None
    scale: bool | None = None
    temperature: float | None = None
    positional_embedding_type: str | None = None
    n_heads: int | None = None
    n_layers: int | None = None
    d_model: int | None = None
    seed: int | None = None
    ablate: tuple[AblatedHead, ...] = ()

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def toggles(self) -> dict[str, object]:
        """The toggles this spec sets (not left to the model), by name."""
        return {name: getattr(self, name) for name in ATTENTION_TOGGLES + SIZE_TOGGLES
                if getattr(self, name) is not None}


@dataclass(frozen=True)
class Setup:
    """A spec tokenised and configured, before any weight is loaded: cheap, so checked first."""

    model: Model
    cfg: TransformerConfig
    encoding: Encoding
    ablate: dict[tuple[int, int], Method]  # {(layer, head): method}, checked against cfg
    seed: int

    @property
    def n(self) -> int:
        return len(self.encoding.ids)


@dataclass(frozen=True)
class Prepared:
    """A setup checked against every limit, with its weights: ready to compute."""

    model: Model
    cfg: TransformerConfig
    encoding: Encoding
    ablate: dict[tuple[int, int], Method]
    seed: int
    params: Params

    @property
    def ids(self) -> np.ndarray:  # [pos]
        return np.asarray(self.encoding.ids)

    @property
    def tokens(self) -> list[str]:
        return self.encoding.tokens

    @property
    def ablations(self) -> list[AblatedHead]:
        return [AblatedHead(layer, head, how) for (layer, head), how in self.ablate.items()]

    def token_str(self, token_id: int) -> str:
        return self.model.tokenizer.token_str(int(token_id))


# ------------------------------------------------------------------ results (the API's response models read these)

@dataclass(frozen=True)
class TokenRef:
    token: str
    id: int


@dataclass(frozen=True)
class TopToken(TokenRef):
    prob: float


@dataclass(frozen=True)
class ProbabilityChange:
    """One token's probability without the ablation (baseline_prob) and with it (prob); delta = prob − baseline."""

    token: str
    id: int
    baseline_prob: float
    prob: float
    delta: float


@dataclass(frozen=True)
class AblationEffect:
    """What ablating heads did to the prediction: the same run's top-k without the ablation, and each of
    those tokens' probability before and after."""

    baseline_top_k: list[TopToken]  # the same run without the ablation
    changes: list[ProbabilityChange]  # each baseline top-k token: before -> after


@dataclass(frozen=True)
class RunHead:
    """The fields every model result starts with."""

    prepared: Prepared

    @property
    def model(self) -> str:
        return self.prepared.model.name

    @property
    def tokens(self) -> list[str]:
        return self.prepared.tokens

    @property
    def token_ids(self) -> list[int]:
        return list(self.prepared.encoding.ids)

    @property
    def config(self) -> TransformerConfig:
        return self.prepared.cfg

    @property
    def seed(self) -> int:
        return self.prepared.seed

    @property
    def ablate(self) -> list[AblatedHead]:
        return self.prepared.ablations


@dataclass(frozen=True)
class HookShape:
    axes: str
    dims: list[int]


@dataclass(frozen=True)
class RunResult(RunHead):
    hooks: dict[str, np.ndarray]  # by hook name; masked scores are -inf
    top_k: list[TopToken]  # [] for encoders
    ablation_effect: AblationEffect | None  # with ablations on a decoder: the prediction before and after

    @property
    def hook_shapes(self) -> dict[str, HookShape]:
        return {name: HookShape(hook_shape(name, self.config), list(a.shape)) for name, a in self.hooks.items()}


@dataclass(frozen=True)
class ShapeRow:
    name: str
    axes: str
    dims: list[int]
    layer_start: bool  # the first array of a layer (a rule above it in the table)


@dataclass(frozen=True)
class ExplorerView(RunHead):
    """Everything the explorer page draws for one state, from one preparation of the model."""

    layer: int  # clamped to the model
    head: int
    stages: AttentionStages  # of the chosen layer and head
    patterns: np.ndarray  # [head_index, query_pos, key_pos] of the chosen layer
    other_stages: AttentionStages | None  # with the causal mask flipped (Compare)
    residual: ResidualNorms
    top_k: list[TopToken]
    ablation_effect: AblationEffect | None
    rollout: np.ndarray | None  # [query_pos, key_pos] through the chosen layer
    shapes: list[ShapeRow]  # every activation of the run, then the logits

    @property
    def kv_heads(self) -> list[int]:
        """The key/value head each query head reads: consecutive query heads share one under
        grouped-query attention (cfg.kv_head); [0, 1, 2, ...] when every head has its own."""
        return [self.config.kv_head(h) for h in range(self.config.n_heads)]


@dataclass(frozen=True)
class HookInfo:
    name: str
    shape: str  # axis names, "[head_index, query_pos, key_pos]"


@dataclass(frozen=True)
class HookList:
    model: str
    config: TransformerConfig
    hooks: list[HookInfo]


@dataclass(frozen=True)
class Decomposition(RunHead):
    d: ResidualDecomposition  # labels, parts [n_parts, d_model], direct_logit [n_parts], ...
    target: TopToken  # the token whose logit is attributed (prob: the model's at pos)
    targets: list[TopToken]  # the model's most likely tokens at pos, to choose another target
    largest: list[tuple[str, float]]  # the parts with the largest |direct logit|, largest first

    def __getattr__(self, name: str):  # pos, labels, parts, direct_logit, logit_bias, scale, logit, part_norms
        return getattr(self.d, name)


@dataclass(frozen=True)
class Lens(RunHead):
    lens: LogitLens  # points, top_tokens [n_points, pos, k], top_probs
    token_strs: dict[int, str]  # every id in the table, readable

    @property
    def points(self) -> list[str]:
        return self.lens.points

    @property
    def top_k(self) -> list[list[list[TopToken]]]:
        """[point][pos][k], most probable first."""
        strs = self.token_strs
        return [[[TopToken(strs[t], t, p) for t, p in zip(cell_ids, cell_probs)]
                 for cell_ids, cell_probs in zip(point_ids, point_probs)]
                for point_ids, point_probs in zip(self.lens.top_tokens.tolist(), self.lens.top_probs.tolist())]


@dataclass(frozen=True)
class FlaggedHead:
    detector: str
    on: Literal["text", "random"]
    layer: int
    head: int
    score: float


@dataclass(frozen=True)
class Detectors(RunHead):
    random_token_ids: list[int]
    random_tokens: list[str]
    detectors: dict[str, dict[str, np.ndarray]]  # {detector: {"text"|"random": [n_layers, n_heads]}}, NaN = undefined
    threshold: float
    flagged: list[FlaggedHead]  # highest score first


@dataclass(frozen=True)
class KVStepRow:
    pos: int
    token: str
    id: int
    generated: bool
    k_shape: list[int]
    v_shape: list[int]
    cache_bytes: int
    max_abs_diff: float  # |cached logits − full recomputation|, max over the vocabulary
    top: TokenRef  # the most likely next token after this step


@dataclass(frozen=True)
class KVSteps(RunHead):
    steps: list[KVStepRow]
    generated_text: str
    dtype: str
    bytes_per_token: int  # 2 (K and V) × n_layers × n_key_value_heads × d_head × itemsize
    itemsize: int
    max_abs_diff: float

    @property
    def bytes_formula(self) -> str:
        c = self.config
        shared = (f" (shared by its {c.n_heads} query heads)" if c.n_key_value_heads != c.n_heads else "")
        return (f"2 × n_layers {c.n_layers} × n_key_value_heads {c.n_key_value_heads}{shared} × d_head {c.d_head} × "
                f"{self.itemsize} bytes = {self.bytes_per_token:,} bytes per token")


@dataclass(frozen=True)
class ComparedSide(RunHead):
    pattern: np.ndarray  # [query_pos, key_pos] of the chosen layer and head
    mask: np.ndarray | None  # [query_pos, key_pos], True where the causal mask forbids


@dataclass(frozen=True)
class Comparison:
    a: ComparedSide
    b: ComparedSide
    layer: int
    head: int
    difference: np.ndarray | None  # b − a, when both sides have as many tokens
    note: str | None

    @property
    def model(self) -> str:
        return self.a.model

    @property
    def max_change(self) -> float | None:
        """The largest |b − a| of any weight."""
        return None if self.difference is None else float(np.abs(self.difference).max())


@dataclass(frozen=True)
class Rollout(RunHead):
    rollout: np.ndarray  # [n_layers, query_pos, key_pos], rows sum to 1


# lessons and calculators

def _shapes(**arrays: np.ndarray) -> dict[str, list[int]]:
    return {name: list(a.shape) for name, a in arrays.items()}


@dataclass(frozen=True)
class AttentionLessonResult:
    lesson: lessons.AttentionLesson  # tokens, X, W_q.., Q, K, V, raw_scores, mask, result
    scaled_scores: np.ndarray  # [query_pos, key_pos], QKᵀ / √d_k before the mask
    divisor: float  # √d_k, or 1 when scaling is off

    def __getattr__(self, name: str):  # tokens, raw_scores, mask
        return getattr(self.lesson, name)

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
        return _shapes(X=a.X, W_q=a.W_q, W_k=a.W_k, W_v=a.W_v, Q=a.Q, K=a.K, V=a.V, scores=a.result.scores,
                       weights=a.result.weights, output=a.result.output)


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
        return _shapes(X=m.X, W_qkv=m.W_qkv, W_o=m.W_o, Q=m.Q, K=m.K, V=m.V, weights=m.result.weights,
                       heads=m.result.output, concat=m.concat, output=m.output)


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


@dataclass(frozen=True)
class ParamGroup:
    """Parameters gathered into one of the spec's components (token table, attention weights...)."""

    name: str
    size: int  # parameters, or what it would cost when not counted
    counted: bool
    note: str


@dataclass(frozen=True)
class ParamsLessonRow:
    name: str
    cfg: TransformerConfig
    count: ParamCount


@dataclass(frozen=True)
class ParamsLessonResult:
    name: str  # the preset's name, or "your model"
    rows: list[ParamsLessonRow]  # the toy, then this model
    rule: int  # 12 d², the rule of thumb for a block
    rule_gap: float  # |per_block − rule| / per_block
    embedding_share: float  # embeddings / total
    groups: list[ParamGroup]
    spec_sizes: dict[str, tuple[int, ...]]  # (vocab, n_ctx, d, n_layers[, d_ff]) per row, as gpt_params takes them


@dataclass(frozen=True)
class ParamsResult:
    config: TransformerConfig
    count: ParamCount

    def __getattr__(self, name: str):  # embeddings, per_block, total
        return getattr(self.count, name)

    @property
    def breakdown(self) -> list:  # core.params.ParamEntry: name, shape, per_layer, counted, size, total, note
        return self.count.entries


@dataclass(frozen=True)
class KVCacheTerms:
    n_layers: int
    batch: int
    seq_len: int
    n_heads: int  # query heads
    n_key_value_heads: int  # the heads that keep keys and values
    d_head: int
    dtype_bytes: int


@dataclass(frozen=True)
class KVCacheResult:
    config: TransformerConfig
    size: KVCacheSize
    dtype: str

    @property
    def bytes(self) -> int:
        return self.size.bytes

    @property
    def formula(self) -> str:
        return self.size.formula

    @property
    def terms(self) -> KVCacheTerms:
        k = self.size
        return KVCacheTerms(k.n_layers, k.batch, k.seq_len, self.config.n_heads, k.n_kv_heads, k.d_head, k.dtype_bytes)


@dataclass(frozen=True)
class RunPatterns:
    id: str
    step: int
    tokens: list[str]  # the probe's tokens
    patterns: list  # [layer][head][query_pos][key_pos]


@dataclass(frozen=True)
class HeadHistory:
    steps: list[int]  # the run's snapshot steps
    tokens: list[str]  # the probe's tokens
    patterns: list  # [step][query_pos][key_pos], the head's weights at each snapshot step


@dataclass(frozen=True)
class CalculatorResult:
    cfg: TransformerConfig
    count: ParamCount
    groups: list[ParamGroup]
    weights_bytes: int  # float32
    kv: KVCacheSize
    lengths: list[int]  # the cache chart's sequence lengths
    ticks: list[int]  # the lengths labelled on its axis
    kv_by_dtype: dict[str, list[int]]  # bytes at each length, per dtype


# ------------------------------------------------------------------ the service

def _fmt(n: int | float) -> str:
    return f"{n:,.0f}"


def _dims(dims) -> str:
    """A shape as NumPy prints it: (4,) (4, 8)."""
    dims = list(dims)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"



def explorer_view_hooks(cfg: TransformerConfig, layer: int = 0, rollout: bool = False) -> list[str]:
    """The activations one explorer view keeps: every layer's residual stream, the chosen layer's
    stages (q, k, scores, pattern), and every layer's pattern with rollout."""
    hooks = residual_hooks(cfg) + stage_hooks(cfg, layer)
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


class Service:
    """The catalogue and the limits one request is served with."""

    def __init__(self, catalog: Catalog, settings: Settings):
        self.catalog = catalog
        self.settings = settings
        self.preparations = 0  # models prepared (weights loaded) for this request: one per view

    # ---------------------------------------------------------------- limits

    def check_cost(self, work: int, largest: int, reduce: str, *, pretrained: bool = False) -> None:
        """Refuse a request whose work or largest array exceeds the limits, naming what to reduce.

        A pretrained model (weights loaded, not drawn) has its own work limit: a real model's one pass
        is tens of billions of multiply-adds where a toy's is millions."""
        s = self.settings
        limit = s.max_pretrained_work if pretrained else s.max_work
        if work > limit:
            raise InputError(f"this request needs about {_fmt(work)} multiply-adds, more than this server's limit "
                             f"of {_fmt(limit)}{' for a pretrained model' if pretrained else ''}: reduce {reduce}")
        if largest > s.max_elements:
            raise InputError(f"this request needs an array of {_fmt(largest)} numbers, more than this server's "
                             f"limit of {_fmt(s.max_elements)}: reduce {reduce}")

    @staticmethod
    def check_count(what: str, n: int, limit: int, hint: str) -> None:
        if n > limit:
            raise InputError(f"{what} has {n:,} tokens, more than the limit of {limit:,}: {hint}")

    def check_drawable(self, n: int, what: str = "words", of: str = "the text") -> None:
        """A lesson page lays out T × T tables; beyond lesson_max_tokens they stop being legible
        (the JSON API still takes up to max_tokens)."""
        s = self.settings
        if n > s.lesson_max_tokens:
            raise InputError(f"{of} has {n} {what}; this page draws up to {s.lesson_max_tokens} "
                             f"(the API takes up to {s.max_tokens}): shorten it")

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

    def _check_hook_values(self, values: int, advice: str) -> None:
        if values > self.settings.max_hook_values:
            raise InputError(f"{advice.format(values=f'{values:,}', limit=f'{self.settings.max_hook_values:,}')}")

    # ---------------------------------------------------------------- models

    def models(self) -> Mapping[str, Model]:
        """Every model this server knows, runnable or not, by name."""
        return self.catalog

    def model(self, name: str) -> Model:
        """A model that can run (InputError saying why not, or listing the known names)."""
        model = self.catalog.get_model(name)
        if model.error:
            raise InputError(f"model {name!r} cannot run: {model.error}")
        return model

    def hooks(self, name: str, n_layers: int | None = None, positional_embedding_type: str | None = None) -> HookList:
        model = self.model(name)
        _check_toggles(model, {"n_layers": n_layers, "positional_embedding_type": positional_embedding_type})
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
        encoding = model.tokenizer.encode(spec.text)
        n = len(encoding.ids)
        if page and n > (limit := self.explorer_token_limit(model)):
            n_ctx = model.configure({}, limit).n_ctx
            context = (f"{model.name}'s context is {limit} tokens" if limit == n_ctx else
                       f"a longer text's view of {model.name} would keep more than this server's limit of "
                       f"{self.settings.explorer_max_values:,} numbers" if limit < self.settings.explorer_max_tokens
                       else f"the API at /api/v1/run takes up to {self.settings.max_tokens}")
            raise InputError(f"the text has {n:,} tokens; the explorer draws up to {limit:,} ({context}): "
                             "shorten the text")
        self.check_count("the text", n, self.settings.max_tokens, "use a shorter text")
        cfg = _configure(model, spec, len(encoding.ids) if n_tokens_for is None else n_tokens_for)
        seed = spec.seed if spec.seed is not None else model.default_seed
        return Setup(model, cfg, encoding, ablation_map(spec.ablate, cfg), seed)

    def load(self, st: Setup, work: int, largest: int = 0,
             reduce: str = "the text's length, d_model, n_layers or n_heads") -> Prepared:
        """Check the cost of `work` multiply-adds (plus drawing the weights), then load the weights.

        Drawn weights count towards the work and the largest array; a checkpoint's are loaded once and
        kept (app/pretrained.py's memory budget), so its requests are priced by their own arrays, against
        the pretrained work limit."""
        s = self.settings
        drawn = count_params(st.cfg).total if st.model.draws_weights else 0
        if st.model.draws_weights and drawn > s.max_params:
            raise InputError(f"a model of this size has {drawn:,} parameters, more than the limit of "
                             f"{s.max_params:,}: reduce d_model or n_layers")
        self.check_cost(drawn + work, max(largest, largest_array(st.cfg, st.n, weights=st.model.draws_weights)),
                        reduce, pretrained=not st.model.draws_weights)
        self.preparations += 1
        params = st.model.load_params(st.cfg, st.seed, st.encoding)
        return Prepared(st.model, st.cfg, st.encoding, st.ablate, st.seed, params)

    def _resolve_hooks(self, wanted: list[str], cfg: TransformerConfig, model_name: str) -> list[str]:
        names = hook_names(cfg)
        known = set(names)
        unknown = [h for h in wanted if h not in known]
        if unknown:
            raise InputError(f"unknown hook name {unknown[0]!r} for model {model_name!r} with {cfg.n_layers} "
                             f"layer(s): hooks look like {names[-4]!r}; GET /api/v1/hooks?model={model_name} "
                             f"lists all {len(names)}")
        return list(dict.fromkeys(wanted))  # drop repeats, keep the order asked

    def _top_tokens(self, p: Prepared, probs: np.ndarray, k: int) -> list[TopToken]:
        """The k most probable tokens, most probable first (ties: the lower id first).  # probs [d_vocab]"""
        best = np.argsort(-probs, kind="stable")[:min(k, probs.size)]
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

    def _run_predicting(self, p: Prepared, names: list[str], top_k: int, decoder: bool
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
        top = self._top_tokens(p, probs, top_k) if top_k else []
        if not p.ablate:
            return top, None
        baseline = next_token_probs(self._run_last(p, [], None)[0])  # [d_vocab]
        before = self._top_tokens(p, baseline, top_k) if top_k else []
        return top, AblationEffect(before, [ProbabilityChange(t.token, t.id, t.prob, float(probs[t.id]),
                                                              float(probs[t.id]) - t.prob) for t in before])

    # ---------------------------------------------------------------- run (the API's raw view)

    def run(self, spec: RunSpec, hooks: list[str], top_k: int) -> RunResult:
        """Run a model on a text: tokens, next-token top-k and the chosen activations.

        With ablations on a decoder, the same text also runs without them, so the result says how
        the prediction changed (two forward passes, priced as such)."""
        st = self.setup(spec)
        cfg, n = st.cfg, st.n
        hooks = self._resolve_hooks(hooks, cfg, st.model.name)
        self._check_hook_values(sum(math.prod(hook_dims(h, cfg, n)) for h in hooks),
                                "the hooks asked for hold {values} numbers, more than the limit of {limit} per "
                                "response: ask for fewer hooks or use a shorter text")
        decoder = not st.model.is_encoder
        baseline = bool(st.ablate) and decoder
        p = self.load(st, self._pass_work(cfg, n, decoder) * (2 if baseline else 1), cfg.d_vocab if decoder else 0)
        cache, top, effect = self._run_predicting(p, hooks, top_k, decoder)
        return RunResult(p, {h: cache[h] for h in hooks}, top, effect)

    # ---------------------------------------------------------------- the explorer page

    def explorer(self, spec: RunSpec, layer: int, head: int, *, compare: bool, rollout: bool,
                 top_k: int) -> ExplorerView:
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
            fewer = ("fewer layers, a smaller d_model, fewer heads" if st.model.draws_weights else "") + \
                (" or no attention rollout" if rollout else "")
            raise InputError(f"this view would keep {values:,} numbers ({n:,} tokens, {cfg.n_layers} layers, "
                             f"{cfg.n_heads} heads), more than this server's limit of {s.explorer_max_values:,}: "
                             f"use a shorter text{', ' + fewer.lstrip(' ') if fewer else ''}")
        decoder = not st.model.is_encoder
        compare = compare and "causal" in st.model.toggles
        passes = 1 + (bool(st.ablate) and decoder) + compare
        p = self.load(st, self._pass_work(cfg, n, decoder) * passes, cfg.d_vocab if decoder else 0)
        cache, top, effect = self._run_predicting(p, hooks, top_k, decoder)
        other = None
        if compare:  # the same weights with the mask flipped: attention toggles never change them
            flipped = cfg.replace(attention_dir="bidirectional" if cfg.causal else "causal")
            _, flipped_cache = run_with_cache(p.params, flipped, p.ids, names=stage_hooks(flipped, layer),
                                              ablate=p.ablate, logits=False)
            other = flipped_cache.attention_stages(layer, head)
        return ExplorerView(
            p, layer, head, cache.attention_stages(layer, head), cache[f"blocks.{layer}.attn.hook_pattern"], other,
            cache.residual_norms(), top, effect, cache.rollout()[layer] if rollout else None,
            self._shape_rows(cfg, n, decoder))

    @staticmethod
    def _shape_rows(cfg: TransformerConfig, n: int, decoder: bool) -> list[ShapeRow]:
        """Every activation of a run in forward order, with its axes and dims."""
        rows = [ShapeRow("tokens", "[pos]", [n], False)]
        rows += [ShapeRow(name, hook_shape(name, cfg), hook_dims(name, cfg, n), name.endswith("hook_resid_pre"))
                 for name in hook_names(cfg)]
        if decoder:
            rows.append(ShapeRow("logits", "[pos, d_vocab]", [n, cfg.d_vocab], True))
        return rows

    # ---------------------------------------------------------------- looking inside (/inspect, /api/v1/analysis)

    def next_token_reason(self, model: Model, cfg: TransformerConfig, what: str) -> str | None:
        """Why `what` (decomposition, logit lens) cannot run on this model, or None. Both read the residual
        stream through the final layer norm and the unembedding, which only a pre-norm decoder has."""
        if model.is_encoder:
            return (f"{what} does not apply to {model.name!r}: it is an encoder (BERT-style), which predicts no "
                    "next token, and post-norm, so it has no final layer norm and unembedding to read the residual "
                    "stream through. Choose a decoder such as 'toy' (detectors and rollout do work on encoders)")
        if cfg.block_type != "pre_norm":
            return (f"{what} needs a pre-norm model (GPT-2 style, with a final layer norm); {model.name!r} is "
                    "post-norm, whose residual stream is re-normalised in every block")
        return None

    @staticmethod
    def kv_cache_reason(model: Model, cfg: TransformerConfig) -> str | None:
        """Why stepped generation with a KV cache cannot run on this model and setting, or None."""
        if model.is_encoder:
            return (f"{model.name!r} is an encoder: it generates nothing, and its bidirectional attention lets every "
                    "new token change the earlier positions, so nothing could be cached. Choose a decoder such as "
                    "'toy'")
        if not cfg.causal:
            return ("a KV cache needs the causal mask: without it every new token changes the earlier positions "
                    "too, so nothing can be reused. Turn causal back on")
        return None

    def inspect_reason(self, view: str, spec: RunSpec) -> str | None:
        """Why an Inspect view does not apply to this model and setting, or None."""
        model = self.catalog.get_model(spec.model)
        causal = model.cfg.causal if spec.causal is None else spec.causal
        cfg = model.cfg.replace(attention_dir="causal" if causal else "bidirectional")
        if view == "decompose":
            return self.next_token_reason(model, cfg, "the residual-stream decomposition")
        if view == "lens":
            return self.next_token_reason(model, cfg, "the logit lens")
        if view == "kvcache":
            return self.kv_cache_reason(model, cfg)
        return None

    def _require_next_token(self, st: Setup, what: str) -> None:
        reason = self.next_token_reason(st.model, st.cfg, what)
        if reason:
            raise InputError(reason)

    def decompose(self, spec: RunSpec, pos: int, target: int | None, n_targets: int = 10) -> Decomposition:
        """The residual stream at `pos` split into its parts, each part's direct logit for the target token."""
        st = self.setup(spec)
        self._require_next_token(st, "the residual-stream decomposition")
        if not -st.n <= pos < st.n:
            raise InputError(f"pos={pos} is outside the text's {st.n} tokens: use 0 … {st.n - 1}, or -1 for the last")
        if target is not None and target >= st.cfg.d_vocab:
            raise InputError(f"target={target} is not a token id of {st.model.name!r}, whose vocabulary is "
                             f"0 … {st.cfg.d_vocab - 1}; leave it out to use the model's most likely next token")
        n_parts = 3 + st.cfg.n_layers * (st.cfg.n_heads + 3)  # embeddings, then per layer heads, biases, mlp
        p = self.load(st, forward_work(st.cfg, st.n), max(n_parts * st.cfg.d_model, st.n * st.cfg.d_vocab))
        logits, cache = run_with_cache(p.params, p.cfg, p.ids, names=decomposition_hooks(p.cfg), ablate=p.ablate)
        probs = softmax(logits[pos])  # [d_vocab], the prediction at pos (the default target)
        token = target if target is not None else int(np.argmax(probs))
        d = cache.decompose_resid(token, pos)
        order = np.argsort(-np.abs(d.direct_logit), kind="stable")[:5]
        return Decomposition(p, d, TopToken(p.token_str(token), token, float(probs[token])),
                             self._top_tokens(p, probs, n_targets),
                             [(d.labels[i], float(d.direct_logit[i])) for i in order])

    def logit_lens(self, spec: RunSpec, top_k: int) -> Lens:
        """Every resid_pre / resid_mid (and the last resid_post) decoded through ln_final and W_U."""
        st = self.setup(spec)
        self._require_next_token(st, "the logit lens")
        cfg, n = st.cfg, st.n
        points = lens_points(cfg)
        k = min(top_k, cfg.d_vocab)
        self._check_hook_values(len(points) * n * k, "the lens table holds {values} cells, more than the limit of "
                                                     "{limit}: reduce top_k or use a shorter text")
        lens_work = len(points) * n * cfg.d_model * cfg.d_vocab  # each point's unembedding
        p = self.load(st, forward_work(cfg, n, logits=False) + lens_work, n * cfg.d_vocab)
        _, cache = run_with_cache(p.params, cfg, p.ids, names=points, ablate=p.ablate, logits=False)
        lens = cache.logit_lens(k)
        return Lens(p, lens, {int(t): p.token_str(int(t)) for t in np.unique(lens.top_tokens)})

    def detectors(self, spec: RunSpec, random_length: int, random_seed: int, threshold: float) -> Detectors:
        """Previous-token, duplicate-token and induction scores of every head, on the text and on a
        repeated random sequence (where only induction can predict the second half)."""
        st = self.setup(spec)
        model, cfg = st.model, st.cfg
        random_ids = repeated_random_tokens(cfg.d_vocab, random_length, 2, random_seed)
        n_random = random_ids.size
        self.check_count("the repeated random sequence", n_random, self.settings.max_tokens, "reduce random_length")
        # The random run uses the weights this model has for a text of that length (the same weights,
        # except for spec-forward, whose position table is drawn per prompt length).
        random_cfg = _configure(model, spec, n_random)
        if random_cfg.positional_embedding_type == "learned" and n_random > random_cfg.n_ctx:
            raise InputError(f"the repeated random sequence has {n_random} tokens, more than the context of "
                             f"{model.name!r}, n_ctx={random_cfg.n_ctx}: reduce random_length")
        ablate_random = ablation_map(spec.ablate, random_cfg)
        random_tokens = [model.tokenizer.token_str(int(t)) for t in random_ids]
        longest = max(st.n, n_random)
        p = self.load(st, forward_work(cfg, st.n, logits=False) + forward_work(random_cfg, n_random, logits=False),
                      max(largest_array(random_cfg, n_random, weights=model.draws_weights),
                          cfg.n_layers * cfg.n_heads * longest * longest))
        on_text = run_with_cache(p.params, cfg, p.ids, names=pattern_hooks(cfg), ablate=p.ablate,
                                 logits=False)[1].head_detector_scores()
        random_params = model.load_params(random_cfg, p.seed, Encoding(list(map(int, random_ids)), random_tokens))
        on_random = run_with_cache(random_params, random_cfg, random_ids, names=pattern_hooks(random_cfg),
                                   ablate=ablate_random, logits=False)[1].head_detector_scores()
        scores = {name: {"text": on_text[name], "random": on_random[name]} for name in HEAD_DETECTORS}
        flagged = [FlaggedHead(name, on, int(layer), int(head), float(grid[layer, head]))
                   for name, by in scores.items() for on, grid in by.items()
                   for layer, head in zip(*np.nonzero(np.nan_to_num(grid, nan=-1.0) >= threshold))]
        flagged.sort(key=lambda f: -f.score)
        return Detectors(p, list(map(int, random_ids)), random_tokens, scores, threshold, flagged)

    def kv_steps(self, spec: RunSpec, n_new: int) -> KVSteps:
        """Generate token by token with a KV cache, and check every step against a full recomputation."""
        s = self.settings
        st = self.setup(spec)
        model, cfg, n = st.model, st.cfg, st.n
        reason = self.kv_cache_reason(model, cfg)
        if reason:
            raise InputError(reason)
        total = n + n_new
        self.check_count("the text plus the generated tokens", total, s.max_tokens, "reduce n_new or shorten the text")
        if cfg.positional_embedding_type == "learned" and total > cfg.n_ctx:
            raise InputError(f"{n} tokens of text + n_new={n_new} exceed the context of {model.name!r}, "
                             f"n_ctx={cfg.n_ctx} learned positions: reduce n_new to at most {max(cfg.n_ctx - n, 0)}")
        # stepping costs about one full pass over all tokens; the check recomputes them all once more
        p = self.load(st, 2 * forward_work(cfg, total), 2 * total * cfg.d_vocab,
                      "n_new, the text's length, d_model, n_layers or n_heads")
        kv: KVRun = run_with_kv_cache(p.params, cfg, p.ids, n_new=n_new)
        full, _ = run_with_cache(p.params, cfg, kv.tokens, names=())  # [total, d_vocab]
        cached = np.stack([step.logits for step in kv.steps])  # [total, d_vocab]
        diff = np.abs(cached - full).max(axis=-1)  # [total]
        strs = p.tokens + [p.token_str(int(t)) for t in kv.tokens[n:]]
        rows = []
        for step, d in zip(kv.steps, diff):
            top = int(np.argmax(step.logits))
            rows.append(KVStepRow(step.pos, strs[step.pos], step.token, step.generated, list(step.k_shape),
                                  list(step.v_shape), step.cache_bytes, float(d), TokenRef(p.token_str(top), top)))
        itemsize = kv.kv.keys[0].dtype.itemsize
        return KVSteps(p, rows, "".join(strs[n:]), str(kv.kv.keys[0].dtype),
                       2 * cfg.n_layers * cfg.n_key_value_heads * cfg.d_head * itemsize, itemsize, float(diff.max()))

    def _pattern(self, spec: RunSpec, layer: int, head: int) -> ComparedSide:
        st = self.setup(spec)
        if layer >= st.cfg.n_layers or head >= st.cfg.n_heads:
            raise InputError(f"layer {layer}, head {head} does not exist: {st.model.name!r} has {st.cfg.n_layers} "
                             f"layer(s) of {st.cfg.n_heads} head(s), counted from 0")
        p = self.load(st, forward_work(st.cfg, st.n, logits=False))
        name = f"blocks.{layer}.attn.hook_pattern"
        _, cache = run_with_cache(p.params, p.cfg, p.ids, names=[name], ablate=p.ablate, logits=False)
        return ComparedSide(p, cache[name][head], causal_mask(st.n) if p.cfg.causal else None)

    def compare(self, spec: RunSpec, other: Mapping[str, object], layer: int, head: int) -> Comparison:
        """One head's pattern under two settings (`other` changes the first side's), and b − a."""
        a = self._pattern(spec, layer, head)
        b = self._pattern(spec.replace(**{k: v for k, v in other.items() if v is not None}), layer, head)
        if a.pattern.shape != b.pattern.shape:
            return Comparison(a, b, layer, head, None,
                              f"the two texts have {a.pattern.shape[0]} and {b.pattern.shape[0]} tokens: a "
                              "difference needs texts of the same number of tokens")
        return Comparison(a, b, layer, head, b.pattern - a.pattern, None)

    def rollout(self, spec: RunSpec) -> Rollout:
        """Attention rollout after every layer (core.analysis.attention_rollout); works on any model."""
        st = self.setup(spec)
        cfg, n = st.cfg, st.n
        self._check_hook_values(cfg.n_layers * n * n, "the rollout holds {values} numbers, more than the limit of "
                                                      "{limit}: use a shorter text")
        p = self.load(st, forward_work(cfg, n, logits=False) + cfg.n_layers * n ** 3,
                      cfg.n_layers * cfg.n_heads * n * n)
        _, cache = run_with_cache(p.params, cfg, p.ids, names=pattern_hooks(cfg), ablate=p.ablate, logits=False)
        return Rollout(p, cache.rollout())

    # ---------------------------------------------------------------- lessons

    def _check_words(self, text: str) -> list[str]:
        tokens = word_tokens(text)
        self.check_count("the text", len(tokens), self.settings.max_tokens, "use a shorter text")
        return tokens

    def lesson_attention(self, text: str, seed: int, d_model: int, d_k: int, causal: bool, scale: bool
                         ) -> AttentionLessonResult:
        T = len(self._check_words(text))
        self.check_cost(3 * T * d_model * d_k + 2 * T * T * d_k, max(T * T, T * d_model, d_model * d_k),
                        "the number of words, d_model or d_k")
        lesson = lessons.attention(text, seed, d_model, d_k, causal=causal, scale=scale)
        divisor = attention_scale(d_k, scale)
        return AttentionLessonResult(lesson, lesson.raw_scores / divisor, divisor)

    def lesson_causal(self, text: str, seed: int, d_model: int, d_k: int, scale: bool) -> CausalLessonResult:
        """The attention lesson with the mask on, and the same weights without it."""
        masked = self.lesson_attention(text, seed, d_model, d_k, True, scale).lesson
        return CausalLessonResult(masked, self.lesson_attention(text, seed, d_model, d_k, False, scale).lesson)

    def lesson_scaling(self, dims: tuple[int, ...], n_queries: int, n_keys: int, seed: int
                       ) -> list[lessons.ScalingRow]:
        # every key entry is drawn and multiplied once; the key array of the widest d is the largest
        self.check_cost(2 * n_queries * n_keys * sum(dims), n_queries * n_keys * max(dims),
                        "n_queries, n_keys or the dims")
        return lessons.scaling(dims, n_queries, n_keys, seed)

    def lesson_multihead(self, text: str, seed: int, d_model: int, n_heads: int, causal: bool, scale: bool
                         ) -> MultiheadLessonResult:
        T = len(self._check_words(text))
        self.check_cost(4 * T * d_model * d_model + 2 * T * T * d_model, max(n_heads * T * T, 3 * d_model * d_model),
                        "the number of words, d_model or n_heads")
        m = lessons.multihead(text, seed, d_model, n_heads, causal=causal, scale=scale)
        return MultiheadLessonResult(m, np.isneginf(m.result.scores[0]) if causal else None)

    def lesson_positions(self, n_pos: int, d: int, pairs: tuple[tuple[int, int], ...] | None,
                         series: bool = False) -> PositionsLessonResult:
        """With no pairs given, the spec's pairs that fit inside n_pos. With `series`, the dot product of
        each pair's first position with every later one (the page's chart)."""
        self.check_cost(n_pos * d, n_pos * d, "n_pos or d")
        if pairs is None:
            pairs = tuple((i, j) for i, j in lessons.SPEC_POSITION_PAIRS if i < n_pos and j < n_pos)
        p = lessons.positions(n_pos, d, pairs)
        rows = []
        if series:
            for i in list(dict.fromkeys(i for i, _, _ in p.dots)) or [0]:
                dots = [float(p.encoding[i] @ p.encoding[j]) for j in range(i, n_pos)]
                rows.append(DotSeries(i, list(range(n_pos - i)), dots))
        return PositionsLessonResult(p, rows)

    def lesson_forward(self, text: str, prompt: str, seed: int, d_model: int, n_heads: int, d_mlp: int
                       ) -> ForwardLessonResult:
        self.check_count("the prompt", len(prompt), self.settings.max_tokens, "use a shorter prompt")
        if not text:
            raise InputError("the text is empty: its characters are the vocabulary, so type at least one")
        # the config the lesson will build, to price it first (and to explain d_model/n_heads errors)
        cfg = self.catalog.get_model("spec-forward").cfg.replace(
            d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, d_vocab=len(set(text)), n_ctx=max(len(prompt), 1))
        self.check_cost(count_params(cfg).total + forward_work(cfg, len(prompt)), largest_array(cfg, len(prompt)),
                        "the prompt, d_model, n_heads or d_mlp")
        f = lessons.forward(text, prompt, seed, d_model, n_heads, d_mlp)
        return ForwardLessonResult(f, f.cache["blocks.0.attn.hook_pattern"],
                                   np.isneginf(f.cache["blocks.0.attn.hook_attn_scores"][0]))

    # ---------------------------------------------------------------- training (app/runs.py, app/training.py)

    def _store(self) -> RunStore:
        store = self.catalog.runs
        if store is None:
            raise Unavailable("training is off on this server (EXPLORER_TRAIN_WORKERS=0)", retry_after_s=None)
        if store.error:
            raise Unavailable(store.error, retry_after_s=None)
        return store

    def train(self, recipe: str, changes: dict[str, object], client: str) -> tuple[RunInfo, bool]:
        """The run of these settings: created and queued if new, resumed if it was cut short, cancelled
        or failed, as it is otherwise. Returns it and whether this request queued it. A run is a pure
        function of its settings, so the same request always names the same run."""
        store = self._store()
        client = hashlib.sha256(client.encode()).hexdigest()[:16]  # who, without keeping the address
        settings = train_settings(recipe, **changes)
        id = run_id(settings)
        if store.exists(id):
            info = store.info(id)
            if info.status not in ("cancelled", "interrupted", "failed"):
                return info, False
            self._check_room(store, client)
            store.requeue(id)
            return store.info(id, store.queue()), True
        self._check_room(store, client)
        store.evict()  # make room within EXPLORER_RUNS_MAX_MB: the oldest finished runs go first
        id, created = store.create(settings, client)
        return store.info(id, store.queue()), created

    def _check_room(self, store: RunStore, client: str) -> None:
        s = self.settings
        active = [store.request(id) for id in store.ids()
                  if store.state(id)["status"] in ("queued", "running") or store.is_training(id)]
        mine = sum(1 for r in active if r.get("client") == client)
        if mine >= s.train_max_per_client:
            raise Unavailable(f"you already have {mine} run(s) queued or training, the most one client may "
                              f"have: wait for one to finish, or stop one (DELETE /api/v1/runs/{{id}})",
                              retry_after_s=30, status_code=429)
        if len(active) >= s.train_max_runs:
            raise Unavailable(f"this server has {len(active)} runs queued or training, its limit: try again "
                              "when one has finished", retry_after_s=30, status_code=503)

    def runs(self) -> list[RunInfo]:
        """Every run, newest first."""
        store = self._store()
        queue = store.queue()
        return [store.info(id, queue) for id in store.ids()]

    def run_info(self, id: str) -> RunInfo:
        store = self._store()
        if not store.exists(id):
            raise NotFound(f"there is no run {id!r} on this server: GET /api/v1/runs lists them")
        return store.info(id, store.queue())

    def cancel(self, id: str) -> RunInfo:
        """Stop a queued or training run; it keeps what it learned (a snapshot, and its weights as a model)."""
        info = self.run_info(id)
        if info.status in ("queued", "running"):
            self._store().request_cancel(id)
        return self.run_info(id)

    def run_patterns(self, id: str, step: int) -> RunPatterns:
        """The probe's attention patterns at a snapshot step, with the probe's tokens."""
        info = self.run_info(id)
        patterns = self._store().patterns(id, step)
        if patterns is None:
            raise NotFound(f"run {id!r} has no patterns at step {step}: its snapshot steps are "
                           f"{info.snapshots or 'none yet'}")
        return RunPatterns(id, step, self.probe_tokens(id), patterns)

    def head_history(self, id: str, layer: int, head: int) -> HeadHistory:
        """One head's pattern on the probe at every snapshot step: how it formed as the run trained."""
        info = self.run_info(id)
        store = self._store()
        patterns = [store.patterns(id, step) for step in info.snapshots]
        settings = store.settings(id)
        n_layers, n_heads = settings.n_layers, settings.n_heads
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise InputError(f"layer {layer}, head {head} does not exist: the run's model has {n_layers} layer(s) "
                             f"of {n_heads} head(s), counted from 0")
        return HeadHistory(info.snapshots, self.probe_tokens(id), [p[layer][head] for p in patterns if p])

    @staticmethod
    def recipe_defaults(recipe: str) -> dict[str, object]:
        """A recipe's working settings, as the training form shows them."""
        return dataclasses.asdict(train_settings(recipe))

    def probe_tokens(self, id: str) -> list[str]:
        """The probe's tokens, as the patterns' axes show them."""
        self.run_info(id)  # a run that exists
        return recipe_probe_tokens(self._store().settings(id))

    def checkpoint(self, id: str) -> tuple[str, bytes]:
        """The run's weights as a zip of its Hugging Face folder: (file name, bytes)."""
        self.run_info(id)
        folder = self._store().model_folder(id)
        if folder is None:
            raise NotFound(f"run {id!r} has no weights yet: they are written when it finishes or is stopped")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(folder.iterdir()):
                z.write(path, f"{id}/{path.name}")
        return f"{id}.zip", buffer.getvalue()

    def run_changes(self, id: str, since: str | None) -> tuple[list[tuple[str, object]], str, bool]:
        """What changed in a run since a stream's last event id: ([(event, data)], the new id, finished).

        The id is RunInfo.event_id ("records.step.status"). A stream with no id gets the whole run first;
        then each new record, the progress (step and loss) when it moved, and the whole run again when
        the status changes."""
        info = self.run_info(id)
        n_sent, step_sent, status_sent = _parse_event_id(since)
        events: list[tuple[str, object]] = []
        if since is None or status_sent != info.status:
            events.append(("run", info))
        else:
            events += [("record", r) for r in info.records[n_sent:]]
            if info.step != step_sent:
                events.append(("progress", {"id": id, "step": info.step, "steps": info.steps, "loss": info.loss,
                                            "status": info.status}))
        return events, info.event_id, info.status in FINISHED

    # ---------------------------------------------------------------- calculators

    @staticmethod
    def params(preset: str | None, sizes: dict[str, object]) -> ParamsResult:
        """Count a preset's parameters, with any given sizes replacing its own, array by array."""
        cfg = calc_config(preset, **sizes)
        return ParamsResult(cfg, count_params(cfg))

    @staticmethod
    def kv_cache(preset: str | None, sizes: dict[str, object], seq_len: int | None, batch: int,
                 dtype: str) -> KVCacheResult:
        """The memory of a KV cache of `seq_len` tokens (default: the model's context)."""
        cfg = calc_config(preset, **sizes)
        return KVCacheResult(cfg, kv_cache(cfg, seq_len, batch, dtype), dtype)

    def lesson_params(self, preset: str, sizes: dict[str, object]) -> ParamsLessonResult:
        """The spec's "Counting parameters": the toy and this model, and the 12 d² rule of thumb."""
        toy_cfg = calc_config("toy")
        cfg = calc_config(preset, **sizes)
        name = {"gpt2-small": "GPT-2 small"}.get(preset, preset) if cfg == PRESETS[preset] else "your model"
        rows = [ParamsLessonRow(label, c, count_params(c)) for label, c in (("toy", toy_cfg), (name, cfg))]
        mine = rows[1].count
        rule = 12 * cfg.d_model * cfg.d_model
        return ParamsLessonResult(name, rows, rule, abs(mine.per_block - rule) / mine.per_block,
                                  mine.embeddings / mine.total, param_groups(mine),
                                  {r.name: _spec_sizes(r.cfg) for r in rows})

    def calculator(self, preset: str | None, sizes: dict[str, object], seq_len: int | None, batch: int,
                   dtype: str) -> CalculatorResult:
        """The parameter count of one configuration, and its KV cache at this length and at every power of two."""
        cfg = calc_config(preset, **sizes)
        count = count_params(cfg)
        kv = kv_cache(cfg, seq_len, batch, dtype)
        top = max(cfg.n_ctx, kv.seq_len)
        lengths = sorted({2**k for k in range(int(math.log2(top)) + 1)} | {cfg.n_ctx, kv.seq_len})
        powers = [n for n in lengths if n & (n - 1) == 0]
        ticks = powers[::max(1, math.ceil(len(powers) / 8))]  # at most about 8 labels
        by_dtype = {d: [kv_cache(cfg, n, batch, d).bytes for n in lengths] for d in DTYPE_BYTES}
        return CalculatorResult(cfg, count, param_groups(count), count.total * DTYPE_BYTES["float32"], kv,
                                lengths, ticks, by_dtype)


# ------------------------------------------------------------------ helpers that need no catalogue

def _check_toggles(model: Model, given: dict[str, object]) -> None:
    refused = [k for k, v in given.items() if v is not None and k not in model.toggles]
    if "causal" in refused and not model.is_encoder and "local" in (model.cfg.attn_types or ()):
        raise InputError(f"model {model.name!r} does not accept causal: its local (sliding-window) attention layers "
                         f"see only the last {model.cfg.window_size} tokens before each query, which is defined "
                         f"under the causal mask only; it takes {', '.join(model.toggles)}")
    if refused:
        raise InputError(f"model {model.name!r} does not accept {', '.join(refused)}: it takes "
                         f"{', '.join(model.toggles) or 'no toggles'}"
                         + ("; the 'toy' model accepts every toggle" if model.name != "toy" else ""))


def _configure(model: Model, spec: RunSpec, n_tokens: int) -> TransformerConfig:
    """The model's config with the spec's toggles applied."""
    _check_toggles(model, {name: getattr(spec, name) for name in ATTENTION_TOGGLES + SIZE_TOGGLES})
    sizes = {k: getattr(spec, k) for k in ("n_heads", "n_layers", "d_model") if getattr(spec, k) is not None}
    cfg = model.configure(sizes, n_tokens)
    attention = {"attention_dir": None if spec.causal is None else ("causal" if spec.causal else "bidirectional"),
                 "use_attn_scale": spec.scale, "attn_temperature": spec.temperature,
                 "positional_embedding_type": spec.positional_embedding_type}
    attention = {k: v for k, v in attention.items() if v is not None}
    return cfg.replace(**attention) if attention else cfg


def ablation_map(ablate: tuple[AblatedHead, ...], cfg: TransformerConfig) -> dict[tuple[int, int], Method]:
    """The spec's ablations as core's {(layer, head): "zero"|"mean"}, checked against this model."""
    out: dict[tuple[int, int], Method] = {}
    for a in ablate:
        if a.layer >= cfg.n_layers or a.head >= cfg.n_heads:
            raise InputError(f"ablate: layer {a.layer} head {a.head} does not exist: this model has "
                             f"{cfg.n_layers} layer(s) of {cfg.n_heads} head(s), counted from 0")
        if (a.layer, a.head) in out:
            raise InputError(f"ablate: layer {a.layer} head {a.head} is listed twice: list each head once")
        out[(a.layer, a.head)] = a.method
    return out


def calc_config(preset: str | None, **sizes: int | bool | str | None) -> TransformerConfig:
    """A preset (default "toy") with any given sizes (and switches) replacing its own.

    Heads split d_model without changing any count; when a new d_model is not a multiple of
    the preset's heads (and no d_head is given), one head is assumed, with one key/value head.
    """
    base = PRESETS[preset or "toy"]
    changes = {k: v for k, v in sizes.items() if v is not None}
    if ("n_heads" not in changes and "d_head" not in changes and "d_model" in changes
            and changes["d_model"] % base.n_heads):
        changes["n_heads"] = 1
        changes.setdefault("n_key_value_heads", 1)
    return base.replace(**changes) if changes else base


def kv_cache(cfg: TransformerConfig, seq_len: int | None, batch: int, dtype: str) -> KVCacheSize:
    return kv_cache_bytes(cfg, seq_len if seq_len is not None else cfg.n_ctx, batch, dtype)


def _spec_sizes(cfg: TransformerConfig) -> tuple[int, ...]:
    """(vocab, n_ctx, d, n_layers[, d_ff]) as the spec's gpt_params takes them."""
    sizes = (cfg.d_vocab, cfg.n_ctx, cfg.d_model, cfg.n_layers)
    return sizes + ((cfg.d_mlp,) if cfg.d_mlp != 4 * cfg.d_model else ())


# The presets the spec's closed formula counts exactly (GPT-2's design: learned positions, biases,
# layer norms, an ungated MLP): the "Counting parameters" lesson offers these; the calculator, all.
SPEC_FORMULA_PRESETS = tuple(name for name, cfg in PRESETS.items()
                             if gpt_params(*_spec_sizes(cfg))[2] == count_params(cfg).total)


def param_groups(count: ParamCount) -> list[ParamGroup]:
    """The count's entries gathered into the spec's components. An uncounted component keeps what it
    would cost, so a chart can say why it costs nothing."""
    groups: dict[str, list] = {}
    for e in count.entries:
        leaf = e.name.rsplit(".", 1)[-1]
        if not e.counted:
            name = "unembedding (tied)" if e.name.startswith("unembed") else (
                "causal mask buffers" if leaf == "mask" else e.name)
        elif e.name.startswith("embed"):
            name = "token table"
        elif e.name.startswith(("pos_embed", "token_type_embed")):
            name = "position table" if e.name.startswith("pos_embed") else "segment table"
        elif ".ln" in e.name or e.name.startswith(("ln_final", "ln_embed")):
            name = "layer norms (gain + bias)"
        elif ".attn." in e.name:
            name = "attention biases" if leaf.startswith("b_") else "attention weights"
        elif ".mlp." in e.name:
            name = "MLP biases" if leaf.startswith("b_") else "MLP weights"
        else:
            name = "unembedding" + (" bias" if leaf.startswith("b_") else "")
        g = groups.setdefault(name, [0, e.counted, e.note])
        g[0] += e.size * e.copies
    return [ParamGroup(name, size, counted, note) for name, (size, counted, note) in groups.items() if size]


def _parse_event_id(since: str | None) -> tuple[int, int, str | None]:
    """"3.150.running" -> (3, 150, "running"); anything else starts from nothing."""
    try:
        n, step, status = (since or "").split(".")
        return int(n), int(step), status
    except ValueError:
        return 0, -1, None
