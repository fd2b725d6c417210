"""SAE training: steps per second of core's NumPy trainer (core/sae_train.py SAETrainer) against SAELens's
trainer on torch (issue 34: ≥ 1.0×), at the same threads, on the same activations, batches and initial weights.

The activations are the induction model's residual stream after its first block (blocks.0.hook_resid_post,
d_in 64), its own training data as the sae recipe reads them (core/sae_run.py `activations`, 65,536 vectors);
the SAE is top-k with a 16× expansion (d_sae 1,024), k 32, batch 4,096 (SAELens's default batch), Adam at 3e-4,
features dead after 200 steps without firing on both sides; and a JumpReLU row beside it, the same SAE with
SAELens's JumpReLU defaults (threshold 0.01, bandwidth 0.05, L0 weight 1). SAELens's side (bench/sae_lens_side.py)
runs in the SAEENV venv (SAELens 6.54.12, torch 2.13.0: the Makefile's SAE_PINS) with the same weights and batches,
its TopKTrainingSAE without the decoder-norm rescaling (the objective core trains) or its JumpReLUTrainingSAE,
stepping SAETrainer's own loop (which also clips the gradient's norm, as core's trainer does not).
The two sides alternate in blocks of steps so that the shared machine's drifting load weighs on both alike; the
first step's MSE of the two (same weights, same batch) shows they compute the same objective. Medians, their
ratio and the load average before and after are printed in one run.

    bench/.env/bin/python -m bench.sae_train [--threads 1 2] [--architectures topk jumprelu] [--rounds 7]
        [--block 10] [--sae-python PATH]

The budget is the issue's, for top-k; the JumpReLU row is shown beside it, not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import header, load_average, median, run_main, table, verdict
from core.run_settings import settings
from core.sae import SAEConfig
from core.sae_run import activations
from core.sae_train import JUMPRELU_FIELDS, SAETrainer, SAETraining, init_sae

RATIO_BUDGET = 1.0  # NumPy steps/s over SAELens's, at least
HOOK = "blocks.0.hook_resid_post"
D_SAE, K, BATCH, LR, DEAD_WINDOW = 1024, 32, 4096, 3e-4, 200
SIDE = Path(__file__).with_name("sae_lens_side.py")


def _problem(x: np.ndarray, training: SAETraining, architecture: str) -> tuple[SAEConfig, dict[str, np.ndarray]]:
    k = K if architecture == "topk" else None
    cfg = SAEConfig(
        architecture=architecture, d_in=x.shape[1], d_sae=D_SAE, hook_name=HOOK, model_name="induction", k=k
    )
    return cfg, init_sae(cfg, training).arrays()


def _order(n_rows: int, steps: int, training: SAETraining) -> np.ndarray:
    """[steps, batch]: the rows SAETrainer draws, step by step (its generator, seed + 1, drawn as it draws)."""
    rng = np.random.default_rng(training.seed + 1)
    return np.stack([rng.integers(0, n_rows, size=training.batch_size) for _ in range(steps)])


def compare(threads: int, rounds: int, block: int, sae_python: str, x: np.ndarray, architecture: str = "topk") -> dict:
    training = SAETraining(batch_size=BATCH, lr=LR, dead_window=DEAD_WINDOW, seed=0)
    cfg, init = _problem(x, training, architecture)
    jumprelu = {name: getattr(training, name) for name in JUMPRELU_FIELDS}
    total = (rounds + 2) * block + 1
    with tempfile.TemporaryDirectory(prefix="bench-sae-") as tmp:
        data = Path(tmp) / "data.npz"
        np.savez(
            data,
            activations=x,
            order=_order(len(x), total, training),
            architecture=architecture,
            k=K,
            lr=LR,
            dead_window=DEAD_WINDOW,
            **jumprelu,
            **init,
        )
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        side = subprocess.Popen(
            [sae_python, str(SIDE), str(data), "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert side.stdin is not None and side.stdout is not None
        ready = json.loads(side.stdout.readline())

        def torch_block(n: int) -> dict:
            side.stdin.write(f"{n}\n")  # type: ignore[union-attr]
            side.stdin.flush()  # type: ignore[union-attr]
            return json.loads(side.stdout.readline())  # type: ignore[union-attr]

        from core.sae import SAE

        trainer = SAETrainer(x, cfg, training, sae=SAE(cfg=cfg, **{k: v.copy() for k, v in init.items()}))
        numpy_rate, torch_rate = [], []
        with threadpool_limits(threads, user_api="blas"):
            first_numpy = trainer.train_step().mse
            first_torch = torch_block(1)["mse"]
            load_before = load_average()
            for r in range(rounds + 1):  # the first round warms both up and is not counted
                t0 = time.perf_counter()
                for _ in range(block):
                    last = trainer.train_step()
                seconds = time.perf_counter() - t0
                answer = torch_block(block)
                if r:
                    numpy_rate.append(block / seconds)
                    torch_rate.append(block / answer["seconds"])
            load_after = load_average()
        side.stdin.close()
        side.wait(timeout=60)
    return {
        "architecture": architecture,
        "threads": threads,
        "numpy": median(numpy_rate),
        "torch": median(torch_rate),
        "first_mse": (first_numpy, first_torch),
        "last_mse": (last.mse, answer["mse"]),
        "load": (load_before, load_after),
        "torch_version": ready["torch"],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--architectures", nargs="+", default=["topk", "jumprelu"], choices=["topk", "jumprelu"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--sae-python", default=os.environ.get("SAE_PYTHON", "/tmp/saeenv/bin/python"))
    args = ap.parse_args(argv)
    header("SAE training: core's NumPy trainer against SAELens's on torch (steps per second)")
    if not Path(args.sae_python).is_file():
        print(f"no SAELens venv at {args.sae_python}: make it with `make saeenv` (the Makefile's SAE_PINS)")
        return 1
    x = activations(settings("sae", model="induction", hook=HOOK, steps=128, batch_size=512))  # 65,536 vectors
    print(
        f"induction model, {HOOK}: {x.shape[0]:,} vectors of d_in {x.shape[1]}; SAE d_sae {D_SAE:,} (16×), top-k "
        f"k {K} / JumpReLU SAELens's defaults, batch {BATCH:,}, Adam lr {LR:g}; {args.rounds} rounds of "
        f"{args.block} steps a side"
    )
    rows, ok = [], True
    for threads in args.threads:
        for architecture in args.architectures:
            c = compare(threads, args.rounds, args.block, args.sae_python, x, architecture)
            ratio = c["numpy"] / c["torch"]
            judged = architecture == "topk"  # the budget; jumprelu's row is beside it
            ok &= ratio >= RATIO_BUDGET or not judged
            rows.append(
                [
                    architecture,
                    threads,
                    f"{c['numpy']:.2f}",
                    f"{c['torch']:.2f}",
                    f"{ratio:.2f}×",
                    f"{c['first_mse'][0]:.4f} / {c['first_mse'][1]:.4f}",
                    f"{c['load'][0]} → {c['load'][1]}",
                    verdict(ratio >= RATIO_BUDGET) if judged else "",
                ]
            )
    print(
        table(
            f"steps/s, medians (SAELens 6.54.12 on torch {c['torch_version']}; budget ≥ {RATIO_BUDGET:.1f}×)",
            ["SAE", "threads", "NumPy", "SAELens", "ratio", "first MSE NumPy / SAELens", "load before → after", ""],
            rows,
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(main)
