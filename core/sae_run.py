"""The sae recipe: a sparse autoencoder trained as a training run, on one hook of a model trained here.

Settings are TrainSettings' (core/recipes.py): `model` (a model shipped in core/trained/, or a model run trained
here: its id, with `model_sha256`, its weights' digest, which the caller's `SourceModel` fills in), `hook` (any of its
[pos, width] activations, e.g. blocks.0.hook_resid_post), `architecture` (standard, topk or jumprelu), `d_sae`,
`k` (topk), `l1_coefficient` (standard) or `l0_coefficient`, `jumprelu_init_threshold` and `jumprelu_bandwidth`
(jumprelu, SAELens's names), and the shared `steps`, `batch_size` (vectors per step), `lr`, `seed`,
`eval_interval`; `text`, the corpus (null: the model's own training data, drawn by its recipe from the seed).

The activations are read once, at the start: at most POOL_TOKENS vectors (fewer when steps × batch_size is
smaller), from sequences of the model's context, computed with one BLAS thread; core/sae_train.py's SAETrainer
then draws its batches from them. Given a folder (the run's), the pool is kept there as an .npy named by its
digest (written beside, then renamed), and a resumed run reads it back instead of running the model again.
A model run's weights are not core's to find: the caller (app/training/) hands them in as a `SourceModel`, the
checkpoint and the settings it was trained with. `SAERun` offers what the
training worker asks of a run (app/training/worker.py: step, settings, records, snapshot, resume, export),
so an SAE run shares the store, the event stream, cancel and resume with a model's run. Its records are
averages since the previous record of the batch metrics SAELens logs (MSE, explained variance, L0), and the
dead fraction at the record's step.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .cache import run_with_cache
from .checkpoints import CONFIG_FILE, Checkpoint, CheckpointError, load_checkpoint, trained_models
from .errors import InputError
from .i18n import _
from .recipes import (
    DIGEST,
    JUMPRELU_FIELDS,
    SAE_FIELDS,
    TrainSettings,
    check,
    make_recipe,
    setting_fields,
)
from .sae import SAE, SAEConfig, save_sae
from .sae_train import MAX_D_SAE, MAX_SAE_K, SAE_KINDS, SAETrainer, SAETraining
from .train import Snapshot

POOL_TOKENS = 65_536  # activation vectors read at the start, at most (64 × 65,536 float32: 16 MiB)
DEFAULT_K = 16  # topk
DEFAULT_L1 = 1.0  # standard: SAELens's l1_coefficient default
# Each architecture's own settings and their defaults (jumprelu's: SAELens's, SAETraining's); a request that sets
# another architecture's is refused.
ARCHITECTURE_DEFAULTS: dict[str, dict[str, object]] = {
    "standard": {"l1_coefficient": DEFAULT_L1},
    "topk": {"k": DEFAULT_K},
    "jumprelu": {name: getattr(SAETraining, name) for name in JUMPRELU_FIELDS},
}
# The recipe's working defaults: the induction model's residual stream after its first layer, 16× expanded.
DEFAULTS: dict[str, object] = dict(
    model="induction",
    hook="blocks.0.hook_resid_post",
    architecture="topk",
    d_sae=1024,
    steps=1000,
    batch_size=512,
    lr=1e-3,
    eval_interval=25,
)
OWN = {*SAE_FIELDS, *DEFAULTS, "seed", "text"}  # the settings an sae run takes (the others shape a model)
RECORD_KEYS = ("loss", "mse", "explained_variance", "l0", "dead_fraction")
POOL_PREFIX = "activations-"  # a run folder's pool: activations-<sha256 of its bytes, 16 digits>.npy


@functools.lru_cache(maxsize=16)
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    out = hashlib.sha256()
    for path, _size, _mtime in files:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                out.update(chunk)
    return out.hexdigest()


def weights_digest(folder: str | Path) -> str:
    """The SHA-256 of a checkpoint folder's weights (its .safetensors files, in name order): what tells two
    trainings of one model id apart. Kept per file size and time, so asking again reads nothing."""
    paths = sorted(Path(folder).glob("*.safetensors"))
    if not paths:
        raise CheckpointError(f"{folder} holds no .safetensors weights")
    return _digest(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths))


@dataclass(frozen=True)
class SourceModel:
    """The model an SAE learns from: its weights and the settings it was trained with (its recipe draws the
    SAE's default corpus). `shipped_model(name)` for core/trained/'s; for a model run the caller finds its
    folder and settings (`run_model`)."""

    name: str
    checkpoint: Checkpoint
    settings: TrainSettings
    shipped: bool = False

    @property
    def digest(self) -> str | None:
        """Its weights' SHA-256 (a model run's), None for a shipped model (named by its name alone)."""
        return None if self.shipped else weights_digest(self.checkpoint.spec.path)


@functools.lru_cache(maxsize=4)
def shipped_model(name: str) -> SourceModel:
    ckpt = _checkpoint(name)
    return SourceModel(name, ckpt, _card_settings(ckpt), shipped=True)


def run_model(name: str, folder: str | Path, settings: TrainSettings) -> SourceModel:
    """A model run's weights (its exported folder) and settings, as an SAE run reads them."""
    if settings.recipe == "sae":
        raise InputError(_("model={model!r} is an SAE's run, not a model's").format(model=name))
    return SourceModel(name, load_checkpoint(folder), settings)


def _source(s: TrainSettings, model: SourceModel | None) -> SourceModel:
    """The model `s` reads: `model` (whose weights must be those the settings name), else the shipped one."""
    if model is None:
        if s.model_sha256 is not None:
            raise InputError(
                _("the SAE run reads model run {model}'s weights, which were not handed to it").format(model=s.model)
            )
        models = trained_models()
        if s.model not in models:
            raise InputError(
                _(
                    "model={model!r}: SAEs are trained here on the models shipped with the explorer ({choices}) or "
                    "on a model trained here (a run's id, e.g. induction-3f2a9c1b7d0e: GET /api/v1/runs)"
                ).format(model=s.model, choices=", ".join(models))
            )
        return shipped_model(str(s.model))
    if model.name != s.model:
        raise InputError(_("the SAE run reads model {model}, not {other}").format(model=s.model, other=model.name))
    if s.model_sha256 is not None and s.model_sha256 != model.digest:
        raise InputError(
            _(
                "model run {model}'s weights have changed since this SAE was asked for (it trained further, or "
                "again): ask for the SAE again to train it on the weights there are now"
            ).format(model=s.model)
        )
    return model


def sae_settings(given: dict, model: SourceModel | None = None) -> TrainSettings:
    """The sae recipe's settings: its defaults with `given` applied, checked (InputError says what to change).
    `model`: the model run it reads (None: `given`'s model is a shipped one); its digest becomes model_sha256."""
    model_only = [f.name for f in setting_fields() if f.name in given and f.name not in OWN and f.name != DIGEST]
    if model_only:
        raise InputError(
            _(
                "the sae recipe trains an autoencoder on a model that exists: leave out {fields} (they shape "
                "or optimise a model; the SAE's settings are {own})"
            ).format(fields=", ".join(model_only), own=", ".join(sorted(OWN)))
        )
    values: dict[str, Any] = DEFAULTS | given
    if model is not None and not model.shipped:
        values[DIGEST] = model.digest
    architecture = values["architecture"]
    if architecture not in SAE_KINDS:
        raise InputError(
            _("architecture={architecture!r}: SAEs are trained here as {choices}").format(
                architecture=architecture, choices=" or ".join(SAE_KINDS)
            )
        )
    own = ARCHITECTURE_DEFAULTS[architecture]
    for other, names in ARCHITECTURE_DEFAULTS.items():
        if wrong := [name for name in names if name in given and name not in own]:
            raise InputError(
                _("{name} is the {owner} architecture's setting; a {architecture} SAE takes {own} instead").format(
                    name=wrong[0], owner=other, architecture=architecture, own=", ".join(own)
                )
            )
    values = {**own, **values}
    steps = values["steps"]
    if isinstance(steps, int) and steps >= 1 and "eval_interval" not in given:
        values["eval_interval"] = min(int(values["eval_interval"]), steps)
    s = TrainSettings(recipe="sae", **values)
    check(s)
    check_sae(s, model)
    return s


@functools.lru_cache(maxsize=4)
def _checkpoint(name: str) -> Checkpoint:
    return load_checkpoint(trained_models()[name])


@functools.lru_cache(maxsize=4)
def model_hooks(name: str) -> dict[str, int]:
    """A shipped model's hooks an SAE can read (one vector per position), with their widths."""
    return checkpoint_hooks(_checkpoint(name))


def checkpoint_hooks(ckpt: Checkpoint) -> dict[str, int]:
    """A model's hooks an SAE can read (one vector per position), with their widths: one pass of two tokens."""
    _logits, cache = run_with_cache(ckpt.params, ckpt.cfg, np.zeros(2, dtype=np.int64), logits=False)
    return {k: int(v.shape[-1]) for k, v in cache.items() if v.ndim == 2}


def check_sae(s: TrainSettings, model: SourceModel | None = None) -> None:
    source = _source(s, model)
    hooks = model_hooks(source.name) if source.shipped else checkpoint_hooks(source.checkpoint)
    if s.hook not in hooks:
        raise InputError(
            _("hook={hook!r} is not one of {model}'s hooks an SAE can read: {choices}").format(
                hook=s.hook, model=s.model, choices=", ".join(hooks)
            )
        )
    if not isinstance(s.d_sae, int) or not 1 <= s.d_sae <= MAX_D_SAE:
        raise InputError(
            _("d_sae={d_sae!r} must be an integer from 1 to {most:,}").format(d_sae=s.d_sae, most=MAX_D_SAE)
        )
    if s.architecture == "topk" and not (isinstance(s.k, int) and 1 <= s.k <= min(s.d_sae, MAX_SAE_K)):
        raise InputError(
            _("k={k!r} features active per token must be from 1 to {most} (at most d_sae={d_sae})").format(
                k=s.k, most=min(s.d_sae, MAX_SAE_K), d_sae=s.d_sae
            )
        )
    if s.architecture == "standard" and not (
        isinstance(s.l1_coefficient, (int, float)) and math.isfinite(s.l1_coefficient) and s.l1_coefficient >= 0
    ):
        raise InputError(_("l1_coefficient must be a number of at least 0"))
    if s.architecture == "jumprelu":
        fields = {f.name: f for f in dataclasses.fields(TrainSettings)}
        for name in JUMPRELU_FIELDS:  # within the bounds TrainSettings states (the API's schema states them too)
            value, bounds = getattr(s, name), fields[name].metadata["bounds"]
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and value <= bounds["le"]
            if "gt" in bounds and not (number and value > bounds["gt"]):
                raise InputError(
                    _("{name}={value!r} must be a number above {low:g} and at most {high:g}").format(
                        name=name, value=value, low=bounds["gt"], high=bounds["le"]
                    )
                )
            if "ge" in bounds and not (number and value >= bounds["ge"]):
                raise InputError(
                    _("{name}={value!r} must be a number from {low:g} to {high:g}").format(
                        name=name, value=value, low=bounds["ge"], high=bounds["le"]
                    )
                )
    if s.text is not None:
        ids = source.checkpoint.tokenizer.encode(s.text).ids
        if len(ids) < 2:
            raise InputError(_("the text gives {n} token(s); an SAE needs at least 2 to learn from").format(n=len(ids)))


def pool_size(s: TrainSettings) -> int:
    """How many activation vectors a run reads: POOL_TOKENS, or steps × batch_size when fewer."""
    return min(POOL_TOKENS, s.steps * s.batch_size)


def activations(s: TrainSettings, model: SourceModel | None = None) -> np.ndarray:
    """[n, d_in] float32: the hook's vectors over the corpus, at most POOL_TOKENS (fewer when steps ×
    batch_size is smaller). The model's own data: its recipe's batches from a generator seeded by the run's
    seed; a text: its tokens in windows of the model's context, the whole text or its first POOL_TOKENS.
    `model`: a model run's (see `SourceModel`); None: the shipped model the settings name."""
    from threadpoolctl import threadpool_limits

    source = _source(s, model)
    ckpt = source.checkpoint
    n = pool_size(s)
    n_ctx = ckpt.cfg.n_ctx
    if s.text is None:
        recipe = make_recipe(source.settings)
        rng = np.random.default_rng(np.random.SeedSequence(s.seed).spawn(2)[1])
        rows: list[np.ndarray] = []
        while sum(r.size for r in rows) < n:
            rows.extend(recipe.batch(rng)[:, :n_ctx])
        sequences = rows
    else:
        ids = np.asarray(ckpt.tokenizer.encode(s.text).ids[:n], dtype=np.int64)
        sequences = [ids[i : i + n_ctx] for i in range(0, len(ids), n_ctx)]
    out = []
    with threadpool_limits(1, user_api="blas"):
        for seq in sequences:
            _logits, cache = run_with_cache(ckpt.params, ckpt.cfg, seq, names=[str(s.hook)], logits=False)
            out.append(cache[str(s.hook)])
    return np.ascontiguousarray(np.concatenate(out)[:n], dtype=np.float32)


def kept_activations(
    s: TrainSettings, model: SourceModel | Callable[[], SourceModel] | None, folder: str | Path | None
) -> np.ndarray:
    """The run's activations: read back from `folder` when a whole pool is kept there (its bytes' digest is its
    name; at most pool_size rows, fewer from a shorter text), else computed (`model` called only then) and,
    given a folder, kept there."""
    n = pool_size(s)
    for path in sorted(Path(folder).glob(f"{POOL_PREFIX}*.npy")) if folder is not None else ():
        try:
            x = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            continue
        if x.dtype == np.float32 and x.ndim == 2 and 1 <= x.shape[0] <= n and path.stem == _pool_name(x):
            return x
    x = activations(s, model() if callable(model) else model)
    if folder is not None:
        _keep(Path(folder), x)
    return x


def _pool_name(x: np.ndarray) -> str:
    return POOL_PREFIX + hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]


def _keep(folder: Path, x: np.ndarray) -> None:
    """The pool as folder/activations-<digest>.npy: written beside, then renamed, the earlier ones removed."""
    name = _pool_name(x) + ".npy"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, x, allow_pickle=False)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for old in folder.glob(f"{POOL_PREFIX}*.npy"):
        if old.name != name:
            old.unlink(missing_ok=True)


def _card_settings(ckpt: Checkpoint) -> TrainSettings:
    """The settings a shipped model was trained with (its config.json's card)."""
    import json

    raw = json.loads((ckpt.spec.path / CONFIG_FILE).read_text(encoding="utf-8"))
    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    card = {k: v for k, v in raw["transformer_explorer"]["settings"].items() if k in fields}
    return TrainSettings(**card)


@dataclass
class SAERecord:
    """One record of an SAE run: the means since the previous record, and the dead fraction now."""

    step: int
    steps: int
    train_loss: float
    mse: float
    explained_variance: float
    l0: float
    dead_fraction: float
    lr: float
    elapsed_s: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class SAERun:
    """One SAE's training run, as app/training/worker.py drives a model's (core/train.py Training)."""

    def __init__(
        self,
        s: TrainSettings,
        model: SourceModel | Callable[[], SourceModel] | None = None,
        folder: str | Path | None = None,
    ):
        """`model`: a model run's weights and settings (or what loads them, called only when its activations
        are not kept yet); None: the shipped model the settings name. `folder`: where its activations pool is
        kept across resumes (None: nowhere, computed each time)."""
        self.settings = s
        x = kept_activations(s, model, folder)
        self.cfg = SAEConfig(
            architecture=str(s.architecture),
            d_in=int(x.shape[1]),
            d_sae=int(s.d_sae or 0),
            hook_name=str(s.hook),
            model_name=str(s.model),
            k=s.k if s.architecture == "topk" else None,
            metadata={"trained_by": "transformer-explorer sae recipe", "settings": s.to_dict()},
        )
        jumprelu: dict[str, Any] = {
            name: float(getattr(s, name)) for name in JUMPRELU_FIELDS if getattr(s, name) is not None
        }
        self.trainer = SAETrainer(
            x,
            self.cfg,
            SAETraining(
                steps=s.steps,
                batch_size=s.batch_size,
                lr=s.lr,
                seed=s.seed,
                l1_coefficient=float(s.l1_coefficient or 0.0),
                **jumprelu,
            ),
        )
        self._pending: list[list[float]] = []  # each step's RECORD_KEYS since the last record
        self._elapsed = 0.0

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def sae(self) -> SAE:
        return self.trainer.sae

    def records(
        self, stop: Callable[[], bool] | None = None, progress: Callable[[int, float], None] | None = None
    ) -> Iterator[SAERecord]:
        """Train to settings.steps, yielding a record every eval_interval steps and at the last; `stop()` is
        asked before every step, `progress(step, loss)` told after it."""
        s = self.settings
        while self.step < s.steps:
            if stop is not None and stop():
                return
            t0 = time.perf_counter()
            r = self.trainer.train_step()
            self._elapsed += time.perf_counter() - t0
            if not math.isfinite(r.loss):
                raise InputError(
                    _(
                        "the loss became {loss} at step {step}: training diverged; lower the learning rate (lr={lr:g})"
                    ).format(loss=r.loss, step=r.step, lr=s.lr)
                )
            self._pending.append([getattr(r, k) for k in RECORD_KEYS])
            if progress is not None:
                progress(self.step, r.loss)
            if self.step % s.eval_interval == 0 or self.step == s.steps:
                yield self._record()

    def _record(self) -> SAERecord:
        means = np.mean(self._pending, axis=0)
        dead = self._pending[-1][-1]
        self._pending = []
        return SAERecord(
            step=self.step,
            steps=self.settings.steps,
            train_loss=float(means[0]),
            mse=float(means[1]),
            explained_variance=float(means[2]),
            l0=float(means[3]),
            dead_fraction=float(dead),
            lr=self.settings.lr,
            elapsed_s=self._elapsed,
        )

    def snapshot(self) -> Snapshot:
        state = self.trainer.state()
        return Snapshot(
            settings=self.settings,
            step=state["step"],
            params=state["params"],
            m=state["m"],
            v=state["v"],
            t=state["t"],
            data_rng_state=state["rng"],
            elapsed_s=self._elapsed,
            arrays={
                "since": state["since"],
                "pending": np.asarray(self._pending, dtype=np.float64).reshape(-1, len(RECORD_KEYS)),
            },
        )

    @classmethod
    def resume(
        cls,
        snap: Snapshot,
        model: SourceModel | Callable[[], SourceModel] | None = None,
        folder: str | Path | None = None,
    ) -> SAERun:
        run = cls(snap.settings, model, folder)
        run.trainer.restore(
            {
                "step": snap.step,
                "params": snap.params,
                "m": snap.m,
                "v": snap.v,
                "t": snap.t,
                "rng": snap.data_rng_state,
                "since": snap.arrays["since"],
            }
        )
        run._pending = snap.arrays["pending"].tolist()
        run._elapsed = snap.elapsed_s
        return run

    def export(self, folder: str | Path) -> Path:
        """The SAE as a SAELens folder (cfg.json, sae_weights.safetensors), replacing one there."""
        folder = Path(folder)
        if folder.exists():
            shutil.rmtree(folder)
        return save_sae(self.sae, folder)
