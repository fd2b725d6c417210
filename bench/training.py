"""Training: steps per second of core's NumPy trainer against PyTorch, and the wall-clock to an induction head.

1. Steps per second, side by side, under each OpenBLAS kernel in turn (bench.common.KERNELS), each in
   a process of its own: the same model (a recipe's default), the same initial weights, the
   same batches and the same thread count. NumPy runs core.train.optimisation_step (forward, backward,
   clipping, AdamW); PyTorch runs the same model written with its own layers and autograd
   (bench/torch_model.py) with torch.optim.AdamW and clip_grad_norm_. The two sides alternate in blocks
   of steps so that drifting load on this shared machine weighs on both alike; the first losses of the
   two are compared to prove they train the same model. Then where a step's time goes, side by side:
   the forward pass with the loss, the backward pass, and the rest (gradient bookkeeping, clipping,
   AdamW), and each side's share of the float32 GEMM rate measured on the same threads (a step's
   products: three times a forward pass's, bench.common.forward_flops).
2. Wall-clock to induction (this process's kernel): `core.train.Training` on the induction recipe's
   defaults, from the first step until the best layer-1 induction score reaches 0.4, records
   (evaluations) included.

    bench/.env/bin/python -m bench.training [--threads 1 2] [--rounds 7] [--block 5] [--kernels native Haswell]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import (
    KERNELS,
    OUT,
    Gemm,
    blas_info,
    forward_flops,
    header,
    load_average,
    median,
    run_main,
    table,
    under_kernels,
    verdict,
    wall_and_cpu,
    without_option,
)
from core import backprop
from core.optim import AdamW, ParamVector
from core.recipes import make_recipe
from core.run_settings import settings
from core.train import Training, optimisation_step, reuse_freed_memory

RATIO_BUDGET = 1.0  # NumPy steps/s over PyTorch steps/s, at least
INDUCTION_BUDGET_S = 30.0  # wall-clock seconds to a layer-1 induction score of 0.4, at most
INDUCTION_SCORE = 0.4
CASES = ("induction", "text")


def _torch_side(recipe, params, threads: int):
    import torch

    from bench import torch_model as tm

    torch.set_num_threads(threads)
    s = recipe.settings
    p = tm.to_torch(params)
    opt = tm.make_optimizer(p, lr=s.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=s.weight_decay)

    def step(batch: np.ndarray, lr: float, phases: dict | None = None) -> float:
        tokens = torch.from_numpy(batch)
        return tm.train_step(p, recipe.cfg, opt, tokens[:, :-1], tokens[:, 1:], lr, s.grad_clip, phases)

    return step


@contextlib.contextmanager
def core_phases(phases: dict):
    """Adds to phases["forward"] the seconds core's training spends in backprop.forward and the loss, and to
    phases["backward"] those in the loss's gradient and backprop.backward (they are looked up by name)."""
    phase = {
        "forward": "forward",
        "cross_entropy": "forward",
        "cross_entropy_backward": "backward",
        "backward": "backward",
    }
    originals = {name: getattr(backprop, name) for name in phase}

    def timing(name, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[phase[name]] = phases.get(phase[name], 0.0) + time.perf_counter() - t0

        return run

    for name, fn in originals.items():
        setattr(backprop, name, timing(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(backprop, name, fn)


def steps_per_second(case: str, threads: int, rounds: int, block: int) -> dict:
    s = settings(case)
    recipe = make_recipe(s)
    params = recipe.init_params()
    vector = ParamVector(params)
    optimizer = AdamW(vector, weight_decay=s.weight_decay)
    torch_step = _torch_side(recipe, params, threads)
    rng = np.random.default_rng(0)
    batches = [recipe.batch(rng) for _ in range(rounds * block + 3)]
    lr = s.lr

    def numpy_step(batch):
        return optimisation_step(vector, optimizer, recipe.cfg, batch, lr, s.grad_clip)[0]

    with threadpool_limits(threads, user_api="blas"):
        # Same model, same numbers: the first three losses agree to float32 rounding.
        first = [(numpy_step(b), torch_step(b, lr)) for b in batches[:3]]
        gap = max(abs(a - b) for a, b in first)
        gemm = Gemm()
        numpy_t, torch_t, rates = [], [], []
        for r in range(rounds):
            chunk = batches[3 + r * block : 3 + (r + 1) * block]
            rates.append(gemm.measure())
            numpy_t.append(wall_and_cpu(lambda chunk=chunk: [numpy_step(b) for b in chunk]))
            torch_t.append(wall_and_cpu(lambda chunk=chunk: [torch_step(b, lr) for b in chunk]))
        # Where a step's time goes: the same batches again, each phase timed, summed over the rounds.
        numpy_phases, torch_phases = {}, {}
        for r in range(rounds):
            chunk = batches[3 + r * block : 3 + (r + 1) * block]
            t0 = time.perf_counter()
            with core_phases(numpy_phases):
                for b in chunk:
                    numpy_step(b)
            numpy_phases["step"] = numpy_phases.get("step", 0.0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            for b in chunk:
                torch_step(b, lr, torch_phases)
            torch_phases["step"] = torch_phases.get("step", 0.0) + time.perf_counter() - t0
    n, t = median([w for w, _ in numpy_t]) / block, median([w for w, _ in torch_t]) / block
    n_cpu, t_cpu = median([c for _, c in numpy_t]) / block, median([c for _, c in torch_t]) / block
    flops = 3 * s.batch_size * forward_flops(recipe.cfg, s.seq_len)  # forward, and a backward of twice its products
    # The GEMM share best against best (each side's fastest block, the fastest GEMM): load swings single samples.
    rate, n_best, t_best = max(rates), min(w for w, _ in numpy_t) / block, min(w for w, _ in torch_t) / block
    steps = rounds * block
    per_step = {
        side: {k: v / steps for k, v in ph.items()} for side, ph in (("numpy", numpy_phases), ("torch", torch_phases))
    }
    for ph in per_step.values():
        ph["rest"] = ph["step"] - ph["forward"] - ph["backward"]
    return {
        "case": case,
        "threads": threads,
        "params": vector.size,
        "batch": s.batch_size,
        "seq_len": s.seq_len,
        "numpy_steps_per_s": 1 / n,
        "torch_steps_per_s": 1 / t,
        "ratio": t / n,
        "cpu_ratio": t_cpu / n_cpu,
        "first_loss_gap": gap,
        "gflop_per_step": flops / 1e9,
        "gemm_gflops": rate / 1e9,
        "numpy_gemm_fraction": flops / n_best / rate,
        "torch_gemm_fraction": flops / t_best / rate,
        "phases": per_step,
    }


def time_to_induction(threads: int) -> dict:
    run = Training(settings("induction"))
    t0 = time.perf_counter()
    reached = None
    with threadpool_limits(threads, user_api="blas"):
        for record in run.records():
            if record.best_induction >= INDUCTION_SCORE:
                reached = record
                break
    wall = time.perf_counter() - t0
    return {
        "threads": threads,
        "seconds": wall if reached else None,
        "step": reached.step if reached else None,
        "score": reached.best_induction if reached else None,
        "steps_run": run.step,
    }


def speed(args) -> dict:
    """Steps per second and their phases under the kernel this process's OpenBLAS runs."""
    import torch

    reuse_freed_memory()  # what Training does; importing torch happens to have the same effect
    header("Training: NumPy (core.train) vs PyTorch, steps per second")
    print(f"torch {torch.__version__}; median of {args.rounds} blocks of {args.block} steps per side, alternating\n")
    rows, phase_rows, results = [], [], []
    for case in args.cases:
        for threads in args.threads:
            r = steps_per_second(case, threads, args.rounds, args.block)
            results.append(r)
            rows.append(
                [
                    case,
                    f"{r['params']:,}",
                    f"{r['batch']} x {r['seq_len']}",
                    threads,
                    f"{r['numpy_steps_per_s']:.1f}",
                    f"{r['torch_steps_per_s']:.1f}",
                    f"{r['ratio']:.2f}",
                    f"{r['cpu_ratio']:.2f}",
                    f"{r['numpy_gemm_fraction']:.0%}",
                    f"{r['torch_gemm_fraction']:.0%}",
                    f"{r['first_loss_gap']:.1e}",
                ]
            )
            for phase in ("forward", "backward", "rest", "step"):
                a, b = r["phases"]["numpy"][phase], r["phases"]["torch"][phase]
                phase_rows.append([case, threads, phase, f"{a * 1e3:.1f}", f"{b * 1e3:.1f}", f"{a / b:.2f}"])
            print(
                f"  {case}, {threads} thread(s): NumPy {r['numpy_steps_per_s']:.1f} steps/s, "
                f"PyTorch {r['torch_steps_per_s']:.1f} ({r['ratio']:.2f}x; CPU time {r['cpu_ratio']:.2f}x)",
                flush=True,
            )
    print()
    print(
        table(
            "Training steps per second (float32; forward, backward, clipping, AdamW)",
            [
                "recipe model",
                "parameters",
                "batch x seq",
                "threads",
                "NumPy steps/s",
                "PyTorch steps/s",
                "NumPy / PyTorch",
                "(CPU time)",
                "NumPy % of GEMM",
                "PyTorch % of GEMM",
                "first-loss gap",
            ],
            rows,
        )
    )
    print(
        table(
            "Where a step's time goes (ms per step, the mean over the same blocks again; forward: the model "
            "and the loss; backward: the loss's gradient and back through the model; rest: gradient "
            "bookkeeping, clipping, AdamW)",
            ["recipe", "threads", "phase", "NumPy ms", "PyTorch ms", "NumPy / PyTorch"],
            phase_rows,
        )
    )
    print(training_budget(results, blas_info()["kernel"]))
    print(f"load average at the end: {load_average()}\n")
    return {"kernel": blas_info()["kernel"], "steps_per_s": results}


def training_budget(results: list[dict], kernel: str) -> str:
    one = [r for r in results if r["threads"] == 1]
    if not one:
        return f"[{kernel}] budget NumPy/PyTorch >= {RATIO_BUDGET} at 1 thread: not measured\n"
    worst = min(r["ratio"] for r in one)
    each = ", ".join(f"{r['case']} {r['ratio']:.2f}" for r in one)
    return (
        f"[{kernel}] budget NumPy/PyTorch >= {RATIO_BUDGET} at 1 thread: worst {worst:.2f} ({each}) -> "
        f"{verdict(worst >= RATIO_BUDGET)}\n"
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=5, help="steps per timed block")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--skip-induction", action="store_true")
    ap.add_argument(
        "--kernels",
        nargs="+",
        default=list(KERNELS),
        help="OpenBLAS kernels for the steps per second, each in a process of its own",
    )
    ap.add_argument("--child-json", help=argparse.SUPPRESS)  # one kernel's run, started by under_kernels
    args = ap.parse_args(argv)
    if args.child_json:
        with open(args.child_json, "w") as f:
            json.dump(speed(args), f)
        return 0

    runs = under_kernels(
        "training", without_option(without_option(argv, "--kernels"), "--skip-induction"), args.kernels
    )
    rows = []
    for kernel, run in runs.items():
        for r in run["steps_per_s"]:
            ph_n, ph_t = r["phases"]["numpy"], r["phases"]["torch"]
            rows.append(
                [
                    f"{kernel} ({run['kernel']})",
                    r["case"],
                    r["threads"],
                    f"{r['ratio']:.2f}",
                    f"{ph_t['forward'] / ph_n['forward']:.2f}",
                    f"{ph_t['backward'] / ph_n['backward']:.2f}",
                    f"{r['numpy_gemm_fraction']:.0%}",
                    f"{r['torch_gemm_fraction']:.0%}",
                ]
            )
    print(
        table(
            "Both kernels side by side (PyTorch time / NumPy time: above 1, NumPy is faster)",
            [
                "kernel",
                "recipe",
                "threads",
                "steps/s NumPy / PyTorch",
                "forward",
                "backward",
                "NumPy % of GEMM",
                "PyTorch % of GEMM",
            ],
            rows,
        )
    )
    for run in runs.values():
        print(training_budget(run["steps_per_s"], run["kernel"]))

    induction = []
    if not args.skip_induction:
        header("Training: wall-clock to an induction head")
        rows = []
        for threads in args.threads:
            r = time_to_induction(threads)
            induction.append(r)
            rows.append(
                [
                    threads,
                    "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
                    r["step"] or "not reached",
                    "-" if r["score"] is None else f"{r['score']:.2f}",
                ]
            )
        print(
            table(
                f"Wall-clock to a layer-1 induction score >= {INDUCTION_SCORE} (induction recipe defaults, "
                "evaluations included)",
                ["threads", "seconds", "step", "score"],
                rows,
            )
        )
        ok = [r for r in induction if r["threads"] == 1 and r["seconds"] is not None]
        print(
            f"budget <= {INDUCTION_BUDGET_S:.0f} s at 1 thread: "
            f"{ok[0]['seconds'] if ok else 'not reached'} -> {verdict(bool(ok) and ok[0]['seconds'] <= INDUCTION_BUDGET_S)}\n"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "training.json").write_text(json.dumps({"by_kernel": runs, "induction": induction}, indent=1))
    return 0 if len(runs) == len(args.kernels) else 1


if __name__ == "__main__":
    run_main(main)
