"""Training through the API, on a real server with real worker processes (scripts/liveserver.py), on both
stores: the runs folder with the server's own trainer processes (the embedded default), and Redis with a
Celery worker (`python -m app.worker`; tests/scale/services.py starts redis-server and the worker).

A run is a pure function of its request (one id, one training however many ask); it trains in a worker
process and reports through its store (app/training/); cancel, a killed server and a resume leave it
consistent; the event stream resumes where a client left it; bad settings are readable 422s; each
client and the server have a stated number of runs.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package)

from tests.scale import services  # noqa: E402

QUICK = {"recipe": "nasi-lemak", "steps": 40, "eval_interval": 10}  # trains in about a second
LONG = {"recipe": "nasi-lemak", "steps": 20000, "eval_interval": 50}  # long enough to stop or kill mid-run
WAIT_S = 120


PICKUP_S = 12  # the Redis mode's pickup time here: a cancel is seen within a heartbeat (0.7 s)


@pytest.fixture
def runs_dir(tmp_path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def redis_stack():
    """redis-server and one Celery worker (one training process), for every Redis-mode test of this module:
    each test uses seeds of its own and leaves no run queued or training."""
    with services.redis_server() as redis_server, services.worker(redis_server.url, train_pickup_s=PICKUP_S) as worker:
        yield redis_server, worker


@pytest.fixture(params=["folder", "redis"])
def store(request) -> str:
    return request.param


@pytest.fixture
def start(store, runs_dir, request):
    """start(**settings): a live server on this test's store, with these settings (EXPLORER_<NAME>)."""

    def start_server(**settings):
        env = {"EXPLORER_ACCESS_LOG": "false"} | {f"EXPLORER_{k.upper()}": str(v) for k, v in settings.items()}
        if store == "folder":
            return liveserver.live_server(env=env | {"EXPLORER_RUNS_DIR": str(runs_dir)})
        redis_server, _ = request.getfixturevalue("redis_stack")
        return liveserver.live_server(
            env=env | {"EXPLORER_REDIS_URL": redis_server.url, "EXPLORER_TRAIN_PICKUP_S": str(PICKUP_S)}
        )

    return start_server


@pytest.fixture(scope="module")
def redis_replica(redis_stack):
    """One replica on the module's Redis for the tests that need no settings of their own."""
    with liveserver.live_server(
        env={
            "EXPLORER_ACCESS_LOG": "false",
            "EXPLORER_REDIS_URL": redis_stack[0].url,
            "EXPLORER_TRAIN_PICKUP_S": str(PICKUP_S),
        }
    ) as s:
        yield s


@pytest.fixture
def server(store, start, request):
    if store == "redis":
        yield request.getfixturevalue("redis_replica")
        return
    with start() as s:
        yield s


def trainings(store: str, request, runs_dir: Path, id: str) -> int:
    """How many times the run was started: its trainer's log (folder), its stream's `running` events (Redis)."""
    if store == "folder":
        return (runs_dir / id / "trainer.log").is_file() + 0
    redis_server, _ = request.getfixturevalue("redis_stack")
    events = redis_server.client().xrange(f"explorer:run:{id}:events")
    return sum(
        fields[b"event"] == b"run" and json.loads(fields[b"data"])["status"] == "running" for _, fields in events
    )


def wait(client: httpx.Client, id: str, until=("done", "failed", "cancelled", "interrupted"), timeout=WAIT_S) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"/api/v1/runs/{id}").json()
        if run["status"] in until:
            return run
        assert time.monotonic() < deadline, f"{id} still {run['status']} at step {run['step']}"
        time.sleep(0.2)


def test_a_run_trains_in_a_worker_and_becomes_a_model(store, server, runs_dir):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/api/v1/train", json=QUICK)
        assert r.status_code == 202, r.text
        body = r.json()
        id = body["id"]
        assert id.startswith("nasi-lemak-") and body["links"]["events"] == f"/api/v1/runs/{id}/events"
        run = wait(c, id)
        assert run["status"] == "done" and run["step"] == QUICK["steps"] and run["model"] == id
        assert run["metrics"]["step"] == [0, 10, 20, 30, 40] and len(run["heads"]["induction"]) == 5
        # the spec's claim: after training, 'l' follows "nasi " more likely than at the start
        assert run["metrics"]["target"][-1] > run["metrics"]["target"][0]
        # the trained run is a model every endpoint takes, and it says what the run recorded
        top = c.post("/api/v1/run", json={"model": id, "text": "nasi ", "top_k": 9}).json()["top_k"]
        assert abs({t["token"]: t["prob"] for t in top}["l"] - run["metrics"]["target"][-1]) < 1e-5
        assert id in [m["name"] for m in c.get("/api/v1/models").json()["models"]]
        assert c.get("/", params={"model": id, "text": "nasi "}).status_code == 200
        assert c.get("/inspect", params={"model": id, "text": "nasi nasi ", "view": "lens"}).status_code == 200
        # the checkpoint: a zip of a Hugging Face GPT-2 folder
        z = zipfile.ZipFile(io.BytesIO(c.get(f"/api/v1/runs/{id}/checkpoint").content))
        names = {Path(n).name for n in z.namelist()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
        assert json.loads(z.read(f"{id}/config.json"))["model_type"] == "gpt2"
        # the same request is the same run, done already
        again = c.post("/api/v1/train", json=QUICK).json()
        assert again["id"] == id and again["status"] == "done" and not again["queued"]
    if store == "folder":
        assert (runs_dir / id / "state.json").is_file() and not list(runs_dir.glob(".new-*"))


def test_thirty_identical_requests_make_one_run_and_one_training(store, server, runs_dir, request):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with concurrent.futures.ThreadPoolExecutor(30) as pool:
            answers = list(pool.map(lambda _: c.post("/api/v1/train", json=QUICK | {"seed": 7}), range(30)))
        assert {a.status_code for a in answers} == {202}
        ids = {a.json()["id"] for a in answers}
        assert len(ids) == 1
        assert sum(a.json()["queued"] for a in answers) == 1  # exactly one of them created it
        id = ids.pop()
        wait(c, id)
    assert trainings(store, request, runs_dir, id) == 1
    if store == "folder":
        assert [p.name for p in runs_dir.iterdir() if not p.name.startswith(".")] == [id]
        log = (runs_dir / id / "trainer.log").read_text()
        assert (runs_dir / id / "state.json").is_file() and log.count("Traceback") == 0


def test_cancel_keeps_a_consistent_run_and_a_repeat_resumes_it(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        id = c.post("/api/v1/train", json=LONG).json()["id"]
        run = wait(c, id, until=("running",))
        while run["step"] < 60:
            run = c.get(f"/api/v1/runs/{id}").json()
            time.sleep(0.1)
        stopped = c.delete(f"/api/v1/runs/{id}")
        assert stopped.status_code == 200
        run = wait(c, id)
        assert run["status"] == "cancelled" and run["resumable"] and run["model"] == id
        assert 60 <= run["step"] < LONG["steps"]
        at = run["step"]
        # pressing Start again continues from the snapshot, not from zero
        again = c.post("/api/v1/train", json=LONG).json()
        assert again["id"] == id and again["queued"]
        run = wait(c, id, until=("running",))
        assert run["step"] >= 50 * (at // 50)
        c.delete(f"/api/v1/runs/{id}")
        wait(c, id)


def test_events_stream_and_resume_after_a_dropped_connection(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        id = c.post("/api/v1/train", json=QUICK | {"seed": 3, "steps": 400, "eval_interval": 20}).json()["id"]
        seen, last_id = [], None
        with c.stream("GET", f"/api/v1/runs/{id}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for event in services.parse_events(stream.iter_lines()):
                seen.append(event)
                last_id = event.get("id", last_id)
                if sum(e["event"] == "record" for e in seen) >= 2:
                    break  # drop the connection mid-run
        assert seen[0]["event"] == "run"  # the whole run first
        with c.stream("GET", f"/api/v1/runs/{id}/events", headers={"Last-Event-ID": last_id}) as stream:
            rest = list(services.parse_events(stream.iter_lines()))
        assert rest[-1]["event"] == "end"
        run = c.get(f"/api/v1/runs/{id}").json()
        # every record exactly once across the two connections (the final `run` event carries them all)
        steps = [json.loads(e["data"])["step"] for e in seen + rest if e["event"] == "record"]
        assert steps == sorted(set(steps)) and set(steps) <= set(run["metrics"]["step"])
        finals = [json.loads(e["data"]) for e in rest if e["event"] == "run"]
        assert finals and finals[-1]["status"] == "done" and finals[-1]["metrics"] == run["metrics"]


def test_a_killed_server_leaves_finished_runs_intact_and_the_cut_one_interrupted(store, start):
    """(With Redis a Celery worker trains the run, not the server: the run goes on without it.)"""
    with start() as first, httpx.Client(base_url=first.url, timeout=60) as c:
        done_id = c.post("/api/v1/train", json=QUICK | {"seed": 11}).json()["id"]
        wait(c, done_id)
        cut_id = c.post("/api/v1/train", json=LONG | {"seed": 11}).json()["id"]
        run = wait(c, cut_id, until=("running",))
        while run["step"] < 60:
            run = c.get(f"/api/v1/runs/{cut_id}").json()
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)  # no shutdown: the trainer dies with it
        time.sleep(1)
    with start() as second, httpx.Client(base_url=second.url, timeout=60) as c:
        done = c.get(f"/api/v1/runs/{done_id}").json()
        assert done["status"] == "done" and done["step"] == QUICK["steps"]
        cut = c.get(f"/api/v1/runs/{cut_id}").json()
        if store == "redis":
            assert cut["status"] == "running" and cut["worker"] is not None and cut["step"] >= 60
            c.delete(f"/api/v1/runs/{cut_id}")
            assert wait(c, cut_id)["status"] == "cancelled"
            return
        assert cut["status"] == "interrupted" and cut["resumable"]
        assert c.post("/api/v1/train", json=LONG | {"seed": 11, "steps": LONG["steps"]}).json()["queued"]
        resumed = wait(c, cut_id, until=("running",))
        assert resumed["step"] >= 50
        c.delete(f"/api/v1/runs/{cut_id}")
        assert wait(c, cut_id)["status"] == "cancelled"


@pytest.mark.parametrize(
    "body, says",
    [
        ({"recipe": "induction", "d_model": 30, "n_heads": 4}, "not divisible"),
        ({"recipe": "induction", "steps": 0}, "steps"),
        ({"recipe": "nope"}, "recipe"),
        ({"recipe": "text", "text": " "}, "text"),
        ({"recipe": "induction", "seq_len": 4}, "seq_len"),
    ],
)
def test_bad_settings_are_readable_422s(client, body, says):
    r = client.post("/api/v1/train", json=body)
    assert r.status_code == 422, r.text
    assert says in " ".join(d["msg"] for d in r.json()["detail"])


@pytest.mark.parametrize(
    "name",
    [
        "induction-3f2a9c1b7d0e",
        "nasi-lemak-0123456789ab",
        "a-0123456789ab",  # the shortest
        "a" * 51 + "-0123456789ab",  # the longest: 64 characters
        "a" * 52 + "-0123456789ab",
        "Induction-3f2a9c1b7d0e",
        "induction-3F2A9C1B7D0E",
        "induction-3f2a9c1b7d0",
        "induction-3f2a9c1b7d0e0",
        "induction3f2a9c1b7d0e",
        "-0123456789ab",
        "x_y-0123456789ab",
        "x.y-0123456789ab",
        "x%20y-0123456789ab",
    ],
)
def test_the_api_and_the_store_agree_on_what_a_run_id_is(client_with, runs_dir, name):
    """The path's pattern and the store's check are one (app/training/base.py RUN_ID_PATTERN): what the API
    refuses with 422 is exactly what the store would refuse, and every recipe's ids pass both."""
    from app.training.base import is_training_run_id, training_run_id
    from core.recipes import RECIPES
    from core.run_settings import settings as train_settings

    assert all(is_training_run_id(training_run_id(train_settings(recipe))) for recipe in RECIPES)
    r = client_with(runs_dir=runs_dir).get(f"/api/v1/runs/{name}")
    assert r.status_code == (404 if is_training_run_id(name.replace("%20", " ")) else 422), r.text


@pytest.mark.parametrize("per_client, total, status", [(2, 10, 429), (10, 2, 503)])
def test_each_client_and_the_server_have_a_limit(start, per_client, total, status):
    with (
        start(train_workers=1, train_max_per_client=per_client, train_max_runs=total) as s,
        httpx.Client(base_url=s.url, timeout=60) as c,
    ):
        ids = [c.post("/api/v1/train", json=LONG | {"seed": seed + 100 * total}).json()["id"] for seed in (1, 2)]
        third = c.post("/api/v1/train", json=LONG | {"seed": 3 + 100 * total})
        assert third.status_code == status and int(third.headers["retry-after"]) > 0
        assert "2 run" in third.json()["detail"][0]["msg"]
        wait(c, ids[0], until=("running",))
        queued = c.get(f"/api/v1/runs/{ids[1]}").json()
        assert queued["status"] == "queued" and queued["queue_position"] == 1  # one worker: the second waits
        for id in ids:
            c.delete(f"/api/v1/runs/{id}")
        for id in ids:
            wait(c, id)


def test_training_off_says_so(client_with, runs_dir):
    c = client_with(runs_dir=runs_dir, train_workers=0)
    r = c.post("/api/v1/train", json=QUICK)
    assert r.status_code == 503 and "EXPLORER_TRAIN_WORKERS=0" in r.json()["detail"][0]["msg"]
    assert c.get("/train").status_code == 200  # the page still opens, and says why when Start is pressed


def test_the_runs_folder_keeps_within_its_size(store, start, runs_dir, request):
    """EXPLORER_RUNS_MAX_MB: starting a run deletes the oldest finished ones beyond the cap."""
    with start(runs_max_mb=1) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        first = c.post("/api/v1/train", json=QUICK | {"seed": 21}).json()["id"]
        wait(c, first)
        if store == "folder":
            (runs_dir / first / "padding").write_bytes(b"\0" * 2**20)  # the folder is now over 1 MB
        else:
            request.getfixturevalue("redis_stack")[0].client().hset(f"explorer:run:{first}", "padding", b"\0" * 2**20)
        second = c.post("/api/v1/train", json=QUICK | {"seed": 22}).json()["id"]
        assert c.get(f"/api/v1/runs/{first}").status_code == 404
        if store == "folder":
            assert not (runs_dir / first).exists()
        wait(c, second)
        assert c.get(f"/api/v1/runs/{second}").json()["status"] == "done"
