"""Starting queued training runs in worker processes, never on the event loop.

Every server process (each uvicorn worker, each replica sharing EXPLORER_RUNS_DIR) runs one
`TrainingManager`. Twice a second it looks at the runs folder (app/training/folder_store.py) and, while fewer than
EXPLORER_TRAIN_WORKERS runs are being trained in all, starts the oldest queued one: it takes the
run's lock, hands it to a new `python -m app.training.worker` process and forgets it. The decision is made
under a folder-wide lock, so two processes never start the same run or overshoot the bound.

A trainer dies with the server process that started it (app/training/worker.py), and on a graceful shutdown
the manager asks its trainers to stop (SIGTERM: they save a snapshot and end as interrupted).

This is the embedded default, for the folder store only (it is typed for it, and app/main.py starts it only
with it). With EXPLORER_REDIS_URL set the runs live in Redis and Celery workers train them
(app/training/jobs.py, `python -m app.worker`): no manager runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import threading

from app.training.folder_store import FolderStore

log = logging.getLogger("app.training.scheduler")

TICK_S = 0.5  # how often the queue is looked at
SCHEDULER_LOCK = ".scheduler.lock"
STOP_GRACE_S = 10.0  # a trainer's time to save its snapshot when the server shuts down


class TrainingManager:
    def __init__(self, store: FolderStore, workers: int, python: str = sys.executable):
        self.store = store
        self.workers = workers
        self.python = python
        self.children: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def claim(self) -> list[tuple[str, int]]:
        """Take the locks of the queued runs there is room for: [(id, the lock's fd)]. Reading the folder
        is slow-ish: this runs in a worker thread, the spawning in the event loop's thread (below)."""
        with self._lock:
            self._reap()
            if self.store.error:
                return []
            claimed = []
            with self._scheduler_lock():
                training = sum(1 for id in self.store.ids() if self.store.is_training(id))
                for id in self.store.queue():
                    if training >= self.workers:
                        break
                    fd = self.store.claim(id)
                    if fd is not None:  # else another process has it
                        claimed.append((id, fd))
                        training += 1
            return claimed

    @contextlib.contextmanager
    def _scheduler_lock(self):
        fd = os.open(self.store.root / SCHEDULER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def spawn(self, id: str, lock_fd: int) -> None:
        """Start the trainer of a claimed run. From a thread that lives as long as the server: the trainer
        is killed when the thread that started it ends (app/training/worker.py, PR_SET_PDEATHSIG)."""
        folder = self.store.folder(id)
        env = os.environ | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        with open(folder / "trainer.log", "ab") as out:
            child = subprocess.Popen(
                [self.python, "-m", "app.training.worker", str(self.store.root), id, "--lock-fd", str(lock_fd)],
                pass_fds=(lock_fd,),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        with self._lock:
            self.children[id] = child
        log.info("training %s in process %d", id, child.pid)

    def _reap(self) -> None:
        for id, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[id]

    async def run_forever(self) -> None:
        while True:
            try:
                for id, fd in await asyncio.to_thread(self.claim):
                    try:
                        self.spawn(id, fd)  # a fork and exec: milliseconds, on the event loop's thread
                    finally:
                        os.close(fd)
            except Exception:  # a full disk, a folder removed under us: say so, try again next tick
                log.exception("training scheduler")
            await asyncio.sleep(TICK_S)

    def shutdown(self) -> None:
        """Ask every trainer this process started to save and stop; kill those that do not in time."""
        with self._lock:
            for child in self.children.values():
                if child.poll() is None:
                    child.terminate()
            for child in self.children.values():
                try:
                    child.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            self.children.clear()
