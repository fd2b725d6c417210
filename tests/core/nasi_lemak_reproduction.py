"""Retraining the shipped nasi-lemak model (core/trained/nasi-lemak), and what of it reproduces where.

Used by tests/core/test_trained_models.py (in the test process, on this CPU's BLAS kernel) and by
tests/core/test_blas_kernels.py, which runs this module in subprocesses under other OpenBLAS kernels:

    python -m tests.core.nasi_lemak_reproduction OUT   # retrain into OUT/nasi-lemak; print what it gives, as JSON

Bit for bit, a retrain reproduces the shipped bytes only with the same NumPy (so the same OpenBLAS), the
same BLAS kernel and one BLAS thread: a kernel adds a matrix product's terms in its own order, and
another order changes the last bits. Elsewhere it reproduces within the bounds below, chosen from
these measurements (AMD Zen 4, NumPy 2.4.6 with OpenBLAS 0.3.31, one thread, float32, 300 steps):

  Thirteen OPENBLAS_CORETYPE values ran five distinct kernels (Haswell, SkylakeX, Sandybridge, Nehalem,
  Prescott). Haswell's retrain is the shipped folder byte for byte (the card records that kernel);
  the other four end 3.3e-7 to 5.4e-7 (max abs) from the shipped weights, p('l' | "nasi ") within
  1e-8, head scores within 1e-7, with the shipped run's ReLU pattern. Switching off NumPy's AVX-512 loops (NPY_DISABLE_CPU_FEATURES)
  changed no bit.

  400 retrains with rounding-sized noise (measure_noise, below: every gradient of every step, or the
  initial weights, multiplied by 1 + u, |u| up to 1 or 16 float32 ulps) stand in for BLASes not on
  this machine (ARM's, Apple's Accelerate). 320 keep the shipped run's ReLU pattern (which of the
  MLP's pre-activations are > 0, at every token of every step's batch) and end within 1.1e-6 of the
  shipped weights, p('l' | "nasi ") within 1e-8, head scores within 1.5e-7. One in five do not: at
  step 22 one pre-activation is 1.3e-7 of the largest, within rounding of 0, and on whichever side of
  0 rounding puts it a ReLU passes a different gradient, so the run goes on from a nearby but
  different place. Those 80 ended 0.0214 (79 runs) or 0.0435 (1 run) from the shipped weights, with
  p('l' | "nasi ") within 2.4e-5, head scores within 1.8e-3 and every argmax the same:

    python -m tests.core.nasi_lemak_reproduction --noise 150 --where grad --ulps 1 --first-seed 5000
    python -m tests.core.nasi_lemak_reproduction --noise 150 --where init --ulps 1 --first-seed 5000
    python -m tests.core.nasi_lemak_reproduction --noise 100 --where grad --ulps 16 --first-seed 5000

Hence the bounds below, each at least twice the worst measured.
"""

from __future__ import annotations

import hashlib
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from core import backprop, run_with_cache
from core.checkpoints import load_checkpoint, trained_models
from core.recipes import TrainSettings
from core.train import Training

# Where the ReLU pattern is the shipped run's: the weights within 1e-5 (measured: 1.1e-6 at most).
WEIGHTS_ATOL_SAME_RELUS = 1e-5
# Anywhere: the weights within 0.1 (measured: 0.0435 at most, after a flipped ReLU). For scale, a
# retrain with another data seed lands 0.59 away and one with a learning rate 1% lower 0.21, but one
# step fewer (299) only 0.021: only the 1e-5 bound tells that apart from a flipped ReLU.
WEIGHTS_ATOL = 0.1
# p('l' | "nasi ") within 1e-4 (measured: 2.4e-5 at most; not compared rounded: the shipped 0.99252 is
# 2e-5 from 0.9925, where rounding to 3 decimals turns); head scores within 1e-2 (measured: 1.8e-3).
P_ATOL = 1e-4
SCORES_ATOL = 1e-2
# Next tokens where the shipped model is sure (top probability at least 0.98 above the second): each
# text's argmax at every position. (After "nasi lemak " any phrase may start: not asked.)
NEXT_TOKENS = {
    "ali makan nasi l": "li makan nasi le",
    "makan nasi lemak": "akan nasi lemak ",
    "nasi lemak": "asi lemak ",
}
SCORE_TEXTS = ("ali makan nasi l", "makan nasi lemak")  # the recipe's probe, and a phrase
PROMPT, TARGET = "nasi ", "l"

SHIPPED = trained_models()["nasi-lemak"]
CARD = json.loads((SHIPPED / "config.json").read_text())["transformer_explorer"]
# The shipped run's ReLU pattern (see relu_pattern), as retrained on the card's kernel, whose weights
# are the shipped bytes.
SHIPPED_RELU_PATTERN = "0405ed6c03e10352cc5e17be57d9af6f27d9f8b77167a2567eebf09da06f8d7d"


@contextmanager
def relu_pattern():
    """Inside: every training step's ReLU pattern (which MLP pre-activations are > 0, at every token of
    the step's batch) goes into one SHA-256, whose hex digest the yielded list holds afterwards."""
    h, done, original = hashlib.sha256(), [], backprop.backward

    def backward(params, cfg, saved, *args, **kwargs):  # called by loss_and_grads: training steps only
        for layer in saved.layers:
            h.update(np.packbits(layer.mlp_pre > 0).tobytes())
        return original(params, cfg, saved, *args, **kwargs)

    backprop.backward = backward
    try:
        yield done
    finally:
        backprop.backward = original
        done.append(h.hexdigest())


def retrain(out: Path, noise: tuple[str, float, int] | None = None) -> tuple[Path, str]:
    """The run that made the shipped folder, from the settings its card records, with one BLAS thread
    (core.train's default), exported to out/nasi-lemak. Returns the folder and the run's ReLU pattern.

    noise=(where, ulps, seed) stands in for a BLAS that rounds differently: every training step's
    gradients (where="grad") or the initial weights ("init") times 1 + u, u uniform within ±ulps
    float32 ulps of 1 (2^-24 each), drawn from the seed."""
    rng = np.random.default_rng(noise[2]) if noise else None

    def jitter(a: np.ndarray) -> np.ndarray:
        return (a * (1 + noise[1] * 2.0**-24 * rng.uniform(-1, 1, a.shape))).astype(a.dtype)

    original = backprop.loss_and_grads
    if noise and noise[0] == "grad":

        def noisy(*args, **kwargs):
            loss, grads = original(*args, **kwargs)
            return loss, _tree_map(jitter, grads)

        backprop.loss_and_grads = noisy
    try:
        with threadpool_limits(1, user_api="blas"), relu_pattern() as pattern:
            run = Training(TrainSettings(**CARD["settings"]))
            if noise and noise[0] == "init":
                run.vector.flat[:] = jitter(run.vector.flat)
            run.run()
    finally:
        backprop.loss_and_grads = original
    return run.export(Path(out) / "nasi-lemak"), pattern[0]


def _tree_map(f, tree):
    if isinstance(tree, dict):
        return {k: _tree_map(f, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_tree_map(f, v) for v in tree]
    return f(tree)


def weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def max_abs_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) for k in a)


def predictions(folder: Path) -> dict:
    """What the model in the folder predicts, as plain JSON data: p(TARGET | PROMPT), the argmax next
    token at every position of NEXT_TOKENS' texts, and the head detector scores on SCORE_TEXTS."""
    ckpt = load_checkpoint(folder)

    def run(text: str):
        return run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode(text).ids))

    logits = run(PROMPT)[0][-1].astype(np.float64)
    p = np.exp(logits - logits.max())
    target = ckpt.tokenizer.encode(TARGET).ids[0]
    return {
        "p_target": float(p[target] / p.sum()),
        "next_tokens": {
            text: "".join(ckpt.tokenizer.token_str(int(i)) for i in run(text)[0].argmax(-1)) for text in NEXT_TOKENS
        },
        "head_scores": {
            text: {name: s.tolist() for name, s in run(text)[1].head_detector_scores().items()} for text in SCORE_TEXTS
        },
    }


def differences(folder: Path, pattern: str) -> dict:
    """How far a retrain in the folder is from the shipped model, in the terms of the bounds above."""
    got, shipped = predictions(folder), predictions(SHIPPED)
    return {
        "same_relus": pattern == SHIPPED_RELU_PATTERN,
        "weights": max_abs_difference(weights(folder), weights(SHIPPED)),
        "p_target": abs(got["p_target"] - shipped["p_target"]),
        "head_scores": max(
            float(np.nanmax(np.abs(np.array(got["head_scores"][t][k], dtype=float) - v)))
            for t in SCORE_TEXTS
            for k, v in shipped["head_scores"][t].items()
        ),
        "same_next_tokens": got["next_tokens"] == shipped["next_tokens"],
    }


def measure_noise(runs: int, where: str, ulps: float, first_seed: int = 0) -> None:
    """Retrain `runs` times with noise (retrain's `noise`) and print each run's differences and a summary."""
    import tempfile

    rows = []
    for seed in range(first_seed, first_seed + runs):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(differences(*retrain(Path(tmp), (where, ulps, seed))))
        print(seed, json.dumps(rows[-1]), flush=True)
    for same in (True, False):
        part = [r for r in rows if r["same_relus"] == same]
        if part:
            print(
                f"{'the shipped' if same else 'another'} ReLU pattern: {len(part)} of {len(rows)} runs; max "
                + ", ".join(f"{k} {max(r[k] for r in part):.3g}" for k in ("weights", "p_target", "head_scores"))
                + f"; next tokens all the same: {all(r['same_next_tokens'] for r in part)}"
            )


def main(argv: list[str]) -> int:
    """OUT: retrain into OUT and print one JSON line: the BLAS it trained on (the card's blas), the
    folder, the run's ReLU pattern and the retrained model's predictions, computed on this process's
    kernel. --noise RUNS --where grad|init --ulps U [--first-seed S]: measure_noise."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.core.nasi_lemak_reproduction")
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--noise", type=int, metavar="RUNS")
    parser.add_argument("--where", choices=["grad", "init"], default="grad")
    parser.add_argument("--ulps", type=float, default=1.0)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.noise:
        measure_noise(args.noise, args.where, args.ulps, args.first_seed)
        return 0
    if args.out is None:
        parser.error("give OUT, or --noise RUNS")
    folder, pattern = retrain(args.out)
    print(
        json.dumps(
            {
                "blas": json.loads((folder / "config.json").read_text())["transformer_explorer"].get("blas"),
                "numpy": np.__version__,
                "folder": str(folder),
                "relu_pattern": pattern,
                "predictions": predictions(folder),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
