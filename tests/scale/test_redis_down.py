"""Redis down is not the site down (issue 32, item 9), with real parts (tests/scale/services.py): two replicas
behind Debian's caddy running deploy/Caddyfile, a Celery worker and redis-server. With Redis killed, every
replica's /readyz answers 200 "degraded" naming Redis, so Caddy keeps both in its rotation: the explorer, the
lessons, Inspect, circuits, generation and /api/v1/run answer 200 through Caddy, and training answers 503 with
the reason and Retry-After. Redis restarted, the replicas and the worker reconnect by themselves and a run
trains. A Redis that hangs instead (SIGSTOP) costs /readyz and a page a second at most. And over TLS: a Redis
with a certificate from a certificate authority the test makes, reached by the replica and the worker given
that authority (EXPLORER_REDIS_CA) and by nobody without it, Celery's broker included."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from app.api.health import STORE_CHECK_S
from app.settings import Settings, redis_connection_url
from app.training.redis_store import PING_TIMEOUT_S
from tests.scale import services
from tests.scale.conftest import PICKUP_S, wait

QUICK = {"recipe": "nasi-lemak", "steps": 40, "eval_interval": 10}
HEALTH_INTERVAL_S = 1  # PROXY_HEALTH_INTERVAL in services.caddy
# What needs no Redis, as a learner and a script use it: the explorer, a lesson, Inspect, circuits, the
# generation page and the API's run, lesson and generation.
SERVED = [
    ("GET", "/?model=toy", None),
    ("GET", "/lessons/attention", None),
    ("GET", "/inspect", None),
    ("GET", "/circuits", None),
    ("GET", "/generate", None),
    ("GET", "/api/v1/lessons/attention", None),
    ("POST", "/api/v1/run", {"model": "toy", "text": "Ali makan nasi"}),
    ("POST", "/api/v1/generate", {"model": "toy", "text": "Ali makan", "max_new_tokens": 4, "seed": 1}),
]


def status(url: str) -> dict:
    r = httpx.get(url + "/readyz", timeout=10)
    assert r.status_code == 200, r.text  # ready or degraded: never out of the proxy's rotation for Redis
    return r.json()


def test_redis_killed_under_two_replicas_behind_caddy():
    with (
        services.redis_server(password="a-school-secret") as redis,
        services.worker(redis.url, train_pickup_s=PICKUP_S) as worker,
        services.replica(redis.url, train_pickup_s=PICKUP_S) as a,
        services.replica(redis.url, train_pickup_s=PICKUP_S) as b,
        services.caddy([a.hostport, b.hostport]) as proxy,
        httpx.Client(base_url=proxy.url, timeout=60) as c,
    ):
        assert status(a.url)["status"] == status(b.url)["status"] == "ready"
        redis.kill()  # SIGKILL: the machine Redis ran on, lost
        for replica in (a, b):
            degraded = services.wait_until(
                lambda r=replica: status(r.url)["status"] == "degraded" and status(r.url), 10, "degraded"
            )
            assert len(degraded["reasons"]) == 1 and "Redis" in degraded["reasons"][0]
            assert "a-school-secret" not in str(degraded)
        time.sleep(3 * HEALTH_INTERVAL_S)  # Caddy has asked both replicas since: a 503 would take them out
        for _ in range(3):  # a few rounds, so both replicas answer some
            for method, path, body in SERVED:
                r = c.request(method, path, json=body)
                assert r.status_code == 200, (method, path, r.status_code, r.text[:300])
        for replica in (a, b):
            assert httpx.post(replica.url + "/api/v1/run", json=SERVED[6][2], timeout=60).status_code == 200
        train = c.post("/api/v1/train", json=QUICK)
        assert train.status_code == 503, train.text
        assert int(train.headers["retry-after"]) > 0
        assert "Redis" in train.json()["detail"][0]["msg"] and "a-school-secret" not in train.text
        assert c.get("/api/v1/runs").status_code == 503
        down_for = time.monotonic()

        redis.start()  # the same folder and port: what a restarted Redis is
        for replica in (a, b):
            services.wait_until(lambda r=replica: status(r.url)["status"] == "ready", 15, "ready again")
        started = c.post("/api/v1/train", json=QUICK)
        assert started.status_code == 202, started.text
        done = wait(c, started.json()["id"])  # the worker, never restarted, trains it
        assert done["status"] == "done", done
        assert worker.proc.poll() is None
        print(f"Redis back: a run trained {time.monotonic() - down_for:.1f} s after the restart")


def test_a_redis_that_hangs_costs_a_page_a_second_at_most():
    """SIGSTOP: Redis accepts connections and never answers (a command waits for the client's 10 s socket
    timeout). /readyz still answers 200 "degraded" within about STORE_CHECK_S, well inside Caddy's 3 s
    health_timeout, and a page that lists the models (trained runs among them) waits for one short ping at most
    (PING_TIMEOUT_S), then asks Redis nothing while it is known to be away (before: 20.2 s a page)."""
    with services.redis_server() as redis, services.replica(redis.url) as app:
        assert status(app.url)["status"] == "ready"
        httpx.get(app.url + "/?model=toy", timeout=60).raise_for_status()  # warm: the toy is drawn once
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(1.1)  # past the store's trusted ping (PING_EVERY_S)
            for path in ("/readyz", "/?model=toy", "/api/v1/models", "/readyz", "/?model=toy"):
                started = time.monotonic()
                r = httpx.get(app.url + path, timeout=60)
                took = time.monotonic() - started
                assert r.status_code == 200, (path, r.text[:300])
                assert took < PING_TIMEOUT_S + STORE_CHECK_S + 1.5, f"{path} took {took:.1f} s"
                if path == "/readyz":
                    assert r.json()["status"] == "degraded" and "Redis" in r.json()["reasons"][0], r.json()
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        services.wait_until(lambda: status(app.url)["status"] == "ready", 20, "ready again")


def test_rediss_with_a_certificate_authority_the_test_made():
    from celery import Celery

    from app.training import jobs
    from app.training.redis_store import RedisStore, Timing

    with services.redis_server(password="a-school-secret", tls=True) as redis:
        assert redis.url.startswith("rediss://")
        with (
            services.worker(redis.url, train_pickup_s=PICKUP_S, redis_ca=redis.ca),
            services.replica(redis.url, train_pickup_s=PICKUP_S, redis_ca=redis.ca) as app,
            httpx.Client(base_url=app.url, timeout=30) as c,
        ):
            assert c.get("/readyz").json() == {"status": "ready", "reasons": []}
            started = c.post("/api/v1/train", json=QUICK)
            assert started.status_code == 202, started.text
            assert wait(c, started.json()["id"])["status"] == "done"
        # Without the authority nobody connects: not the store (its readiness says why) ...
        unchecked = Settings(redis_url=redis.url)
        error = RedisStore.from_settings(unchecked).error or ""
        assert "certificate verify failed" in error and "a-school-secret" not in error
        # ... and not Celery's broker, which, handed the bare rediss:// URL, would not have checked at all
        broker = jobs.configure(redis_connection_url(unchecked), Timing(PICKUP_S), Celery("t", set_as_current=False))
        with pytest.raises(Exception, match="certificate verify failed"):
            with broker.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1)
        bare = jobs.configure(redis.url, Timing(PICKUP_S), Celery("bare", set_as_current=False))
        with bare.connection_for_write() as connection:  # what the worker did before EXPLORER_REDIS_CA
            connection.ensure_connection(max_retries=1)
            assert connection.ssl == {"ssl_cert_reqs": 0}  # ssl.CERT_NONE: any certificate would have done
