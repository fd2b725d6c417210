"""What the model views return: plain dataclasses with token strings resolved, which the API's response
models read (`from_attributes`) and the pages format. Arrays stay NumPy; masked scores are −inf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from app.service.spec import AblatedHead, Prepared
from core import TransformerConfig, hook_shape
from core.analysis import LogitLens, ResidualDecomposition
from core.attention import attention_scale
from core.cache import AttentionStages, ResidualNorms
from core.cell import AttentionCell, HeadVectors, attention_cell


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
class ModelResult:
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
class RunResult(ModelResult):
    hooks: dict[str, np.ndarray]  # by hook name; masked scores are -inf
    top_k: list[TopToken]  # [] for encoders
    ablation_effect: AblationEffect | None  # with ablations on a decoder: the prediction before and after
    steering_effect: AblationEffect | None = None  # with steers: the unsteered prediction, and each token's change

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
class ExplorerView(ModelResult):
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
    # With ablations on a causal pre-norm decoder: the probability of each of ablation_effect's tokens when every
    # attention pattern from the first ablated layer on keeps its unablated value (core.patching.ablated_logits,
    # frozen): the ablated heads' direct and value paths only. Beside ablation_effect's (every pattern recomputed),
    # the difference is what the ablation does through later heads' queries and keys.
    frozen_ablation: list[ProbabilityChange] | None = None
    vectors: HeadVectors = field(kw_only=True)  # the chosen head's q, k, v, z: what opens one of its cells

    @property
    def cells(self) -> HeadCells:
        """What opens any cell of the chosen head, without the rest of the view."""
        return HeadCells(self.model, self.tokens, self.config, self.stages, self.vectors)

    @property
    def kv_heads(self) -> list[int]:
        """The key/value head each query head reads: consecutive query heads share one under
        grouped-query attention (cfg.kv_head); [0, 1, 2, ...] when every head has its own."""
        return [self.config.kv_head(h) for h in range(self.config.n_heads)]


@dataclass(frozen=True)
class HeadCells:
    """One head of one explorer view, as much as opens any of its cells: its stages and its vectors (a page
    keeps this for a while, so that moving the open cell does not run the model again)."""

    model: str
    tokens: list[str]
    config: TransformerConfig
    stages: AttentionStages
    vectors: HeadVectors

    @property
    def layer(self) -> int:
        return self.vectors.layer

    @property
    def head(self) -> int:
        return self.vectors.head

    @property
    def nbytes(self) -> int:
        st = self.stages
        return self.vectors.nbytes + sum(a.nbytes for a in (st.raw, st.scaled, st.mask, st.masked, st.weights))

    def cell(self, query: int, key: int) -> AttentionCell:
        """The cell (query, key): q, k and their products, the four stages' numbers, the row's weights and
        values, and the head's output for the query (core/cell.py attention_cell)."""
        cfg = self.config
        divisor = attention_scale(cfg.d_head, cfg.use_attn_scale, cfg.attn_temperature)
        return attention_cell(self.vectors, self.stages, divisor, query, key)


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
class Decomposition(ModelResult):
    d: ResidualDecomposition  # labels, parts [n_parts, d_model], direct_logit [n_parts], ...
    target: TopToken  # the token whose logit is attributed (prob: the model's at pos)
    targets: list[TopToken]  # the model's most likely tokens at pos, to choose another target
    largest: list[tuple[str, float]]  # the parts with the largest |direct logit|, largest first

    def __getattr__(self, name: str):  # pos, labels, parts, direct_logit, logit_bias, scale, logit, part_norms
        return getattr(self.d, name)


@dataclass(frozen=True)
class Lens(ModelResult):
    lens: LogitLens  # points, top_tokens [n_points, pos, k], top_probs
    token_strs: dict[int, str]  # every id in the table, readable

    @property
    def points(self) -> list[str]:
        return self.lens.points

    @property
    def top_k(self) -> list[list[list[TopToken]]]:
        """[point][pos][k], most probable first."""
        strs = self.token_strs
        return [
            [
                [TopToken(strs[t], t, p) for t, p in zip(cell_ids, cell_probs)]
                for cell_ids, cell_probs in zip(point_ids, point_probs)
            ]
            for point_ids, point_probs in zip(self.lens.top_tokens.tolist(), self.lens.top_probs.tolist())
        ]


@dataclass(frozen=True)
class FlaggedHead:
    detector: str
    on: Literal["text", "random"]
    layer: int
    head: int
    score: float


@dataclass(frozen=True)
class Detectors(ModelResult):
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
class KVSteps(ModelResult):
    steps: list[KVStepRow]
    generated_text: str
    dtype: str
    bytes_per_token: int  # 2 (K and V) × n_layers × n_key_value_heads × d_head × itemsize
    itemsize: int
    max_abs_diff: float

    @property
    def bytes_formula(self) -> str:
        c = self.config
        shared = f" (shared by its {c.n_heads} query heads)" if c.n_key_value_heads != c.n_heads else ""
        return (
            f"2 × n_layers {c.n_layers} × n_key_value_heads {c.n_key_value_heads}{shared} × d_head {c.d_head} × "
            f"{self.itemsize} bytes = {self.bytes_per_token:,} bytes per token"
        )


@dataclass(frozen=True)
class ComparedSide(ModelResult):
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
class Rollout(ModelResult):
    rollout: np.ndarray  # [n_layers, query_pos, key_pos], rows sum to 1
