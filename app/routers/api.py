"""JSON routes under /api/v1: parse (app/schemas.py) -> compute (app/service.py) -> JSON (app/jsonio.py).

Routes are plain `def`s, so FastAPI runs them in its threadpool and NumPy work never blocks
the event loop. Each returns a FastJSONResponse built from NumPy arrays; `response_model`
is there only so the OpenAPI documents the JSON.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query

from core import DTYPE_BYTES, hook_shape

from .. import registry, schemas, service
from ..jsonio import FastJSONResponse
from ..settings import get_settings

S = get_settings()

router = APIRouter(prefix="/api/v1", tags=["api v1"], default_response_class=FastJSONResponse)

_ERRORS = {422: {"description": "Invalid input, or a request beyond the limits: `detail[].msg` says what to "
                                "change"}}


def _shapes(**arrays) -> dict[str, list[int]]:
    return {name: list(a.shape) for name, a in arrays.items()}


# ------------------------------------------------------------------ lessons

@router.get("/lessons/attention", response_model=schemas.AttentionLessonResponse, responses=_ERRORS,
            summary="Scaled dot-product attention (and the causal mask) on a few words")
def lesson_attention(q: Annotated[schemas.AttentionQuery, Query()]) -> FastJSONResponse:
    """The spec's "Scaled dot-product attention" section; with `causal=true`, its "Causal masks" section.
    The four stages are `raw_scores` → `scaled_scores` → `scores` (masked, null where forbidden) → `weights`."""
    r = service.lesson_attention(q.text, q.seed, q.d_model, q.d_k, q.causal, q.scale)
    a = r.lesson
    return FastJSONResponse({
        "tokens": a.tokens,
        "shapes": _shapes(X=a.X, W_q=a.W_q, W_k=a.W_k, W_v=a.W_v, Q=a.Q, K=a.K, V=a.V,
                          scores=a.result.scores, weights=a.result.weights, output=a.result.output),
        "raw_scores": a.raw_scores, "scaled_scores": r.scaled_scores, "scores": a.result.scores,
        "mask": a.mask, "weights": a.result.weights, "output": a.result.output, "divisor": r.divisor,
    })


@router.get("/lessons/scaling", response_model=schemas.ScalingResponse, responses=_ERRORS,
            summary="Why divide by √d_k: unscaled scores grow with d and the softmax collapses")
def lesson_scaling(q: Annotated[schemas.ScalingQuery, Query()]) -> FastJSONResponse:
    rows = service.lesson_scaling(q.dim_list, q.n_queries, q.n_keys, q.seed)
    return FastJSONResponse({"rows": [dataclasses.asdict(r) for r in rows]})


@router.get("/lessons/multihead", response_model=schemas.MultiheadResponse, responses=_ERRORS,
            summary="Multi-head attention: heads as a batch axis")
def lesson_multihead(q: Annotated[schemas.MultiheadQuery, Query()]) -> FastJSONResponse:
    m = service.lesson_multihead(q.text, q.seed, q.d_model, q.n_heads, q.causal, q.scale)
    return FastJSONResponse({
        "tokens": m.tokens, "d_head": m.d_head,
        "shapes": _shapes(X=m.X, W_qkv=m.W_qkv, W_o=m.W_o, Q=m.Q, K=m.K, V=m.V, weights=m.result.weights,
                          heads=m.result.output, concat=m.concat, output=m.output),
        "heads": [{"scores": s, "weights": w} for s, w in zip(m.result.scores, m.result.weights)],
        "output": m.output,
    })


@router.get("/lessons/positions", response_model=schemas.PositionsResponse, responses=_ERRORS,
            summary="Sinusoidal position encodings and their dot products")
def lesson_positions(q: Annotated[schemas.PositionsQuery, Query()]) -> FastJSONResponse:
    p = service.lesson_positions(q.n_pos, q.d, q.pair_list)
    return FastJSONResponse({"encoding": p.encoding, "dots": [{"i": i, "j": j, "dot": d} for i, j, d in p.dots]})


@router.get("/lessons/forward", response_model=schemas.ForwardResponse, responses=_ERRORS,
            summary="A full forward pass of the spec's one-block character model")
def lesson_forward(q: Annotated[schemas.ForwardQuery, Query()]) -> FastJSONResponse:
    f = service.lesson_forward(q.text, q.prompt, q.seed, q.d_model, q.n_heads, q.d_mlp)
    return FastJSONResponse({
        "vocab": f.vocab, "tokens": list(f.prompt), "token_ids": f.token_ids,
        "steps": [{"name": n, "shape": list(s)} for n, s in f.steps],
        "next_token_probs": f.next_token_probs, "config": f.cfg.to_dict(),
    })


# ------------------------------------------------------------------ calculators

@router.get("/params", response_model=schemas.ParamsResponse, responses=_ERRORS,
            summary="Count a model's parameters, array by array")
def params(q: Annotated[schemas.ParamsQuery, Query()]) -> FastJSONResponse:
    """A preset, or explicit sizes (which replace the preset's; the default preset is `toy`).
    `breakdown` names every array, whether it is counted, and why."""
    cfg = service.calc_config(q.preset, d_vocab=q.d_vocab, n_ctx=q.n_ctx, d_model=q.d_model, n_layers=q.n_layers,
                              d_mlp=q.d_mlp, tied_embeddings=q.tied_embeddings)
    c = service.param_count(cfg)
    layers = cfg.n_layers
    return FastJSONResponse({
        "config": cfg.to_dict(), "embeddings": c.embeddings, "per_block": c.per_block, "total": c.total,
        "breakdown": [{"name": e.name, "shape": list(e.shape), "per_layer": e.per_layer, "counted": e.counted,
                       "size": e.size, "total": e.size * (layers if e.per_layer else 1) if e.counted else 0,
                       "note": e.note} for e in c.entries],
    })


@router.get("/kv-cache", response_model=schemas.KVCacheResponse, responses=_ERRORS,
            summary="Memory of a KV cache: keys and values of every layer for every cached token")
def kv_cache(q: Annotated[schemas.KVCacheQuery, Query()]) -> FastJSONResponse:
    cfg = service.calc_config(q.preset, n_layers=q.n_layers, d_model=q.d_model, n_heads=q.n_heads)
    k = service.kv_cache(cfg, q.seq_len, q.batch, q.dtype)
    return FastJSONResponse({
        "bytes": k.bytes, "dtype": q.dtype, "formula": k.formula,
        "terms": {"n_layers": k.n_layers, "batch": k.batch, "seq_len": k.seq_len, "n_heads": k.n_kv_heads,
                  "d_head": k.d_head, "dtype_bytes": DTYPE_BYTES[q.dtype]},
        "config": cfg.to_dict(),
    })


# ------------------------------------------------------------------ models

def _model_info(m: registry.Model) -> dict:
    return {"name": m.name, "kind": m.kind, "description": m.description, "config": m.cfg.to_dict(),
            "toggles": list(m.toggles), "is_encoder": m.is_encoder, "default_text": m.default_text,
            "default_seed": m.default_seed, "runnable": m.error is None, "error": m.error}


@router.get("/models", response_model=schemas.ModelsResponse, summary="The models this server can run")
def models() -> FastJSONResponse:
    return FastJSONResponse({"models": [_model_info(m) for m in registry.models().values()]})


@router.get("/hooks", response_model=schemas.HooksResponse, responses=_ERRORS,
            summary="A model's activation (hook) names and their axes")
def hooks(q: Annotated[schemas.HooksQuery, Query()]) -> FastJSONResponse:
    model, cfg, names = service.model_hooks(q.model, q.n_layers, q.positional_embedding_type)
    return FastJSONResponse({"model": model.name, "config": cfg.to_dict(),
                             "hooks": [{"name": n, "shape": s} for n, s in names]})


@router.post("/run", response_model=schemas.RunResponse,
             responses=_ERRORS | {413: {"description": f"The body is over {S.max_body_bytes:,} bytes"}},
             summary="Run a model on a text: tokens, next-token top-k and the chosen activations")
def run(req: schemas.RunRequest) -> FastJSONResponse:
    """Toggles left null keep the model's defaults. Masked attention scores (−∞) are null in JSON."""
    r = service.run(req)
    return FastJSONResponse({
        "model": r.model, "tokens": r.tokens, "token_ids": r.token_ids, "config": r.cfg.to_dict(), "seed": r.seed,
        "hooks": r.hooks,
        "hook_shapes": {h: {"axes": hook_shape(h), "dims": list(a.shape)} for h, a in r.hooks.items()},
        "top_k": [dataclasses.asdict(t) for t in r.top_k],
        "ablation_effect": None if r.ablation is None else dataclasses.asdict(r.ablation),
    })


# ------------------------------------------------------------------ looking inside

_ENCODER_422 = ("Encoders (all-MiniLM-L6-v2) and post-norm models answer 422 saying why: they predict no next "
                "token and have no final layer norm to read the residual stream through.")


def _ablations(ablate: dict[tuple[int, int], str]) -> list[dict]:
    return [{"layer": layer, "head": head, "method": how} for (layer, head), how in ablate.items()]


def _analysis_head(p: service.Prepared) -> dict:
    """The fields every analysis response starts with (schemas.AnalysisResponse)."""
    return {"model": p.model.name, "tokens": p.encoding.tokens, "token_ids": list(p.encoding.ids),
            "config": p.cfg.to_dict(), "seed": p.seed, "ablate": _ablations(p.ablate)}


@router.post("/analysis/decompose", response_model=schemas.DecomposeResponse, responses=_ERRORS,
             summary="Residual-stream decomposition and direct logit attribution at one position")
def decompose(req: schemas.DecomposeRequest) -> FastJSONResponse:
    """The last residual stream at `pos` as the sum of what wrote it (embeddings, every head, every MLP,
    biases), and each part's direct contribution to the `target` token's logit, with the final layer norm's
    σ frozen from the run: `sum(direct_logit) + logit_bias == logit`. """ + _ENCODER_422
    r = service.decompose(req)
    d = r.d
    return FastJSONResponse(_analysis_head(r.setup) | {
        "pos": d.pos, "target": {"token": r.target_str, "id": d.token}, "labels": d.labels,
        "direct_logit": d.direct_logit, "logit_bias": d.logit_bias, "scale": d.scale, "logit": d.logit,
        "parts": d.parts, "part_norms": np.linalg.norm(d.parts, axis=-1),
    })


@router.post("/analysis/logit-lens", response_model=schemas.LogitLensResponse, responses=_ERRORS,
             summary="Logit lens: the top tokens the residual stream predicts after every layer")
def logit_lens(req: schemas.LogitLensRequest) -> FastJSONResponse:
    """Each layer's `resid_pre` and `resid_mid`, and the last `resid_post`, passed through the final layer
    norm and the unembedding as if the remaining layers were deleted. The last point is the model's own
    prediction (equal to `/run`'s `top_k` at the last position). """ + _ENCODER_422
    r = service.logit_lens(req)
    strs, ids, probs = r.token_strs, r.top_ids.tolist(), r.top_probs.tolist()
    return FastJSONResponse(_analysis_head(r.setup) | {
        "points": r.points,
        "top_k": [[[{"token": strs[t], "id": t, "prob": pr} for t, pr in zip(cell_ids, cell_probs)]
                   for cell_ids, cell_probs in zip(point_ids, point_probs)]
                  for point_ids, point_probs in zip(ids, probs)],
    })


@router.post("/analysis/detectors", response_model=schemas.DetectorsResponse, responses=_ERRORS,
             summary="Previous-token, duplicate-token and induction scores of every head")
def detectors(req: schemas.DetectorsRequest) -> FastJSONResponse:
    """A head's score is its mean attention on the keys the detector names (1.0: only there), over the
    queries that have such a key: the token before (previous_token), earlier copies of the same token
    (duplicate_token), the tokens that followed earlier copies (induction). Computed on the text and on a
    random sequence repeated once, where the second half is predictable only by induction. Works on every
    model, encoders included."""
    r = service.detectors(req)
    return FastJSONResponse(_analysis_head(r.setup) | {
        "random_tokens": r.random_tokens, "random_token_ids": r.random_ids,
        "detectors": r.scores, "threshold": r.threshold,
        "flagged": [dataclasses.asdict(f) for f in r.flagged],
    })


@router.post("/analysis/kv-cache", response_model=schemas.KVStepsResponse, responses=_ERRORS,
             summary="Generate token by token with a KV cache: shapes, bytes, and agreement with recomputation")
def kv_cache_steps(req: schemas.KVStepsRequest) -> FastJSONResponse:
    """Reads the text one token at a time, then greedily generates `n_new` tokens, keeping every layer's K
    and V. Each step appends one row to K and V; `max_abs_diff` compares that step's logits with a full
    recomputation of the whole sequence (it is 0 up to floating-point rounding). Causal decoders only
    (422 otherwise, saying why)."""
    r = service.kv_steps(req)
    cfg = r.setup.cfg
    steps = [{"pos": st.pos, "token": r.token_strs[st.pos], "id": st.token, "generated": st.generated,
              "k_shape": list(st.k_shape), "v_shape": list(st.k_shape), "cache_bytes": st.cache_bytes,
              "max_abs_diff": float(diff), "top": {"token": r.setup.model.tokenizer.token_str(top), "id": top}}
             for st, diff, top in zip(r.run.steps, r.max_abs_diff, r.top_ids)]
    n_text = len(r.setup.encoding.ids)
    return FastJSONResponse(_analysis_head(r.setup) | {
        "steps": steps, "generated_text": "".join(r.token_strs[n_text:]),
        "dtype": str(r.run.kv.keys[0].dtype),
        "bytes_formula": (f"2 × n_layers {cfg.n_layers} × n_heads {cfg.n_heads} × d_head {cfg.d_head} × "
                          f"{r.itemsize} bytes = {2 * cfg.n_layers * cfg.n_heads * cfg.d_head * r.itemsize:,} "
                          "bytes per token"),
        "max_abs_diff": float(r.max_abs_diff.max()),
    })


@router.post("/analysis/compare", response_model=schemas.CompareResponse, responses=_ERRORS,
             summary="One head's attention pattern under two texts or two settings, and their difference")
def compare(req: schemas.CompareRequest) -> FastJSONResponse:
    """Side `a` is the request's own settings; side `b` is the same with `other`'s fields changed (a text,
    the mask, the scale, the temperature, the positions, the seed, or the ablated heads). `difference` is
    b − a, when both have as many tokens."""
    r = service.compare(req)

    def side(s: service.ComparedSide) -> dict:
        return {"tokens": s.setup.encoding.tokens, "config": s.setup.cfg.to_dict(),
                "ablate": _ablations(s.setup.ablate), "pattern": s.pattern}

    return FastJSONResponse({"model": r.a.setup.model.name, "layer": r.layer, "head": r.head,
                             "a": side(r.a), "b": side(r.b), "difference": r.difference, "note": r.note})


@router.post("/analysis/rollout", response_model=schemas.RolloutResponse, responses=_ERRORS,
             summary="Attention rollout: how much each input token flows into each position, layer by layer")
def rollout(req: schemas.RolloutRequest) -> FastJSONResponse:
    """Abnar & Zuidema (2020): per layer, the heads' mean pattern plus the identity (the residual
    connection), rows renormalised, multiplied through the layers. Works on every model."""
    r = service.rollout(req)
    return FastJSONResponse(_analysis_head(r.setup) | {"rollout": r.rollout})
