"""BERT encoders (model_type "bert"): post-norm, bidirectional, learned positions, segment embeddings.

BERT's nn.Linear weights are stored [out, in]; core uses their transposes, which are views of the
memory-mapped file (no copy), and keeps query, key and value separate (W_Q, W_K, W_V) rather than
fusing them, which would copy.
"""

from __future__ import annotations

from ..config import TransformerConfig
from ..errors import InputError
from ..i18n import N_, _
from ..model import Params
from .fields import act_fn
from .tensors import Tensors

MODEL_TYPES = ("bert",)
LABEL = N_("BERT-family encoder")
PREFIXES = ("bert.",)


def config(c: dict) -> TransformerConfig:
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise InputError(
            _("position_embedding_type {kind!r} is not supported (only absolute)").format(
                kind=c["position_embedding_type"]
            )
        )
    if c.get("is_decoder"):
        raise InputError(_("BERT used as a decoder (is_decoder) is not supported"))
    return TransformerConfig(
        d_model=c["hidden_size"],
        n_layers=c["num_hidden_layers"],
        n_heads=c["num_attention_heads"],
        d_vocab=c["vocab_size"],
        n_ctx=c.get("max_position_embeddings", 512),
        d_mlp=c["intermediate_size"],
        act_fn=act_fn(c.get("hidden_act", "gelu")),
        eps=c.get("layer_norm_eps", 1e-12),
        n_token_types=c.get("type_vocab_size", 2),
        # BERT's masked-LM head (a dense layer, a norm, then W_E transposed) is not loaded: the
        # explorer shows an encoder's activations, not its predictions. Tied means "no W_U array".
        tied_embeddings=True,
        normalization_type="LN",
        positional_embedding_type="learned",
        attention_dir="bidirectional",
        block_type="post_norm",
        bias=True,
    )


def params(t: Tensors, cfg: TransformerConfig) -> Params:
    d, dm, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    hd = cfg.n_heads * cfg.d_head

    def bias(name: str, width: int):
        return t.get(f"{name}.bias", (width,))

    e = "embeddings."
    params: Params = {
        "embed": {"W_E": t.get(e + "word_embeddings.weight", (V, d))},
        "pos_embed": {"W_pos": t.get(e + "position_embeddings.weight", (cfg.n_ctx, d))},
        "token_type_embed": {"W_token_type": t.get(e + "token_type_embeddings.weight", (cfg.n_token_types, d))},
        "ln_embed": t.norm(e + "LayerNorm", d),
    }
    blocks = []
    for layer in range(cfg.n_layers):
        b = f"encoder.layer.{layer}."
        s, o = b + "attention.self.", b + "attention.output.dense"
        attn = {
            "W_Q": t.linear(s + "query.weight", d, hd),
            "b_Q": bias(s + "query", hd),
            "W_K": t.linear(s + "key.weight", d, hd),
            "b_K": bias(s + "key", hd),
            "W_V": t.linear(s + "value.weight", d, hd),
            "b_V": bias(s + "value", hd),
            "W_O": t.linear(o + ".weight", hd, d),
            "b_O": bias(o, d),
        }
        mlp = {
            "W_in": t.linear(b + "intermediate.dense.weight", d, dm),
            "b_in": bias(b + "intermediate.dense", dm),
            "W_out": t.linear(b + "output.dense.weight", dm, d),
            "b_out": bias(b + "output.dense", d),
        }
        # Post-norm: ln1 normalises x + attn(x) ("attention.output.LayerNorm"), ln2 normalises
        # x + mlp(x) ("output.LayerNorm"), matching core.model.transformer_block.
        blocks.append(
            {
                "ln1": t.norm(b + "attention.output.LayerNorm", d),
                "attn": attn,
                "ln2": t.norm(b + "output.LayerNorm", d),
                "mlp": mlp,
            }
        )
    params["blocks"] = blocks
    return params
