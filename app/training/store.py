"""Where training runs live: one interface, `TrainingStore`, and two places behind it.

A run is a pure function of its settings (recipe, shape, optimiser, seed, steps): its id is a hash of
them, so the same request finds the same run, a class of thirty pressing Start trains once, and
replicas agree on names. Nothing here trains: app/training/worker.py's `train` does, writing through
the store's `RunWriter` while it holds the run's lock.

- `FolderStore` (below), the embedded default: one folder per run under EXPLORER_RUNS_DIR, started by
  the in-process scheduler (app/training/scheduler.py) in worker processes on the same machine.
- `RedisStore` (app/training/redis_store.py), when EXPLORER_REDIS_URL is set: runs live in Redis and
  are trained by Celery workers on any machine that reaches it (app/training/jobs.py, app/worker.py).

`open_store(settings)` picks one. The folder store's layout:

    <runs>/<id>/
      request.json        the settings (TrainSettings fields; a text of your own is text.txt beside it)
      state.json          what the trainer wrote last: status, records (metrics, head scores, samples)
      progress.json       the latest step and loss, rewritten several times a second while training
      patterns/<step>.json  the probe's attention patterns [layer][head][query][key] at snapshot steps
      snapshot.npz        weights, optimiser state and data stream: resuming continues bit for bit
      model-<step>/       a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer.json)
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
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.settings import Settings, runs_folder
from core import InputError
from core.i18n import _
from core.recipes import TrainSettings, text_hash

if TYPE_CHECKING:
    from core.train import Snapshot, Training

Status = Literal["queued", "running", "done", "failed", "cancelled", "interrupted"]
STATUSES: tuple[Status, ...] = ("queued", "running", "done", "failed", "cancelled", "interrupted")
FINISHED = ("done", "failed", "cancelled", "interrupted")  # nobody is training it
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
MODEL_PREFIX = "model-"
HOST = socket.gethostname()  # who trains a run, with its pid (GET /api/v1/runs/{id} `worker`)


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
    write_atomic(path, json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")), durable=durable)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------ names


def training_run_id(s: TrainSettings) -> str:
    """The run's name: its recipe and a hash of every setting (a text by its SHA-256), e.g. induction-3f2a9c1b7d0e."""
    fields = dataclasses.asdict(s)
    if s.text is not None:
        fields["text"] = text_hash(s.text)
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return f"{s.recipe}-{digest[:12]}"


def step_and_loss(state: dict, progress: dict | None) -> tuple[int, float | None]:
    """The step a run has reached and its loss: the trainer's progress while it runs, else the state's.
    A progress behind the state's step is the previous trainer's (a run resumed from its snapshot writes
    the snapshot's step to its state before its first progress), so it is not read."""
    records = state.get("records", [])
    step = state.get("step", records[-1]["step"] if records else 0)
    if progress and progress["step"] >= step:
        return progress["step"], progress.get("loss")
    return step, records[-1].get("train_loss") if records else None


def is_training_run_id(name: str) -> bool:
    recipe, _, digest = name.rpartition("-")
    return bool(recipe) and len(digest) == 12 and all(c in "0123456789abcdef" for c in digest)


# ------------------------------------------------------------------ what a run is, read back


@dataclass
class TrainingRunInfo:
    """A run as the API shows it (GET /api/v1/runs/{id}); built from what its store keeps."""

    id: str
    recipe: str
    config: dict  # the settings, a text by its size and hash
    status: Status
    step: int  # the last step trained (progress.json while running, else the last record)
    steps: int
    created_at: float
    updated_at: float
    records: list[dict] = field(default_factory=list)  # every Record.to_dict() without its patterns
    snapshots: list[int] = field(default_factory=list)  # steps whose attention patterns are stored
    loss: float | None = None  # the latest training loss (a single step's while running)
    model: str | None = None  # the name /api/v1/run and the pages take, once weights exist
    error: str | None = None
    queue_position: int | None = None  # 1 = next to start; None unless queued
    resumable: bool = False  # a snapshot to continue from exists
    worker: dict | None = None  # who trains it while it runs: {"host", "pid"}
    cursor: str | None = None  # the store's own position in the run's event log (Redis: a stream id)

    @property
    def metrics(self) -> dict[str, list]:
        """Per record: step, training loss (mean since the previous record), held-out loss, lr, in-context
        score and the recipe's target probability."""
        keys = ("step", "train_loss", "val_loss", "lr", "icl_score", "target", "grad_norm", "elapsed_s")
        out = {k: [r.get(k) for r in self.records] for k in keys}
        out["loss"] = out.pop("train_loss")
        return out

    @property
    def heads(self) -> dict[str, list]:
        """Per record: every head's previous-token and induction score on the probe, [step][layer][head]."""
        return {
            "step": [r["step"] for r in self.records],
            "previous_token": [r["previous_token"] for r in self.records],
            "induction": [r["induction"] for r in self.records],
        }

    @property
    def samples(self) -> list[dict]:
        return [{"step": r["step"], "text": r["sample"]} for r in self.records if r.get("sample")]

    @property
    def event_id(self) -> str:
        """Where a stream of this run's changes stands: the store's event-log position where it keeps one
        (a Redis stream id), else records sent, the step and the status."""
        return self.cursor or f"{len(self.records)}.{self.step}.{self.status}"


# ------------------------------------------------------------------ what a store must answer


@dataclass(frozen=True)
class Room:
    """How many runs may be queued or training: per client (429 beyond) and in all (503 beyond)."""

    per_client: int
    total: int


class NoRoom(Exception):
    """Starting this run would pass a limit: `scope` is "client" or "server", `count` what there is."""

    def __init__(self, scope: Literal["client", "server"], count: int):
        super().__init__(f"{count} runs queued or training ({scope})")
        self.scope = scope
        self.count = count


class StoreUnavailable(Exception):
    """The store cannot be reached now (Redis down): the service answers 503 with this message."""


class TrainingStore(ABC):
    """Where runs live. The service (app/service/training.py) reads and starts runs through this; the one
    process training a run writes through `writer`. Reading is safe from anywhere; each run has one
    writer at a time (its lock)."""

    max_bytes: int  # the store's size cap: finished runs are deleted oldest first beyond it
    kind: str  # "folder" or "redis", for /readyz and /metrics

    @property
    @abstractmethod
    def error(self) -> str | None:
        """Why training is off (the folder cannot be written, Redis cannot be reached), or None."""

    # ---------------------------------------------------------------- asking
    @abstractmethod
    def exists(self, id: str) -> bool: ...

    @abstractmethod
    def ids(self) -> list[str]:
        """Every run, newest first."""

    @abstractmethod
    def queue(self) -> list[str]:
        """Runs waiting to start, first come first served."""

    @abstractmethod
    def info(self, id: str, queue: list[str] | None = None) -> TrainingRunInfo: ...

    @abstractmethod
    def request(self, id: str) -> dict:
        """What was asked: {"id", "settings", "text_sha256", "created_at", "client"}."""

    @abstractmethod
    def settings(self, id: str) -> TrainSettings: ...

    @abstractmethod
    def state(self, id: str) -> dict:
        """What the trainer wrote last: status, step, records, error, model_dir, ..."""

    @abstractmethod
    def is_training(self, id: str) -> bool:
        """Whether some process holds the run's lock (is training it now)."""

    @abstractmethod
    def patterns(self, id: str, step: int) -> list | None: ...

    @abstractmethod
    def model_folder(self, id: str) -> Path | None:
        """The run's current weights as a Hugging Face folder on this machine, once it has any."""

    def stats(self) -> dict:
        """For /metrics: runs by status, the queue's length, training workers alive (None: not known here)."""
        statuses = [self.info(id).status for id in self.ids()]
        return {"runs": {s: statuses.count(s) for s in STATUSES}, "queue": len(self.queue()), "workers": None}

    def changes(self, id: str, since: str | None) -> tuple[list[tuple[str, object]], str, bool]:
        """What changed in a run since a stream's last event id: ([(event, data)], the new id, finished).

        Here the id is TrainingRunInfo.event_id ("records.step.status"), compared with the run as it is
        now: a stream with no id gets the whole run first; then each new record, the progress (step and
        loss) when it moved, and the whole run again when the status changes. A store that keeps an event
        log (Redis) answers from it instead."""
        info = self.info(id, self.queue())
        n_sent, step_sent, status_sent = _parse_event_id(since)
        events: list[tuple[str, object]] = []
        if since is None or status_sent != info.status:
            events.append(("run", info))
        else:
            events += [("record", r) for r in info.records[n_sent:]]
            if info.step != step_sent:
                events.append(
                    (
                        "progress",
                        {"id": id, "step": info.step, "steps": info.steps, "loss": info.loss, "status": info.status},
                    )
                )
        return events, info.event_id, info.status in FINISHED

    # ---------------------------------------------------------------- changing
    @abstractmethod
    def create(self, s: TrainSettings, client: str, room: Room | None = None) -> tuple[str, bool]:
        """The run of these settings, created queued if new (within `room`, else NoRoom). Returns (id, created)."""

    @abstractmethod
    def requeue(self, id: str, client: str | None = None, room: Room | None = None) -> None:
        """Put a cut-short, cancelled or failed run back in the queue (within `room`): it resumes from its snapshot."""

    @abstractmethod
    def request_cancel(self, id: str) -> None:
        """Ask the trainer to stop (it checks between steps); a run nobody trains is marked at once."""

    @abstractmethod
    def evict(self) -> list[str]:
        """Delete finished runs, oldest first, until the store is within its cap."""


def _parse_event_id(since: str | None) -> tuple[int, int, str | None]:
    """ "3.150.running" -> (3, 150, "running"); anything else starts from nothing."""
    try:
        n, step, status = (since or "").split(".")
        return int(n), int(step), status
    except ValueError:
        return 0, -1, None


class RunWriter(ABC):
    """What the one process training a run writes through, while it holds the run's lock
    (app/training/worker.py `train`). Each write is whole: a reader sees the previous one or this one."""

    id: str

    @abstractmethod
    def state(self) -> dict: ...

    @abstractmethod
    def settings(self) -> TrainSettings: ...

    @abstractmethod
    def load_snapshot(self) -> Snapshot | None: ...

    @abstractmethod
    def save_snapshot(self, snapshot: Snapshot) -> None: ...

    @abstractmethod
    def write_state(self, state: dict) -> None:
        """The run's whole state (status, step, records, ...), as the trainer has it now."""

    @abstractmethod
    def write_progress(self, step: int, loss: float) -> None: ...

    @abstractmethod
    def write_patterns(self, step: int, patterns: list) -> None: ...

    @abstractmethod
    def export(self, run: Training) -> str:
        """The weights as a Hugging Face folder; returns its name (model-<step>) for the state's model_dir."""

    @abstractmethod
    def drop_models_but(self, keep: str | None) -> None:
        """Remove earlier exports: the state names the current one."""

    def stop_requested(self) -> bool:
        """Whether someone asked the run to stop (a cancel), checked between steps."""
        return False


def open_store(settings: Settings) -> TrainingStore | None:
    """The store these settings name: Redis when EXPLORER_REDIS_URL is set, else the runs folder; None when
    training is off (EXPLORER_TRAIN_WORKERS=0)."""
    if not settings.train_workers:
        return None
    if settings.redis_url:
        from app.training.redis_store import RedisStore

        return RedisStore.from_settings(settings)
    return FolderStore(runs_folder(settings), settings.runs_max_mb * 2**20)


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
        if not is_training_run_id(id):
            raise InputError(
                _("{id!r} is not a run id: ids look like induction-3f2a9c1b7d0e (GET /api/v1/runs)").format(id=id)
            )
        return self.root / id

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
        req = self.request(id)
        state = self.state(id)
        status: Status = state["status"]
        training = self.is_training(id)
        if status == "queued" and training:
            status = "running"  # started; the trainer has not written yet
        elif status == "running" and not training:
            status = "interrupted"  # its process is gone (killed, crashed, the server restarted)
        records = state.get("records", [])
        step, loss = step_and_loss(state, read_json(folder / PROGRESS) if status == "running" else None)
        settings = dict(req["settings"])
        if req.get("text_sha256"):
            settings["text"] = f"<sha256 {req['text_sha256'][:16]}>"
        snapshots = (
            sorted(int(p.stem) for p in (folder / PATTERNS).glob("*.json")) if (folder / PATTERNS).is_dir() else []
        )
        position = None
        if status == "queued" and queue is not None and id in queue:
            position = queue.index(id) + 1
        worker = {"host": HOST, "pid": state["pid"]} if status == "running" and state.get("pid") else None
        return TrainingRunInfo(
            id=id,
            recipe=settings["recipe"],
            config=settings,
            status=status,
            step=step,
            steps=settings["steps"],
            created_at=req["created_at"],
            updated_at=state.get("updated_at", req["created_at"]),
            records=records,
            snapshots=snapshots,
            loss=loss,
            model=id if state.get("model_dir") else None,
            error=state.get("error"),
            queue_position=position,
            resumable=(folder / SNAPSHOT).is_file(),
            worker=worker,
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

    def export(self, run: Training) -> str:
        name = f"{MODEL_PREFIX}{run.step}"
        run.export(self.folder / name)
        return name

    def drop_models_but(self, keep: str | None) -> None:
        for old in self.folder.glob(f"{MODEL_PREFIX}*"):
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)

    def stop_requested(self) -> bool:
        return (self.folder / CANCEL).exists()
