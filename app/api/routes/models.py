"""The models: which ones this server can run (/models), a model's activation names (/hooks), and the
calculators of a model's size, its parameters (/params) and its KV cache's memory (/kv-cache)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from app.api import requests, responses
from app.api.routes.shared import api_router, errors, respond
from app.deps import ServiceDep
from app.http.jsonio import FastJSONResponse
from app.service import calculators

router = api_router()


@router.get(
    "/params",
    response_model=responses.ParamsResponse,
    responses=errors(422),
    summary="Count a model's parameters, array by array",
)
def params(q: Annotated[requests.ParamsQuery, Query()]) -> FastJSONResponse:
    """A preset, or explicit sizes (which replace the preset's; the default preset is `toy`).
    `breakdown` names every array, whether it is counted, and why."""
    return respond(responses.ParamsResponse, calculators.params(q.preset, q.sizes()))


@router.get(
    "/kv-cache",
    response_model=responses.KVCacheResponse,
    responses=errors(422),
    summary="Memory of a KV cache: keys and values of every layer for every cached token",
)
def kv_cache(q: Annotated[requests.KVCacheQuery, Query()]) -> FastJSONResponse:
    """A preset or sizes, a sequence length (default: the model's context), a batch and an element type
    give the bytes, with the formula and each of its terms."""
    return respond(responses.KVCacheResponse, calculators.kv_cache(q.preset, q.sizes(), q.seq_len, q.batch, q.dtype))


@router.get("/models", response_model=responses.ModelsResponse, summary="The models this server can run")
def models(svc: ServiceDep) -> FastJSONResponse:
    """Built-in toys, the bundled MiniLM and every checkpoint folder found in EXPLORER_MODELS_DIR, each with
    its config, the toggles it accepts, its default text and seed, and why it cannot run if it cannot."""
    return respond(responses.ModelsResponse, {"models": list(svc.views.models().values())})


@router.get(
    "/hooks",
    response_model=responses.HooksResponse,
    responses=errors(422),
    summary="A model's activation (hook) names and their axes",
)
def hooks(q: Annotated[requests.HooksQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """Every activation name `POST /api/v1/run` can return for this model (with these layers and this
    position scheme), in forward order, with its axes in TransformerLens' names."""
    return respond(responses.HooksResponse, svc.views.hooks(q.model, q.n_layers, q.positional_embedding_type))
