"""The calculators (/params, /api/v1/params, /api/v1/kv-cache) and the "Counting parameters" lesson:
parameter counts and KV-cache sizes of a preset or any sizes. Pure functions of their arguments: they
need no catalogue and no settings (core.params counts; nothing here is a forward pass)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core import PRESETS, TransformerConfig
from core.i18n import N_
from core.params import DTYPE_BYTES, KVCacheSize, ParamCount, count_params, gpt_params, kv_cache_bytes

# A model's shape fields as a request gives them (the sizes and switches of calc_config; None: the preset's).
Sizes = dict[str, int | bool | str | None]


@dataclass(frozen=True)
class ParamGroup:
    """Parameters gathered into one of the spec's components (token table, attention weights...)."""

    name: str
    size: int  # parameters, or what it would cost when not counted
    counted: bool
    note: str


@dataclass(frozen=True)
class ParamsLessonRow:
    name: str
    cfg: TransformerConfig
    count: ParamCount


@dataclass(frozen=True)
class ParamsLessonResult:
    name: str  # the preset's name, or "your model"
    rows: list[ParamsLessonRow]  # the toy, then this model
    rule: int  # 12 d², the rule of thumb for a block
    rule_gap: float  # |per_block − rule| / per_block
    embedding_share: float  # embeddings / total
    groups: list[ParamGroup]
    spec_sizes: dict[str, tuple[int, ...]]  # (vocab, n_ctx, d, n_layers[, d_ff]) per row, as gpt_params takes them


@dataclass(frozen=True)
class ParamsResult:
    config: TransformerConfig
    count: ParamCount

    def __getattr__(self, name: str):  # embeddings, per_block, total
        return getattr(self.count, name)

    @property
    def breakdown(self) -> list:  # core.params.ParamEntry: name, shape, per_layer, counted, size, total, note
        return self.count.entries


@dataclass(frozen=True)
class KVCacheTerms:
    n_layers: int
    batch: int
    seq_len: int
    n_heads: int  # query heads
    n_key_value_heads: int  # the heads that keep keys and values
    d_head: int
    dtype_bytes: int


@dataclass(frozen=True)
class KVCacheResult:
    config: TransformerConfig
    size: KVCacheSize
    dtype: str

    @property
    def bytes(self) -> int:
        return self.size.bytes

    @property
    def formula(self) -> str:
        return self.size.formula

    @property
    def terms(self) -> KVCacheTerms:
        k = self.size
        return KVCacheTerms(k.n_layers, k.batch, k.seq_len, self.config.n_heads, k.n_kv_heads, k.d_head, k.dtype_bytes)


@dataclass(frozen=True)
class CalculatorResult:
    cfg: TransformerConfig
    count: ParamCount
    groups: list[ParamGroup]
    weights_bytes: int  # float32
    kv: KVCacheSize
    lengths: list[int]  # the cache chart's sequence lengths
    ticks: list[int]  # the lengths labelled on its axis
    kv_by_dtype: dict[str, list[int]]  # bytes at each length, per dtype


def params(preset: str | None, sizes: Sizes) -> ParamsResult:
    """Count a preset's parameters, with any given sizes replacing its own, array by array."""
    cfg = calc_config(preset, **sizes)
    return ParamsResult(cfg, count_params(cfg))


def kv_cache(preset: str | None, sizes: Sizes, seq_len: int | None, batch: int, dtype: str) -> KVCacheResult:
    """The memory of a KV cache of `seq_len` tokens (default: the model's context)."""
    cfg = calc_config(preset, **sizes)
    return KVCacheResult(cfg, kv_cache_size(cfg, seq_len, batch, dtype), dtype)


def params_lesson(preset: str, sizes: Sizes) -> ParamsLessonResult:
    """The spec's "Counting parameters" lesson: the toy and this model, and the 12 d² rule of thumb."""
    toy_cfg = calc_config("toy")
    cfg = calc_config(preset, **sizes)
    name = {"gpt2-small": "GPT-2 small"}.get(preset, preset) if cfg == PRESETS[preset] else "your model"
    rows = [ParamsLessonRow(label, c, count_params(c)) for label, c in (("toy", toy_cfg), (name, cfg))]
    mine = rows[1].count
    rule = 12 * cfg.d_model * cfg.d_model
    return ParamsLessonResult(
        name,
        rows,
        rule,
        abs(mine.per_block - rule) / mine.per_block,
        mine.embeddings / mine.total,
        param_groups(mine),
        {r.name: _spec_sizes(r.cfg) for r in rows},
    )


def calculator(preset: str | None, sizes: Sizes, seq_len: int | None, batch: int, dtype: str) -> CalculatorResult:
    """The parameter count of one configuration, and its KV cache at this length and at every power of two."""
    cfg = calc_config(preset, **sizes)
    count = count_params(cfg)
    kv = kv_cache_size(cfg, seq_len, batch, dtype)
    top = max(cfg.n_ctx, kv.seq_len)
    lengths = sorted({2**k for k in range(int(math.log2(top)) + 1)} | {cfg.n_ctx, kv.seq_len})
    powers = [n for n in lengths if n & (n - 1) == 0]
    ticks = powers[:: max(1, math.ceil(len(powers) / 8))]  # at most about 8 labels
    by_dtype = {d: [kv_cache_size(cfg, n, batch, d).bytes for n in lengths] for d in DTYPE_BYTES}
    return CalculatorResult(
        cfg, count, param_groups(count), count.total * DTYPE_BYTES["float32"], kv, lengths, ticks, by_dtype
    )


def calc_config(preset: str | None, **sizes: int | bool | str | None) -> TransformerConfig:
    """A preset (default "toy") with any given sizes (and switches) replacing its own.

    Heads split d_model without changing any count; when a new d_model is not a multiple of
    the preset's heads (and no d_head is given), one head is assumed, with one key/value head.
    """
    base = PRESETS[preset or "toy"]
    changes = {k: v for k, v in sizes.items() if v is not None}
    if (
        "n_heads" not in changes
        and "d_head" not in changes
        and "d_model" in changes
        and changes["d_model"] % base.n_heads
    ):
        changes["n_heads"] = 1
        changes.setdefault("n_key_value_heads", 1)
    return base.replace(**changes) if changes else base


def kv_cache_size(cfg: TransformerConfig, seq_len: int | None, batch: int, dtype: str) -> KVCacheSize:
    return kv_cache_bytes(cfg, seq_len if seq_len is not None else cfg.n_ctx, batch, dtype)


def _spec_sizes(cfg: TransformerConfig) -> tuple[int, ...]:
    """(vocab, n_ctx, d, n_layers[, d_ff]) as the spec's gpt_params takes them."""
    sizes = (cfg.d_vocab, cfg.n_ctx, cfg.d_model, cfg.n_layers)
    return sizes + ((cfg.d_mlp,) if cfg.d_mlp != 4 * cfg.d_model else ())


# The presets the spec's closed formula counts exactly (GPT-2's design: learned positions, biases,
# layer norms, an ungated MLP): the "Counting parameters" lesson offers these; the calculator, all.
SPEC_FORMULA_PRESETS = tuple(
    name for name, cfg in PRESETS.items() if gpt_params(*_spec_sizes(cfg))[2] == count_params(cfg).total
)


def param_groups(count: ParamCount) -> list[ParamGroup]:
    """The count's entries gathered into the spec's components. An uncounted component keeps what it
    would cost, so a chart can say why it costs nothing."""
    groups: dict[str, list] = {}
    for e in count.entries:
        leaf = e.name.rsplit(".", 1)[-1]
        if not e.counted:
            name = (
                N_("unembedding (tied)")
                if e.name.startswith("unembed")
                else (N_("causal mask buffers") if leaf == "mask" else e.name)
            )
        elif e.name.startswith("embed"):
            name = N_("token table")
        elif e.name.startswith(("pos_embed", "token_type_embed")):
            name = N_("position table") if e.name.startswith("pos_embed") else N_("segment table")
        elif ".ln" in e.name or e.name.startswith(("ln_final", "ln_embed")):
            name = N_("layer norms (gain + bias)")
        elif ".attn." in e.name:
            name = N_("attention biases") if leaf.startswith("b_") else N_("attention weights")
        elif ".mlp." in e.name:
            name = N_("MLP biases") if leaf.startswith("b_") else N_("MLP weights")
        else:
            name = N_("unembedding bias") if leaf.startswith("b_") else N_("unembedding")
        g = groups.setdefault(name, [0, e.counted, e.note])
        g[0] += e.size * e.copies
    return [ParamGroup(name, size, counted, note) for name, (size, counted, note) in groups.items() if size]
