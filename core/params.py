"""Counting parameters from a config, and the memory of a KV cache.

`count_params` derives every array's shape from the config alone (no weights needed, so
it works for GPT-2 XL) and says what it counts; a test checks it against the arrays that
`init_params` actually allocates, and against the spec's closed formula.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .config import TransformerConfig
from .errors import InputError
from .i18n import N_, _

# Bytes per element of the dtypes a KV cache is commonly stored in.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}


@dataclass(frozen=True)
class ParamEntry:
    name: str  # dotted name of the array, with {l} standing for every layer
    shape: tuple[int, ...]
    per_layer: bool  # one copy in every block
    counted: bool  # False for arrays that exist but add no parameters (tied, or buffers)
    template: str = ""  # what it is, in English (marked for the catalogue), with {names} from `args`
    copies: int = 1  # n_layers for a per-layer array, else 1
    args: tuple[tuple[str, object], ...] = ()

    @property
    def note(self) -> str:
        """What it is, in English (as the API states it)."""
        return self.template.format(**dict(self.args))

    def said(self) -> str:
        """What it is, in the reader's language (core/i18n.py)."""
        return _(self.template).format(**dict(self.args)) if self.template else ""

    @property
    def size(self) -> int:
        """Elements of one copy."""
        return math.prod(self.shape)

    @property
    def elements(self) -> int:
        """Elements of every copy, counted or not."""
        return self.size * self.copies

    @property
    def total(self) -> int:
        """Parameters this entry adds to the model's total: every copy, or 0 when not counted."""
        return self.elements if self.counted else 0


# A norm's arrays, said whole (a translation orders the words its own way): (where, norm type, which).
NORM_NOTES = {
    ("", "LN", "gain"): N_("layer norm gain"),
    ("", "LN", "bias"): N_("layer norm bias"),
    ("", "RMS", "gain"): N_("RMS norm gain"),
    ("", "RMS", "bias"): N_("RMS norm bias"),
    ("embedding", "LN", "gain"): N_("embedding layer norm gain"),
    ("embedding", "LN", "bias"): N_("embedding layer norm bias"),
    ("embedding", "RMS", "gain"): N_("embedding RMS norm gain"),
    ("embedding", "RMS", "bias"): N_("embedding RMS norm bias"),
    ("final", "LN", "gain"): N_("final layer norm gain"),
    ("final", "LN", "bias"): N_("final layer norm bias"),
    ("final", "RMS", "gain"): N_("final RMS norm gain"),
    ("final", "RMS", "bias"): N_("final RMS norm bias"),
}


def param_entries(cfg: TransformerConfig) -> list[ParamEntry]:
    """Every array of a model built from `cfg`, counted or not, in the order they are used."""
    d, h, kv, dh, dm, V = cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    norm_type = cfg.normalization_type if cfg.normalization_type in ("LN", "RMS") else None  # None: no parameters

    def norm(prefix: str, per_layer: bool, what: str = "") -> list[ParamEntry]:
        if norm_type is None:
            return []
        gain = [ParamEntry(f"{prefix}.w", (d,), per_layer, True, NORM_NOTES[what, norm_type, "gain"])]
        bias = [ParamEntry(f"{prefix}.b", (d,), per_layer, True, NORM_NOTES[what, norm_type, "bias"])]
        return gain + bias if cfg.normalization_type == "LN" else gain

    e: list[ParamEntry] = [ParamEntry("embed.W_E", (V, d), False, True, N_("token table"))]
    if cfg.positional_embedding_type == "learned":
        e.append(ParamEntry("pos_embed.W_pos", (cfg.n_ctx, d), False, True, N_("learned position table")))
    else:
        e.append(
            ParamEntry(
                "pos_embed",
                (0,),
                False,
                False,
                N_("{scheme} positions have no parameters"),
                args=(("scheme", cfg.positional_embedding_type),),
            )
        )
    if cfg.n_token_types:
        e.append(ParamEntry("token_type_embed.W_token_type", (cfg.n_token_types, d), False, True, N_("segment table")))
    if cfg.block_type == "post_norm":
        e += norm("ln_embed", False, "embedding")
    sublayers = (("attn", "blocks.{l}.ln1"),) + (() if cfg.attn_only else (("mlp", "blocks.{l}.ln2"),))
    for sub, norm_prefix in sublayers:
        e += norm(norm_prefix, True)
        if sub == "attn":
            if kv == h:
                e.append(
                    ParamEntry(
                        "blocks.{l}.attn.W_QKV", (d, 3 * h * dh), True, True, N_("queries, keys, values of all heads")
                    )
                )
                if cfg.qkv_bias:
                    e.append(ParamEntry("blocks.{l}.attn.b_QKV", (3 * h * dh,), True, True, N_("their biases")))
            else:
                e += [
                    ParamEntry("blocks.{l}.attn.W_Q", (d, h * dh), True, True, N_("queries of all heads")),
                    ParamEntry(
                        "blocks.{l}.attn.W_K",
                        (d, kv * dh),
                        True,
                        True,
                        N_("keys of the {kv} key/value heads (grouped-query attention)"),
                        args=(("kv", kv),),
                    ),
                    ParamEntry("blocks.{l}.attn.W_V", (d, kv * dh), True, True, N_("their values")),
                ]
                if cfg.qkv_bias:
                    e += [
                        ParamEntry(f"blocks.{{l}}.attn.b_{m}", (n * dh,), True, True, N_("its bias"))
                        for m, n in (("Q", h), ("K", kv), ("V", kv))
                    ]
            if cfg.use_qk_norm:
                e += [
                    ParamEntry(f"blocks.{{l}}.attn.{m}_norm.w", (dh,), True, True, what)
                    for m, what in (
                        ("q", N_("RMS norm gain of every head's query")),
                        ("k", N_("RMS norm gain of every head's key")),
                    )
                ]
            e.append(ParamEntry("blocks.{l}.attn.W_O", (h * dh, d), True, True, N_("output projection")))
            if cfg.attn_out_bias:
                e.append(ParamEntry("blocks.{l}.attn.b_O", (d,), True, True, N_("its bias")))
            if cfg.causal:
                e.append(
                    ParamEntry(
                        "blocks.{l}.attn.mask",
                        (cfg.n_ctx, cfg.n_ctx),
                        True,
                        False,
                        N_("causal mask: a constant, not learned (GPT-2 checkpoints store it as attn.bias)"),
                    )
                )
        else:
            if cfg.gated_mlp:
                e.append(ParamEntry("blocks.{l}.mlp.W_gate", (d, dm), True, True, N_("MLP gate projection")))
                if cfg.mlp_bias:
                    e.append(ParamEntry("blocks.{l}.mlp.b_gate", (dm,), True, True, N_("its bias")))
            e.append(ParamEntry("blocks.{l}.mlp.W_in", (d, dm), True, True, N_("MLP up-projection")))
            if cfg.mlp_bias:
                e.append(ParamEntry("blocks.{l}.mlp.b_in", (dm,), True, True, N_("its bias")))
            e.append(ParamEntry("blocks.{l}.mlp.W_out", (dm, d), True, True, N_("MLP down-projection")))
            if cfg.mlp_bias:
                e.append(ParamEntry("blocks.{l}.mlp.b_out", (d,), True, True, N_("its bias")))
    if cfg.block_type == "pre_norm":
        e += norm("ln_final", False, "final")
    if cfg.tied_embeddings:
        e.append(
            ParamEntry("unembed.W_U", (d, V), False, False, N_("tied: the token table transposed, no new parameters"))
        )
    else:
        e.append(ParamEntry("unembed.W_U", (d, V), False, True, N_("output layer")))
        if cfg.unembed_bias:
            e.append(ParamEntry("unembed.b_U", (V,), False, True, N_("output bias")))
    return [dataclasses.replace(x, copies=cfg.n_layers) if x.per_layer else x for x in e]


@dataclass(frozen=True)
class ParamCount:
    embeddings: int  # token (+ position, + segment) tables
    per_block: int
    total: int
    entries: list[ParamEntry]


def count_params(cfg: TransformerConfig) -> ParamCount:
    entries = param_entries(cfg)
    counted = [x for x in entries if x.counted]
    embeddings = sum(x.size for x in counted if x.name.split(".")[0] in ("embed", "pos_embed", "token_type_embed"))
    per_block = sum(x.size for x in counted if x.per_layer)
    total = sum(x.total for x in entries)
    return ParamCount(embeddings, per_block, total, entries)


def gpt_params(vocab: int, n_ctx: int, d: int, n_layers: int, d_ff: int | None = None) -> tuple[int, int, int]:
    """The spec's closed formula for a GPT-2-style model: (embeddings, per block, total)."""
    d_ff = d_ff or 4 * d
    embed = vocab * d + n_ctx * d  # token + learned position tables
    attn = d * 3 * d + 3 * d + d * d + d  # W_qkv, biases, W_o, bias
    mlp = d * d_ff + d_ff + d_ff * d + d  # two linear layers with biases
    norms = 2 * 2 * d  # two layer norms (scale + shift)
    block = attn + mlp + norms
    total = embed + n_layers * block + 2 * d  # + final layer norm
    return embed, block, total  # output layer shares the token table


@dataclass(frozen=True)
class KVCacheSize:
    bytes: int
    n_layers: int
    seq_len: int
    batch: int
    n_kv_heads: int
    d_head: int
    dtype_bytes: int
    formula: str = (
        "2 (K and V) × n_layers × batch × seq_len × n_key_value_heads × d_head × bytes per element "
        "(n_key_value_heads = n_heads unless grouped-query attention shares them)"
    )


def kv_cache_bytes(cfg: TransformerConfig, seq_len: int, batch: int = 1, dtype: str = "float32") -> KVCacheSize:
    """Memory that caching every layer's keys and values of `seq_len` tokens takes."""
    if dtype not in DTYPE_BYTES:
        raise InputError(
            _("dtype={dtype!r} is not one of {choices}").format(dtype=dtype, choices=", ".join(DTYPE_BYTES))
        )
    for name, value in (("seq_len", seq_len), ("batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise InputError(_("{name} must be a positive integer, got {value!r}").format(name=name, value=value))
    size = DTYPE_BYTES[dtype]
    total = 2 * cfg.n_layers * batch * seq_len * cfg.n_key_value_heads * cfg.d_head * size
    return KVCacheSize(total, cfg.n_layers, seq_len, batch, cfg.n_key_value_heads, cfg.d_head, size)


# ---------------------------------------------------------------------------- the work of a forward pass


def forward_work(
    cfg: TransformerConfig, n_tokens: int, *, logits: bool = True, n_past: int = 0, stop_at_layer: int | None = None
) -> int:
    """Multiply-adds of one forward pass over `n_tokens` new tokens (after `n_past` cached ones), through
    stop_at_layer blocks when it stops there (core.model.forward's; no logits then).

    Every block parameter is used once per token (count_params' per_block: weights, and the few
    biases and gains, which the count does not try to separate); then QKᵀ and pattern @ V, each
    n_heads × d_head per query and visible key (all earlier keys counted, as core computes them
    before masking; a local layer's queries see at most window_size keys); then the unembedding
    (d_model × d_vocab per token) unless the pass stops before the logits. Grouped-query
    attention and gated MLPs enter through per_block, which counts their own weights.
    """
    per_block = count_params(cfg).per_block
    n_keys = n_past + n_tokens
    layers = cfg.n_layers if stop_at_layer is None else stop_at_layer
    attention = 0
    for layer in range(layers):
        window = cfg.window(layer)
        visible = n_keys if window is None else min(n_keys, window)
        attention += 2 * n_tokens * visible * cfg.n_heads * cfg.d_head
    matmuls = n_tokens * per_block * layers
    return matmuls + attention + (n_tokens * cfg.d_model * cfg.d_vocab if logits and stop_at_layer is None else 0)


def largest_array(cfg: TransformerConfig, n_tokens: int, n_past: int = 0, *, weights: bool = True) -> int:
    """Elements of the biggest array a forward pass holds: one layer's scores, or a weight matrix.

    weights=False leaves the weight matrices out, for weights that exist before the pass (a loaded
    checkpoint's); then the biggest is a layer's scores or its MLP activations."""
    activations = max(cfg.n_heads * n_tokens * (n_past + n_tokens), n_tokens * cfg.d_mlp)
    if not weights:
        return activations
    qkv_width = (cfg.n_heads + 2 * cfg.n_key_value_heads) * cfg.d_head
    tables = [cfg.d_vocab * cfg.d_model] + (
        [cfg.n_ctx * cfg.d_model] if cfg.positional_embedding_type == "learned" else []
    )
    return max(activations, cfg.d_model * qkv_width, cfg.d_model * cfg.d_mlp, *tables)
