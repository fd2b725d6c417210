"""Request and response models of the circuits endpoints (app/api/routes/circuits.py): activation patching, one
score's QK circuit, the heads' composition, a head's OV circuit.

A patching request is a model request (app/api/requests.py `ModelRequest`: the model and its toggles) with
two texts, `clean` and `corrupted`, in place of `text`; the circuit requests are model requests whose text
is optional where the weights alone decide (composition; the OV circuit's sources default to the model's
own text's tokens). Limits are the settings' (app/settings.py), stated in the schema as every request's are.
The responses read the service's results (app/service/circuits.py) by their attributes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from app.api import requests
from app.api.responses import Matrix, ModelResultResponse, ResponseModel, Vector
from app.service import Knobs, RunSpec, knobs
from app.service.circuits import DIRECTIONS, METHODS, METRICS, TARGETS
from app.service.results import TokenRef

Target = Literal[TARGETS]  # type: ignore[valid-type]
Direction = Literal[DIRECTIONS]  # type: ignore[valid-type]
Metric = Literal[METRICS]  # type: ignore[valid-type]
Method = Literal[METHODS]  # type: ignore[valid-type]

TARGET_HELP = (
    "what to patch, one patched run per cell of the grid: resid_pre, resid_mid, resid_post (the residual "
    "stream at one layer and position: rows layers, columns positions), mlp_out (an MLP's output at one "
    "position), attn_head (a head's output at every position: rows layers, columns heads), attn_head_pos "
    "(a head's output at one position: rows L{layer}H{head}, columns positions), pattern (a head's whole "
    "attention pattern: rows layers, columns heads). Attention-only models have no resid_mid or mlp_out"
)
TOKEN_TEXT = Annotated[str, requests.TextUpTo("max_text_chars")]


# The model request's fields (the model and every knob) but its text, then the patching's own (Knobs first
# among the bases: app/api/requests.py ModelRequest says why).
class PatchingRequest(Knobs, requests.ModelChoice):
    """Activation patching: two texts of the same length, the answer and wrong tokens, what to patch."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "induction",
                    "clean": "wqnhibbaevqxnpzsqooyhvrawqnhibbaevqxnpzsqooyhvr",
                    "corrupted": "kwoatswecwaochmkkaadarnqwqnhibbaevqxnpzsqooyhvr",
                    "answer": "a",
                    "wrong": "q",
                    "target": "attn_head",
                    "direction": "noise",
                },
                {
                    "model": "toy",
                    "clean": "the cat sat on the mat",
                    "corrupted": "the dog sat on the mat",
                    "target": "resid_pre",
                },
            ]
        },
    )

    clean: TOKEN_TEXT = Field(
        json_schema_extra=requests.stating(
            "the text where the model does the thing (predicts the answer); at most {max_text_chars:,} "
            "characters and {max_tokens:,} tokens"
        )
    )
    corrupted: TOKEN_TEXT = Field(
        description="a text of as many tokens as `clean`, changed where it matters (422 naming both counts otherwise)"
    )
    answer: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description=(
            "the token the clean run should predict after its last token: one of the texts' tokens as the API "
            'shows them ("␣the" or " the"), or a text that is one token; null: the clean run\'s most likely '
            "next token"
        ),
    )
    wrong: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description=(
            "the token the metric compares the answer with; null: the corrupted run's most likely next token (the "
            "clean run's next best when that is the answer)"
        ),
    )
    target: Target = Field(
        "resid_pre",
        json_schema_extra=requests.stating(
            TARGET_HELP.replace("{", "{{").replace("}", "}}") + ". A sweep makes one patched run per cell: at most "
            "{patching_max_passes:,} on this server, counted before anything runs (422 naming how many were asked)"
        ),
    )
    direction: Direction = Field(
        "denoise",
        description=(
            "denoise: the corrupted run with one activation from the clean run (how much does it restore?); "
            "noise: the clean run with one activation from the corrupted run (how much does the behaviour "
            "depend on it?)"
        ),
    )
    metric: Metric = Field(
        "logit_diff",
        description=(
            "logit_diff: the answer's logit minus the wrong token's at the last position; prob: the answer's "
            "probability there"
        ),
    )
    frozen_attention: bool = Field(
        False,
        description=(
            "hold every attention pattern downstream of the patch at its value in the unpatched run: what is "
            "left is the effect through values and the direct path, not through later heads' queries and keys"
        ),
    )

    method: Method = Field(
        "exact",
        description=(
            "exact: one patched run per cell; attribution: attribution patching, every cell's first-order estimate "
            "(activation difference · the metric's gradient in the run patched into) from one forward and "
            "backward pass of both texts, in the same units, no patched runs (passes 0). Needs the model's "
            "gradients (422 saying so otherwise) and frozen_attention false"
        ),
    )

    def spec(self) -> RunSpec:
        """The clean run as the service's typed specification (the corrupted text is the same model's)."""
        return RunSpec(model=self.model, text=self.clean, **{name: getattr(self, name) for name in knobs.names()})


class QKCircuitRequest(requests.ModelRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "induction",
                    "text": "mntyadvygiwlmntyadvygiw",
                    "layer": 1,
                    "head": 0,
                    "query": 22,
                    "key": 11,
                },
                {"model": "toy", "text": "Ali makan nasi lemak", "layer": 1, "head": 2},
            ]
        },
    )

    layer: requests.LayerIndex = Field(description="counted from 0, below the model's n_layers")
    head: requests.HeadIndex = Field(description="the query head, counted from 0, below the model's n_heads")
    query: requests.Position = -1
    key: requests.Position | None = Field(
        None, description="the key position, at or before the query (causal); null: where this head's query looks most"
    )


class _WeightsRequest(requests.ModelRequest):
    # optional here (a model request's text is not): the weights alone decide, or the model's own text does
    text: TOKEN_TEXT | None = Field(  # type: ignore[assignment]
        None,
        description="null: the model's default text (a text sizes only a model whose shape follows it, the spec's)",
    )


class CompositionRequest(_WeightsRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"model": "induction"}]})


class OVCircuitRequest(_WeightsRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"model": "induction", "layer": 1, "head": 0, "top_k": 5, "text": "abc"}]},
    )

    text: TOKEN_TEXT | None = Field(
        None,
        json_schema_extra=requests.stating(
            "its distinct tokens are the sources (at most {ov_max_sources}); null: the model's default text"
        ),
    )
    layer: requests.LayerIndex = Field(description="counted from 0, below the model's n_layers")
    head: requests.HeadIndex = Field(description="counted from 0, below the model's n_heads")
    top_k: Annotated[int, requests.IntUpTo("max_top_k")] = Field(5, description="output tokens listed per source")


# ------------------------------------------------------------------ responses


class PatchingResponse(ModelResultResponse):
    # two texts' tokens, by text (a model result's are one text's)
    tokens: dict[str, list[str]] = Field(description="`clean` and `corrupted`, as the model reads them")  # type: ignore[assignment]
    token_ids: dict[str, list[int]]  # type: ignore[assignment]
    answer: TokenRef
    wrong: TokenRef
    target: Target
    direction: Direction
    metric: Metric
    frozen_attention: bool
    method: Method = Field(description="exact: patched runs; attribution: their first-order estimate")
    clean_metric: float = Field(description="the metric of the clean run")
    corrupted_metric: float = Field(description="the metric of the corrupted run")
    grid: Matrix = Field(
        description="[rows][columns], normalised: (metric − corrupted_metric) / (clean_metric − "
        "corrupted_metric), so 0 is the corrupted run and 1 the clean run"
    )
    raw_grid: Matrix = Field(description="[rows][columns], the metric of each patched run")
    rows: list[str] = Field(description="L{layer}, or L{layer}H{head} for attn_head_pos")
    columns: list[str] = Field(description='positions ("0", "1", ...) or heads ("H0", ...)')
    passes: int = Field(description="patched runs made (besides the clean and corrupted runs)")


class PairModel(ResponseModel):
    query_part: str
    key_part: str
    contribution: float


class QKCircuitResponse(ModelResultResponse):
    layer: int
    head: int
    query: int = Field(description="the query position")
    key: int = Field(description="the key position")
    query_token: str
    key_token: str
    score: float = Field(description="the model's pre-softmax score (scaled; hook_attn_scores)")
    weight: float = Field(description="the attention weight on this key after the softmax")
    top_key: int = Field(description="where this query looks most")
    query_parts: list[str] = Field(
        description="what wrote the residual stream at the query: embed, pos_embed, "
        "L{layer}H{head}, L{layer} attn bias, L{layer} mlp, L{layer} mlp "
        "bias, then bias (the norm's bias through W_Q and b_Q) if any"
    )
    key_parts: list[str] = Field(description="the same at the key (bias: through W_K and b_K)")
    contributions: Matrix = Field(
        description="[query part][key part]: each pair's term of the score, the norms' "
        "scales frozen from the run; they sum to `total`"
    )
    total: float = Field(description="the sum of the contributions: the score, up to rounding")
    bias_terms: dict[str, float] = Field(description="the terms involving a bias, summed by kind")
    query_scale: float = Field(description="the layer norm's σ at the query, frozen")
    key_scale: float
    top_pairs: list[PairModel] = Field(description="the five largest terms by size")


class CompositionResponse(ModelResultResponse):
    heads: list[str] = Field(description="L{layer}H{head}, every head in layer order (the rows and the columns)")
    q: Matrix = Field(
        description="[later head][earlier head]: Q-composition, ‖W_OV W_QK‖ / (‖W_OV‖ ‖W_QK‖); null "
        "where the column's head is not in an earlier layer"
    )
    k: Matrix = Field(description="K-composition, ‖W_OV W_QKᵀ‖ / (‖W_OV‖ ‖W_QK‖)")
    v: Matrix = Field(description="V-composition, ‖W_OV W_OV'‖ / (‖W_OV‖ ‖W_OV'‖)")
    baseline: float = Field(description="the mean score of random matrices of the same shapes")
    baseline_std: float


class OVLogit(ResponseModel):
    token: str
    id: int
    logit: float


class OVSourceModel(ResponseModel):
    token: str
    id: int
    self_rank: int = Field(
        description="where the source token itself ranks among the outputs it raises (0: first: the head copies it)"
    )
    top: list[OVLogit]


class OVCircuitResponse(ModelResultResponse):
    layer: int
    head: int
    copying_score: float = Field(
        description="Σλ / Σ|λ| over the eigenvalues of W_E W_V W_O W_U: 1 for a head that "
        "only copies, −1 for one that only suppresses"
    )
    eigenvalues: list[Vector] = Field(description="[real, imaginary] of each nonzero eigenvalue, largest |λ| first")
    sources: list[OVSourceModel] = Field(description="the text's distinct tokens, each with the outputs it raises most")
