"""The model configuration: one plain dataclass with TransformerLens names."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from .functional import ACTIVATIONS
from .positions import POSITION_SCHEMES

NORMALIZATION_TYPES = ("LN", "LNPre")  # LN: gain and bias; LNPre: neither (the spec's toy)
ATTENTION_DIRS = ("causal", "bidirectional")
BLOCK_TYPES = ("pre_norm", "post_norm")  # GPT-2 normalises a sub-layer's input, BERT its output


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 64  # width of the residual stream
    n_layers: int = 2
    n_heads: int = 4
    d_vocab: int = 65  # the spec's toy: 65 characters
    n_ctx: int = 64  # longest sequence; the size of a learned position table
    d_head: int | None = None  # None: d_model // n_heads
    d_mlp: int | None = None  # None: 4 * d_model, as in GPT-2
    act_fn: Literal["gelu_new", "gelu", "relu"] = "gelu_new"  # gelu_new is GPT-2's tanh GELU
    normalization_type: Literal["LN", "LNPre"] = "LN"
    positional_embedding_type: Literal["none", "sinusoidal", "learned", "rotary"] = "learned"
    attention_dir: Literal["causal", "bidirectional"] = "causal"
    use_attn_scale: bool = True  # divide scores by √d_head
    attn_temperature: float = 1.0  # scores are further divided by this before the softmax
    block_type: Literal["pre_norm", "post_norm"] = "pre_norm"
    bias: bool = True  # biases on every linear map (the spec's toy has none)
    tied_embeddings: bool = True  # unembedding is W_E transposed, as in GPT-2
    n_token_types: int = 0  # BERT's segment embeddings; 0 for decoders
    eps: float = 1e-5  # layer norm epsilon
    attn_only: bool = False  # blocks without an MLP (TransformerLens' name): the classic induction-head setting

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                    f"choose a width that is a multiple of the number of heads"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if not self.attn_only and (not isinstance(self.d_mlp, int) or self.d_mlp < 1):
            raise ValueError(f"d_mlp must be a positive integer, got {self.d_mlp!r} (or set attn_only for no MLP)")
        _check_choice("act_fn", self.act_fn, tuple(ACTIVATIONS))
        _check_choice("normalization_type", self.normalization_type, NORMALIZATION_TYPES)
        _check_choice("positional_embedding_type", self.positional_embedding_type, POSITION_SCHEMES)
        _check_choice("attention_dir", self.attention_dir, ATTENTION_DIRS)
        _check_choice("block_type", self.block_type, BLOCK_TYPES)
        if self.positional_embedding_type in ("sinusoidal", "rotary"):
            width, what = (self.d_model, "d_model") if self.positional_embedding_type == "sinusoidal" else (
                self.d_head, "d_head")
            if width % 2:
                raise ValueError(f"{self.positional_embedding_type} positions need an even {what}, got {width}")
        if not (self.attn_temperature > 0 and math.isfinite(self.attn_temperature)):
            raise ValueError(f"attn_temperature must be a positive finite number, got {self.attn_temperature}")

    @property
    def causal(self) -> bool:
        return self.attention_dir == "causal"

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed; derived sizes are re-derived unless given."""
        if "d_model" in changes or "n_heads" in changes:
            changes.setdefault("d_head", None)
        if "d_model" in changes:
            changes.setdefault("d_mlp", None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")


# Named configurations: the spec's toy and the four GPT-2 sizes (Radford et al., 2019).
PRESETS: dict[str, TransformerConfig] = {
    "toy": TransformerConfig(d_vocab=65, n_ctx=64, d_model=64, n_layers=2, n_heads=4),
    "gpt2-small": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=768, n_layers=12, n_heads=12),
    "gpt2-medium": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=1024, n_layers=24, n_heads=16),
    "gpt2-large": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=1280, n_layers=36, n_heads=20),
    "gpt2-xl": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=1600, n_layers=48, n_heads=25),
}
