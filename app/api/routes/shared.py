"""What every route module shares: the router it starts from, `respond()`, and the one table of the
error answers an operation documents (its `responses=`)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter
from pydantic import BaseModel

from app.http.jsonio import FastJSONResponse

# Each error status the API answers with, and what it means (app/http/errors.py writes the body:
# {"detail": [{"loc", "msg", "type"}]}). An operation names the ones it can answer with `errors()`.
ERRORS: dict[int, str] = {
    401: "No credential: this needs the teacher's token (`Authorization: Bearer`)",
    403: "Not yours to do: not the teacher's token",
    422: "Invalid input, or a request beyond the limits: `detail[].msg` says what to change",
    404: "No run with this id",
    413: "The body is over {max_body_bytes:,} bytes",  # app/main.py writes in the limit it is given
    429: "This client already has its share of runs queued or training (Retry-After)",
    503: "Training is off, or the server has its limit of runs queued or training (Retry-After)",
}
TRAINING = (422, 404, 429, 503)  # what an operation on training runs can answer


def api_router() -> APIRouter:
    """A resource's router: under /api/v1, in the API's one tag, answering JSON."""
    return APIRouter(prefix="/api/v1", tags=["api v1"], default_response_class=FastJSONResponse)


def errors(*statuses: int, said: Mapping[int, str] | None = None) -> dict[int | str, dict]:
    """The `responses=` of an operation that can answer with these statuses, in this order, each described
    as the table says, or as `said` says for this operation."""
    said = said or {}
    return {status: {"description": said.get(status, ERRORS[status])} for status in statuses}


def respond(
    model: type[BaseModel], result: object, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> FastJSONResponse:
    """The service's result read into its response model (`from_attributes`), as JSON."""
    return FastJSONResponse(model.model_validate(result).model_dump(), status_code=status_code, headers=headers)
