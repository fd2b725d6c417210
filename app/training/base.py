"""What every training store is and says, written once: the interface both stores implement
(`TrainingStore`, and `RunWriter` for the process training a run), a run's name (`training_run_id`, the
id's pattern the API checks), a run as the API shows it (`TrainingRunInfo`, built by `run_info` from
whatever a store keeps), the errors a store raises, and the JSON every store writes.

Nothing here knows where runs live: app/training/folder_store.py (the runs folder) and
app/training/redis_store.py (Redis) do, and app/training/__init__.py `open_store` picks one. This module
imports no other module of app/training, so each of them can import it.

A run is a pure function of its settings (recipe, shape, optimiser, seed, steps): its id is a hash of
them, so the same request finds the same run, a class of thirty pressing Start trains once, and replicas
agree on names. Nothing here trains: app/training/worker.py's `train` does, writing through a store's
`RunWriter` while it holds the run's lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core import InputError
from core.i18n import _
from core.recipes import TrainSettings, text_hash
from core.sae_train import JUMPRELU_FIELDS

if TYPE_CHECKING:
    from core.sae_run import SAERun
    from core.train import Snapshot, Training

Status = Literal["queued", "running", "done", "failed", "cancelled", "interrupted"]
STATUSES: tuple[Status, ...] = ("queued", "running", "done", "failed", "cancelled", "interrupted")
FINISHED = ("done", "failed", "cancelled", "interrupted")  # nobody is training it
MODEL_PREFIX = "model-"  # a run's exported weights are model-<step> (an sae run's: a SAELens folder)
SAE_METRICS = ("mse", "explained_variance", "l0", "dead_fraction")  # what an sae recipe's run records
HOST = socket.gethostname()  # who trains a run, with its pid (GET /api/v1/runs/{id} `worker`)


def dumps(obj: Any) -> str:
    """JSON as every store writes it: UTF-8 as is, no NaN (a loss that diverged is a bug to see), compact."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ------------------------------------------------------------------ names

RUN_ID_DIGITS = 12  # hex digits of the settings' hash in a run's id
# A run's id: its recipe (lower-case letters and hyphens, as core.recipes names them) and the hash. The API's
# path parameter checks this same pattern (app/api, through app.service), and `is_training_run_id` does too,
# so a name that is not an id never reaches a folder's path or a Redis key.
RUN_ID_PATTERN = rf"^[a-z-]+-[0-9a-f]{{{RUN_ID_DIGITS}}}$"
RUN_ID_MIN_LENGTH = 1 + 1 + RUN_ID_DIGITS  # a one-letter recipe, the hyphen, the digits
RUN_ID_MAX_LENGTH = 64
_RUN_ID = re.compile(RUN_ID_PATTERN)


def training_run_id(s: TrainSettings) -> str:
    """The run's name: its recipe and a hash of every setting (a text by its SHA-256), e.g. induction-3f2a9c1b7d0e."""
    fields = dataclasses.asdict(s)
    if s.model_sha256 is None:  # the ids of the runs made before the setting existed stay as they were
        del fields["model_sha256"]
    # settings added after runs were named (jumprelu's): left out while unset, so every earlier run keeps its name
    fields = {k: v for k, v in fields.items() if k not in JUMPRELU_FIELDS or v is not None}
    if s.text is not None:
        fields["text"] = text_hash(s.text)
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return f"{s.recipe}-{digest[:RUN_ID_DIGITS]}"


def is_sae_run_id(name: str) -> bool:
    """Whether `name` is an sae recipe's run (its weights are an SAE, not a model)."""
    return is_training_run_id(name) and name.startswith("sae-")


def is_training_run_id(name: str) -> bool:
    """Whether `name` has the shape of a run's id (RUN_ID_PATTERN, at most RUN_ID_MAX_LENGTH characters)."""
    return len(name) <= RUN_ID_MAX_LENGTH and _RUN_ID.fullmatch(name) is not None


def checked_run_id(id: str) -> str:
    """`id` if it is a run's id, else an InputError saying what one looks like."""
    if not is_training_run_id(id):
        raise InputError(
            _("{id!r} is not a run id: ids look like induction-3f2a9c1b7d0e (GET /api/v1/runs)").format(id=id)
        )
    return id


# ------------------------------------------------------------------ what a run is, read back


def step_and_loss(state: dict, progress: dict | None) -> tuple[int, float | None]:
    """The step a run has reached and its loss: the trainer's progress while it runs, else the state's.
    A progress behind the state's step is the previous trainer's (a run resumed from its snapshot writes
    the snapshot's step to its state before its first progress), so it is not read."""
    records = state.get("records", [])
    step = state.get("step", records[-1]["step"] if records else 0)
    if progress and progress["step"] >= step:
        return progress["step"], progress.get("loss")
    return step, records[-1].get("train_loss") if records else None


def progress_event(id: str, step: int, steps: int, loss: float | None, status: str) -> dict:
    """A stream's `progress` event (GET /api/v1/runs/{id}/events): where the run is and its latest loss."""
    return {"id": id, "step": step, "steps": steps, "loss": loss, "status": status}


@dataclass
class TrainingRunInfo:
    """A run as the API shows it (GET /api/v1/runs/{id}); built from what its store keeps (`run_info`)."""

    id: str
    recipe: str
    config: dict  # the settings, a text by its size and hash
    status: Status
    step: int  # the last step trained (the progress while running, else the last record)
    steps: int
    created_at: float
    updated_at: float
    records: list[dict] = field(default_factory=list)  # every Record.to_dict() without its patterns
    snapshots: list[int] = field(default_factory=list)  # steps whose attention patterns are stored
    loss: float | None = None  # the latest training loss (a single step's while running)
    model: str | None = None  # the name /api/v1/run and the pages take, once weights exist
    sae: str | None = None  # an sae recipe's run: the name GET /api/v1/saes lists it by, once it has weights
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
        if self.recipe == "sae":  # an SAE's: SAELens's batch metrics (core/sae_run.py SAERecord)
            keys = ("step", "train_loss", "lr", "elapsed_s", *SAE_METRICS)
        out = {k: [r.get(k) for r in self.records] for k in keys}
        out["loss"] = out.pop("train_loss")
        return out

    @property
    def heads(self) -> dict[str, list]:
        """Per record: every head's previous-token and induction score on the probe, [step][layer][head]."""
        scored = [r for r in self.records if "previous_token" in r]  # an SAE's run scores no heads
        return {
            "step": [r["step"] for r in scored],
            "previous_token": [r["previous_token"] for r in scored],
            "induction": [r["induction"] for r in scored],
        }

    @property
    def samples(self) -> list[dict]:
        return [{"step": r["step"], "text": r["sample"]} for r in self.records if r.get("sample")]

    @property
    def event_id(self) -> str:
        """Where a stream of this run's changes stands: the store's event-log position where it keeps one
        (a Redis stream id), else records sent, the step and the status."""
        return self.cursor or f"{len(self.records)}.{self.step}.{self.status}"


def run_info(
    id: str,
    request: dict,
    state: dict,
    *,
    status: Status,
    progress: dict | None,
    snapshots: list[int],
    resumable: bool,
    queue: list[str] | None,
    worker: dict | None,
    cursor: str | None = None,
) -> TrainingRunInfo:
    """A run as the API shows it, from what every store keeps of it: the request (settings, created_at), the
    trainer's last state (records, step, error, model_dir, updated_at) and its progress, and what only the
    store can say: the status as shown (whether anyone trains it), the snapshot steps, whether a snapshot
    exists, the queue, who trains it and the event log's position. The text of a text run shows as its hash."""
    settings = dict(request["settings"])
    if request.get("text_sha256"):
        settings["text"] = f"<sha256 {request['text_sha256'][:16]}>"
    step, loss = step_and_loss(state, progress if status == "running" else None)
    position = queue.index(id) + 1 if status == "queued" and queue is not None and id in queue else None
    return TrainingRunInfo(
        id=id,
        recipe=settings["recipe"],
        config=settings,
        status=status,
        step=step,
        steps=settings["steps"],
        created_at=request["created_at"],
        updated_at=state.get("updated_at", request["created_at"]),
        records=state.get("records", []),
        snapshots=snapshots,
        loss=loss,
        model=id if state.get("model_dir") and settings["recipe"] != "sae" else None,
        sae=id if state.get("model_dir") and settings["recipe"] == "sae" else None,
        error=state.get("error"),
        queue_position=position,
        resumable=resumable,
        worker=worker if status == "running" else None,
        cursor=cursor,
    )


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
    process training a run writes through a `RunWriter`. Reading is safe from anywhere; each run has one
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
                events.append(("progress", progress_event(id, info.step, info.steps, info.loss, info.status)))
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
    store: TrainingStore  # the store the run lives in

    def model_of(self, id: str) -> tuple[Path, TrainSettings] | None:
        """Another run's current weights (a folder on this machine) and settings: the model run an SAE run
        reads. None when there is no such run, or it has no weights."""
        if not self.store.exists(id):
            return None
        folder = self.store.model_folder(id)
        return None if folder is None else (folder, self.store.settings(id))

    def keep_folder(self) -> Path | None:
        """A folder of this machine where the run keeps files across resumes (an SAE run's activations); None:
        nowhere (a resumed run computes them again)."""
        return None

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
    def export(self, run: Training | SAERun) -> str:
        """The weights as a Hugging Face folder; returns its name (model-<step>) for the state's model_dir."""

    @abstractmethod
    def drop_models_but(self, keep: str | None) -> None:
        """Remove earlier exports: the state names the current one."""

    def stop_requested(self) -> bool:
        """Whether someone asked the run to stop (a cancel), checked between steps."""
        return False
