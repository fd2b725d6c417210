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
    """Toggles left null keep the model's defaults. Masked attention scores (−∞) are null in JSON."""
    return respond(responses.RunResponse, svc.views.run(req.spec(), req.hooks, req.top_k))
