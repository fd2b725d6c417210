"""Memory: resident set size of one server process, idle, after loading MiniLM, and at its peak
while serving 1000 mixed requests (lessons, toy runs of several lengths, MiniLM runs, pages); then
what a second worker adds with MiniLM loaded in every worker.

    bench/.env/bin/python -m bench.memory [--requests 1000] [--clients 8] [--workers 1 2]

RSS is sampled every 50 ms from /proc by psutil; the peak is also read from the kernel (VmHWM),
which misses nothing between samples.

Workers: `python -m app` with EXPLORER_WORKERS=1 and then 2, MiniLM run in every worker (requests are
sent until each worker's RSS has grown by the weights' size). RSS counts a page shared by two
processes in both, so the server's memory is the sum of PSS (proportional set size: a shared page
counted half in each) over the supervisor and its workers; USS is what each worker holds alone.
What the second worker adds = that sum with 2 workers - with 1. Weights memory-mapped read-only
from the safetensors file are shared pages; weights copied into each worker are private.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time

from bench.common import live_server, header, run_main, table, verdict

MINILM = "all-MiniLM-L6-v2"
SECOND_WORKER_BUDGET_MB = 30
# The mix, cycled: what a class of learners and a script might send.
MIX = [
    ("GET", "/healthz", None),
    ("GET", "/api/v1/lessons/attention", None),
    ("POST", "/api/v1/run", {"model": "toy", "text": "the cat sat on the mat", "hooks": ["blocks.0.attn.hook_pattern"]}),
    ("POST", "/api/v1/run", {"model": "toy", "text": "the cat sat on the mat. " * 40}),
    ("POST", "/api/v1/run", {"model": MINILM, "text": "the cat sat on the mat", "hooks": ["blocks.0.attn.hook_pattern"]}),
    ("GET", "/api/v1/lessons/multihead", None),
    ("GET", "/?text=the+cat+sat+on+the+mat", None),
    ("POST", "/api/v1/run", {"model": "spec-forward", "text": "nasi ", "top_k": 9}),
]


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def hwm_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def serve_mix(url: str, n: int, clients: int) -> dict[int, int]:
    import httpx

    statuses: dict[int, int] = {}
    requests = itertools.islice(itertools.cycle(MIX), n)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def worker():
            for method, path, body in requests:  # the clients share one iterator
                r = await client.request(method, path, json=body)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        await asyncio.gather(*(worker() for _ in range(clients)))
    return statuses


MINILM_MB = 80  # a worker's RSS grows by about this much when it reads MiniLM's 87 MB of float32 weights


def server_processes(pid: int) -> list:
    import psutil

    master = psutil.Process(pid)
    return [master, *master.children(recursive=True)]


def workers_memory(n_workers: int) -> dict:
    """PSS, USS and RSS (MB) of `python -m app` with n workers, each having run MiniLM."""
    import httpx
    import liveserver  # scripts/, on the path through bench.common

    from bench.common import APP_PYTHON

    env = {"HF_HUB_OFFLINE": "1", "EXPLORER_WORKERS": str(n_workers), "EXPLORER_ACCESS_LOG": "false"}
    with liveserver.live_server(env=env, entry_point=True, startup_timeout_s=60, python=APP_PYTHON) as server:
        procs = server_processes(server.pid)
        # uvicorn's workers, not multiprocessing's resource tracker (also a child of the supervisor)
        workers = [p for p in procs if p.pid != server.pid and "resource_tracker" not in " ".join(p.cmdline())] or procs
        idle = {p.pid: p.memory_info().rss / 2**20 for p in workers}
        body = {"model": MINILM, "text": "the cat sat on the mat"}

        async def load_everywhere() -> None:
            # a new connection per request: the kernel hands each to whichever worker accepts first
            no_reuse = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=no_reuse) as client:
                for _ in range(50):  # the kernel picks the worker that accepts: ask until each has loaded it
                    await asyncio.gather(*(client.post("/api/v1/run", json=body) for _ in range(4 * n_workers)))
                    if all(p.memory_info().rss / 2**20 - idle[p.pid] > MINILM_MB for p in workers):
                        return

        asyncio.run(load_everywhere())
        info = {p.pid: p.memory_full_info() for p in procs}
        loaded = all(info[p.pid].rss / 2**20 - idle[p.pid] > MINILM_MB for p in workers)
        return {"workers": n_workers, "loaded_everywhere": loaded,
                "pss": sum(i.pss for i in info.values()) / 2**20,
                "uss": [info[p.pid].uss / 2**20 for p in workers],
                "rss": [info[p.pid].rss / 2**20 for p in workers]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2],
                    help="worker counts for the shared-weights table (none: skip it)")
    args = ap.parse_args(argv)
    import httpx

    header("Memory: one server process")
    with live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server:
        pid = server.pid
        idle = rss_mb(pid)
        t0 = time.perf_counter()
        r = httpx.post(server.url + "/api/v1/run", json={"model": MINILM, "text": "hello"}, timeout=120)
        load_s = time.perf_counter() - t0
        if r.status_code != 200:
            print(f"MiniLM did not run ({r.status_code}): {r.text[:200]}\n")
        after_minilm = rss_mb(pid)
        samples: list[float] = []
        done = threading.Event()

        def sample():
            while not done.is_set():
                samples.append(rss_mb(pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        statuses = asyncio.run(serve_mix(server.url, args.requests, args.clients))
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        end, peak_sampled, peak_kernel = rss_mb(pid), max(samples), hwm_mb(pid)

    print(table(f"RSS of the server (MB); {args.requests} requests of {len(MIX)} kinds from {args.clients} clients "
                f"in {wall:.0f} s, statuses {dict(sorted(statuses.items()))}",
                ["moment", "RSS MB"],
                [["idle after start", f"{idle:.0f}"],
                 [f"after loading {MINILM} (first run: {load_s:.1f} s)", f"{after_minilm:.0f}"],
                 ["peak while serving (sampled every 50 ms)", f"{peak_sampled:.0f}"],
                 ["peak over the process's life (kernel VmHWM)", f"{peak_kernel:.0f}"],
                 ["after the requests", f"{end:.0f}"]]))
    if not args.workers:
        return 0
    runs = [workers_memory(n) for n in args.workers]
    rows = [[r["workers"], f"{r['pss']:.0f}", " / ".join(f"{x:.0f}" for x in r["rss"]),
             " / ".join(f"{x:.0f}" for x in r["uss"]), "yes" if r["loaded_everywhere"] else "NO"] for r in runs]
    print(table(f"Workers with {MINILM} loaded in each (MB): the server's memory is the sum of PSS",
                ["workers", "server PSS (all processes)", "RSS per worker", "USS per worker (private)",
                 "MiniLM loaded in every worker"], rows))
    by = {r["workers"]: r for r in runs}
    if 1 in by and 2 in by:
        added = by[2]["pss"] - by[1]["pss"]
        print(f"budget the second worker adds <= {SECOND_WORKER_BUDGET_MB} MB: {added:.0f} MB -> "
              f"{verdict(added <= SECOND_WORKER_BUDGET_MB and by[2]['loaded_everywhere'])}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
