"""`python -m app.worker`: a training worker for the Redis mode, on any machine that reaches Redis.

    EXPLORER_REDIS_URL=redis://:password@school-server:6379/0 python -m app.worker

It is Celery's own worker (prefork) around the project's one task (app/training/jobs.py), started with the
project's settings: EXPLORER_TRAIN_WORKERS training processes, each with one BLAS thread (bit for bit, and
no process fights another for the cores) and a lower priority than a server's requests on the same machine;
EXPLORER_TRAIN_PICKUP_S for the broker's visibility timeout and the runs' leases. It registers itself in
Redis while it lives (/metrics counts the workers), and on a warm shutdown (SIGTERM) its trainers save a
snapshot and put their runs back in the queue for another worker.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

# Before NumPy is imported anywhere in this process or the ones it forks: one BLAS thread each.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

from celery import signals  # noqa: E402

from app import __version__  # noqa: E402
from app.settings import get_settings, redis_connection_url  # noqa: E402

REGISTER_EVERY_S = 5.0  # how often a worker says it is alive (explorer:workers in Redis)
NICENESS = 10  # below a server's request workers on the same machine
log = logging.getLogger("app.worker")


def main(argv: list[str] | None = None) -> int:
    """`python -m app.worker [celery worker options]`; `--check`: exit 0 if a worker of this machine said it
    was alive within the last three registrations (a container's health check)."""
    s = get_settings()
    if argv and argv[0] == "--check":
        return check(s)
    if not s.redis_url:
        print(
            "app.worker: set EXPLORER_REDIS_URL (redis://[:password@]host:port/db) to the Redis the servers use",
            file=sys.stderr,
        )
        return 2
    if s.train_workers < 1:
        print("app.worker: EXPLORER_TRAIN_WORKERS must be 1 or more here (training processes)", file=sys.stderr)
        return 2
    import redis

    from app.training import jobs, open_redis
    from app.training.base import HOST, StoreUnavailable
    from app.training.redis_store import Timing, register_worker, unregister_worker

    node = f"explorer-{os.getpid()}@{HOST}"
    os.environ["EXPLORER_WORKER_NODE"] = node  # the training processes read it (the shutdown flag's name)
    url = redis_connection_url(s)  # over TLS, checking Redis's certificate (EXPLORER_REDIS_CA)
    store = open_redis(url, s.runs_max_mb * 2**20, Timing(s.train_pickup_s))  # its sweep sends tasks
    app = jobs.configure(store.url, store.timing)
    alive = threading.Event()

    def register_forever() -> None:
        """The sweep: say this worker is alive, and send the tasks of runs whose replica never did. It
        survives whatever goes wrong (it tries again next time) and logs each time it does."""
        while not alive.wait(REGISTER_EVERY_S):
            try:
                register_worker(store, node, s.train_workers, __version__)
                for id in store.unsent():  # a replica died between creating a run and sending its task
                    log.warning(
                        "run %s was queued more than %.0f s ago and its task never sent: sending it",
                        id,
                        store.timing.unsent_s,
                    )
                    store.submit(id)
            except (redis.RedisError, StoreUnavailable) as e:  # Redis away: one line each sweep, no traceback
                log.warning("worker sweep: Redis cannot be reached, trying again in %.0f s: %s", REGISTER_EVERY_S, e)
            except Exception:  # a bug: its traceback, and the sweep goes on
                log.exception("worker sweep failed; trying again in %.0f s", REGISTER_EVERY_S)

    @signals.worker_ready.connect(weak=False)
    def ready(**_) -> None:
        register_worker(store, node, s.train_workers, __version__)
        for id in store.waiting():  # a second message is harmless: a run trains once (jobs.py)
            store.submit(id)
        threading.Thread(target=register_forever, name="register", daemon=True).start()

    @signals.worker_shutting_down.connect(weak=False)
    def shutting_down(**_) -> None:
        alive.set()
        try:
            unregister_worker(store, node)  # and tell its trainers to put their runs back
        except Exception:  # it still shuts down: its registration ages out, its leases expire
            log.exception("worker %s: could not unregister while shutting down", node)

    @signals.worker_process_init.connect(weak=False)
    def lower_priority(**_) -> None:
        os.nice(NICENESS)

    # Only the project's own task: Celery's built-in ones (canvas helpers, result cleanup) are never sent
    # here, so a message naming one is refused as unregistered, like any other name.
    for name in [name for name in app.tasks if name != jobs.TASK]:
        app.tasks.unregister(name)
    args = [
        "worker",
        f"--hostname={node}",
        f"--concurrency={s.train_workers}",
        "--pool=prefork",
        f"--loglevel={s.log_level.upper()}",
        f"--queues={jobs.QUEUE}",
        "--prefetch-multiplier=1",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *(argv or []),
    ]
    app.worker_main(args)
    return 0


def check(s) -> int:
    import json
    import time

    from app.training.base import HOST
    from app.training.redis_store import WORKERS, RedisStore

    try:
        seen = [json.loads(v) for v in RedisStore.from_settings(s).r.hvals(WORKERS)]
    except Exception as e:  # Redis out of reach: not healthy either
        print(f"app.worker --check: {e}", file=sys.stderr)
        return 1
    alive = [w for w in seen if w["host"] == HOST and w["seen"] > time.time() - 3 * REGISTER_EVERY_S]
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
