"""Liveness (/healthz: the process answers) and readiness (/readyz: it can serve what it should)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from app import __version__
from app.deps import SettingsDep
from app.paths import STATIC_DIR
from app.service import Service

router = APIRouter(tags=["health"])

# The list of front-end files copied from node_modules (see scripts/vendor_assets.sh).
VENDOR_LIST = "vendor-files.txt"


class Health(BaseModel):
    status: str = "ok"
    version: str = __version__


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    reasons: list[str] = []  # empty when ready; otherwise what an operator has to fix


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


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Can the server serve pages and models?",
    responses={503: {"model": Readiness, "description": "not ready; `reasons` says why"}},
)
def readyz(request: Request, response: Response, settings: SettingsDep) -> Readiness:
    """200 when the front-end files are in place, the models folder, if set, can be read and Redis, if set
    (EXPLORER_REDIS_URL), answers; 503 with the `reasons` an operator has to fix otherwise. Point a load
    balancer at it."""
    reasons = models_dir_problems(settings.models_dir) + vendor_asset_problems(STATIC_DIR)
    catalog = getattr(request.app.state, "catalog", None)  # built in the lifespan (app/main.py)
    if catalog is not None:
        reasons += Service(catalog, settings).training.problems()
    if reasons:
        response.status_code = 503
        return Readiness(status="not ready", reasons=reasons)
    return Readiness(status="ready")
