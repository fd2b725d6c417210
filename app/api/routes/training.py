"""Training runs: POST /api/v1/train queues a run, /api/v1/runs lists them, and each run has its detail,
its Server-Sent Events (app/http/sse.py), its weights as a zip and its attention patterns by step.

A run is a pure function of its request: the id is derived from it (app/training/base.py), so the same
request names the same run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Path, Request
from fastapi.responses import Response, StreamingResponse

from app.api import requests, responses
from app.api.routes.shared import TRAINING, api_router, errors, respond
from app.deps import ServiceDep
from app.http import sse
from app.http.jsonio import FastJSONResponse
from app.http.security import client_address
from app.service import RUN_ID_MAX_LENGTH, RUN_ID_MIN_LENGTH, RUN_ID_PATTERN

router = api_router()

# A run's id as the path takes it: a recipe and 12 hex digits, the one pattern the store checks too
# (app/training/base.py RUN_ID_PATTERN, re-exported by app.service).
RunId = Annotated[
    str,
    Path(
        min_length=RUN_ID_MIN_LENGTH,
        max_length=RUN_ID_MAX_LENGTH,
        pattern=RUN_ID_PATTERN,
        description="a run's id, e.g. induction-3f2a9c1b7d0e (GET /api/v1/runs)",
    ),
]
EVENTS_POLL_S = 0.1  # how often a run's event stream looks for news (a trainer writes progress every 0.1 s)


def run_links(id: str) -> dict[str, str]:
    base = f"/api/v1/runs/{id}"
    return {"self": base, "events": f"{base}/events", "checkpoint": f"{base}/checkpoint", "page": f"/train?run={id}"}


@router.post(
    "/train",
    status_code=202,
    response_model=responses.TrainAccepted,
    responses=errors(*TRAINING),
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
    return respond(responses.TrainAccepted, body, status_code=202, headers={"Location": run_links(info.id)["self"]})


@router.get(
    "/runs",
    response_model=responses.TrainingRunsList,
    responses=errors(*TRAINING),
    summary="The training runs this server knows, newest first",
)
def runs(svc: ServiceDep) -> FastJSONResponse:
    """Every run in the runs folder (EXPLORER_RUNS_DIR): queued, training, done, failed, cancelled or
    interrupted (its process died; POST the same request to resume it)."""
    return respond(responses.TrainingRunsList, {"runs": svc.training.all()})


@router.get(
    "/runs/{id}",
    response_model=responses.TrainingRun,
    responses=errors(*TRAINING),
    summary="One training run: status, metrics, head scores, samples, its model",
)
def run_detail(id: RunId, svc: ServiceDep) -> FastJSONResponse:
    """`metrics` and `heads` hold one entry per record (every `eval_interval` steps); `model` is the name
    `/api/v1/run`, `/api/v1/analysis/*` and the pages accept once the run has weights."""
    return respond(responses.TrainingRun, svc.training.get(id))


@router.get(
    "/runs/{id}/events",
    responses=errors(*TRAINING)
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
    "/runs/{id}",
    response_model=responses.TrainingRun,
    responses=errors(*TRAINING),
    summary="Stop a queued or training run",
)
def cancel_run(id: RunId, svc: ServiceDep) -> FastJSONResponse:
    """The run stops before its next step and is marked `cancelled`, keeping a snapshot and its weights so
    far (a model you can explore). POST the same request to continue it."""
    return respond(responses.TrainingRun, svc.training.cancel(id))


@router.get(
    "/runs/{id}/checkpoint",
    responses=errors(*TRAINING)
    | {200: {"content": {"application/zip": {}}, "description": "a Hugging Face GPT-2 folder, or a SAELens folder"}},
    summary="Download a run's weights: a zip of its model's Hugging Face GPT-2 folder, or its SAE's SAELens folder",
)
def checkpoint(id: RunId, svc: ServiceDep) -> Response:
    """A model's run: its Hugging Face GPT-2 folder, config.json, model.safetensors and tokenizer.json (with
    tokenizer_config.json), which `transformers` opens as it is (GPT2LMHeadModel.from_pretrained). An SAE's run
    (recipe sae): its SAELens folder, cfg.json and sae_weights.safetensors, which SAELens's `SAE.load_from_disk`
    opens (the same files as GET /api/v1/saes/{id}/download)."""
    name, data = svc.training.weights_zip(id)
    return Response(
        data, media_type="application/zip", headers={"Content-Disposition": f'attachment; filename="{name}"'}
    )


@router.get(
    "/runs/{id}/patterns/{step}",
    response_model=responses.TrainingPatterns,
    responses=errors(*TRAINING),
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
