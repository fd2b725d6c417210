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
    models_dir: Path | None = Field(None, description="folder whose subfolders are Hugging Face checkpoints")


@lru_cache
def get_settings() -> Settings:
    return Settings()
