"""One training run in its own process: `python -m app.training.worker RUNS_DIR RUN_ID --lock-fd N`.

Started by app/training/scheduler.py, which took the run's lock (app/training/folder_store.py) and hands it
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
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from app.training.base import RunWriter
from app.training.folder_store import FolderStore
from core import InputError
from core.i18n import _
from core.recipes import TrainSettings

if TYPE_CHECKING:
    from core.sae_run import SourceModel

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

    def __init__(self, writer: RunWriter):
        self.writer = writer
        self.terminated = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        self.terminated = True

    @property
    def cancelled(self) -> bool:
        return self.writer.stop_requested()

    def __call__(self) -> bool:
        return self.terminated or self.cancelled


def source_model(w: RunWriter, s: TrainSettings) -> Callable[[], SourceModel] | None:
    """What loads the model run an SAE run reads, from the store (called only when its activations are not
    kept already); None for a shipped model, which core finds itself."""
    from core.sae_run import run_model

    if s.model_sha256 is None:
        return None

    def load() -> SourceModel:
        found = w.model_of(str(s.model))
        if found is None:
            raise InputError(
                _("model run {model} has no weights on this server any more: ask for the SAE again").format(
                    model=s.model
                )
            )
        return run_model(str(s.model), *found)

    return load


def train(w: RunWriter, stop: Callable[[], bool], cancelled: Callable[[], bool], *, pid: int | None = None) -> str:
    """Train the run to its last step (or until `stop()`), writing through `w`; returns its final status
    (`cancelled()` says whether an early stop was a cancel). The folder store and the Redis store alike."""
    from threadpoolctl import threadpool_limits

    from core.sae_run import SAERun
    from core.train import Training

    threadpool_limits(1, user_api="blas")  # bit for bit: one thread adds in one order
    state = w.state()
    records = list(state.get("records", []))
    snapshot = w.load_snapshot()
    run: Training | SAERun
    if snapshot is not None:  # an SAE's run (the sae recipe, core/sae_run.py) goes the same way as a model's
        s = snapshot.settings
        if s.recipe == "sae":
            run = SAERun.resume(snapshot, source_model(w, s), w.keep_folder())
        else:
            run = Training.resume(snapshot)
        records = [r for r in records if r["step"] <= run.step]  # records after the snapshot come again
    else:
        s = w.settings()
        run = SAERun(s, source_model(w, s), w.keep_folder()) if s.recipe == "sae" else Training(s)
        records = []
    w.write_state(
        state
        | {
            "status": "running",
            "step": run.step,
            "records": records,
            "error": None,
            "pid": pid or os.getpid(),
            "started_at": state.get("started_at") or time.time(),
        }
    )
    last_progress = 0.0

    def progress(step: int, loss: float) -> None:
        nonlocal last_progress
        now = time.monotonic()
        if now - last_progress >= PROGRESS_EVERY_S or step == run.settings.steps:
            w.write_progress(step, loss)
            last_progress = now

    def save(status: str, **extra) -> None:
        w.write_state(w.state() | {"status": status, "step": run.step, "records": records, **extra})

    for record in run.records(stop=stop, progress=progress):
        entry = record.to_dict()
        patterns = entry.pop("patterns", None)
        if patterns is not None:
            w.write_patterns(record.step, patterns)
        records.append(entry)
        if record.step % run.settings.snapshot_every == 0 or record.step == run.settings.steps:
            w.save_snapshot(run.snapshot())
        save("running")
    # Stopped early or finished: keep what was learned, explorable as a model.
    w.save_snapshot(run.snapshot())
    status = "done" if run.step >= run.settings.steps else ("cancelled" if cancelled() else "interrupted")
    model_dir = w.export(run) if run.step > 0 else None
    save(status, model_dir=model_dir, finished_at=time.time())
    w.drop_models_but(model_dir)  # earlier exports: the state names the current one
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir", type=Path)
    ap.add_argument("run_id")
    ap.add_argument("--lock-fd", type=int, required=True, help="the run's lock, held by the caller for us")
    args = ap.parse_args(argv)
    die_with_parent()
    os.nice(NICENESS)
    store = FolderStore(args.runs_dir, max_bytes=0)
    writer = store.writer(args.run_id)
    stop = Stop(writer)
    try:
        train(writer, stop, lambda: stop.cancelled)
    except Exception as exc:  # a bug, or a settings problem found late: the run says so
        traceback.print_exc()
        store.write_state(
            args.run_id,
            store.state(args.run_id)
            | {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "finished_at": time.time()},
        )
        return 1
    finally:
        os.close(args.lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
