"""Live classes: a teacher's view followed by every student's screen, and the teacher's polls.

The interface is base.py (`ClassStore`, `LiveClass`, `Poll`, `ClassEvent`, codes and tokens); a class
lives in this process (memory.py, the embedded default with one worker process), in a SQLite file that
this machine's worker processes share (sqlite_store.py, EXPLORER_WORKERS > 1: `docker compose up`) or,
with EXPLORER_REDIS_URL, in Redis (redis_store.py), so every replica serves every class.
`open_class_store` picks one from the settings;
the app opens it in its lifespan (app/main.py) and the service (app/service/classes.py) is what the API
and the pages call.

May import: `app.settings`. Never core (a class computes nothing), never the service or the faces.
"""

from __future__ import annotations

from app.classes.base import ClassStore
from app.classes.memory import MemoryClassStore
from app.classes.redis_store import RedisClassStore
from app.classes.sqlite_store import SQLiteClassStore, class_file
from app.settings import Settings, redis_connection_url, runs_folder


def open_class_store(settings: Settings) -> ClassStore:
    """The store the settings name: Redis when EXPLORER_REDIS_URL is set; else, with several worker
    processes, the file they share in the runs folder; else this process (nothing to share, nothing
    written to disk)."""
    if settings.redis_url:
        # over TLS, checking Redis's certificate (EXPLORER_REDIS_CA), as the training store does
        return RedisClassStore(redis_connection_url(settings), idle_s=settings.class_idle_s)
    if settings.workers > 1:
        return SQLiteClassStore(class_file(runs_folder(settings)), idle_s=settings.class_idle_s)
    return MemoryClassStore(idle_s=settings.class_idle_s)
