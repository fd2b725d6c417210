"""JSON routes under /api/v1: request model (app/api/requests.py) -> service (app/service/) -> response model -> JSON.

Routes are plain `def`s, so FastAPI runs them in its threadpool and NumPy work never blocks the
event loop. Each validates the service's result into its response model (`from_attributes`) and
sends it with orjson (app/http/jsonio.py), arrays straight from NumPy, -inf and NaN as null.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from app.api import requests, responses
from app.deps import ServiceDep
from app.http import sse
from app.http.jsonio import FastJSONResponse
from app.http.security import client_address
from app.service import calculators

router = APIRouter(prefix="/api/v1", tags=["api v1"], default_response_class=FastJSONResponse)

_ERRORS = {422: {"description": "Invalid input, or a request beyond the limits: `detail[].msg` says what to change"}}
_ENCODERS = (
    "Encoders (all-MiniLM-L6-v2) and post-norm models answer 422 saying why: they predict no next "
    "token and have no final layer norm to read the residual stream through."
)


# A run's id as the path takes it: a recipe and 12 hex digits (app/training/store.py training_run_id).
RunId = Annotated[
    str,
    Path(
        min_length=14,
        max_length=64,
        pattern=r"^[a-z-]+-[0-9a-f]{12}$",
        description="a run's id, e.g. induction-3f2a9c1b7d0e (GET /api/v1/runs)",
    ),
]
EVENTS_POLL_S = 0.1  # how often a run's event stream looks for news (a trainer writes progress every 0.1 s)


def respond(model: type[BaseModel], result: object) -> FastJSONResponse:
    """The result read into its response model, as JSON."""
    return FastJSONResponse(model.model_validate(result).model_dump())


# ------------------------------------------------------------------ lessons


@router.get(
    "/lessons/attention",
    response_model=responses.AttentionLessonResponse,
    responses=_ERRORS,
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
    responses=_ERRORS,
    summary="Why divide by √d_k: unscaled scores grow with d and the softmax collapses",
)
def lesson_scaling(q: Annotated[requests.ScalingQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "Why divide by √d_k" table: for each width d, the spread of random dot products and the
    average largest softmax weight, unscaled and scaled."""
    return respond(responses.ScalingResponse, {"rows": svc.lessons.scaling(q.dim_list, q.n_queries, q.n_keys, q.seed)})


@router.get(
    "/lessons/multihead",
    response_model=responses.MultiheadResponse,
    responses=_ERRORS,
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
    responses=_ERRORS,
    summary="Sinusoidal position encodings and their dot products",
)
def lesson_positions(q: Annotated[requests.PositionsQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "Where am I?": the sinusoidal encoding of `n_pos` positions, and the dot products of the
    chosen pairs, which depend only on the gap between the positions."""
    return respond(responses.PositionsResponse, svc.lessons.positions(q.n_pos, q.d, q.pair_list))


@router.get(
    "/lessons/forward",
    response_model=responses.ForwardResponse,
    responses=_ERRORS,
    summary="A full forward pass of the spec's one-block character model",
)
def lesson_forward(q: Annotated[requests.ForwardQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """The spec's "A full forward pass": the printed shapes of every step and the next-character
    probabilities after the prompt, with the spec's random weights."""
    return respond(
        responses.ForwardResponse, svc.lessons.forward(q.text, q.prompt, q.seed, q.d_model, q.n_heads, q.d_mlp)
    )


# ------------------------------------------------------------------ calculators


@router.get(
    "/params",
    response_model=responses.ParamsResponse,
    responses=_ERRORS,
    summary="Count a model's parameters, array by array",
)
def params(q: Annotated[requests.ParamsQuery, Query()]) -> FastJSONResponse:
    """A preset, or explicit sizes (which replace the preset's; the default preset is `toy`).
    `breakdown` names every array, whether it is counted, and why."""
    return respond(responses.ParamsResponse, calculators.params(q.preset, q.sizes()))


@router.get(
    "/kv-cache",
    response_model=responses.KVCacheResponse,
    responses=_ERRORS,
    summary="Memory of a KV cache: keys and values of every layer for every cached token",
)
def kv_cache(q: Annotated[requests.KVCacheQuery, Query()]) -> FastJSONResponse:
    """A preset or sizes, a sequence length (default: the model's context), a batch and an element type
    give the bytes, with the formula and each of its terms."""
    return respond(responses.KVCacheResponse, calculators.kv_cache(q.preset, q.sizes(), q.seq_len, q.batch, q.dtype))


# ------------------------------------------------------------------ models


@router.get("/models", response_model=responses.ModelsResponse, summary="The models this server can run")
def models(svc: ServiceDep) -> FastJSONResponse:
    """Built-in toys, the bundled MiniLM and every checkpoint folder found in EXPLORER_MODELS_DIR, each with
    its config, the toggles it accepts, its default text and seed, and why it cannot run if it cannot."""
    return respond(responses.ModelsResponse, {"models": list(svc.views.models().values())})


@router.get(
    "/hooks",
    response_model=responses.HooksResponse,
    responses=_ERRORS,
    summary="A model's activation (hook) names and their axes",
)
def hooks(q: Annotated[requests.HooksQuery, Query()], svc: ServiceDep) -> FastJSONResponse:
    """Every activation name `POST /api/v1/run` can return for this model (with these layers and this
    position scheme), in forward order, with its axes in TransformerLens' names."""
    return respond(responses.HooksResponse, svc.views.hooks(q.model, q.n_layers, q.positional_embedding_type))


@router.post(
    "/run",
    response_model=responses.RunResponse,
    responses=_ERRORS | {413: {"description": "The body is over {max_body_bytes:,} bytes"}},  # app/main.py
    summary="Run a model on a text: tokens, next-token top-k and the chosen activations",
)
def run(req: requests.RunRequest, svc: ServiceDep) -> FastJSONResponse:
    """Toggles left null keep the model's defaults. Masked attention scores (−∞) are null in JSON."""
    return respond(responses.RunResponse, svc.views.run(req.spec(), req.hooks, req.top_k))


# ------------------------------------------------------------------ looking inside


@router.post(
    "/analysis/decompose",
    response_model=responses.DecomposeResponse,
    responses=_ERRORS,
    summary="Residual-stream decomposition and direct logit attribution at one position",
    description="The last residual stream at `pos` as the sum of what wrote it (embeddings, every head, "
    "every MLP, biases), and each part's direct contribution to the `target` token's logit, with "
    "the final layer norm's σ frozen from the run: `sum(direct_logit) + logit_bias == logit`. " + _ENCODERS,
)
def decompose(req: requests.DecomposeRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(responses.DecomposeResponse, svc.inspect.decompose(req.spec(), req.pos, req.target))


@router.post(
    "/analysis/logit-lens",
    response_model=responses.LogitLensResponse,
    responses=_ERRORS,
    summary="Logit lens: the top tokens the residual stream predicts after every layer",
    description="Each layer's `resid_pre` and `resid_mid`, and the last `resid_post`, passed through the "
    "final layer norm and the unembedding as if the remaining layers were deleted. The last "
    "point is the model's own prediction (equal to `/run`'s `top_k` at the last position). " + _ENCODERS,
)
def logit_lens(req: requests.LogitLensRequest, svc: ServiceDep) -> FastJSONResponse:
    return respond(responses.LogitLensResponse, svc.inspect.logit_lens(req.spec(), req.top_k))


@router.post(
    "/analysis/detectors",
    response_model=responses.DetectorsResponse,
    responses=_ERRORS,
    summary="Previous-token, duplicate-token and induction scores of every head",
)
def detectors(req: requests.DetectorsRequest, svc: ServiceDep) -> FastJSONResponse:
    """A head's score is its mean attention on the keys the detector names (1.0: only there), over the
    queries that have such a key: the token before (previous_token), earlier copies of the same token
    (duplicate_token), the tokens that followed earlier copies (induction). Computed on the text and on a
    random sequence repeated once, where the second half is predictable only by induction. Works on every
    model, encoders included."""
    return respond(
        responses.DetectorsResponse,
        svc.inspect.detectors(req.spec(), req.random_length, req.random_seed, req.threshold),
    )


@router.post(
    "/analysis/kv-cache",
    response_model=responses.KVStepsResponse,
    responses=_ERRORS,
    summary="Generate token by token with a KV cache: shapes, bytes, and agreement with recomputation",
)
def kv_cache_steps(req: requests.KVStepsRequest, svc: ServiceDep) -> FastJSONResponse:
    """Reads the text one token at a time, then greedily generates `n_new` tokens, keeping every layer's K
    and V. Each step appends one row to K and V; `max_abs_diff` compares that step's logits with a full
    recomputation of the whole sequence (it is 0 up to floating-point rounding). Causal decoders only
    (422 otherwise, saying why)."""
    return respond(responses.KVStepsResponse, svc.inspect.kv_steps(req.spec(), req.n_new))


@router.post(
    "/analysis/compare",
    response_model=responses.CompareResponse,
    responses=_ERRORS,
    summary="One head's attention pattern under two texts or two settings, and their difference",
)
def compare(req: requests.CompareRequest, svc: ServiceDep) -> FastJSONResponse:
    """Side `a` is the request's own settings; side `b` is the same with `other`'s fields changed (a text,
    the mask, the scale, the temperature, the positions, the seed, or the ablated heads). `difference` is
    b − a, when both have as many tokens."""
    return respond(responses.CompareResponse, svc.inspect.compare(req.spec(), req.other.changes(), req.layer, req.head))


@router.post(
    "/analysis/rollout",
    response_model=responses.RolloutResponse,
    responses=_ERRORS,
    summary="Attention rollout: how much each input token flows into each position, layer by layer",
)
def rollout(req: requests.RolloutRequest, svc: ServiceDep) -> FastJSONResponse:
    """Abnar & Zuidema (2020): per layer, the heads' mean pattern plus the identity (the residual
    connection), rows renormalised, multiplied through the layers. Works on every model."""
    return respond(responses.RolloutResponse, svc.inspect.rollout(req.spec()))


# ------------------------------------------------------------------ training (v1 additions)

_TRAIN_ERRORS = _ERRORS | {
    404: {"description": "No run with this id"},
    429: {"description": "This client already has its share of runs queued or training (Retry-After)"},
    503: {"description": "Training is off, or the server has its limit of runs queued or training (Retry-After)"},
}


def run_links(id: str) -> dict[str, str]:
    base = f"/api/v1/runs/{id}"
    return {"self": base, "events": f"{base}/events", "checkpoint": f"{base}/checkpoint", "page": f"/train?run={id}"}


@router.post(
    "/train",
    status_code=202,
    response_model=responses.TrainAccepted,
    responses=_TRAIN_ERRORS,
    summary="Train a model: queue a run of a recipe (the same request names the same run)",
)
def train(req: requests.TrainRequest, request: Request, svc: ServiceDep) -> FastJSONResponse:
    """Queues a run in a worker process and answers at once with its id and where to follow it. A run is a
    pure function of its request (recipe, settings, seed, steps): the id is derived from them, so the same
    request returns the same run, and a class pressing Start together trains once. A run that was cut short,
    cancelled or failed is resumed from its last snapshot. Settings left null are the recipe's defaults."""
    info, queued = svc.training.start(req.recipe, req.changes(), client_address(request))
    body = {
        "id": info.id,
        "status": info.status,
        "queued": queued,
        "queue_position": info.queue_position,
        "links": run_links(info.id),
    }
    return FastJSONResponse(
        responses.TrainAccepted.model_validate(body).model_dump(),
        status_code=202,
        headers={"Location": run_links(info.id)["self"]},
    )


@router.get(
    "/runs",
    response_model=responses.TrainingRunsList,
    responses=_TRAIN_ERRORS,
    summary="The training runs this server knows, newest first",
)
def runs(svc: ServiceDep) -> FastJSONResponse:
    """Every run in the runs folder (EXPLORER_RUNS_DIR): queued, training, done, failed, cancelled or
    interrupted (its process died; POST the same request to resume it)."""
    return respond(responses.TrainingRunsList, {"runs": svc.training.all()})


@router.get(
    "/runs/{id}",
    response_model=responses.TrainingRun,
    responses=_TRAIN_ERRORS,
    summary="One training run: status, metrics, head scores, samples, its model",
)
def run_detail(id: RunId, svc: ServiceDep) -> FastJSONResponse:
    """`metrics` and `heads` hold one entry per record (every `eval_interval` steps); `model` is the name
    `/api/v1/run`, `/api/v1/analysis/*` and the pages accept once the run has weights."""
    return respond(responses.TrainingRun, svc.training.get(id))


@router.get(
    "/runs/{id}/events",
    responses=_TRAIN_ERRORS
    | {
        200: {
            "content": {sse.MEDIA_TYPE: {}},
            "description": "`run` (the whole run, first and whenever its status changes), `record` (each new record), "
            "`progress` (step and loss, several times a second) and `end` (the run has finished)",
        }
    },
    summary="Server-Sent Events: a run's progress as it happens",
)
async def run_events(id: RunId, request: Request, svc: ServiceDep, resume: sse.ResumeFrom) -> StreamingResponse:
    """Each event's id says where the stream stands; a client that reconnects with `Last-Event-ID` (as
    EventSource does), or opens a new stream with `since`, gets only what it missed. The stream ends
    after the `end` event."""
    await asyncio.to_thread(svc.training.get, id)  # 404 before the stream starts

    async def changes() -> AsyncIterator[sse.Event]:
        cursor = resume
        while not await request.is_disconnected():
            events, cursor, finished = await asyncio.to_thread(svc.training.changes, id, cursor)
            for name, data in events:
                yield cursor, name, responses.TrainingRun.model_validate(data).model_dump() if name == "run" else data
            if finished:
                yield cursor, "end", {}
                return
            await asyncio.sleep(EVENTS_POLL_S)

    return sse.event_stream(changes(), retry_ms=1000)


@router.delete(
    "/runs/{id}", response_model=responses.TrainingRun, responses=_TRAIN_ERRORS, summary="Stop a queued or training run"
)
def cancel_run(id: RunId, svc: ServiceDep) -> FastJSONResponse:
    """The run stops before its next step and is marked `cancelled`, keeping a snapshot and its weights so
    far (a model you can explore). POST the same request to continue it."""
    return respond(responses.TrainingRun, svc.training.cancel(id))


@router.get(
    "/runs/{id}/checkpoint",
    responses=_TRAIN_ERRORS | {200: {"content": {"application/zip": {}}}},
    summary="Download a run's weights: a zip of its Hugging Face GPT-2 folder",
)
def checkpoint(id: RunId, svc: ServiceDep) -> Response:
    """config.json, model.safetensors and tokenizer.json (with tokenizer_config.json): `transformers`
    opens the folder as it is (GPT2LMHeadModel.from_pretrained)."""
    name, data = svc.training.weights_zip(id)
    return Response(
        data, media_type="application/zip", headers={"Content-Disposition": f'attachment; filename="{name}"'}
    )


@router.get(
    "/runs/{id}/patterns/{step}",
    response_model=responses.TrainingPatterns,
    responses=_TRAIN_ERRORS,
    summary="A run's attention patterns on its probe at one snapshot step",
)
def run_patterns(
    id: RunId,
    step: Annotated[int, Path(ge=0, le=requests.MAX_TRAIN_STEPS, description="a snapshot step")],
    svc: ServiceDep,
) -> FastJSONResponse:
    """Every head of every layer on the recipe's fixed probe sequence, at a step listed in the run's
    `snapshots`: how attention formed as it trained."""
    return respond(responses.TrainingPatterns, svc.training.patterns(id, step))
