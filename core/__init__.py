"""Transformer Explorer's core: an exact, pure-NumPy Transformer.

Usable on its own from a notebook:

    from core import TransformerConfig, init_params, run_with_cache, lessons
    lessons.attention().result.weights      # the spec's attention table
    logits, cache = run_with_cache(params, cfg, tokens)
    cache.attention_stages(layer=0, head=1).weights
"""

from . import analysis, circuits, lessons, patching
from .attention import (
    AttentionResult,
    causal_mask,
    merge_heads,
    multi_head_attention,
    reference_attention,
    scaled_dot_product_attention,
    split_heads,
)
from .cache import ActivationCache, run_with_cache
from .config import PRESETS, TransformerConfig
from .errors import InputError
from .functional import gelu, gelu_new, layer_norm, relu, rms_norm, silu, softmax
from .generate import SINK_THRESHOLD, GenerationStep, generate, generate_ids
from .hooks import hook_dims, hook_names, hook_shape
from .model import (
    KVCache,
    forward,
    init_params,
    iter_arrays,
    next_token_probs,
    per_head_weights,
    run_with_kv_cache,
    unembedding,
)
from .params import DTYPE_BYTES, count_params, forward_work, gpt_params, kv_cache_bytes, largest_array
from .positions import POSITION_SCHEMES, apply_rotary, rotary, sinusoidal
from .sampling import Sampling, sampler, warp
from .tokenizers import CharTokenizer, word_tokens

__all__ = [
    "analysis",
    "lessons",
    "AttentionResult",
    "reference_attention",
    "causal_mask",
    "merge_heads",
    "multi_head_attention",
    "scaled_dot_product_attention",
    "split_heads",
    "ActivationCache",
    "run_with_cache",
    "PRESETS",
    "TransformerConfig",
    "InputError",
    "gelu",
    "gelu_new",
    "layer_norm",
    "relu",
    "softmax",
    "KVCache",
    "forward",
    "hook_names",
    "hook_shape",
    "init_params",
    "iter_arrays",
    "next_token_probs",
    "per_head_weights",
    "run_with_kv_cache",
    "unembedding",
    "DTYPE_BYTES",
    "count_params",
    "gpt_params",
    "kv_cache_bytes",
    "POSITION_SCHEMES",
    "apply_rotary",
    "sinusoidal",
    "CharTokenizer",
    "word_tokens",
    # other families (Llama, Qwen, Mistral, GPT-NeoX, GPT-Neo): their functions, and a forward pass's cost
    "rms_norm",
    "silu",
    "rotary",
    "hook_dims",
    "forward_work",
    "largest_array",
    # why a head attends and what it causes: activation patching, QK and OV circuits, composition
    "circuits",
    "patching",
    # writing with a model: sampling settings, the sampler, and generation through the KV cache
    "Sampling",
    "sampler",
    "warp",
    "generate",
    "generate_ids",
    "GenerationStep",
    "SINK_THRESHOLD",
]
