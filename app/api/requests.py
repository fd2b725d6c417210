"""Request models of the REST API v1 (also what validates a page's state), with their limits and examples.

Every limit comes from app/settings.py and every default from the core function it feeds
(core.lessons' signatures), so each is written once. Request models forbid unknown fields; a
model request becomes the service's typed RunSpec with `.spec()`.

The limits shown in the schema are the environment's at import (the OpenAPI states them); the
service checks every limit again at request time with the injected settings (app/deps.py).
"""

from __future__ import annotations

import inspect
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from core import DTYPE_BYTES, POSITION_SCHEMES, PRESETS, TransformerConfig, lessons, recipes
from core.config import NORMALIZATION_TYPES

from app.service import AblatedHead, RunSpec
from app.settings import get_settings

S = get_settings()
MAX_SEED = 2**32 - 1  # NumPy's RandomState, which the spec's np.random.seed uses, takes seeds below 2³²


def default(fn, name: str) -> Any:
    """The default of `name` in core function `fn`: the spec's value, stated once, in core."""
    return inspect.signature(fn).parameters[name].default


def _non_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("text_empty", "the text is empty or only spaces: type at least one word")
    if re.search("[\ud800-\udfff]", text):
        raise PydanticCustomError("text_surrogate", "the text contains an unpaired UTF-16 surrogate, "
                                  "which is not a character: remove it")
    return text


def Text(default_: Any, max_length: int, description: str, **kw) -> Any:
    return Field(default_, min_length=1, max_length=max_length, description=description, **kw)


NonBlank = Annotated[str, AfterValidator(_non_blank)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, description=f"random seed, 0 … {MAX_SEED:,}")]
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
NormalizationType = Literal[NORMALIZATION_TYPES]  # type: ignore[valid-type]
DType = Literal[tuple(DTYPE_BYTES)]  # type: ignore[valid-type]
PositionScheme = Literal[POSITION_SCHEMES]  # type: ignore[valid-type]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _int_list(value: str, name: str, low: int, high: int) -> tuple[int, ...]:
    items = tuple(int(x) for x in value.split(","))
    if len(items) > S.max_dims:
        raise PydanticCustomError("too_long", f"{{n}} {name} given, more than the limit of {S.max_dims}",
                                  {"n": len(items)})
    bad = [x for x in items if not low <= x <= high]
    if bad:
        raise PydanticCustomError("out_of_range", f"{name} must each lie in {low} … {high:,}; got {{bad}}",
                                  {"bad": bad[0]})
    return items


# ------------------------------------------------------------------ lesson queries

LESSON_TEXT = f"words split on spaces, at most {S.max_tokens:,} words and {S.max_text_chars:,} characters"


class AttentionQuery(Request):
    text: NonBlank = Text(lessons.DEFAULT_TEXT, S.max_text_chars, LESSON_TEXT, examples=["the cat sat down"])
    seed: Seed = default(lessons.attention, "seed")
    d_model: int = Field(default(lessons.attention, "d_model"), ge=1, le=S.max_d_model,
                         description="width of each token's embedding")
    d_k: int = Field(default(lessons.attention, "d_k"), ge=1, le=S.max_d_model,
                     description="width of queries, keys and values")
    causal: bool = Field(default(lessons.attention, "causal"), description="forbid attending to later tokens")
    scale: bool = Field(default(lessons.attention, "scale"), description="divide the scores by √d_k")


class ScalingQuery(Request):
    dims: str = Field(",".join(map(str, default(lessons.scaling, "dims"))), pattern=r"^\d{1,9}(,\d{1,9})*$",
                      description=f"comma-separated widths d, at most {S.max_dims}, each 1 … {S.calc_max_width:,}",
                      examples=["4,64,512"])
    n_queries: int = Field(default(lessons.scaling, "n_queries"), ge=1, le=S.max_queries)
    n_keys: int = Field(default(lessons.scaling, "n_keys"), ge=1, le=S.max_tokens)
    seed: Seed = default(lessons.scaling, "seed")

    @field_validator("dims")
    @classmethod
    def _dims(cls, v: str) -> str:
        _int_list(v, "dims", 1, S.calc_max_width)
        return v

    @property
    def dim_list(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.dims.split(","))


class MultiheadQuery(Request):
    text: NonBlank = Text(lessons.DEFAULT_TEXT, S.max_text_chars, LESSON_TEXT)
    seed: Seed = default(lessons.multihead, "seed")
    d_model: int = Field(default(lessons.multihead, "d_model"), ge=1, le=S.max_d_model,
                         description="width; must be a multiple of n_heads")
    n_heads: int = Field(default(lessons.multihead, "n_heads"), ge=1, le=S.max_heads)
    causal: bool = Field(default(lessons.multihead, "causal"), description="forbid attending to later tokens")
    scale: bool = Field(default(lessons.multihead, "scale"), description="divide the scores by √d_head")


class PositionsQuery(Request):
    n_pos: int = Field(default(lessons.positions, "n_pos"), ge=1, le=S.max_tokens, description="positions")
    d: int = Field(default(lessons.positions, "d"), ge=2, le=S.max_d_model, description="width (even)")
    pairs: str | None = Field(None, pattern=r"^\d{1,7}:\d{1,7}(,\d{1,7}:\d{1,7})*$",
                              description=(f"comma-separated i:j position pairs whose dot products to show, at "
                                           f"most {S.max_dims}; default: the spec's pairs that fit in n_pos"),
                              examples=["10:10,10:11,30:35"])

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: str | None) -> str | None:
        if v is not None and len(v.split(",")) > S.max_dims:
            raise PydanticCustomError("too_long", f"more than {S.max_dims} pairs given")
        return v

    @property
    def pair_list(self) -> tuple[tuple[int, int], ...] | None:
        if self.pairs is None:
            return None
        return tuple((int(i), int(j)) for i, j in (p.split(":") for p in self.pairs.split(",")))


class ForwardQuery(Request):
    text: NonBlank = Text(default(lessons.forward, "text"), S.max_text_chars,
                          "corpus whose sorted distinct characters are the vocabulary")
    prompt: NonBlank = Text(default(lessons.forward, "prompt"), S.max_tokens,
                            f"characters to run (one token each, at most {S.max_tokens:,}), all from the text")
    seed: Seed = default(lessons.forward, "seed")
    d_model: int = Field(default(lessons.forward, "d_model"), ge=1, le=S.max_d_model)
    n_heads: int = Field(default(lessons.forward, "n_heads"), ge=1, le=S.max_heads)
    d_mlp: int = Field(default(lessons.forward, "d_mlp"), ge=1, le=S.max_d_mlp)


# ------------------------------------------------------------------ calculator queries

PRESET_DESCRIPTION = ("start from this configuration (default: toy); a field given replaces the preset's. "
                      "toy and gpt2-*: GPT-2's design; smollm2-135m, tinyllama-1.1b, qwen2.5-0.5b, qwen3-0.6b: "
                      "Llama's (RMS norm, gated MLP, rotary, grouped-query attention); pythia-70m: GPT-NeoX; "
                      "tinystories-33m: GPT-Neo")


class SizesQuery(Request):
    """The sizes the spec's closed formula takes, replacing a preset's. Fields left null keep the preset's."""

    preset: PresetName | None = Field(None, description=PRESET_DESCRIPTION)
    d_vocab: int | None = Field(None, ge=1, le=S.calc_max_vocab)
    n_ctx: int | None = Field(None, ge=1, le=S.calc_max_ctx)
    d_model: int | None = Field(None, ge=1, le=S.calc_max_width)
    n_layers: int | None = Field(None, ge=1, le=S.calc_max_layers)
    d_mlp: int | None = Field(None, ge=1, le=S.calc_max_width, description="default 4 × d_model")
    tied_embeddings: bool | None = Field(None, description="the unembedding reuses the token table (GPT-2)")

    def sizes(self) -> dict[str, object]:
        """The shape fields of this query (None: the preset's)."""
        return {k: getattr(self, k) for k in type(self).model_fields if k in SHAPE_FIELDS}


class ParamsQuery(SizesQuery):
    """The shape of a model: a preset, with any of these replacing its own. Fields left null keep the preset's."""

    n_heads: int | None = Field(None, ge=1, le=S.calc_max_width,
                                description="query heads; must divide d_model unless d_head is given")
    n_key_value_heads: int | None = Field(
        None, ge=1, le=S.calc_max_width,
        description="key/value heads, each shared by n_heads / n_key_value_heads query heads (grouped-query "
                    "attention; 1: multi-query); must divide n_heads. Default: one per query head, or the preset's")
    d_head: int | None = Field(None, ge=1, le=S.calc_max_width,
                               description="width of each head (default d_model / n_heads; Qwen3's is wider)")
    gated_mlp: bool | None = Field(None, description="a gated (SwiGLU) MLP: a third matrix W_gate beside W_in, W_out")
    normalization_type: NormalizationType | None = Field(
        None, description="LN: layer norm, gain and bias; RMS: RMS norm, gain only (Llama); LNPre, RMSPre: no "
                          "parameters")
    positional_embedding_type: PositionScheme | None = Field(
        None, description="learned positions add an n_ctx × d_model table; the others have no parameters")
    bias: bool | None = Field(None, description="biases on every linear map (GPT-2: yes; Llama: no)")
    qkv_bias: bool | None = Field(None, description="biases of Q, K and V only (Qwen2: yes); default as bias")
    use_qk_norm: bool | None = Field(None, description="an RMS gain on every head's queries and keys (Qwen3)")


class KVCacheQuery(Request):
    """A model's KV cache: the preset's shape, with these replacing its own, at a sequence length, batch and dtype."""

    preset: PresetName | None = Field(None, description=PRESET_DESCRIPTION)
    n_layers: int | None = Field(None, ge=1, le=S.calc_max_layers)
    d_model: int | None = Field(None, ge=1, le=S.calc_max_width)
    n_heads: int | None = Field(None, ge=1, le=S.calc_max_width, description="must divide d_model")
    n_key_value_heads: int | None = Field(
        None, ge=1, le=S.calc_max_width,
        description="heads whose keys and values are cached (grouped-query attention shares each among "
                    "n_heads / n_key_value_heads query heads); must divide n_heads")
    d_head: int | None = Field(None, ge=1, le=S.calc_max_width, description="default d_model / n_heads")
    seq_len: int | None = Field(None, ge=1, le=S.calc_max_ctx, description="cached tokens (default: n_ctx)")
    batch: int = Field(1, ge=1, le=S.calc_max_batch)
    dtype: DType = Field("float32", description="element type of the cache")

    sizes = SizesQuery.sizes


# The calculators' fields that are TransformerConfig fields: the model's shape (the rest say which
# preset, and how much to cache in which dtype).
SHAPE_FIELDS = frozenset(TransformerConfig.__dataclass_fields__)


class HooksQuery(Request):
    model: str = Field("toy", max_length=200, description="a name from GET /api/v1/models")
    n_layers: int | None = Field(None, ge=1, le=S.max_layers)
    positional_embedding_type: PositionScheme | None = None


# ------------------------------------------------------------------ run

# A layer or head index must be below the model's own n_layers and n_heads (the service checks it
# per model). A pretrained model's depth is its checkpoint's (Qwen3-0.6B: 28 layers; TinyLlama: 32
# heads), beyond the toys' max_layers and max_heads, so the schema bounds them as the calculators do.
LAYER_INDEX = {"ge": 0, "le": S.calc_max_layers - 1}
HEAD_INDEX = {"ge": 0, "le": S.calc_max_width - 1}


class HeadAblation(Request):
    layer: int = Field(**LAYER_INDEX, description="the head's layer, counted from 0, below the model's n_layers")
    head: int = Field(**HEAD_INDEX, description="the query head within its layer, counted from 0, below n_heads")
    method: Literal["zero", "mean"] = Field(
        "zero", description="zero: the head writes nothing; mean: it writes its mean output over the text's "
                            "positions (what it says whatever the token)")


COST = (f"The cost of a request is checked before anything is computed: at most {S.max_work:,} multiply-adds "
        f"(random draws included) on a toy, whose weights are drawn for the request; at most "
        f"{S.max_pretrained_work:,} on a pretrained model, whose weights are loaded once (one 128-token pass of a "
        f"0.5B-parameter model is about 6.4 × 10¹⁰); and no array of more than {S.max_elements:,} numbers (a toy's "
        f"drawn weights included, a pretrained model's loaded ones not). Beyond a limit: 422 saying what to reduce.")


class ModelRequest(Request):
    """A model, a text and the toggles: what every model endpoint (run and the analyses) reads."""

    model: str = Field("toy", max_length=200, description="a name from GET /api/v1/models. " + COST)
    text: NonBlank = Text(..., S.max_text_chars,
                          f"the input; at most {S.max_text_chars:,} characters and {S.max_tokens:,} tokens")
    causal: bool | None = Field(None, description="null: the model's default")
    scale: bool | None = Field(None, description="divide scores by √d_head; null: the model's default")
    temperature: float | None = Field(None, gt=0, le=100, allow_inf_nan=False,
                                      description="attention softmax temperature (scores ÷ it)")
    positional_embedding_type: PositionScheme | None = None
    n_heads: int | None = Field(None, ge=1, le=S.max_heads, description="must divide d_model")
    n_layers: int | None = Field(None, ge=1, le=S.max_layers)
    d_model: int | None = Field(None, ge=1, le=S.max_d_model)
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="weights' seed; null: the model's default")

    def spec(self) -> RunSpec:
        """What to run, as the service's typed specification."""
        ablate = tuple(AblatedHead(a.layer, a.head, a.method) for a in getattr(self, "ablate", ()))
        return RunSpec(model=self.model, text=self.text, causal=self.causal, scale=self.scale,
                               temperature=self.temperature, positional_embedding_type=self.positional_embedding_type,
                               n_heads=self.n_heads, n_layers=self.n_layers, d_model=self.d_model, seed=self.seed,
                               ablate=ablate)


class AblatingRequest(ModelRequest):
    ablate: list[HeadAblation] = Field(
        default_factory=list, max_length=S.max_ablations,
        description=(f"heads whose output is replaced before W_O (at most {S.max_ablations}, each head once); "
                     "every later activation and the prediction change, earlier ones do not"))


class RunRequest(AblatingRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "Ali makan nasi lemak", "hooks": ["blocks.0.attn.hook_pattern"], "top_k": 5},
        {"model": "spec-forward", "text": "nasi ", "top_k": 9},
        {"model": "toy", "text": "the cat sat", "causal": False, "n_heads": 2, "n_layers": 1,
         "positional_embedding_type": "rotary", "seed": 3, "hooks": ["blocks.0.attn.hook_attn_scores"]},
        {"model": "toy", "text": "the cat sat", "hooks": ["blocks.1.attn.hook_pattern"],
         "ablate": [{"layer": 0, "head": 2, "method": "zero"}]},
    ]})

    hooks: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=S.max_hooks,
        description=(f"activation names to return (GET /api/v1/hooks lists them), at most {S.max_hooks}, "
                     f"holding at most {S.max_hook_values:,} numbers in all"))
    top_k: int = Field(5, ge=0, le=S.max_top_k, description="how many next-token predictions to return")


# ------------------------------------------------------------------ looking inside (analysis)

Position = Annotated[int, Field(ge=-S.max_tokens, le=S.max_tokens - 1,
                                description="a token position, from 0; negative counts from the end (-1 = last)")]


class DecomposeRequest(AblatingRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "Ali makan nasi lemak"},
        {"model": "spec-forward", "text": "nasi ", "pos": -1, "target": 2},
    ]})

    pos: Position = -1
    target: int | None = Field(None, ge=0, le=S.calc_max_vocab - 1,
                               description="the token id whose logit to attribute (below the model's d_vocab); "
                                           "null: the model's most likely next token at `pos`")


class LogitLensRequest(AblatingRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "Ali makan nasi lemak", "top_k": 3}]})

    top_k: int = Field(5, ge=1, le=S.max_top_k, description="tokens kept per layer and position")


class DetectorsRequest(AblatingRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "the cat sat on the mat. the cat sat"},
        {"model": "all-MiniLM-L6-v2", "text": "The cat sat on the mat. The cat sat on the mat.",
         "random_length": 20}]})

    random_length: int = Field(20, ge=2, le=S.max_tokens // 2,
                               description="length of the random sequence, which is then repeated once")
    random_seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the random sequence")
    threshold: float = Field(0.4, ge=0, le=1, description="a head is flagged when its score reaches this")


class KVStepsRequest(ModelRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "Ali makan", "n_new": 8}]})

    n_new: int = Field(8, ge=0, le=S.max_new_tokens, description="tokens to generate greedily after the text")


class CompareSide(Request):
    """What the second side changes; a field left null keeps the first side's value."""

    text: NonBlank | None = Field(None, min_length=1, max_length=S.max_text_chars)
    causal: bool | None = None
    scale: bool | None = None
    temperature: float | None = Field(None, gt=0, le=100, allow_inf_nan=False)
    positional_embedding_type: PositionScheme | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    ablate: list[HeadAblation] | None = Field(None, max_length=S.max_ablations,
                                              description="replaces the first side's list (use [] for none)")

    def changes(self) -> dict[str, object]:
        """The fields this side changes, as RunSpec fields (ablations as the service's type)."""
        out = {k: v for k, v in self.model_dump(exclude={"ablate"}).items() if v is not None}
        if self.ablate is not None:
            out["ablate"] = tuple(AblatedHead(a.layer, a.head, a.method) for a in self.ablate)
        return out


class CompareRequest(AblatingRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "Ali makan nasi", "other": {"causal": False}, "layer": 1, "head": 0},
        {"model": "toy", "text": "the cat sat", "other": {"text": "the dog sat"}},
        {"model": "toy", "text": "the cat sat", "layer": 1, "other": {"ablate": [{"layer": 0, "head": 1}]}},
    ]})

    other: CompareSide = Field(description="the second side: the first side's settings with these changed")
    layer: int = Field(0, **LAYER_INDEX, description="counted from 0, below the model's n_layers")
    head: int = Field(0, **HEAD_INDEX, description="the query head, counted from 0, below the model's n_heads")


class RolloutRequest(AblatingRequest):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "toy", "text": "Ali makan nasi lemak"}]})


# ------------------------------------------------------------------ training (v1 additions)

MAX_TRAIN_STEPS = recipes.MAX_STEPS
TRAIN_FIELDS = ("seed", "steps", "n_layers", "n_heads", "d_model", "d_mlp", "attn_only", "lr", "batch_size", "seq_len",
                "warmup", "weight_decay", "grad_clip", "eval_interval", "text")


class TrainRequest(Request):
    """A training run: a recipe and any settings that differ from its working defaults (null keeps the
    recipe's). The same request names the same run (its id is a hash of the settings)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"recipe": "nasi-lemak", "steps": 40},
        {"recipe": "induction"},
        {"recipe": "induction", "n_layers": 1},
        {"recipe": "text", "text": "to be or not to be, that is the question. " * 20, "steps": 200},
    ]})

    recipe: Literal["induction", "nasi-lemak", "text"] = Field(
        description="induction: random characters with a repeated segment (a 2-layer attention-only model grows "
                    "an induction head); nasi-lemak: the spec's one-block model on its Malay phrases; text: a "
                    "character-level GPT on Python's documentation or your own text")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="weights, data order and probe derive from it")
    steps: int | None = Field(None, ge=1, le=recipes.MAX_STEPS, description="optimiser steps")
    n_layers: int | None = Field(None, ge=1, le=recipes.MAX_LAYERS)
    n_heads: int | None = Field(None, ge=1, le=recipes.MAX_HEADS, description="must divide d_model")
    d_model: int | None = Field(None, ge=1, le=recipes.MAX_D_MODEL)
    d_mlp: int | None = Field(None, ge=1, le=4 * recipes.MAX_D_MODEL, description="default 4 × d_model")
    attn_only: bool | None = Field(None, description="blocks without an MLP (the induction recipe's default)")
    lr: float | None = Field(None, gt=0, le=1, allow_inf_nan=False, description="peak learning rate (AdamW)")
    batch_size: int | None = Field(None, ge=1, le=recipes.MAX_BATCH, description="sequences per step")
    seq_len: int | None = Field(None, ge=2, le=recipes.MAX_SEQ_LEN, description="tokens per sequence (the context)")
    warmup: int | None = Field(None, ge=0, le=recipes.MAX_STEPS, description="steps of linear warm-up")
    weight_decay: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    grad_clip: float | None = Field(None, ge=0, le=1000, allow_inf_nan=False, description="0: no clipping")
    eval_interval: int | None = Field(None, ge=1, le=recipes.MAX_STEPS, description="steps between records")
    text: NonBlank | None = Field(None, min_length=1, max_length=S.train_max_text_chars,
                                  description=f"the text recipe's corpus, at most {S.train_max_text_chars:,} "
                                              "characters; null: Python's documentation")

    def changes(self) -> dict[str, object]:
        """The settings this request sets (the rest are the recipe's defaults)."""
        return {k: getattr(self, k) for k in TRAIN_FIELDS if getattr(self, k) is not None}
