"""Counting parameters from a config, and the memory of a KV cache.

`count_params` derives every array's shape from the config alone (no weights needed, so
it works for GPT-2 XL) and says what it counts; a test checks it against the arrays that
`init_params` actually allocates, and against the spec's closed formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import TransformerConfig

# Bytes per element of the dtypes a KV cache is commonly stored in.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}


@dataclass(frozen=True)
class ParamEntry:
    name: str  # dotted name of the array, with {l} standing for every layer
    shape: tuple[int, ...]
    per_layer: bool  # one copy in every block
    counted: bool  # False for arrays that exist but add no parameters (tied, or buffers)
    note: str = ""

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def param_entries(cfg: TransformerConfig) -> list[ParamEntry]:
    """Every array of a model built from `cfg`, counted or not, in the order they are used."""
    d, h, dh, dm, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    ln = cfg.normalization_type == "LN"
    e: list[ParamEntry] = [ParamEntry("embed.W_E", (V, d), False, True, "token table")]
    if cfg.positional_embedding_type == "learned":
        e.append(ParamEntry("pos_embed.W_pos", (cfg.n_ctx, d), False, True, "learned position table"))
    else:
        e.append(ParamEntry("pos_embed", (0,), False, False,
                            f"{cfg.positional_embedding_type} positions have no parameters"))
    if cfg.n_token_types:
        e.append(ParamEntry("token_type_embed.W_token_type", (cfg.n_token_types, d), False, True, "segment table"))
    if cfg.block_type == "post_norm" and ln:
        e += [ParamEntry("ln_embed.w", (d,), False, True, "embedding layer norm gain"),
              ParamEntry("ln_embed.b", (d,), False, True, "embedding layer norm bias")]
    for sub, norm in (("attn", "ln1"),) if cfg.attn_only else (("attn", "ln1"), ("mlp", "ln2")):
        if ln:
            e += [ParamEntry(f"blocks.{{l}}.{norm}.w", (d,), True, True, "layer norm gain"),
                  ParamEntry(f"blocks.{{l}}.{norm}.b", (d,), True, True, "layer norm bias")]
        if sub == "attn":
            e.append(ParamEntry("blocks.{l}.attn.W_QKV", (d, 3 * h * dh), True, True, "queries, keys, values of all heads"))
            if cfg.bias:
                e.append(ParamEntry("blocks.{l}.attn.b_QKV", (3 * h * dh,), True, True, "their biases"))
            e.append(ParamEntry("blocks.{l}.attn.W_O", (h * dh, d), True, True, "output projection"))
            if cfg.bias:
                e.append(ParamEntry("blocks.{l}.attn.b_O", (d,), True, True, "its bias"))
            if cfg.causal:
                e.append(ParamEntry("blocks.{l}.attn.mask", (cfg.n_ctx, cfg.n_ctx), True, False,
                                    "causal mask: a constant, not learned (GPT-2 checkpoints store it as attn.bias)"))
        else:
            e.append(ParamEntry("blocks.{l}.mlp.W_in", (d, dm), True, True, "MLP up-projection"))
            if cfg.bias:
                e.append(ParamEntry("blocks.{l}.mlp.b_in", (dm,), True, True, "its bias"))
            e.append(ParamEntry("blocks.{l}.mlp.W_out", (dm, d), True, True, "MLP down-projection"))
            if cfg.bias:
                e.append(ParamEntry("blocks.{l}.mlp.b_out", (d,), True, True, "its bias"))
    if cfg.block_type == "pre_norm" and ln:
        e += [ParamEntry("ln_final.w", (d,), False, True, "final layer norm gain"),
              ParamEntry("ln_final.b", (d,), False, True, "final layer norm bias")]
    if cfg.tied_embeddings:
        e.append(ParamEntry("unembed.W_U", (d, V), False, False, "tied: the token table transposed, no new parameters"))
    else:
        e.append(ParamEntry("unembed.W_U", (d, V), False, True, "output layer"))
        if cfg.bias:
            e.append(ParamEntry("unembed.b_U", (V,), False, True, "output bias"))
    return e


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
    total = sum(x.size * (cfg.n_layers if x.per_layer else 1) for x in counted)
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
    formula: str = "2 (K and V) × n_layers × batch × seq_len × n_heads × d_head × bytes per element"


def kv_cache_bytes(cfg: TransformerConfig, seq_len: int, batch: int = 1, dtype: str = "float32") -> KVCacheSize:
    """Memory that caching every layer's keys and values of `seq_len` tokens takes."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    for name, value in (("seq_len", seq_len), ("batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    size = DTYPE_BYTES[dtype]
    total = 2 * cfg.n_layers * batch * seq_len * cfg.n_heads * cfg.d_head * size
    return KVCacheSize(total, cfg.n_layers, seq_len, batch, cfg.n_heads, cfg.d_head, size)
