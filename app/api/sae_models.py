"""Request and response models of the SAE endpoints (app/api/routes/saes.py): the SAEs this server has, a text's
features, a feature's dashboard, and a steering vector from two sets of texts. Read from the service's results
(app/service/features.py, app/service/steering.py) by their attributes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from app.api import requests
from app.api.responses import ModelResultResponse, ResponseModel, Vector
from app.api.steer_models import MAX_FEATURE_INDEX
from app.service import Knobs, RunSpec, knobs

NAME_HELP = "an SAE's name, from GET /api/v1/saes"
__all__ = ["MAX_FEATURE_INDEX"]  # the feature index's bound, stated once in steer_models.py


class LabelledFeatureModel(ResponseModel):
    index: int
    label: str


class SAEModel(ResponseModel):
    name: str = Field(description="the SAE's folder in EXPLORER_SAES_DIR")
    model: str | None = Field(description="the model it reads (its cfg.json's metadata.model_name)")
    hook: str | None = Field(description="the hook it reads (metadata.hook_name)")
    architecture: str | None = Field(description="standard, topk or jumprelu")
    d_in: int | None
    d_sae: int | None = Field(description="its number of features")
    labelled_features: list[LabelledFeatureModel] = Field(description="the features its labels.json names")
    problem: str | None = Field(None, description="why it cannot be used; absent when it can")


class SAEsResponse(ResponseModel):
    saes: list[SAEModel]


# the schema's example: the SAE that ships with the app (core/trained/saes/, scripts/train_shipped_sae.py)
EXAMPLE_SAE = "python-docs-induction-resid0"


class FeaturesRequest(requests.ModelRequest):
    """A model request (the model, the text, the toggles) with the SAE to read its hook through."""

    # The example names the shipped SAE; the install test (tests/deploy/test_install.py) sends it to the
    # installed wheel, which carries that SAE.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "python-docs-induction",
                    "text": 'Call "os.path.join(a, b)" to join two paths.',
                    "sae": EXAMPLE_SAE,
                    "top_k": 5,
                }
            ]
        },
    )

    sae: str = Field(min_length=1, max_length=200, description=NAME_HELP + "; it must read this model")
    top_k: Annotated[int, requests.IntUpTo("max_top_k")] = Field(
        10, json_schema_extra=requests.stating("features listed per token, at most {max_top_k}")
    )


class FeatureActivationModel(ResponseModel):
    index: int
    activation: float


# A text's features go out as the service built them (1,024 tokens of 10 features: 10,240 objects, which pydantic
# validated and dumped in about 30 ms of the endpoint's budget); their JSON schema is stated here.
FeatureLists = Annotated[
    Any,
    WithJsonSchema({"type": "array", "items": {"type": "array", "items": FeatureActivationModel.model_json_schema()}}),
]


class FeaturesResponse(ModelResultResponse):
    sae: str
    hook: str
    d_sae: int
    features: FeatureLists = Field(description="[pos]: the token's non-zero features, largest first, at most top_k")
    labels: dict[int, str] = Field(description="the labels of the SAE's labelled features, by index")


class ExampleModel(ResponseModel):
    tokens: list[str]
    activations: list[float] = Field(description="the feature's activation at each token")
    max_position: int = Field(description="where in `tokens` the feature is largest")


class LogitTokenModel(ResponseModel):
    token: str
    id: int
    value: float


class HistogramModel(ResponseModel):
    edges: list[float] = Field(description="bin edges, 0 to the feature's largest activation")
    counts: list[int] = Field(description="non-zero activations in each bin")


class LogitEffectModel(ResponseModel):
    positive: list[LogitTokenModel] = Field(description="the tokens W_dec[i] · W_U raises most, largest first")
    negative: list[LogitTokenModel] = Field(description="the tokens it lowers most, most negative first")


class FeatureDashboardResponse(ResponseModel):
    sae: str
    model: str
    hook: str
    index: int
    d_sae: int
    label: str | None
    density: float = Field(description="fraction of the scanned tokens where the feature is non-zero")
    max_activation: float
    tokens_scanned: int = Field(description="tokens of the model's own text the scan read")
    top_examples: list[ExampleModel] = Field(description="contexts of its largest activations, largest first")
    histogram: HistogramModel
    logit_effect: LogitEffectModel = Field(
        description="W_dec[i] · W_U (empty when the SAE's vectors are not the residual stream's width)"
    )


# ------------------------------------------------------------------ a steering vector (difference of means)

SteerText = Annotated[str, requests.TextUpTo("max_text_chars")]


class SteeringVectorRequest(Knobs, requests.ModelChoice):
    """The model (and its toggles), a residual-stream hook, and two sets of texts."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "induction",
                    "hook": "blocks.1.hook_resid_pre",
                    "texts_a": ["I love this. It is wonderful", "What a great day"],
                    "texts_b": ["I hate this. It is awful", "What a terrible day"],
                }
            ]
        },
    )

    hook: str = Field(
        max_length=200,
        description="blocks.<layer>.hook_resid_pre, hook_resid_mid or hook_resid_post of the model",
        examples=["blocks.1.hook_resid_pre"],
    )
    texts_a: Annotated[list[SteerText], requests.Limit("max_length", "steer_max_texts")] = Field(
        min_length=1,
        json_schema_extra=requests.stating(
            "1 to {steer_max_texts} texts, each at most {max_text_chars:,} characters and {max_tokens:,} tokens: "
            "the side the vector points to"
        ),
    )
    texts_b: Annotated[list[SteerText], requests.Limit("max_length", "steer_max_texts")] = Field(
        min_length=1,
        json_schema_extra=requests.stating(
            "1 to {steer_max_texts} texts, each at most {max_text_chars:,} characters and {max_tokens:,} tokens: "
            "the side it points away from"
        ),
    )

    def spec(self) -> RunSpec:
        """The model and its toggles (the text: each of the texts in turn)."""
        return RunSpec(model=self.model, text=self.texts_a[0], **{name: getattr(self, name) for name in knobs.names()})


class SteeringVectorResponse(ResponseModel):
    model: str
    hook: str
    vector: Vector = Field(description="[d_model]: the mean over every token of texts_a minus the same over texts_b")
    norm: float = Field(description="the vector's length (L2)")
    tokens_a: int = Field(description="tokens averaged over texts_a")
    tokens_b: int = Field(description="tokens averaged over texts_b")
