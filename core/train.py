"""Training a recipe's model: the loop, what it records, snapshots, and the command line.

    python -m core.train induction                      # one line per evaluation
    python -m core.train induction --control            # and the 1-layer control beside it
    python -m core.train text --steps 500 --out runs/text

From code (the app runs this in a worker process, beside its request workers):

    run = Training(model_settings("induction", seed=1))
    for record in run.records(stop=cancelled.is_set):   # a Record every eval_interval steps
        send(record.to_dict())                          # plain JSON-able data
    run.snapshot().save("run.npz")                      # between steps, at any time
    run = Training.resume(Snapshot.load("run.npz"))     # continues bit for bit
    run.export("models/mine")                           # a Hugging Face GPT-2 folder

What reproduces where (docs/training.md):

  bit for bit   same settings, same NumPy (and so the same BLAS build), the same BLAS kernel and one
                BLAS thread: every random draw comes from the seed (core/recipes.py), the optimiser is
                deterministic, and every matrix product adds in the same order. Another kernel (OpenBLAS
                picks one per CPU: Haswell, SkylakeX, ...; `OPENBLAS_CORETYPE` forces one), another
                BLAS or another thread count may add in another order and change the last bits.
  within bounds on any CPU: the last bits differ and stay that small (nasi-lemak: weights within 6e-7
                of each other on every OpenBLAS kernel measured) unless a rounding difference puts a
                pre-activation that is within rounding of 0 on the other side of a ReLU's kink; the run
                then goes on from a nearby but different place (nasi-lemak: weights up to 0.044 apart,
                p('l' | "nasi ") within 3e-5, head scores within 0.002, the same predicted letters;
                tests/core/nasi_lemak_reproduction.py). A long run drifts further (docs/training.md).

An exported folder's config.json records the BLAS its training ran on (`blas`: library, version, kernel,
threads) beside NumPy's and Python's versions, so a run can be repeated bit for bit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from . import backprop
from .analysis import detector_score, induction_keys, previous_token_keys
from .errors import InputError
from .i18n import _
from .optim import AdamW, ParamVector, clip_grad_norm, learning_rate
from .recipes import DEFAULTS, UNK, Induction, TrainSettings, make_recipe, model_settings, setting_fields, setting_type

SAMPLE_TOKENS = 96  # longest sample (and never past the model's context)


@dataclass
class Record:
    """What a run reports every eval_interval steps (and at step 0, before training)."""

    step: int
    steps: int
    lr: float  # the learning rate of the step just taken
    train_loss: float | None  # mean training loss over the steps since the previous record (None at step 0)
    val_loss: float  # mean loss on the fixed held-out sequences
    grad_norm: float | None  # the last step's gradient norm, before clipping
    previous_token: list[list[float]]  # [layer][head]: attention to the token before, on the probe
    induction: list[list[float]]  # [layer][head]: attention to what followed the current token last time
    icl_score: float  # in-context learning: held-out loss late in the context minus early (negative: context helps)
    target: float | None  # the recipe's target probability (Recipe.target_name), if it has one
    patterns: list | None = None  # [layer][head][query_pos][key_pos] on probe 0, at snapshot steps
    sample: str | None = None  # the model's continuation of the recipe's prompt, at snapshot steps
    elapsed_s: float = 0.0  # wall-clock seconds of training and evaluation so far

    def to_dict(self) -> dict:
        """Plain JSON data: a score that does not exist (NaN: no query of the probe had a relevant key)
        or a diverged number becomes None, since JSON has no NaN or infinity."""
        return _finite(asdict(self))

    @property
    def best_induction(self) -> float:
        """The highest induction score among the last layer's heads (where induction heads sit)."""
        return float(np.nanmax(self.induction[-1]))


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


@dataclass
class Snapshot:
    """Everything a run needs to continue exactly: settings, weights, optimiser state, step, data stream."""

    settings: TrainSettings
    step: int
    params: np.ndarray  # [n_params], ParamVector order
    m: np.ndarray  # AdamW's moments, same layout
    v: np.ndarray
    t: int
    data_rng_state: Mapping[str, Any]  # the numpy bit generator's state (JSON-able)
    pending_losses: list[float] = field(default_factory=list)  # training losses since the last record
    grad_norm: float | None = None
    elapsed_s: float = 0.0
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # a recipe's own state (the sae recipe's)

    def save(self, path: str | Path) -> Path:
        """One .npz; written beside the target and renamed into place, so a reader never sees half a file."""
        path = Path(path)
        meta = {
            "settings": asdict(self.settings),
            "step": self.step,
            "t": self.t,
            "data_rng_state": self.data_rng_state,
            "pending_losses": self.pending_losses,
            "grad_norm": self.grad_norm,
            "elapsed_s": self.elapsed_s,
        }
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            arrays: dict[str, Any] = {
                "params": self.params,
                "m": self.m,
                "v": self.v,
                "meta": np.array(json.dumps(meta)),
            }
            arrays |= {f"arrays.{k}": v for k, v in self.arrays.items()}  # a recipe's own (the sae recipe's)
            np.savez(f, **arrays)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path | IO[bytes]) -> Snapshot:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            return cls(
                TrainSettings(**meta["settings"]),
                meta["step"],
                z["params"],
                z["m"],
                z["v"],
                meta["t"],
                meta["data_rng_state"],
                meta["pending_losses"],
                meta["grad_norm"],
                meta["elapsed_s"],
                {k.removeprefix("arrays."): z[k] for k in z.files if k.startswith("arrays.")},
            )


# A batch is run through the model this many tokens at a time (gradient accumulation), so that each
# part's activations stay in the CPU cache between the forward and the backward pass: measured ~10%
# faster on the text recipe's 4,096-token batches. Smaller batches run whole.
MICRO_BATCH_TOKENS = 1024


def optimisation_step(
    vector: ParamVector, optimizer: AdamW, cfg, batch: np.ndarray, lr: float, grad_clip: float
) -> tuple[float, float]:
    """Loss and gradients of batch [batch, pos + 1] (inputs [:, :-1], targets [:, 1:]), the gradient clipped
    to a global norm of grad_clip (0: not clipped), one AdamW update at this learning rate.
    Returns the loss and the gradient's norm before clipping."""
    n_parts = max(1, min(len(batch), batch[:, 1:].size // MICRO_BATCH_TOKENS))
    loss, grad = 0.0, None
    parts = np.array_split(batch, n_parts)  # at least one: the gradient is set below
    for part in parts:
        part_loss, grads = backprop.loss_and_grads(vector.params, cfg, part[:, :-1], part[:, 1:])
        weight = len(part) / len(batch)  # each part's loss is a mean over its own sequences
        loss += weight * part_loss
        g = vector.flatten(grads)  # [n_params]
        grad = g * g.dtype.type(weight) if grad is None else grad + g * g.dtype.type(weight)
        # (with one part, weight is 1 and the gradient passes unchanged)
    assert grad is not None  # n_parts >= 1
    norm = clip_grad_norm(grad, grad_clip if grad_clip > 0 else math.inf)
    optimizer.step(grad, lr)
    return loss, norm


_malloc_tuned = False


def reuse_freed_memory() -> None:
    """Ask the C library to keep freed memory for reuse (glibc only; elsewhere nothing happens).

    A training step allocates and frees the same few-hundred-kilobyte arrays again and again. By
    default glibc hands blocks that size back to the system (mmap, or trimming the heap) and the next
    step faults every page back in: measured here, that made a step about 1.8x slower. This raises
    the thresholds for the whole process, once.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows): nothing to tune
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 64 << 20)
    mallopt(M_TRIM_THRESHOLD, 256 << 20)


def blas_in_use() -> dict | None:
    """The BLAS NumPy's matrix products run on, as threadpoolctl sees it now: library, version, kernel
    (OpenBLAS's architecture, e.g. "Haswell") and threads; None if it sees none. With NumPy's and
    Python's versions, what decides a run's last bits."""
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    blas.sort(key=lambda i: "numpy" not in i.get("filepath", ""))  # NumPy's own first (SciPy may load another)
    if not blas:
        return None
    i = blas[0]
    return {
        "library": i.get("internal_api"),
        "version": i.get("version"),
        "kernel": i.get("architecture"),
        "threads": i.get("num_threads"),
    }


class Training:
    """One run: a recipe's model, its AdamW state and data stream, advanced one step at a time."""

    def __init__(self, s: TrainSettings):
        reuse_freed_memory()
        self.settings = s
        self.recipe = make_recipe(s)
        self.cfg = self.recipe.cfg
        self.vector = ParamVector(self.recipe.init_params())
        self.optimizer = AdamW(self.vector, weight_decay=s.weight_decay)
        self.step = 0
        self.grad_norm: float | None = None
        self._pending: list[float] = []  # training losses since the last record
        self._elapsed = 0.0
        self.blas: dict | None = None  # the BLAS the last records() trained on (blas_in_use), for export
        self._prev_keys = [previous_token_keys(p) for p in self.recipe.probe]
        self._induction_keys = [induction_keys(p) for p in self.recipe.probe]

    @property
    def params(self):
        """The model's weights: views into the optimiser's flat vector (they change as it steps)."""
        return self.vector.params

    def lr(self, step: int) -> float:
        s = self.settings
        return learning_rate(step, lr=s.lr, steps=s.steps, warmup=s.warmup, min_lr=s.final_lr)

    # ------------------------------------------------------------------ one step

    def train_step(self) -> float:
        """Draw a batch and take one optimisation step on it. Returns the batch's loss."""
        batch = self.recipe.batch(self.recipe.data_rng)  # [batch, seq_len + 1]
        loss, self.grad_norm = optimisation_step(
            self.vector, self.optimizer, self.cfg, batch, self.lr(self.step), self.settings.grad_clip
        )
        if not math.isfinite(loss):
            raise InputError(
                _(
                    "the loss became {loss} at step {step}: training diverged; lower the "
                    "learning rate (lr={lr:g}) or keep gradient clipping on"
                ).format(loss=loss, step=self.step + 1, lr=self.settings.lr)
            )
        self.step += 1
        self._pending.append(loss)
        return loss

    def records(
        self, stop: Callable[[], bool] | None = None, progress: Callable[[int, float], None] | None = None
    ) -> Iterator[Record]:
        """Train to settings.steps, yielding a Record at step 0 (fresh runs), every eval_interval steps
        and at the last step. `stop()` is asked before every step; when it says True the run stops
        there (take a snapshot to continue it later). `progress(step, loss)` is told after every step
        (a live page shows it between records)."""
        s = self.settings
        if self.step < s.steps:
            self.blas = blas_in_use()
        if self.step == 0:
            yield self.evaluate()
        while self.step < s.steps:
            if stop is not None and stop():
                return
            t0 = time.perf_counter()
            loss = self.train_step()
            self._elapsed += time.perf_counter() - t0
            if progress is not None:
                progress(self.step, loss)
            if self.step % s.eval_interval == 0 or self.step == s.steps:
                yield self.evaluate()

    def run(self, stop: Callable[[], bool] | None = None) -> list[Record]:
        return list(self.records(stop))

    # ------------------------------------------------------------------ evaluation

    def _logits(self, tokens: np.ndarray) -> np.ndarray:  # [batch, pos] -> [batch, pos, d_vocab]
        return backprop.forward(self.params, self.cfg, tokens)[0]

    def evaluate(self, patterns: bool | None = None, sample: bool | None = None) -> Record:
        t0 = time.perf_counter()
        s, recipe = self.settings, self.recipe
        at_snapshot = self.step % s.snapshot_every == 0 or self.step == s.steps
        patterns = at_snapshot if patterns is None else patterns
        sample = at_snapshot if sample is None else sample

        # Held-out loss, position by position, MICRO_BATCH_TOKENS at a time (as training runs a batch).
        held_out = recipe.held_out
        parts = max(1, min(len(held_out), held_out[:, 1:].size // MICRO_BATCH_TOKENS))
        losses = np.concatenate(
            [_token_losses(self._logits(chunk[:, :-1]), chunk[:, 1:]) for chunk in np.array_split(held_out, parts)]
        )
        quarter = max(1, losses.shape[1] // 4)
        icl = float(losses[:, -quarter:].mean() - losses[:, :quarter].mean())

        # Head scores on the probe: mean over its sequences of core.analysis's detector scores.
        _, saved = backprop.forward(self.params, self.cfg, recipe.probe)
        pattern = np.stack([layer.pattern for layer in saved.layers], axis=1)  # [n_probes, layer, head, q, k]
        prev = np.nanmean([detector_score(p, keys) for p, keys in zip(pattern, self._prev_keys)], axis=0)
        ind = np.nanmean([detector_score(p, keys) for p, keys in zip(pattern, self._induction_keys)], axis=0)

        target = recipe.target(lambda tokens: self._logits(np.asarray(tokens)[None])[0])
        record = Record(
            step=self.step,
            steps=s.steps,
            lr=self.lr(max(0, self.step - 1)),
            train_loss=float(np.mean(self._pending)) if self._pending else None,
            val_loss=float(losses.mean()),
            grad_norm=self.grad_norm,
            previous_token=prev.tolist(),
            induction=ind.tolist(),
            icl_score=icl,
            target=target,
            patterns=pattern[0].astype(np.float64).tolist() if patterns else None,
            sample=self.sample() if sample else None,
        )
        self._pending = []
        self._elapsed += time.perf_counter() - t0
        record.elapsed_s = self._elapsed
        return record

    def sample(self, n_new: int = SAMPLE_TOKENS) -> str:
        """The model's continuation of the recipe's prompt (greedy, or sampled with a generator seeded by
        the run's seed and step, so a sample never moves the data stream)."""
        tokens = list(self.recipe.sample_prompt())
        prompt_len = len(tokens)
        rng = np.random.default_rng([self.settings.seed, self.step])
        while len(tokens) < min(self.cfg.n_ctx, prompt_len + n_new):
            logits = self._logits(np.array(tokens)[None])[0, -1].astype(np.float64)
            if self.recipe.vocab[0] == UNK:
                logits[0] = -np.inf  # a sample is text: never [UNK]
            if self.recipe.sample_greedy:
                tokens.append(int(np.argmax(logits)))
            else:
                p = np.exp(logits - logits.max())
                tokens.append(int(rng.choice(len(p), p=p / p.sum())))
        return self.recipe.decode(tokens)

    # ------------------------------------------------------------------ snapshots and export

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.settings,
            self.step,
            self.vector.flat.copy(),
            self.optimizer.state.m.copy(),
            self.optimizer.state.v.copy(),
            self.optimizer.state.t,
            self.recipe.data_rng.bit_generator.state,
            list(self._pending),
            self.grad_norm,
            self._elapsed,
        )

    @classmethod
    def resume(cls, snap: Snapshot) -> Training:
        run = cls(snap.settings)
        if snap.params.shape != run.vector.flat.shape:
            raise InputError(
                _(
                    "the snapshot holds {held} parameters, the settings' model {expected}: it belongs to another run"
                ).format(held=snap.params.size, expected=run.vector.size)
            )
        run.vector.flat[:] = snap.params
        run.optimizer.state.m[:] = snap.m
        run.optimizer.state.v[:] = snap.v
        run.optimizer.state.t = snap.t
        run.recipe.data_rng.bit_generator.state = snap.data_rng_state
        run.step, run._pending, run.grad_norm, run._elapsed = (
            snap.step,
            list(snap.pending_losses),
            snap.grad_norm,
            snap.elapsed_s,
        )
        return run

    def export(self, folder: str | Path) -> Path:
        """The model as a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer.json);
        config.json's card records the BLAS this process trained on (none if it took no step)."""
        from .export import save_gpt2_folder

        return save_gpt2_folder(folder, self.params, self.cfg, self.recipe, self.settings, blas=self.blas)


def _token_losses(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """−log p(target) at every position.  # [batch, pos, d_vocab], [batch, pos] -> [batch, pos]"""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]


# ---------------------------------------------------------------------------- command line


def _line(name: str, r: Record, target_name: str | None) -> str:
    loss = "    -   " if r.train_loss is None else f"{r.train_loss:7.4f} "
    prev = np.nanmax(r.previous_token[0])
    text = (
        f"{name} step {r.step:>6}/{r.steps}  loss {loss} val {r.val_loss:7.4f}  lr {r.lr:.2e}  "
        f"prev-token(L0) {prev:.2f}  induction(L{len(r.induction) - 1}) {r.best_induction:.2f}  "
        f"icl {r.icl_score:+.2f}"
    )
    if r.target is not None:
        text += f"  target {r.target:.3f}"
    return text + f"  {r.elapsed_s:6.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.train",
        description=(
            "Train a recipe's model in NumPy and print one line per evaluation. "
            "Same settings, NumPy, BLAS kernel and thread count: the same weights, bit for bit."
        ),
    )
    parser.add_argument("recipe", choices=list(DEFAULTS))
    options = setting_fields(cli=True)  # TrainSettings' own: --steps, --seq-len, --attn-only/--no-attn-only ...
    for f in options:
        kind, meta = setting_type(f), f.metadata
        about: dict[str, Any] = {
            "help": f"{meta['help'] + ' ' if meta['help'] else ''}(default: the recipe's)",
            "dest": f.name,
        }
        if kind is bool:
            about |= {"action": argparse.BooleanOptionalAction, "default": None}
        elif meta["choices"]:
            about |= {"choices": list(meta["choices"])}
        else:
            about |= {"type": kind}
        parser.add_argument("--" + f.name.replace("_", "-"), **about)
    parser.add_argument("--text-file", type=Path, help="text recipe: train on this UTF-8 file instead of Python's docs")
    parser.add_argument("--control", action="store_true", help="induction: also train the 1-layer control")
    parser.add_argument("--out", type=Path, help="save the trained model here as a Hugging Face GPT-2 folder")
    parser.add_argument("--snapshot", type=Path, help="save a snapshot here at the end (or on Ctrl-C)")
    parser.add_argument("--resume", type=Path, help="continue from this snapshot (its settings are used)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS threads (default 1: reproducible bit for bit with the same BLAS kernel, and "
        "the fastest at these sizes)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the last record")
    args = parser.parse_args(argv)

    from threadpoolctl import threadpool_limits

    changes = {f.name: getattr(args, f.name) for f in options}
    if args.text_file:
        changes["text"] = args.text_file.read_text(encoding="utf-8")
    try:
        if args.resume:
            run = Training.resume(Snapshot.load(args.resume))
        else:
            run = Training(model_settings(args.recipe, **changes))
        runs = [("model  ", run)]
        if args.control:
            if not isinstance(run.recipe, Induction):
                raise InputError(_("--control is the induction recipe's 1-layer control"))
            runs.append(("control", Training(run.recipe.control())))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(json.dumps(run.settings.to_dict()))
    if run.recipe.target_name:
        print(f"target: {run.recipe.target_name}")
    with threadpool_limits(args.threads):
        for name, r in runs:
            last = None
            try:
                for last in r.records():
                    if not args.quiet:
                        print(_line(name, last, r.recipe.target_name), flush=True)
                        if last.sample is not None:
                            print(f"        sample: {last.sample!r}", flush=True)
            except KeyboardInterrupt:
                print(f"stopped at step {r.step}", file=sys.stderr)
                if args.snapshot and r is run:
                    print(f"snapshot: {r.snapshot().save(args.snapshot)}")
                return 130
            if args.quiet and last is not None:
                print(_line(name, last, r.recipe.target_name))
    if args.snapshot:
        print(f"snapshot: {run.snapshot().save(args.snapshot)}")
    if args.out:
        print(f"saved: {run.export(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
