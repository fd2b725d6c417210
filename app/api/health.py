"""Liveness (/healthz: the process answers) and readiness (/readyz: it serves the pages and models, and says what,
if anything, is degraded).

Redis is needed by training alone: with Redis away a replica still serves the explorer, the lessons, Inspect,
circuits, generation and /api/v1/run, so /readyz answers 200 "degraded" naming it, and the proxy (deploy/Caddyfile)
keeps sending it traffic; training answers 503 + Retry-After until Redis is back.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from app import __version__
from app.deps import SettingsDep
from app.paths import STATIC_DIR
from app.service import Service
from app.settings import Settings

router = APIRouter(tags=["health"])

# The list of front-end files copied from node_modules (see scripts/vendor_assets.sh).
VENDOR_LIST = "vendor-files.txt"


class Health(BaseModel):
    status: str = "ok"
    version: str = __version__


# How long /readyz waits for the training store's answer (a Redis ping): well inside the proxy's health_timeout
# (deploy/Caddyfile, 3 s), so a Redis that hangs rather than refuses makes a replica degraded, not unhealthy.
STORE_CHECK_S = 1.0
# One thread asks the store: a ping that hangs holds it (up to the client's socket timeout), and the probes
# behind it wait their STORE_CHECK_S and say so, instead of each taking a thread of their own.
_store_check = ThreadPoolExecutor(1, thread_name_prefix="readyz-store")


class Readiness(BaseModel):
    status: Literal["ready", "degraded", "not ready"] = Field(
        description="ready: everything works; degraded: the pages, lessons and models are served but something "
        "is not (training, while Redis cannot be reached), said in `reasons` (200 both); not ready: the pages "
        "cannot be served (503)"
    )
    reasons: list[str] = Field(default=[], description="empty when ready; otherwise what an operator has to fix")


@router.get("/healthz", response_model=Health, summary="Is the server alive?")
def healthz() -> Health:
    """200 while the process answers: the liveness probe (the image's HEALTHCHECK uses it). Never
    limited and never computing, so it answers while every compute slot is busy."""
    return Health()


def models_dir_problems(models_dir: Path | None) -> list[str]:
    """Why the optional checkpoints folder cannot be read (empty list if it can, or if none is set)."""
    if models_dir is None:
        return []
    if not models_dir.is_dir():
        return [f"EXPLORER_MODELS_DIR={models_dir} is not a folder"]
    try:
        with os.scandir(models_dir) as entries:
            next(entries, None)
    except OSError as e:
        return [f"EXPLORER_MODELS_DIR={models_dir} cannot be read: {e.strerror}"]
    return []


def vendor_asset_problems(static_dir: Path) -> list[str]:
    """Which listed front-end files are missing from static/vendor (empty list if none)."""
    listing = static_dir / VENDOR_LIST
    if not listing.is_file():
        return [f"{listing} is missing, so the front-end files cannot be checked"]
    problems = []
    for line in listing.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        asset = static_dir / "vendor" / Path(line).name
        if not asset.is_file() or asset.stat().st_size == 0:
            problems.append(f"front-end file static/vendor/{asset.name} is missing (run `make setup`)")
    return problems


def store_problems(request: Request, settings: Settings) -> list[str]:
    """What keeps training from working (Redis out of reach): asked in a thread of its own."""
    catalog = getattr(request.app.state, "catalog", None)  # built in the lifespan (app/main.py)
    return [] if catalog is None else Service(catalog, settings).training.problems()


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Can the server serve pages and models, and is anything degraded?",
    responses={
        200: {"description": "ready, or degraded: everything but what `reasons` names is served"},
        503: {"model": Readiness, "description": "not ready: the pages cannot be served; `reasons` says why"},
    },
)
async def readyz(request: Request, response: Response, settings: SettingsDep) -> Readiness:
    """200 "ready" when the front-end files are in place, the models folder, if set, can be read and Redis, if set
    (EXPLORER_REDIS_URL), answers; 200 "degraded" when only Redis does not (training answers 503 meanwhile, all
    else is served); 503 "not ready" when the pages cannot be served. The `reasons` say what an operator has to
    fix. Point a load balancer at it: it answers within about a second whatever Redis does."""
    loop = asyncio.get_running_loop()
    failing = await loop.run_in_executor(
        None, lambda: models_dir_problems(settings.models_dir) + vendor_asset_problems(STATIC_DIR)
    )
    try:
        check = loop.run_in_executor(_store_check, store_problems, request, settings)
        degraded = await asyncio.wait_for(check, STORE_CHECK_S)
    except TimeoutError:
        degraded = [f"training is off for now: Redis did not answer within {STORE_CHECK_S:g} s"]
    if failing:
        response.status_code = 503
        return Readiness(status="not ready", reasons=failing + degraded)
    if degraded:
        return Readiness(status="degraded", reasons=degraded)
    return Readiness(status="ready")
