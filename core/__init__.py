"""Transformer Explorer's core: an exact, pure-NumPy Transformer.

Usable on its own from a notebook:

    from core import TransformerConfig, init_params, run_with_cache, lessons
    lessons.attention().result.weights      # the spec's attention table
"""

from . import analysis, lessons
from .attention import (AttentionResult, causal_mask, merge_heads, multi_head_attention,
                        scaled_dot_product_attention, split_heads)
from .config import PRESETS, TransformerConfig
from .functional import gelu, gelu_new, layer_norm, relu, softmax
from .model import (hook_names, hook_shape, init_params, iter_arrays, next_token_probs, per_head_weights,
                    run_with_cache, unembedding)
from .params import DTYPE_BYTES, count_params, gpt_params, kv_cache_bytes
from .positions import POSITION_SCHEMES, apply_rotary, sinusoidal
from .tokenizers import CharTokenizer, word_tokens

__all__ = [
    "analysis", "lessons", "AttentionResult", "causal_mask", "merge_heads", "multi_head_attention",
    "scaled_dot_product_attention", "split_heads", "PRESETS", "TransformerConfig", "gelu", "gelu_new",
    "layer_norm", "relu", "softmax", "hook_names", "hook_shape", "init_params", "iter_arrays",
    "next_token_probs", "per_head_weights", "run_with_cache", "unembedding", "DTYPE_BYTES", "count_params",
    "gpt_params", "kv_cache_bytes", "POSITION_SCHEMES", "apply_rotary", "sinusoidal", "CharTokenizer",
    "word_tokens",
]
