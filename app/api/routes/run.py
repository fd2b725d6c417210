"""POST /api/v1/run: a model on a text, its tokens, next-token top-k and the activations asked for."""

from __future__ import annotations

from app.api import requests, responses
from app.api.routes.shared import api_router, errors, respond
from app.deps import ServiceDep
from app.http.jsonio import FastJSONResponse

router = api_router()


@router.post(
    "/run",
    response_model=responses.RunResponse,
    responses=errors(422, 413),
    summary="Run a model on a text: tokens, next-token top-k and the chosen activations",
)
def run(req: requests.RunRequest, svc: ServiceDep) -> FastJSONResponse:
    """Toggles left null keep the model's defaults. Masked attention scores (−∞) are null in JSON.

    With `steer` (a decoder; not with `ablate`): the hooks and `top_k` are the steered run's, and
    `steering_effect` holds the unsteered prediction beside it. A steer that does not fit the model or this
    server's SAEs (a vector of another length, an unknown SAE, an SAE of another model or hook, a feature out
    of range, a position past the text) is a 422 saying which steer and why."""
    spec = req.spec()
    if spec.steering is not None:
        return respond(responses.RunResponse, svc.steering.run(spec, req.hooks, req.top_k))
    return respond(responses.RunResponse, svc.views.run(spec, req.hooks, req.top_k))
