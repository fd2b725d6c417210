"""Request models of the REST API v1 (also what validates a page's state), with their limits and examples.

Every limit comes from app/settings.py and every default from the core function it feeds
(core.lessons' signatures), so each is written once. The run's toggles are the fields of the class Knobs
(app/models/knobs.py): ModelRequest inherits them, CompareSide and HooksQuery take some by their types; the
training settings are core/recipes.py's TrainSettings fields (TrainRequest's). Request models forbid
unknown fields; a model request becomes the service's typed RunSpec with `.spec()`.

A limit that is a setting (`Limit("le", "max_heads")`, `Annotated[str, TextUpTo("max_text_chars")]`, a description
that states one: `stating("at most {max_tokens:,} tokens")`) is read from the settings in effect
(app/settings.py `settings_in_effect`): the injected settings of the request being validated
(create_app(settings), a dependency override: app/deps.py `apply_settings`), or those the OpenAPI is
written for (app/main.py). What a server refuses and what its OpenAPI states are the same number.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import annotated_types
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from app.api.steer_models import Steered
from app.http.language import _
from app.service import AblatedHead, Knobs, RunSpec, knobs
from app.service.calculators import Sizes
from app.settings import Limit, Settings, setting, settings_in_effect
from core import DTYPE_BYTES, POSITION_SCHEMES, PRESETS, TransformerConfig, lessons, recipes, sae_run
from core.config import NORMALIZATION_TYPES

MAX_SEED = knobs.MAX_SEED


# ------------------------------------------------------------------ limits that are settings (Limit: app/settings.py)


def upper_bound(model: type[BaseModel], name: str) -> int | float | None:
    """A request field's greatest value in effect (its `le`: fixed, or a setting's), as its schema states it."""
    metadata = model.model_fields[name].metadata
    # IntUpTo and TextUpTo are groups (pydantic keeps them whole here): their parts
    parts = [part for m in metadata for part in (m if isinstance(m, annotated_types.GroupedMetadata) else (m,))]
    for part in parts:
        if isinstance(part, Limit) and part.kind == "le":
            return setting(part.of)
        if isinstance(part, annotated_types.Le) and isinstance(part.le, (int, float)):
            return part.le
    return None


def stating(template: str) -> Callable[[dict], None]:
    """A description that states settings ("at most {max_tokens:,} tokens"), written with those in effect
    (a field's `json_schema_extra`)."""

    def describe(schema: dict) -> None:
        schema["description"] = template.format_map(vars(settings_in_effect()))

    return describe


@dataclass(frozen=True)
class IntUpTo(annotated_types.GroupedMetadata):
    """An integer from `low` to a setting: `Annotated[int, IntUpTo("max_tokens")]`."""

    limit: str | Callable[[Settings], int]
    low: int = 1

    def __iter__(self) -> Iterator[object]:
        yield annotated_types.Ge(self.low)
        yield Limit("le", self.limit)


def default(fn, name: str) -> Any:
    """The default of `name` in core function `fn`: the spec's value, stated once, in core."""
    return inspect.signature(fn).parameters[name].default


def _non_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("text_empty", _("the text is empty or only spaces: type at least one word"))
    if re.search("[\ud800-\udfff]", text):
        raise PydanticCustomError(
            "text_surrogate", _("the text contains an unpaired UTF-16 surrogate, which is not a character: remove it")
        )
    return text


@dataclass(frozen=True)
class TextUpTo(annotated_types.GroupedMetadata):
    """A text that is not blank, of at most a setting's characters: `Annotated[str, TextUpTo("max_text_chars")]`."""

    limit: str | Callable[[Settings], int]

    def __iter__(self) -> Iterator[object]:
        yield annotated_types.MinLen(1)
        yield Limit("max_length", self.limit)
        yield AfterValidator(_non_blank)


NonBlank = Annotated[str, AfterValidator(_non_blank)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, description=f"random seed, 0 … {MAX_SEED:,}")]
# Choices read from core's tables when the module is imported: pydantic checks them and the schema lists
# them; a type checker cannot read a Literal built from a tuple (each is Any to it).
PRESET_NAMES, DTYPE_NAMES = tuple(PRESETS), tuple(DTYPE_BYTES)
PresetName = Literal[PRESET_NAMES]  # type: ignore[valid-type]
NormalizationType = Literal[NORMALIZATION_TYPES]  # type: ignore[valid-type]
DType = Literal[DTYPE_NAMES]  # type: ignore[valid-type]
PositionScheme = Literal[POSITION_SCHEMES]  # type: ignore[valid-type]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _int_list(value: str, name: str, low: int, high: int) -> tuple[int, ...]:
    items = tuple(int(x) for x in value.split(","))
    if len(items) > (most := setting("max_dims")):
        raise PydanticCustomError(
            "too_long",
            _("{{n}} {name} given, more than the limit of {most}").format(name=name, most=most),
            {"n": len(items)},
        )
    bad = [x for x in items if not low <= x <= high]
    if bad:
        raise PydanticCustomError(
            "out_of_range",
            _("{name} must each lie in {low} … {high:,}; got {{bad}}").format(name=name, low=low, high=high),
            {"bad": bad[0]},
        )
    return items


# ------------------------------------------------------------------ lesson queries

LESSON_TEXT = stating("words split on spaces, at most {max_tokens:,} words and {max_text_chars:,} characters")


class AttentionQuery(Request):
    text: Annotated[str, TextUpTo("max_text_chars")] = Field(
        lessons.DEFAULT_TEXT, json_schema_extra=LESSON_TEXT, examples=["the cat sat down"]
    )
    seed: Seed = default(lessons.attention, "seed")
    d_model: Annotated[int, IntUpTo("max_d_model")] = Field(
        default(lessons.attention, "d_model"), description="width of each token's embedding"
    )
    d_k: Annotated[int, IntUpTo("max_d_model")] = Field(
        default(lessons.attention, "d_k"), description="width of queries, keys and values"
    )
    causal: bool = Field(default(lessons.attention, "causal"), description="forbid attending to later tokens")
    scale: bool = Field(default(lessons.attention, "scale"), description="divide the scores by √d_k")


class ScalingQuery(Request):
    dims: str = Field(
        ",".join(map(str, default(lessons.scaling, "dims"))),
        pattern=r"^\d{1,9}(,\d{1,9})*$",
        json_schema_extra=stating("comma-separated widths d, at most {max_dims}, each 1 … {calc_max_width:,}"),
        examples=["4,64,512"],
    )
    n_queries: Annotated[int, IntUpTo("max_queries")] = default(lessons.scaling, "n_queries")
    n_keys: Annotated[int, IntUpTo("max_tokens")] = default(lessons.scaling, "n_keys")
    seed: Seed = default(lessons.scaling, "seed")

    @field_validator("dims")
    @classmethod
    def _dims(cls, v: str) -> str:
        _int_list(v, "dims", 1, setting("calc_max_width"))
        return v

    @property
    def dim_list(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.dims.split(","))


class MultiheadQuery(Request):
    text: Annotated[str, TextUpTo("max_text_chars")] = Field(lessons.DEFAULT_TEXT, json_schema_extra=LESSON_TEXT)
    seed: Seed = default(lessons.multihead, "seed")
    d_model: Annotated[int, IntUpTo("max_d_model")] = Field(
        default(lessons.multihead, "d_model"), description="width; must be a multiple of n_heads"
    )
    n_heads: Annotated[int, IntUpTo("max_heads")] = default(lessons.multihead, "n_heads")
    causal: bool = Field(default(lessons.multihead, "causal"), description="forbid attending to later tokens")
    scale: bool = Field(default(lessons.multihead, "scale"), description="divide the scores by √d_head")


class PositionsQuery(Request):
    n_pos: Annotated[int, IntUpTo("max_tokens")] = Field(default(lessons.positions, "n_pos"), description="positions")
    d: Annotated[int, IntUpTo("max_d_model", low=2)] = Field(
        default(lessons.positions, "d"), description="width (even)"
    )
    pairs: str | None = Field(
        None,
        pattern=r"^\d{1,7}:\d{1,7}(,\d{1,7}:\d{1,7})*$",
        json_schema_extra=stating(
            "comma-separated i:j position pairs whose dot products to "
            "show, at most {max_dims}; default: the spec's pairs that "
            "fit in n_pos"
        ),
        examples=["10:10,10:11,30:35"],
    )

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: str | None) -> str | None:
        if v is not None and len(v.split(",")) > (most := setting("max_dims")):
            raise PydanticCustomError("too_long", _("more than {most} pairs given").format(most=most))
        return v

    @property
    def pair_list(self) -> tuple[tuple[int, int], ...] | None:
        if self.pairs is None:
            return None
        return tuple((int(i), int(j)) for i, j in (p.split(":") for p in self.pairs.split(",")))


class ForwardQuery(Request):
    text: Annotated[str, TextUpTo("max_text_chars")] = Field(
        default(lessons.forward, "text"), description="corpus whose sorted distinct characters are the vocabulary"
    )
    prompt: Annotated[str, TextUpTo("max_tokens")] = Field(
        default(lessons.forward, "prompt"),
        json_schema_extra=stating("characters to run (one token each, at most {max_tokens:,}), all from the text"),
    )
    seed: Seed = default(lessons.forward, "seed")
    d_model: Annotated[int, IntUpTo("max_d_model")] = default(lessons.forward, "d_model")
    n_heads: Annotated[int, IntUpTo("max_heads")] = default(lessons.forward, "n_heads")
    d_mlp: Annotated[int, IntUpTo("max_d_mlp")] = default(lessons.forward, "d_mlp")


# ------------------------------------------------------------------ calculator queries

PRESET_DESCRIPTION = (
    "start from this configuration (default: toy); a field given replaces the preset's. "
    "toy and gpt2-*: GPT-2's design; smollm2-135m, tinyllama-1.1b, qwen2.5-0.5b, qwen3-0.6b: "
    "Llama's (RMS norm, gated MLP, rotary, grouped-query attention); pythia-70m: GPT-NeoX; "
    "tinystories-33m: GPT-Neo"
)


def shape_fields(query: BaseModel) -> Sizes:
    """A calculator query's fields that are TransformerConfig fields (None: the preset's)."""
    return {k: getattr(query, k) for k in type(query).model_fields if k in SHAPE_FIELDS}


class SizesQuery(Request):
    """The sizes the spec's closed formula takes, replacing a preset's. Fields left null keep the preset's."""

    preset: PresetName | None = Field(None, description=PRESET_DESCRIPTION)
    d_vocab: Annotated[int, IntUpTo("calc_max_vocab")] | None = None
    n_ctx: Annotated[int, IntUpTo("calc_max_ctx")] | None = None
    d_model: Annotated[int, IntUpTo("calc_max_width")] | None = None
    n_layers: Annotated[int, IntUpTo("calc_max_layers")] | None = None
    d_mlp: Annotated[int, IntUpTo("calc_max_width")] | None = Field(None, description="default 4 × d_model")
    tied_embeddings: bool | None = Field(None, description="the unembedding reuses the token table (GPT-2)")

    def sizes(self) -> Sizes:
        """The shape fields of this query (None: the preset's)."""
        return shape_fields(self)


class ParamsQuery(SizesQuery):
    """The shape of a model: a preset, with any of these replacing its own. Fields left null keep the preset's."""

    n_heads: Annotated[int, IntUpTo("calc_max_width")] | None = Field(
        None, description="query heads; must divide d_model unless d_head is given"
    )
    n_key_value_heads: Annotated[int, IntUpTo("calc_max_width")] | None = Field(
        None,
        description="key/value heads, each shared by n_heads / n_key_value_heads query heads (grouped-query "
        "attention; 1: multi-query); must divide n_heads. Default: one per query head, or the preset's",
    )
    d_head: Annotated[int, IntUpTo("calc_max_width")] | None = Field(
        None, description="width of each head (default d_model / n_heads; Qwen3's is wider)"
    )
    gated_mlp: bool | None = Field(None, description="a gated (SwiGLU) MLP: a third matrix W_gate beside W_in, W_out")
    normalization_type: NormalizationType | None = Field(
        None,
        description="LN: layer norm, gain and bias; RMS: RMS norm, gain only (Llama); LNPre, RMSPre: no parameters",
    )
    positional_embedding_type: PositionScheme | None = Field(
        None, description="learned positions add an n_ctx × d_model table; the others have no parameters"
    )
    bias: bool | None = Field(None, description="biases on every linear map (GPT-2: yes; Llama: no)")
    qkv_bias: bool | None = Field(None, description="biases of Q, K and V only (Qwen2: yes); default as bias")
    use_qk_norm: bool | None = Field(None, description="an RMS gain on every head's queries and keys (Qwen3)")


class KVCacheQuery(Request):
    """A model's KV cache: the preset's shape, with these replacing its own, at a sequence length, batch and dtype."""

    preset: PresetName | None = Field(None, description=PRESET_DESCRIPTION)
    n_layers: Annotated[int, IntUpTo("calc_max_layers")] | None = None
    d_model: Annotated[int, IntUpTo("calc_max_width")] | None = None
    n_heads: Annotated[int, IntUpTo("calc_max_width")] | None = Field(None, description="must divide d_model")
    n_key_value_heads: Annotated[int, IntUpTo("calc_max_width")] | None = Field(
        None,
        description="heads whose keys and values are cached (grouped-query attention shares each among "
        "n_heads / n_key_value_heads query heads); must divide n_heads",
    )
    d_head: Annotated[int, IntUpTo("calc_max_width")] | None = Field(None, description="default d_model / n_heads")
    seq_len: Annotated[int, IntUpTo("calc_max_ctx")] | None = Field(None, description="cached tokens (default: n_ctx)")
    batch: Annotated[int, IntUpTo("calc_max_batch")] = 1
    dtype: DType = Field("float32", description="element type of the cache")

    def sizes(self) -> Sizes:
        """The shape fields of this query (None: the preset's)."""
        return shape_fields(self)


# The calculators' fields that are TransformerConfig fields: the model's shape (the rest say which
# preset, and how much to cache in which dtype).
SHAPE_FIELDS = frozenset(TransformerConfig.__dataclass_fields__)


# What decides a model's activation names: the model, and the knobs that add or remove hooks (its blocks,
# its position scheme).
class HooksQuery(Request):
    model: str = Field("toy", max_length=200, description="a name from GET /api/v1/models")
    n_layers: knobs.NLayers = None
    positional_embedding_type: knobs.PositionalEmbeddingType = None


# ------------------------------------------------------------------ run

# A layer or head index must be below the model's own n_layers and n_heads (the service checks it
# per model). A pretrained model's depth is its checkpoint's (Qwen3-0.6B: 28 layers; TinyLlama: 32
# heads), beyond the toys' max_layers and max_heads, so the schema bounds them as the calculators do.
LayerIndex = Annotated[int, IntUpTo(lambda s: s.calc_max_layers - 1, low=0)]
HeadIndex = Annotated[int, IntUpTo(lambda s: s.calc_max_width - 1, low=0)]


class HeadAblation(Request):
    layer: LayerIndex = Field(description="the head's layer, counted from 0, below the model's n_layers")
    head: HeadIndex = Field(description="the query head within its layer, counted from 0, below n_heads")
    method: Literal["zero", "mean"] = Field(
        "zero",
        description="zero: the head writes nothing; mean: it writes its mean output over the text's "
        "positions (what it says whatever the token)",
    )


COST = (
    "The cost of a request is checked before anything is computed: at most {max_work:,} multiply-adds "
    "(random draws included) on a toy, whose weights are drawn for the request; at most "
    "{max_pretrained_work:,} on a pretrained model, whose weights are loaded once (one 128-token pass of a "
    "0.5B-parameter model is about 6.4 × 10¹⁰); and no array of more than {max_elements:,} numbers (a toy's "
    "drawn weights included, a pretrained model's loaded ones not). Beyond a limit: 422 saying what to reduce."
)


# The model a request runs: every model request's first field.
class ModelChoice(Request):
    model: str = Field("toy", max_length=200, json_schema_extra=stating("a name from GET /api/v1/models. " + COST))


class _ModelAndText(ModelChoice):
    text: Annotated[str, TextUpTo("max_text_chars")] = Field(
        json_schema_extra=stating("the input; at most {max_text_chars:,} characters and {max_tokens:,} tokens")
    )


# Knobs first among the bases: pydantic orders fields base-most first, so the knobs follow the model and the
# text (Knobs has no __init__, repr or equality to take over from the pydantic model's).
class ModelRequest(Knobs, _ModelAndText):
    """A model, a text and the toggles: what every model endpoint (run and the analyses) reads."""

    def spec(self) -> RunSpec:
        """What to run, as the service's typed specification."""
        ablate = tuple(AblatedHead(a.layer, a.head, a.method) for a in getattr(self, "ablate", ()))
        return RunSpec(
            model=self.model, text=self.text, ablate=ablate, **{name: getattr(self, name) for name in knobs.names()}
        )


class AblatingRequest(ModelRequest):
    ablate: Annotated[list[HeadAblation], Limit("max_length", "max_ablations")] = Field(
        default_factory=list,
        json_schema_extra=stating(
            "heads whose output is replaced before W_O (at most {max_ablations}, each head "
            "once); every later activation and the prediction change, earlier ones do not"
        ),
    )


class RunRequest(Steered, AblatingRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "toy", "text": "Ali makan nasi lemak", "hooks": ["blocks.0.attn.hook_pattern"], "top_k": 5},
                {"model": "spec-forward", "text": "nasi ", "top_k": 9},
                {
                    "model": "toy",
                    "text": "the cat sat",
                    "causal": False,
                    "n_heads": 2,
                    "n_layers": 1,
                    "positional_embedding_type": "rotary",
                    "seed": 3,
                    "hooks": ["blocks.0.attn.hook_attn_scores"],
                },
                {
                    "model": "toy",
                    "text": "the cat sat",
                    "hooks": ["blocks.1.attn.hook_pattern"],
                    "ablate": [{"layer": 0, "head": 2, "method": "zero"}],
                },
            ]
        },
    )

    hooks: Annotated[list[Annotated[str, Field(max_length=200)]], Limit("max_length", "max_hooks")] = Field(
        default_factory=list,
        json_schema_extra=stating(
            "activation names to return (GET /api/v1/hooks lists them), at most {max_hooks}, "
            "holding at most {max_hook_values:,} numbers in all"
        ),
    )
    top_k: Annotated[int, IntUpTo("max_top_k", low=0)] = Field(
        5, description="how many next-token predictions to return"
    )

    def spec(self) -> RunSpec:
        return super().spec().replace(steering=self.steering())


# ------------------------------------------------------------------ looking inside (analysis)

Position = Annotated[
    int,
    Limit("ge", lambda s: -s.max_tokens),
    Limit("le", lambda s: s.max_tokens - 1),
    Field(description="a token position, from 0; negative counts from the end (-1 = last)"),
]


class DecomposeRequest(AblatingRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "toy", "text": "Ali makan nasi lemak"},
                {"model": "spec-forward", "text": "nasi ", "pos": -1, "target": 2},
            ]
        },
    )

    pos: Position = -1
    target: Annotated[int, IntUpTo(lambda s: s.calc_max_vocab - 1, low=0)] | None = Field(
        None,
        description="the token id whose logit to attribute (below the model's d_vocab); "
        "null: the model's most likely next token at `pos`",
    )


class LogitLensRequest(AblatingRequest):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"model": "toy", "text": "Ali makan nasi lemak", "top_k": 3}]}
    )

    top_k: Annotated[int, IntUpTo("max_top_k")] = Field(5, description="tokens kept per layer and position")


class DetectorsRequest(AblatingRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "toy", "text": "the cat sat on the mat. the cat sat"},
                {
                    "model": "all-MiniLM-L6-v2",
                    "text": "The cat sat on the mat. The cat sat on the mat.",
                    "random_length": 20,
                },
            ]
        },
    )

    random_length: Annotated[int, IntUpTo(lambda s: s.max_tokens // 2, low=2)] = Field(
        20, description="length of the random sequence, which is then repeated once"
    )
    random_seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the random sequence")
    threshold: float = Field(0.4, ge=0, le=1, description="a head is flagged when its score reaches this")


class KVStepsRequest(ModelRequest):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"model": "toy", "text": "Ali makan", "n_new": 8}]}
    )

    n_new: Annotated[int, IntUpTo("max_new_tokens", low=0)] = Field(
        8, description="tokens to generate greedily after the text"
    )


def _without_knob_help(schema: dict[str, Any]) -> None:
    """The knobs' descriptions say what null means for a run (the model's default); on the second side null
    keeps the first side's value (the model's description says so), so they are left out there."""
    for name in knobs.names():
        schema["properties"].get(name, {}).pop("description", None)


# The second side may change the text, every knob that keeps the model's shape (the same weights, or the
# same shape drawn from another seed: its heads compare one to one) and the ablations. tests/api/test_knobs.py
# checks that these are the knobs that keep the shape.
class CompareSide(Request):
    """What the second side changes; a field left null keeps the first side's value."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_without_knob_help)

    text: Annotated[NonBlank | None, Limit("max_length", "max_text_chars")] = Field(None, min_length=1)
    causal: knobs.Causal = None
    scale: knobs.Scale = None
    temperature: knobs.Temperature = None
    positional_embedding_type: knobs.PositionalEmbeddingType = None
    seed: knobs.Seed = None
    ablate: Annotated[list[HeadAblation], Limit("max_length", "max_ablations")] | None = Field(
        None, description="replaces the first side's list (use [] for none)"
    )

    def changes(self) -> dict[str, object]:
        """The fields this side changes, as RunSpec fields (ablations as the service's type)."""
        out = {k: v for k, v in self.model_dump(exclude={"ablate"}).items() if v is not None}
        if self.ablate is not None:
            out["ablate"] = tuple(AblatedHead(a.layer, a.head, a.method) for a in self.ablate)
        return out


class CompareRequest(AblatingRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "toy", "text": "Ali makan nasi", "other": {"causal": False}, "layer": 1, "head": 0},
                {"model": "toy", "text": "the cat sat", "other": {"text": "the dog sat"}},
                {"model": "toy", "text": "the cat sat", "layer": 1, "other": {"ablate": [{"layer": 0, "head": 1}]}},
            ]
        },
    )

    other: CompareSide = Field(description="the second side: the first side's settings with these changed")
    layer: LayerIndex = Field(0, description="counted from 0, below the model's n_layers")
    head: HeadIndex = Field(0, description="the query head, counted from 0, below the model's n_heads")


class RolloutRequest(AblatingRequest):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"model": "toy", "text": "Ali makan nasi lemak"}]}
    )


# ------------------------------------------------------------------ training (v1 additions)

MAX_TRAIN_STEPS = recipes.MAX_STEPS
MAX_TRAIN_NAME = 100  # characters of a name a training setting takes (a model, a hook, an architecture)
# The settings a request may change: TrainSettings' fields that are the API's (core/recipes.py), in its order.
TRAIN_FIELDS = tuple(f.name for f in recipes.setting_fields(api=True))


def train_field(f: dataclasses.Field) -> tuple[Any, Any]:
    """A TrainSettings field as a request field: null (the recipe's), or within the setting's bounds."""
    kind, meta = recipes.setting_type(f), f.metadata
    bounds = dict(meta["bounds"]) | ({"allow_inf_nan": False} if kind is float else {})
    bounds |= {"max_length": MAX_TRAIN_NAME} if kind is str else {}  # the sae recipe's model, hook, architecture
    return (Annotated[kind, Field(**bounds)] if bounds else kind) | None, Field(None, description=meta["help"])


@dataclass(frozen=True)
class TrainControl:
    """A setting as the training page offers it (templates/train.html): a checkbox for a switch, else a
    number input (its bounds: TrainRequest's schema)."""

    name: str
    label: str
    hint: str | None
    kind: Literal["check", "number"]
    step: str = "1"  # a number input's: "any" for a real number
    inputmode: str = "numeric"


def _train_control(f: dataclasses.Field) -> TrainControl:
    kind, meta = recipes.setting_type(f), f.metadata
    if kind is bool:
        return TrainControl(f.name, meta["label"], meta["hint"], "check")
    real = kind is float
    return TrainControl(
        f.name, meta["label"], meta["hint"], "number", "any" if real else "1", "decimal" if real else "numeric"
    )


# The settings the training page offers: the API's that have a label (core/recipes.py), in its order.
TRAIN_FORM = [_train_control(f) for f in recipes.setting_fields(api=True) if f.metadata["label"]]
SAE_FIELDS = recipes.SAE_FIELDS  # the sae recipe's own settings (a model's recipe refuses them)
SAE_SETTINGS = sae_run.OWN  # every setting the sae recipe takes (the others shape or optimise a model)
# each SAE architecture's own settings (another's are refused), and the architecture a request leaves out gets
SAE_ARCHITECTURE_SETTINGS = {a: tuple(own) for a, own in sae_run.ARCHITECTURE_DEFAULTS.items()}
SAE_DEFAULT_ARCHITECTURE = str(sae_run.DEFAULTS["architecture"])


class _TrainRequest(Request):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"recipe": "nasi-lemak", "steps": 40},
                {"recipe": "induction"},
                {"recipe": "induction", "n_layers": 1},
                {"recipe": "text", "text": "to be or not to be, that is the question. " * 20, "steps": 200},
                {"recipe": "sae", "model": "induction", "hook": "blocks.0.hook_resid_post", "d_sae": 256, "k": 8},
                {"recipe": "sae", "architecture": "standard", "l1_coefficient": 1.0, "steps": 200},
                {"recipe": "sae", "architecture": "jumprelu", "l0_coefficient": 1.0, "jumprelu_init_threshold": 0.01},
            ]
        },
    )

    recipe: Literal["induction", "nasi-lemak", "text", "sae"] = Field(
        description="induction: random characters with a repeated segment (a 2-layer attention-only model grows "
        "an induction head); nasi-lemak: the spec's one-block model on its Malay phrases; text: a "
        "character-level GPT on Python's documentation or your own text; sae: a sparse autoencoder (SAELens's "
        "standard, topk or jumprelu objective) on one hook of a shipped trained model or of a model run that has "
        "weights (its id) (model, hook, architecture, d_sae, k (topk), l1_coefficient (standard) or l0_coefficient, "
        "jumprelu_init_threshold and jumprelu_bandwidth (jumprelu), steps, batch_size vectors a step, lr, seed; "
        "text: its corpus, null: the model's own training data), listed by GET /api/v1/saes once trained"
    )

    def changes(self) -> dict[str, object]:
        """The settings this request sets (the rest are the recipe's defaults)."""
        return {k: getattr(self, k) for k in TRAIN_FIELDS if getattr(self, k) is not None}


# TrainSettings' fields that are the API's, each made optional (null: the recipe's), then the text with this
# server's limit. Python's types cannot say "these fields, each optional", so the class is made from the
# declaration rather than written out a second time; to a type checker it is the _TrainRequest it extends.
if TYPE_CHECKING:
    TrainRequest = _TrainRequest
else:
    TrainRequest = create_model(
        "TrainRequest",
        __base__=_TrainRequest,
        __module__=__name__,
        __doc__="""A training run: a recipe and any settings that differ from its working defaults (null keeps the
        recipe's). The same request names the same run (its id is a hash of the settings).""",
        **{f.name: train_field(f) for f in recipes.setting_fields(api=True)}
        | {
            # a text of your own: this server's limit on it, not core's
            "text": (
                Annotated[NonBlank | None, Limit("max_length", "train_max_text_chars")],
                Field(
                    None,
                    min_length=1,
                    json_schema_extra=stating(
                        "the text recipe's corpus, at most {train_max_text_chars:,} "
                        "characters; null: Python's documentation (the sae recipe's: null, the model's own data)"
                    ),
                ),
            )
        },
    )
