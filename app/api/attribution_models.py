"""Request and response models of token attribution (POST /api/v1/analysis/attribution, app/api/routes/analysis.py),
read from the service's result (app/service/attribution.py) by its attributes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from app.api import requests
from app.api.responses import ModelResultResponse, ResponseModel
from app.service import attribution
from app.service.results import TokenRef, TopToken

Method = Literal[attribution.METHODS]  # type: ignore[valid-type]
TokenGiven = Annotated[int, Field(ge=0, le=2**31 - 1)] | Annotated[str, Field(min_length=1, max_length=100)]
TOKEN_HELP = (
    "a token id (a JSON number), or the token's text (a JSON string: as the tokens are shown, whitespace as "
    "␣ ↵ ⇥ or itself, or any text that is one token of the model)"
)


class AttributionRequest(requests.ModelRequest):
    """A model request (the model, the text, the toggles) with the metric to attribute and the method."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "induction", "text": "Ali makan nasi lemak. Ali makan", "method": "integrated_gradients"},
                {
                    "model": "induction",
                    "text": "Ali makan nasi lemak. Ali makan",
                    "method": "direct_logit",
                    "position": -1,
                    "target": " ",
                    "contrast": "a",
                },
            ]
        },
    )

    position: requests.Position = -1
    target: TokenGiven | None = Field(
        None, description=TOKEN_HELP + "; null: the model's most likely token at `position`"
    )
    contrast: TokenGiven | None = Field(
        None, description=TOKEN_HELP + "; given, the metric is logit(target) − logit(contrast)"
    )
    method: Method = Field(
        "integrated_gradients",
        description="saliency: ‖∂metric/∂x_i‖₂ over d_model of the token embedding x_i (before positions are "
        "added); input_x_gradient: Σ_d x_i · ∂metric/∂x_i; integrated_gradients: the same along the straight "
        "path from the zero embedding, Gauss–Legendre (Captum's default); occlusion: metric − metric with token "
        "i's embedding set to zero; direct_logit: what each head moved from each source token into the metric "
        "through its OV circuit, with the final norm's scale frozen (no gradient needed)",
    )
    steps: Annotated[int, Field(ge=1, le=attribution.MAX_STEPS)] = Field(
        attribution.DEFAULT_STEPS,
        description=f"integrated gradients' steps, 1 … {attribution.MAX_STEPS} (each is a forward and backward "
        "pass, priced against the server's work limit)",
    )


class AttributionPartModel(ResponseModel):
    label: str
    value: float


class AttributionResponse(ModelResultResponse):
    method: str
    position: int = Field(description="the position whose prediction is attributed, counted from 0")
    target: TokenRef
    contrast: TokenRef | None
    metric: float = Field(description="logit(target) at the position, minus logit(contrast) when given")
    baseline_metric: float | None = Field(
        description="the metric with every token embedding set to zero (positions kept): integrated gradients' "
        "baseline; null for direct_logit"
    )
    scores: list[float] = Field(
        description="[pos]: each token's score by the method (0 after the position under the causal mask); "
        "direct_logit: the sum over every head of what it moved from that token"
    )
    steps: int | None = Field(description="integrated gradients' steps; null for the other methods")
    convergence_delta: float | None = Field(
        description="integrated gradients: sum(scores) − (metric − baseline_metric), the quadrature's error "
        "(completeness: 0 with enough steps); null for the other methods"
    )
    heads: list[list[list[float]]] | None = Field(
        description="direct_logit: [layer][head][source pos], what each head moved from each token into the metric"
    )
    parts: list[AttributionPartModel] | None = Field(
        description="direct_logit: every other part (embed, pos_embed, each layer's attention bias, MLP and MLP "
        "bias, the final norm's bias and b_U as 'final bias'); sum(heads) + sum(parts) == metric"
    )
    predictions: list[TopToken] = Field(description="the most likely tokens at the position, most likely first")
