"""Looking inside a model: residual decomposition, logit lens, head detectors, KV-cache steps, rollout.

Every function is pure: it takes parameters, a config and token ids (or a cache), runs the
model through `core.model.run_with_cache`, and returns plain arrays in TransformerLens'
vocabulary. Shapes carry no batch axis, as in the rest of core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .attention import merge_heads, scaled_dot_product_attention, split_heads
from .config import TransformerConfig
from .functional import layer_norm, softmax
from .model import Ablation, Params, check_tokens, mlp_block, per_head_weights, run_with_cache, unembedding
from .positions import apply_rotary, sinusoidal


def _require_pre_norm(cfg: TransformerConfig, what: str) -> None:
    if cfg.block_type != "pre_norm":
        raise ValueError(f"{what} needs a pre-norm model (GPT-2 style, with a final layer norm); "
                         f"this model is {cfg.block_type}, whose residual stream is re-normalised in every block")


def _check_position(pos: int, n: int) -> int:
    if not isinstance(pos, (int, np.integer)) or not -n <= pos < n:
        raise ValueError(f"position {pos!r} is outside the text's {n} tokens (use 0..{n - 1}, or -1 for the last)")
    return int(pos) % n


def _check_token(token: int, cfg: TransformerConfig) -> int:
    if not isinstance(token, (int, np.integer)) or not 0 <= token < cfg.d_vocab:
        raise ValueError(f"token id {token!r} is outside the vocabulary 0..{cfg.d_vocab - 1}")
    return int(token)


# ------------------------------------------------------------------ residual decomposition

@dataclass(frozen=True)
class ResidualDecomposition:
    """The final residual vector at one position as a sum of the parts that wrote it.

    sum(parts) == blocks.{n_layers-1}.hook_resid_post[pos], and
    sum(direct_logit) + logit_bias == the model's logit for `token` at `pos`.
    """

    pos: int
    token: int  # the token whose logit is attributed
    labels: list[str]  # "embed", "pos_embed", "L0H3", "L0 attn bias", "L0 mlp", "L0 mlp bias", ...
    parts: np.ndarray  # [n_parts, d_model]
    direct_logit: np.ndarray  # [n_parts], each part's direct contribution to the token's logit
    logit_bias: float  # ln_final.b · W_U[:, token] + b_U[token]: written by no part of the residual
    scale: float  # the final layer norm's σ at pos, frozen from the run
    logit: float  # the model's actual logit


def residual_decomposition(
    params: Params,
    cfg: TransformerConfig,
    tokens,
    token: int,
    pos: int = -1,
    ablate: Mapping[tuple[int, int], Ablation] | None = None,
) -> ResidualDecomposition:
    """Split the last residual stream at `pos` into what each component added, and attribute `token`'s logit.

    In a pre-norm model every sub-layer adds its output to the residual stream, so the final
    stream is exactly the sum of the embeddings, every head's z[h] @ W_O[h], every attention
    bias b_O, every MLP's post @ W_out and every MLP bias b_out. The final layer norm is
    linear except for its 1/σ; freezing σ at its value from the run (direct logit
    attribution, as TransformerLens does) makes the logit a sum over those parts.
    """
    _require_pre_norm(cfg, "the residual-stream decomposition")
    tokens = check_tokens(tokens, cfg)
    pos, token = _check_position(pos, tokens.size), _check_token(token, cfg)
    logits, cache = run_with_cache(params, cfg, tokens, ablate=ablate)

    labels, parts = ["embed"], [cache["hook_embed"][pos]]
    for name, label in (("hook_pos_embed", "pos_embed"), ("hook_token_type_embed", "token_type_embed")):
        if name in cache:
            labels.append(label)
            parts.append(cache[name][pos])
    for layer, block in enumerate(params["blocks"]):
        W_O = per_head_weights(block["attn"], cfg)["W_O"]  # [n_heads, d_head, d_model]
        z = cache[f"blocks.{layer}.attn.hook_z"][pos]  # [n_heads, d_head]
        heads = np.einsum("hd,hdm->hm", z, W_O)  # [n_heads, d_model]
        labels += [f"L{layer}H{h}" for h in range(cfg.n_heads)]
        parts += list(heads)
        if "b_O" in block["attn"]:
            labels.append(f"L{layer} attn bias")
            parts.append(block["attn"]["b_O"])
        labels.append(f"L{layer} mlp")
        parts.append(cache[f"blocks.{layer}.mlp.hook_post"][pos] @ block["mlp"]["W_out"])  # [d_model]
        if "b_out" in block["mlp"]:
            labels.append(f"L{layer} mlp bias")
            parts.append(block["mlp"]["b_out"])
    parts_arr = np.stack(parts)  # [n_parts, d_model]

    resid = cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"][pos]  # [d_model]
    scale = float(np.sqrt(resid.var() + cfg.eps))
    ln = params.get("ln_final", {})
    W_U, b_U = unembedding(params)
    direction = W_U[:, token] * ln["w"] if "w" in ln else W_U[:, token]  # [d_model]
    centred = parts_arr - parts_arr.mean(axis=-1, keepdims=True)  # centring is linear: apply it per part
    direct_logit = centred @ direction / scale  # [n_parts]
    logit_bias = float(ln["b"] @ W_U[:, token] if "b" in ln else 0.0) + float(0.0 if b_U is None else b_U[token])
    return ResidualDecomposition(pos, token, labels, parts_arr, direct_logit, logit_bias, scale,
                                 float(logits[pos, token]))


# ------------------------------------------------------------------ logit lens

def lens_points(cfg: TransformerConfig) -> list[str]:
    """Where the lens reads the residual stream, in order.

    blocks.{l}.hook_resid_post is the same array as blocks.{l+1}.hook_resid_pre, so it is
    listed once, for the last layer only (as TransformerLens' accumulated_resid does).
    """
    points = []
    for layer in range(cfg.n_layers):
        points += [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_resid_mid"]
    return points + [f"blocks.{cfg.n_layers - 1}.hook_resid_post"]


@dataclass(frozen=True)
class LogitLens:
    points: list[str]  # hook names, see lens_points
    top_tokens: np.ndarray  # [n_points, pos, k] token ids, most probable first
    top_probs: np.ndarray  # [n_points, pos, k]


def lens_logits(params: Params, cfg: TransformerConfig, resid: np.ndarray) -> np.ndarray:
    """The final layer norm and unembedding applied to any residual stream.  # [..., d_model] -> [..., d_vocab]"""
    ln = params.get("ln_final", {})
    W_U, b_U = unembedding(params)
    out = layer_norm(resid, ln.get("w"), ln.get("b"), cfg.eps) @ W_U
    return out if b_U is None else out + b_U


def logit_lens(params: Params, cfg: TransformerConfig, tokens, k: int = 5,
               ablate: Mapping[tuple[int, int], Ablation] | None = None) -> LogitLens:
    """Decode every intermediate residual stream as if it were the last (nostalgebraist, 2020).

    Each point is normalised with its own σ (not the final one), exactly as the model would
    normalise it if the remaining layers were deleted; so the last point is the model's output.
    """
    _require_pre_norm(cfg, "the logit lens")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= cfg.d_vocab:
        raise ValueError(f"k={k!r} must be between 1 and the vocabulary size {cfg.d_vocab}")
    points = lens_points(cfg)
    _, cache = run_with_cache(params, cfg, tokens, names=points, ablate=ablate, logits=False)
    resid = np.stack([cache[p] for p in points])  # [n_points, pos, d_model]
    probs = softmax(lens_logits(params, cfg, resid))  # [n_points, pos, d_vocab]
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :k]  # [n_points, pos, k]
    return LogitLens(points, top, np.take_along_axis(probs, top, axis=-1))


# ------------------------------------------------------------------ head detectors

def stack_patterns(cache: Mapping[str, np.ndarray], n_layers: int) -> np.ndarray:
    """Every layer's attention pattern.  # -> [n_layers, head_index, query_pos, key_pos]"""
    return np.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(n_layers)])


def previous_token_keys(tokens: np.ndarray) -> np.ndarray:
    """[query_pos, key_pos] True where key = query - 1."""
    n = len(tokens)
    return np.eye(n, k=-1, dtype=bool)


def duplicate_token_keys(tokens: np.ndarray) -> np.ndarray:
    """[query_pos, key_pos] True where an earlier key holds the query's own token."""
    tokens = np.asarray(tokens)
    same = tokens[:, None] == tokens[None, :]
    return same & np.tri(len(tokens), k=-1, dtype=bool)


def induction_keys(tokens: np.ndarray) -> np.ndarray:
    """[query_pos, key_pos] True where the key comes right after an earlier occurrence of the query's token.

    In "A B ... A", the second A's induction key is B: the head looks back for what followed
    A last time, so the model can predict B again.
    """
    tokens = np.asarray(tokens)
    n = len(tokens)
    keys = np.zeros((n, n), dtype=bool)
    keys[:, 1:] = tokens[:, None] == tokens[None, :-1]  # key j follows a copy of the query's token
    return keys & np.tri(n, k=-1, dtype=bool)  # only earlier keys: the current token is no memory


HEAD_DETECTORS = {"previous_token": previous_token_keys, "duplicate_token": duplicate_token_keys,
                  "induction": induction_keys}


def detector_score(patterns: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mean attention mass on the relevant keys, over the queries that have any.

    patterns: [..., query_pos, key_pos]; keys: [query_pos, key_pos] boolean. For each query
    with at least one relevant key, the score sums its weights on those keys (1.0 when the
    head attends only there, 0.0 when it never does), then averages over those queries.
    Queries with no relevant key (the first token, for previous-token) are left out, so a
    perfect head scores exactly 1.0. NaN when no query has a relevant key (e.g. no repeated
    token for the duplicate and induction detectors).  # -> [...]
    """
    rows = keys.any(axis=-1)  # [query_pos]
    if not rows.any():
        return np.full(patterns.shape[:-2], np.nan)
    mass = (patterns * keys).sum(axis=-1)  # [..., query_pos]
    return mass[..., rows].mean(axis=-1)


def head_detector_scores(params: Params, cfg: TransformerConfig, tokens,
                         ablate: Mapping[tuple[int, int], Ablation] | None = None) -> dict[str, np.ndarray]:
    """Each detector's score for every head on these tokens.  # -> {name: [n_layers, n_heads]}

    previous_token: mass on the token just before. duplicate_token: mass on earlier copies
    of the same token. induction: mass on the tokens that followed earlier copies of the
    current token. Run them on `repeated_random_tokens` to find induction heads.
    """
    tokens = check_tokens(tokens, cfg)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
    _, cache = run_with_cache(params, cfg, tokens, names=names, ablate=ablate, logits=False)
    patterns = stack_patterns(cache, cfg.n_layers)  # [n_layers, n_heads, pos, pos]
    return {name: detector_score(patterns, keys(tokens)) for name, keys in HEAD_DETECTORS.items()}


def repeated_random_tokens(d_vocab: int, length: int, n_repeats: int = 2, seed: int = 0) -> np.ndarray:
    """`length` random token ids repeated `n_repeats` times: the second copy is predictable only
    by induction (look up what followed this token last time).  # -> [length * n_repeats]"""
    for name, value in (("d_vocab", d_vocab), ("length", length), ("n_repeats", n_repeats)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    half = np.random.default_rng(seed).integers(0, d_vocab, size=length)
    return np.tile(half, n_repeats)


# ------------------------------------------------------------------ KV cache, stepped

@dataclass(frozen=True)
class KVStep:
    pos: int
    token: int  # the token fed in at this step
    generated: bool  # False while reading the prompt, True for tokens the model chose
    k_shape: tuple[int, int, int]  # every layer's K: [n_heads, pos + 1, d_head]; V has the same
    cache_bytes: int  # all layers' K and V
    logits: np.ndarray  # [d_vocab], the prediction for the next token


@dataclass(frozen=True)
class KVRun:
    steps: list[KVStep]
    tokens: np.ndarray  # [pos], prompt then generated
    keys: list[np.ndarray]  # per layer [n_heads, pos, d_head] (rotated, for rotary)
    values: list[np.ndarray]  # per layer [n_heads, pos, d_head]


def _embed_one(params: Params, cfg: TransformerConfig, token: int, pos: int) -> np.ndarray:  # -> [1, d_model]
    W_E = params["embed"]["W_E"]
    x = W_E[[token]]
    if cfg.positional_embedding_type == "learned":
        x = x + params["pos_embed"]["W_pos"][[pos]]
    elif cfg.positional_embedding_type == "sinusoidal":
        x = x + sinusoidal(pos + 1, cfg.d_model)[[pos]].astype(W_E.dtype)
    if cfg.n_token_types:
        x = x + params["token_type_embed"]["W_token_type"][[0]]  # a decoder's text is all segment 0
    if cfg.block_type == "post_norm":
        x = _norm(x, params["ln_embed"], cfg)
    return x


def _norm(x: np.ndarray, ln: Mapping, cfg: TransformerConfig) -> np.ndarray:
    return layer_norm(x, ln.get("w"), ln.get("b"), cfg.eps)


def _attention_step(x, attn: Mapping, cfg: TransformerConfig, K: np.ndarray, V: np.ndarray, pos: int):
    """One new query against every cached key.  # x [1, d_model], K, V [n_heads, pos, d_head]"""
    qkv = x @ attn["W_QKV"]  # [1, 3 * n_heads * d_head]
    if "b_QKV" in attn:
        qkv = qkv + attn["b_QKV"]
    q, k, v = (split_heads(m, cfg.n_heads) for m in np.split(qkv, 3, axis=-1))  # each [n_heads, 1, d_head]
    if cfg.positional_embedding_type == "rotary":
        where = np.array([pos])
        q, k = apply_rotary(q, where), apply_rotary(k, where)  # K is cached already rotated
    K, V = np.concatenate([K, k], axis=1), np.concatenate([V, v], axis=1)  # [n_heads, pos + 1, d_head]
    # The newest query is the last position, so it may see every cached key: no mask is needed.
    z = scaled_dot_product_attention(q, K, V, scale=cfg.use_attn_scale, temperature=cfg.attn_temperature).output
    out = merge_heads(z) @ attn["W_O"]  # [1, d_model]
    if "b_O" in attn:
        out = out + attn["b_O"]
    return out, K, V


def _no_hook(name: str, value: np.ndarray) -> np.ndarray:
    return value


def run_with_kv_cache(params: Params, cfg: TransformerConfig, prompt, n_new: int = 0) -> KVRun:
    """Feed the prompt one token at a time, then greedily generate `n_new` tokens, keeping K and V.

    Each step computes q, k, v for the one new token only, appends k and v to every layer's
    cache and attends from the new query to all cached keys: the same numbers as re-running
    the whole sequence, at a cost per step that grows with the length instead of its square.
    Only a causal model can be cached: with a bidirectional one, a new token changes the
    keys' own outputs.
    """
    if not cfg.causal:
        raise ValueError("a KV cache needs causal attention: in a bidirectional model every new token "
                         "changes the earlier positions too, so nothing can be reused")
    prompt = check_tokens(prompt, cfg)
    if not isinstance(n_new, (int, np.integer)) or n_new < 0:
        raise ValueError(f"n_new must be a non-negative integer, got {n_new!r}")
    if cfg.positional_embedding_type == "learned" and prompt.size + n_new > cfg.n_ctx:
        raise ValueError(f"{prompt.size} prompt tokens + {n_new} new ones exceed the model's context "
                         f"of n_ctx={cfg.n_ctx}")
    dtype = params["embed"]["W_E"].dtype
    empty = np.zeros((cfg.n_heads, 0, cfg.d_head), dtype=dtype)
    keys, values = [empty] * cfg.n_layers, [empty] * cfg.n_layers
    W_U, b_U = unembedding(params)
    tokens, steps = list(prompt), []
    pos = 0
    while pos < len(tokens):
        x = _embed_one(params, cfg, tokens[pos], pos)  # [1, d_model]
        for layer, block in enumerate(params["blocks"]):
            pre = cfg.block_type == "pre_norm"
            attn_out, keys[layer], values[layer] = _attention_step(
                _norm(x, block["ln1"], cfg) if pre else x, block["attn"], cfg, keys[layer], values[layer], pos)
            if pre:
                x = x + attn_out
                x = x + mlp_block(_norm(x, block["ln2"], cfg), block["mlp"], cfg, _no_hook, "")
            else:
                x = _norm(x + attn_out, block["ln1"], cfg)
                x = _norm(x + mlp_block(x, block["mlp"], cfg, _no_hook, ""), block["ln2"], cfg)
        if cfg.block_type == "pre_norm":
            x = _norm(x, params["ln_final"], cfg)
        logits = (x @ W_U)[0]  # [d_vocab]
        if b_U is not None:
            logits = logits + b_U
        steps.append(KVStep(pos, int(tokens[pos]), pos >= prompt.size, keys[0].shape,
                            sum(k.nbytes + v.nbytes for k, v in zip(keys, values)), logits))
        if pos == len(tokens) - 1 and len(tokens) < prompt.size + n_new:
            tokens.append(int(np.argmax(logits)))  # greedy: the most probable next token
        pos += 1
    return KVRun(steps, np.array(tokens), keys, values)


# ------------------------------------------------------------------ attention rollout

def attention_rollout(patterns: np.ndarray) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020): how much each input token flows into each position.

    patterns: [n_layers, head_index, query_pos, key_pos]. Per layer, average the heads, add the
    identity for the residual connection and renormalise the rows (so Ã = (A + I) / 2); then
    multiply the layers: R_0 = Ã_0, R_l = Ã_l R_{l-1}. Returns R_l for every layer
    [n_layers, query_pos, key_pos]; each row of each R_l sums to 1.
    """
    if patterns.ndim != 4 or patterns.shape[-1] != patterns.shape[-2]:
        raise ValueError(f"expected patterns [n_layers, head_index, pos, pos], got shape {patterns.shape}")
    mixed = patterns.mean(axis=1) + np.eye(patterns.shape[-1])  # [n_layers, pos, pos]
    mixed /= mixed.sum(axis=-1, keepdims=True)
    rollout = np.empty_like(mixed)
    current = np.eye(patterns.shape[-1])
    for layer, a in enumerate(mixed):
        current = a @ current
        rollout[layer] = current
    return rollout
