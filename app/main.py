"""Builds the FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from threadpoolctl import threadpool_limits

from . import __version__
from .compression import CachedStaticFiles, GZipMiddleware
from .observability import AccessLogMiddleware, configure_access_log
from .paths import STATIC_DIR
from . import errors
from .bodylimit import BodySizeLimitMiddleware, UrlLengthLimitMiddleware
from .routers import api, docs, health, inspect, lessons, pages
from .security import ComputeLimitMiddleware, SecurityHeadersMiddleware
from .settings import get_settings


def create_app() -> FastAPI:
    threadpool_limits(get_settings().blas_threads, user_api="blas")  # process-wide, see Settings.blas_threads
    app = FastAPI(
        title="Transformer Explorer",
        version=__version__,
        description=("See how a Transformer works: the spec's lessons, runnable models and their activations. "
                     f"Request bodies are limited to {get_settings().max_body_bytes:,} bytes (413 beyond), URLs "
                     f"to {get_settings().max_url_bytes:,} bytes (414 beyond); every error answers in JSON as "
                     '{"detail": [{"loc", "msg", "type"}]}.'),
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
    # Middleware, outermost first (each add_middleware wraps what was added before it):
    #   AccessLog > SecurityHeaders > ServerError > UrlLengthLimit > BodySizeLimit > ComputeLimit > GZip
    # - the access log is outermost, so its duration covers every layer and it logs every answer;
    # - the security headers go on every answer below them: refusals (414, 413, 503) and a bug's 500;
    # - a bug's 500 is answered here, inside the security headers (Starlette's own ServerErrorMiddleware
    #   sits outside all of these and would answer without them); the exception still propagates;
    # - requests too large are refused before they take a compute slot;
    # - gzip is innermost: it compresses what the routes answer (refusals are too small to matter).
    settings = get_settings()
    app.add_middleware(GZipMiddleware)  # off the event loop for big bodies; static files compressed once
    app.add_middleware(ComputeLimitMiddleware, limit=settings.max_concurrent_compute,
                       retry_after_s=settings.retry_after_s)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(UrlLengthLimitMiddleware, max_bytes=settings.max_url_bytes)
    app.add_middleware(ServerErrorMiddleware, handler=errors.unexpected)
    app.add_middleware(SecurityHeadersMiddleware)
    if settings.access_log:
        configure_access_log(settings.log_level)
        app.add_middleware(AccessLogMiddleware)
    app.mount("/static", CachedStaticFiles(directory=STATIC_DIR), name="static")
    return app


app = create_app()
