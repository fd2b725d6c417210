"""All run-time settings in one place, read from the environment (prefix EXPLORER_)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EXPLORER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes")
    log_level: str = Field("info", pattern="^(critical|error|warning|info|debug)$")
    access_log: bool = Field(True, description="one JSON line per request on stdout (app/observability.py)")
    models_dir: Path | None = Field(None, description="folder whose subfolders are Hugging Face checkpoints")
    # Load shedding (app/security.py): beyond this many model/lesson computations in flight per
    # worker, answer 503 + Retry-After at once rather than queue; cheap routes are never limited.
    max_concurrent_compute: int = Field(8, ge=1, le=256, description="compute requests in flight per worker")
    retry_after_s: int = Field(1, ge=1, le=3600, description="Retry-After seconds on a 503 when busy")


@lru_cache
def get_settings() -> Settings:
    return Settings()
