"""Classroom: how many students one machine serves. Locust plays a class of students (bench/locustfile.py:
typing in bursts through the page's own debounce, switching heads and layers, opening lessons and
Inspect views) against a real server on 127.0.0.1, once as `make serve` runs it (`python -m app`
with its defaults: one worker) and once with two workers (EXPLORER_WORKERS=2).

    bench/.env/bin/python -m bench.classroom [--students 60] [--minutes 3] [--workers 1 2]

Server time is each request's `duration_ms` in the app's own access log (app/http/observability.py: from
the request's arrival to the last byte of its answer), so it does not include Locust's own
scheduling; the students' view (Locust's response times, which do) is printed beside it.
Budget: no errors, p95 server time <= 150 ms. docs/deployment.md's table "how many students one machine serves"
comes from this output.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import APP_PYTHON, ROOT, header, percentile, run_main, table, verdict

P95_BUDGET_MS = 150.0
LOCUST = Path(sys.executable).parent / "locust"


def server_durations(log: str) -> list[tuple[str, int, float]]:
    """(path, status, duration_ms) of every request in the access log."""
    out = []
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "request" and "duration_ms" in entry:
            out.append((entry["path"], int(entry["status"]), float(entry["duration_ms"])))
    return out


def run_class(workers: int, students: int, seconds: int) -> dict:
    env = {"EXPLORER_WORKERS": str(workers), "EXPLORER_ACCESS_LOG": "true"}
    with served_as_make_serve(env) as server, tempfile.TemporaryDirectory(prefix="classroom-") as tmp:
        # spawn the class over 10 s, as students arrive and open the link
        cmd = [
            str(LOCUST),
            "-f",
            str(ROOT / "bench" / "locustfile.py"),
            "--headless",
            "--host",
            server.url,
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
        if done.returncode not in (0, 1):  # 1: some requests failed, which the table reports
            raise RuntimeError(f"locust failed ({done.returncode}): {done.stderr[-2000:]}")
        with open(f"{tmp}/class_stats.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        with open(f"{tmp}/class_failures.csv", newline="") as f:
            failures = list(csv.DictReader(f))
        log = server.log()
    served = server_durations(log)
    return {
        "workers": workers,
        "students": students,
        "seconds": seconds,
        "locust": rows,
        "server": served,
        "failures": [[f["Name"], f["Error"][:90], f["Occurrences"]] for f in failures],
        "load": os.getloadavg()[0],
    }


def served_as_make_serve(env: dict[str, str]):
    """The app as `make serve` starts it (`python -m app`, so EXPLORER_WORKERS takes effect), from the
    app's own venv, on a free 127.0.0.1 port: scripts/liveserver.py's starter."""
    import liveserver  # scripts/, on the path through bench.common

    return liveserver.live_server(
        env={"HF_HUB_OFFLINE": "1", **env},
        entry_point=True,
        startup_timeout_s=60,
        python=APP_PYTHON if APP_PYTHON.exists() else Path(sys.executable),
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=60)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    header("Classroom: simulated students against one machine")
    seconds = int(args.minutes * 60)
    results = [run_class(w, args.students, seconds) for w in args.workers]

    summary = []
    for r in results:
        times = [d for _, _, d in r["server"]]
        errors = sum(1 for _, status, _ in r["server"] if status >= 400)
        total = next(row for row in r["locust"] if row["Name"] == "Aggregated")
        p95 = percentile(times, 95)
        summary.append(
            [
                f"{r['workers']} ({'make serve' if r['workers'] == 1 else 'EXPLORER_WORKERS=2'})",
                r["students"],
                f"{len(times) / r['seconds']:.1f}",
                f"{errors} + {total['Failure Count']}",
                f"{percentile(times, 50):.0f}",
                f"{p95:.0f}",
                f"{percentile(times, 99):.0f}",
                total["95%"],
                f"{r['load']:.1f}",
                verdict(errors == 0 and int(total["Failure Count"]) == 0 and p95 <= P95_BUDGET_MS),
            ]
        )
    print(
        table(
            f"{args.students} students for {args.minutes:g} min (server ms from the access log; "
            "students' ms from Locust)",
            [
                "workers",
                "students",
                "req/s",
                "errors (server + Locust)",
                "server p50",
                "server p95",
                "server p99",
                "students' p95",
                "load avg",
                f"p95 <= {P95_BUDGET_MS:.0f} ms, 0 errors",
            ],
            summary,
        )
    )
    for r in results:
        print(
            table(
                f"By request, {r['workers']} worker(s) (Locust's view, ms)",
                ["request", "count", "failures", "median", "p95", "p99", "max"],
                [
                    [
                        row["Name"],
                        row["Request Count"],
                        row["Failure Count"],
                        row["50%"],
                        row["95%"],
                        row["99%"],
                        f"{float(row['Max Response Time']):.0f}",
                    ]
                    for row in r["locust"]
                ],
            )
        )
        if r["failures"]:
            print(table(f"Failures, {r['workers']} worker(s)", ["request", "error", "count"], r["failures"]))
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "classroom.json").write_text(
        json.dumps([{k: v for k, v in r.items() if k != "server"} for r in results], indent=1)
    )
    return 0


if __name__ == "__main__":
    run_main(main)
