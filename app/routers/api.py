"""JSON routes under /api/v1: parse (app/schemas.py) -> compute (app/service.py) -> JSON (app/jsonio.py).

Routes are plain `def`s, so FastAPI runs them in its threadpool and NumPy work never blocks
the event loop. Each returns a FastJSONResponse built from NumPy arrays; `response_model`
is there only so the OpenAPI documents the JSON.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

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
    })
