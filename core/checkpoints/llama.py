"""Llama and the decoders built like it: "llama" (SmolLM2, TinyLlama), "mistral", "qwen2" (Qwen2.5)
and "qwen3".

All four: RMS norms, a SwiGLU MLP (gate_proj, up_proj, down_proj), rotary positions in the
rotate-half layout, grouped-query attention (num_key_value_heads), no biases except where a
config or the family says so. Qwen2 adds biases to q, k and v (not o); Qwen3 RMS-normalises each
head's query and key (q_norm, k_norm); Mistral, and Qwen with use_sliding_window, make layers local.
nn.Linear weights are stored [out, in]: core uses their transposes, views of the file.
"""

from __future__ import annotations

from typing import Any

from ..config import TransformerConfig
from ..errors import InputError
from ..i18n import N_, _
from ..model import Params
from .fields import act_fn, need, rope
from .tensors import Tensors

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
LABEL = N_("Llama-family decoder")
PREFIXES = ("model.",)

# transformers' class defaults of the fields a config.json may leave out.
_HEAD_DIM_DEFAULT = {"qwen3": 128}  # the others: hidden_size // num_attention_heads
_MAX_POSITIONS_DEFAULT = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}


def _attn_types(c: dict, kind: str, n_layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    """(per-layer "global"/"local", window) from layer_types, or Mistral's and Qwen's sliding_window."""
    window = c.get("sliding_window")
    if kind == "mistral":
        window = c.get("sliding_window", 4096)  # Mistral's default: every layer slides
        return (None, None) if window is None else (("local",) * n_layers, window)
    if kind in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
        window = None  # Qwen slides only when use_sliding_window is set
    types = c.get("layer_types")
    if types is None:
        first = c.get("max_window_layers", 28)
        types = [
            "sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n_layers)
        ]
    names = {"full_attention": "global", "sliding_attention": "local"}
    if not isinstance(types, list) or any(t not in names for t in types):
        raise InputError(
            _("layer_types {types!r} is not a list of 'full_attention' and 'sliding_attention'").format(types=types)
        )
    if "sliding_attention" not in types:
        return None, None
    if not isinstance(window, int):
        raise InputError(_("layer_types has sliding_attention layers but sliding_window is not a number"))
    return tuple(names[t] for t in types), window


def config(c: dict) -> TransformerConfig:
    kind = c["model_type"]
    d, n_heads = need(c, "hidden_size"), need(c, "num_attention_heads")
    n_layers = need(c, "num_hidden_layers")
    d_head = c.get("head_dim") or _HEAD_DIM_DEFAULT.get(kind) or d // n_heads
    theta, _ = rope(c)  # Llama-family rotary always turns the whole head
    attn_types, window = _attn_types(c, kind, n_layers)
    qkv_bias = True if kind == "qwen2" else bool(c.get("attention_bias", False))
    return TransformerConfig(
        d_model=d,
        n_layers=n_layers,
        n_heads=n_heads,
        n_key_value_heads=c.get("num_key_value_heads") or n_heads,
        d_head=d_head,
        d_mlp=need(c, "intermediate_size"),
        d_vocab=need(c, "vocab_size"),
        n_ctx=c.get("max_position_embeddings") or _MAX_POSITIONS_DEFAULT[kind],
        act_fn=act_fn(c.get("hidden_act", "silu")),
        eps=c.get("rms_norm_eps", 1e-6),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        normalization_type="RMS",
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_base=theta,
        rotary_adjacent_pairs=False,
        attention_dir="causal",
        block_type="pre_norm",
        attn_types=attn_types,
        window_size=window,
        use_qk_norm=kind == "qwen3",
        bias=False,
        qkv_bias=qkv_bias,
        attn_out_bias=False if kind == "qwen2" else bool(c.get("attention_bias", False)),
        mlp_bias=bool(c.get("mlp_bias", False)),
    )


def params(t: Tensors, cfg: TransformerConfig) -> Params:
    d, dm, V, dh = cfg.d_model, cfg.d_mlp, cfg.d_vocab, cfg.d_head
    hq, hkv = cfg.n_heads * dh, cfg.n_key_value_heads * dh

    params: Params = {"embed": {"W_E": t.get("embed_tokens.weight", (V, d))}}
    blocks = []
    for layer in range(cfg.n_layers):
        a, m = f"layers.{layer}.self_attn.", f"layers.{layer}.mlp."
        attn: dict[str, Any] = {  # arrays, and the q and k norms' dicts
            "W_Q": t.linear(a + "q_proj.weight", d, hq),
            "W_K": t.linear(a + "k_proj.weight", d, hkv),
            "W_V": t.linear(a + "v_proj.weight", d, hkv),
        }  # [d_model, heads * d_head] each, views
        if cfg.qkv_bias:
            attn |= {
                "b_Q": t.get(a + "q_proj.bias", (hq,)),
                "b_K": t.get(a + "k_proj.bias", (hkv,)),
                "b_V": t.get(a + "v_proj.bias", (hkv,)),
            }
        if cfg.use_qk_norm:
            attn |= {"q_norm": t.norm(a + "q_norm", dh, bias=False), "k_norm": t.norm(a + "k_norm", dh, bias=False)}
        attn["W_O"] = t.linear(a + "o_proj.weight", hq, d)
        if cfg.attn_out_bias:
            attn["b_O"] = t.get(a + "o_proj.bias", (d,))
        mlp = {
            "W_gate": t.linear(m + "gate_proj.weight", d, dm),
            "W_in": t.linear(m + "up_proj.weight", d, dm),
            "W_out": t.linear(m + "down_proj.weight", dm, d),
        }
        if cfg.mlp_bias:
            mlp |= {
                "b_gate": t.get(m + "gate_proj.bias", (dm,)),
                "b_in": t.get(m + "up_proj.bias", (dm,)),
                "b_out": t.get(m + "down_proj.bias", (d,)),
            }
        blocks.append(
            {
                "ln1": t.norm(f"layers.{layer}.input_layernorm", d, bias=False),
                "attn": attn,
                "ln2": t.norm(f"layers.{layer}.post_attention_layernorm", d, bias=False),
                "mlp": mlp,
            }
        )
    params["blocks"] = blocks
    params["ln_final"] = t.norm("norm", d, bias=False)
    if not cfg.tied_embeddings:
        params["unembed"] = t.unembed("lm_head.weight", d, V)
    return params
