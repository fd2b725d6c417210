"""Live classes in the embedded mode (the store in process): the API's contract, its security rules, and
followers in step, read from a real server's event stream (issue 35)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.classes import open_class_store
from app.classes.base import ALPHABET, CODE_LENGTH, ClassFull, ClassNotFound
from app.classes.memory import MemoryClassStore
from app.classes.sqlite_store import SQLiteClassStore, class_file
from app.main import create_app
from app.service.classes import check_path
from app.settings import Settings
from core.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scale"))
from services import parse_events  # noqa: E402


@pytest.fixture
def clients():
    """clients(n, **settings): n clients of one app (one class store), each with its own cookies: a
    teacher and students. The first runs the app's lifespan."""
    opened = []

    def make(n: int = 1, **changes) -> list[TestClient]:
        app = create_app(Settings(**changes))
        first = TestClient(app).__enter__()
        opened.append(first)
        return [first, *(TestClient(app) for _ in range(n - 1))]

    yield make
    for c in opened:
        c.__exit__(None, None, None)


def start(client, path="/lessons/attention"):
    r = client.post("/api/v1/classes", json={"path": path})
    assert r.status_code == 201, r.text
    return r.json()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


# ------------------------------------------------------------------ the contract


def test_starting_a_class_gives_a_code_a_join_link_and_a_secret_kept_out_of_urls(clients):
    (client,) = clients()
    body = start(client)
    assert len(body["code"]) >= 6 and set(body["code"]) <= set(ALPHABET) and len(body["code"]) == CODE_LENGTH
    assert body["join_url"] == f"/class/{body['code']}" and body["teacher_token"] not in body["join_url"]
    cookie = client.cookies.get(f"explorer_teacher_{body['code']}")
    assert cookie == body["teacher_token"]
    state = client.get(f"/api/v1/classes/{body['code']}").json()
    assert state == {"code": body["code"], "path": "/lessons/attention", "students": 0, "poll": None}


def test_only_the_teacher_drives(clients):
    teacher, student = clients(2)
    body = start(teacher)
    code, url = body["code"], f"/api/v1/classes/{body['code']}/state"
    refused = student.put(url, json={"path": "/"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert student.put(url, json={"path": "/"}, headers=bearer("not-the-token")).status_code == 403
    assert (
        student.post(f"/api/v1/classes/{code}/polls", json={"question": "q", "options": ["a", "b"]}).status_code == 401
    )
    assert student.delete(f"/api/v1/classes/{code}", headers=bearer("x")).status_code == 403
    by_header = student.put(url, json={"path": "/?text=abc"}, headers=bearer(body["teacher_token"]))
    assert by_header.status_code == 200 and by_header.json()["path"] == "/?text=abc"
    by_cookie = teacher.put(url, json={"path": "/inspect?view=lens"})  # the teacher's HttpOnly cookie
    assert by_cookie.status_code == 200
    assert student.get(f"/api/v1/classes/{code}").json()["path"] == "/inspect?view=lens"


@pytest.mark.parametrize(
    "path",
    [
        "https://example.com/",
        "//example.com/",
        "/api/v1/run",
        "/docs",
        "/class/ABCDEFGH",
        "javascript:alert(1)",
        "lessons/attention",
        "/\\example.com",
        "/static/js/explorer.js",
        "/" + "a" * 9000,
    ],
)
def test_a_pushed_path_must_be_one_of_this_sites_pages(clients, path):
    (teacher,) = clients()
    code = start(teacher)["code"]
    r = teacher.put(f"/api/v1/classes/{code}/state", json={"path": path})
    assert r.status_code == 422, r.text
    assert teacher.get(f"/api/v1/classes/{code}").json()["path"] == "/lessons/attention"  # nothing changed


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/?text=Ali+makan&layer=1&cell=2,0",
        "/lessons/attention?d_k=3",
        "/inspect?view=lens",
        "/circuits",
        "/generate",
        "/features?model=induction&sae=x",
    ],
)
def test_every_page_a_teacher_shows_is_accepted(path):
    assert check_path(path) == path


def test_wrong_codes_are_rate_limited_per_client(clients):
    (client,) = clients(class_max_wrong_codes=3)
    for _ in range(3):
        assert client.get("/api/v1/classes/ACDEFGHJ").status_code == 404
    limited = client.get("/api/v1/classes/ACDEFGHJ")
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    code = start(client)["code"]
    assert client.get(f"/api/v1/classes/{code}").status_code == 429  # even a right code, until the minute is over
    assert client.get("/api/v1/classes/bad!code").status_code == 429


def test_polls_take_one_answer_per_student_and_the_teacher_reveals(clients):
    teacher, *students = clients(4)
    code = start(teacher)["code"]
    poll = teacher.post(
        f"/api/v1/classes/{code}/polls", json={"question": "Which token comes next?", "options": ["a", "k", "␣"]}
    )
    assert poll.status_code == 201 and poll.json()["counts"] == [0, 0, 0]
    pid = poll.json()["id"]
    for s, option in zip(students, ["a", "k", "k"]):
        assert s.post(f"/api/v1/classes/{code}/polls/{pid}/answers", json={"option": option}).status_code == 200
    students[0].post(f"/api/v1/classes/{code}/polls/{pid}/answers", json={"option": "k"})  # replaces "a"
    assert teacher.get(f"/api/v1/classes/{code}/polls/{pid}").json()["counts"] == [0, 3, 0]
    wrong = students[1].post(f"/api/v1/classes/{code}/polls/{pid}/answers", json={"option": "z"})
    assert wrong.status_code == 422 and "choose one of a, k, ␣" in wrong.json()["detail"][0]["msg"]
    closed = teacher.post(f"/api/v1/classes/{code}/polls/{pid}/close", json={"answer": "k"}).json()
    assert closed["closed"] and closed["answer"] == "k" and closed["counts"] == [0, 3, 0]
    late = students[2].post(f"/api/v1/classes/{code}/polls/{pid}/answers", json={"option": "a"})
    assert late.status_code == 404
    assert teacher.get(f"/api/v1/classes/{code}").json()["students"] == 3


def _best_head(client, model: str) -> tuple[str, float]:
    """The head with the highest induction score on the repeated random sequence, from the detectors API."""
    grid = client.post("/api/v1/analysis/detectors", json={"model": model, "text": "a b"}).json()["detectors"]
    scores = np.array(grid["induction"]["random"], dtype=float)
    layer, head = np.unravel_index(np.nanargmax(scores), scores.shape)
    return f"L{layer}H{head}", float(scores[layer, head])


def test_the_server_reveals_the_models_answer_for_the_view_the_class_is_on(clients):
    """A next-token poll reveals the top next token (and its probability) of the model and text of the class's
    current page, as /api/v1/run predicts it; an induction-head poll, the head with the highest induction
    score, as the detectors API scores it; a free-text poll keeps the teacher's pick."""
    teacher, student = clients(2)
    text = "the cat sat on the mat and the cat "
    code = start(teacher, path="/?" + urlencode({"model": "induction", "text": text, "layer": "1"}))["code"]
    top = teacher.post("/api/v1/run", json={"model": "induction", "text": text, "top_k": 1}).json()["top_k"][0]
    said = top["token"].strip() or top["token"]  # an option as a teacher types it
    asked = teacher.post(
        f"/api/v1/classes/{code}/polls",
        json={"question": "Which token comes next?", "options": ["zzz", said], "kind": "next_token"},
    ).json()
    assert asked["kind"] == "next_token"
    student.post(f"/api/v1/classes/{code}/polls/{asked['id']}/answers", json={"option": said})
    # the teacher's own pick is ignored: the server says what the model says
    closed = teacher.post(f"/api/v1/classes/{code}/polls/{asked['id']}/close", json={"answer": "zzz"}).json()
    assert closed["answer"] == said and closed["counts"] == [0, 1]
    detail = closed["detail"]
    assert detail["kind"] == "next_token" and detail["model"] == "induction" and detail["text"] == text
    assert detail["token"] == top["token"] and detail["prob"] == pytest.approx(top["prob"], rel=1e-9)

    head, score = _best_head(teacher, "induction")
    heads = ["L0H0", "L0H1", "L1H0", "L1H1"]
    asked = teacher.post(
        f"/api/v1/classes/{code}/polls",
        json={"question": "Which head is the induction head?", "options": heads, "kind": "induction_head"},
    ).json()
    closed = teacher.post(f"/api/v1/classes/{code}/polls/{asked['id']}/close").json()
    assert closed["answer"] == head and closed["detail"]["head"] == head
    assert closed["detail"]["score"] == pytest.approx(score, abs=1e-6) and head.startswith("L1")  # a 2-layer model's

    # the class moves to a page without model or text: the explorer's defaults (the tests' default model, the
    # toy, tests/conftest.py, and its own text)
    teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/lessons/attention"})
    asked = teacher.post(
        f"/api/v1/classes/{code}/polls", json={"question": "Next?", "options": ["a", "b"], "kind": "next_token"}
    ).json()
    closed = teacher.post(f"/api/v1/classes/{code}/polls/{asked['id']}/close").json()
    models = {m["name"]: m for m in teacher.get("/api/v1/models").json()["models"]}
    assert closed["detail"]["model"] == "toy" and closed["detail"]["text"] == models["toy"]["default_text"]
    assert closed["answer"] and closed["answer"] not in ("a", "b") or closed["detail"]["token"].strip() in ("a", "b")

    free = teacher.post(f"/api/v1/classes/{code}/polls", json={"question": "Fav?", "options": ["a", "b"]}).json()
    assert free["kind"] == "free"
    closed = teacher.post(f"/api/v1/classes/{code}/polls/{free['id']}/close", json={"answer": "b"}).json()
    assert closed["answer"] == "b" and closed["detail"] is None
    bad = teacher.post(f"/api/v1/classes/{code}/polls", json={"question": "q", "options": ["a", "b"], "kind": "x"})
    assert bad.status_code == 422


def test_a_poll_needs_two_to_eight_different_options_of_bounded_text(clients):
    (teacher,) = clients()
    code = start(teacher)["code"]
    url = f"/api/v1/classes/{code}/polls"
    for bad in (["a"], ["a"] * 9, ["a", "a"], ["a", "x" * 81]):
        assert teacher.post(url, json={"question": "q", "options": bad}).status_code == 422, bad
    assert teacher.post(url, json={"question": "x" * 301, "options": ["a", "b"]}).status_code == 422


def test_a_class_takes_at_most_its_cap_of_students(clients):
    teacher, first, second = clients(3, class_max_students=2)
    code = start(teacher)["code"]
    pid = teacher.post(f"/api/v1/classes/{code}/polls", json={"question": "q", "options": ["a", "b"]}).json()["id"]
    url = f"/api/v1/classes/{code}/polls/{pid}/answers"
    assert teacher.post(url, json={"option": "a"}).status_code == 200
    assert first.post(url, json={"option": "a"}).status_code == 200
    full = second.post(url, json={"option": "b"})
    assert full.status_code == 403 and "is full" in full.json()["detail"][0]["msg"]
    assert teacher.post(url, json={"option": "b"}).status_code == 200  # one already in is still in


def test_ending_a_class_ends_its_code(clients):
    (teacher,) = clients()
    code = start(teacher)["code"]
    assert teacher.delete(f"/api/v1/classes/{code}").status_code == 204
    assert teacher.get(f"/api/v1/classes/{code}").status_code == 404
    assert teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/"}).status_code == 404


def test_the_schema_states_every_limit(client_with):
    schema = client_with().get("/openapi.json").json()["components"]["schemas"]
    assert schema["PollRequest"]["properties"]["options"]["maxItems"] == 8
    assert schema["PollRequest"]["properties"]["question"]["maxLength"] == 300
    assert schema["StateRequest"]["properties"]["path"]["maxLength"] == 8192


# ------------------------------------------------------------------ the store


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request, tmp_path):
    """make_store(idle_s, clock): a store of each kind that one machine runs without Redis."""

    def make(idle_s=600, clock=None):
        if request.param == "memory":
            return MemoryClassStore(idle_s=idle_s, **({"clock": clock} if clock else {}))
        return SQLiteClassStore(class_file(tmp_path), idle_s=idle_s, **({"clock": clock} if clock else {}))

    return make


def test_an_idle_class_is_forgotten(make_store):
    now = [0.0]
    store = make_store(idle_s=60, clock=lambda: now[0])

    async def scenario():
        await store.create("ACDEFGHJ", "h", "/")
        now[0] = 59
        await store.set_path("ACDEFGHJ", "/?a=1")  # activity keeps it
        now[0] = 59 + 61
        with pytest.raises(ClassNotFound, match="^ACDEFGHJ$"):  # the code it no longer knows
            await store.get("ACDEFGHJ")
        await store.create("ACDEFGHJ", "h2", "/params")  # and a new class may take the code
        assert (await store.get("ACDEFGHJ")).path == "/params"
        await store.close()

    asyncio.run(scenario())


def test_a_follower_resumes_after_its_last_event_and_a_new_one_gets_the_present(make_store):
    store = make_store()

    async def scenario():
        await store.create("ACDEFGHJ", "h", "/")
        first = await store.set_path("ACDEFGHJ", "/?a=1")
        await store.add_poll("ACDEFGHJ", "q", ["a", "b"])
        await store.set_path("ACDEFGHJ", "/?a=2")
        missed = await store.events("ACDEFGHJ", first.id, 0.1)
        assert [(e.name, e.data.get("path")) for e in missed] == [("poll", None), ("state", "/?a=2")]
        present = await store.events("ACDEFGHJ", None, 0.1)
        assert [e.name for e in present] == ["state", "poll"] and present[0].data == {"path": "/?a=2"}
        assert await store.events("ACDEFGHJ", missed[-1].id, 0.05) == []  # nothing new: waits, then nothing
        waiting = asyncio.create_task(store.events("ACDEFGHJ", missed[-1].id, 5))
        await asyncio.sleep(0.05)
        await store.set_path("ACDEFGHJ", "/?a=3")
        t0 = time.monotonic()
        woke = await waiting
        assert [e.data for e in woke] == [{"path": "/?a=3"}] and time.monotonic() - t0 < 0.5
        await store.close()

    asyncio.run(scenario())


def test_wrong_codes_are_counted_by_the_store_per_client(make_store):
    now = [100.0]
    store = make_store(clock=lambda: now[0])

    async def scenario():
        assert await store.guesses("10.0.0.1", 60) == (0, 0.0)
        await store.guessed("10.0.0.1", 60)
        now[0] += 10
        await store.guessed("10.0.0.1", 60)
        assert await store.guesses("10.0.0.1", 60) == (2, 10.0)
        assert (await store.guesses("10.0.0.2", 60))[0] == 0  # another client's count is its own
        now[0] += 55  # the first is out of the minute
        assert await store.guesses("10.0.0.1", 60) == (1, 55.0)
        await store.close()

    asyncio.run(scenario())


def test_the_worker_processes_of_one_machine_share_classes_through_one_file(tmp_path):
    """Two SQLite stores on one file stand for two worker processes: each sees the other's classes, a
    follower waiting on one is woken by the other's write within the watch interval, the student cap and
    one answer per student hold across them, and so does the count of a client's wrong codes."""
    a = SQLiteClassStore(class_file(tmp_path), idle_s=600)
    b = SQLiteClassStore(class_file(tmp_path), idle_s=600)

    async def scenario():
        created = await a.create("ACDEFGHJ", "h", "/")
        assert (await b.get("ACDEFGHJ")).path == "/"
        waiting = asyncio.create_task(b.events("ACDEFGHJ", created.last_event, 5))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        moved = await a.set_path("ACDEFGHJ", "/inspect")
        woke = await waiting
        took = time.monotonic() - t0
        assert [(e.id, e.data) for e in woke] == [(moved.id, {"path": "/inspect"})] and took < 1.0, took
        poll = await b.add_poll("ACDEFGHJ", "Next?", ["x", "y"])
        assert await a.join("ACDEFGHJ", "s1", 2) == 1 and await b.join("ACDEFGHJ", "s2", 2) == 2
        with pytest.raises(ClassFull):
            await a.join("ACDEFGHJ", "s3", 2)
        await a.answer("ACDEFGHJ", poll.id, "s1", 0)
        await b.answer("ACDEFGHJ", poll.id, "s1", 1)  # the same student, through the other worker: replaced
        assert (await a.poll("ACDEFGHJ", poll.id)).counts == [0, 1]
        for _ in range(3):
            await a.guessed("10.0.0.1", 60)
        assert (await b.guesses("10.0.0.1", 60))[0] == 3
        await b.end("ACDEFGHJ")
        with pytest.raises(ClassNotFound):
            await a.get("ACDEFGHJ")
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_check_path_says_why():
    with pytest.raises(InputError, match="is not a page a class can show"):
        check_path("/api/v1/run")


# ------------------------------------------------------------------ followers in step (a real server)


@pytest.fixture(scope="module", params=["one process", "two workers"])
def server(request):
    """A real server: one process (classes in it), or `python -m app` with two worker processes and no
    Redis, as `docker compose up` runs it (classes in the file they share)."""
    env = {"EXPLORER_ACCESS_LOG": "false"}
    if request.param == "two workers":
        env["EXPLORER_WORKERS"] = "2"
    with liveserver.live_server(env=env, entry_point=request.param == "two workers") as s:
        yield s.url


class Student:
    """A follower reading the class's event stream in a thread, as a browser's EventSource does."""

    def __init__(self, url: str, code: str, last_event_id: str | None = None):
        self.events: list[dict] = []
        self.stop = threading.Event()
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=30))
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self.thread = threading.Thread(
            target=self._follow, args=(f"/api/v1/classes/{code}/events", headers), daemon=True
        )
        self.thread.start()

    def _follow(self, path, headers):
        with self.client.stream("GET", path, headers=headers) as r:
            self.status = r.status_code
            for event in parse_events(r.iter_lines()):
                self.events.append(event)
                if self.stop.is_set() or event["event"] == "ended":
                    return

    def wait_for(self, predicate, timeout_s=10.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.events):
                return self.events
            time.sleep(0.02)
        raise AssertionError(f"not seen in {timeout_s} s: {self.events}")


def test_every_follower_sees_the_teachers_move_and_a_reconnect_resumes(server):
    teacher = httpx.Client(base_url=server)
    body = teacher.post("/api/v1/classes", json={"path": "/"}).json()
    code, auth = body["code"], bearer(body["teacher_token"])
    students = [Student(server, code) for _ in range(5)]
    for s in students:
        s.wait_for(lambda ev: ev and ev[0]["event"] == "state")
    t0 = time.monotonic()
    teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/lessons/attention"}, headers=auth)
    for s in students:
        s.wait_for(lambda ev: any('"/lessons/attention"' in e["data"] for e in ev))
    took = time.monotonic() - t0
    assert took < 2.0, took  # pushed at once (the bench measures the p95 at sixty)
    last = students[0].events[-1]["id"]
    teacher.post(f"/api/v1/classes/{code}/polls", json={"question": "Next?", "options": ["a", "b"]}, headers=auth)
    teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/inspect"}, headers=auth)
    again = Student(server, code, last_event_id=last)  # a reconnect, as EventSource makes it
    seen = again.wait_for(lambda ev: len(ev) >= 2)
    assert [e["event"] for e in seen[:2]] == ["poll", "state"] and '"/inspect"' in seen[1]["data"]
    assert teacher.get(f"/api/v1/classes/{code}").json()["students"] == 6
    teacher.delete(f"/api/v1/classes/{code}", headers=auth)
    for s in [*students, again]:
        s.wait_for(lambda ev: ev[-1]["event"] == "ended")


def test_the_store_follows_the_settings(tmp_path):
    """One process keeps classes in memory; several worker processes without Redis share a file in the runs
    folder (they run classes, no 503); Redis, when set, is tests/scale's."""
    assert isinstance(open_class_store(Settings()), MemoryClassStore)
    shared = open_class_store(Settings(workers=2, runs_dir=tmp_path))
    assert isinstance(shared, SQLiteClassStore) and shared.path == tmp_path / ".classes.sqlite3"
    asyncio.run(shared.close())


def test_several_workers_without_redis_run_classes(clients, tmp_path):
    teacher, student = clients(2, workers=2, runs_dir=tmp_path)
    code = start(teacher)["code"]
    assert (tmp_path / ".classes.sqlite3").is_file()
    assert teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/params"}).status_code == 200
    assert student.get(f"/api/v1/classes/{code}").json()["path"] == "/params"
