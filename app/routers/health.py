"""Liveness."""

from fastapi import APIRouter
from pydantic import BaseModel

from .. import __version__

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str = "ok"
    version: str = __version__


@router.get("/healthz", response_model=Health, summary="Is the server alive?")
def healthz() -> Health:
    return Health()
