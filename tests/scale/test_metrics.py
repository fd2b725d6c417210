"""/metrics (app/http/metrics.py): off by default; on, in Prometheus' text format, the requests of every
uvicorn worker process of a server added up (prometheus-client's multiprocess mode), the compute
limiter's refusals, and the training queue, runs and workers as Redis has them."""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.scale import services
from tests.scale.conftest import PICKUP_S, db_url, wait

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package)

DB = 3


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_off_by_default(client):
    assert client.get("/metrics").status_code == 404


def test_metrics_add_up_every_worker_process_and_tell_the_training_queue(redis_server):
    url = db_url(redis_server, DB)
    env = {
        "EXPLORER_REDIS_URL": url,
        "EXPLORER_METRICS": "true",
        "EXPLORER_WORKERS": "2",
        "EXPLORER_TRAIN_PICKUP_S": str(PICKUP_S),
        "EXPLORER_MAX_CONCURRENT_COMPUTE": "1",
        "EXPLORER_ACCESS_LOG": "false",
    }
    with (
        services.worker(url, train_pickup_s=PICKUP_S),
        liveserver.live_server(env=env, entry_point=True, startup_timeout_s=60) as server,
    ):
        with httpx.Client(base_url=server.url, timeout=30) as c:
            id = c.post("/api/v1/train", json={"recipe": "nasi-lemak", "steps": 20, "eval_interval": 10}).json()["id"]
            wait(c, id)
        for _ in range(25):  # new connections, so both worker processes answer some
            assert httpx.get(server.url + "/readyz", timeout=30).status_code == 200
        text = " ".join(["nasi lemak"] * 30)  # long enough that one computing view overlaps the next
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            codes = list(
                pool.map(
                    lambda _: (
                        httpx.get(server.url + "/", params={"model": "toy", "text": text}, timeout=60).status_code
                    ),
                    range(24),
                )
            )
        busy = codes.count(503)
        assert set(codes) <= {200, 503}
        answer = httpx.get(server.url + "/metrics", timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    got = samples(answer.text)
    readyz = (("method", "GET"), ("route", "/readyz"), ("status", "200"))
    assert got[("explorer_http_requests_total", readyz)] == 25
    assert got[("explorer_http_request_duration_seconds_count", readyz[:2])] == 25
    assert got[("explorer_http_requests_total", (("method", "GET"), ("route", "/"), ("status", "200")))] == 24 - busy
    assert got.get(("explorer_compute_rejections_total", ()), 0) == busy
    assert got[("explorer_training_runs", (("status", "done"),))] == 1
    assert got[("explorer_training_queue_length", ())] == 0
    assert got[("explorer_training_workers", ())] == 1 and got[("explorer_training_worker_nodes", ())] == 1
    assert got[("explorer_training_store_up", ())] == 1
    # two worker processes wrote their own counts, and the answer added them up
    folder = Path("/tmp") / f"explorer-metrics-{server.pid}"
    assert len({p.name.rsplit("_", 1)[-1] for p in folder.glob("counter_*.db")}) == 2
