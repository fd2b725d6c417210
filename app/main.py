"""Builds the FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI
from threadpoolctl import threadpool_limits

from . import __version__
from .compression import CachedStaticFiles, GZipMiddleware
from .observability import AccessLogMiddleware, configure_access_log
from .paths import STATIC_DIR
from . import errors
from .bodylimit import BodySizeLimitMiddleware
from .routers import api, docs, health, inspect, lessons, pages
from .security import ComputeLimitMiddleware, SecurityHeadersMiddleware
from .settings import get_settings


def create_app() -> FastAPI:
    threadpool_limits(get_settings().blas_threads, user_api="blas")  # process-wide, see Settings.blas_threads
    app = FastAPI(
        title="Transformer Explorer",
        version=__version__,
        description="See how a Transformer works: the spec's lessons, runnable models and their activations.",
        docs_url=None,  # served by our own offline page (no CDN)
        redoc_url=None,
    )
    app.include_router(health.router)
    app.include_router(api.router)
    app.include_router(docs.router)
    app.include_router(pages.router)
    app.include_router(inspect.router)
    app.include_router(lessons.router)
    errors.install(app)
    app.add_middleware(GZipMiddleware)  # off the event loop for big bodies; static files compressed once
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=get_settings().max_body_bytes)
    app.mount("/static", CachedStaticFiles(directory=STATIC_DIR), name="static")
    # Added last = outermost: the headers also go on the limiter's 503s and on error responses.
    limits = get_settings()
    app.add_middleware(ComputeLimitMiddleware, limit=limits.max_concurrent_compute,
                       retry_after_s=limits.retry_after_s)
    app.add_middleware(SecurityHeadersMiddleware)
    # Keep this one last (outermost): the logged duration then covers every other middleware.
    if get_settings().access_log:
        configure_access_log(get_settings().log_level)
        app.add_middleware(AccessLogMiddleware)
    return app


app = create_app()
