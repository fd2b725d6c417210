"""What to run: a model, a text and its toggles (RunSpec), then the same made concrete, once tokenised
and configured (Setup) and once its weights are loaded (Prepared). Every model view starts here.

A *run* is one forward pass of a model over a text; a training run is something else (app/training/).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from app.models import knobs
from app.models.catalog import Model
from app.models.knobs import Knobs
from core import InputError, TransformerConfig
from core.i18n import _
from core.model import Params
from core.tokenizers import Encoding

Method = Literal["zero", "mean"]


@dataclass(frozen=True)
class AblatedHead:
    """A head whose output z is replaced before W_O: by zeros, or by its mean over the positions."""

    layer: int
    head: int
    method: Method = "zero"


@dataclass(frozen=True)
class SteerSpec:
    """One push (core/steering.py): along `vector` [d_model], or along feature `feature` of SAE `sae` (its decoder
    row); add `coefficient` times it, or clamp (a feature's activation, or the stream's component along the
    vector, set to `coefficient`) at `positions` of the text (None: every one, each new token's too)."""

    hook: str
    coefficient: float
    mode: Literal["add", "clamp"] = "add"
    vector: tuple[float, ...] | None = None
    sae: str | None = None
    feature: int | None = None
    positions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Steering:
    """The steers of a run or generation, and whether every attention pattern is the unsteered run's."""

    steers: tuple[SteerSpec, ...]
    frozen_attention: bool = False


@dataclass(frozen=True)
class RunSpec(Knobs):
    """A model, a text and the toggles (Knobs: app/models/knobs.py): what every model view runs. A toggle
    left None keeps the model's default.

    Built once from a request (app/api/requests.py `ModelRequest.spec()`) or from a page's URL."""

    model: str
    text: str
    ablate: tuple[AblatedHead, ...] = ()
    steering: Steering | None = None  # steered (app/service/steering.py); None: the model as it is

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def toggles(self) -> dict[str, object]:
        """The toggles this spec sets (not left to the model), by name."""
        return {k.name: getattr(self, k.name) for k in knobs.KNOBS if getattr(self, k.name) is not None}


@dataclass(frozen=True)
class Setup:
    """A spec tokenised and configured, before any weight is loaded: cheap, so checked first."""

    model: Model
    cfg: TransformerConfig
    encoding: Encoding
    ablate: dict[tuple[int, int], Method]  # {(layer, head): method}, checked against cfg
    seed: int

    @property
    def n(self) -> int:
        return len(self.encoding.ids)


@dataclass(frozen=True)
class Prepared:
    """A setup checked against every limit, with its weights: ready to compute."""

    model: Model
    cfg: TransformerConfig
    encoding: Encoding
    ablate: dict[tuple[int, int], Method]
    seed: int
    params: Params

    @property
    def ids(self) -> np.ndarray:  # [pos]
        return np.asarray(self.encoding.ids)

    @property
    def tokens(self) -> list[str]:
        return self.encoding.tokens

    @property
    def ablations(self) -> list[AblatedHead]:
        return [AblatedHead(layer, head, how) for (layer, head), how in self.ablate.items()]

    def token_str(self, token_id: int) -> str:
        return self.model.reader.token_str(int(token_id))


def check_toggles(model: Model, given: dict[str, object]) -> None:
    refused = [k for k, v in given.items() if v is not None and k not in model.toggles]
    if "causal" in refused and not model.is_encoder and "local" in (model.cfg.attn_types or ()):
        raise InputError(
            _(
                "model {model!r} does not accept causal: its local (sliding-window) attention layers see "
                "only the last {window_size} tokens before each query, which is defined under the causal "
                "mask only; it takes {toggles}"
            ).format(model=model.name, window_size=model.cfg.window_size, toggles=", ".join(model.toggles))
        )
    if refused:
        message = (
            _("model {model!r} does not accept {refused}: it takes {toggles}")
            if model.toggles
            else _("model {model!r} does not accept {refused}: it takes no toggles")
        )
        if model.name != "toy":
            message += _("; the 'toy' model accepts every toggle")
        raise InputError(message.format(model=model.name, refused=", ".join(refused), toggles=", ".join(model.toggles)))


def configure(model: Model, spec: RunSpec, n_tokens: int) -> TransformerConfig:
    """The model's config with the spec's toggles applied: the sizes through the model's own rule
    (Model.configure), then the attention knobs onto their config fields."""
    given = spec.toggles()
    check_toggles(model, given)
    chosen = [(k, given[k.name]) for k in knobs.KNOBS if k.name in given]
    # a knob that reshapes sets a config field (reshapes: config is not None), to an int
    sizes = {k.config: v for k, v in chosen if k.reshapes and k.config is not None and isinstance(v, int)}
    cfg = model.configure(sizes, n_tokens)
    attention = {k.config: k.to_config(v) for k, v in chosen if k.group == "attention" and k.config is not None}
    return cfg.replace(**attention) if attention else cfg


def ablation_map(ablate: tuple[AblatedHead, ...], cfg: TransformerConfig) -> dict[tuple[int, int], Method]:
    """The spec's ablations as core's {(layer, head): "zero"|"mean"}, checked against this model."""
    out: dict[tuple[int, int], Method] = {}
    for a in ablate:
        if a.layer >= cfg.n_layers or a.head >= cfg.n_heads:
            raise InputError(
                _(
                    "ablate: layer {layer} head {head} does not exist: this model has "
                    "{n_layers} layer(s) of {n_heads} head(s), counted from 0"
                ).format(layer=a.layer, head=a.head, n_layers=cfg.n_layers, n_heads=cfg.n_heads)
            )
        if (a.layer, a.head) in out:
            raise InputError(
                _("ablate: layer {layer} head {head} is listed twice: list each head once").format(
                    layer=a.layer, head=a.head
                )
            )
        out[(a.layer, a.head)] = a.method
    return out
