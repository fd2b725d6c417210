"""The knobs of a run, declared once: every toggle a run request, an explorer URL and the explorer's
form may set on a model, with its type, bounds, label, help text and the TransformerConfig field it sets.

Everything that lists the toggles derives from `KNOBS` (read when each module is imported):

- app/service/spec.py: `RunSpec`'s fields, and `configure` (each knob onto its config field);
- app/models/catalog.py: which toggles each model accepts;
- app/api/requests.py: the run requests' fields (`ModelRequest`, `CompareSide`, `HooksQuery`) with their
  bounds, limits (a Settings field, read from the settings in effect) and descriptions;
- app/pages/web.py: the explorer's state, its URL parser, a model's defaults and the form's controls
  (templates/explorer.html draws them), and the Inspect page's "B changes" parameters.

tests/api/test_knobs.py adds a knob here and sees the API, the page state and the form follow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

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
    """One toggle of a run. A request leaves it null (None) to keep the model's own value."""

    name: str  # the request field, the URL parameter and the form control
    type: type  # bool, int, float, or str (one of `choices`)
    group: Group
    label: str  # the form's label, in English, marked for the catalogue (the form translates it)
    help: str | None = None  # the API's description
    hint: str | None = None  # after the form's label
    config: str | None = None  # the TransformerConfig field it sets; None: not a config field (the seed)
    config_values: tuple[Any, Any] | None = None  # a switch's (on, off) values of that field
    model_default: str | None = None  # the Model attribute holding its default, when it is not the config's
    low: int | float | None = None  # the least value (`ge`; `gt` with low_exclusive)
    low_exclusive: bool = False
    high: int | float | None = None  # the greatest value, fixed (`le`)
    limit: str | None = None  # the Settings field bounding it (`le`): app/settings.py
    choices: tuple[str, ...] = ()
    trained_weights: bool = False  # a checkpoint's trained weights take it (they fix shape, seed, positions)
    form_order: int | None = None  # its place on the form within its group; those without one follow

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
        value = getattr(model.cfg, self.config)
        return value if self.config_values is None else value == self.config_values[0]

    def upper(self, settings: Any) -> int | float | None:
        """The greatest value these settings allow: the fixed bound, or the limit's setting."""
        return getattr(settings, self.limit) if self.limit is not None else self.high


KNOBS: tuple[Knob, ...] = (
    Knob(
        "causal",
        bool,
        "attention",
        N_("Causal mask"),
        help="null: the model's default",
        hint=N_("(hide the future)"),
        config="attention_dir",
        config_values=ATTENTION_DIRS,
        trained_weights=True,
    ),
    Knob(
        "scale",
        bool,
        "attention",
        N_("Scale by 1/√d_head"),
        help="divide scores by √d_head; null: the model's default",
        config="use_attn_scale",
        trained_weights=True,
    ),
    Knob(
        "temperature",
        float,
        "attention",
        N_("Softmax temperature"),
        help="attention softmax temperature (scores ÷ it)",
        config="attn_temperature",
        low=0,
        low_exclusive=True,
        high=100,
        trained_weights=True,
    ),
    Knob(
        "positional_embedding_type",
        str,
        "attention",
        N_("Positions"),
        config="positional_embedding_type",
        choices=POSITION_SCHEMES,
    ),
    # The API lists the sizes as heads, layers, width; the form as heads, width, layers, then the seed.
    Knob(
        "n_heads",
        int,
        "size",
        N_("Heads"),
        help="must divide d_model",
        config="n_heads",
        low=1,
        limit="max_heads",
        form_order=1,
    ),
    Knob("n_layers", int, "size", N_("Layers"), config="n_layers", low=1, limit="max_layers", form_order=3),
    Knob("d_model", int, "size", N_("Width d_model"), config="d_model", low=1, limit="max_d_model", form_order=2),
    Knob(
        "seed",
        int,
        "size",
        N_("Seed"),
        help="weights' seed; null: the model's default",
        model_default="default_seed",
        low=0,
        high=MAX_SEED,
        form_order=4,
    ),
)


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
