"""Steered generation: core.generate.generate_steered (a KV cache of the steered run, and of the unsteered one for
frozen attention: core.steering.SteeredDecoder) against torch forward hooks doing the same with transformers' KV
cache, greedy, at the same threads.

The model: random GPT-2-small-shaped weights (float32, 124M parameters; written once by the torch side as a Hugging
Face folder in bench/out/, which core reads memory-mapped). A prompt of --tokens random ids, --new new tokens, the
steer coefficient × a random vector (N(0, 1) per number) added to blocks.{--layer}.hook_resid_pre at every
position, each new token's too. Three modes, each side the same:

    unsteered   core.generate.generate as the app runs it (every step's attention rows recorded); torch the model
                alone, one forward call a token with its DynamicCache (SDPA attention)
    recomputed  generate_steered; torch the same loop with a forward pre-hook on the block adding the push
    frozen      generate_steered(frozen_attention=True); torch per step an unsteered pass of the same tokens with
                a cache of its own (eager attention recording the weights), then the hooked pass whose attention
                from the steered layer on is those weights times its own values (bench/steering_torch_side.py)

torch's side runs in the fixture venv (TORCH_PYTHON, default /tmp/torchenv/bin/python: the Makefile's TORCHENV)
as a subprocess answering one generation per request, so the sides alternate (in a rotating order) and a drifting
load weighs on both alike. Figures: the median time between consecutive new tokens (the first, which reads the
prompt, left out) and of the whole generation, over --repeat runs after a warm-up; both sides' greedy tokens are
compared (the first position where they part; random weights make near ties, float32 on two BLAS can part late).

    bench/.env/bin/python -m bench.steering [--tokens 64] [--new 32] [--repeat 5] [--threads 1] [--torch-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import OUT, blas_info, header, load_average, median, run_main, table
from core import Sampling, generate
from core.config import PRESETS
from core.generate import generate_steered
from core.steering import Steer

MODES = ("unsteered", "recomputed", "frozen")
CFG = PRESETS["gpt2-small"]
CHECKPOINT = OUT / "gpt2-small-random"
SIDE = Path(__file__).with_name("steering_torch_side.py")


def core_generation(params, cfg, prompt: np.ndarray, n_new: int, mode: str, steers: list[Steer]) -> dict:
    """One greedy generation as the app runs it: seconds, each token's time since the start, the tokens."""
    t0 = time.perf_counter()
    if mode == "unsteered":
        steps = generate(params, cfg, prompt, n_new, Sampling(temperature=0))
    else:
        steps = generate_steered(
            params, cfg, prompt, n_new, steers, Sampling(temperature=0), frozen_attention=mode == "frozen"
        )
    stamps, tokens = [], []
    for step in steps:
        stamps.append(time.perf_counter() - t0)
        tokens.append(step.token)
    return {"seconds": time.perf_counter() - t0, "stamps": stamps, "tokens": tokens}


def per_token(run: dict) -> list[float]:
    """Seconds between consecutive new tokens."""
    s = run["stamps"]
    return [b - a for a, b in zip(s, s[1:])]


def parted(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (their length: nowhere)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="prompt tokens")
    ap.add_argument("--new", type=int, default=32, help="new tokens per generation")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="threads for both sides")
    ap.add_argument("--layer", type=int, default=4, help="the steered block (its hook_resid_pre)")
    ap.add_argument("--coefficient", type=float, default=4.0)
    ap.add_argument("--torch-python", default=os.environ.get("TORCH_PYTHON", "/tmp/torchenv/bin/python"))
    args = ap.parse_args(argv)
    header("Steered generation: core's KV cache against torch forward hooks (greedy, ms)")
    if not Path(args.torch_python).is_file():
        print(f"no torch venv at {args.torch_python}: make it with `make fixtures` (the Makefile's FIXTURE_PINS)")
        return 1
    rng = np.random.default_rng(34)
    prompt = rng.integers(0, CFG.d_vocab, size=args.tokens)
    vector = rng.standard_normal(CFG.d_model).astype(np.float32)
    steers = [Steer(f"blocks.{args.layer}.hook_resid_pre", vector, args.coefficient)]
    runs: dict[str, dict[str, list[dict]]] = {m: {"core": [], "torch": []} for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-steer-") as tmp:
        data = Path(tmp) / "data.npz"
        cfg_json = json.dumps({k: v for k, v in asdict(CFG).items() if isinstance(v, (int, float, str))})
        np.savez(
            data,
            cfg=cfg_json,
            prompt=prompt,
            vector=vector,
            layer=args.layer,
            coefficient=args.coefficient,
            n_new=args.new,
        )
        env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        OUT.mkdir(parents=True, exist_ok=True)
        side = subprocess.Popen(
            [args.torch_python, str(SIDE), str(CHECKPOINT), str(data), "--threads", str(args.threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert side.stdin is not None and side.stdout is not None
        versions = json.loads(side.stdout.readline())  # after the checkpoint is written and loaded

        def torch_generation(mode: str) -> dict:
            side.stdin.write(mode + "\n")  # type: ignore[union-attr]
            side.stdin.flush()  # type: ignore[union-attr]
            return json.loads(side.stdout.readline())  # type: ignore[union-attr]

        from core.checkpoints import load_checkpoint

        ckpt = load_checkpoint(CHECKPOINT)
        params, cfg = ckpt.params, ckpt.cfg
        print(
            f"threads: NumPy BLAS {args.threads} ({blas_info()['blas']}), torch {args.threads} "
            f"(torch {versions['torch']}, transformers {versions['transformers']}); prompt {args.tokens} tokens, "
            f"{args.new} new, coefficient {args.coefficient:g} × a random vector at blocks.{args.layer}.hook_resid_pre\n",
            flush=True,
        )
        sides = {
            "core": lambda mode: core_generation(params, cfg, prompt, args.new, mode, steers),
            "torch": torch_generation,
        }
        load_before = load_average()
        with threadpool_limits(args.threads, user_api="blas"):
            for mode in MODES:
                for run in sides.values():
                    run(mode)  # warm-up
                for r in range(args.repeat):
                    for name in ("core", "torch") if r % 2 == 0 else ("torch", "core"):
                        runs[mode][name].append(sides[name](mode))
                print(f"  {mode}: done", flush=True)
        load_after = load_average()
        side.stdin.close()
        side.wait(timeout=60)
    rows, report = [], {}
    for mode in MODES:
        core_runs, torch_runs = runs[mode]["core"], runs[mode]["torch"]
        c_tok = median([t for run in core_runs for t in per_token(run)])
        t_tok = median([t for run in torch_runs for t in per_token(run)])
        c_all = median([run["seconds"] for run in core_runs])
        t_all = median([run["seconds"] for run in torch_runs])
        same = min(parted(a["tokens"], b["tokens"]) for a, b in zip(core_runs, torch_runs))
        moved = parted(runs[mode]["core"][0]["tokens"], runs["unsteered"]["core"][0]["tokens"])
        report[mode] = {"core_ms_per_token": c_tok * 1e3, "torch_ms_per_token": t_tok * 1e3, "core_ms": c_all * 1e3}
        report[mode] |= {"torch_ms": t_all * 1e3, "same_tokens_first": same}
        rows.append(
            [
                mode,
                f"{c_tok * 1e3:.1f}",
                f"{t_tok * 1e3:.1f}",
                f"{c_tok / t_tok:.2f}",
                f"{c_all * 1e3:.0f}",
                f"{t_all * 1e3:.0f}",
                f"{c_all / t_all:.2f}",
                f"{same} of {args.new}",
                "-" if mode == "unsteered" else f"{moved}",
            ]
        )
    print()
    print(
        table(
            f"Steered greedy generation, GPT-2-small-shaped (random, float32), prompt {args.tokens}, {args.new} new "
            f"tokens, {args.threads} thread(s) (ms; median of {args.repeat} after a warm-up)",
            [
                "mode",
                "core per token",
                "torch hooks per token",
                "core / torch",
                "core whole generation",
                "torch whole generation",
                "core / torch",
                "same greedy tokens",
                "core's first token unlike unsteered",
            ],
            rows,
        )
    )
    print(f"load average before {load_before}, after {load_after}\n")
    (OUT / "steering.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)
