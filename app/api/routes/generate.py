"""POST /api/v1/generate: write with a model, the whole generation as JSON, or streamed step by step.

The body (app/api/generation_models.py) is checked and the whole generation priced before anything is
computed (the service's `start`): bad input is a 422 with the reason, as JSON, before any stream begins.
A client that asks for `Accept: text/event-stream` (the /generate page does, with fetch) then gets
Server-Sent Events as each token is written: `start` (the prompt's tokens, the settings, the model's
end-of-text ids), one `step` per token (the same object as the JSON's `steps[i]`) and `end` (the
finish reason and the generated text). Each step is computed off the event loop; when the client goes
away (the page's Stop), no further step is computed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

from fastapi import Request

from app.api.generation_models import SAMPLING_HELP, GeneratedModel, GenerateRequest, GenerateResponse, StepModel
from app.api.routes.shared import api_router, errors, respond
from app.deps import ServiceDep
from app.http import sse
from app.service.generation import GenerationRun

router = api_router()

_RESPONSES = {
    200: {
        "content": {sse.MEDIA_TYPE: {}},
        "description": "The whole generation as JSON; with `Accept: text/event-stream`, Server-Sent Events: `start` "
        "(the response's fields but steps, generated and finish_reason), `step` (one per token, as "
        "`steps[i]`), `end` (`finish_reason`, `generated`)",
    },
} | errors(
    422,
    said={
        422: "Invalid input, or a generation beyond the limits (temperature < 0, top_p outside (0, 1], "
        "top_k < 1, max_new_tokens past the limit or the model's context, an encoder): "
        "`detail[].msg` says what to change"
    },
)


def head(run: GenerationRun) -> dict:
    """What the stream starts with: the response's fields that are known before the first step."""
    return GenerateResponse.model_validate(run.result()).model_dump(exclude={"steps", "generated", "finish_reason"})


async def events(run: GenerationRun, request: Request) -> AsyncIterator[sse.Event]:
    steps: Iterator = iter(run)
    yield None, "start", head(run)
    while True:
        if await request.is_disconnected():
            return  # the client left (Stop): nothing more is computed
        step = await asyncio.to_thread(next, steps, None)  # one token: NumPy work off the event loop
        if step is None:
            break
        yield str(step.index), "step", StepModel.model_validate(step).model_dump()
    result = run.result()
    yield (
        None,
        "end",
        {
            "finish_reason": result.finish_reason,
            "generated": GeneratedModel.model_validate(result.generated).model_dump(),
        },
    )


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses=_RESPONSES,
    summary="Write with a model: temperature, top-k, top-p, each token's distribution and attention",
    description="Continues `text` by up to `max_new_tokens` tokens through the KV cache. Every step "
    "records the token and its probability, its distribution before and after each setting "
    "(the top 20 and the cut-off), the attention row of the query that chose it in every layer "
    "and head (over every token so far), the cache's bytes and the heads acting as attention "
    "sinks (weight on the first token above `sink_threshold`). Decoders only. " + SAMPLING_HELP,
)
async def generate(req: GenerateRequest, request: Request, svc: ServiceDep):
    spec, settings = req.spec(), req.generate_settings()
    if sse.MEDIA_TYPE in request.headers.get("accept", ""):
        run = await asyncio.to_thread(svc.generation.start, spec, settings)  # a 422 here, before the stream
        return sse.event_stream(events(run, request))
    result = await asyncio.to_thread(svc.generation.generate, spec, settings)
    return respond(GenerateResponse, result)
