"""The runs folder: the embedded training store (app/training/base.py `TrainingStore`), one folder per run
under EXPLORER_RUNS_DIR, started by the in-process scheduler (app/training/scheduler.py) in trainer
processes on the same machine (app/training/worker.py). The layout:

    <runs>/<id>/
      request.json        the settings (TrainSettings fields; a text of your own is text.txt beside it)
      state.json          what the trainer wrote last: status, records (metrics, head scores, samples)
      progress.json       the latest step and loss, rewritten several times a second while training
      patterns/<step>.json  the probe's attention patterns [layer][head][query][key] at snapshot steps
      snapshot.npz        weights, optimiser state and data stream: resuming continues bit for bit
      model-<step>/       a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer.json); an sae
                          run's: a SAELens folder (cfg.json, sae_weights.safetensors)
      activations-<sha>.npy  an sae run's activations pool, read back when it resumes (core/sae_run.py)
      lock                held (flock) by the process training the run, as long as it lives
      cancel              present when someone asked to stop it

Every file is written whole (temporary file, then rename), so a reader never sees half of one and a
killed trainer leaves the last complete state. Whether a run is still being trained is the lock: the
kernel releases it when the process ends however it ends, so a "running" state whose lock is free
was cut short, and the run is listed as `interrupted` (same host; for replicas on several hosts use
the Redis store: flock across hosts needs a file system with working locks, such as NFSv4).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.training.base import (
    HOST,
    MODEL_PREFIX,
    NoRoom,
    Room,
    RunWriter,
    Status,
    TrainingRunInfo,
    TrainingStore,
    checked_run_id,
    dumps,
    is_training_run_id,
    run_info,
    training_run_id,
)
from core.recipes import TrainSettings, text_hash

if TYPE_CHECKING:
    from core.sae_run import SAERun
    from core.train import Snapshot, Training

REQUEST, STATE, PROGRESS, SNAPSHOT, LOCK, CANCEL, TEXT = (
    "request.json",
    "state.json",
    "progress.json",
    "snapshot.npz",
    "lock",
    "cancel",
    "text.txt",
)
PATTERNS = "patterns"


# ------------------------------------------------------------------ writing whole files


def write_atomic(path: Path, data: bytes | str, *, durable: bool = True) -> None:
    """Write `path` as a whole: a temporary file beside it, flushed (and synced when `durable`), renamed."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    write_atomic(path, dumps(obj), durable=durable)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------ the runs folder


@dataclass
class FolderStore(TrainingStore):
    """The runs folder. Reading is safe from any process; each run has one writer at a time (its lock)."""

    root: Path
    max_bytes: int  # the folder's size cap: finished runs are deleted oldest first beyond it
    kind = "folder"

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._error: str | None = None  # why training is off (the folder cannot be written)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-test-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self._error = (
                f"training is off: the runs folder {self.root} cannot be written ({e.strerror}); "
                "set EXPLORER_RUNS_DIR to a writable folder (a volume, in a container)"
            )

    @property
    def error(self) -> str | None:
        return self._error

    # ---------------------------------------------------------------- paths and locks

    def folder(self, id: str) -> Path:
        return self.root / checked_run_id(id)

    def exists(self, id: str) -> bool:
        return is_training_run_id(id) and (self.root / id / REQUEST).is_file()

    def claim(self, id: str) -> int | None:
        """Take the run's lock (an open fd holding flock) if nobody holds it, else None. The trainer
        process inherits the fd, so the lock lives exactly as long as it does."""
        fd = os.open(self.folder(id) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        return fd

    def is_training(self, id: str) -> bool:
        """Whether some process holds the run's lock (is training it now)."""
        path = self.root / id / LOCK
        if not path.exists():
            return False
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        finally:
            os.close(fd)  # closing drops the shared lock we may have taken
        return False

    # ---------------------------------------------------------------- creating and asking

    def create(self, s: TrainSettings, client: str, room: Room | None = None) -> tuple[str, bool]:
        """The run of these settings, created queued if new. Returns (id, created). Two processes creating
        the same run at once: both write a whole folder under a temporary name, one rename wins. The room
        is counted before, by each process for itself (the Redis store counts and creates in one step)."""
        id = training_run_id(s)
        target = self.root / id
        if (target / REQUEST).is_file():
            return id, False
        if room is not None:
            self._check_room(client, room)
        tmp = Path(tempfile.mkdtemp(prefix=f".new-{id}-", dir=self.root))
        try:
            fields = dataclasses.asdict(s)
            if s.text is not None:
                write_atomic(tmp / TEXT, s.text)
                fields["text"] = None
            now = time.time()
            write_json(
                tmp / REQUEST,
                {
                    "id": id,
                    "settings": fields,
                    "text_sha256": s.text and text_hash(s.text),
                    "created_at": now,
                    "client": client,
                },
            )
            write_json(tmp / STATE, {"status": "queued", "records": [], "updated_at": now})
            (tmp / PATTERNS).mkdir()
            tmp.chmod(0o755)
            try:
                os.rename(tmp, target)  # atomic; fails when another writer made it first
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return id, False
            return id, True
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def settings(self, id: str) -> TrainSettings:
        req = read_json(self.folder(id) / REQUEST)
        if req is None:
            raise KeyError(id)
        fields = dict(req["settings"])
        if req.get("text_sha256"):
            fields["text"] = (self.folder(id) / TEXT).read_text(encoding="utf-8")
        return TrainSettings(**fields)

    def request(self, id: str) -> dict:
        req = read_json(self.folder(id) / REQUEST)
        if req is None:
            raise KeyError(id)
        return req

    def state(self, id: str) -> dict:
        return read_json(self.folder(id) / STATE) or {"status": "queued", "records": []}

    def write_state(self, id: str, state: dict) -> None:
        write_json(self.folder(id) / STATE, state | {"updated_at": time.time()})

    def model_folder(self, id: str) -> Path | None:
        """The run's current weights as a Hugging Face folder, once it has any."""
        name = self.state(id).get("model_dir")
        path = self.folder(id) / name if name else None
        return path if path is not None and path.is_dir() else None

    def info(self, id: str, queue: list[str] | None = None) -> TrainingRunInfo:
        folder = self.folder(id)
        state = self.state(id)
        status: Status = state["status"]
        training = self.is_training(id)
        if status == "queued" and training:
            status = "running"  # started; the trainer has not written yet
        elif status == "running" and not training:
            # The trainer writes its last state before it lets go of the lock, so a state read before the lock
            # was found free may be its last "running" one: read it again before calling the run interrupted.
            state = self.state(id)
            status = state["status"]
            if status == "running":
                status = "interrupted"  # its process is gone (killed, crashed, the server restarted)
        patterns = folder / PATTERNS
        return run_info(
            id,
            self.request(id),
            state,
            status=status,
            progress=read_json(folder / PROGRESS) if status == "running" else None,
            snapshots=sorted(int(p.stem) for p in patterns.glob("*.json")) if patterns.is_dir() else [],
            resumable=(folder / SNAPSHOT).is_file(),
            queue=queue,
            worker={"host": HOST, "pid": state["pid"]} if state.get("pid") else None,
        )

    def ids(self) -> list[str]:
        """Every run, newest first."""
        found = []
        for path in self.root.iterdir() if self.root.is_dir() else ():
            req = read_json(path / REQUEST) if is_training_run_id(path.name) else None
            if req is not None:
                found.append((req["created_at"], path.name))
        return [id for _, id in sorted(found, reverse=True)]

    def queue(self) -> list[str]:
        """Runs waiting to start, first come first served."""
        waiting = [
            (self.request(id)["created_at"], id)
            for id in self.ids()
            if self.state(id)["status"] == "queued" and not self.is_training(id)
        ]
        return [id for _, id in sorted(waiting)]

    def patterns(self, id: str, step: int) -> list | None:
        return read_json(self.folder(id) / PATTERNS / f"{step}.json")

    def request_cancel(self, id: str) -> None:
        write_atomic(self.folder(id) / CANCEL, b"")
        fd = self.claim(id)
        if fd is None:
            return  # its trainer will see the flag
        try:
            state = self.state(id)
            if state["status"] in ("queued", "running"):
                self.write_state(id, state | {"status": "cancelled"})
        finally:
            os.close(fd)

    def requeue(self, id: str, client: str | None = None, room: Room | None = None) -> None:
        if room is not None:
            self._check_room(client, room)
        fd = self.claim(id)
        if fd is None:
            return
        try:
            (self.folder(id) / CANCEL).unlink(missing_ok=True)
            state = self.state(id)
            self.write_state(id, state | {"status": "queued", "error": None})
        finally:
            os.close(fd)

    def _check_room(self, client: str | None, room: Room) -> None:
        active = [
            self.request(id)
            for id in self.ids()
            if self.state(id)["status"] in ("queued", "running") or self.is_training(id)
        ]
        mine = sum(1 for r in active if r.get("client") == client)
        if mine >= room.per_client:
            raise NoRoom("client", mine)
        if len(active) >= room.total:
            raise NoRoom("server", len(active))

    def writer(self, id: str) -> FolderWriter:
        """For the process that holds the run's lock (app/training/worker.py)."""
        return FolderWriter(self, id)

    # ---------------------------------------------------------------- size

    def size(self, id: str) -> int:
        return sum(p.stat().st_size for p in self.folder(id).rglob("*") if p.is_file())

    def evict(self) -> list[str]:
        """Runs in the queue or training are never deleted (nor, of course, the models shipped with the app,
        which live elsewhere)."""
        sizes = {id: self.size(id) for id in self.ids()}
        total = sum(sizes.values())
        deleted = []
        for id in reversed(self.ids()):  # oldest first
            if total <= self.max_bytes:
                break
            if self.is_training(id) or self.state(id)["status"] == "queued":
                continue
            fd = self.claim(id)
            if fd is None:
                continue
            try:
                trash = self.root / f".deleted-{id}-{uuid.uuid4().hex[:8]}"
                os.rename(self.folder(id), trash)  # gone from listings at once, then removed
            finally:
                os.close(fd)
            shutil.rmtree(trash, ignore_errors=True)
            total -= sizes[id]
            deleted.append(id)
        return deleted


class FolderWriter(RunWriter):
    """A run's files, written by the process that holds its lock: each file whole (write_atomic)."""

    store: FolderStore

    def __init__(self, store: FolderStore, id: str):
        self.store, self.id = store, id
        self.folder = store.folder(id)

    def state(self) -> dict:
        return self.store.state(self.id)

    def settings(self) -> TrainSettings:
        return self.store.settings(self.id)

    def load_snapshot(self) -> Snapshot | None:
        from core.train import Snapshot

        path = self.folder / SNAPSHOT
        return Snapshot.load(path) if path.is_file() else None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        snapshot.save(self.folder / SNAPSHOT)

    def write_state(self, state: dict) -> None:
        self.store.write_state(self.id, state)

    def write_progress(self, step: int, loss: float) -> None:
        write_json(self.folder / PROGRESS, {"step": step, "loss": loss}, durable=False)

    def write_patterns(self, step: int, patterns: list) -> None:
        write_json(self.folder / PATTERNS / f"{step}.json", patterns)

    def export(self, run: Training | SAERun) -> str:
        name = f"{MODEL_PREFIX}{run.step}"
        run.export(self.folder / name)
        return name

    def drop_models_but(self, keep: str | None) -> None:
        for old in self.folder.glob(f"{MODEL_PREFIX}*"):
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)

    def stop_requested(self) -> bool:
        return (self.folder / CANCEL).exists()

    def keep_folder(self) -> Path | None:
        return self.folder
