"""The model configuration: one plain dataclass with TransformerLens names."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .errors import InputError
from .functional import ACTIVATIONS
from .i18n import _
from .positions import POSITION_SCHEMES

# LN: layer norm with gain and bias; LNPre: neither (the spec's toy); RMS: root-mean-square norm with
# a gain (Llama, Mistral, Qwen); RMSPre: RMS norm without a gain.
NORMALIZATION_TYPES = ("LN", "LNPre", "RMS", "RMSPre")
ATTN_TYPES = ("global", "local")  # per layer: see every earlier token, or only the last window_size
ATTENTION_DIRS = ("causal", "bidirectional")
BLOCK_TYPES = ("pre_norm", "post_norm")  # GPT-2 normalises a sub-layer's input, BERT its output

ActFn = Literal["gelu_new", "gelu", "relu", "silu"]  # core.functional.ACTIVATIONS' names

# A size that may be given as None and that __post_init__ resolves (d_head, d_mlp, n_key_value_heads): None
# in the constructor and in the JSON schema of a config, an int in every config once made, which is what the
# type checker is told (so that each use need not test for None).
if TYPE_CHECKING:
    ResolvedInt = int
else:
    ResolvedInt = int | None


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 64  # width of the residual stream
    n_layers: int = 2
    n_heads: int = 4
    d_vocab: int = 65  # the spec's toy: 65 characters
    n_ctx: int = 64  # longest sequence; the size of a learned position table
    d_head: ResolvedInt = None  # type: ignore[assignment]  # None: d_model // n_heads
    d_mlp: ResolvedInt = None  # type: ignore[assignment]  # None: 4 * d_model, as in GPT-2
    act_fn: ActFn = "gelu_new"  # gelu_new is GPT-2's tanh GELU
    normalization_type: Literal["LN", "LNPre", "RMS", "RMSPre"] = "LN"
    positional_embedding_type: Literal["none", "sinusoidal", "learned", "rotary"] = "learned"
    attention_dir: Literal["causal", "bidirectional"] = "causal"
    use_attn_scale: bool = True  # divide scores by √d_head
    attn_temperature: float = 1.0  # scores are further divided by this before the softmax
    block_type: Literal["pre_norm", "post_norm"] = "pre_norm"
    bias: bool = True  # biases on every linear map (the spec's toy has none)
    tied_embeddings: bool = True  # unembedding is W_E transposed, as in GPT-2
    n_token_types: int = 0  # BERT's segment embeddings; 0 for decoders
    eps: float = 1e-5  # epsilon of every norm
    attn_only: bool = False  # blocks without an MLP (TransformerLens' name): the classic induction-head setting
    # Switches of other decoder families (Llama, Qwen, Mistral, GPT-NeoX, GPT-Neo); each default is
    # GPT-2's behaviour, so a config that leaves them alone is the model it always was.
    n_key_value_heads: ResolvedInt = None  # type: ignore[assignment]  # grouped-query attention: K and V heads, each shared by
    # n_heads / n_key_value_heads query heads (None: n_heads, one per query head)
    gated_mlp: bool = False  # SwiGLU-style MLP: act(x @ W_gate) * (x @ W_in), then W_out
    rotary_dim: int | None = None  # rotary: dimensions of each head that are rotated (None: d_head)
    rotary_base: float = 10000.0  # rotary: the angle of pair i at position p is p · base^(-2i/rotary_dim)
    rotary_adjacent_pairs: bool = True  # rotary pairs (2i, 2i+1); False: (i, i + rotary_dim/2), NeoX/Llama
    parallel_attn_mlp: bool = False  # GPT-NeoX: attention and MLP both read the block's input, x + attn + mlp
    window_size: int | None = None  # the span of a local attention layer (tokens, itself included)
    attn_types: tuple[str, ...] | None = None  # per layer "global" or "local" (None: all global)
    use_qk_norm: bool = False  # Qwen3: RMS-normalise each head's query and key (gain over d_head)
    qkv_bias: bool | None = None  # biases of Q, K, V (None: as `bias`; Qwen2 has them without b_O)
    attn_out_bias: bool | None = None  # bias of W_O (None: as `bias`)
    mlp_bias: bool | None = None  # biases of the MLP (None: as `bias`)
    unembed_bias: bool | None = None  # b_U of an untied unembedding (None: as `bias`)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(_("{name} must be a positive integer, got {value!r}").format(name=name, value=value))
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise InputError(
                    _(
                        "d_model={d_model} is not divisible by n_heads={n_heads}: choose a width that "
                        "is a multiple of the number of heads"
                    ).format(d_model=self.d_model, n_heads=self.n_heads)
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if not self.attn_only and (not isinstance(self.d_mlp, int) or self.d_mlp < 1):
            raise InputError(
                _("d_mlp must be a positive integer, got {d_mlp!r} (or set attn_only for no MLP)").format(
                    d_mlp=self.d_mlp
                )
            )
        _check_choice("act_fn", self.act_fn, tuple(ACTIVATIONS))
        _check_choice("normalization_type", self.normalization_type, NORMALIZATION_TYPES)
        _check_choice("positional_embedding_type", self.positional_embedding_type, POSITION_SCHEMES)
        _check_choice("attention_dir", self.attention_dir, ATTENTION_DIRS)
        _check_choice("block_type", self.block_type, BLOCK_TYPES)
        if self.positional_embedding_type in ("sinusoidal", "rotary"):
            width, what = (
                (self.d_model, "d_model") if self.positional_embedding_type == "sinusoidal" else (self.d_head, "d_head")
            )
            if width % 2:
                raise InputError(
                    _("{kind} positions need an even {what}, got {width}").format(
                        kind=self.positional_embedding_type, what=what, width=width
                    )
                )
        if not (self.attn_temperature > 0 and math.isfinite(self.attn_temperature)):
            raise InputError(
                _("attn_temperature must be a positive finite number, got {attn_temperature}").format(
                    attn_temperature=self.attn_temperature
                )
            )
        self._check_families()

    def _check_families(self) -> None:
        """Validate the other families' switches and resolve their None defaults."""
        if self.n_key_value_heads is None:
            object.__setattr__(self, "n_key_value_heads", self.n_heads)
        kv = self.n_key_value_heads
        if not _is_int(kv) or kv < 1:
            raise InputError(_("n_key_value_heads must be a positive integer, got {kv!r}").format(kv=kv))
        if self.n_heads % kv:
            raise InputError(
                _(
                    "n_heads={n_heads} is not divisible by n_key_value_heads={kv}: each "
                    "key/value head serves an equal group of query heads, so choose a "
                    "divisor of {n_heads}"
                ).format(n_heads=self.n_heads, kv=kv)
            )
        if self.positional_embedding_type == "rotary":
            rd = self.d_head if self.rotary_dim is None else self.rotary_dim
            object.__setattr__(self, "rotary_dim", rd)
            if not _is_int(rd) or rd < 2 or rd % 2 or rd > self.d_head:
                raise InputError(
                    _(
                        "rotary_dim={rd!r} must be an even number of dimensions between 2 "
                        "and d_head={d_head}: rotary turns pairs of a head's dimensions"
                    ).format(rd=rd, d_head=self.d_head)
                )
        else:
            object.__setattr__(self, "rotary_dim", None)  # only rotary positions rotate anything
        base = self.rotary_base
        if not (isinstance(base, (int, float)) and base > 1 and math.isfinite(base)):
            raise InputError(
                _("rotary_base must be a finite number above 1, got {rotary_base!r}").format(
                    rotary_base=self.rotary_base
                )
            )
        if self.window_size is not None and (not _is_int(self.window_size) or self.window_size < 1):
            raise InputError(
                _("window_size must be a positive number of tokens, got {window_size!r}").format(
                    window_size=self.window_size
                )
            )
        if self.attn_types is not None:
            types = tuple(self.attn_types) if isinstance(self.attn_types, (list, tuple)) else None
            if types is None or len(types) != self.n_layers:
                raise InputError(
                    _("attn_types needs one entry per layer ({n_layers}), got {attn_types!r}").format(
                        n_layers=self.n_layers, attn_types=self.attn_types
                    )
                )
            for t in types:
                _check_choice("attn_types entry", t, ATTN_TYPES)
            object.__setattr__(self, "attn_types", types)
            if "local" in types and self.window_size is None:
                raise InputError(_("local attention layers need a window_size (how many tokens each one sees)"))
            if "local" in types and not self.causal:
                raise InputError(
                    _("local attention layers see the last window_size tokens: they need causal attention")
                )
        if self.parallel_attn_mlp and self.block_type != "pre_norm":
            raise InputError(
                _("parallel_attn_mlp needs a pre-norm block: attention and MLP both read the block's normalised input")
            )
        for name in ("qkv_bias", "attn_out_bias", "mlp_bias", "unembed_bias"):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, self.bias)
            elif not isinstance(value, bool):
                raise InputError(_("{name} must be true, false or null, got {value!r}").format(name=name, value=value))

    def attn_type(self, layer: int) -> str:
        """ "global" or "local" for one layer."""
        return "global" if self.attn_types is None else self.attn_types[layer]

    def window(self, layer: int) -> int | None:
        """The number of tokens one layer's queries may see (itself included), or None: all of them."""
        return self.window_size if self.attn_type(layer) == "local" else None

    @property
    def group_size(self) -> int:
        """Query heads that share one key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_key_value_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head `head` reads (consecutive query heads share one)."""
        return head // self.group_size

    @property
    def causal(self) -> bool:
        return self.attention_dir == "causal"

    def replace(self, **changes) -> TransformerConfig:
        """A copy with some fields changed; derived sizes are re-derived unless given.

        A model with one K/V head per query head keeps that when n_heads changes; a rotary
        dimension covering the whole head keeps covering it; the per-layer attention types repeat
        their pattern when n_layers changes; the bias switches follow a changed `bias`."""
        if "d_model" in changes or "n_heads" in changes:
            changes.setdefault("d_head", None)
        if "d_model" in changes:
            changes.setdefault("d_mlp", None)
        if "n_heads" in changes and self.n_key_value_heads == self.n_heads:
            changes.setdefault("n_key_value_heads", None)
        if ("d_head" in changes or "positional_embedding_type" in changes) and self.rotary_dim == self.d_head:
            changes.setdefault("rotary_dim", None)
        if "n_layers" in changes and self.attn_types is not None and "attn_types" not in changes:
            n = changes["n_layers"]
            if _is_int(n) and n > 0:
                changes["attn_types"] = tuple(self.attn_types[i % len(self.attn_types)] for i in range(n))
        if "bias" in changes:
            for name in ("qkv_bias", "attn_out_bias", "mlp_bias", "unembed_bias"):
                changes.setdefault(name, None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(
            _("{name}={value!r} is not one of {choices}").format(name=name, value=value, choices=", ".join(choices))
        )


def _llama_like(**sizes) -> TransformerConfig:
    """Llama's design (Touvron et al., 2023), which SmolLM2, TinyLlama and Qwen share: RMS norms,
    a SwiGLU MLP, rotary in the rotate-half layout, no biases."""
    return TransformerConfig(
        normalization_type="RMS",
        gated_mlp=True,
        act_fn="silu",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        bias=False,
        **sizes,
    )


# Named configurations: the spec's toy and the four GPT-2 sizes (Radford et al., 2019), then the
# small open decoders of other families, with the sizes of their Hugging Face config.json
# (tests/core/test_params.py checks each count against transformers' own).
PRESETS: dict[str, TransformerConfig] = {
    "toy": TransformerConfig(d_vocab=65, n_ctx=64, d_model=64, n_layers=2, n_heads=4),
    "gpt2-small": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=768, n_layers=12, n_heads=12),
    "gpt2-medium": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=1024, n_layers=24, n_heads=16),
    "gpt2-large": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=1280, n_layers=36, n_heads=20),
    "gpt2-xl": TransformerConfig(d_vocab=50257, n_ctx=1024, d_model=1600, n_layers=48, n_heads=25),
    "smollm2-135m": _llama_like(
        d_vocab=49152,
        n_ctx=8192,
        d_model=576,
        n_layers=30,
        n_heads=9,
        n_key_value_heads=3,
        d_mlp=1536,
        rotary_base=100000.0,
        eps=1e-5,
    ),
    "tinyllama-1.1b": _llama_like(
        d_vocab=32000,
        n_ctx=2048,
        d_model=2048,
        n_layers=22,
        n_heads=32,
        n_key_value_heads=4,
        d_mlp=5632,
        rotary_base=10000.0,
        eps=1e-5,
        tied_embeddings=False,
    ),
    "qwen2.5-0.5b": _llama_like(
        d_vocab=151936,
        n_ctx=32768,
        d_model=896,
        n_layers=24,
        n_heads=14,
        n_key_value_heads=2,
        d_mlp=4864,
        rotary_base=1000000.0,
        eps=1e-6,
        qkv_bias=True,
    ),
    "qwen3-0.6b": _llama_like(
        d_vocab=151936,
        n_ctx=40960,
        d_model=1024,
        n_layers=28,
        n_heads=16,
        n_key_value_heads=8,
        d_head=128,
        d_mlp=3072,
        rotary_base=1000000.0,
        eps=1e-6,
        use_qk_norm=True,
    ),
    # GPT-NeoX (Black et al., 2022): parallel attention and MLP, a quarter of each head rotated.
    "pythia-70m": TransformerConfig(
        d_vocab=50304,
        n_ctx=2048,
        d_model=512,
        n_layers=6,
        n_heads=8,
        d_mlp=2048,
        act_fn="gelu",
        positional_embedding_type="rotary",
        rotary_dim=16,
        rotary_adjacent_pairs=False,
        parallel_attn_mlp=True,
        tied_embeddings=False,
        unembed_bias=False,
    ),
    # GPT-Neo: learned positions, unscaled scores, local (256-token) layers between global ones.
    "tinystories-33m": TransformerConfig(
        d_vocab=50257,
        n_ctx=2048,
        d_model=768,
        n_layers=4,
        n_heads=16,
        use_attn_scale=False,
        attn_types=("global", "local") * 2,
        window_size=256,
        qkv_bias=False,
        unembed_bias=False,
    ),
}
