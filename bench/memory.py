"""Memory: resident set size of one server process, idle, after loading MiniLM, and at its peak
while serving 1000 mixed requests (lessons, toy runs of several lengths, MiniLM runs, pages).

    bench/.env/bin/python -m bench.memory [--requests 1000] [--clients 8]

RSS is sampled every 50 ms from /proc by psutil; the peak is also read from the kernel (VmHWM),
which misses nothing between samples.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time

from bench.common import live_server, header, run_main, table

MINILM = "all-MiniLM-L6-v2"
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


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
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
    return 0


if __name__ == "__main__":
    run_main(main)
