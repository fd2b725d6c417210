"""One training run in its own process: `python -m app.training.worker RUNS_DIR RUN_ID --lock-fd N`.

Started by app/training/scheduler.py, which took the run's lock (app/training/store.py) and hands it
over as an inherited file descriptor: the lock lives as long as this process, so when it dies however it
dies, the run shows as interrupted. It trains with core.train.Training and writes, each as a whole file:
progress.json several times a second, state.json with every record, the probe's attention patterns at
snapshot steps, snapshot.npz to resume from, and the weights as a Hugging Face folder at the end (and
when stopped early, so what was learned so far can be explored).

It asks the kernel to kill it if the server that started it dies (no orphans training for nobody),
runs with one BLAS thread and a lower priority, so the server's requests come first, and on SIGTERM
(the server shutting down) it saves a snapshot and stops as interrupted.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from app.training.store import CANCEL, MODEL_PREFIX, PATTERNS, PROGRESS, SNAPSHOT, TrainingStore, write_json

PROGRESS_EVERY_S = 0.1  # progress.json at most this often: a page sees ≥ 4 updates a second
NICENESS = 10  # below the request workers'
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the server process that started it) dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the server's shutdown still stops it
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        sys.exit(1)


class Stop:
    """Why the loop should stop before its next step: a cancel asked for, or SIGTERM."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.terminated = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        self.terminated = True

    @property
    def cancelled(self) -> bool:
        return (self.folder / CANCEL).exists()

    def __call__(self) -> bool:
        return self.terminated or self.cancelled


def train(store: TrainingStore, id: str) -> str:
    """Train the run to its last step (or until stopped); returns its final status."""
    from threadpoolctl import threadpool_limits

    from core.train import Snapshot, Training

    threadpool_limits(1, user_api="blas")  # bit for bit: one thread adds in one order
    folder = store.folder(id)
    state = store.state(id)
    records = list(state.get("records", []))
    snapshot_path = folder / SNAPSHOT
    if snapshot_path.is_file():
        run = Training.resume(Snapshot.load(snapshot_path))
        records = [r for r in records if r["step"] <= run.step]  # records after the snapshot come again
    else:
        run = Training(store.settings(id))
        records = []
    store.write_state(id, state | {"status": "running", "records": records, "error": None, "pid": os.getpid(),
                                   "started_at": state.get("started_at") or time.time()})
    stop = Stop(folder)
    last_progress = 0.0

    def progress(step: int, loss: float) -> None:
        nonlocal last_progress
        now = time.monotonic()
        if now - last_progress >= PROGRESS_EVERY_S or step == run.settings.steps:
            write_json(folder / PROGRESS, {"step": step, "loss": loss}, durable=False)
            last_progress = now

    def save(status: str, **extra) -> None:
        store.write_state(id, store.state(id) | {"status": status, "step": run.step, "records": records, **extra})

    for record in run.records(stop=stop, progress=progress):
        entry = record.to_dict()
        patterns = entry.pop("patterns", None)
        if patterns is not None:
            write_json(folder / PATTERNS / f"{record.step}.json", patterns)
        records.append(entry)
        if record.step % run.settings.snapshot_every == 0 or record.step == run.settings.steps:
            run.snapshot().save(snapshot_path)
        save("running")
    # Stopped early or finished: keep what was learned, explorable as a model.
    run.snapshot().save(snapshot_path)
    status = "done" if run.step >= run.settings.steps else ("cancelled" if stop.cancelled else "interrupted")
    model_dir = None
    if run.step > 0:
        model_dir = f"{MODEL_PREFIX}{run.step}"
        run.export(folder / model_dir)
    save(status, model_dir=model_dir, finished_at=time.time())
    for old in folder.glob(f"{MODEL_PREFIX}*"):  # earlier exports: the state names the current one
        if old.name != model_dir:
            shutil.rmtree(old, ignore_errors=True)
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir", type=Path)
    ap.add_argument("run_id")
    ap.add_argument("--lock-fd", type=int, required=True, help="the run's lock, held by the caller for us")
    args = ap.parse_args(argv)
    die_with_parent()
    os.nice(NICENESS)
    store = TrainingStore(args.runs_dir, max_bytes=0)
    try:
        train(store, args.run_id)
    except Exception as exc:  # a bug, or a settings problem found late: the run says so
        traceback.print_exc()
        store.write_state(args.run_id, store.state(args.run_id) | {
            "status": "failed", "error": f"{type(exc).__name__}: {exc}", "finished_at": time.time()})
        return 1
    finally:
        os.close(args.lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
