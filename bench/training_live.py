"""Training beside the pages: while two runs train in their worker processes on this 2-core machine,
do /healthz and an explorer view still answer? And how often does a run's event stream report?

    bench/.env/bin/python -m bench.training_live [--seconds 20] [--requests 60]

One real server (its own venv, EXPLORER_TRAIN_WORKERS=2, a fresh runs folder). First the latency of
GET /healthz and of the explorer's htmx request with no training (the peer), then the same while two
long induction runs train side by side; medians and p95, and the ratio. Then the default induction
recipe from its start: progress events per second on GET /api/v1/runs/{id}/events.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import httpx

from bench.common import header, live_server, median, percentile, run_main, table

EXPLORER = ("/", {"model": "induction", "text": "Ali makan nasi lemak. Ali makan nasi lemak."}, {"HX-Request": "true"})
LONG = {"recipe": "induction", "steps": 20_000}  # trains for minutes: longer than the measurement


def latencies(client: httpx.Client, path: str, params: dict, headers: dict, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(path, params=params, headers=headers)
        out.append((time.perf_counter() - t0) * 1e3)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
    return out


def measure(client: httpx.Client, n: int) -> dict[str, list[float]]:
    return {
        "GET /healthz": latencies(client, "/healthz", {}, {}, n),
        "explorer view (htmx, 43 tokens)": latencies(client, *EXPLORER, n),
    }


def progress_rate(client: httpx.Client, seconds: float) -> tuple[float, int, int]:
    """Progress events per second on the default recipe's stream, over its first `seconds` of training."""
    id = client.post("/api/v1/train", json={"recipe": "induction", "seed": 12345}).json()["id"]
    progress = records = 0
    t0 = None
    with client.stream("GET", f"/api/v1/runs/{id}/events", timeout=None) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
                if event == "progress":
                    t0 = t0 or time.perf_counter()
                    progress += 1
                records += event == "record"
                if event == "end" or (t0 and time.perf_counter() - t0 > seconds):
                    break
    client.delete(f"/api/v1/runs/{id}")
    return progress / (time.perf_counter() - t0), progress, records


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60, help="requests per endpoint and condition")
    ap.add_argument("--seconds", type=float, default=10, help="how long to count progress events")
    args = ap.parse_args(argv)
    header("Training beside the pages: two runs in worker processes, 2 cores")
    with (
        tempfile.TemporaryDirectory(prefix="bench-runs-") as runs,
        live_server(
            env={
                "EXPLORER_ACCESS_LOG": "false",
                "EXPLORER_RUNS_DIR": runs,
                "EXPLORER_TRAIN_WORKERS": "2",
                "EXPLORER_TRAIN_MAX_PER_CLIENT": "4",
            }
        ) as server,
        httpx.Client(base_url=server.url, timeout=120) as c,
    ):
        measure(c, 5)  # warm-up: the model's weights, the page's first render
        idle = measure(c, args.requests)
        ids = [c.post("/api/v1/train", json=LONG | {"seed": seed}).json()["id"] for seed in (1, 2)]
        deadline = time.monotonic() + 60
        while sum(c.get(f"/api/v1/runs/{i}").json()["status"] == "running" for i in ids) < 2:
            assert time.monotonic() < deadline, "the two runs did not start"
            time.sleep(0.2)
        busy = measure(c, args.requests)
        steps = [c.get(f"/api/v1/runs/{i}").json()["step"] for i in ids]
        for i in ids:
            c.delete(f"/api/v1/runs/{i}")
        rows = []
        for name in idle:
            rows.append(
                [
                    name,
                    f"{median(idle[name]):.1f}",
                    f"{percentile(idle[name], 95):.1f}",
                    f"{median(busy[name]):.1f}",
                    f"{percentile(busy[name], 95):.1f}",
                    f"{percentile(busy[name], 95) / percentile(idle[name], 95):.1f}×",
                ]
            )
        print(
            table(
                f"Latency, ms ({args.requests} requests each; the two runs had reached steps {steps})",
                ["request", "idle p50", "idle p95", "2 runs training p50", "p95", "p95 ratio"],
                rows,
            )
        )
        # give the two cancelled runs' workers a moment to stop before counting the default run's events
        time.sleep(2)
        rate, n, records = progress_rate(c, args.seconds)
        print(
            table(
                "The default induction run's event stream",
                ["progress events / s", "progress events", "records"],
                [[f"{rate:.1f}", n, records]],
            )
        )
    return 0


if __name__ == "__main__":
    run_main(main)
