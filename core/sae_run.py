"""The sae recipe: a sparse autoencoder trained as a training run, on one hook of a model trained here.

Settings are TrainSettings' (core/recipes.py): `model` (a model shipped in core/trained/), `hook` (any of its
[pos, width] activations, e.g. blocks.0.hook_resid_post), `architecture` (standard or topk), `d_sae`, `k` (topk)
or `l1_coefficient` (standard), and the shared `steps`, `batch_size` (vectors per step), `lr`, `seed`,
`eval_interval`; `text`, the corpus (null: the model's own training data, drawn by its recipe from the seed).

The activations are read once, at the start: at most POOL_TOKENS vectors (fewer when steps × batch_size is
smaller), from sequences of the model's context, computed with one BLAS thread so that a resumed run reads the
same numbers; core/sae_train.py's SAETrainer then draws its batches from them. `SAERun` offers what the
training worker asks of a run (app/training/worker.py: step, settings, records, snapshot, resume, export),
so an SAE run shares the store, the event stream, cancel and resume with a model's run. Its records are
averages since the previous record of the batch metrics SAELens logs (MSE, explained variance, L0), and the
dead fraction at the record's step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache import run_with_cache
from .checkpoints import CONFIG_FILE, Checkpoint, load_checkpoint, trained_models
from .errors import InputError
from .i18n import _
from .recipes import (
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


def sae_settings(given: dict) -> TrainSettings:
    """The sae recipe's settings: its defaults with `given` applied, checked (InputError says what to change)."""
    model_only = [f.name for f in setting_fields() if f.name in given and f.name not in OWN]
    if model_only:
        raise InputError(
            _(
                "the sae recipe trains an autoencoder on a model that exists: leave out {fields} (they shape "
                "or optimise a model; the SAE's settings are {own})"
            ).format(fields=", ".join(model_only), own=", ".join(sorted(OWN)))
        )
    values = DEFAULTS | given
    architecture = values["architecture"]
    if architecture not in SAE_KINDS:
        raise InputError(
            _("architecture={architecture!r}: SAEs are trained here as {choices}").format(
                architecture=architecture, choices=" or ".join(SAE_KINDS)
            )
        )
    if architecture == "topk":
        if "l1_coefficient" in given:
            raise InputError(
                _("l1_coefficient is the standard architecture's penalty; a topk SAE keeps k features instead")
            )
        values.setdefault("k", DEFAULT_K)
    else:
        if "k" in given:
            raise InputError(_("k is the topk architecture's; a standard SAE is made sparse by l1_coefficient"))
        values.setdefault("l1_coefficient", DEFAULT_L1)
    steps = values["steps"]
    if isinstance(steps, int) and steps >= 1 and "eval_interval" not in given:
        values["eval_interval"] = min(int(values["eval_interval"]), steps)
    s = TrainSettings(recipe="sae", **values)
    check(s)
    check_sae(s)
    return s


@functools.lru_cache(maxsize=4)
def _checkpoint(name: str) -> Checkpoint:
    return load_checkpoint(trained_models()[name])


@functools.lru_cache(maxsize=4)
def model_hooks(name: str) -> dict[str, int]:
    """A shipped model's hooks an SAE can read (one vector per position), with their widths."""
    ckpt = _checkpoint(name)
    _logits, cache = run_with_cache(ckpt.params, ckpt.cfg, np.zeros(2, dtype=np.int64), logits=False)
    return {k: int(v.shape[-1]) for k, v in cache.items() if v.ndim == 2}


def check_sae(s: TrainSettings) -> None:
    models = trained_models()
    if s.model not in models:
        raise InputError(
            _("model={model!r}: SAEs are trained here on the models shipped with the explorer: {choices}").format(
                model=s.model, choices=", ".join(models)
            )
        )
    hooks = model_hooks(s.model)
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
    if s.text is not None:
        ids = _checkpoint(s.model).tokenizer.encode(s.text).ids
        if len(ids) < 2:
            raise InputError(_("the text gives {n} token(s); an SAE needs at least 2 to learn from").format(n=len(ids)))


def activations(s: TrainSettings) -> np.ndarray:
    """[n, d_in] float32: the hook's vectors over the corpus, at most POOL_TOKENS (fewer when steps ×
    batch_size is smaller). The model's own data: its recipe's batches from a generator seeded by the run's
    seed; a text: its tokens in windows of the model's context, the whole text or its first POOL_TOKENS."""
    from threadpoolctl import threadpool_limits

    ckpt = _checkpoint(str(s.model))
    n = min(POOL_TOKENS, s.steps * s.batch_size)
    n_ctx = ckpt.cfg.n_ctx
    if s.text is None:
        card = _card_settings(ckpt)
        recipe = make_recipe(card)
        rng = np.random.default_rng(np.random.SeedSequence(s.seed).spawn(2)[1])
        rows: list[np.ndarray] = []
        while sum(r.size for r in rows) < n:
            rows.extend(recipe.batch(rng)[:, :n_ctx])
        sequences = rows
    else:
        ids = np.asarray(_checkpoint(str(s.model)).tokenizer.encode(s.text).ids[:n], dtype=np.int64)
        sequences = [ids[i : i + n_ctx] for i in range(0, len(ids), n_ctx)]
    out = []
    with threadpool_limits(1, user_api="blas"):
        for seq in sequences:
            _logits, cache = run_with_cache(ckpt.params, ckpt.cfg, seq, names=[str(s.hook)], logits=False)
            out.append(cache[str(s.hook)])
    return np.ascontiguousarray(np.concatenate(out)[:n], dtype=np.float32)


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

    def __init__(self, s: TrainSettings):
        self.settings = s
        x = activations(s)
        self.cfg = SAEConfig(
            architecture=str(s.architecture),
            d_in=int(x.shape[1]),
            d_sae=int(s.d_sae or 0),
            hook_name=str(s.hook),
            model_name=str(s.model),
            k=s.k if s.architecture == "topk" else None,
            metadata={"trained_by": "transformer-explorer sae recipe", "settings": s.to_dict()},
        )
        self.trainer = SAETrainer(
            x,
            self.cfg,
            SAETraining(
                steps=s.steps,
                batch_size=s.batch_size,
                lr=s.lr,
                seed=s.seed,
                l1_coefficient=float(s.l1_coefficient or 0.0),
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
    def resume(cls, snap: Snapshot) -> SAERun:
        run = cls(snap.settings)
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
