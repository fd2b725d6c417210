"""GPT-Neo (model_type "gpt_neo"): the TinyStories models and EleutherAI's GPT-Neo.

GPT-2's design with three differences: attention scores are not scaled by 1/√d_head; layers
alternate global and local attention (attention_types, each local layer seeing the last
window_size tokens); q, k and v are separate nn.Linear maps without bias (stored [out, in], used as
transposed views), and so is the MLP's c_fc/c_proj (unlike GPT-2's Conv1D).
"""

from __future__ import annotations

from ..config import TransformerConfig
from ..errors import InputError
from ..i18n import N_, _
from ..model import Params
from .fields import act_fn, need
from .tensors import Tensors

MODEL_TYPES = ("gpt_neo",)
LABEL = N_("GPT-Neo-family decoder")
PREFIXES = ("transformer.",)


def _layers(c: dict, n_layers: int) -> tuple[str, ...]:
    """attention_layers, or attention_types expanded: [[["global", "local"], 2]] -> global, local, global, local."""
    layers = c.get("attention_layers")
    if layers is None:
        layers = [
            kind
            for kinds, repeat in c.get("attention_types", [[["global", "local"], n_layers // 2]])
            for _ in range(repeat)
            for kind in kinds
        ]
    if not isinstance(layers, list) or len(layers) != n_layers:
        raise InputError(
            _("attention_types gives {given!r} layers but num_layers is {n_layers}").format(
                given=len(layers) if isinstance(layers, list) else layers, n_layers=n_layers
            )
        )
    return tuple(layers)


def config(c: dict) -> TransformerConfig:
    n_layers = need(c, "num_layers", "num_hidden_layers")
    return TransformerConfig(
        d_model=need(c, "hidden_size"),
        n_layers=n_layers,
        n_heads=need(c, "num_heads", "num_attention_heads"),
        d_vocab=need(c, "vocab_size"),
        n_ctx=c.get("max_position_embeddings", 2048),
        d_mlp=c.get("intermediate_size"),  # type: ignore[arg-type]  # None: 4 * d_model (TransformerConfig resolves it)
        act_fn=act_fn(c.get("activation_function", "gelu_new")),
        eps=c.get("layer_norm_epsilon", 1e-5),
        tied_embeddings=bool(c.get("tie_word_embeddings", True)),
        use_attn_scale=False,
        attn_types=_layers(c, n_layers),
        window_size=c.get("window_size", 256),
        normalization_type="LN",
        positional_embedding_type="learned",
        attention_dir="causal",
        block_type="pre_norm",
        bias=True,
        qkv_bias=False,
        unembed_bias=False,
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
        a, m = f"h.{layer}.attn.attention.", f"h.{layer}.mlp."
        # h.{l}.attn.attention.bias and masked_bias are the (local) causal mask as a buffer: core builds its own.
        attn = {
            "W_Q": t.linear(a + "q_proj.weight", d, hd),
            "W_K": t.linear(a + "k_proj.weight", d, hd),
            "W_V": t.linear(a + "v_proj.weight", d, hd),
            "W_O": t.linear(a + "out_proj.weight", hd, d),
            "b_O": t.get(a + "out_proj.bias", (d,)),
        }
        mlp = {
            "W_in": t.linear(m + "c_fc.weight", d, dm),
            "b_in": t.get(m + "c_fc.bias", (dm,)),
            "W_out": t.linear(m + "c_proj.weight", dm, d),
            "b_out": t.get(m + "c_proj.bias", (d,)),
        }
        blocks.append(
            {"ln1": t.norm(f"h.{layer}.ln_1", d), "attn": attn, "ln2": t.norm(f"h.{layer}.ln_2", d), "mlp": mlp}
        )
    params["blocks"] = blocks
    params["ln_final"] = t.norm("ln_f", d)
    if not cfg.tied_embeddings:
        params["unembed"] = t.unembed("lm_head.weight", d, V)
    return params
