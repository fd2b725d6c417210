"""A whole school: the Redis mode measured beside the embedded one, all on this machine (real parts: Debian's
redis-server and caddy, Celery workers, app replicas; tests/scale/services.py starts them).

1. Runs finished per minute with 1, 2 and 4 training processes (one `python -m app.worker` with
   EXPLORER_TRAIN_WORKERS=N), induction runs with distinct seeds all queued at once, beside the embedded
   mode (the runs folder and the server's scheduler, EXPLORER_TRAIN_WORKERS=N) training the same runs.
2. The delay from a record written (its Redis stream entry's time) to the record seen by each of 60
   Server-Sent-Events clients through Caddy over two replicas, beside 60 clients on one replica directly.
3. The explorer for a class of 60 (Locust, bench/locustfile.py as bench/classroom.py plays it) through
   Caddy over two replicas, beside the same class on one process (`python -m app`, as `make serve`).

    bench/.env/bin/python -m bench.scale [--runs 4] [--steps 150] [--repeat 3] [--clients 60] [--students 60]
                                         [--minutes 1] [--skip runs events class]

docs/benchmarks.md and docs/deployment.md ("A whole school: several machines") quote its tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import subprocess
import tempfile
import time

import httpx

from bench.classroom import LOCUST, served_as_make_serve, server_durations
from bench.common import APP_PYTHON, OUT, ROOT, header, median, percentile, run_main, table
from tests.scale import services

if APP_PYTHON.exists():
    services.PYTHON = str(APP_PYTHON)  # workers and replicas run in the app's own environment


# ------------------------------------------------------------------ 1. runs finished per minute


def queue_and_wait(submit, status, ids: list[str], timeout_s: float) -> float:
    """Seconds from the first run queued to the last one done."""
    t0 = time.perf_counter()
    for i in range(len(ids)):
        ids[i] = submit(i)
    deadline = time.monotonic() + timeout_s
    while not all(status(id) == "done" for id in ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"runs not done within {timeout_s} s: {[status(id) for id in ids]}")
        time.sleep(0.2)
    return time.perf_counter() - t0


def throughput_redis(redis: services.RedisServer, processes: int, runs: int, steps: int, db: int) -> float:
    from app.training import open_redis
    from app.training.redis_store import Timing
    from core.run_settings import settings

    url = redis.url.rsplit("/", 1)[0] + f"/{db}"
    store = open_redis(url, 2**30, Timing(60))
    with services.worker(url, train_workers=processes):
        return queue_and_wait(
            lambda i: store.create(settings("induction", steps=steps, seed=1000 * db + i), client=f"bench-{i}")[0],
            lambda id: store.info(id).status,
            [""] * runs,
            60 * runs,
        )


def throughput_folder(processes: int, runs: int, steps: int, seed0: int) -> float:
    from bench.common import live_server

    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-runs-") as folder,
        live_server(
            env={
                "EXPLORER_RUNS_DIR": folder,
                "EXPLORER_TRAIN_WORKERS": str(processes),
                "EXPLORER_ACCESS_LOG": "false",
                "EXPLORER_TRAIN_MAX_PER_CLIENT": str(runs),
                "EXPLORER_TRAIN_MAX_RUNS": str(runs),
            }
        ) as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        return queue_and_wait(
            lambda i: c.post("/api/v1/train", json={"recipe": "induction", "steps": steps, "seed": seed0 + i}).json()[
                "id"
            ],
            lambda id: c.get(f"/api/v1/runs/{id}").json()["status"],
            [""] * runs,
            60 * runs,
        )


# ------------------------------------------------------------------ 2. a record, from written to seen


async def follow(url: str, id: str, seen: list[tuple[int, float]], ready: asyncio.Event, n: list[int]) -> None:
    """One client: every record event it is sent, with the time it arrived."""
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(120, read=120)) as client,
        client.stream("GET", f"{url}/api/v1/runs/{id}/events") as stream,
    ):
        n[0] += 1
        if n[0] == n[1]:
            ready.set()
        event = {}
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                event = {"event": line[7:]}
            elif line.startswith("data: ") and event.get("event") == "record":
                seen.append((json.loads(line[6:])["step"], time.time()))
            elif line.startswith("data: ") and event.get("event") == "end":
                return


async def delays(base: str, direct: str, redis_url: str, clients: int, seed: int) -> list[float]:
    """Seconds from each record's stream entry (written by the worker) to each client's reading of it. The
    run waits in the queue behind another (the worker's one process is busy) until every client listens."""
    import redis

    async with httpx.AsyncClient(timeout=60) as c:
        blocker = (
            await c.post(f"{direct}/api/v1/train", json={"recipe": "nasi-lemak", "steps": 100_000, "seed": seed})
        ).json()["id"]
        while (await c.get(f"{direct}/api/v1/runs/{blocker}")).json()["status"] != "running":
            await asyncio.sleep(0.1)
        body = {"recipe": "nasi-lemak", "steps": 2000, "eval_interval": 20, "seed": seed}
        id = (await c.post(f"{direct}/api/v1/train", json=body)).json()["id"]
        seen: list[tuple[int, float]] = []
        ready, n = asyncio.Event(), [0, clients]
        tasks = [asyncio.create_task(follow(base, id, seen, ready, n)) for _ in range(clients)]
        await asyncio.wait_for(ready.wait(), 60)
        await c.delete(f"{direct}/api/v1/runs/{blocker}")  # the measured run starts
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    written = {}
    for entry_id, fields in redis.Redis.from_url(redis_url).xrange(f"explorer:run:{id}:events"):
        if fields[b"event"] == b"record":
            written[json.loads(fields[b"data"])["step"]] = int(entry_id.split(b"-")[0]) / 1000
    return [at - written[step] for step, at in seen if step in written]


def sse_delays(redis: services.RedisServer, clients: int) -> dict[str, list[float]]:
    url = redis.url.rsplit("/", 1)[0] + "/14"
    with (
        services.replica(url) as a,
        services.replica(url) as b,
        services.caddy([a.hostport, b.hostport]) as proxy,
        services.worker(url),
    ):
        through = asyncio.run(delays(proxy.url, a.url, url, clients, seed=7001))
        direct = asyncio.run(delays(a.url, a.url, url, clients, seed=7002))
    return {"caddy": through, "direct": direct}


# ------------------------------------------------------------------ 3. a class of 60


def play_class(host: str, students: int, seconds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-scale-class-") as tmp:
        cmd = [
            str(LOCUST),
            "-f",
            str(ROOT / "bench" / "locustfile.py"),
            "--headless",
            "--host",
            host,
            "-u",
            str(students),
            "-r",
            str(max(1, students // 10)),
            "-t",
            f"{seconds}s",
            "--csv",
            f"{tmp}/class",
            "--only-summary",
            "--loglevel",
            "WARNING",
            "--stop-timeout",
            "5",
        ]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"locust failed ({done.returncode}): {done.stderr[-2000:]}")
        with open(f"{tmp}/class_stats.csv", newline="") as f:
            total = next(row for row in csv.DictReader(f) if row["Name"] == "Aggregated")
    return total


def classes(redis: services.RedisServer, students: int, seconds: int) -> list[list]:
    rows = []
    url = redis.url.rsplit("/", 1)[0] + "/15"
    with (
        services.replica(url, access_log="true") as a,
        services.replica(url, access_log="true") as b,
        services.caddy([a.hostport, b.hostport]) as proxy,
    ):
        total = play_class(proxy.url, students, seconds)
        served = server_durations(a.log()) + server_durations(b.log())
        rows.append(class_row("2 replicas behind Caddy", students, seconds, total, served))
    with served_as_make_serve({"EXPLORER_WORKERS": "1", "EXPLORER_ACCESS_LOG": "true"}) as server:
        total = play_class(server.url, students, seconds)
        rows.append(class_row("1 process (make serve)", students, seconds, total, server_durations(server.log())))
    return rows


def class_row(name: str, students: int, seconds: int, total: dict, served: list) -> list:
    times = [d for _, _, d in served]
    errors = sum(1 for _, status, _ in served if status >= 400)
    return [
        name,
        students,
        f"{len(times) / seconds:.1f}",
        f"{errors} + {total['Failure Count']}",
        f"{percentile(times, 50):.0f}",
        f"{percentile(times, 95):.0f}",
        total["50%"],
        total["95%"],
    ]


# ------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs queued at once for each number of processes")
    ap.add_argument("--steps", type=int, default=150, help="steps of each induction run")
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=3, help="batches per side and number of processes (medians)")
    ap.add_argument("--clients", type=int, default=60, help="event-stream clients following one run")
    ap.add_argument("--students", type=int, default=60)
    ap.add_argument("--minutes", type=float, default=1.0, help="how long each class plays")
    ap.add_argument("--skip", nargs="*", default=[], choices=["runs", "events", "class"])
    args = ap.parse_args(argv)
    header("A whole school: Redis, Celery workers and replicas behind Caddy, on this machine")
    out: dict = {}
    with services.redis_server() as redis:
        if "runs" not in args.skip:
            rows = []
            for i, n in enumerate(args.processes):
                celery, folder = [], []
                for r in range(args.repeat):  # the two sides alternate, so the machine's load falls on both
                    sides = [("celery", celery), ("folder", folder)][:: 1 if r % 2 == 0 else -1]
                    for side, times in sides:
                        db = 1 + i * args.repeat + r
                        times.append(
                            throughput_redis(redis, n, args.runs, args.steps, db=db)
                            if side == "celery"
                            else throughput_folder(n, args.runs, args.steps, seed0=10_000 * db)
                        )
                c, f = median(celery), median(folder)
                rows.append(
                    [
                        n,
                        args.runs,
                        f"{60 * args.runs / c:.1f}",
                        f"{60 * args.runs / f:.1f}",
                        f"{f / c:.2f}",
                        " ".join(f"{t:.0f}" for t in celery),
                        " ".join(f"{t:.0f}" for t in folder),
                    ]
                )
                out.setdefault("runs", []).append({"processes": n, "celery_s": celery, "folder_s": folder})
            print(
                table(
                    f"Runs finished per minute: {args.runs} induction runs of {args.steps} steps (distinct seeds) "
                    f"queued at once; medians of {args.repeat}",
                    [
                        "training processes",
                        "runs",
                        "Celery + Redis runs/min",
                        "embedded (runs folder) runs/min",
                        "ratio",
                        "Celery s (each)",
                        "embedded s (each)",
                    ],
                    rows,
                )
            )
        if "events" not in args.skip:
            d = sse_delays(redis, args.clients)
            out["events"] = {k: [percentile(v, q) for q in (50, 95, 100)] for k, v in d.items()}
            print(
                table(
                    f"A record, from written (its stream entry) to seen by each of {args.clients} SSE clients "
                    "(ms; nasi-lemak, 101 records)",
                    ["clients follow", "records seen", "p50", "p95", "max", "p95 ratio"],
                    [
                        [
                            name,
                            len(v),
                            f"{1000 * median(v):.0f}",
                            f"{1000 * percentile(v, 95):.0f}",
                            f"{1000 * max(v):.0f}",
                            f"{percentile(v, 95) / percentile(d['direct'], 95):.2f}",
                        ]
                        for name, v in (("through Caddy, 2 replicas", d["caddy"]), ("1 replica, direct", d["direct"]))
                    ],
                )
            )
        if "class" not in args.skip:
            rows = classes(redis, args.students, int(60 * args.minutes))
            out["class"] = rows
            print(
                table(
                    f"The explorer for a class of {args.students} for {args.minutes:g} min (server ms from the "
                    "replicas' access logs; students' ms from Locust, through Caddy where there is one)",
                    [
                        "served by",
                        "students",
                        "req/s",
                        "errors (server + Locust)",
                        "server p50",
                        "server p95",
                        "students' p50",
                        "students' p95",
                    ],
                    rows,
                )
            )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scale.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run_main(main)
