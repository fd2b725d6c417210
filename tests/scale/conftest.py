"""Beyond one machine, checked with real parts (tests/scale/services.py): Debian's redis-server, Celery
workers (`python -m app.worker`), app replicas and Debian's caddy, on free 127.0.0.1 ports. One Redis
serves the session; each test module takes a database of its own (its workers and replicas with it), so
a module's kills and restarts touch nobody else's runs.

The pickup time is short here (PICKUP_S): a run whose worker machine died is taken up within it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.scale import services

PICKUP_S = 12  # EXPLORER_TRAIN_PICKUP_S in these tests: lease 2 s, visibility timeout 8 s, sweeps every 2 s
WAIT_S = 120


@pytest.fixture(scope="session")
def redis_server() -> Iterator[services.RedisServer]:
    with services.redis_server() as server:
        yield server


def db_url(server: services.RedisServer, db: int) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{db}"


def wait(
    client: httpx.Client, id: str, until=("done", "failed", "cancelled", "interrupted"), timeout=WAIT_S, check=None
) -> dict:
    """The run once its status is one of `until` (and `check(run)` holds, if given)."""
    return services.wait_until(lambda: _run_if(client, id, until, check), timeout, f"run {id} {until}", 0.1)


def _run_if(client: httpx.Client, id: str, until, check) -> dict | None:
    run = client.get(f"/api/v1/runs/{id}").json()
    return run if run["status"] in until and (check is None or check(run)) else None
