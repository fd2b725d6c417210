"""Response models of the REST API v1: each is read from a service result's attributes
(`from_attributes`); a route validates its result into its response model and sends that
(app/api/routes/), so the OpenAPI describes exactly what is sent. Small value types (a top-k token,
an ablation's effect, a flagged head) are the service's own dataclasses, used here as they are. Arrays
pass through unvalidated as `Matrix` (NumPy in, JSON out, app/http/jsonio.py) with their JSON schema
stated."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema

from app.service import STATUSES, AblatedHead
from app.service.lessons import Dot
from app.service.results import AblationEffect, FlaggedHead, HookShape, TokenRef, TopToken
from core import TransformerConfig

# Arrays go out as they are (app/http/jsonio.py writes NumPy); their JSON schema is stated here.
Matrix = Annotated[Any, WithJsonSchema(TypeAdapter(list[list[float | None]]).json_schema())]
Matrices = Annotated[Any, WithJsonSchema(TypeAdapter(list[list[list[float | None]]]).json_schema())]
BoolMatrix = Annotated[Any, WithJsonSchema(TypeAdapter(list[list[bool]]).json_schema())]
Vector = Annotated[Any, WithJsonSchema(TypeAdapter(list[float]).json_schema())]


class ResponseModel(BaseModel):
    """A JSON response, read from a service result's attributes."""

    model_config = ConfigDict(from_attributes=True)


class AttentionLessonResponse(ResponseModel):
    tokens: list[str]
    shapes: dict[str, list[int]] = Field(description="shape of each array: X, W_q, W_k, W_v, Q, K, V, weights, output")
    raw_scores: Matrix = Field(description="Q Kᵀ [query_pos, key_pos], rows are queries, columns keys")
    scaled_scores: Matrix = Field(description="raw_scores ÷ divisor, before the mask")
    scores: Matrix = Field(description="scaled and masked: null where the mask forbids")
    mask: BoolMatrix = Field(description="true where a query may not see a key")
    weights: Matrix = Field(description="softmax of each row of scores")
    output: Matrix = Field(description="weights @ V [pos, d_k]")
    divisor: float = Field(description="√d_k when scaling, else 1")


class ScalingRowModel(ResponseModel):
    d: int
    std: float = Field(description="standard deviation of the raw dot products q·k")
    top_weight_unscaled: float = Field(description="mean largest softmax weight, scores not scaled")
    top_weight_scaled: float = Field(description="the same with scores ÷ √d")


class ScalingResponse(ResponseModel):
    rows: list[ScalingRowModel]


class HeadModel(ResponseModel):
    scores: Matrix
    weights: Matrix


class MultiheadResponse(ResponseModel):
    tokens: list[str]
    d_head: int
    shapes: dict[str, list[int]]
    heads: list[HeadModel] = Field(description="one entry per head: scores and weights [query_pos, key_pos]")
    output: Matrix = Field(description="concatenated heads @ W_o [pos, d_model]")


class PositionsResponse(ResponseModel):
    encoding: Matrix = Field(description="[n_pos, d]: sin on even dimensions, cos on odd")
    dots: list[Dot]


class StepModel(ResponseModel):
    name: str
    shape: list[int]


class ForwardResponse(ResponseModel):
    vocab: list[str]
    tokens: list[str]
    token_ids: list[int]
    steps: list[StepModel] = Field(description="the spec's printed shapes, step by step")
    next_token_probs: dict[str, float] = Field(description="probability of each character after the prompt")
    config: TransformerConfig


class ParamEntryModel(ResponseModel):
    name: str = Field(description="dotted array name; {l} stands for every layer")
    shape: list[int]
    per_layer: bool
    counted: bool = Field(description="false for arrays that add no parameters (tied tables, the mask buffer)")
    size: int = Field(description="elements of one copy")
    total: int = Field(description="parameters this entry adds to the total (0 if not counted)")
    note: str = Field(description="what it is, and why it is or is not counted")


class ParamsResponse(ResponseModel):
    config: TransformerConfig
    embeddings: int
    per_block: int
    total: int
    breakdown: list[ParamEntryModel]


class KVCacheTerms(ResponseModel):
    n_layers: int
    batch: int
    seq_len: int
    n_heads: int = Field(description="query heads")
    n_key_value_heads: int = Field(description="heads whose keys and values are cached (the formula's term)")
    d_head: int
    dtype_bytes: int


class KVCacheResponse(ResponseModel):
    bytes: int
    dtype: str
    formula: str
    terms: KVCacheTerms
    config: TransformerConfig


class ModelInfo(ResponseModel):
    name: str
    kind: Literal["toy", "pretrained", "trained"] = Field(
        description="toy: random weights drawn here; trained: by core.train (shipped with the app, or a run); "
        "pretrained: a checkpoint"
    )
    description: str
    config: TransformerConfig
    toggles: list[str] = Field(description="run request fields this model accepts")
    is_encoder: bool
    default_text: str
    default_seed: int
    runnable: bool
    error: str | None = Field(description="why it cannot run, if it cannot")


class ModelsResponse(ResponseModel):
    models: list[ModelInfo]


class HookModel(ResponseModel):
    name: str
    shape: str = Field(description="axis names, e.g. [head_index, query_pos, key_pos]")


class HooksResponse(ResponseModel):
    model: str
    config: TransformerConfig
    hooks: list[HookModel]


class ModelResultResponse(ResponseModel):
    """What every model response starts with: the model, its tokens and the config and seed it ran with."""

    model: str
    tokens: list[str]
    token_ids: list[int]
    config: TransformerConfig
    seed: int


class RunResponse(ModelResultResponse):
    hooks: dict[str, Any] = Field(description="nested lists by hook name; masked scores are null")
    hook_shapes: dict[str, HookShape]
    top_k: list[TopToken] = Field(description="most likely next tokens; empty for encoders")
    ablation_effect: AblationEffect | None = Field(
        None,
        description="with `ablate`, on a decoder: the prediction without the ablation and how much each of "
        "its top tokens' probability changed",
    )
    steering_effect: AblationEffect | None = Field(
        None,
        description="with `steer`: the unsteered prediction (baseline_top_k) and each of its top tokens' "
        "probability without the steers and with them (`top_k` is the steered prediction)",
    )


# ------------------------------------------------------------------ looking inside (analysis)


class AnalysisResponse(ModelResultResponse):
    ablate: list[AblatedHead] = Field(description="the heads ablated in this computation")


class DecomposeResponse(AnalysisResponse):
    pos: int = Field(description="the position decomposed (a negative request counts from the end)")
    target: TokenRef = Field(description="the token whose logit is attributed")
    labels: list[str] = Field(
        description="embed, pos_embed, L{layer}H{head} per head, L{layer} attn bias, L{layer} mlp, L{layer} mlp bias"
    )
    direct_logit: Vector = Field(description="each part's direct contribution to the target's logit")
    logit_bias: float = Field(description="ln_final.b · W_U[:, target] + b_U[target]: written by no part")
    scale: float = Field(description="the final layer norm's σ at pos, frozen from the run")
    logit: float = Field(description="the model's actual logit; = sum(direct_logit) + logit_bias")
    parts: Matrix = Field(description="[n_parts, d_model]: what each part wrote; they sum to the last resid_post")
    part_norms: Vector = Field(description="‖part‖ for each part")


class LogitLensResponse(AnalysisResponse):
    points: list[str] = Field(
        description="where the residual stream is read: each layer's resid_pre and "
        "resid_mid, then the last resid_post (the model's output)"
    )
    top_k: list[list[list[TopToken]]] = Field(description="[point][pos][k], most probable first")


class DetectorScores(ResponseModel):
    text: Matrix = Field(
        description="[n_layers, n_heads] on the request's text; null when no token qualifies (e.g. nothing repeats)"
    )
    random: Matrix = Field(description="[n_layers, n_heads] on the repeated random sequence")


class DetectorsResponse(AnalysisResponse):
    random_tokens: list[str] = Field(description="the repeated random sequence, as tokens")
    random_token_ids: list[int]
    detectors: dict[str, DetectorScores] = Field(description="previous_token, duplicate_token, induction")
    threshold: float
    flagged: list[FlaggedHead] = Field(description="heads scoring at least `threshold`, highest first")


class KVStepModel(ResponseModel):
    pos: int
    token: str
    id: int
    generated: bool = Field(description="false while reading the text, true for tokens the model chose")
    k_shape: list[int] = Field(
        description="each layer's K after this step: [n_key_value_heads, pos + 1, d_head] "
        "(n_key_value_heads = n_heads unless grouped-query attention shares them)"
    )
    v_shape: list[int] = Field(description="each layer's V after this step: [n_key_value_heads, pos + 1, d_head]")
    cache_bytes: int = Field(description="bytes of every layer's K and V")
    max_abs_diff: float = Field(description="max |cached logits − full recomputation's logits| at this position")
    top: TokenRef = Field(description="the most likely next token after this step")


class KVStepsResponse(AnalysisResponse):
    steps: list[KVStepModel]
    generated_text: str = Field(description="the tokens generated after the text, joined")
    dtype: str
    bytes_formula: str = Field(
        description="how cache_bytes grows: 2 (K and V) × n_layers × n_key_value_heads × "
        "d_head × bytes per number, per token (only the key/value heads are "
        "cached: under grouped-query attention fewer than the query heads)"
    )
    max_abs_diff: float = Field(description="the largest difference over all steps")


class ComparedSideModel(ResponseModel):
    tokens: list[str]
    config: TransformerConfig
    ablate: list[AblatedHead]
    pattern: Matrix = Field(description="[query_pos, key_pos] of the chosen layer and head")


class CompareResponse(ResponseModel):
    model: str
    layer: int
    head: int
    a: ComparedSideModel
    b: ComparedSideModel
    difference: Matrix | None = Field(
        description="b − a, [query_pos, key_pos]; null when the two have different numbers of tokens"
    )
    note: str | None = Field(description="why there is no difference, if there is none")


class RolloutResponse(AnalysisResponse):
    rollout: Matrices = Field(
        description="[n_layers, query_pos, key_pos]: how much each input token "
        "flows into each position after each layer; rows sum to 1"
    )


# ------------------------------------------------------------------ training runs


class TrainingRunLinks(ResponseModel):
    self: str
    events: str = Field(description="Server-Sent Events of the run's progress")
    checkpoint: str = Field(
        description="a zip of its weights, once it has any: a model's Hugging Face GPT-2 folder, an SAE's (recipe "
        "sae) SAELens folder"
    )
    page: str = Field(description="the run's page")


class TrainAccepted(ResponseModel):
    id: str
    status: Literal[STATUSES]  # type: ignore[valid-type]
    queued: bool = Field(description="true if this request queued it; false if the run existed already")
    queue_position: int | None = Field(description="1 = next to start; null unless queued")
    links: TrainingRunLinks


class ModelRunMetrics(ResponseModel):
    """A model's run (recipes induction, nasi-lemak, text): one entry per record."""

    model_config = ConfigDict(from_attributes=True, extra="forbid")

    step: list[int]
    loss: list[float | None] = Field(description="mean training loss since the previous record")
    val_loss: list[float] = Field(description="loss on the recipe's fixed held-out sequences")
    lr: list[float]
    icl_score: list[float] = Field(
        description="held-out loss late in the context minus early (negative: the context helps)"
    )
    target: list[float | None] = Field(
        description="the recipe's target probability: nasi-lemak's P('l' | 'nasi '), induction's on a repeated segment",
    )
    grad_norm: list[float | None]
    elapsed_s: list[float]


class SAERunMetrics(ResponseModel):
    """An SAE's run (recipe sae): one entry per record, SAELens's batch metrics."""

    model_config = ConfigDict(from_attributes=True, extra="forbid")

    step: list[int]
    loss: list[float | None] = Field(description="mean of its objective (SAELens's loss) since the previous record")
    lr: list[float]
    elapsed_s: list[float]
    mse: list[float] = Field(description="mean since the previous record of Σ_d (x̂ − x)², averaged over the batch")
    explained_variance: list[float] = Field(
        description="1 − Σ (x − x̂)² / Σ (x − mean x)² over a batch, mean since the previous record"
    )
    l0: list[float] = Field(description="features active per token, mean since the previous record")
    dead_fraction: list[float] = Field(
        description="the share of features that have not fired in the last 200 steps, at the record's step"
    )


class TrainingHeadScores(ResponseModel):
    step: list[int]
    previous_token: list[Matrix] = Field(
        description="[step][layer][head]: attention to the previous token on the probe"
    )
    induction: list[Matrix] = Field(
        description="[step][layer][head]: attention to what followed the current token last time"
    )


class Sample(ResponseModel):
    step: int
    text: str


class TrainingWorker(ResponseModel):
    host: str = Field(description="the machine's host name (a container's id in Docker)")
    pid: int = Field(description="the training process's id on that machine")


class TrainingRun(ResponseModel):
    id: str
    recipe: str
    config: dict[str, Any] = Field(description="the run's settings")
    status: Literal[STATUSES]  # type: ignore[valid-type]
    step: int
    steps: int
    loss: float | None = Field(description="the latest training loss")
    metrics: ModelRunMetrics | SAERunMetrics = Field(
        description="a model's run: its loss, held-out loss, in-context score, target probability and gradient norm; "
        "an SAE's run (recipe sae): its loss and SAELens's metrics. Each has its own fields only"
    )
    heads: TrainingHeadScores
    samples: list[Sample]
    snapshots: list[int] = Field(description="steps whose attention patterns GET .../patterns/{step} returns")
    model: str | None = Field(
        description="the model name /api/v1/run, /api/v1/analysis/* and the pages accept, once the run has weights"
    )
    sae: str | None = Field(
        None, description="recipe sae: the SAE's name in GET /api/v1/saes (and its download), once it has weights"
    )
    error: str | None
    queue_position: int | None
    resumable: bool = Field(description="a snapshot exists: POST the same request again to continue")
    worker: TrainingWorker | None = Field(None, description="who trains it while it runs (null otherwise)")
    created_at: float
    updated_at: float


class TrainingRunsList(ResponseModel):
    runs: list[TrainingRun]


class TrainingPatterns(ResponseModel):
    id: str
    step: int
    tokens: list[str] = Field(description="the probe's tokens (both axes)")
    patterns: Matrices = Field(description="[layer][head][query_pos][key_pos]")
