"""Request and response models of POST /api/v1/generate (app/api/routes/generate.py): writing with a model.

The request is a model request (app/api/requests.py `ModelRequest`: the model, the text and its
toggles) whose `temperature` and `seed` are the sampler's: 0 means greedy, and the same seed and
settings give the same text. The attention temperature and the weights' seed that other model
requests call by those names keep the model's own values here. The response reads the service's
`Generation` (app/service/generation.py) by its attributes, as every response does.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from app.api import requests, responses
from app.api.responses import Matrices, ResponseModel
from app.api.steer_models import Steered
from app.service.generation import GenerateSettings
from app.service.spec import RunSpec

DEFAULT = GenerateSettings()  # the defaults, stated once (the page's too)

SAMPLING_HELP = (
    "Each new token is drawn from the model's next-token distribution after, in this order (as "
    "transformers applies them): repetition_penalty, temperature, top_k, top_p. Tokens are ranked by "
    "logit, ties by the lower id. The draw takes one uniform number u in [0, 1) from NumPy's "
    "Generator(PCG64(seed)) per token and lays the kept tokens end to end in ranked order, each as "
    "wide as its probability: the token under u × their total is drawn."
)


class GenerateRequest(Steered, requests.ModelRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "toy",
                    "text": "Ali makan nasi",
                    "max_new_tokens": 16,
                    "temperature": 0.8,
                    "top_k": 20,
                    "top_p": 0.9,
                    "seed": 1,
                },
                {
                    "model": "induction",
                    "text": "ali makan nasi lemak. ali makan",
                    "max_new_tokens": 12,
                    "temperature": 0,
                },
                {
                    "model": "python-docs",
                    "text": "The for statement",
                    "max_new_tokens": 40,
                    "top_p": 0.9,
                    "seed": 3,
                    "stop": ".",
                },
            ]
        },
    )

    max_new_tokens: Annotated[int, requests.IntUpTo("generate_max_new_tokens")] = Field(
        DEFAULT.max_new_tokens,
        json_schema_extra=requests.stating(
            "tokens to write, at most {generate_max_new_tokens:,}, and with the text at most the model's context "
            "(n_ctx); each step's attention rows count towards {generate_max_values:,} numbers per generation"
        ),
    )
    temperature: float = Field(
        DEFAULT.temperature,
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="the sampler's temperature: logits ÷ it before the softmax; 0 is greedy "
        "(the most likely token, nothing drawn), below 1 sharpens, above 1 "
        "flattens",
    )
    top_k: Annotated[int, requests.IntUpTo(lambda s: s.calc_max_vocab)] | None = Field(
        DEFAULT.top_k, description="keep only the k most likely tokens (at most the model's d_vocab); null: no top-k"
    )
    top_p: float = Field(
        DEFAULT.top_p,
        gt=0,
        le=1,
        description="nucleus: keep the smallest set of most likely tokens whose probability reaches "
        "top_p; 1 keeps every token",
    )
    repetition_penalty: float = Field(
        DEFAULT.repetition_penalty,
        gt=0,
        le=10,
        allow_inf_nan=False,
        description="a token already in the text: its logit ÷ this if positive, × if negative (1: none)",
    )
    seed: int = Field(
        DEFAULT.seed,
        ge=0,
        le=requests.MAX_SEED,
        description=f"the sampler's seed, 0 … {requests.MAX_SEED:,}: the same seed and settings give the same text",
    )
    stop: str | None = Field(
        DEFAULT.stop,
        min_length=1,
        max_length=64,
        description="end the generation once the new text contains this string (the model's "
        "end-of-text token always ends it)",
    )

    def spec(self) -> RunSpec:
        """What to run: the model, the text and the toggles; the sampler's temperature and seed are not the
        attention temperature and weights' seed of the RunSpec, which keep the model's values."""
        return super().spec().replace(temperature=None, seed=None, steering=self.steering())

    def generate_settings(self) -> GenerateSettings:
        return GenerateSettings(
            self.max_new_tokens, self.temperature, self.top_k, self.top_p, self.seed, self.stop, self.repetition_penalty
        )


Stage = Literal["model", "repetition_penalty", "temperature", "top_k", "top_p", "greedy"]


class CandidateModel(ResponseModel):
    token: str
    id: int
    rank: int = Field(description="0 = most likely, ties by the lower id (the ranking top-k and top-p cut)")
    prob_before: float = Field(description="the model's own probability")
    prob_after: float = Field(description="in the distribution the token was drawn from (0: cut away)")
    probs: list[float] = Field(description="after each of the step's `stages`, in order")
    kept: bool = Field(description="it could be drawn: the settings did not cut it away")
    cut_by: Stage | None = Field(description="the setting that cut it away")


class SinkHeadModel(ResponseModel):
    layer: int
    head: int
    weight: float = Field(description="its weight on the first token")


class StepModel(ResponseModel):
    index: int
    token: str
    id: int
    prob: float = Field(description="the model's own probability of the token")
    prob_after: float = Field(description="its probability in the distribution it was drawn from")
    u: float | None = Field(description="the uniform number its draw used; null when greedy")
    stages: list[Stage] = Field(
        description="the distributions `top[].probs` lists: the model's, then each setting that is on"
    )
    top: list[CandidateModel] = Field(
        description="the 20 most likely tokens before any was cut (the kept ones "
        "first, so the cut-off is a line), and the drawn token wherever "
        "it ranks"
    )
    kept_count: int = Field(description="tokens that could be drawn")
    kept_mass: float = Field(description="the model's probability of those tokens")
    attention: Matrices = Field(
        description="[layer][head][key]: the weights of the query that chose this token "
        "(the last token before it) over every token so far"
    )
    sink_heads: list[SinkHeadModel] = Field(
        description="heads whose weight on the first token is above sink_threshold: attention sinks"
    )
    cache_bytes: int = Field(description="the KV cache when it was chosen: keys and values of every earlier token")
    stop: bool = Field(description="this token ended the generation")


class GeneratedModel(ResponseModel):
    text: str = Field(description="the new text, decoded as the model's tokenizer decodes")
    ids: list[int]
    tokens: list[str] = Field(description="each new token as the pages show it (whitespace made visible)")


class SettingsModel(ResponseModel):
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float
    repetition_penalty: float
    stop: str | None


class GenerateResponse(responses.ModelResultResponse):
    seed: int = Field(description="the sampler's seed")
    settings: SettingsModel
    generated: GeneratedModel
    steps: list[StepModel] = Field(description="one per new token")
    finish_reason: Literal["length", "stop"] = Field(
        description="length: max_new_tokens were written; stop: the model's end-of-text token or the stop string"
    )
    stop_ids: list[int] = Field(description="the model's end-of-text token ids (none for the built-in toys)")
    sink_threshold: float
    kv_heads: list[int] = Field(
        description="the key/value head each query head reads (grouped-query attention "
        "shares one among n_heads / n_key_value_heads query heads)"
    )
