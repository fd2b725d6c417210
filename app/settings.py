"""All run-time settings in one place, read from the environment (prefix EXPLORER_).

A route is given its settings by the `get_settings` dependency (app/deps.py; an app made with
create_app(settings), or `app.dependency_overrides[get_settings]`, gives others). The request models'
limits (`Limit`, below: app/api/requests.py, the run's knobs in app/models/knobs.py) read
`settings_in_effect()`: the settings of the request being validated (app/deps.py `apply_settings`, every
route's first dependency) or of the OpenAPI being written (app/main.py), else the environment's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field
from pydantic_core import PydanticKnownError, core_schema
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.threads import MAX_WIDTH


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EXPLORER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes")
    log_level: str = Field("info", pattern="^(critical|error|warning|info|debug)$")
    access_log: bool = Field(True, description="one JSON line per request on stdout (app/http/observability.py)")
    # BLAS threads per worker. Requests already run in parallel (one per threadpool thread), so a
    # second BLAS thread per matrix product only waits: measured on 2 cores, a 256-token toy run's
    # p50 fell from 206 ms to 21 ms under 32 clients with 1 thread (bench/api_load.py).
    blas_threads: int = Field(1, ge=1, le=256, description="BLAS threads per worker process")
    # A compute request that starts while no other is computing in its worker may spread its long passes over
    # this many threads (core.threads.lend): the lone learner's 1,024-token runs use the machine, and under load
    # every request keeps to blas_threads. 0: the CPUs this process may run on, shared out among the workers.
    lend_threads: int = Field(
        0, ge=0, le=MAX_WIDTH, description="threads for a compute request computing alone (0: the CPUs / workers)"
    )
    models_dir: Path | None = Field(None, description="folder whose subfolders are Hugging Face checkpoints")
    # Loaded pretrained weights kept in a worker's own memory (app/models/pretrained.py); beyond it the least
    # recently used model is dropped. Only float16/bfloat16 files count, upcast to float32 (4 bytes a
    # parameter: SmolLM2-135M 513 MiB, Qwen2.5-0.5B 1,885 MiB, Qwen3-0.6B 2,274 MiB, TinyLlama-1.1B
    # 4,196 MiB); float32 files are memory-mapped, shared by the workers, and not counted.
    pretrained_memory_mb: int = Field(
        5120, ge=1, le=1_048_576, description="MiB of upcast (float16/bfloat16) pretrained weights per worker"
    )
    # Training (app/training/folder_store.py, app/training/scheduler.py). Runs live in runs_dir (None: a per-user
    # folder, see runs_folder()); each trains in its own process, at most train_workers at once per runs folder.
    runs_dir: Path | None = Field(None, description="folder of training runs (default: per-user data folder)")
    # Sparse autoencoders (app/models/saes.py): each subfolder in SAELens's format is an SAE named after it.
    saes_dir: Path | None = Field(None, description="folder whose subfolders are SAEs in SAELens's format")
    # A feature's dashboard reads the SAE over its model's own text (app/service/features.py), once per SAE:
    # at most this many tokens of it (Python's documentation is about 465,000 characters).
    sae_scan_max_tokens: int = Field(
        16384, ge=1, le=1_048_576, description="tokens of the corpus a feature dashboard's scan reads"
    )
    runs_max_mb: int = Field(
        2048, ge=1, le=1_048_576, description="MB the runs folder may hold; oldest finished runs are deleted beyond it"
    )
    train_workers: int = Field(1, ge=0, le=64, description="training processes at once (0: training off)")
    train_max_per_client: int = Field(2, ge=1, le=1000, description="runs one client may have queued or running")
    train_max_runs: int = Field(16, ge=1, le=10_000, description="runs queued or running in all")
    train_max_text_chars: int = Field(
        200_000, ge=1, le=1_000_000, description="characters of a text of your own (the text recipe)"
    )
    # Beyond one machine (docs/deployment.md, "A whole school: several machines"): with a Redis URL the runs live
    # in Redis and Celery workers train them (`python -m app.worker`, EXPLORER_TRAIN_WORKERS processes each, on
    # any machine that reaches Redis); unset, the runs folder and the in-process scheduler above. The pickup time
    # sets Celery's visibility timeout and the run lock's lease (app/training/redis_store.py `Timing`).
    redis_url: str | None = Field(
        None,
        description="redis://[:password@]host:port/db (rediss:// over TLS): runs "
        "live in Redis and are trained by Celery workers",
    )
    # Over TLS every client checks Redis's certificate (redis_connection_url below): against this authority when
    # Redis's certificate is a school's own, else against the system's.
    redis_ca: Path | None = Field(
        None,
        description="PEM file of the certificate authority that signed a rediss:// Redis's certificate "
        "(unset: the system's authorities)",
    )
    train_pickup_s: float = Field(
        60,
        ge=3,
        le=3600,
        description="seconds within which another worker takes up a run whose worker machine died (Redis only)",
    )
    # Live classes (app/classes/, app/service/classes.py): a class is forgotten after this long without a
    # teacher's or a student's action; a teacher's link is for one room, so the students a class takes are
    # capped; and codes are 2.1 × 10¹¹ (app/classes/base.py), so at this many wrong codes a minute per client
    # finding a class by guessing takes longer than any class lasts.
    class_idle_s: int = Field(3 * 3600, ge=60, le=7 * 86400, description="seconds a live class lasts without activity")
    class_max_students: int = Field(200, ge=1, le=10_000, description="students one live class takes")
    class_max_wrong_codes: int = Field(
        20, ge=1, le=10_000, description="wrong class codes one client may try a minute (429 beyond)"
    )
    metrics: bool = Field(
        False,
        description="serve Prometheus metrics at /metrics (request counts and latencies "
        "by route, training queue and workers)",
    )
    # Load shedding (app/http/security.py): beyond this many model/lesson computations in flight per
    # worker, the next ones wait their turn (first come, first served) for at most compute_queue_s, then
    # get 503 + Retry-After; cheap routes are never limited. The wait absorbs a burst: 32 scripted
    # clients calling a 1 ms lesson, 2,400 requests, got 1,377-1,822 503s without it (0 s) on a shared 2-core
    # machine, none with it (tests/security/test_compute_queue.py), and it is short enough that a request the
    # server cannot reach soon is told so while its reader still waits.
    max_concurrent_compute: int = Field(8, ge=1, le=256, description="compute requests in flight per worker")
    compute_queue_s: float = Field(
        5.0, ge=0, le=60, description="seconds a compute request waits for a free slot before a 503 (0: none)"
    )
    retry_after_s: int = Field(1, ge=1, le=3600, description="Retry-After seconds on a 503 when busy")

    # Request limits. The request models (app/api/requests.py) state them, read from the settings in effect
    # when a request is validated and when the OpenAPI is written, so each is stated once, refused and shown alike.
    # Sizes a learner can choose when running a model or a lesson:
    max_tokens: int = Field(1024, ge=1, description="tokens in one text (words for the lessons)")
    max_text_chars: int = Field(4096, ge=1, description="characters in one text")
    max_d_model: int = Field(512, ge=1, description="width of the residual stream")
    max_heads: int = Field(16, ge=1, description="attention heads per layer")
    max_layers: int = Field(12, ge=1, description="blocks of a runnable model")
    max_d_mlp: int = Field(2048, ge=1, description="hidden width of the MLP (forward lesson)")
    max_top_k: int = Field(100, ge=0, description="next-token predictions returned")
    max_hooks: int = Field(256, ge=1, description="hook names in one run request")
    max_dims: int = Field(8, ge=1, description="entries of a list parameter (scaling's dims, positions' pairs)")
    max_queries: int = Field(100_000, ge=1, description="random queries in the scaling lesson")
    max_body_bytes: int = Field(65536, ge=1024, description="bytes of a request body (413 beyond)")
    # A page's whole state is in its URL, text included (4,096 characters percent-encode to at most
    # 49,152 bytes). 65,535 is the most uvicorn's httptools parser takes: it keeps a URL's offsets in
    # 16 bits, and uvicorn answers a longer URL with a plain-text 400, not our 414 (app/http/bodylimit.py).
    max_url_bytes: int = Field(65535, ge=1024, le=65535, description="bytes of a URL, path and query (414 beyond)")
    # The cost of one request, checked before computing (422 saying what to reduce):
    max_work: int = Field(1_000_000_000, ge=1, description="multiply-adds and random draws of one request")
    # A pretrained model's weights are loaded, not drawn, and a real one is large: the explorer's
    # 128-token view of SmolLM2-135M is 1.4 × 10¹⁰ multiply-adds, of Qwen2.5-0.5B 4.7 × 10¹⁰, and the
    # logit lens decodes every layer through the whole vocabulary (Qwen's default text: 1.4 × 10¹¹).
    # One BLAS thread on this 2-core machine does 2.3-2.8 × 10¹⁰ a second (docs/models.md, "Work limits"), so a
    # request at 2 × 10¹¹ takes about 8 s, and the logit lens of every named model's default text fits.
    max_pretrained_work: int = Field(
        200_000_000_000, ge=1, description="multiply-adds of one request on a pretrained (loaded) model"
    )
    max_elements: int = Field(2**24, ge=1, description="elements of the largest array one request creates")
    max_params: int = Field(8_000_000, ge=1, description="parameters of a toy model drawn for a run")
    max_hook_values: int = Field(2**21, ge=1, description="numbers returned in one run response's hooks")
    # Looking inside a run (the Inspect views and their API): heads switched off, tokens generated.
    max_ablations: int = Field(64, ge=1, description="heads ablated in one request")
    max_new_tokens: int = Field(64, ge=0, description="tokens generated by the stepped KV-cache view")
    # Steering (`steer` on /run and /generate, /api/v1/analysis/steering-vector): pushes in one request, and
    # texts on each side of a difference of means (each a text of at most max_text_chars, all priced as work).
    max_steers: int = Field(8, ge=1, description="steers in one run or generation request")
    steer_max_texts: int = Field(32, ge=1, description="texts on each side of a steering vector's difference of means")
    # Circuits (/circuits, /api/v1/analysis/patching ...): a patching sweep is one patched run per cell
    # (GPT-2 small's heads by position at 32 tokens: 12 × 12 × 32 = 4,608), also priced as work.
    patching_max_passes: int = Field(4096, ge=1, description="patched runs in one activation-patching sweep")
    ov_max_sources: int = Field(16, ge=1, description="source tokens one OV-circuit request lists")
    # Writing with a model (/generate, POST /api/v1/generate): each step returns the choosing query's
    # attention row in every layer and head (SmolLM2-135M: 270 rows a token), so both are bounded.
    generate_max_new_tokens: int = Field(256, ge=1, description="tokens one generation writes")
    generate_max_values: int = Field(
        2**21, ge=1, description="attention weights one generation returns (every step's row in every layer and head)"
    )
    # The explorer page draws T × T heatmaps in the browser: as images beyond app/pages/figures.py's
    # IMAGE_MIN_TOKENS, zoomable, so it takes what the API takes (a model's own n_ctx where shorter).
    explorer_max_tokens: int = Field(1024, ge=1, description="tokens the explorer page draws")
    # What the explorer keeps for one view: every layer's stream, the chosen layer's scores and
    # patterns ([heads, T, T] twice), every layer's patterns with rollout. The toy at 1,024 tokens
    # keeps 9.2 million numbers, Qwen3-0.6B at 128 tokens 19.4 million; SmolLM2-135M's 1,024 tokens
    # would be 109 million (435 MB), so it draws up to 356 (GPT-2 small 545, Qwen2.5-0.5B 285,
    # TinyLlama 140). 2^25 numbers are 256 MiB in float64 (drawn toys), 128 MiB in float32.
    explorer_max_values: int = Field(2**25, ge=1, description="numbers the explorer keeps for one view")
    # The lessons lay out T × T tables as HTML: beyond this many words they stop being legible.
    lesson_max_tokens: int = Field(128, ge=1, description="words (or characters) a lesson page draws")
    default_model: str = Field(
        "induction",
        min_length=1,
        max_length=200,
        description="the model the explorer and Inspect open on (the toy when this "
        "server cannot run it); a teacher may choose the class's",
    )
    # The calculators only do arithmetic, so their sizes may be those of real large models:
    calc_max_width: int = Field(65536, ge=1, description="d_model and d_mlp in the calculators")
    calc_max_vocab: int = Field(1_048_576, ge=1, description="d_vocab in the calculators")
    calc_max_ctx: int = Field(1_048_576, ge=1, description="n_ctx and seq_len in the calculators")
    calc_max_layers: int = Field(1024, ge=1, description="n_layers in the calculators")
    calc_max_batch: int = Field(4096, ge=1, description="batch in the KV-cache calculator")


def lent_threads(settings: Settings) -> int:
    """The threads a compute request computing alone may use (Settings.lend_threads; 0: the CPUs / workers)."""
    if settings.lend_threads:
        return settings.lend_threads
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WIDTH, cpus // settings.workers))


def runs_folder(settings: Settings) -> Path:
    """Where training runs live: EXPLORER_RUNS_DIR, else the user's data folder (XDG_DATA_HOME, by
    default ~/.local/share) /transformer-explorer/runs, so `make serve` keeps runs across restarts."""
    if settings.runs_dir is not None:
        return settings.runs_dir
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "transformer-explorer" / "runs"


def redis_connection_url(settings: Settings) -> str:
    """EXPLORER_REDIS_URL as every Redis client is given it (the store's redis-py and Celery's broker, in the
    replicas and the workers): over TLS (rediss://) with Redis's certificate checked, against EXPLORER_REDIS_CA
    when set. Celery's broker, handed a bare rediss:// URL, would not check the certificate at all (kombu falls
    back to ssl_cert_reqs=none); its URL query is what both read. A query the URL already has is kept."""
    url = settings.redis_url
    if not url:  # the callers make a Redis client: only with EXPLORER_REDIS_URL set
        raise ValueError("EXPLORER_REDIS_URL is not set")
    if not url.startswith("rediss://"):
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.setdefault("ssl_cert_reqs", "required")
    if settings.redis_ca is not None:
        query.setdefault("ssl_ca_certs", str(settings.redis_ca))
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


@lru_cache
def get_settings() -> Settings:
    return Settings()


_IN_EFFECT: ContextVar[Settings | None] = ContextVar("explorer_settings_in_effect", default=None)


def settings_in_effect() -> Settings:
    """The settings the current request is served with (or the OpenAPI written for), else the environment's."""
    return _IN_EFFECT.get() or get_settings()


def put_in_effect(settings: Settings) -> None:
    """Make these the settings in effect for the rest of this request (its context: app/deps.py)."""
    _IN_EFFECT.set(settings)


@contextmanager
def in_effect(settings: Settings) -> Iterator[None]:
    """These settings in effect within the block (writing the OpenAPI; a test)."""
    token = _IN_EFFECT.set(settings)
    try:
        yield
    finally:
        _IN_EFFECT.reset(token)


# ------------------------------------------------------------------ limits that are settings


def setting(of: str | Callable[[Settings], int]) -> int:
    """A setting's value in effect now (`of`: its name, or a function of the settings)."""
    s = settings_in_effect()
    return getattr(s, of) if isinstance(of, str) else of(s)


@dataclass(frozen=True)
class Limit:
    """A bound that is a setting, read from the settings in effect when a value is validated and when
    the JSON schema is written: `le`/`ge` bound a number, `max_length` a text or a list. On `X | None`
    it bounds the value as pydantic's own max_length does there ("Value should have at most ...")."""

    kind: Literal["le", "ge", "max_length"]
    of: str | Callable[[Settings], int]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        schema = handler(source)
        kind, of, on = self.kind, self.of, schema["type"]
        if kind == "max_length" and on == "list":  # counted before the items are validated, as pydantic does

            def count_first(value: Any, validate: Callable) -> Any:
                if isinstance(value, (list, tuple)) and len(value) > (bound := setting(of)):
                    raise PydanticKnownError(
                        "too_long", {"field_type": "List", "max_length": bound, "actual_length": len(value)}
                    )
                return validate(value)

            return core_schema.no_info_wrap_validator_function(count_first, schema)

        def check(value: Any) -> Any:
            if value is None:
                return value
            bound = setting(of)
            if kind == "le" and value > bound:
                raise PydanticKnownError("less_than_equal", {"le": bound})
            if kind == "ge" and value < bound:
                raise PydanticKnownError("greater_than_equal", {"ge": bound})
            if kind == "max_length" and len(value) > bound:
                if on == "str":
                    raise PydanticKnownError("string_too_long", {"max_length": bound})
                raise PydanticKnownError(
                    "too_long", {"field_type": "Value", "max_length": bound, "actual_length": len(value)}
                )
            return value

        return core_schema.no_info_after_validator_function(check, schema)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        js = handler(schema)
        target = next((b for b in js.get("anyOf", ()) if b.get("type") != "null"), js)
        key = {"le": "maximum", "ge": "minimum"}.get(self.kind) or (
            "maxLength" if target.get("type") == "string" else "maxItems"
        )
        target[key] = setting(self.of)
        return js
