"""Builds the FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from . import __version__
from .paths import STATIC_DIR
from .routers import health


def create_app() -> FastAPI:
    app = FastAPI(
        title="Transformer Explorer",
        version=__version__,
        description="See how a Transformer works: the spec's lessons, runnable models and their activations.",
        docs_url=None,  # served by our own offline page (no CDN)
        redoc_url=None,
    )
    app.include_router(health.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


app = create_app()
