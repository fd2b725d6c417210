"""The service layer: what the JSON API and the pages both compute, from validated inputs.

Each function checks the request's cost against the limits in app/settings.py *before*
computing, calls core/, and returns a dataclass holding NumPy arrays (no JSON, no HTML).
Bad input raises ValueError with a message a learner can act on; app/errors.py turns it
into a 422.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from core import PRESETS, TransformerConfig, analysis, count_params, hook_names, hook_shape, kv_cache_bytes, lessons
from core.attention import attention_scale
from core.functional import softmax
from core import run_with_cache, run_with_kv_cache
from core.model import KVRun, Params, next_token_probs
from core.params import KVCacheSize, ParamCount
from core.tokenizers import Encoding, word_tokens

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


def forward_work(cfg: TransformerConfig, n_tokens: int, logits: bool = True) -> int:
    """Multiply-adds of one forward pass: every block weight once per token, QKᵀ and pattern·V,
    and the unembedding (unless the pass stops before the logits)."""
    c = count_params(cfg)
    matmuls = n_tokens * c.per_block * cfg.n_layers
    attention = cfg.n_layers * 2 * n_tokens * n_tokens * cfg.n_heads * cfg.d_head
    return matmuls + attention + (n_tokens * cfg.d_model * cfg.d_vocab if logits else 0)


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
    ablate: dict[tuple[int, int], str] = field(default_factory=dict)  # {(layer, head): "zero"|"mean"}
    ablation: "AblationEffect | None" = None  # with ablations on a decoder: the prediction before and after


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


def _configure(model: registry.Model, req, n_tokens: int) -> TransformerConfig:
    """The model's config with the request's toggles applied (req: app.schemas.ModelRequest)."""
    toggles = {name: getattr(req, name) for name in registry.ATTENTION_TOGGLES + registry.SIZE_TOGGLES}
    _check_toggles(model, toggles)
    sizes = {k: toggles[k] for k in ("n_heads", "n_layers", "d_model") if toggles[k] is not None}
    cfg = model.configure(sizes, n_tokens)
    attention = {"attention_dir": None if req.causal is None else ("causal" if req.causal else "bidirectional"),
                 "use_attn_scale": req.scale, "attn_temperature": req.temperature,
                 "positional_embedding_type": req.positional_embedding_type}
    attention = {k: v for k, v in attention.items() if v is not None}
    return cfg.replace(**attention) if attention else cfg


def ablation_map(ablate, cfg: TransformerConfig) -> dict[tuple[int, int], str]:
    """The request's `ablate` list as core's {(layer, head): "zero"|"mean"}, checked against this model."""
    out: dict[tuple[int, int], str] = {}
    for a in ablate or ():
        if a.layer >= cfg.n_layers or a.head >= cfg.n_heads:
            raise ValueError(f"ablate: layer {a.layer} head {a.head} does not exist: this model has "
                             f"{cfg.n_layers} layer(s) of {cfg.n_heads} head(s), counted from 0")
        if (a.layer, a.head) in out:
            raise ValueError(f"ablate: layer {a.layer} head {a.head} is listed twice: list each head once")
        out[(a.layer, a.head)] = a.method
    return out


@dataclass
class Prepared:
    """A request checked against every limit, with its weights: ready to compute."""

    model: registry.Model
    cfg: TransformerConfig
    seed: int
    encoding: Encoding
    ablate: dict[tuple[int, int], str]
    params: Params

    @property
    def ids(self) -> np.ndarray:  # [pos]
        return np.asarray(self.encoding.ids)


@dataclass
class Setup:
    """A request's model, config, tokens and ablations, before any weight is loaded."""

    model: registry.Model
    cfg: TransformerConfig
    encoding: Encoding
    ablate: dict[tuple[int, int], str]
    seed_given: int | None

    @property
    def n(self) -> int:
        return len(self.encoding.ids)


def setup(req) -> Setup:
    """Tokenise and configure a ModelRequest; refuse what this model cannot do, cheaply, before loading."""
    model = get_model(req.model)
    encoding = model.tokenizer.encode(req.text)
    check_count("the text", len(encoding.ids), get_settings().max_tokens, "use a shorter text")
    cfg = _configure(model, req, len(encoding.ids))
    return Setup(model, cfg, encoding, ablation_map(getattr(req, "ablate", None), cfg), req.seed)


def load(st: Setup, work: int, largest: int = 0, reduce: str = "the text's length, d_model, n_layers or n_heads"
         ) -> Prepared:
    """Check the cost of `work` multiply-adds (plus drawing the weights) and load the weights."""
    s = get_settings()
    drawn = count_params(st.cfg).total if st.model.draws_weights else 0
    if st.model.draws_weights and drawn > s.max_params:
        raise ValueError(f"a model of this size has {drawn:,} parameters, more than the limit of "
                         f"{s.max_params:,}: reduce d_model or n_layers")
    check_cost(drawn + work, max(largest, largest_array(st.cfg, st.n)), reduce)
    seed = st.seed_given if st.seed_given is not None else st.model.default_seed
    params = st.model.load_params(st.cfg, seed, st.encoding)
    return Prepared(st.model, st.cfg, seed, st.encoding, st.ablate, params)


def top_tokens(model: registry.Model, probs: np.ndarray, k: int) -> list[TopToken]:
    """The k most probable tokens, most probable first (ties: the lower id first).  # probs [d_vocab]"""
    best = np.argsort(-probs, kind="stable")[:min(k, probs.size)]
    return [TopToken(model.tokenizer.token_str(int(i)), int(i), float(probs[i])) for i in best]


@dataclass
class ProbabilityChange:
    token: str
    id: int
    baseline_prob: float
    prob: float
    delta: float


@dataclass
class AblationEffect:
    baseline_top_k: list[TopToken]  # the same run without the ablation
    changes: list[ProbabilityChange]  # each baseline top-k token: before -> after


def run(req) -> RunResult:
    """Run a model on a text with the request's toggles (req: app.schemas.RunRequest).

    With ablations on a decoder, the same text also runs without them, so the result says how
    the prediction changed (two forward passes, priced as such).
    """
    s = get_settings()
    st = setup(req)
    cfg, n = st.cfg, st.n
    hooks = _resolve_hooks(req.hooks, cfg, st.model.name)
    values = sum(math.prod(hook_dims(h, cfg, n)) for h in hooks)
    if values > s.max_hook_values:
        raise ValueError(f"the hooks asked for hold {values:,} numbers, more than the limit of "
                         f"{s.max_hook_values:,} per response: ask for fewer hooks or use a shorter text")
    compare_baseline = bool(st.ablate) and not st.model.is_encoder
    p = load(st, forward_work(cfg, n, logits=not st.model.is_encoder) * (2 if compare_baseline else 1))
    logits, cache = run_with_cache(p.params, cfg, p.ids, names=hooks, ablate=p.ablate,
                                   logits=not p.model.is_encoder)
    top: list[TopToken] = []
    effect = None
    if not p.model.is_encoder:
        probs = next_token_probs(logits)  # [d_vocab]
        top = top_tokens(p.model, probs, req.top_k) if req.top_k else []
        if compare_baseline:
            baseline_logits, _ = run_with_cache(p.params, cfg, p.ids, names=())
            baseline = next_token_probs(baseline_logits)  # [d_vocab]
            before = top_tokens(p.model, baseline, req.top_k) if req.top_k else []
            effect = AblationEffect(before, [ProbabilityChange(t.token, t.id, t.prob, float(probs[t.id]),
                                                               float(probs[t.id]) - t.prob) for t in before])
    return RunResult(p.model.name, p.encoding.tokens, list(p.encoding.ids), cfg, p.seed,
                     {h: cache[h] for h in hooks}, top, p.ablate, effect)


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


# ------------------------------------------------------------------ looking inside (issue 6)

def next_token_reason(model: registry.Model, cfg: TransformerConfig, what: str) -> str | None:
    """Why `what` (decomposition, logit lens) cannot run on this model, or None. Both read the residual
    stream through the final layer norm and the unembedding, which only a pre-norm decoder has."""
    if model.is_encoder:
        return (f"{what} does not apply to {model.name!r}: it is an encoder (BERT-style), which predicts no "
                "next token, and post-norm, so it has no final layer norm and unembedding to read the residual "
                "stream through. Choose a decoder such as 'toy' (detectors and rollout do work on encoders)")
    if cfg.block_type != "pre_norm":
        return (f"{what} needs a pre-norm model (GPT-2 style, with a final layer norm); {model.name!r} is "
                "post-norm, whose residual stream is re-normalised in every block")
    return None


def kv_cache_reason(model: registry.Model, cfg: TransformerConfig) -> str | None:
    """Why stepped generation with a KV cache cannot run on this model and setting, or None."""
    if model.is_encoder:
        return (f"{model.name!r} is an encoder: it generates nothing, and its bidirectional attention lets every "
                "new token change the earlier positions, so nothing could be cached. Choose a decoder such as 'toy'")
    if not cfg.causal:
        return ("a KV cache needs the causal mask: without it every new token changes the earlier positions "
                "too, so nothing can be reused. Turn causal back on")
    return None


def _require_next_token(model: registry.Model, cfg: TransformerConfig, what: str) -> None:
    reason = next_token_reason(model, cfg, what)
    if reason:
        raise ValueError(reason)


@dataclass
class Decomposition:
    setup: Prepared
    d: analysis.ResidualDecomposition  # labels, parts [n_parts, d_model], direct_logit [n_parts], ...
    target_str: str
    probs_at_pos: np.ndarray  # [d_vocab], the model's next-token probabilities at pos (to choose a target)


def decompose(req) -> Decomposition:
    """The residual stream at `req.pos` split into its parts, each part's direct logit for the target token."""
    st = setup(req)
    _require_next_token(st.model, st.cfg, "the residual-stream decomposition")
    if not -st.n <= req.pos < st.n:
        raise ValueError(f"pos={req.pos} is outside the text's {st.n} tokens: use 0 … {st.n - 1}, or -1 for the last")
    if req.target is not None and req.target >= st.cfg.d_vocab:
        raise ValueError(f"target={req.target} is not a token id of {st.model.name!r}, whose vocabulary is "
                         f"0 … {st.cfg.d_vocab - 1}; leave it out to use the model's most likely next token")
    n_parts = 3 + st.cfg.n_layers * (st.cfg.n_heads + 3)  # embeddings, then per layer heads, biases, mlp
    # one pass gives the prediction at pos (the default target), the second decomposes
    p = load(st, 2 * forward_work(st.cfg, st.n), n_parts * st.cfg.d_model)
    logits, _ = run_with_cache(p.params, p.cfg, p.ids, names=(), ablate=p.ablate)
    probs = softmax(logits[req.pos])  # [d_vocab]
    target = req.target if req.target is not None else int(np.argmax(probs))
    d = run_with_cache(p.params, p.cfg, p.ids, ablate=p.ablate)[1].decompose_resid(target, req.pos)
    return Decomposition(p, d, p.model.tokenizer.token_str(target), probs)


@dataclass
class Lens:
    setup: Prepared
    points: list[str]  # hook names, see core.analysis.lens_points
    top_ids: np.ndarray  # [n_points, pos, k]
    top_probs: np.ndarray  # [n_points, pos, k]
    token_strs: dict[int, str]  # every id in top_ids, readable


def logit_lens(req) -> Lens:
    """Every resid_pre / resid_mid (and the last resid_post) decoded through ln_final and W_U.

    The same numbers as core.analysis.logit_lens, one point at a time, so the largest array is
    [pos, d_vocab] rather than [n_points, pos, d_vocab] (GPT-2's vocabulary is 50,257 wide).
    """
    s = get_settings()
    st = setup(req)
    _require_next_token(st.model, st.cfg, "the logit lens")
    cfg, n = st.cfg, st.n
    points = analysis.lens_points(cfg)
    k = min(req.top_k, cfg.d_vocab)
    if len(points) * n * k > s.max_hook_values:
        raise ValueError(f"the lens table holds {len(points) * n * k:,} cells, more than the limit of "
                         f"{s.max_hook_values:,}: reduce top_k or use a shorter text")
    lens_work = len(points) * n * cfg.d_model * cfg.d_vocab  # each point's unembedding
    p = load(st, forward_work(cfg, n, logits=False) + lens_work, n * cfg.d_vocab)
    _, cache = run_with_cache(p.params, cfg, p.ids, names=points, ablate=p.ablate, logits=False)
    top_ids = np.empty((len(points), n, k), dtype=np.int64)
    top_probs = np.empty((len(points), n, k))
    for i, point in enumerate(points):
        probs = softmax(analysis.lens_logits(p.params, cfg, cache[point]))  # [pos, d_vocab]
        top_ids[i] = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        top_probs[i] = np.take_along_axis(probs, top_ids[i], axis=-1)
    strs = {int(t): p.model.tokenizer.token_str(int(t)) for t in np.unique(top_ids)}
    return Lens(p, points, top_ids, top_probs, strs)


@dataclass
class FlaggedHead:
    detector: str
    on: str  # "text" or "random"
    layer: int
    head: int
    score: float


@dataclass
class Detectors:
    setup: Prepared
    random_ids: list[int]
    random_tokens: list[str]
    scores: dict[str, dict[str, np.ndarray]]  # {detector: {"text"|"random": [n_layers, n_heads]}}, NaN = undefined
    threshold: float
    flagged: list[FlaggedHead]  # highest score first


def detectors(req) -> Detectors:
    """Previous-token, duplicate-token and induction scores of every head, on the text and on a
    repeated random sequence (where only induction can predict the second half)."""
    st = setup(req)
    model, cfg = st.model, st.cfg
    random_ids = analysis.repeated_random_tokens(cfg.d_vocab, req.random_length, 2, req.random_seed)
    n_random = random_ids.size
    check_count("the repeated random sequence", n_random, get_settings().max_tokens, "reduce random_length")
    # The random run uses the weights this model has for a text of that length (the same weights,
    # except for spec-forward, whose position table is drawn per prompt length).
    random_cfg = _configure(model, req, n_random)
    if random_cfg.positional_embedding_type == "learned" and n_random > random_cfg.n_ctx:
        raise ValueError(f"the repeated random sequence has {n_random} tokens, more than the context of "
                         f"{model.name!r}, n_ctx={random_cfg.n_ctx}: reduce random_length")
    ablate_random = ablation_map(req.ablate, random_cfg)
    random_tokens = [model.tokenizer.token_str(int(t)) for t in random_ids]
    longest = max(st.n, n_random)
    p = load(st, forward_work(cfg, st.n, logits=False) + forward_work(random_cfg, n_random, logits=False),
             max(largest_array(random_cfg, n_random), cfg.n_layers * cfg.n_heads * longest * longest))
    on_text = run_with_cache(p.params, cfg, p.ids, names=pattern_hooks(cfg), ablate=p.ablate,
                             logits=False)[1].head_detector_scores()
    random_params = model.load_params(random_cfg, p.seed, Encoding(list(map(int, random_ids)), random_tokens))
    on_random = run_with_cache(random_params, random_cfg, random_ids, names=pattern_hooks(random_cfg),
                               ablate=ablate_random, logits=False)[1].head_detector_scores()
    scores = {name: {"text": on_text[name], "random": on_random[name]} for name in analysis.HEAD_DETECTORS}
    flagged = [FlaggedHead(name, on, layer, head, float(grid[layer, head]))
               for name, by in scores.items() for on, grid in by.items()
               for layer, head in zip(*np.nonzero(np.nan_to_num(grid, nan=-1.0) >= req.threshold))]
    flagged.sort(key=lambda f: -f.score)
    return Detectors(p, list(map(int, random_ids)), random_tokens, scores, req.threshold, flagged)


@dataclass
class KVSteps:
    setup: Prepared
    run: KVRun  # steps (shapes, bytes, logits), all tokens, the final K and V
    token_strs: list[str]  # every token fed in, prompt then generated
    top_ids: list[int]  # the most likely next token after each step
    max_abs_diff: np.ndarray  # [steps]: |cached logits − full recomputation logits|, max over the vocabulary
    itemsize: int  # bytes per cached number


def kv_steps(req) -> KVSteps:
    """Generate token by token with a KV cache, and check every step against a full recomputation."""
    s = get_settings()
    st = setup(req)
    model, cfg, n = st.model, st.cfg, st.n
    reason = kv_cache_reason(model, cfg)
    if reason:
        raise ValueError(reason)
    total = n + req.n_new
    check_count("the text plus the generated tokens", total, s.max_tokens, "reduce n_new or shorten the text")
    if cfg.positional_embedding_type == "learned" and total > cfg.n_ctx:
        raise ValueError(f"{n} tokens of text + n_new={req.n_new} exceed the context of {model.name!r}, "
                         f"n_ctx={cfg.n_ctx} learned positions: reduce n_new to at most {max(cfg.n_ctx - n, 0)}")
    # stepping costs about one full pass over all tokens; the check recomputes them all once more
    p = load(st, 2 * forward_work(cfg, total), 2 * total * cfg.d_vocab,
             "n_new, the text's length, d_model, n_layers or n_heads")
    kv = run_with_kv_cache(p.params, cfg, p.ids, n_new=req.n_new)
    full, _ = run_with_cache(p.params, cfg, kv.tokens, names=())  # [total, d_vocab]
    cached = np.stack([step.logits for step in kv.steps])  # [total, d_vocab]
    diff = np.abs(cached - full).max(axis=-1)  # [total]
    strs = p.encoding.tokens + [model.tokenizer.token_str(int(t)) for t in kv.tokens[n:]]
    return KVSteps(p, kv, strs, [int(np.argmax(step.logits)) for step in kv.steps], diff,
                   p.params["embed"]["W_E"].dtype.itemsize)


@dataclass
class ComparedSide:
    setup: Prepared
    pattern: np.ndarray  # [query_pos, key_pos] of the chosen layer and head


@dataclass
class Comparison:
    a: ComparedSide
    b: ComparedSide
    layer: int
    head: int
    difference: np.ndarray | None  # b − a, when both sides have as many tokens
    note: str | None


COMPARE_FIELDS = ("text", "causal", "scale", "temperature", "positional_embedding_type", "seed", "ablate")


def _pattern(req, layer: int, head: int) -> ComparedSide:
    st = setup(req)
    if layer >= st.cfg.n_layers or head >= st.cfg.n_heads:
        raise ValueError(f"layer {layer}, head {head} does not exist: {st.model.name!r} has {st.cfg.n_layers} "
                         f"layer(s) of {st.cfg.n_heads} head(s), counted from 0")
    p = load(st, forward_work(st.cfg, st.n, logits=False))
    name = f"blocks.{layer}.attn.hook_pattern"
    _, cache = run_with_cache(p.params, p.cfg, p.ids, names=[name], ablate=p.ablate, logits=False)
    return ComparedSide(p, cache[name][head])


def compare(req) -> Comparison:
    """One head's pattern under two settings (req.other changes the first side's), and b − a."""
    a = _pattern(req, req.layer, req.head)
    changes = {k: getattr(req.other, k) for k in COMPARE_FIELDS if getattr(req.other, k) is not None}
    b = _pattern(req.model_copy(update=changes), req.layer, req.head)
    if a.pattern.shape != b.pattern.shape:
        return Comparison(a, b, req.layer, req.head, None,
                          f"the two texts have {a.pattern.shape[0]} and {b.pattern.shape[0]} tokens: a "
                          "difference needs texts of the same number of tokens")
    return Comparison(a, b, req.layer, req.head, b.pattern - a.pattern, None)


@dataclass
class Rollout:
    setup: Prepared
    rollout: np.ndarray  # [n_layers, query_pos, key_pos], rows sum to 1


def rollout(req) -> Rollout:
    """Attention rollout after every layer (core.analysis.attention_rollout); works on any model."""
    s = get_settings()
    st = setup(req)
    cfg, n = st.cfg, st.n
    if cfg.n_layers * n * n > s.max_hook_values:
        raise ValueError(f"the rollout holds {cfg.n_layers * n * n:,} numbers, more than the limit of "
                         f"{s.max_hook_values:,}: use a shorter text")
    p = load(st, forward_work(cfg, n, logits=False) + cfg.n_layers * n ** 3, cfg.n_layers * cfg.n_heads * n * n)
    _, cache = run_with_cache(p.params, cfg, p.ids, names=pattern_hooks(cfg), ablate=p.ablate, logits=False)
    return Rollout(p, rollout_of(cache, cfg))


def pattern_hooks(cfg: TransformerConfig) -> list[str]:
    """Every layer's attention pattern: what `rollout_of` needs."""
    return [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]


def rollout_of(hooks: dict[str, np.ndarray], cfg: TransformerConfig) -> np.ndarray:
    """Attention rollout from a run that kept `pattern_hooks`.  # -> [n_layers, query_pos, key_pos]"""
    return analysis.attention_rollout(np.stack([hooks[name] for name in pattern_hooks(cfg)]))
