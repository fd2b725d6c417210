"""What every benchmark shares: timing (warm-up, then medians), tables, and the machine's description.

These machines are noisy (2 shared cores), so every figure is a median of several repetitions
taken after a warm-up, and each comparison is printed as a ratio to a peer measured in the same run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"  # scratch space (checkpoints, results); ignored by git


def timed(fn: Callable[[], object], *, repeat: int, warmup: int = 1) -> list[float]:
    """Seconds per call of `fn`, `repeat` times, after `warmup` calls that are not counted."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def wall_and_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """Seconds of one call: wall-clock, and CPU time of this process (all its threads).

    On a loaded machine the wall time includes waiting for a core; with one thread the CPU
    time does not, so it is the steadier figure there (with several threads it also counts
    the time BLAS threads spin while waiting for each other).
    """
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank: p99 of 200 samples is the 198th smallest."""
    s = sorted(xs)
    rank = max(1, min(len(s), round(q / 100 * len(s) + 0.5)))
    return s[rank - 1]


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (readable in a terminal and pasteable into docs/benchmarks.md)."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [f"### {title}", ""]
    for n, r in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n"


def _fmt(c: object) -> str:
    if isinstance(c, float):
        return f"{c:.3g}" if abs(c) < 100 else f"{c:.0f}"
    return str(c)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def blas_info() -> dict:
    """The BLAS NumPy calls (library, version, the kernel it picked for this CPU, threads)."""
    import numpy as np
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    info = blas[0] if blas else {}
    return {
        "numpy": np.__version__,
        "blas": f"{info.get('internal_api', '?')} {info.get('version', '?')}",
        "kernel": info.get("architecture", "?"),
        "blas_threads": info.get("num_threads", 0),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine() -> str:
    """One paragraph describing where the figures were taken."""
    b = blas_info()
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        commit = "?"
    return (
        f"nproc {os.cpu_count()}, CPU {cpu_model()}, Python {platform.python_version()}, "
        f"NumPy {b['numpy']} with {b['blas']} (kernel {b['kernel']}, {b['blas_threads']} threads), "
        f"OpenBLAS overrides {env or 'none'}, commit {commit}"
    )


def header(name: str) -> None:
    print(f"## {name}\n\n{machine()}\n\nload average at the start: {load_average()}\n", flush=True)


def run_main(main: Callable[[list[str]], int]) -> None:
    sys.exit(main(sys.argv[1:]))


# ---------------------------------------------------------------------------- OpenBLAS kernels

# OpenBLAS picks a kernel for the CPU it finds: SkylakeX (AVX-512) on the Xeons and Zen 4 EPYCs, Haswell
# (AVX2) on the Zen 2/3 EPYC of the CI machine. A speed-up measured on one can be a slow-down on the other,
# so the core benchmarks measure both, each in a process of its own: OpenBLAS reads OPENBLAS_CORETYPE once,
# when NumPy loads it. ("native": the variable unset, OpenBLAS's own choice.)
KERNELS = ("native", "Haswell")


def kernel_env(kernel: str) -> dict[str, str]:
    """This process's environment with OpenBLAS forced to `kernel` ("native": not forced)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if kernel != "native":
        env["OPENBLAS_CORETYPE"] = kernel
    return env


def under_kernels(module: str, argv: Sequence[str], kernels: Sequence[str]) -> dict[str, dict]:
    """`python -m bench.<module> <argv> --child-json FILE` once per kernel, one after the other, its output
    printed here as it comes; returns {kernel: the JSON the run wrote} (a run that failed is left out)."""
    results = {}
    for kernel in kernels:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            print(f"---- OpenBLAS kernel: {kernel} ----\n", flush=True)
            proc = subprocess.Popen(
                [sys.executable, "-m", f"bench.{module}", *argv, "--child-json", str(out)],
                cwd=ROOT,
                env=kernel_env(kernel),
                stdout=subprocess.PIPE,
                text=True,
            )
            for line in proc.stdout:
                print(line, end="", flush=True)  # through this process's stdout: bench.run keeps a copy
            if proc.wait() == 0 and out.is_file():
                results[kernel] = json.loads(out.read_text())
            else:
                print(f"(the run under the {kernel} kernel failed: exit {proc.returncode})\n")
    return results


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """argv less `option` and the values that follow it (a run of one kernel is not given --kernels)."""
    out, skipping = [], False
    for a in argv:
        if a == option:
            skipping = True
        elif not (skipping and not a.startswith("--")):
            skipping = False
            out.append(a)
    return out


class Gemm:
    """The machine's float32 matrix-multiply rate through NumPy's BLAS: one n x n product, on the threads
    the BLAS has when it is measured.

    Measured between the passes it is compared with, not once up front, so that the load other programs
    put on this shared machine weighs on the reference rate as it weighs on the passes.
    """

    def __init__(self, n: int = 2048):
        import numpy as np

        rng = np.random.default_rng(0)
        self.n = n
        self.a, self.b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        self.out = np.empty((n, n), dtype=np.float32)
        self.rates: list[float] = []
        for _ in range(3):  # warm-up
            self.measure()
        self.rates.clear()

    def measure(self) -> float:
        import numpy as np

        seconds = timed(lambda: np.matmul(self.a, self.b, out=self.out), repeat=1, warmup=0)[0]
        self.rates.append(2 * self.n**3 / seconds)
        return self.rates[-1]


def visible_pairs(n: int) -> int:
    """(query, key) pairs a causal mask lets through: n(n + 1)/2."""
    return n * (n + 1) // 2


def forward_flops(cfg, n: int) -> int:
    """Floating-point operations (2 per multiply-add) of the matrix products of a forward pass over n tokens
    of the decoder cfg describes: Q, K, V and O projections (grouped-query attention's fewer K and V heads),
    the attention, the MLP (three products when gated), the unembedding. Attention counts QKᵀ and
    pattern @ V over the visible pairs of a causal mask only, the work both sides do: core's blocked
    attention skips the blocks no query can see, and so does PyTorch's SDPA kernel. Elementwise work
    (norms, activations, softmax) is a few per cent of this at these sizes and not counted."""
    d, dm, dh = cfg.d_model, cfg.d_mlp, cfg.d_head
    heads, kv = cfg.n_heads, cfg.n_key_value_heads
    projections = 2 * n * d * (heads + 2 * kv) * dh + 2 * n * heads * dh * d
    pairs = visible_pairs(n) if cfg.causal else n * n
    attention = 2 * 2 * pairs * heads * dh
    mlp = 0 if cfg.attn_only else 2 * n * d * dm * (3 if cfg.gated_mlp else 2)
    return cfg.n_layers * (projections + attention + mlp) + 2 * n * d * cfg.d_vocab


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1, 5, 15 min)"
    except OSError:
        return "?"


# ---------------------------------------------------------------------------- a real server

APP_PYTHON = ROOT / ".venv" / "bin" / "python"  # the app's own environment (no torch in it)
sys.path.insert(0, str(ROOT / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package): the one live-server starter


def live_server(env: dict[str, str] | None = None, timeout_s: float = 60.0):
    """The app in a real uvicorn process on a free loopback port, run with the app's own venv (as
    `make serve` runs it), stopped on exit: scripts/liveserver.py's, as the tests use it."""
    python = APP_PYTHON if APP_PYTHON.exists() else Path(sys.executable)
    return liveserver.live_server(
        env={"HF_HUB_OFFLINE": "1", **(env or {})}, startup_timeout_s=timeout_s, python=python
    )
