"""GPT-2 (model_type "gpt2"): pre-norm, learned positions, causal, tied unembedding by default.

GPT-2's Conv1D weights are stored [in, out], which is already core's layout, and c_attn is already
fused [Q | K | V] as core's W_QKV: every array is the file's own bytes, memory-mapped.
"""

from __future__ import annotations

import numpy as np

from ..config import TransformerConfig
from ..errors import InputError
from ..i18n import N_, _
from ..model import Params
from .fields import act_fn
from .tensors import CheckpointError, Tensors

MODEL_TYPES = ("gpt2",)
LABEL = N_("GPT-2-family decoder")
PREFIXES = ("transformer.",)


def config(c: dict) -> TransformerConfig:
    if c.get("scale_attn_by_inverse_layer_idx"):
        raise InputError(_("scale_attn_by_inverse_layer_idx (Mistral-style scaling) is not supported"))
    return TransformerConfig(
        d_model=c["n_embd"],
        n_layers=c["n_layer"],
        n_heads=c["n_head"],
        d_vocab=c["vocab_size"],
        n_ctx=c.get("n_positions", c.get("n_ctx", 1024)),
        d_mlp=c.get("n_inner"),  # type: ignore[arg-type]  # None: 4 * d_model (TransformerConfig resolves it)
        act_fn=act_fn(c.get("activation_function", "gelu_new")),
        use_attn_scale=c.get("scale_attn_weights", True),
        eps=c.get("layer_norm_epsilon", 1e-5),
        tied_embeddings=c.get("tie_word_embeddings", True),
        normalization_type="LN",
        positional_embedding_type="learned",
        attention_dir="causal",
        block_type="pre_norm",
        bias=True,
        unembed_bias=False,  # lm_head has no bias
        # Not GPT-2's: core/export.py writes it for attention-only models, whose MLPs are exactly zero.
        attn_only=c.get("attn_only", False) is True,
    )


def params(t: Tensors, cfg: TransformerConfig) -> Params:
    d, dm, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    hd = cfg.n_heads * cfg.d_head

    params: Params = {
        "embed": {"W_E": t.get("wte.weight", (V, d))},
        "pos_embed": {"W_pos": t.get("wpe.weight", (cfg.n_ctx, d))},
    }
    blocks = []
    for layer in range(cfg.n_layers):
        h = f"h.{layer}."
        # h.{l}.attn.bias / attn.masked_bias, in older checkpoints, are the causal mask as a
        # constant buffer; core builds the mask itself, so they are not read.
        block = {
            "ln1": t.norm(h + "ln_1", d),
            "attn": {
                "W_QKV": t.get(h + "attn.c_attn.weight", (d, 3 * hd)),  # columns [Q | K | V]
                "b_QKV": t.get(h + "attn.c_attn.bias", (3 * hd,)),
                "W_O": t.get(h + "attn.c_proj.weight", (hd, d)),
                "b_O": t.get(h + "attn.c_proj.bias", (d,)),
            },
        }
        if cfg.attn_only:
            # The stored MLP must add nothing, or transformers would compute another model than core.
            if np.any(t.get(h + "mlp.c_proj.weight", (dm, d))) or np.any(t.get(h + "mlp.c_proj.bias", (d,))):
                raise CheckpointError(
                    f"config.json says attn_only, but layer {layer}'s MLP output weights are not "
                    f"all zero: remove attn_only or zero mlp.c_proj"
                )
        else:
            block |= {
                "ln2": t.norm(h + "ln_2", d),
                "mlp": {
                    "W_in": t.get(h + "mlp.c_fc.weight", (d, dm)),
                    "b_in": t.get(h + "mlp.c_fc.bias", (dm,)),
                    "W_out": t.get(h + "mlp.c_proj.weight", (dm, d)),
                    "b_out": t.get(h + "mlp.c_proj.bias", (d,)),
                },
            }
        blocks.append(block)
    params["blocks"] = blocks
    params["ln_final"] = t.norm("ln_f", d)
    if not cfg.tied_embeddings:
        params["unembed"] = t.unembed("lm_head.weight", d, V)
    return params
