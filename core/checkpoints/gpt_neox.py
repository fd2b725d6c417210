"""GPT-NeoX (model_type "gpt_neox"): Pythia and the models EleutherAI trained with it.

Pre-norm layer norms; rotary in the rotate-half layout on part of each head (rotary_pct, a
quarter for Pythia); attention and MLP in parallel, both reading the block's input
(use_parallel_residual; sequential when false); an untied embed_out without bias.
query_key_value is fused per head: its rows are [head][q, k, v][d_head], so its transpose,
viewed as [d_model, n_heads, 3, d_head], is core's per-head fused W_QKV with no copy.
"""

from __future__ import annotations

import numpy as np

from ..config import TransformerConfig
from ..i18n import N_
from ..model import Params
from .fields import act_fn, need, rope, rotary_dim
from .tensors import Tensors

MODEL_TYPES = ("gpt_neox",)
LABEL = N_("GPT-NeoX-family decoder")  # translated where it is shown (app/models/catalog.py)
PREFIXES = ("gpt_neox.",)


def config(c: dict) -> TransformerConfig:
    d, n_heads = need(c, "hidden_size"), need(c, "num_attention_heads")
    theta, partial = rope(c, default_partial=0.25)
    bias = bool(c.get("attention_bias", True))
    return TransformerConfig(
        d_model=d,
        n_layers=need(c, "num_hidden_layers"),
        n_heads=n_heads,
        d_mlp=need(c, "intermediate_size"),
        d_vocab=need(c, "vocab_size"),
        n_ctx=c.get("max_position_embeddings", 2048),
        act_fn=act_fn(c.get("hidden_act", "gelu")),
        eps=c.get("layer_norm_eps", 1e-5),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=rotary_dim(d // n_heads, partial),
        rotary_base=theta,
        rotary_adjacent_pairs=False,
        parallel_attn_mlp=bool(c.get("use_parallel_residual", True)),
        attention_dir="causal",
        block_type="pre_norm",
        bias=True,
        qkv_bias=bias,
        attn_out_bias=bias,
        unembed_bias=False,
    )


def params(t: Tensors, cfg: TransformerConfig) -> Params:
    d, dm, V, h, dh = cfg.d_model, cfg.d_mlp, cfg.d_vocab, cfg.n_heads, cfg.d_head

    params: Params = {"embed": {"W_E": t.get("embed_in.weight", (V, d))}}
    blocks = []
    for layer in range(cfg.n_layers):
        a, m = f"layers.{layer}.attention.", f"layers.{layer}.mlp."
        # [3 n_heads d_head, d_model] -> transposed [d_model, n_heads, 3, d_head]: a view
        attn: dict[str, np.ndarray] = {
            "W_QKV": t.linear(a + "query_key_value.weight", d, 3 * h * dh).reshape(d, h, 3, dh)
        }
        if cfg.qkv_bias:
            attn["b_QKV"] = t.get(a + "query_key_value.bias", (3 * h * dh,)).reshape(h, 3, dh)
        attn["W_O"] = t.linear(a + "dense.weight", h * dh, d)
        if cfg.attn_out_bias:
            attn["b_O"] = t.get(a + "dense.bias", (d,))
        mlp = {
            "W_in": t.linear(m + "dense_h_to_4h.weight", d, dm),
            "b_in": t.get(m + "dense_h_to_4h.bias", (dm,)),
            "W_out": t.linear(m + "dense_4h_to_h.weight", dm, d),
            "b_out": t.get(m + "dense_4h_to_h.bias", (d,)),
        }
        blocks.append(
            {
                "ln1": t.norm(f"layers.{layer}.input_layernorm", d),
                "attn": attn,
                "ln2": t.norm(f"layers.{layer}.post_attention_layernorm", d),
                "mlp": mlp,
            }
        )
    params["blocks"] = blocks
    params["ln_final"] = t.norm("final_layer_norm", d)
    if not cfg.tied_embeddings:
        params["unembed"] = t.unembed("embed_out.weight", d, V)
    return params
