"""The knobs of a run, declared once, as a class: `Knobs` has one field per toggle that a run request, an
explorer URL and the explorer's form may set on a model. A field's annotation says everything about its
knob: its type (None: the model's own value), its bounds and the API's description (pydantic's `Field`),
its limit when a setting bounds it (`Limit`: app/settings.py), and what the form and the model's config
make of it (`Knob`: the form's label and fieldset, the TransformerConfig field it sets).

Everything that takes the toggles inherits the class or reads it:

- app/service/spec.py: `RunSpec(Knobs)`, and `configure` (each knob onto its config field);
- app/api/requests.py: `ModelRequest(Knobs, ...)` (pydantic reads the annotations: the schema, the
  bounds, the limits) and every request built on it; `CompareSide` and `HooksQuery` take some knobs,
  by their types below;
- app/pages/web.py: `ExplorerState(Knobs, ...)`, its URL parser, a model's defaults and the form's
  controls (templates/explorer.html draws them), and the Inspect page's "B changes" parameters;
- app/models/catalog.py: which toggles each model accepts (`KNOBS`, read from the class).

tests/api/test_knobs.py adds a field to the class and sees the API, the page state and the form follow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import annotated_types
from pydantic import Field
from pydantic.fields import FieldInfo

from app.settings import Limit
from core import POSITION_SCHEMES
from core.config import ATTENTION_DIRS
from core.i18n import N_

MAX_SEED = 2**32 - 1  # NumPy's RandomState, which the spec's np.random.seed uses, takes seeds below 2³²

Group = Literal["attention", "size"]
# The form's fieldsets, in order: (legend, hint). attention: how a model computes with the same weights;
# size: which weights it has (its shape, and the seed they are drawn from).
GROUPS: dict[str, tuple[str, str | None]] = {
    "attention": (N_("Attention"), None),
    "size": (N_("Model shape"), N_("(new random weights)")),
}


@dataclass(frozen=True)
class Knob:
    """One toggle of a run. Declared in its field's annotation with what the form and the config make of
    it; `KNOBS` holds it completed from the field (its name, type, bounds, limit and description)."""

    group: Group
    label: str  # the form's label, in English, marked for the catalogue (the form translates it)
    hint: str | None = None  # after the form's label
    config: str | None = None  # the TransformerConfig field it sets; None: not a config field (the seed)
    config_values: tuple[Any, Any] | None = None  # a switch's (on, off) values of that field
    model_default: str | None = None  # the Model attribute holding its default, when it is not the config's
    trained_weights: bool = False  # a checkpoint's trained weights take it (they fix shape, seed, positions)
    form_order: int | None = None  # its place on the form within its group; those without one follow
    # From the field:
    name: str = ""  # the request field, the URL parameter and the form control
    type: type = object  # bool, int, float, or str (one of `choices`)
    help: str | None = None  # the API's description
    low: int | float | None = None  # the least value (`ge`; `gt` with low_exclusive)
    low_exclusive: bool = False
    high: int | float | None = None  # the greatest value, fixed (`le`)
    limit: str | None = None  # the Settings field bounding it (`le`): app/settings.py
    choices: tuple[str, ...] = ()

    @property
    def reshapes(self) -> bool:
        """It changes the model's shape (a TransformerConfig size): the same weights cannot follow."""
        return self.group == "size" and self.config is not None

    def to_config(self, value: Any) -> Any:
        """The config field's value for this knob's value (a switch's on/off values, else the value)."""
        return value if self.config_values is None else self.config_values[0 if value else 1]

    def default(self, model: Any) -> Any:
        """The model's own value (a catalogue Model): its config's, or the attribute that holds it."""
        if self.model_default is not None:
            return getattr(model, self.model_default)
        value = getattr(model.cfg, str(self.config))
        return value if self.config_values is None else value == self.config_values[0]

    def upper(self, settings: Any) -> int | float | None:
        """The greatest value these settings allow: the fixed bound, or the limit's setting."""
        return getattr(settings, self.limit) if self.limit is not None else self.high


# Each knob's type, named so that a request taking only some knobs (CompareSide, HooksQuery) names them.
Causal = Annotated[
    bool | None,
    Field(description="null: the model's default"),
    Knob(
        "attention",
        N_("Causal mask"),
        hint=N_("(hide the future)"),
        config="attention_dir",
        config_values=ATTENTION_DIRS,
        trained_weights=True,
    ),
]
Scale = Annotated[
    bool | None,
    Field(description="divide scores by √d_head; null: the model's default"),
    Knob("attention", N_("Scale by 1/√d_head"), config="use_attn_scale", trained_weights=True),
]
Temperature = Annotated[
    float | None,
    Field(gt=0, le=100, allow_inf_nan=False, description="attention softmax temperature (scores ÷ it)"),
    Knob("attention", N_("Softmax temperature"), config="attn_temperature", trained_weights=True),
]
PositionalEmbeddingType = Annotated[
    Literal[POSITION_SCHEMES] | None,  # type: ignore[valid-type]  # the schemes core knows, a tuple of str
    Knob("attention", N_("Positions"), config="positional_embedding_type"),
]
NHeads = Annotated[
    int | None,
    Field(ge=1, description="must divide d_model"),
    Limit("le", "max_heads"),
    Knob("size", N_("Heads"), config="n_heads", form_order=1),
]
NLayers = Annotated[
    int | None, Field(ge=1), Limit("le", "max_layers"), Knob("size", N_("Layers"), config="n_layers", form_order=3)
]
DModel = Annotated[
    int | None,
    Field(ge=1),
    Limit("le", "max_d_model"),
    Knob("size", N_("Width d_model"), config="d_model", form_order=2),
]
Seed = Annotated[
    int | None,
    Field(ge=0, le=MAX_SEED, description="weights' seed; null: the model's default"),
    Knob("size", N_("Seed"), model_default="default_seed", form_order=4),
]


# kw_only: a subclass's own fields (RunSpec's model and text) come first in its __init__. No __init__, repr
# or equality of its own (init, repr, eq False): each subclass has its own, a dataclass's or a pydantic
# model's, which a pydantic model must keep (its bases list Knobs first, so that the knobs follow its own
# fields in the schema: pydantic orders fields base-most first).
@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Knobs:
    """The toggles of a run, each None (null) to keep the model's own value. In the API's order: the
    attention knobs, then the sizes (heads, layers, width) and the weights' seed."""

    causal: Causal = None
    scale: Scale = None
    temperature: Temperature = None
    positional_embedding_type: PositionalEmbeddingType = None
    n_heads: NHeads = None
    n_layers: NLayers = None
    d_model: DModel = None
    seed: Seed = None


def _bound(info: FieldInfo, kind: type[annotated_types.BaseMetadata]) -> int | float | None:
    """A Field's bound of this kind (annotated_types.Ge, Gt or Le: its ge, gt or le), if it has one."""
    found = next((b for b in info.metadata if isinstance(b, kind)), None)
    value = getattr(found, kind.__name__.lower(), None)
    return value if isinstance(value, (int, float)) else None


def declared(cls: type = Knobs) -> tuple[Knob, ...]:
    """Each field of the class as its Knob, completed from the field's annotation, in declaration order."""
    hints = get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        kind, *meta = get_args(hints[f.name])
        value_type = next(t for t in get_args(kind) if t is not type(None))  # the type that is not None
        info = next((m for m in meta if isinstance(m, FieldInfo)), FieldInfo())
        ge, gt, high = (_bound(info, kind) for kind in (annotated_types.Ge, annotated_types.Gt, annotated_types.Le))
        choices = get_args(value_type) if get_origin(value_type) is Literal else ()
        out.append(
            dataclasses.replace(
                next(m for m in meta if isinstance(m, Knob)),
                name=f.name,
                type=str if choices else value_type,
                help=info.description,
                low=gt if ge is None else ge,
                low_exclusive=gt is not None,
                high=high,
                limit=next((m.of for m in meta if isinstance(m, Limit) and isinstance(m.of, str)), None),
                choices=choices,
            )
        )
    return tuple(out)


KNOBS: tuple[Knob, ...] = declared()


def names(knobs: Iterable[Knob] | None = None) -> tuple[str, ...]:
    """The knobs' names (every knob's, in declaration order, by default)."""
    return tuple(k.name for k in (KNOBS if knobs is None else knobs))


def by_name(name: str) -> Knob:
    return next(k for k in KNOBS if k.name == name)


def on_form() -> list[Knob]:
    """The knobs in the form's order: group by group (GROUPS), then by form_order (those without one
    after, in declaration order). The explorer's URL lists them in this order too."""
    group_index = list(GROUPS)
    return sorted(KNOBS, key=lambda k: (group_index.index(k.group), k.form_order is None, k.form_order or 0))
