"""What to run: a model, a text and its toggles (RunSpec), then the same made concrete, once tokenised
and configured (Setup) and once its weights are loaded (Prepared). Every model view starts here.

A *run* is one forward pass of a model over a text; a training run is something else (app/training/).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from app.models.catalog import ATTENTION_TOGGLES, SIZE_TOGGLES, Model
from core import InputError, TransformerConfig
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
class RunSpec:
    """A model, a text and the toggles: what every model view runs. None keeps the model's default.

    Built once from a request (app/api/requests.py `ModelRequest.spec()`) or from a page's URL."""

    model: str
    text: str
    causal: bool | None = None
    scale: bool | None = None
    temperature: float | None = None
    positional_embedding_type: str | None = None
    n_heads: int | None = None
    n_layers: int | None = None
    d_model: int | None = None
    seed: int | None = None
    ablate: tuple[AblatedHead, ...] = ()

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def toggles(self) -> dict[str, object]:
        """The toggles this spec sets (not left to the model), by name."""
        return {name: getattr(self, name) for name in ATTENTION_TOGGLES + SIZE_TOGGLES
                if getattr(self, name) is not None}


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
        return self.model.tokenizer.token_str(int(token_id))




def check_toggles(model: Model, given: dict[str, object]) -> None:
    refused = [k for k, v in given.items() if v is not None and k not in model.toggles]
    if "causal" in refused and not model.is_encoder and "local" in (model.cfg.attn_types or ()):
        raise InputError(f"model {model.name!r} does not accept causal: its local (sliding-window) attention layers "
                         f"see only the last {model.cfg.window_size} tokens before each query, which is defined "
                         f"under the causal mask only; it takes {', '.join(model.toggles)}")
    if refused:
        raise InputError(f"model {model.name!r} does not accept {', '.join(refused)}: it takes "
                         f"{', '.join(model.toggles) or 'no toggles'}"
                         + ("; the 'toy' model accepts every toggle" if model.name != "toy" else ""))


def configure(model: Model, spec: RunSpec, n_tokens: int) -> TransformerConfig:
    """The model's config with the spec's toggles applied."""
    check_toggles(model, {name: getattr(spec, name) for name in ATTENTION_TOGGLES + SIZE_TOGGLES})
    sizes = {k: getattr(spec, k) for k in ("n_heads", "n_layers", "d_model") if getattr(spec, k) is not None}
    cfg = model.configure(sizes, n_tokens)
    attention = {"attention_dir": None if spec.causal is None else ("causal" if spec.causal else "bidirectional"),
                 "use_attn_scale": spec.scale, "attn_temperature": spec.temperature,
                 "positional_embedding_type": spec.positional_embedding_type}
    attention = {k: v for k, v in attention.items() if v is not None}
    return cfg.replace(**attention) if attention else cfg


def ablation_map(ablate: tuple[AblatedHead, ...], cfg: TransformerConfig) -> dict[tuple[int, int], Method]:
    """The spec's ablations as core's {(layer, head): "zero"|"mean"}, checked against this model."""
    out: dict[tuple[int, int], Method] = {}
    for a in ablate:
        if a.layer >= cfg.n_layers or a.head >= cfg.n_heads:
            raise InputError(f"ablate: layer {a.layer} head {a.head} does not exist: this model has "
                             f"{cfg.n_layers} layer(s) of {cfg.n_heads} head(s), counted from 0")
        if (a.layer, a.head) in out:
            raise InputError(f"ablate: layer {a.layer} head {a.head} is listed twice: list each head once")
        out[(a.layer, a.head)] = a.method
    return out
