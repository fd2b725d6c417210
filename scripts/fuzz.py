"""Schema-driven fuzzing of a running server: schemathesis draws requests from /openapi.json, both
valid ones (positive) and ones that break the schema (negative), and we check each answer:
no 5xx ever, and every 4xx tells the user what to fix (a readable `detail`).

    .venv/bin/python scripts/fuzz.py --requests 2000        # starts its own server (make fuzz)
    .venv/bin/python scripts/fuzz.py --url http://127.0.0.1:8000 --requests 500

tests/security/test_fuzz_live.py calls `fuzz()` with a small budget against a live server.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import hypothesis
import hypothesis.errors
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from schemathesis import GenerationMode

MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


@dataclass
class Tally:
    requests: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_operation: Counter = field(default_factory=Counter)
    unsendable: int = 0  # cases the HTTP client itself cannot send (e.g. a header with a newline)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.by_status.items()))
        lines = [
            f"fuzz: {self.requests} requests, statuses {{{statuses}}}, "
            f"{self.unsendable} unsendable, {len(self.problems)} problems"
        ]
        lines += [f"  {op}: {n}" for op, n in sorted(self.by_operation.items())]
        lines += [f"  PROBLEM {p}" for p in self.problems[:20]]
        return "\n".join(lines)


def readable_message(response: requests.Response) -> str | None:
    """The message a 4xx gives its reader, or None if it gives none.

    Accepts FastAPI's shapes: {"detail": "text"} or {"detail": [{"msg": "text", ...}, ...]}."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return None
    if isinstance(detail, str):
        messages = [detail]
    elif isinstance(detail, list) and detail and all(isinstance(d, dict) for d in detail):
        messages = [d.get("msg") for d in detail]
    else:
        return None
    if not all(isinstance(m, str) and any(c.isalpha() for c in m) for m in messages):
        return None
    if any("Traceback" in m or "Internal Server Error" in m for m in messages):
        return None
    return "; ".join(messages)


def judge(case, response: requests.Response) -> str | None:
    """What is wrong with this answer, or None."""
    where = f"{case.method} {case.formatted_path} query={case.query!r} body={str(case.body)[:200]!r}"
    if response.status_code >= 500:
        return f"{response.status_code} for {where}: {response.text[:300]!r}"
    if 400 <= response.status_code < 500 and readable_message(response) is None:
        return f"{response.status_code} without a readable message for {where}: {response.text[:300]!r}"
    return None


def fuzz(base_url: str, examples_per_operation: int, *, seed: int = 0, tally: Tally | None = None) -> Tally:
    tally = tally or Tally()
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        for mode in MODES:

            @hypothesis.settings(
                max_examples=examples_per_operation,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
                derandomize=False,
            )
            @hypothesis.seed(seed)
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case):
                try:
                    response = case.call(base_url=base_url, session=session, timeout=60)
                except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, UnicodeError, ValueError):
                    tally.unsendable += 1
                    return
                tally.requests += 1
                tally.by_status[response.status_code] += 1
                tally.by_operation[label] += 1  # noqa: B023  (one() runs within this iteration)
                problem = judge(case, response)
                if problem:
                    tally.problems.append(problem)

            try:
                one()
            except hypothesis.errors.Unsatisfiable:
                pass  # nothing to break: e.g. no negative cases for an operation without inputs
    stop_training(base_url, session)
    return tally


def stop_training(base_url: str, session) -> None:
    """Cancel the training runs the fuzzing queued: valid POST /api/v1/train bodies are real runs, which
    would otherwise go on training (some of them for hours) after the fuzzing is over."""
    runs = session.get(base_url + "/api/v1/runs", timeout=60)
    if runs.status_code != 200:
        return  # training is off on that server
    for run in runs.json()["runs"]:
        if run["status"] in ("queued", "running"):
            session.delete(f"{base_url}/api/v1/runs/{run['id']}", timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server; default: start one on a free port")
    parser.add_argument("--requests", type=int, default=2000, help="fuzz until at least this many were sent")
    parser.add_argument("--examples", type=int, default=60, help="examples per operation and mode per round")
    args = parser.parse_args()

    def run(url: str) -> Tally:
        tally, seed, started = Tally(), 0, time.monotonic()
        while tally.requests < args.requests:
            before = tally.requests
            fuzz(url, args.examples, seed=seed, tally=tally)
            if tally.requests == before:
                sys.exit("fuzz: a round sent no request; is the schema empty?")
            seed += 1
            print(f"round {seed}: {tally.requests} requests so far, {len(tally.problems)} problems", flush=True)
        print(tally.summary())
        print(f"fuzz took {time.monotonic() - started:.0f} s")
        return tally

    if args.url:
        tally = run(args.url.rstrip("/"))
    else:
        from liveserver import live_server

        with live_server() as server:
            tally = run(server.url)
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(main())
