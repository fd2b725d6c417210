"""Training runs (jobs) outside the request, behind one interface (base.py `TrainingStore`, with everything
both stores share: run ids, `TrainingRunInfo` and its one builder, the errors) and two implementations:

- embedded (the default): the runs folder (folder_store.py `FolderStore`), the in-process scheduler that
  starts queued runs (scheduler.py) and the trainer process (worker.py, `python -m app.training.worker`);
- beyond one machine (EXPLORER_REDIS_URL): runs in Redis (redis_store.py; the trainer's lease and writes in
  redis_writer.py), trained by Celery workers (jobs.py, started by `python -m app.worker`). The Redis store
  does not know Celery: it is handed a `send` (jobs.py `sender`) that sends a run's task, here.

Both train with the same loop (worker.py `train`, on core.train). `open_store(settings)` picks the store.
Each module imports only modules below it, never one that imports it: base; then folder_store and
redis_store; worker (the loop, and the folder's trainer) and redis_writer; jobs; and this package's
factory on top (tests/test_architecture.py checks that no import, late or not, makes a circle).

May import: `core` and `app.settings`. The service (app/service/) is what pages and the API call.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.settings import Settings, redis_connection_url, runs_folder
from app.training.base import TrainingStore
from app.training.folder_store import FolderStore

if TYPE_CHECKING:
    from app.training.redis_store import RedisStore, Timing

__all__ = ["FolderStore", "TrainingStore", "open_redis", "open_store"]


def open_store(settings: Settings) -> TrainingStore | None:
    """The store these settings name: Redis when EXPLORER_REDIS_URL is set, else the runs folder; None when
    training is off (EXPLORER_TRAIN_WORKERS=0)."""
    if not settings.train_workers:
        return None
    if settings.redis_url:
        from app.training.redis_store import Timing

        url = redis_connection_url(settings)  # over TLS, checking Redis's certificate (EXPLORER_REDIS_CA)
        return open_redis(url, settings.runs_max_mb * 2**20, Timing(settings.train_pickup_s))
    return FolderStore(runs_folder(settings), settings.runs_max_mb * 2**20)


def open_redis(url: str, max_bytes: int, timing: Timing, cache_dir: Path | None = None) -> RedisStore:
    """The Redis store whose runs Celery's workers train: it sends each new run's task through Celery
    (app/training/jobs.py `sender`). Imported only here, so a server on the runs folder loads neither
    redis nor Celery."""
    from app.training import jobs
    from app.training.redis_store import RedisStore

    return RedisStore(url, max_bytes, timing, cache_dir, send=jobs.sender(url, timing))
