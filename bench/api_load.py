"""API overhead: throughput and latency of lesson and run endpoints against a bare /healthz, on one
real uvicorn server, at 1, 8 and 32 concurrent clients (asyncio + httpx; bounded request counts).

    bench/.env/bin/python -m bench.api_load [--rounds 3] [--requests 160]

Every (endpoint, clients) cell is measured once per round, the rounds interleaved so that machine
load drifts over all cells alike; the table gives medians over rounds. The client runs on the same
2 cores as the server, so absolute rates are the pair's, and the ratio to /healthz is the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from bench.common import header, live_server, median, percentile, run_main, table, verdict

# (label, method, path, JSON body). Texts are character-level for the toy model: n chars = n tokens.
ENDPOINTS = [
    ("GET /healthz", "GET", "/healthz", None),
    ("GET /api/v1/lessons/attention", "GET", "/api/v1/lessons/attention", None),
    (
        "POST /api/v1/run toy, 16 tokens",
        "POST",
        "/api/v1/run",
        {"model": "toy", "text": "the cat sat on a", "top_k": 5},
    ),
    (
        "POST /api/v1/run toy, 256 tokens",
        "POST",
        "/api/v1/run",
        {"model": "toy", "text": ("the cat sat on the mat. " * 11)[:256], "top_k": 5},
    ),
]
CLIENTS = (1, 8, 32)
THROUGHPUT_BUDGET = 0.5  # lesson req/s over /healthz req/s, at 32 clients
P99_BUDGET_MS = 25.0


async def load(client, method: str, url: str, body, n_requests: int, concurrency: int) -> dict:
    """`concurrency` clients send `n_requests` in all, each waiting for its answer before the next
    (status 0 counts a connection error)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    remaining = n_requests

    async def one_client():
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            try:
                r = await client.request(method, url, json=body)
                await r.aread()
                status = r.status_code
            except httpx.TransportError:  # e.g. a kept-alive connection the server had closed
                status = 0
            latencies.append(time.perf_counter() - t0)
            statuses[status] = statuses.get(status, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ok = statuses.get(200, 0)
    return {
        "rps": ok / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "errors": n_requests - ok,
        "statuses": statuses,
    }


async def bench(url: str, rounds: int, n_requests: int) -> dict:
    results: dict[tuple[str, int], list[dict]] = {}
    limits = httpx.Limits(max_connections=max(CLIENTS), max_keepalive_connections=max(CLIENTS))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        for _, method, path, body in ENDPOINTS:  # warm-up: imports, first model draw, caches
            await load(client, method, path, body, 20, 4)
        for _ in range(rounds):
            for c in CLIENTS:
                for label, method, path, body in ENDPOINTS:
                    n = max(n_requests, 4 * c)
                    results.setdefault((label, c), []).append(await load(client, method, path, body, n, c))
    return results


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=160, help="requests per cell and round")
    ap.add_argument(
        "--blas-threads",
        type=int,
        default=0,
        help="OPENBLAS_NUM_THREADS for the server (0: OpenBLAS's default, one per core)",
    )
    args = ap.parse_args(argv)

    env = {"OPENBLAS_NUM_THREADS": str(args.blas_threads)} if args.blas_threads else {}
    header(
        f"API overhead: one uvicorn worker, the app's default settings{', ' if env else ''}"
        f"{' '.join(f'{k}={v}' for k, v in env.items())}"
    )
    with live_server(env=env) as server:
        results = asyncio.run(bench(server.url, args.rounds, args.requests))

    rows = []
    summary = {}
    for c in CLIENTS:
        base = median([r["rps"] for r in results[("GET /healthz", c)]])
        for label, *_ in ENDPOINTS:
            rs = results[(label, c)]
            rps, p50, p99 = (median([r[k] for r in rs]) for k in ("rps", "p50", "p99"))
            errors = sum(r["errors"] for r in rs)
            summary[(label, c)] = (rps / base, p99 * 1e3)
            rows.append(
                [
                    c,
                    label,
                    f"{rps:.0f}",
                    f"{rps / base:.2f}",
                    f"{p50 * 1e3:.1f}",
                    f"{p99 * 1e3:.1f}",
                    errors if not errors else f"{errors} {sorted({s for r in rs for s in r['statuses']})}",
                ]
            )
    print(
        table(
            f"Requests per second and latency (median of {args.rounds} rounds of {args.requests}+ requests)",
            ["clients", "endpoint", "req/s", "÷ /healthz req/s", "p50 ms", "p99 ms", "non-200"],
            rows,
        )
    )
    lesson = "GET /api/v1/lessons/attention"
    share, _ = summary[(lesson, 32)]
    print(
        f"budget lesson throughput >= {THROUGHPUT_BUDGET:.0%} of /healthz at 32 clients: {share:.0%} -> "
        f"{verdict(share >= THROUGHPUT_BUDGET)}"
    )
    for c in CLIENTS:
        p99 = summary[(lesson, c)][1]
        print(
            f"budget lesson p99 <= {P99_BUDGET_MS:.0f} ms at {c} clients: {p99:.1f} ms -> "
            f"{verdict(p99 <= P99_BUDGET_MS)}"
        )
    print()
    return 0


if __name__ == "__main__":
    run_main(main)
