"""The trainer's side of the Redis store: the run's lease and every write made under it.

The process training a run (a Celery worker's, app/training/jobs.py) takes the run's lease: a key with a
token and a time to live (`acquire`: SET NX PX), renewed by a thread every heartbeat for as long as it
trains (`Lease`), which also reads whether someone asked the run to stop (a cancel) and whether this
worker is shutting down. Every write it makes (`RedisWriter`: state, records, progress, patterns,
snapshot, weights, and the events a stream shows) runs in one Lua script that first checks the token
(`fenced`): a trainer that lost its lease (stalled longer than the lease, or cut off from Redis) cannot
write over the one that took the run up after it. The lease also dies with its machine: nobody renews it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from app.training.base import FINISHED, HOST, MODEL_PREFIX, RunWriter, dumps, progress_event
from app.training.redis_store import (
    ACTIVE,
    QUEUE,
    STREAM_MAXLEN,
    RedisStore,
    as_bytes,
    client_key,
    events_key,
    lock_key,
    run_key,
    stopping_key,
)
from core.recipes import TrainSettings

if TYPE_CHECKING:
    from core.sae_run import SAERun
    from core.train import Snapshot, Training

log = logging.getLogger("app.training.redis_writer")

# The trainer's writes: only while its token holds the lease. ARGV: token, maxlen, mode ('' | 'start' |
# 'finish' | 'queue'), id, then n and n field/value pairs to set, m and m fields to delete, k and k (event, data) pairs.
FENCED = """
-- KEYS: lock, run, events, queue, active, client
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local i = 5
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then
  local args = {}
  for j = 1, 2 * n do args[j] = ARGV[i]; i = i + 1 end
  redis.call('HSET', KEYS[2], unpack(args))
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do redis.call('HDEL', KEYS[2], ARGV[i]); i = i + 1 end
if ARGV[3] == 'start' or ARGV[3] == 'finish' then redis.call('ZREM', KEYS[4], ARGV[4]) end
if ARGV[3] == 'finish' then
  redis.call('ZREM', KEYS[5], ARGV[4])
  redis.call('SREM', KEYS[6], ARGV[4])
end
if ARGV[3] == 'queue' then
  local created = redis.call('ZSCORE', KEYS[5], ARGV[4])
  if created then redis.call('ZADD', KEYS[4], created, ARGV[4]) end
end
local last = 1
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  last = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'event', ARGV[i], 'data', ARGV[i + 1])
  i = i + 2
end
return last
"""

RENEW = """
-- KEYS: lock, run, stopping. ARGV: token, ttl_ms, now
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, 0, 0} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'heartbeat_at', ARGV[3])
return {1, redis.call('HEXISTS', KEYS[2], 'cancel'), redis.call('EXISTS', KEYS[3])}
"""

# Taking the lease takes a queued run out of the queue in the same step (its place is no longer waiting).
ACQUIRE = """
-- KEYS: lock, run, queue. ARGV: token, ttl_ms, id
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if redis.call('HGET', KEYS[2], 'status') == 'queued' then redis.call('ZREM', KEYS[3], ARGV[3]) end
return 1
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeaseLost(Exception):
    """This process no longer holds the run's lease: it must not write (another worker may train it)."""


_scripts: dict[tuple[int, str], Any] = {}


def _script(store: RedisStore, name: str):
    key = (id(store.r), name)
    if key not in _scripts:
        _scripts[key] = store.r.register_script(
            {"fenced": FENCED, "renew": RENEW, "release": RELEASE, "acquire": ACQUIRE}[name]
        )
    return _scripts[key]


def acquire(store: RedisStore, id: str, node: str | None = None) -> Lease | None:
    """The run's lease if nobody holds it, renewed by a thread until released; else None."""
    token = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    if not _script(store, "acquire")(
        keys=[lock_key(id), run_key(id), QUEUE], args=[token, int(store.timing.lease_s * 1000), id]
    ):
        return None
    return Lease(store, id, token, node)


def fenced(
    store: RedisStore,
    id: str,
    token: str,
    *,
    set: dict | None = None,
    delete: Iterable[str] = (),
    events: Iterable[tuple[str, Any]] = (),
    mode: str = "",
    client: str = "",
) -> bytes:
    """Write as the lease's holder, in one script; LeaseLost if the token no longer holds it. `mode`: "start"
    (out of the queue), "finish" (out of the queue and the limits' counts), "queue" (back in the queue)."""
    pairs = [x for kv in (set or {}).items() for x in kv]
    delete = list(delete)
    evs = [x for name, data in events for x in (name, dumps(data))]
    out = _script(store, "fenced")(
        keys=[lock_key(id), run_key(id), events_key(id), QUEUE, ACTIVE, client_key(client)],
        args=[token, STREAM_MAXLEN, mode, id, len(pairs) // 2, *pairs, len(delete), *delete, len(evs) // 2, *evs],
    )
    if out is None:
        raise LeaseLost(id)
    return out


class Lease:
    """The lock on one run, held by the process training it: renewed every heartbeat by a thread, which also
    reads whether someone asked the run to stop (a cancel) and whether this worker is shutting down."""

    def __init__(self, store: RedisStore, id: str, token: str, node: str | None):
        self.store, self.id, self.token = store, id, token
        self.stopping_key = stopping_key(node or "-")
        self.cancelled = self.stopping = self.lost = False
        self.unreachable = False  # the last renewal could not reach Redis
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew_forever, name=f"lease-{id}", daemon=True)
        self._thread.start()

    def _renew_forever(self) -> None:
        t = self.store.timing
        while not self._done.wait(t.heartbeat_s):
            try:
                held, cancel, stopping = _script(self.store, "renew")(
                    keys=[lock_key(self.id), run_key(self.id), self.stopping_key],
                    args=[self.token, int(t.lease_s * 1000), repr(time.time())],
                )
                self.unreachable = False
            except redis.RedisError as e:
                if not self.unreachable:  # once per outage: it renews again every heartbeat until Redis is back
                    log.warning("run %s: cannot renew its lease, Redis cannot be reached: %s", self.id, e)
                self.unreachable = True
                continue
            if not held:
                self.lost = True
                return
            self.cancelled, self.stopping = bool(cancel), bool(stopping)

    def should_stop(self) -> bool:
        return self.cancelled or self.stopping or self.lost

    def release(self) -> None:
        self._done.set()
        try:
            _script(self.store, "release")(keys=[lock_key(self.id)], args=[self.token])
        except redis.RedisError as e:
            log.warning("run %s: cannot release its lease (it expires by itself): %s", self.id, e)


class RedisWriter(RunWriter):
    """A run's fields in Redis, written only while the lease holds, each write with its events."""

    store: RedisStore

    def __init__(self, store: RedisStore, id: str, lease: Lease):
        self.store, self.id, self.lease = store, id, lease
        self.client = store.request(id)["client"]
        self.steps = store.settings(id).steps
        self._status: str | None = None  # the status this writer last wrote (None: nothing yet)
        self._records = 0  # records it has announced
        self.cut_short: dict | None = None  # set when the run lost its worker: said in the stream at the start
        self.snapshot_step: int | None = None  # the step of the snapshot it resumes from

    def _write(self, **kw) -> bytes:
        return fenced(self.store, self.id, self.lease.token, client=self.client, **kw)

    def state(self) -> dict:
        return self.store.state(self.id)

    def settings(self) -> TrainSettings:
        return self.store.settings(self.id)

    def load_snapshot(self) -> Snapshot | None:
        from core.train import Snapshot

        [raw] = self.store._fields(self.id, "snapshot")
        if raw is None:
            return None
        snapshot = Snapshot.load(io.BytesIO(raw))
        self.snapshot_step = snapshot.step
        return snapshot

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with tempfile.TemporaryDirectory(prefix="explorer-snapshot-") as tmp:
            data = snapshot.save(Path(tmp) / "snapshot.npz").read_bytes()
        self._write(set={"snapshot": data})

    def begin(self, worker: dict) -> None:
        """This process takes the run: who it is, out of the queue, no progress of an earlier trainer."""
        self._write(set={"worker": dumps(worker), "heartbeat_at": repr(time.time())}, delete=["progress"], mode="start")

    def write_state(self, state: dict) -> None:
        state = dict(state)
        status, error = state.pop("status"), state.pop("error", None)
        state["updated_at"] = time.time()
        records = state.get("records", [])
        events = [("record", r) for r in records[self._records :]] if self._status is not None else []
        if self._status is None and self.cut_short is not None:  # the gap: who was lost, from where it goes on
            events.append(("resumed", self.cut_short | {"from_step": self.snapshot_step or 0}))
        if status != self._status:
            events.append(("run", {"status": status}))
        fields = {"state": dumps(state), "status": status}
        if error is not None:
            fields["error"] = error
        if state.get("model_dir"):
            fields["model_dir"] = state["model_dir"]
        finished = status in FINISHED
        self._write(
            set=fields,
            delete=[] if error is not None else ["error"],
            events=events,
            mode="finish" if finished else "queue" if status == "queued" else "",
        )
        self._status, self._records = status, len(records)

    def write_progress(self, step: int, loss: float) -> None:
        progress = {"step": step, "loss": loss}
        self._write(
            set={"progress": dumps(progress)},
            events=[("progress", progress_event(self.id, step, self.steps, loss, "running"))],
        )

    def write_patterns(self, step: int, patterns: list) -> None:
        self._write(set={f"patterns:{step}": dumps(patterns)})

    def export(self, run: Training | SAERun) -> str:
        name = f"{MODEL_PREFIX}{run.step}"
        with tempfile.TemporaryDirectory(prefix="explorer-export-") as tmp:
            folder = run.export(Path(tmp) / name)
            files = {f"model:{p.name}": p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        digest = hashlib.sha256()
        for key in sorted(files):
            digest.update(key.encode() + files[key])
        old = [k.decode() for k in map(as_bytes, self.store.r.hkeys(run_key(self.id))) if k.startswith(b"model:")]
        self._write(
            set=files | {"model_dir": name, "model_hash": digest.hexdigest()}, delete=[k for k in old if k not in files]
        )
        return name

    def drop_models_but(self, keep: str | None) -> None:
        pass  # export replaced the files in one write

    def stop_requested(self) -> bool:
        return self.lease.cancelled
