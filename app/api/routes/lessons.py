"""The spec's lessons under /api/v1/lessons: attention and its mask, why scale, multi-head attention,
position encodings, a full forward pass. Each computes on a few words with the spec's random weights."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from app.api import requests, responses
from app.api.routes.shared import api_router, errors, respond
from app.deps import ServiceDep
from app.http.jsonio import FastJSONResponse

router = api_router()


@router.get(
    "/lessons/attention",
    response_model=responses.AttentionLessonResponse,
    responses=errors(422),
    summary="Scaled dot-product attention (and the causal mask) on a few words",
)
def lesson_attention(q: Annotated[requests.AttentionQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "Scaled dot-product attention" section; with `causal=true`, its "Causal masks" section.
    The four stages are `raw_scores` → `scaled_scores` → `scores` (masked, null where forbidden) → `weights`."""
    return respond(
        responses.AttentionLessonResponse, svc.lessons.attention(q.text, q.seed, q.d_model, q.d_k, q.causal, q.scale)
    )


@router.get(
    "/lessons/scaling",
    response_model=responses.ScalingResponse,
    responses=errors(422),
    summary="Why divide by √d_k: unscaled scores grow with d and the softmax collapses",
)
def lesson_scaling(q: Annotated[requests.ScalingQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "Why divide by √d_k" table: for each width d, the spread of random dot products and the
    average largest softmax weight, unscaled and scaled."""
    return respond(responses.ScalingResponse, {"rows": svc.lessons.scaling(q.dim_list, q.n_queries, q.n_keys, q.seed)})


@router.get(
    "/lessons/multihead",
    response_model=responses.MultiheadResponse,
    responses=errors(422),
    summary="Multi-head attention: heads as a batch axis",
)
def lesson_multihead(q: Annotated[requests.MultiheadQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "Multi-head attention": one QKV matrix for every head, split by reshaping, each head's
    scores and weights, and the concatenated heads projected by W_o."""
    return respond(
        responses.MultiheadResponse, svc.lessons.multihead(q.text, q.seed, q.d_model, q.n_heads, q.causal, q.scale)
    )


@router.get(
    "/lessons/positions",
    response_model=responses.PositionsResponse,
    responses=errors(422),
    summary="Sinusoidal position encodings and their dot products",
)
def lesson_positions(q: Annotated[requests.PositionsQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "Where am I?": the sinusoidal encoding of `n_pos` positions, and the dot products of the
    chosen pairs, which depend only on the gap between the positions."""
    return respond(responses.PositionsResponse, svc.lessons.positions(q.n_pos, q.d, q.pair_list))


@router.get(
    "/lessons/forward",
    response_model=responses.ForwardResponse,
    responses=errors(422),
    summary="A full forward pass of the spec's one-block character model",
)
def lesson_forward(q: Annotated[requests.ForwardQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "A full forward pass": the printed shapes of every step and the next-character
    probabilities after the prompt, with the spec's random weights."""
    return respond(
        responses.ForwardResponse, svc.lessons.forward(q.text, q.prompt, q.seed, q.d_model, q.n_heads, q.d_mlp)
    )
