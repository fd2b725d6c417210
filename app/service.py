"""The service layer: what the JSON API and the pages both compute, from validated inputs.

Each function checks the request's cost against the limits in app/settings.py *before*
computing, calls core/, and returns a dataclass holding NumPy arrays (no JSON, no HTML).
Bad input raises ValueError with a message a learner can act on; app/errors.py turns it
into a 422.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core import PRESETS, TransformerConfig, count_params, hook_names, hook_shape, kv_cache_bytes, lessons
from core.attention import attention_scale
from core.model import next_token_probs, run_with_cache
from core.params import KVCacheSize, ParamCount
from core.tokenizers import word_tokens

from . import registry
from .settings import get_settings


# ------------------------------------------------------------------ cost of a request

def _fmt(n: int | float) -> str:
    return f"{n:,.0f}"


def check_cost(work: int, largest: int, reduce: str) -> None:
    """Refuse a request whose work or largest array exceeds the limits, naming what to reduce."""
    s = get_settings()
    if work > s.max_work:
        raise ValueError(f"this request needs about {_fmt(work)} multiply-adds, more than this server's limit "
                         f"of {_fmt(s.max_work)}: reduce {reduce}")
    if largest > s.max_elements:
        raise ValueError(f"this request needs an array of {_fmt(largest)} numbers, more than this server's limit "
                         f"of {_fmt(s.max_elements)}: reduce {reduce}")


def check_count(what: str, n: int, limit: int, hint: str) -> None:
    if n > limit:
        raise ValueError(f"{what} has {n:,} tokens, more than the limit of {limit:,}: {hint}")


def forward_work(cfg: TransformerConfig, n_tokens: int) -> int:
    """Multiply-adds of one forward pass: every block weight once per token, QKᵀ and pattern·V,
    and the unembedding."""
    c = count_params(cfg)
    matmuls = n_tokens * c.per_block * cfg.n_layers
    attention = cfg.n_layers * 2 * n_tokens * n_tokens * cfg.n_heads * cfg.d_head
    return matmuls + attention + n_tokens * cfg.d_model * cfg.d_vocab


def largest_array(cfg: TransformerConfig, n_tokens: int) -> int:
    """The biggest array a forward pass holds: a layer's scores, or the largest weight matrix."""
    return max(cfg.n_heads * n_tokens * n_tokens, cfg.d_vocab * cfg.d_model, cfg.n_ctx * cfg.d_model,
               cfg.d_model * 3 * cfg.n_heads * cfg.d_head, cfg.d_model * cfg.d_mlp)


def hook_dims(name: str, cfg: TransformerConfig, n_tokens: int) -> list[int]:
    """A hook's concrete shape from its axis names ("[head_index, query_pos, key_pos]")."""
    sizes = {"pos": n_tokens, "query_pos": n_tokens, "key_pos": n_tokens, "head_index": cfg.n_heads,
             "d_head": cfg.d_head, "d_model": cfg.d_model, "d_mlp": cfg.d_mlp, "d_vocab": cfg.d_vocab}
    return [sizes[a.strip()] for a in hook_shape(name).strip("[]").split(",")]


# ------------------------------------------------------------------ lessons

def _check_words(text: str) -> list[str]:
    tokens = word_tokens(text)
    check_count("the text", len(tokens), get_settings().max_tokens, "use a shorter text")
    return tokens


@dataclass
class AttentionLessonResult:
    lesson: lessons.AttentionLesson  # tokens, X, W_q.., Q, K, V, raw_scores, mask, result
    scaled_scores: np.ndarray  # [query_pos, key_pos], QKᵀ / √d_k before the mask
    divisor: float  # √d_k, or 1 when scaling is off


def lesson_attention(text: str, seed: int, d_model: int, d_k: int, causal: bool, scale: bool
                     ) -> AttentionLessonResult:
    T = len(_check_words(text))
    check_cost(3 * T * d_model * d_k + 2 * T * T * d_k, max(T * T, T * d_model, d_model * d_k),
               "the number of words, d_model or d_k")
    lesson = lessons.attention(text, seed, d_model, d_k, causal=causal, scale=scale)
    divisor = attention_scale(d_k, scale)
    return AttentionLessonResult(lesson, lesson.raw_scores / divisor, divisor)


def lesson_scaling(dims: tuple[int, ...], n_queries: int, n_keys: int, seed: int) -> list[lessons.ScalingRow]:
    # every key entry is drawn and multiplied once; the key array of the widest d is the largest
    check_cost(2 * n_queries * n_keys * sum(dims), n_queries * n_keys * max(dims),
               "n_queries, n_keys or the dims")
    return lessons.scaling(dims, n_queries, n_keys, seed)


def lesson_multihead(text: str, seed: int, d_model: int, n_heads: int, causal: bool, scale: bool
                     ) -> lessons.MultiHeadLesson:
    T = len(_check_words(text))
    check_cost(4 * T * d_model * d_model + 2 * T * T * d_model, max(n_heads * T * T, 3 * d_model * d_model),
               "the number of words, d_model or n_heads")
    return lessons.multihead(text, seed, d_model, n_heads, causal=causal, scale=scale)


def lesson_positions(n_pos: int, d: int, pairs: tuple[tuple[int, int], ...] | None) -> lessons.PositionsLesson:
    """With no pairs given, the spec's pairs that fit inside n_pos."""
    check_cost(n_pos * d, n_pos * d, "n_pos or d")
    if pairs is None:
        pairs = tuple((i, j) for i, j in lessons.SPEC_POSITION_PAIRS if i < n_pos and j < n_pos)
    return lessons.positions(n_pos, d, pairs)


def lesson_forward(text: str, prompt: str, seed: int, d_model: int, n_heads: int, d_mlp: int
                   ) -> lessons.ForwardLesson:
    check_count("the prompt", len(prompt), get_settings().max_tokens, "use a shorter prompt")
    if not text:
        raise ValueError("the text is empty: its characters are the vocabulary, so type at least one")
    # the config the lesson will build, to price it first (and to explain d_model/n_heads errors)
    cfg = registry.models()["spec-forward"].cfg.replace(d_model=d_model, n_heads=n_heads, d_mlp=d_mlp,
                                                        d_vocab=len(set(text)), n_ctx=max(len(prompt), 1))
    check_cost(count_params(cfg).total + forward_work(cfg, len(prompt)), largest_array(cfg, len(prompt)),
               "the prompt, d_model, n_heads or d_mlp")
    return lessons.forward(text, prompt, seed, d_model, n_heads, d_mlp)


# ------------------------------------------------------------------ calculators

def calc_config(preset: str | None, **sizes: int | bool | None) -> TransformerConfig:
    """A preset (default "toy") with any given sizes replacing its own.

    Heads split d_model without changing any count; when a new d_model is not a multiple of
    the preset's heads, one head is assumed.
    """
    base = PRESETS[preset or "toy"]
    changes = {k: v for k, v in sizes.items() if v is not None}
    if "n_heads" not in changes and "d_model" in changes and changes["d_model"] % base.n_heads:
        changes["n_heads"] = 1
    return base.replace(**changes) if changes else base


def param_count(cfg: TransformerConfig) -> ParamCount:
    return count_params(cfg)


def kv_cache(cfg: TransformerConfig, seq_len: int | None, batch: int, dtype: str) -> KVCacheSize:
    return kv_cache_bytes(cfg, seq_len if seq_len is not None else cfg.n_ctx, batch, dtype)


# ------------------------------------------------------------------ models and runs

def get_model(name: str) -> registry.Model:
    model = registry.get(name)
    if model.error:
        raise ValueError(f"model {name!r} cannot run: {model.error}")
    return model


def model_hooks(name: str, n_layers: int | None = None, positional_embedding_type: str | None = None
                ) -> tuple[registry.Model, TransformerConfig, list[tuple[str, str]]]:
    model = get_model(name)
    _check_toggles(model, {"n_layers": n_layers, "positional_embedding_type": positional_embedding_type})
    cfg = model.cfg
    if n_layers is not None:
        cfg = cfg.replace(n_layers=n_layers)
    if positional_embedding_type is not None:
        cfg = cfg.replace(positional_embedding_type=positional_embedding_type)
    return model, cfg, [(n, hook_shape(n)) for n in hook_names(cfg)]


@dataclass
class TopToken:
    token: str
    id: int
    prob: float


@dataclass
class RunResult:
    model: str
    tokens: list[str]
    token_ids: list[int]
    cfg: TransformerConfig
    seed: int
    hooks: dict[str, np.ndarray]  # by hook name; masked scores are -inf
    top_k: list[TopToken]  # [] for encoders


def _check_toggles(model: registry.Model, given: dict[str, object]) -> None:
    refused = [k for k, v in given.items() if v is not None and k not in model.toggles]
    if refused:
        raise ValueError(f"model {model.name!r} does not accept {', '.join(refused)}: it takes "
                         f"{', '.join(model.toggles) or 'no toggles'}"
                         + ("; the 'toy' model accepts every toggle" if model.name != "toy" else ""))


def _resolve_hooks(wanted: list[str], cfg: TransformerConfig, model_name: str) -> list[str]:
    names = hook_names(cfg)
    known = set(names)
    unknown = [h for h in wanted if h not in known]
    if unknown:
        raise ValueError(f"unknown hook name {unknown[0]!r} for model {model_name!r} with {cfg.n_layers} "
                         f"layer(s): hooks look like {names[-4]!r}; GET /api/v1/hooks?model={model_name} "
                         f"lists all {len(names)}")
    return list(dict.fromkeys(wanted))  # drop repeats, keep the order asked


def run(req) -> RunResult:
    """Run a model on a text with the request's toggles (req: app.schemas.RunRequest)."""
    s = get_settings()
    model = get_model(req.model)
    toggles = {name: getattr(req, name) for name in registry.ATTENTION_TOGGLES + registry.SIZE_TOGGLES}
    _check_toggles(model, toggles)
    encoding = model.tokenizer.encode(req.text)
    n = len(encoding.ids)
    check_count("the text", n, s.max_tokens, "use a shorter text")

    sizes = {k: toggles[k] for k in ("n_heads", "n_layers", "d_model") if toggles[k] is not None}
    cfg = model.configure(sizes, n)
    attention = {"attention_dir": None if req.causal is None else ("causal" if req.causal else "bidirectional"),
                 "use_attn_scale": req.scale, "attn_temperature": req.temperature,
                 "positional_embedding_type": req.positional_embedding_type}
    attention = {k: v for k, v in attention.items() if v is not None}
    if attention:
        cfg = cfg.replace(**attention)

    hooks = _resolve_hooks(req.hooks, cfg, model.name)
    values = sum(math.prod(hook_dims(h, cfg, n)) for h in hooks)
    if values > s.max_hook_values:
        raise ValueError(f"the hooks asked for hold {values:,} numbers, more than the limit of "
                         f"{s.max_hook_values:,} per response: ask for fewer hooks or use a shorter text")
    drawn = count_params(cfg).total if model.draws_weights else 0
    if model.draws_weights and drawn > s.max_params:
        raise ValueError(f"a model of this size has {drawn:,} parameters, more than the limit of "
                         f"{s.max_params:,}: reduce d_model or n_layers")
    check_cost(drawn + forward_work(cfg, n), largest_array(cfg, n),
               "the text's length, d_model, n_layers or n_heads")

    seed = req.seed if req.seed is not None else model.default_seed
    params = model.load_params(cfg, seed, encoding)
    logits, cache = run_with_cache(params, cfg, np.asarray(encoding.ids), names=hooks,
                                   logits=not model.is_encoder)
    top: list[TopToken] = []
    if not model.is_encoder and req.top_k:
        probs = next_token_probs(logits)  # [d_vocab]
        k = min(req.top_k, probs.size)
        best = np.argsort(-probs, kind="stable")[:k]
        top = [TopToken(model.tokenizer.token_str(int(i)), int(i), float(probs[i])) for i in best]
    return RunResult(model.name, encoding.tokens, list(encoding.ids), cfg, seed,
                     {h: cache[h] for h in hooks}, top)


# ------------------------------------------------------------------ the four stages, for pages

@dataclass
class AttentionStages:
    raw: np.ndarray  # [query_pos, key_pos], QKᵀ
    scaled: np.ndarray  # raw / (√d_head · temperature)
    mask: np.ndarray  # True where forbidden
    masked: np.ndarray  # scaled with -inf where forbidden (hook_attn_scores)
    weights: np.ndarray  # softmax rows (hook_pattern)


def stage_hooks(cfg: TransformerConfig, layer: int) -> list[str]:
    """The hooks `attention_stages` needs for one layer."""
    b = f"blocks.{layer}.attn."
    qk = ("hook_rot_q", "hook_rot_k") if cfg.positional_embedding_type == "rotary" else ("hook_q", "hook_k")
    return [b + qk[0], b + qk[1], b + "hook_attn_scores", b + "hook_pattern"]


def attention_stages(result: RunResult, layer: int, head: int) -> AttentionStages:
    """Raw, scaled, masked scores and weights of one head, from a run that kept `stage_hooks`."""
    cfg = result.cfg
    if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
        raise ValueError(f"layer {layer}, head {head} does not exist: the model has {cfg.n_layers} layer(s) "
                         f"of {cfg.n_heads} head(s), counted from 0")
    q_name, k_name, scores_name, pattern_name = stage_hooks(cfg, layer)
    q = result.hooks[q_name][:, head]  # [pos, d_head]
    k = result.hooks[k_name][:, head]
    raw = q @ k.T  # [query_pos, key_pos]
    scaled = raw / attention_scale(cfg.d_head, cfg.use_attn_scale, cfg.attn_temperature)
    masked = result.hooks[scores_name][head]
    return AttentionStages(raw, scaled, np.isneginf(masked), masked, result.hooks[pattern_name][head])


# ------------------------------------------------------------------ the residual stream, for pages

def residual_hooks(cfg: TransformerConfig) -> list[str]:
    """The hooks `residual_norms` needs: the embedding, and each layer's stream and what it adds."""
    names = ["hook_embed"]
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        names += [b + "hook_resid_pre", b + "hook_attn_out", b + "hook_resid_mid", b + "hook_mlp_out",
                  b + "hook_resid_post"]
    return names


@dataclass
class ResidualNorms:
    stream_names: list[str]  # "hook_embed", "0 resid_pre", "0 resid_mid", "0 resid_post", "1 resid_pre", ...
    stream: np.ndarray  # [pos, len(stream_names)], ‖x‖ of each token at each point of the stream
    writes_names: list[str]  # "0 attn_out", "0 mlp_out", ...
    writes: np.ndarray  # [pos, len(writes_names)], ‖what each sub-layer adds‖ per token


def residual_norms(result: RunResult) -> ResidualNorms:
    """Per-token L2 norms along the residual stream, from a run that kept `residual_hooks`."""
    h, n_layers = result.hooks, result.cfg.n_layers
    stream_names, stream = ["hook_embed"], [h["hook_embed"]]
    writes_names, writes = [], []
    for layer in range(n_layers):
        b = f"blocks.{layer}."
        for point in ("resid_pre", "resid_mid", "resid_post"):
            stream_names.append(f"{layer} {point}")
            stream.append(h[b + "hook_" + point])
        for part in ("attn_out", "mlp_out"):
            writes_names.append(f"{layer} {part}")
            writes.append(h[b + "hook_" + part])
    norms = lambda arrays: np.stack([np.linalg.norm(a, axis=-1) for a in arrays], axis=-1)  # [pos, n]
    return ResidualNorms(stream_names, norms(stream), writes_names, norms(writes))
