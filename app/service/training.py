"""Training runs as the pages and the API see them: start one (the same settings name the same run,
within each client's and the server's limits), list, follow, stop, and read what it learned (the
probe's patterns, a head's history, the weights as a zip). The runs themselves live in the store and
are trained by worker processes (app/training/); this is the request side of them.

A *training run* (a job) is never called a "run" alone here: that word is a forward pass (app/service/spec.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

from app.models.catalog import Catalog
from app.service.errors import NotFound, Unavailable
from app.settings import Settings
from app.training.base import (
    NoRoom,
    Room,
    StoreUnavailable,
    TrainingRunInfo,
    TrainingStore,
    is_sae_run_id,
    is_training_run_id,
    training_run_id,
)
from core import InputError, sae_run
from core.checkpoints import trained_models
from core.i18n import _
from core.recipes import TrainSettings
from core.recipes import probe_tokens as recipe_probe_tokens
from core.run_settings import settings as train_settings
from core.sae_train import SAE_KINDS


@dataclass(frozen=True)
class TrainingPatterns:
    id: str
    step: int
    tokens: list[str]  # the probe's tokens
    patterns: list  # [layer][head][query_pos][key_pos]


@dataclass(frozen=True)
class SAEForm:
    """What the training page offers for the sae recipe: the models, the chosen model's hooks (with their
    widths), the architectures, and each architecture's own settings with their defaults (an architecture not
    chosen shows its)."""

    models: list[str]
    hooks: dict[str, int]
    architectures: tuple[str, ...]
    defaults: dict[str, dict[str, object]]  # architecture -> its own settings' defaults


@dataclass(frozen=True)
class HeadHistory:
    steps: list[int]  # the run's snapshot steps
    tokens: list[str]  # the probe's tokens
    patterns: list  # [step][query_pos][key_pos], the head's weights at each snapshot step


def _reachable(method: Callable) -> Callable:
    """The store cannot be reached now (Redis down): 503, with what to check."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except StoreUnavailable as e:
            raise Unavailable(str(e), retry_after_s=5) from e

    return wrapper


class TrainingService:
    """The training runs this server keeps (catalog.training_runs), and the limits on starting more."""

    def __init__(self, catalog: Catalog, settings: Settings):
        self.catalog = catalog
        self.settings = settings

    def _store(self) -> TrainingStore:
        store = self.catalog.training_runs
        if store is None:
            raise Unavailable(_("training is off on this server (EXPLORER_TRAIN_WORKERS=0)"), retry_after_s=None)
        if store.error:
            raise Unavailable(store.error, retry_after_s=5 if store.kind == "redis" else None)
        return store

    def problems(self) -> list[str]:
        """What keeps training from working that an operator must fix (/readyz): Redis out of reach."""
        store = self.catalog.training_runs
        return [store.error] if store is not None and store.kind == "redis" and store.error else []

    @_reachable
    def start(self, recipe: str, changes: dict[str, object], client: str) -> tuple[TrainingRunInfo, bool]:
        """The run of these settings: created and queued if new, resumed if it was cut short, cancelled
        or failed, as it is otherwise. Returns it and whether this request queued it. A run is a pure
        function of its settings, so the same request always names the same run."""
        store = self._store()
        client = hashlib.sha256(client.encode()).hexdigest()[:16]  # who, without keeping the address
        settings = self._settings(store, recipe, changes)
        id = training_run_id(settings)
        room = Room(self.settings.train_max_per_client, self.settings.train_max_runs)
        try:
            if store.exists(id):
                info = store.info(id)
                if info.status not in ("cancelled", "interrupted", "failed"):
                    return info, False
                store.requeue(id, client, room)
                return store.info(id, store.queue()), True
            store.evict()  # make room within EXPLORER_RUNS_MAX_MB: the oldest finished runs go first
            id, created = store.create(settings, client, room)
        except NoRoom as full:
            raise _refusal(full) from None
        return store.info(id, store.queue()), created

    def _settings(self, store: TrainingStore, recipe: str, changes: dict[str, object]) -> TrainSettings:
        """The run's settings, checked. An SAE on a model run reads that run's weights, found here in the store:
        their digest is one of the settings, so a model trained further (or again) under its id names another run."""
        model = changes.get("model")
        if recipe == "sae" and isinstance(model, str) and is_training_run_id(model) and model not in trained_models():
            return sae_run.sae_settings(dict(changes), self._model_run(store, model))
        return train_settings(recipe, **changes)

    @staticmethod
    def _model_run(store: TrainingStore, id: str) -> sae_run.SourceModel:
        """A model run's weights and settings, for an SAE to learn from; InputError (422) saying why it cannot."""
        if is_sae_run_id(id):
            raise InputError(
                _(
                    "model={model!r} is an SAE's run: an SAE learns a model's activations; choose a shipped model "
                    "({choices}) or a model run (GET /api/v1/runs)"
                ).format(model=id, choices=", ".join(trained_models()))
            )
        if not store.exists(id):
            raise InputError(
                _("model={model!r}: there is no run {model} on this server (GET /api/v1/runs lists them)").format(
                    model=id
                )
            )
        folder = store.model_folder(id)
        if folder is None:
            raise InputError(
                _(
                    "model={model!r}: that run has no weights yet (they are written when it finishes or is "
                    "stopped): train an SAE on it once it has"
                ).format(model=id)
            )
        return sae_run.run_model(id, folder, store.settings(id))

    @_reachable
    def all(self) -> list[TrainingRunInfo]:
        """Every run, newest first."""
        store = self._store()
        queue = store.queue()
        return [store.info(id, queue) for id in store.ids()]

    @_reachable
    def get(self, id: str) -> TrainingRunInfo:
        store = self._store()
        if not store.exists(id):
            raise NotFound(_("there is no run {id!r} on this server: GET /api/v1/runs lists them").format(id=id))
        return store.info(id, store.queue())

    @_reachable
    def cancel(self, id: str) -> TrainingRunInfo:
        """Stop a queued or training run; it keeps what it learned (a snapshot, and its weights as a model)."""
        info = self.get(id)
        if info.status in ("queued", "running"):
            self._store().request_cancel(id)
        return self.get(id)

    @_reachable
    def patterns(self, id: str, step: int) -> TrainingPatterns:
        """The probe's attention patterns at a snapshot step, with the probe's tokens."""
        info = self.get(id)
        patterns = self._store().patterns(id, step)
        if patterns is None:
            raise NotFound(
                (
                    _("run {id!r} has no patterns at step {step}: its snapshot steps are {steps}")
                    if info.snapshots
                    else _("run {id!r} has no patterns at step {step}: it has no snapshot yet")
                ).format(id=id, step=step, steps=info.snapshots)
            )
        return TrainingPatterns(id, step, self.probe_tokens(id), patterns)

    @_reachable
    def head_history(self, id: str, layer: int, head: int) -> HeadHistory:
        """One head's pattern on the probe at every snapshot step: how it formed as the run trained."""
        info = self.get(id)
        store = self._store()
        patterns = [store.patterns(id, step) for step in info.snapshots]
        settings = store.settings(id)
        n_layers, n_heads = settings.n_layers, settings.n_heads
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise InputError(
                _(
                    "layer {layer}, head {head} does not exist: the run's model has "
                    "{n_layers} layer(s) of {n_heads} head(s), counted from 0"
                ).format(layer=layer, head=head, n_layers=n_layers, n_heads=n_heads)
            )
        return HeadHistory(info.snapshots, self.probe_tokens(id), [p[layer][head] for p in patterns if p])

    @staticmethod
    def recipe_defaults(recipe: str) -> dict[str, object]:
        """A recipe's working settings, as the training form shows them."""
        return dataclasses.asdict(train_settings(recipe))

    def sae_form(self, model: object) -> SAEForm:
        """The sae recipe's choices: the shipped models, then the model runs with weights (newest first); the
        hooks those of `model` (none for a name that is neither)."""
        shipped = list(trained_models())
        store = self.catalog.training_runs
        try:
            # which runs have weights, from their state (Redis: without fetching each one's weights to this machine)
            runs = [id for id in store.ids() if not is_sae_run_id(id) and store.info(id).model] if store else []
            hooks = {}
            if isinstance(model, str) and model in shipped:
                hooks = sae_run.model_hooks(model)
            elif store is not None and model in runs:
                hooks = sae_run.checkpoint_hooks(self._model_run(store, str(model)).checkpoint)
        except (StoreUnavailable, InputError):  # Redis away, a folder that cannot be read: the shipped ones
            runs, hooks = [], sae_run.model_hooks(model) if model in shipped else {}
        return SAEForm([*shipped, *runs], hooks, SAE_KINDS, sae_run.ARCHITECTURE_DEFAULTS)

    @_reachable
    def probe_tokens(self, id: str) -> list[str]:
        """The probe's tokens, as the patterns' axes show them."""
        self.get(id)  # a run that exists
        return recipe_probe_tokens(self._store().settings(id))

    @_reachable
    def weights_zip(self, id: str) -> tuple[str, bytes]:
        """The run's weights as a zip of its Hugging Face folder: (file name, bytes)."""
        self.get(id)
        folder = self._store().model_folder(id)
        if folder is None:
            raise NotFound(
                _("run {id!r} has no weights yet: they are written when it finishes or is stopped").format(id=id)
            )
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(folder.iterdir()):
                z.write(path, f"{id}/{path.name}")
        return f"{id}.zip", buffer.getvalue()

    @_reachable
    def changes(self, id: str, since: str | None) -> tuple[list[tuple[str, object]], str, bool]:
        """What changed in a run since a stream's last event id: ([(event, data)], the new id, finished).

        The id is TrainingRunInfo.event_id: the folder store's "records.step.status", the Redis store's
        stream ids (app/training/base.py `TrainingStore.changes`). A stream with no id gets the whole run
        first; then each new record, the progress (step and loss) when it moved, and the whole run again
        when the status changes."""
        if not self._store().exists(id):
            raise NotFound(_("there is no run {id!r} on this server: GET /api/v1/runs lists them").format(id=id))
        return self._store().changes(id, since)


def _refusal(full: NoRoom) -> Unavailable:
    if full.scope == "client":
        return Unavailable(
            _(
                "you already have {count} run(s) queued or training, the most one client may have: "
                "wait for one to finish, or stop one (DELETE /api/v1/runs/{{id}})"
            ).format(count=full.count),
            retry_after_s=30,
            status_code=429,
        )
    return Unavailable(
        _("this server has {count} runs queued or training, its limit: try again when one has finished").format(
            count=full.count
        ),
        retry_after_s=30,
        status_code=503,
    )
