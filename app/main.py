"""Builds the FastAPI application: routers, error handlers, middleware, and the model catalogue at start-up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from threadpoolctl import threadpool_limits

from app import __version__
from app.api import health, routes
from app.classes import open_class_store
from app.deps import apply_settings
from app.http import errors, metrics
from app.http.bodylimit import BodySizeLimitMiddleware, UrlLengthLimitMiddleware
from app.http.compression import CachedStaticFiles, GZipMiddleware
from app.http.language import LanguageMiddleware
from app.http.observability import AccessLogMiddleware, configure_access_log
from app.http.security import ComputeLimitMiddleware, SecurityHeadersMiddleware, busy_description, is_compute
from app.models.catalog import build_catalog
from app.pages import attribution as attribution_page
from app.pages import circuits as circuits_page
from app.pages import classroom, docs, explorer, glossary, inspect, lessons, train
from app.pages import features as features_page
from app.pages import generate as generate_page
from app.paths import STATIC_DIR
from app.service.classes import Classes
from app.settings import Settings, get_settings, in_effect, lent_threads
from app.training import FolderStore
from app.training.scheduler import TrainingManager


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app for these settings (default: the environment's, EXPLORER_*). Given settings also
    become what every route's settings dependency returns."""
    s = settings or get_settings()
    threadpool_limits(s.blas_threads, user_api="blas")  # process-wide, see Settings.blas_threads

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Found once per process: the built-in models and the checkpoint folders' config.json files
        # (weights load on first use). Routes get it through app/deps.py.
        app.state.catalog = catalog = build_catalog(s)
        # Training runs queued in the runs folder start in worker processes (app/training/scheduler.py);
        # runs in Redis are Celery's workers' (app/training/jobs.py), so no manager runs for them.
        manager = None
        if isinstance(catalog.training_runs, FolderStore) and catalog.training_runs.error is None:
            manager = TrainingManager(catalog.training_runs, s.train_workers)
            scheduler = asyncio.create_task(manager.run_forever())
        # Live classes, in this process or in Redis (app/classes/); the class routes reach them on app.state.
        app.state.classes = Classes(open_class_store(s), s)
        yield
        await app.state.classes.store.close()
        if manager is not None:
            scheduler.cancel()
            await asyncio.to_thread(manager.shutdown)

    app = FastAPI(
        title="Transformer Explorer",
        version=__version__,
        description=(
            "See how a Transformer works: the spec's lessons, runnable models and their activations. "
            f"Request bodies are limited to {s.max_body_bytes:,} bytes (413 beyond), URLs "
            f"to {s.max_url_bytes:,} bytes (414 beyond); every error answers in JSON as "
            '{"detail": [{"loc", "msg", "type"}]}.'
        ),
        docs_url=None,  # served by our own offline page (no CDN)
        redoc_url=None,
        lifespan=lifespan,
        dependencies=[Depends(apply_settings)],  # request models validate against the injected settings
    )
    if settings is not None:
        app.dependency_overrides[get_settings] = lambda: settings
    app.openapi = _openapi_for_injected_settings(app, s)  # type: ignore[method-assign]  # FastAPI's way to extend the schema
    app.include_router(health.router)
    for router in routes.ROUTERS:  # /api/v1, one router per resource
        app.include_router(router)
    app.include_router(docs.router)
    # Every page knows whether its reader is a teacher presenting a live class (its "Presenting" bar).
    presenting = [Depends(classroom.presenting)]
    for page in (
        explorer,
        inspect,
        lessons,
        train,
        glossary,
        circuits_page,
        generate_page,
        features_page,
        attribution_page,
        classroom,
    ):
        app.include_router(page.router, dependencies=presenting)
    errors.install(app)
    # Middleware, outermost first (each add_middleware wraps what was added before it):
    #   AccessLog > SecurityHeaders > Language > ServerError > UrlLengthLimit > BodySizeLimit > ComputeLimit > GZip
    # - the access log is outermost, so its duration covers every layer and it logs every answer;
    # - the security headers go on every answer below them: refusals (414, 413, 503) and a bug's 500;
    # - a bug's 500 is answered here, inside the security headers (Starlette's own ServerErrorMiddleware
    #   sits outside all of these and would answer without them); the exception still propagates;
    # - requests too large are refused before they take a compute slot;
    # - gzip is innermost: it compresses what the routes answer (refusals are too small to matter).
    app.add_middleware(GZipMiddleware)  # off the event loop for big bodies; static files compressed once
    app.add_middleware(
        ComputeLimitMiddleware,
        limit=s.max_concurrent_compute,
        retry_after_s=s.retry_after_s,
        queue_s=s.compute_queue_s,
        lend=lent_threads(s),
    )
    # A text to train on may be larger than any other body: up to 4 bytes a character, and the form around it.
    train_body = 4 * s.train_max_text_chars + 8192
    app.add_middleware(
        BodySizeLimitMiddleware, max_bytes=s.max_body_bytes, larger={"/api/v1/train": train_body, "/train": train_body}
    )
    app.add_middleware(UrlLengthLimitMiddleware, max_bytes=s.max_url_bytes)
    app.add_middleware(ServerErrorMiddleware, handler=errors.unexpected)
    # the reader's language (English or Malay) for everything inside it, error messages included
    app.add_middleware(LanguageMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)
    if s.access_log:
        configure_access_log(s.log_level)
        app.add_middleware(AccessLogMiddleware)
    metrics.install(app, s)  # EXPLORER_METRICS: /metrics, and the outermost middleware that counts every answer
    app.mount("/static", CachedStaticFiles(directory=STATIC_DIR), name="static")
    return app


def _openapi_for_injected_settings(app: FastAPI, s: Settings) -> Callable[[], dict[str, Any]]:
    """app.openapi, written with the limits of the settings the routes are given (the `get_settings`
    dependency, overrides included): the request models read them from the settings in effect
    (app/api/requests.py), as they do when they validate a request. Kept until those settings change.
    The body limit a 413 states is the middleware's, these app settings' `s`."""
    write = app.openapi  # FastAPI's own: builds the schema once and keeps it in app.openapi_schema
    written: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        settings = app.dependency_overrides.get(get_settings, get_settings)()
        if "schema" not in written or written["settings"] != settings:
            app.openapi_schema = None
            with in_effect(settings):
                schema = write()
            for operation in (op for ops in schema.get("paths", {}).values() for op in ops.values()):
                for param in operation.get("parameters", ()):
                    # A description that states a setting is written into the field's schema when the schema
                    # is (requests.stating); FastAPI copies a query field's fixed description to its
                    # parameter, and so do we.
                    if "description" in param.get("schema", {}) and "description" not in param:
                        param["description"] = param["schema"]["description"]
                if "413" in operation.get("responses", {}):  # "The body is over {max_body_bytes:,} bytes"
                    said = operation["responses"]["413"]
                    said["description"] = said["description"].format(max_body_bytes=s.max_body_bytes)
            busy = busy_description(s.max_concurrent_compute, s.compute_queue_s, s.retry_after_s)
            for path, operations in schema.get("paths", {}).items():
                if is_compute(path):  # the compute limiter's 503, in front of the route (app/http/security.py)
                    for operation in operations.values():
                        said = operation.setdefault("responses", {}).setdefault("503", {"description": busy})
                        if said["description"] != busy:
                            said["description"] += f"; or {busy[0].lower()}{busy[1:]}"
            written.update(schema=schema, settings=settings)
        return written["schema"]

    return openapi


app = create_app()
