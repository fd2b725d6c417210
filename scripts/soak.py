"""Load and soak: many mixed requests from many concurrent clients against a server this script
starts on 127.0.0.1, then a tally of status codes, latency and the server's memory.

    .venv/bin/python scripts/soak.py                      # 20,000 requests, 64 clients (make soak)
    .venv/bin/python scripts/soak.py --requests 2000 --clients 16

Each request has the statuses it may get: valid requests 200, deliberately bad ones 422; compute
requests may also get the limiter's 503 (and any may get 429 from a proxy). Anything else -- another
status, a timeout, a dropped connection -- is an error. Memory: the server's RSS after a warm-up
round and again at the end; growth must stay under --max-rss-growth.
Exit status 0 only if there were no errors and RSS grew less than that.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from liveserver import live_server

SHED = {429, 503}  # deliberate load shedding, not an error

# What a class types: short sentences, some accents, emoji, right-to-left and combining marks.
TEXTS = [
    "nasi lemak",
    "the cat sat on the mat",
    "Ali makan nasi lemak",
    "attention is all you need",
    "héllo wörld",
    "emoji 🙂🚀 ok",
    "مرحبا بالعالم",
    "e\u0301 combining",
    "x",
    "a longer sentence that a curious student might paste in to see what happens to the heatmap",
]


@dataclass(frozen=True)
class Call:
    kind: str
    method: str
    path: str
    params: dict | None = None
    json: dict | None = None
    ok: frozenset = frozenset({200})


def mix(rng: random.Random, models: list[str], paths: set[str]) -> Call:
    """One request, drawn from the mix a classroom makes: mostly runs and lessons, some pages,
    assets, docs and calculators, and a few mistakes."""
    text = rng.choice(TEXTS)
    candidates: list[tuple[float, Call]] = [
        (2, Call("healthz", "GET", "/healthz")),
        (2, Call("static", "GET", "/static/vendor/htmx.min.js")),
        (3, Call("page", "GET", "/", params={"text": text})),
    ]
    if "/api/v1/run" in paths:
        model = rng.choice(models)
        body = {"model": model, "text": text, "hooks": ["blocks.0.attn.hook_pattern"], "top_k": 5}
        if model == "toy":
            body |= {"causal": rng.random() < 0.5, "n_heads": rng.choice([1, 2, 4, 8]), "seed": rng.randrange(5)}
        # spec-forward knows only " aeiklmns": anything else is a deliberate 422 with a message.
        ok = frozenset({200, 422}) if model == "spec-forward" else frozenset({200})
        candidates += [
            (30, Call("run", "POST", "/api/v1/run", json=body, ok=ok)),
            (5, Call("run-bad", "POST", "/api/v1/run", json={"model": "toy", "text": "  "}, ok=frozenset({422}))),
            (
                3,
                Call(
                    "run-bad",
                    "POST",
                    "/api/v1/run",
                    json={"model": "toy", "text": "hi", "d_model": 10, "n_heads": 4},
                    ok=frozenset({422}),
                ),
            ),
        ]
    lessons = {
        "/api/v1/lessons/attention": {"text": text, "causal": rng.choice(["true", "false"])},
        "/api/v1/lessons/multihead": {"text": text},
        "/api/v1/lessons/positions": {"n_pos": rng.choice([10, 50, 100])},
        "/api/v1/lessons/scaling": {"n_queries": rng.choice([10, 100]), "dims": "4,64"},
        "/api/v1/lessons/forward": {},
    }
    candidates += [(4, Call("lesson", "GET", p, params=q)) for p, q in lessons.items() if p in paths]
    cheap = {
        "/api/v1/models": None,
        "/api/v1/params": {"preset": "gpt2-small"},
        "/api/v1/kv-cache": {"preset": "gpt2-small"},
        "/openapi.json": None,
    }
    candidates += [
        (2, Call("cheap", "GET", p, params=q)) for p, q in cheap.items() if p in paths or p == "/openapi.json"
    ]
    weights, calls = zip(*candidates)
    call = rng.choices(calls, weights=weights)[0]
    return call


@dataclass
class Tally:
    by_status: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    healthz_ms: list[float] = field(default_factory=list)  # liveness under load, reported apart


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def hammer(base: str, n: int, clients: int, seed: int, models: list[str], paths: set[str]) -> Tally:
    tally, rng, remaining = Tally(), random.Random(seed), n
    # Drop idle connections before uvicorn's 5 s keep-alive timeout does: otherwise a request can
    # race the server's close of the connection it reuses (a ReadError that is the client's fault).
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as client:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                call = mix(rng, models, paths)
                started = time.perf_counter()
                try:
                    r = await client.request(call.method, call.path, params=call.params, json=call.json)
                    status = r.status_code
                except httpx.HTTPError as exc:
                    tally.errors[f"{call.kind}: {type(exc).__name__}"] += 1
                    continue
                tally.latencies_ms.append((time.perf_counter() - started) * 1000)
                if call.kind == "healthz":
                    tally.healthz_ms.append(tally.latencies_ms[-1])
                tally.by_status[status] += 1
                tally.by_kind[f"{call.kind} {status}"] += 1
                if status not in call.ok and status not in SHED:
                    tally.errors[f"{call.kind} {call.method} {call.path} -> {status}: {r.text[:120]}"] += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    return tally


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else (values or [0.0])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=64)
    # The warm-up must reach every cache (each model loaded, each toy size and seed drawn) before
    # memory is measured; 4,000 mixed requests do (RSS then stays flat to within 1 MiB).
    parser.add_argument("--warmup", type=int, default=4_000, help="requests before the first RSS reading")
    parser.add_argument("--max-rss-growth", type=float, default=0.10, help="fraction, warm to end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server:
        paths = set(httpx.get(server.url + "/openapi.json").json()["paths"])
        models = ["toy"]
        if "/api/v1/models" in paths:
            listing = httpx.get(server.url + "/api/v1/models").json()
            items = listing.get("models", listing) if isinstance(listing, dict) else listing
            models = [m["name"] for m in items if not m.get("error")] or models

        rss_start = rss_bytes(server.pid)
        warm = asyncio.run(hammer(server.url, args.warmup, args.clients, args.seed, models, paths))
        rss_warm = rss_bytes(server.pid)
        started = time.monotonic()
        tally = asyncio.run(hammer(server.url, args.requests, args.clients, args.seed + 1, models, paths))
        elapsed = time.monotonic() - started
        rss_end = rss_bytes(server.pid)

    growth = (rss_end - rss_warm) / rss_warm
    mb = 1 / 2**20
    lat = tally.latencies_ms
    print(
        f"soak: {args.requests} requests ({args.clients} concurrent clients, models {models}) "
        f"in {elapsed:.1f} s = {args.requests / elapsed:.0f} req/s"
    )
    print(f"  statuses: {dict(sorted(tally.by_status.items()))}")
    for kind, count in sorted(tally.by_kind.items()):
        print(f"    {kind}: {count}")
    print(
        f"  latency ms: p50 {percentile(lat, 50):.1f}, p95 {percentile(lat, 95):.1f}, "
        f"p99 {percentile(lat, 99):.1f}, max {max(lat, default=0):.1f}"
    )
    hz = tally.healthz_ms
    print(
        f"  /healthz latency ms: p50 {percentile(hz, 50):.1f}, p95 {percentile(hz, 95):.1f}, "
        f"max {max(hz, default=0):.1f}"
    )
    print(f"  errors: {sum(tally.errors.values())} (warm-up round: {sum(warm.errors.values())})")
    for what, count in tally.errors.most_common(10):
        print(f"    {count} x {what}")
    print(
        f"  RSS: start {rss_start * mb:.1f} MiB, warm {rss_warm * mb:.1f} MiB, end {rss_end * mb:.1f} MiB, "
        f"growth warm->end {growth:+.1%} (limit {args.max_rss_growth:.0%})"
    )
    failed = sum(tally.errors.values()) + sum(warm.errors.values()) > 0 or growth >= args.max_rss_growth
    print("soak: FAIL" if failed else "soak: PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
