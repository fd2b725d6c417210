"""The runs folder (app/training/store.py) on its own: names, whole-file writes, one creator among many, the lock
that says a run is alive, and eviction oldest first."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from app.training.store import FINISHED, TrainingStore, training_run_id, write_json
from core.recipes import settings as train_settings


@pytest.fixture
def store(tmp_path) -> TrainingStore:
    return TrainingStore(tmp_path / "runs", max_bytes=10 * 2**20)


def quick(**changes):
    return train_settings("nasi-lemak", **({"steps": 20} | changes))


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


def _create(root: str, barrier) -> tuple[str, bool]:
    barrier.wait()
    return TrainingStore(root, 2**20).create(quick(seed=5), client=str(os.getpid()))


def test_many_processes_creating_the_same_run_make_one(store):
    n = 8
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager, ctx.Pool(n) as pool:
        barrier = manager.Barrier(n)
        results = pool.starmap(_create, [(str(store.root), barrier)] * n)
    assert len({id for id, _ in results}) == 1 and sum(created for _, created in results) == 1
    assert [p.name for p in store.root.iterdir()] == [results[0][0]]  # no half-made folder left


def test_the_lock_says_who_is_training(store):
    id, _ = store.create(quick(), client="a")
    assert not store.is_training(id)
    fd = store.claim(id)
    assert fd is not None and store.is_training(id) and store.claim(id) is None
    store.write_state(id, store.state(id) | {"status": "running"})
    assert store.info(id).status == "running"
    os.close(fd)  # the trainer died: the kernel drops its lock
    assert not store.is_training(id) and store.info(id).status == "interrupted"


def _hold_lock(root: str, id: str, ready, release) -> None:
    store = TrainingStore(root, 2**20)
    fd = store.claim(id)
    ready.set()
    release.wait(10)
    os.close(fd)


def test_a_lock_held_by_another_process_and_dropped_when_it_is_killed(store):
    id, _ = store.create(quick(), client="a")
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(store.root), id, ready, release))
    holder.start()
    assert ready.wait(10)
    assert store.is_training(id) and store.claim(id) is None
    holder.kill()  # SIGKILL: no cleanup runs, the kernel releases the flock
    holder.join()
    assert not store.is_training(id)


def test_cancel_of_a_run_nobody_trains_is_immediate(store):
    id, _ = store.create(quick(), client="a")
    store.request_cancel(id)
    assert store.info(id).status == "cancelled"
    store.requeue(id)
    assert store.info(id).status == "queued"


def test_whole_file_writes_leave_no_temporary_files(store, tmp_path):
    path = tmp_path / "x.json"
    for i in range(20):
        write_json(path, {"i": i, "pad": "x" * 10_000})
    assert json.loads(path.read_text())["i"] == 19
    assert [p.name for p in tmp_path.iterdir() if p.name != "runs"] == ["x.json"]


def test_eviction_deletes_finished_runs_oldest_first_and_never_queued_or_training(tmp_path):
    store = TrainingStore(tmp_path / "runs", max_bytes=3_500_000)
    ids = []
    for seed in range(5):
        id, _ = store.create(quick(seed=seed), client="a")
        (store.folder(id) / "snapshot.npz").write_bytes(b"\0" * 1_000_000)  # each run ~1 MB
        ids.append(id)
        time.sleep(0.01)  # distinct creation times
    for id in ids[:4]:
        store.write_state(id, store.state(id) | {"status": "done"})
    fd = store.claim(ids[1])  # the second oldest is being written: kept
    try:
        deleted = store.evict()
    finally:
        os.close(fd)
    assert deleted == [ids[0], ids[2]]  # oldest finished first, until under 3.5 MB; the queued one stays
    assert store.ids() == [ids[4], ids[3], ids[1]]
    assert all(store.info(id).status in FINISHED + ("queued",) for id in store.ids())


def test_an_unwritable_folder_turns_training_off_with_a_reason(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # even root cannot make a folder inside a file
    store = TrainingStore(blocked / "runs", 2**20)
    assert store.error and "EXPLORER_RUNS_DIR" in store.error and str(blocked) in store.error
