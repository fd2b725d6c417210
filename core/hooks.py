"""Activation names: what a run caches, in TransformerLens' names, and each one's shape; and
PassContext, what one forward pass records under those names.

Every family has the same names (DESIGN.md); a config only decides which of them a run makes
(rotary's hook_rot_q/k, a gated MLP's hook_pre_linear, a pre-norm model's ln_final.hook_normalized).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .config import TransformerConfig
from .threads import SERIAL, Team


def hook_names(cfg: TransformerConfig) -> list[str]:
    """The activation names a full run caches, in the order the forward pass makes them."""
    names = ["hook_embed"]
    if cfg.positional_embedding_type in ("learned", "sinusoidal"):
        names.append("hook_pos_embed")
    if cfg.n_token_types:
        names.append("hook_token_type_embed")
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        names += [b + "hook_resid_pre", b + "attn.hook_q", b + "attn.hook_k", b + "attn.hook_v"]
        if cfg.positional_embedding_type == "rotary":
            names += [b + "attn.hook_rot_q", b + "attn.hook_rot_k"]
        names += [b + "attn.hook_attn_scores", b + "attn.hook_pattern", b + "attn.hook_z", b + "hook_attn_out"]
        if not cfg.attn_only:  # an attention-only block adds attn_out straight to resid_post (as TransformerLens)
            names += [b + "hook_resid_mid", b + "mlp.hook_pre"]
            if cfg.gated_mlp:
                names.append(b + "mlp.hook_pre_linear")
            names += [b + "mlp.hook_post", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    if cfg.block_type == "pre_norm":
        names.append("ln_final.hook_normalized")
    return names


# Shapes of each hook, in TransformerLens' axis names (no batch axis here). The head axis of
# hook_k, hook_v and hook_rot_k counts key/value heads: n_key_value_heads, which is n_heads
# except under grouped-query attention (hook_shape(name, cfg) then says kv_head_index).
HOOK_SHAPES = {
    "hook_embed": "[pos, d_model]",
    "hook_pos_embed": "[pos, d_model]",
    "hook_token_type_embed": "[pos, d_model]",
    "hook_resid_pre": "[pos, d_model]",
    "attn.hook_q": "[pos, head_index, d_head]",
    "attn.hook_k": "[pos, head_index, d_head]",
    "attn.hook_v": "[pos, head_index, d_head]",
    "attn.hook_rot_q": "[pos, head_index, d_head]",
    "attn.hook_rot_k": "[pos, head_index, d_head]",
    "attn.hook_attn_scores": "[head_index, query_pos, key_pos]",
    "attn.hook_pattern": "[head_index, query_pos, key_pos]",
    "attn.hook_z": "[pos, head_index, d_head]",
    "hook_attn_out": "[pos, d_model]",
    "hook_resid_mid": "[pos, d_model]",
    "mlp.hook_pre": "[pos, d_mlp]",  # x @ W_in, or x @ W_gate in a gated MLP (as TransformerLens names them)
    "mlp.hook_pre_linear": "[pos, d_mlp]",  # gated MLP only: x @ W_in, multiplied by act(hook_pre)
    "mlp.hook_post": "[pos, d_mlp]",
    "hook_mlp_out": "[pos, d_model]",
    "hook_resid_post": "[pos, d_model]",
    "ln_final.hook_normalized": "[pos, d_model]",
}


KV_HOOKS = ("attn.hook_k", "attn.hook_v", "attn.hook_rot_k")  # their head axis counts key/value heads


def hook_shape(name: str, cfg: TransformerConfig | None = None) -> str:
    """The axis names of a hook: "blocks.3.attn.hook_q" -> "[pos, head_index, d_head]".

    Given a config with grouped-query attention, the keys' and values' head axis is named
    kv_head_index (n_key_value_heads long)."""
    key = name.split(".", 2)[2] if name.startswith("blocks.") else name
    if cfg is not None and key in KV_HOOKS and cfg.n_key_value_heads != cfg.n_heads:
        return "[pos, kv_head_index, d_head]"
    return HOOK_SHAPES[key]


def hook_dims(name: str, cfg: TransformerConfig, n_tokens: int, n_keys: int | None = None) -> tuple[int, ...]:
    """A hook's concrete shape for a run of `n_tokens` tokens (`n_keys`: with a KV cache's tokens too)."""
    sizes = {
        "pos": n_tokens,
        "query_pos": n_tokens,
        "key_pos": n_tokens if n_keys is None else n_keys,
        "head_index": cfg.n_heads,
        "kv_head_index": cfg.n_key_value_heads,
        "d_head": cfg.d_head,
        "d_model": cfg.d_model,
        "d_mlp": cfg.d_mlp,
        "d_vocab": cfg.d_vocab,
    }
    return tuple(sizes[a] for a in hook_shape(name, cfg).strip("[]").split(", "))


def layers_needed(names: Iterable[str], cfg: TransformerConfig) -> int:
    """How many blocks a pass must run to make every hook named: one past the last block named (0 for the
    embeddings alone; L for blocks.L.hook_resid_pre, the stream entering block L), every block for ln_final's.
    A pass that keeps only these and no logits may stop there (forward's stop_at_layer): an SAE on the first
    layer of a 12-layer model needs 1 of the 12."""
    needed = 0
    for name in names:
        if name.startswith("blocks."):
            _blocks, layer, hook = name.split(".", 2)
            # a block's resid_pre is the stream the blocks before it made (a pass that stops there makes it)
            needed = max(needed, int(layer) + (hook != "hook_resid_pre"))
        elif not name.startswith("hook_"):  # ln_final.hook_normalized: after every block
            needed = cfg.n_layers
    return needed


# ---------------------------------------------------------------------------- what a pass records


class PassContext:
    """What one forward pass records, handed down the model's functions as one object (`ctx`).

    ctx.hook(name, value): every activation passes through it as it is made (TransformerLens' hook
        points): `edit(name, value)` may change it (activation patching, core/patching.py), then it is
        kept in ctx.cache if `names` asks for it (None: every name). References are kept, not copies.
    ctx.wants(name): whether it is kept; the blocks skip what nobody keeps (attention's
        [n_heads, pos, pos] scores and pattern, the largest activations).
    ctx.team (core/threads.py): the threads that share each step's rows or blocks.
    ctx.empty(name, shape, dtype): the memory for the activation `name`, about to be made.

    Memory: a kept activation of some size is a slice of a 32 MiB block starting on a 2 MiB boundary,
    for which NumPy asks the kernel for huge pages: keeping every activation then costs a page fault per
    2 MiB instead of one per 4 KiB (GPT-2 small at 512 tokens: ~45,000 faults, most of what a full
    capture cost beyond the logits-only pass, whose freed temporaries are reused without faults)."""

    BLOCK_BYTES = 32 << 20
    HUGE_PAGE = 2 << 20
    SMALL_BYTES = 64 << 10  # below this an activation comes from the heap as usual
    # Activations that are dead before the next layer makes its own (nothing else points at them: the KV
    # cache holds the keys and values, the next layer reads hook_resid_post). Not kept, one array of each
    # serves every layer, so a long pass does not ask the kernel for fresh pages layer after layer.
    REUSED = frozenset(
        {
            "attn.hook_rot_q",
            "attn.hook_z",
            "hook_attn_out",
            "hook_resid_mid",
            "mlp.hook_pre",
            "mlp.hook_pre_linear",
            "mlp.hook_post",
            "hook_mlp_out",
        }
    )

    def __init__(
        self,
        names: Iterable[str] | None = None,
        team: Team = SERIAL,
        edit: Callable[[str, np.ndarray], np.ndarray] | None = None,
    ):
        self.wanted = None if names is None else set(names)
        self.team = team  # a team's arrays come from memory earlier passes left (core/threads.py Slabs)
        self.edit = edit
        self.cache: dict[str, np.ndarray] = {}
        self._block, self._used = np.empty(0, np.uint8), 0
        self._reused: dict[tuple, np.ndarray] = {}

    def wants(self, name: str) -> bool:
        return self.wanted is None or name in self.wanted

    def hook(self, name: str, value: np.ndarray) -> np.ndarray:
        if self.edit is not None:
            value = self.edit(name, value)
        if self.wants(name):
            self.cache[name] = value
        return value

    def empty(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.wants(name):
            role = name.split(".", 2)[-1] if name.startswith("blocks.") else None
            if role not in self.REUSED:
                return self.team.empty(shape, dtype)  # a temporary, or what the KV cache keeps (q, k, v)
            key = (role, shape, dtype)
            if key not in self._reused:
                self._reused[key] = np.empty(shape, dtype)
            return self._reused[key]
        if not self.SMALL_BYTES <= nbytes <= self.BLOCK_BYTES // 2:
            return self.team.empty(shape, dtype)  # small, or big enough alone
        if self._used + nbytes > self._block.size:
            if self.team.memory is not None:  # a slab: already on a huge-page boundary
                self._block, self._used = self.team.empty((self.BLOCK_BYTES,), np.uint8), 0
            else:
                self._block = np.empty(self.BLOCK_BYTES + self.HUGE_PAGE, np.uint8)
                self._used = -self._block.ctypes.data % self.HUGE_PAGE  # start on a huge-page boundary
        out = self._block[self._used : self._used + nbytes].view(dtype).reshape(shape)
        self._used += -(-nbytes // 64) * 64  # the next one starts 64-byte aligned
        return out


@dataclass(frozen=True)
class Batch:
    """Several sequences in one pass's rows (transformer_block's `batch`): sequence i is `sizes[i]` rows, the
    positions starts[i], starts[i] + 1, ... after the first starts[i] positions of the pass's shared `past`
    (activation patching's variants of one run, each from its first patched position on)."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]

    def positions(self) -> np.ndarray:
        """Every row's position.  # [rows]"""
        return np.concatenate([np.arange(start, start + size) for start, size in zip(self.starts, self.sizes)])

    def ends(self) -> np.ndarray:
        """Each sequence's last row.  # [sequences]"""
        return np.cumsum(self.sizes) - 1

    def runs(self) -> list[tuple[slice, int, int, int]]:
        """Consecutive sequences alike, as (their rows, start, size, how many): attention's calls."""
        out: list[tuple[slice, int, int, int]] = []
        row = 0
        for start, size in zip(self.starts, self.sizes):
            if out and out[-1][1:3] == (start, size):
                rows, _start, _size, count = out[-1]
                out[-1] = (slice(rows.start, row + size), start, size, count + 1)
            else:
                out.append((slice(row, row + size), start, size, 1))
            row += size
        return out
