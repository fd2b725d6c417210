"""The run stores (app/training/folder_store.py, redis_store.py) on their own, the runs folder and Redis alike: names, one creator
among many, the lock that says a run is alive, cancel, eviction oldest first, the limits counted where the
runs are; and what only one of them has: whole-file writes and an unwritable folder, a lease that expires
and an unreachable Redis."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from app.training import open_redis
from app.training.base import FINISHED, NoRoom, Room, TrainingStore, training_run_id
from app.training.folder_store import FolderStore, write_json
from app.training.redis_store import RedisStore, Timing, lock_key, run_key
from app.training.redis_writer import RedisWriter, acquire
from core.run_settings import settings as train_settings
from tests.scale import services

LEASE_S = 0.5  # the Redis store's lease here (its pickup time's sixth)


@pytest.fixture(scope="module")
def redis_url():
    with services.redis_server() as server:
        yield server.url


def open_store(kind: str, where, max_bytes: int) -> TrainingStore:
    if kind == "folder":
        return FolderStore(where, max_bytes=max_bytes)
    return open_redis(where, max_bytes, Timing(6 * LEASE_S))


@pytest.fixture(params=["folder", "redis"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def where(kind, tmp_path, request):
    """The folder, or a fresh Redis database (flushed)."""
    if kind == "folder":
        return tmp_path / "runs"
    url = request.getfixturevalue("redis_url")
    services.redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def store(kind, where) -> TrainingStore:
    return open_store(kind, where, 10 * 2**20)


def quick(**changes):
    return train_settings("nasi-lemak", **({"steps": 20} | changes))


class Trainer:
    """Holding a run as its trainer does: the folder's flock, or the Redis lease (and its writer)."""

    def __init__(self, store: TrainingStore, id: str):
        self.store, self.id = store, id
        if isinstance(store, FolderStore):
            self.held = store.claim(id)
        else:
            self.held = acquire(store, id)

    def write(self, **state) -> None:
        if isinstance(self.store, FolderStore):
            self.store.write_state(self.id, self.store.state(self.id) | state)
        else:
            RedisWriter(self.store, self.id, self.held).write_state(self.store.state(self.id) | state)

    def release(self) -> None:
        if isinstance(self.store, FolderStore):
            os.close(self.held)
        else:
            self.held.release()


def finish(store: TrainingStore, id: str, status: str = "done") -> None:
    t = Trainer(store, id)
    t.write(status=status)
    t.release()


def test_the_id_is_a_function_of_every_setting():
    assert training_run_id(quick()) == training_run_id(quick())
    assert training_run_id(quick()) != training_run_id(quick(seed=1)) != training_run_id(quick(steps=21))
    text = train_settings("text", text="abc " * 200, steps=5, seq_len=16)
    assert training_run_id(text) == training_run_id(train_settings("text", text="abc " * 200, steps=5, seq_len=16))
    assert training_run_id(text) != training_run_id(train_settings("text", text="abd " * 200, steps=5, seq_len=16))
    assert training_run_id(quick()).startswith("nasi-lemak-")


def test_create_once_and_read_back(store):
    id, created = store.create(quick(), client="a")
    assert created and store.exists(id)
    assert store.create(quick(), client="b") == (id, False)
    info = store.info(id, store.queue())
    assert info.status == "queued" and info.queue_position == 1 and info.step == 0 and info.model is None
    assert store.settings(id) == quick()
    assert store.request(id)["client"] == "a"  # the first client owns it
    text = train_settings("text", text="abc " * 200, steps=5, seq_len=16)
    text_id, _ = store.create(text, client="a")
    assert store.settings(text_id) == text and store.info(text_id).config["text"].startswith("<sha256 ")


def _create(kind: str, where: str, barrier) -> tuple[str, bool]:
    barrier.wait()
    return open_store(kind, where, 2**20).create(quick(seed=5), client=str(os.getpid()))


def test_many_processes_creating_the_same_run_make_one(kind, where, store):
    n = 8
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager, ctx.Pool(n) as pool:
        barrier = manager.Barrier(n)
        results = pool.starmap(_create, [(kind, str(where), barrier)] * n)
    assert len({id for id, _ in results}) == 1 and sum(created for _, created in results) == 1
    assert store.ids() == [results[0][0]]
    if kind == "folder":
        assert [p.name for p in store.root.iterdir()] == [results[0][0]]  # no half-made folder left


def test_the_lock_says_who_is_training(store):
    id, _ = store.create(quick(), client="a")
    assert not store.is_training(id)
    trainer = Trainer(store, id)
    assert trainer.held is not None and store.is_training(id) and Trainer(store, id).held is None
    trainer.write(status="running")
    assert store.info(id).status == "running"
    trainer.release()  # the trainer died: its lock is gone
    # the folder's run was cut short (start it again); Redis's waits for a worker to take it up (jobs.py)
    cut = "interrupted" if isinstance(store, FolderStore) else "queued"
    assert not store.is_training(id) and store.info(id).status == cut


def _hold_lock(kind: str, where: str, id: str, ready, release) -> None:
    trainer = Trainer(open_store(kind, where, 2**20), id)
    ready.set()
    release.wait(10)
    trainer.release()


def test_a_lock_held_by_another_process_and_dropped_when_it_is_killed(kind, where, store):
    id, _ = store.create(quick(), client="a")
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(kind, str(where), id, ready, release))
    holder.start()
    assert ready.wait(10)
    time.sleep(2 * LEASE_S)  # a live holder keeps renewing its lease
    assert store.is_training(id) and Trainer(store, id).held is None
    holder.kill()  # SIGKILL: no cleanup runs; the kernel releases the flock, nobody renews the lease
    holder.join()
    if kind == "redis":
        time.sleep(LEASE_S + 0.2)
    assert not store.is_training(id)


def test_cancel_of_a_run_nobody_trains_is_immediate(store):
    id, _ = store.create(quick(), client="a")
    store.request_cancel(id)
    assert store.info(id).status == "cancelled"
    store.requeue(id)
    assert store.info(id).status == "queued"


def test_a_trainer_that_ends_between_the_state_and_the_lock_is_read_is_not_called_interrupted(tmp_path, monkeypatch):
    """The folder store reads a run's state, then its lock. A trainer that writes its last state (cancelled) and
    lets go of the lock between those two reads left the first read saying "running" with nobody training:
    `interrupted`, once, under load (tests/api/test_sae_training.py's cancel, in a clean-clone run). The state
    is read again before a run is called interrupted; one whose trainer is truly gone still is."""
    store = FolderStore(tmp_path, max_bytes=2**20)
    id, _ = store.create(quick(), client="a")
    write_json(store.folder(id) / "state.json", {"status": "running", "step": 3, "records": []})
    reads = iter([{"status": "running", "step": 3, "records": []}])  # the read before the trainer's last write
    real_state = store.state
    monkeypatch.setattr(store, "state", lambda run: next(reads, None) or real_state(run))
    write_json(store.folder(id) / "state.json", {"status": "cancelled", "step": 4, "records": []})
    assert store.info(id).status == "cancelled"
    monkeypatch.setattr(store, "state", real_state)
    write_json(store.folder(id) / "state.json", {"status": "running", "step": 4, "records": []})
    assert store.info(id).status == "interrupted"  # nobody holds the lock and the state still says running


def test_the_limits_count_the_runs_queued_or_training(store):
    room = Room(per_client=2, total=3)
    a = [store.create(quick(seed=s), client="a", room=room)[0] for s in (1, 2)]
    with pytest.raises(NoRoom, match=r"^2 runs queued or training \(client\)$") as full:
        store.create(quick(seed=3), client="a", room=room)
    assert full.value.scope == "client" and full.value.count == 2
    store.create(quick(seed=4), client="b", room=room)
    with pytest.raises(NoRoom, match=r"^3 runs queued or training \(server\)$") as full:
        store.create(quick(seed=5), client="c", room=room)
    assert full.value.scope == "server" and full.value.count == 3
    assert store.create(quick(seed=1), client="c", room=room) == (a[0], False)  # an existing run: no room needed
    finish(store, a[0])
    store.create(quick(seed=5), client="c", room=room)  # a finished run leaves room


def test_whole_file_writes_leave_no_temporary_files(tmp_path):
    path = tmp_path / "x.json"
    for i in range(20):
        write_json(path, {"i": i, "pad": "x" * 10_000})
    assert json.loads(path.read_text())["i"] == 19
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def pad(store: TrainingStore, id: str, n: int) -> None:
    """Make the run take about n more bytes (a snapshot's worth)."""
    if isinstance(store, FolderStore):
        (store.folder(id) / "snapshot.npz").write_bytes(b"\0" * n)
    else:
        store.r.hset(run_key(id), "snapshot", b"\0" * n)


def test_eviction_deletes_finished_runs_oldest_first_and_never_queued_or_training(kind, where):
    store = open_store(kind, where, 3_500_000)
    ids = []
    for seed in range(5):
        id, _ = store.create(quick(seed=seed), client="a")
        pad(store, id, 1_000_000)  # each run ~1 MB
        ids.append(id)
        time.sleep(0.01)  # distinct creation times
    for id in ids[:4]:
        finish(store, id)
    trainer = Trainer(store, ids[1])  # the second oldest is being written: kept
    try:
        deleted = store.evict()
    finally:
        trainer.release()
    assert deleted == [ids[0], ids[2]]  # oldest finished first, until under 3.5 MB; the queued one stays
    assert store.ids() == [ids[4], ids[3], ids[1]]
    assert all(store.info(id).status in FINISHED + ("queued",) for id in store.ids())


def test_an_unwritable_folder_turns_training_off_with_a_reason(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # even root cannot make a folder inside a file
    store = FolderStore(blocked / "runs", 2**20)
    assert store.error and "EXPLORER_RUNS_DIR" in store.error and str(blocked) in store.error


def test_an_unreachable_redis_turns_training_off_with_a_reason_and_hides_no_password():
    port = services.free_port()  # nothing listens there
    store = RedisStore(f"redis://:s3cret@127.0.0.1:{port}/0", 2**20, Timing(60))
    assert store.error and "EXPLORER_REDIS_URL" in store.error and f"127.0.0.1:{port}" in store.error
    assert "s3cret" not in store.error
    assert store.ids() == [] and not store.exists(training_run_id(quick())) and store.model_folder("x-0") is None


def test_a_redis_trainer_that_lost_its_lease_cannot_write(redis_url):
    services.redis.Redis.from_url(redis_url).flushdb()
    store = open_redis(redis_url, 2**20, Timing(6 * LEASE_S))
    id, _ = store.create(quick(), client="a")
    first = acquire(store, id)
    first._done.set()  # stalled: it renews no more
    time.sleep(LEASE_S + 0.2)
    second = acquire(store, id)  # another worker takes the run up
    assert second is not None and store.r.get(lock_key(id)).decode() == second.token
    from app.training.redis_writer import LeaseLost

    with pytest.raises(LeaseLost, match=f"^{id}$"):  # the run whose lease it lost
        RedisWriter(store, id, first).write_progress(7, 1.0)
    RedisWriter(store, id, second).write_progress(3, 2.0)
    second.release()
    assert json.loads(store.r.hget(run_key(id), "progress")) == {"step": 3, "loss": 2.0}


def test_a_resumed_run_never_reports_the_previous_trainers_progress():
    """A run resumed from its snapshot at step 100 writes that step to its state; the progress the previous
    trainer left (step 97, written before its last steps) is behind it and not read, so the step shown
    never goes back. A progress ahead of the state is the current trainer's."""
    from app.training.base import step_and_loss

    state = {"step": 100, "records": [{"step": 100, "train_loss": 1.5}]}
    assert step_and_loss(state, {"step": 97, "loss": 1.7}) == (100, 1.5)
    assert step_and_loss(state, {"step": 103, "loss": 1.4}) == (103, 1.4)
    assert step_and_loss(state, None) == (100, 1.5)
    assert step_and_loss({"records": []}, None) == (0, None)
