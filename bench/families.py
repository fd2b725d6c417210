"""Other families: a SmolLM2-135M-shaped Llama in core against PyTorch, and what a second worker
process costs when the weights are memory-mapped.

1. Speed, under each OpenBLAS kernel in turn (bench.common.KERNELS), each in a process of its own.
   Random weights with SmolLM2-135M's shape (30 layers, 9 query heads sharing 3 key/value
   heads, d_model 576, SwiGLU 1536, vocabulary 49152, tied), written once as a float32 Hugging Face
   checkpoint by transformers and read by core.checkpoints (memory-mapped), so both sides run the
   same numbers (the logits are compared). One forward pass at 128, 512 and 1,024 tokens, medians,
   alternating sides, same thread count: core vs transformers' LlamaForCausalLM (its default
   attention, SDPA), and each side's share of the machine's float32 GEMM rate measured between them
   (bench.common.Gemm, forward_flops). Also the explorer's use: core keeping every activation.
2. The explorer's view, end to end: the same checkpoint in EXPLORER_MODELS_DIR of a real server
   (scripts/liveserver.py: uvicorn, the app's default settings, one BLAS thread), its page asked for
   as htmx asks on each edit, with a 128-token text; and the JSON /api/v1/run (top-k only). Median
   of --repeat after one warm-up (which loads the weights). The budget: under a second.
3. Memory. The same ~540 MB float32 checkpoint loaded by two worker processes at once (each:
   import core, load the weights, run 128 tokens). A process's RSS counts the file's pages it has
   touched even though they are shared, so what a second worker adds is measured as its private
   memory (USS: pages no other process holds) and as the drop of the machine's MemAvailable while
   it loads and runs. For comparison, a worker that copies the weights into its own memory (what
   loading without mmap does).

    bench/.env/bin/python -m bench.families [--tokens 128 512 1024] [--repeat 5] [--kernels native Haswell] [--skip-memory]
    .venv/bin/python -m bench.families --explorer-only   # part 2 alone, without torch (the checkpoint exists)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import (
    KERNELS,
    OUT,
    ROOT,
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
from core import PRESETS, run_with_cache

CFG = PRESETS["smollm2-135m"]
CHECKPOINT = OUT / "smollm2-135m-random"
RATIO_BUDGET = 1.0  # core time / torch time
SECOND_WORKER_BUDGET_MB = 50  # what a second worker may add with a memory-mapped ~500 MB model
EXPLORER_BUDGET_S = 1.0  # a 135M model's 128-token explorer view, at most


def write_checkpoint() -> None:
    """Random SmolLM2-135M-shaped weights as a float32 Hugging Face folder (about 540 MB)."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM

    if (CHECKPOINT / "model.safetensors").is_file():
        return
    torch.manual_seed(0)
    c = CFG
    hf = LlamaConfig(
        vocab_size=c.d_vocab,
        hidden_size=c.d_model,
        intermediate_size=c.d_mlp,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_key_value_heads,
        head_dim=c.d_head,
        max_position_embeddings=c.n_ctx,
        rms_norm_eps=c.eps,
        rope_theta=c.rotary_base,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(hf)
    with torch.no_grad():  # norm gains are 1 at init: perturb them so that every array matters
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(CHECKPOINT, safe_serialization=True)
    # core's loader wants a tokenizer.json beside the weights; the benchmark feeds ids directly.
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(CHECKPOINT / "tokenizer.json"))


def load_core():
    from core.checkpoints import load_params, read_spec

    spec = read_spec(CHECKPOINT)
    assert spec.cfg == CFG, f"checkpoint config {spec.cfg} differs from the preset {CFG}"
    return load_params(spec)


# ---------------------------------------------------------------------------- speed


def speed(args) -> dict:
    """Core vs torch under the kernel this process's OpenBLAS runs: prints its tables, returns its figures."""
    import torch
    from transformers import LlamaForCausalLM

    header("Other families: SmolLM2-135M-shaped Llama (random weights, float32), forward pass")
    threads = args.threads or blas_info()["blas_threads"]
    threadpool_limits(threads, user_api="blas")
    torch.set_num_threads(threads)
    params = load_core()
    model = LlamaForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    print(
        f"threads: NumPy BLAS {blas_info()['blas_threads']}, torch {torch.get_num_threads()} "
        f"(torch {torch.__version__}, attention {model.config._attn_implementation})\n"
    )
    ids = np.random.default_rng(1).integers(0, CFG.d_vocab, size=max(args.tokens))

    def core_forward(n: int, names=()):
        return run_with_cache(params, CFG, ids[:n], names=names)[0]

    def torch_forward(n: int):
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids[None, :n]), use_cache=False).logits

    n0 = min(args.tokens)
    diff = float(np.abs(core_forward(n0) - torch_forward(n0).numpy()[0]).max())
    print(f"max |logits core - logits torch| at {n0} tokens: {diff:.2e}\n")
    if not diff < 1e-2:
        raise SystemExit("the two models disagree: the comparison would be meaningless")
    gemm = Gemm()
    rows, cache_rows, results = [], [], {}
    for n in args.tokens:
        core_forward(n), torch_forward(n)  # warm-up
        core_t, torch_t, rates = [], [], []
        for _ in range(args.repeat):  # alternate, so drifting machine load hits both alike
            rates.append(gemm.measure())
            core_t.append(wall_and_cpu(lambda n=n: core_forward(n)))
            torch_t.append(wall_and_cpu(lambda n=n: torch_forward(n)))
        c, t = median([w for w, _ in core_t]), median([w for w, _ in torch_t])
        c_cpu, t_cpu = median([u for _, u in core_t]), median([u for _, u in torch_t])
        rate, c_best, t_best = max(rates), min(w for w, _ in core_t), min(w for w, _ in torch_t)  # best vs best
        flops = forward_flops(CFG, n)
        rows.append(
            [
                n,
                f"{c * 1e3:.0f}",
                f"{t * 1e3:.0f}",
                f"{c / t:.2f}",
                f"{c_cpu / t_cpu:.2f}",
                f"{flops / 1e9:.1f}",
                f"{rate / 1e9:.1f}",
                f"{flops / c_best / rate:.0%}",
                f"{flops / t_best / rate:.0%}",
            ]
        )
        explorer = median(
            [wall_and_cpu(lambda n=n: core_forward(n, names=None))[0] for _ in range(max(2, args.repeat // 2))]
        )
        cache_rows.append([n, f"{explorer * 1e3:.0f}"])
        results[n] = {
            "core_s": c,
            "torch_s": t,
            "ratio": c / t,
            "cpu_ratio": c_cpu / t_cpu,
            "all_activations_s": explorer,
            "gflop": flops / 1e9,
            "gemm_gflops": rate / 1e9,
            "core_gemm_fraction": flops / c_best / rate,
            "torch_gemm_fraction": flops / t_best / rate,
        }
        print(
            f"  {n} tokens: core {c * 1e3:.0f} ms, torch {t * 1e3:.0f} ms, every activation {explorer * 1e3:.0f} ms",
            flush=True,
        )
    print()
    print(
        table(
            f"Forward pass, logits only (median of {args.repeat}, after a warm-up; GFLOP counts the causal "
            f"half of attention; % of GEMM: each side's fastest pass against the fastest GEMM of the rounds)",
            [
                "tokens",
                "core ms",
                "torch ms",
                "core / torch",
                "(CPU time)",
                "GFLOP",
                "GEMM GFLOP/s (best)",
                "core % of GEMM",
                "torch % of GEMM",
            ],
            rows,
        )
    )
    print(table("Core keeping every activation (the explorer's run)", ["tokens", "core ms"], cache_rows))
    print(speed_budgets(results, blas_info()["kernel"]))
    print(f"load average at the end: {load_average()}\n")
    return {"kernel": blas_info()["kernel"], "threads": threads, "speed": results}


def speed_budgets(results: dict, kernel: str) -> str:
    worst = max(r["ratio"] for r in results.values())
    lines = [f"[{kernel}] budget core/torch <= {RATIO_BUDGET}: worst {worst:.2f} -> {verdict(worst <= RATIO_BUDGET)}"]
    if 128 in results:
        t = results[128]["all_activations_s"]
        lines.append(
            f"[{kernel}] budget 128-token run keeping every activation <= {EXPLORER_BUDGET_S} s: "
            f"{t:.2f} s -> {verdict(t <= EXPLORER_BUDGET_S)}"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the explorer's view

EXPLORER_TOKENS = 128  # the explorer page's limit (EXPLORER_EXPLORER_MAX_TOKENS)
WORDS = (
    "the cat sat on a mat and dog log bird sang in tree while she he it was very big small red blue "
    "green day night sun moon"
).split()


def explorer_models_dir():
    """An EXPLORER_MODELS_DIR holding the benchmark's checkpoint (linked, not copied) with a word-level
    tokenizer of WORDS, so a text of 128 words is 128 tokens (the checkpoint's own tokenizer.json knows
    a single [UNK])."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = OUT / "explorer-models"
    folder = root / "smollm2-135m-random"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        link = folder / name
        if not link.exists():
            link.symlink_to(CHECKPOINT / name)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *WORDS])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    return root


def explorer_view(args) -> tuple[list, dict]:
    import httpx

    from bench.common import live_server

    text = " ".join(WORDS[i % len(WORDS)] for i in range(EXPLORER_TOKENS))
    model = "smollm2-135m-random"
    env = {"EXPLORER_MODELS_DIR": str(explorer_models_dir()), "EXPLORER_ACCESS_LOG": "false"}
    rows, out = [], {}
    with live_server(env=env, timeout_s=120) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        asks = {
            "explorer page (htmx update)": lambda: http.get(
                "/", params={"model": model, "text": text}, headers={"HX-Request": "true"}
            ),
            "explorer page, with rollout": lambda: http.get(
                "/", params={"model": model, "text": text, "rollout": 1}, headers={"HX-Request": "true"}
            ),
            "POST /api/v1/run (top_k 5)": lambda: http.post("/api/v1/run", json={"model": model, "text": text}),
        }
        for name, ask in asks.items():
            first = wall_and_cpu(lambda ask=ask: ask().raise_for_status())[0]  # the first one loads the weights
            times = [wall_and_cpu(lambda ask=ask: ask().raise_for_status())[0] for _ in range(args.repeat)]
            m = median(times)
            out[name] = {"first_s": first, "median_s": m, "times_s": times}
            rows.append(
                [name, f"{first * 1e3:.0f}", f"{m * 1e3:.0f}", f"{min(times) * 1e3:.0f}", f"{max(times) * 1e3:.0f}"]
            )
            print(f"  {name}: median {m * 1e3:.0f} ms (first {first * 1e3:.0f} ms)", flush=True)
        n = len(http.post("/api/v1/run", json={"model": model, "text": text}).json()["token_ids"])
        assert n == EXPLORER_TOKENS, n
    return rows, out


def report_explorer(args) -> dict:
    rows, out = explorer_view(args)
    print()
    print(
        table(
            f"The explorer's view of a SmolLM2-135M-shaped model at {EXPLORER_TOKENS} tokens, through a "
            f"real server (ms; median of {args.repeat} after a warm-up)",
            ["request", "first (loads)", "median", "min", "max"],
            rows,
        )
    )
    t = out["explorer page (htmx update)"]["median_s"]
    print(
        f"budget {EXPLORER_TOKENS}-token explorer view of a 135M model <= {EXPLORER_BUDGET_S} s: {t:.2f} s -> "
        f"{verdict(t <= EXPLORER_BUDGET_S)}\n"
    )
    return out


# ---------------------------------------------------------------------------- memory

# A worker: imports core, waits, loads the weights (mapped, or copied into private memory), runs
# 128 tokens, and reports its memory at each step on stdout; it stays alive until told to exit.
WORKER = r"""
import json, sys
import numpy as np, psutil
from core import run_with_cache
from core.checkpoints import load_params, read_spec, mapped_nbytes, params_nbytes
from core.model import iter_arrays

def report(stage):
    m = psutil.Process().memory_full_info()
    print(json.dumps({"stage": stage, "rss": m.rss, "uss": m.uss, "pss": m.pss}), flush=True)

report("imported"); sys.stdin.readline()
spec = read_spec(sys.argv[1])
params = load_params(spec)
if sys.argv[2] == "copy":  # what a loader without mmap holds: the weights in the process's own memory
    def copy(p):
        if isinstance(p, dict): return {k: copy(v) for k, v in p.items()}
        if isinstance(p, list): return [copy(v) for v in p]
        return np.array(p)
    params = copy(params)
print(json.dumps({"stage": "bytes", "params": params_nbytes(params), "mapped": mapped_nbytes(params)}), flush=True)
report("loaded")
run_with_cache(params, spec.cfg, np.arange(128) % spec.cfg.d_vocab, names=())
report("ran 128 tokens"); sys.stdin.readline()
"""


def mem_available() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Worker:
    def __init__(self, mode: str):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(CHECKPOINT), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.stages: dict[str, dict] = {}
        self.read()  # imported

    def read(self) -> dict:
        line = json.loads(self.proc.stdout.readline())
        self.stages[line["stage"]] = line
        return line

    def step(self) -> None:
        """Load and run; returns when the worker has reported both."""
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        for _ in range(3):
            self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def memory() -> tuple[list, dict]:
    mb = 2**20
    rows, out = [], {}
    first = Worker("mmap")
    try:
        first.step()  # the first worker maps the file and touches every page: the page cache holds it now
        for mode in ("mmap", "copy"):
            second = Worker(mode)
            try:
                before = mem_available()
                second.step()
                time.sleep(0.2)
                drop = before - mem_available()
                s = second.stages
                added_uss = s["ran 128 tokens"]["uss"] - s["imported"]["uss"]
                added_rss = s["ran 128 tokens"]["rss"] - s["imported"]["rss"]
                out[mode] = {
                    "params_mb": s["bytes"]["params"] / mb,
                    "mapped_mb": s["bytes"]["mapped"] / mb,
                    "added_uss_mb": added_uss / mb,
                    "added_rss_mb": added_rss / mb,
                    "pss_mb": s["ran 128 tokens"]["pss"] / mb,
                    "memavailable_drop_mb": drop / mb,
                }
                rows.append(
                    [
                        f"second worker, weights {'memory-mapped' if mode == 'mmap' else 'copied'}",
                        f"{s['bytes']['params'] / mb:.0f}",
                        f"{s['bytes']['mapped'] / mb:.0f}",
                        f"{added_rss / mb:.0f}",
                        f"{added_uss / mb:.0f}",
                        f"{s['ran 128 tokens']['pss'] / mb:.0f}",
                        f"{drop / mb:.0f}",
                    ]
                )
            finally:
                second.close()
        f, ran = first.stages, first.stages["ran 128 tokens"]
        rows.insert(
            0,
            [
                "first worker (mapped, after 128 tokens)",
                f"{f['bytes']['params'] / mb:.0f}",
                f"{f['bytes']['mapped'] / mb:.0f}",
                f"{(ran['rss'] - f['imported']['rss']) / mb:.0f}",
                f"{(ran['uss'] - f['imported']['uss']) / mb:.0f}",
                f"{ran['pss'] / mb:.0f}",
                "-",
            ],
        )
    finally:
        first.close()
    return rows, out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads for both sides (0: NumPy's BLAS default)")
    ap.add_argument(
        "--kernels",
        nargs="+",
        default=list(KERNELS),
        help="OpenBLAS kernels for the speed part, each in a process of its own ('native': the CPU's own)",
    )
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument(
        "--explorer-only",
        action="store_true",
        help="only the explorer's view through a live server (needs the checkpoint, not torch)",
    )
    ap.add_argument("--child-json", help=argparse.SUPPRESS)  # one kernel's speed part, started by under_kernels
    args = ap.parse_args(argv)
    if args.explorer_only:
        header("Other families: the explorer's view of a SmolLM2-135M-shaped model")
        if not (CHECKPOINT / "model.safetensors").is_file():
            raise SystemExit(f"{CHECKPOINT} is missing: run the whole benchmark once (make bench BENCH=families)")
        report = {"explorer": report_explorer(args)}
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "families-explorer.json").write_text(json.dumps(report, indent=1))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.disable_progress_bar()
    if args.child_json:
        with open(args.child_json, "w") as f:
            json.dump(speed(args), f)
        return 0
    write_checkpoint()
    speed_argv = without_option(without_option(without_option(argv, "--kernels"), "--skip-memory"), "--explorer-only")
    runs = under_kernels("families", speed_argv, args.kernels)
    rows = []
    for kernel, run in runs.items():
        for n, r in sorted(run["speed"].items(), key=lambda kv: int(kv[0])):
            rows.append(
                [
                    f"{kernel} ({run['kernel']})",
                    n,
                    f"{r['core_s'] * 1e3:.0f}",
                    f"{r['torch_s'] * 1e3:.0f}",
                    f"{r['ratio']:.2f}",
                    f"{r['core_gemm_fraction']:.0%}",
                    f"{r['torch_gemm_fraction']:.0%}",
                    f"{r['all_activations_s'] * 1e3:.0f}",
                ]
            )
    print(
        table(
            "Both kernels side by side (logits only)",
            [
                "kernel",
                "tokens",
                "core ms",
                "torch ms",
                "core / torch",
                "core % of GEMM",
                "torch % of GEMM",
                "core, every activation ms",
            ],
            rows,
        )
    )
    for run in runs.values():
        print(speed_budgets({int(n): r for n, r in run["speed"].items()}, run["kernel"]))
    report = {"by_kernel": runs}
    header("Other families: the explorer's view and worker memory (SmolLM2-135M-shaped, float32)")
    report["explorer"] = report_explorer(args)
    if not args.skip_memory:
        mem_rows, mem = memory()
        print()
        print(
            table(
                "Memory of worker processes sharing one float32 checkpoint (MB); 'added' = after loading and "
                "128 tokens minus after import",
                ["worker", "params", "of which mapped", "added RSS", "added private (USS)", "PSS", "MemAvailable drop"],
                mem_rows,
            )
        )
        added = max(mem["mmap"]["added_uss_mb"], mem["mmap"]["memavailable_drop_mb"])
        print(
            f"budget second worker adds <= {SECOND_WORKER_BUDGET_MB} MB with mapped weights: {added:.0f} MB -> "
            f"{verdict(added <= SECOND_WORKER_BUDGET_MB)}\n"
        )
        report["memory"] = mem
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "families.json").write_text(json.dumps(report, indent=1))
    return 0 if len(runs) == len(args.kernels) else 1


if __name__ == "__main__":
    run_main(main)
