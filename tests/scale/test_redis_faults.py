"""Bad input and faults in the Redis mode: Redis unreachable when a replica starts; Redis restarted (its
append-only file keeps every finished run with its weights, and the queued runs queued, their Celery
messages too); Redis lost mid-run (the run is marked interrupted, not lost, and the worker carries on);
a worker on an older code version (it refuses the run, saying why, and leaves it for another). Each with
a Redis of its own, with a password as a school's would have."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from app import __version__
from app.training import open_redis
from app.training.redis_store import RedisStore, Timing
from core.run_settings import settings as train_settings
from tests.scale import services
from tests.scale.conftest import PICKUP_S, wait

QUICK = {"recipe": "nasi-lemak", "steps": 40, "eval_interval": 10}


@pytest.fixture
def redis_with_password():
    with services.redis_server(password="a-school-secret") as server:
        yield server


def test_redis_unreachable_when_a_replica_starts():
    """/readyz says why, degraded (so Caddy still sends the replica traffic); pages that need no training still
    work; a training request is a 503 that says what to check. The password never shows."""
    closed = f"redis://:pw-not-shown@127.0.0.1:{services.free_port()}/0"
    with services.replica(closed) as app, httpx.Client(base_url=app.url, timeout=30) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert "EXPLORER_REDIS_URL" in " ".join(ready.json()["reasons"])
        for path in ("/", "/lessons/attention", "/params", "/inspect", "/train", "/api/v1/models"):
            assert c.get(path).status_code == 200, path
        assert c.post("/api/v1/run", json={"model": "toy", "text": "Ali makan"}).status_code == 200
        r = c.post("/api/v1/train", json=QUICK)
        assert r.status_code == 503 and "cannot be reached" in r.json()["detail"][0]["msg"]
        assert int(r.headers["retry-after"]) > 0
        assert "pw-not-shown" not in ready.text + r.text


def test_redis_restarted_keeps_finished_runs_their_weights_and_the_queue(redis_with_password):
    redis = redis_with_password
    with services.replica(redis.url) as app, httpx.Client(base_url=app.url, timeout=30) as c:
        with services.worker(redis.url, train_pickup_s=PICKUP_S):
            done_id = c.post("/api/v1/train", json=QUICK | {"seed": 81}).json()["id"]
            wait(c, done_id)
            weights = c.get(f"/api/v1/runs/{done_id}/checkpoint").content
        # no worker now: these wait in the queue (and their messages in the broker)
        queued = [c.post("/api/v1/train", json=QUICK | {"seed": s}).json()["id"] for s in (82, 83)]
        before = c.get("/api/v1/runs").json()["runs"]
        redis.stop()  # SIGTERM: Redis ends its append-only file and exits
        assert c.post("/api/v1/train", json=QUICK | {"seed": 84}).status_code == 503
        redis.start()  # the same folder: the append-only file is read back
        services.wait_until(lambda: c.get("/readyz").json()["status"] == "ready", 10, "ready again")
        after = c.get("/api/v1/runs").json()["runs"]
        assert after == before
        assert c.get(f"/api/v1/runs/{done_id}").json()["status"] == "done"
        assert c.get(f"/api/v1/runs/{done_id}/checkpoint").content == weights
        assert [c.get(f"/api/v1/runs/{id}").json()["queue_position"] for id in queued] == [1, 2]
        with services.worker(redis.url, train_pickup_s=PICKUP_S):  # their messages survived: they train
            for id in queued:
                assert wait(c, id)["status"] == "done"


def test_redis_lost_mid_run_marks_the_run_interrupted_and_the_worker_goes_on(redis_with_password):
    redis = redis_with_password
    long = {"recipe": "nasi-lemak", "steps": 20000, "eval_interval": 20}  # a snapshot every 100 steps
    with (
        services.replica(redis.url) as app,
        httpx.Client(base_url=app.url, timeout=30) as c,
        services.worker(redis.url, train_pickup_s=PICKUP_S) as worker,
    ):
        id = c.post("/api/v1/train", json=long | {"seed": 91}).json()["id"]
        wait(
            c, id, until=("running",), check=lambda r: max(r["metrics"]["step"], default=0) >= 200
        )  # snapshot 200 written
        time.sleep(1.1)  # and in the append-only file (fsync every second)
        redis.kill()  # SIGKILL: the machine Redis ran on, lost
        time.sleep(1.0)
        redis.start()
        run = wait(c, id, until=("interrupted",), timeout=30)
        assert run["resumable"] and "Redis was unreachable" in run["error"] and run["step"] >= 200
        assert "Redis went away mid-run" in worker.log()
        # the same worker, reconnected, takes the run up again from its snapshot
        again = c.post("/api/v1/train", json=long | {"seed": 91})
        assert again.status_code == 202 and again.json()["queued"]
        resumed = wait(c, id, until=("running",), check=lambda r: r["worker"] is not None)
        assert resumed["worker"]["pid"] in worker.pids() and resumed["step"] >= 200
        c.delete(f"/api/v1/runs/{id}")
        assert wait(c, id)["status"] == "cancelled"


def older_app(folder: Path, version: str) -> Path:
    """This repository's app/ as an older release would ship it: the same code, an older version."""
    repo = services.REPO
    shutil.copytree(repo / "app", folder / "app", ignore=shutil.ignore_patterns("__pycache__"))
    init = folder / "app" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', f'__version__ = "{version}"'))
    (folder / "core").symlink_to(repo / "core")
    return folder


def test_a_worker_on_an_older_version_refuses_the_run(redis_with_password):
    redis = redis_with_password
    store = open_redis(redis.url, 2**20, Timing(PICKUP_S))
    with tempfile.TemporaryDirectory(prefix="explorer-older-") as tmp:
        old = older_app(Path(tmp), "0.0.1")
        with services.worker(redis.url, cwd=old, train_pickup_s=PICKUP_S) as stale:
            id, created = store.create(train_settings("nasi-lemak", steps=40, eval_interval=10, seed=95), "t")
            services.wait_until(lambda: "refusing run" in stale.log(), 30, "the old worker refusing the run")
            assert f"queued by version {__version__} and this worker runs 0.0.1" in stale.log()
            assert store.info(id).status == "queued" and "Traceback" not in stale.log()
        with services.worker(redis.url, train_pickup_s=PICKUP_S):  # a current worker takes it
            services.wait_until(lambda: store.info(id).status == "done", 60, "trained by the current worker")


def dies_before_sending(id: str) -> None:
    """The `send` of a replica that creates a run in Redis and dies (or finds the broker refusing) before its
    task is sent."""
    raise RuntimeError("the replica died here")


def test_a_run_whose_task_was_never_sent_is_not_lost(redis_with_password):
    """Between creating a run and sending its task a replica may die: the same request made again sends it
    (after SEND_GRACE_S), and a run nobody asks for again is sent by a running worker's sweep once it has
    waited Timing.unsent_s. Either way it trains once."""
    from app.training.base import training_run_id
    from app.training.redis_store import SEND_GRACE_S, run_key
    from app.worker import REGISTER_EVERY_S

    redis = redis_with_password
    r, timing = redis.client(), Timing(PICKUP_S)
    dying = RedisStore(redis.url, 2**20, timing, send=dies_before_sending)
    store = open_redis(redis.url, 2**20, timing)
    asked_again, forgotten = (train_settings("nasi-lemak", steps=40, eval_interval=10, seed=s) for s in (96, 97))
    ids = [training_run_id(s) for s in (asked_again, forgotten)]
    with pytest.raises(RuntimeError, match="the replica died here"):
        dying.create(asked_again, "t")
    assert store.info(ids[0]).status == "queued" and r.hget(run_key(ids[0]), "sent") is None
    assert store.create(asked_again, "t") == (ids[0], False) and r.hget(run_key(ids[0]), "sent") is None  # too soon
    time.sleep(SEND_GRACE_S + 0.2)
    assert store.create(asked_again, "t") == (ids[0], False) and r.hget(run_key(ids[0]), "sent") is not None
    with services.worker(redis.url, train_pickup_s=PICKUP_S) as w:
        services.wait_until(lambda: store.info(ids[0]).status == "done", 60, "the run asked for again trained")
        with pytest.raises(RuntimeError, match="the replica died here"):
            dying.create(forgotten, "t")  # the worker is running: only its sweep can find this one
        assert store.unsent() == []  # not before Timing.unsent_s
        started = time.monotonic()
        services.wait_until(
            lambda: f"run {ids[1]} was queued more than" in w.log(),
            timing.unsent_s + 2 * REGISTER_EVERY_S + 5,
            "the worker's sweep sending it",
        )
        assert time.monotonic() - started < timing.unsent_s + 2 * REGISTER_EVERY_S + 5
        services.wait_until(lambda: store.info(ids[1]).status == "done", 60, "the forgotten run trained")
    for id in ids:
        events = r.xrange(f"explorer:run:{id}:events")
        assert sum(1 for _, f in events if f[b"event"] == b"run" and b'"running"' in f[b"data"]) == 1  # once


def test_a_worker_takes_only_its_own_task_and_only_json(redis_with_password):
    """Whoever reaches the broker cannot make a worker run code: a task name that is not the project's (one
    of Celery's own built-in tasks included) is refused as unregistered, a pickled message is refused
    unread, and neither runs."""
    from celery import Celery

    from app.training.jobs import QUEUE, TASK

    redis = redis_with_password
    with services.worker(redis.url) as worker:
        intruder = Celery("intruder", broker=redis.url, set_as_current=False)
        intruder.send_task("celery.accumulate", args=[1, 2], queue=QUEUE)
        intruder.send_task("app.training.jobs.anything", args=[], queue=QUEUE)
        intruder.send_task(TASK, args=["nasi-lemak-000000000000", __version__], queue=QUEUE, serializer="pickle")
        services.wait_until(
            lambda: (
                worker.log().count("Received unregistered task") == 2
                and "untrusted content of type pickle" in worker.log()
            ),
            30,
            "the worker refusing them",
        )
        assert "succeeded" not in worker.log() and worker.proc.poll() is None
