"""What every benchmark shares: timing (warm-up, then medians), tables, and the machine's description.

These machines are noisy (2 shared cores), so every figure is a median of several repetitions
taken after a warm-up, and each comparison is printed as a ratio to a peer measured in the same run.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
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
    """A GitHub-flavoured Markdown table (readable in a terminal and pasteable into BENCHMARKS.md)."""
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
    return {"numpy": np.__version__, "blas": f"{info.get('internal_api', '?')} {info.get('version', '?')}",
            "kernel": info.get("architecture", "?"), "blas_threads": info.get("num_threads", 0)}


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
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except OSError:
        commit = "?"
    return (f"nproc {os.cpu_count()}, CPU {cpu_model()}, Python {platform.python_version()}, "
            f"NumPy {b['numpy']} with {b['blas']} (kernel {b['kernel']}, {b['blas_threads']} threads), "
            f"OpenBLAS overrides {env or 'none'}, commit {commit}")


def header(name: str) -> None:
    print(f"## {name}\n\n{machine()}\n", flush=True)


def run_main(main: Callable[[list[str]], int]) -> None:
    sys.exit(main(sys.argv[1:]))


# ---------------------------------------------------------------------------- a real server

APP_PYTHON = ROOT / ".venv" / "bin" / "python"  # the app's own environment (no torch in it)
sys.path.insert(0, str(ROOT / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package): the one live-server starter


def live_server(env: dict[str, str] | None = None, timeout_s: float = 60.0):
    """The app in a real uvicorn process on a free loopback port, run with the app's own venv (as
    `make serve` runs it), stopped on exit: scripts/liveserver.py's, as the tests use it."""
    python = APP_PYTHON if APP_PYTHON.exists() else Path(sys.executable)
    return liveserver.live_server(env={"HF_HUB_OFFLINE": "1", **(env or {})}, startup_timeout_s=timeout_s,
                                  python=python)
