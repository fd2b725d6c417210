"""Activation names: what a run caches, in TransformerLens' names, and each one's shape.

Every family has the same names (DESIGN.md); a config only decides which of them a run makes
(rotary's hook_rot_q/k, a gated MLP's hook_pre_linear, a pre-norm model's ln_final.hook_normalized).
"""

from __future__ import annotations

from .config import TransformerConfig


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
