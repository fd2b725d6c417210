"""The `steer` list of POST /api/v1/run and /api/v1/generate (app/api/requests.py `RunRequest`,
app/api/generation_models.py `GenerateRequest`): each push with its limits in the schema, and `frozen_attention`.

What the schema cannot know (the model's d_model, the text's length, the SAEs of this server, a feature's range)
the service checks (app/service/steering.py): 422 naming the steer and the reason.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from app.http.language import _
from app.service.spec import Steering, SteerSpec
from app.service.steering import MAX_COEFFICIENT
from app.settings import Limit, settings_in_effect

# A feature index's bound in the schema: 2^24 features, beyond the largest SAEs published (GemmaScope's 1M); the
# SAE's own d_sae is checked by the service (422 naming its range).
MAX_FEATURE_INDEX = 2**24 - 1
# A vector's numbers: finite, and bounded as every request size is (a residual stream's entries are tens at most).
MAX_VECTOR_VALUE = 1e6
VectorValue = Annotated[float, Field(ge=-MAX_VECTOR_VALUE, le=MAX_VECTOR_VALUE, allow_inf_nan=False)]
TokenPosition = Annotated[int, Limit("ge", lambda s: -s.max_tokens), Limit("le", lambda s: s.max_tokens - 1)]

STEER_HELP = (
    "pushes applied to the residual stream, in order (core/steering.py): add coefficient × the vector (or the "
    "feature's decoder row) at the positions; clamp sets the feature's activation (the stream becomes the SAE's "
    "reconstruction with that activation, plus its error), or for a vector the stream's component along it, to "
    "coefficient units of it. At most {max_steers}."
)


class FeatureRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sae: str = Field(min_length=1, max_length=200, description="an SAE's name, from GET /api/v1/saes")
    index: int = Field(ge=0, le=MAX_FEATURE_INDEX, description="the feature, below the SAE's d_sae")


class SteerItem(BaseModel):
    """One push: a vector or an SAE's feature, at a residual-stream hook."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "hook": "blocks.1.hook_resid_pre",
                    "feature": {"sae": "induction-resid0", "index": 3},
                    "coefficient": 8,
                },
                {"hook": "blocks.0.hook_resid_post", "vector": [0.1] * 4, "coefficient": -2, "positions": [-1]},
            ]
        },
    )

    hook: str = Field(
        max_length=200,
        description="blocks.<layer>.hook_resid_pre, hook_resid_mid or hook_resid_post of the model; a feature's "
        "must be its SAE's hook",
        examples=["blocks.1.hook_resid_pre"],
    )
    vector: Annotated[list[VectorValue], Limit("max_length", "calc_max_width")] | None = Field(
        None, description="the direction, d_model numbers (POST /api/v1/analysis/steering-vector makes one)"
    )
    feature: FeatureRef | None = Field(None, description="an SAE's feature: its decoder row is the direction")
    coefficient: float = Field(
        ge=-MAX_COEFFICIENT,
        le=MAX_COEFFICIENT,
        allow_inf_nan=False,
        description="add: how many times the direction; clamp: the activation (or component) to set",
    )
    mode: Literal["add", "clamp"] = "add"
    positions: Annotated[list[TokenPosition], Limit("max_length", "max_tokens")] | None = Field(
        None,
        description="token positions of the text, from 0 (negative: from the end); null: every position (in a "
        "generation, each new token's too; given positions stay on the text's tokens)",
    )

    @model_validator(mode="after")
    def _one_direction(self) -> SteerItem:
        if (self.vector is None) == (self.feature is None):
            raise PydanticCustomError(
                "steer_direction", _("give either a vector or a feature (its SAE and index), not both or neither")
            )
        return self

    def spec(self) -> SteerSpec:
        return SteerSpec(
            self.hook,
            self.coefficient,
            self.mode,
            None if self.vector is None else tuple(self.vector),
            None if self.feature is None else self.feature.sae,
            None if self.feature is None else self.feature.index,
            None if self.positions is None else tuple(self.positions),
        )


def _steer_help(schema: dict) -> None:
    schema["description"] = STEER_HELP.format_map(vars(settings_in_effect()))


class Steered(BaseModel):
    """The steering fields a run or generation request adds."""

    steer: Annotated[list[SteerItem], Limit("max_length", "max_steers")] = Field(
        default_factory=list, json_schema_extra=_steer_help
    )
    frozen_attention: bool = Field(
        False,
        description="with steers: every attention pattern, from the first layer that reads a steered stream on, is "
        "the unsteered run's over the same tokens (in a generation, at each step), so the steer acts through the "
        "values and the residual path only",
    )

    def steering(self) -> Steering | None:
        if not self.steer:
            return None
        return Steering(tuple(s.spec() for s in self.steer), self.frozen_attention)
