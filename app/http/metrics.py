"""/metrics in Prometheus' text format, through prometheus-client, for whoever runs the servers.

Off by default (EXPLORER_METRICS=false: no /metrics route at all), because what it tells (which routes are
used, how long the training queue is) is nobody's business on a laptop served to a class. Where it is on,
keep it off the public side: the scale stack's Caddy answers /metrics with 404 (deploy/Caddyfile) and a
Prometheus inside the network scrapes each replica directly.

    explorer_http_requests_total{route, method, status}          requests answered, by route template
    explorer_http_request_duration_seconds{route, method}         how long each took (histogram)
    explorer_compute_rejections_total                            503s of the compute limiter (busy)
    explorer_training_runs{status}                               runs by status (from the store)
    explorer_training_queue_length                               runs waiting to start
    explorer_training_workers, explorer_training_worker_nodes    Celery worker processes and machines alive
    explorer_training_store_up                                   0 when Redis cannot be reached

Multi-process safe: the counters and histograms use prometheus-client's multiprocess mode, one folder of
memory-mapped files shared by every uvicorn worker of one server (PROMETHEUS_MULTIPROC_DIR, set here to a
folder under the temporary directory named by the server's process id), and a scrape answered by any
worker adds them all up. The training gauges are read from the store when scraped, so every replica tells
the same queue.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.settings import Settings

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DIR_PREFIX = "explorer-metrics-"
_metrics: dict[str, Any] = {}  # this process's metric objects (an app may be built more than once)


def install(app: FastAPI, settings: Settings) -> None:
    """With EXPLORER_METRICS on: count every request (outermost middleware) and serve /metrics."""
    if not settings.metrics:
        return
    folder = multiprocess_folder(settings)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)  # read by prometheus-client when a value is made
    if not _metrics:
        from prometheus_client import Counter, Histogram

        _metrics.update(
            requests=Counter("explorer_http_requests", "HTTP requests answered", ["route", "method", "status"]),
            duration=Histogram(
                "explorer_http_request_duration_seconds",
                "Time to answer, from arrival to the last byte",
                ["route", "method"],
                buckets=BUCKETS_S,
            ),
            rejected=Counter("explorer_compute_rejections", "Requests the compute limiter answered 503 (busy)"),
        )
    app.add_middleware(MetricsMiddleware)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(folder))
        registry.register(TrainingCollector(request.app))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def multiprocess_folder(settings: Settings) -> Path:
    """One folder per server: the uvicorn supervisor's process id with several workers, else this process's.
    Folders of servers that are gone are removed."""
    owner = os.getppid() if settings.workers > 1 else os.getpid()
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{DIR_PREFIX}*"):
        pid = old.name.removeprefix(DIR_PREFIX)
        if pid.isdigit() and int(pid) != owner and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    folder = root / f"{DIR_PREFIX}{owner}"
    folder.mkdir(exist_ok=True)
    return folder


class MetricsMiddleware:
    """Pure ASGI (streams are not buffered): times each request and labels it by its route's template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")  # set by the router when a route matched
            name = getattr(route, "path", None) or "unmatched"
            _metrics["requests"].labels(name, scope["method"], str(status)).inc()
            _metrics["duration"].labels(name, scope["method"]).observe(time.perf_counter() - start)
            if status == 503 and route is None:  # refused before routing: the compute limiter
                _metrics["rejected"].inc()


class TrainingCollector:
    """The training store's numbers, read when scraped (the Redis store's are every replica's)."""

    def __init__(self, app: FastAPI):
        self.app = app

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        store = getattr(getattr(self.app.state, "catalog", None), "training_runs", None)
        if store is None:
            return
        up = GaugeMetricFamily("explorer_training_store_up", "Whether the training store answers (1) or not (0)")
        try:
            stats = store.stats()
        except Exception:  # Redis away: say so, and nothing else
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        runs = GaugeMetricFamily("explorer_training_runs", "Training runs by status", labels=["status"])
        for status, n in stats["runs"].items():
            runs.add_metric([status], n)
        yield runs
        yield GaugeMetricFamily(
            "explorer_training_queue_length", "Training runs waiting to start", value=stats["queue"]
        )
        if stats.get("workers") is not None:
            yield GaugeMetricFamily(
                "explorer_training_workers", "Celery training processes alive (last 30 s)", value=stats["workers"]
            )
            yield GaugeMetricFamily(
                "explorer_training_worker_nodes",
                "Celery workers (machines) alive (last 30 s)",
                value=stats["worker_nodes"],
            )
