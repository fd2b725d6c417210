"""A live class of sixty through Caddy over two replicas in the Redis mode (issue 35; real parts: Debian's
redis-server and caddy, two app replicas, as tests/scale/services.py starts them).

Sixty followers each hold the class's event stream (GET /api/v1/classes/{code}/events, each with its own
student cookie), as a student's page does, and reconnect as EventSource does: after the server's `retry`
with Last-Event-ID. (Followers are HTTP clients, not sixty Chromium tabs, which two cores cannot hold;
tests/browser/test_class.py drives real pages.) Measured:
1. teacher's change -> seen by every follower: the time from the teacher's PUT …/state being sent to each
   follower reading the `state` event, over `--changes` changes: p50, p95, max;
2. the replicas' CPU (user + system, from /proc, both processes) per follower: idle (keep-alives only)
   and during the changes;
3. one replica killed mid-class (SIGKILL): the teacher pushes the next page at once (retried on 502/503,
   as static/js/presenting.js does) and every follower must have it within 5 s.
The load average is printed at the start and the end (the machine is shared).

With --store workers (and by default, after the Redis mode) the same class on `python -m app` with
EXPLORER_WORKERS=2 and no Redis, as `docker compose up` runs it: the two workers share the classes through
a SQLite file (app/classes/sqlite_store.py), no Caddy, nothing killed; --store one is one process.

    .venv/bin/python -m bench.class_follow [--followers 60] [--changes 20] [--store redis|workers|one|all]
    (or: make bench BENCH=class)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

import httpx

from bench.common import APP_PYTHON, header, liveserver, load_average, median, percentile, run_main, table
from tests.scale import services

if APP_PYTHON.exists():
    services.PYTHON = str(APP_PYTHON)  # the replicas run in the app's own environment

BACK_WITHIN_S = 5.0  # the promise after a replica is lost
P95_BUDGET_MS = 300.0  # the promise: teacher's change -> shown on every student's page


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their children, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


class Follower:
    """One student's event stream: every `state` path with the time it arrived; reconnects like EventSource."""

    def __init__(self, base: str, code: str):
        self.base, self.code = base, code
        self.seen: list[tuple[str, float]] = []
        self.connected = asyncio.Event()
        self.last_id: str | None = None
        self.reconnects = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(10, read=60)) as client:
            while True:
                headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
                try:
                    async with client.stream("GET", f"/api/v1/classes/{self.code}/events", headers=headers) as r:
                        if r.status_code != 200:
                            raise httpx.TransportError(f"answered {r.status_code}")
                        self.connected.set()
                        event = {}
                        async for line in r.aiter_lines():
                            if line.startswith("id: "):
                                event["id"] = line[4:]
                            elif line.startswith("event: "):
                                event["event"] = line[7:]
                            elif line.startswith("data: "):
                                event["data"] = line[6:]
                            elif not line and event:
                                if "id" in event:
                                    self.last_id = event["id"]
                                if event.get("event") == "state":
                                    self.seen.append((json.loads(event["data"])["path"], time.monotonic()))
                                if event.get("event") == "ended":
                                    return
                                event = {}
                except (httpx.HTTPError, httpx.StreamError):
                    pass
                self.reconnects += 1
                await asyncio.sleep(1.0)  # the server's retry: 1000 ms (app/api/routes/classes.py)

    def saw(self, path: str) -> float | None:
        return next((t for p, t in self.seen if p == path), None)


async def push(client: httpx.AsyncClient, code: str, auth: dict, path: str) -> float:
    """The teacher's change, sent (retried on 502/503 as the page does): the time it was first sent."""
    sent = time.monotonic()
    for attempt in range(5):
        try:
            r = await client.put(f"/api/v1/classes/{code}/state", json={"path": path}, headers=auth)
            if r.status_code not in (502, 503):
                r.raise_for_status()
                return sent
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.3 * 2**attempt)
    raise RuntimeError(f"the teacher's change to {path} was refused five times")


async def wait_all(followers: list[Follower], path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(f.saw(path) for f in followers):
        if time.monotonic() > deadline:
            missing = sum(1 for f in followers if not f.saw(path))
            raise RuntimeError(f"{missing} followers did not see {path} within {timeout_s} s")
        await asyncio.sleep(0.01)


async def play(proxy: str, pids: list[int], kill, n_followers: int, n_changes: int) -> dict:
    async with httpx.AsyncClient(base_url=proxy, timeout=10) as teacher:
        started = (await teacher.post("/api/v1/classes", json={"path": "/"})).json()
        code, auth = started["code"], {"Authorization": f"Bearer {started['teacher_token']}"}
        followers = [Follower(proxy, code) for _ in range(n_followers)]
        tasks = [asyncio.create_task(f.run()) for f in followers]
        await asyncio.wait_for(asyncio.gather(*(f.connected.wait() for f in followers)), 60)
        await asyncio.sleep(2)
        idle_s = 10.0
        cpu0 = cpu_seconds(pids)
        await asyncio.sleep(idle_s)
        idle_cpu = cpu_seconds(pids) - cpu0

        delays, cpu0, t0 = [], cpu_seconds(pids), time.monotonic()
        for i in range(n_changes):
            path = f"/?text=change+{i}&layer={i % 2}"
            sent = await push(teacher, code, auth, path)
            await wait_all(followers, path, 10)
            delays += [1000 * (f.saw(path) - sent) for f in followers]
            await asyncio.sleep(0.2)
        change_cpu, change_s = cpu_seconds(pids) - cpu0, time.monotonic() - t0

        back, reconnected = [], 0
        if kill is not None:
            reconnects_before = sum(f.reconnects for f in followers)
            kill()
            killed = time.monotonic()
            await push(teacher, code, auth, "/lessons/attention")
            await wait_all(followers, "/lessons/attention", 30)
            back = [f.saw("/lessons/attention") - killed for f in followers]
            reconnected = sum(f.reconnects for f in followers) - reconnects_before

        await teacher.delete(f"/api/v1/classes/{code}", headers=auth)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    return {
        "delays": delays,
        "idle_cpu_per_s": idle_cpu / idle_s,
        "change_cpu": change_cpu,
        "change_s": change_s,
        "back": back,
        "reconnected": reconnected,
    }


def worker_pids(pid: int) -> list[int]:
    """A server and its worker processes (uvicorn's supervisor's children, from /proc)."""
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        children = []
    return [pid, *map(int, children)]


def report(title: str, result: dict, n: int, changes: int) -> bool:
    d = result["delays"]
    p95 = percentile(d, 95)
    print(
        table(
            f"{title}: teacher's change -> seen by every follower ({n} followers, {changes} changes)",
            ["p50 ms", "p95 ms", "max ms", f"p95 ≤ {P95_BUDGET_MS:.0f} ms"],
            [[f"{median(d):.1f}", f"{p95:.1f}", f"{max(d):.1f}", "yes" if p95 <= P95_BUDGET_MS else "NO"]],
        )
    )
    per_change_ms = 1000 * result["change_cpu"] / changes / n
    print(
        table(
            f"{title}: the server processes' CPU (user + system, /proc)",
            ["while", "CPU", "per follower"],
            [
                [
                    "idle (keep-alives)",
                    f"{100 * result['idle_cpu_per_s']:.1f} % of a core",
                    f"{100 * result['idle_cpu_per_s'] / n:.3f} %",
                ],
                [
                    f"{changes} changes in {result['change_s']:.1f} s",
                    f"{result['change_cpu']:.2f} s",
                    f"{per_change_ms:.2f} ms a change",
                ],
            ],
        )
    )
    back = result["back"]
    within = sum(1 for s in back if s <= BACK_WITHIN_S)
    if back:
        print(
            table(
                f"{title}: one replica killed mid-class, the teacher's next page reaches every follower",
                ["followers back", "within 5 s", "median s", "max s", "streams reopened"],
                [[n, within, f"{median(back):.2f}", f"{max(back):.2f}", result["reconnected"]]],
            )
        )
    return p95 <= P95_BUDGET_MS and within == len(back)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--followers", type=int, default=60)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument(
        "--store",
        choices=["redis", "workers", "one", "all"],
        default="all",
        help="redis: Caddy over two replicas; workers: `python -m app` with EXPLORER_WORKERS=2 and no Redis "
        "(classes in the SQLite file they share); one: one process (classes in memory); all: the first two",
    )
    args = parser.parse_args(argv)
    n, ok = args.followers, True
    print(f"load average at the start: {load_average()}")
    if args.store in ("redis", "all"):
        header("A live class: sixty followers through Caddy over two replicas (Redis)")
        with (
            services.redis_server() as server,
            services.replica(server.url) as a,
            services.replica(server.url) as b,
            services.caddy([a.hostport, b.hostport]) as proxy,
        ):
            result = asyncio.run(play(proxy.url, [a.pid, b.pid], a.kill, n, args.changes))
        ok &= report("Redis, 2 replicas", result, n, args.changes)
    for store in [s for s in ("workers", "one") if args.store in (s, "all" if s == "workers" else s)]:
        workers = 2 if store == "workers" else 1
        header(f"A live class: sixty followers on one server, {workers} worker process(es), no Redis")
        with tempfile.TemporaryDirectory() as runs:
            env = {"EXPLORER_WORKERS": str(workers), "EXPLORER_RUNS_DIR": runs, "EXPLORER_ACCESS_LOG": "false"}
            with liveserver.live_server(
                env=env, entry_point=True, python=APP_PYTHON if APP_PYTHON.exists() else None
            ) as s:
                time.sleep(1)  # the workers have started
                result = asyncio.run(play(s.url, worker_pids(s.pid), None, n, args.changes))
        title = "2 workers, SQLite file" if workers == 2 else "1 process, in memory"
        ok &= report(title, result, n, args.changes)
    print(f"load average at the end: {load_average()}")
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(main)
