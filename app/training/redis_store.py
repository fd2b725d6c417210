"""Training runs in Redis (EXPLORER_REDIS_URL): the store every replica and every Celery worker shares.

    explorer:runs                 sorted set: run id by creation time (listing, newest first)
    explorer:queue                sorted set: the runs waiting to start, first come first served
    explorer:active               sorted set: runs queued or training (the server-wide limit counts it)
    explorer:client:<who>         set: a client's active runs (the per-client limit counts it)
    explorer:run:<id>             hash: request, text, status, error, state (records ...), progress, worker,
                                  model_dir, model_hash, snapshot, patterns:<step>, model:<file>, cancel
    explorer:run:<id>:events      stream: run, record, progress and resumed events (GET .../events reads it)
    explorer:run:<id>:lock        the trainer's lease: a token with a time to live, renewed while it trains
    explorer:workers              hash: each Celery worker's host, pid and processes, and when it was last seen

A run is created, counted against the limits and queued in one Lua script, so thirty identical requests
on three replicas make one run and the limits hold across replicas. The process training a run holds
its lease (`Lease`: SET NX with a time to live, renewed by a thread while it trains); every write it
makes checks the token in the same script (`RedisWriter`), so a trainer that lost its lease (a stall
longer than the lease, its machine cut off) cannot write over the one that took the run up after it.
A run whose status is `running` and whose lease has expired lost its worker: it is shown as queued again
until a worker takes it up and resumes it from its snapshot (app/training/jobs.py says when).

A replica that serves a finished run's model reads its weights once into a folder of its own cache
(`model_folder`), named by the weights' hash.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis

from app.settings import Settings, redis_connection_url
from app.training.base import (
    FINISHED,
    HOST,
    STATUSES,
    NoRoom,
    Room,
    Status,
    StoreUnavailable,
    TrainingRunInfo,
    TrainingStore,
    checked_run_id,
    dumps,
    is_training_run_id,
    run_info,
    training_run_id,
)
from core import InputError
from core.recipes import TrainSettings, text_hash

log = logging.getLogger("app.training.redis_store")

PREFIX = "explorer"
RUNS, QUEUE, ACTIVE, WORKERS = (f"{PREFIX}:runs", f"{PREFIX}:queue", f"{PREFIX}:active", f"{PREFIX}:workers")
# A replica sends a run's task the moment it creates it: the same request made this long after, when the
# task was never sent (the broker refused it), sends it then.
SEND_GRACE_S = 2.0
STREAM_MAXLEN = 10_000  # events kept per run (about): progress comes ten times a second
STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
PING_EVERY_S = 1.0  # how long a reachability answer is trusted
# How long a reachability ping waits. Every page that lists models asks the store first (the catalogue's
# questions below), so a Redis that hangs rather than refuses (stopped, or cut off by the network) costs a page
# this, not the 10 s socket timeout twice (measured with a SIGSTOPped Redis: the explorer took 20.2 s).
PING_TIMEOUT_S = 1.0


def run_key(id: str) -> str:
    return f"{PREFIX}:run:{id}"


def events_key(id: str) -> str:
    return f"{PREFIX}:run:{id}:events"


def lock_key(id: str) -> str:
    return f"{PREFIX}:run:{id}:lock"


def client_key(client: str) -> str:
    return f"{PREFIX}:client:{client}"


def stopping_key(node: str) -> str:
    return f"{PREFIX}:stopping:{node}"


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Timing:
    """Every interval of the Redis mode, derived from one setting, the pickup time P (EXPLORER_TRAIN_PICKUP_S):
    when a worker machine dies mid-run, its lease expires after `lease_s` (P/6), and Celery's Redis transport
    gives its unacknowledged message to another worker after `visibility_s` (2P/3) plus at most one sweep
    (`restore_s`, P/6): the run is resumed within 5P/6 < P. A live trainer renews its lease every
    `heartbeat_s`; a delivery that finds the lease held asks again after `retry_s`."""

    pickup_s: float

    @property
    def lease_s(self) -> float:
        return self.pickup_s / 6

    @property
    def heartbeat_s(self) -> float:
        return min(self.lease_s / 3, 2.0)

    @property
    def visibility_s(self) -> int:
        return max(1, int(self.pickup_s * 2 / 3))

    @property
    def restore_s(self) -> int:
        return max(1, int(self.pickup_s / 6))

    @property
    def retry_s(self) -> float:
        return max(0.5, self.lease_s / 2)

    @property
    def unsent_s(self) -> float:
        """A run queued this long whose task was never sent (its replica died, or the broker refused it in
        between) is sent by a worker's sweep."""
        return self.lease_s


def _never_sent(status: bytes | None, sent: bytes | None, queued_at: bytes | None, older_than_s: float) -> bool:
    """A run queued more than `older_than_s` ago whose task no one has marked sent."""
    return (
        status == b"queued" and sent is None and queued_at is not None and time.time() - float(queued_at) > older_than_s
    )


def _decode(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


# This client does not decode Redis's replies: each is bytes. redis-py types a reply for either kind of client
# (bytes, or str when it decodes), so these say which.
def as_bytes(reply: object) -> bytes:
    return reply if isinstance(reply, bytes) else str(reply).encode()


def as_text(reply: object) -> str:
    return as_bytes(reply).decode()


def _json(raw: bytes | None) -> Any:
    return None if raw is None else json.loads(raw)


def _reaching(method: Callable) -> Callable:
    """Redis cannot be reached, or stopped answering: StoreUnavailable, which the service answers with 503."""

    @functools.wraps(method)
    def wrapper(self: RedisStore, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as e:  # (redis-py's TimeoutError is not a ConnectionError)
            raise StoreUnavailable(self.unreachable(e)) from e

    return wrapper


# ------------------------------------------------------------------ scripts (each runs whole, alone)

# Room for one more run (per: the client's limit, -1 for none; total: the server's), counted in the client's
# set (KEYS[5]) and the active runs (KEYS[4]): {-1, count} or {-2, count} when there is none.
ROOM = """if per >= 0 then
  local mine = redis.call('SCARD', KEYS[5])
  if mine >= per then return {-1, mine} end
  local all = redis.call('ZCARD', KEYS[4])
  if all >= total then return {-2, all} end
end
"""

CREATE = (
    """
-- KEYS: run, runs, queue, active, client, events. ARGV: id, request, text, state, created_at, per_client, total
if redis.call('HEXISTS', KEYS[1], 'request') == 1 then return {0, 0} end
local per, total = tonumber(ARGV[6]), tonumber(ARGV[7])
"""
    + ROOM
    + """
redis.call('HSET', KEYS[1], 'request', ARGV[2], 'status', 'queued', 'state', ARGV[4], 'queued_at', ARGV[5])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'text', ARGV[3]) end
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1])
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[8], '*', 'event', 'run', 'data', '{"status":"queued"}')
return {1, 0}
"""
)

# A trainer that has just written its run's last status may still hold the lease for a moment: the run is
# queued all the same, and its next delivery waits for the lease.
REQUEUE = (
    """
-- KEYS: run, lock, queue, active, client, events. ARGV: id, created_at, per_client, total, now, maxlen
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'cancelled' and status ~= 'interrupted' and status ~= 'failed' then return {0, 0} end
local per, total = tonumber(ARGV[3]), tonumber(ARGV[4])
"""
    + ROOM
    + """
redis.call('HSET', KEYS[1], 'status', 'queued', 'queued_at', ARGV[5])
redis.call('HDEL', KEYS[1], 'error', 'cancel', 'sent')
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[6], '*', 'event', 'run', 'data', '{"status":"queued"}')
return {1, 0}
"""
)

CANCEL = """
-- KEYS: run, lock, queue, active, client, events. ARGV: id, maxlen
redis.call('HSET', KEYS[1], 'cancel', '1')
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'cancelled')
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('SREM', KEYS[5], ARGV[1])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*', 'event', 'run', 'data', '{"status":"cancelled"}')
return 1
"""

DELETE = """
-- KEYS: run, lock, events, runs. ARGV: id
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'queued' or status == 'running' then return 0 end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
"""


# ------------------------------------------------------------------ the store


# How a run's task reaches the workers: called with the run's id, raises StoreUnavailable when the broker
# cannot take it. Celery's (app/training/jobs.py `sender`), handed in by app/training/__init__.py `open_redis`.
Send = Callable[[str], None]


def unreachable(url: str, e: Exception) -> str:
    """Why training is off while Redis at `url` cannot be reached, for the 503 and /readyz."""
    return (
        f"training is off for now: Redis at {redacted(url)} cannot be reached ({e}); check that it "
        "runs and EXPLORER_REDIS_URL (host, port, password)"
    )


class RedisStore(TrainingStore):
    """Runs in Redis, shared by every replica and worker. It reads and writes Redis only: starting a run's
    training is `send`'s (None: a store that only reads and trains, such as a worker's, sends nothing)."""

    kind = "redis"

    def __init__(
        self, url: str, max_bytes: int, timing: Timing, cache_dir: Path | None = None, send: Send | None = None
    ):
        self.url = url
        self.max_bytes = max_bytes
        self.timing = timing
        self.send = send
        self.r = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=10)
        self._ping = redis.Redis.from_url(url, socket_connect_timeout=PING_TIMEOUT_S, socket_timeout=PING_TIMEOUT_S)
        digest = hashlib.sha256(url.encode()).hexdigest()[:12]
        self.cache = cache_dir or Path(tempfile.gettempdir()) / f"transformer-explorer-{os.getuid()}" / digest
        self._scripts = {
            name: self.r.register_script(text)
            for name, text in [("create", CREATE), ("requeue", REQUEUE), ("cancel", CANCEL), ("delete", DELETE)]
        }
        self._pinged: tuple[float, str | None] = (0.0, None)  # (when, the error then)
        self._cache_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisStore:
        """A store that reads and trains and sends no task (a worker's); app/training/__init__.py `open_redis`
        opens one that sends."""
        url = redis_connection_url(settings)  # over TLS, checking Redis's certificate (EXPLORER_REDIS_CA)
        return cls(url, settings.runs_max_mb * 2**20, Timing(settings.train_pickup_s))

    def unreachable(self, e: Exception) -> str:
        return unreachable(self.url, e)

    @property
    def error(self) -> str | None:
        when, error = self._pinged
        if time.monotonic() - when > PING_EVERY_S:
            try:
                self._ping.ping()
                error = None
            except redis.RedisError as e:
                error = self.unreachable(e)
            self._pinged = (time.monotonic(), error)
        return error

    # ---------------------------------------------------------------- asking (the catalogue's questions
    # never fail: without Redis there are no trained models to list, and the pages still open; with Redis
    # known to be away, within PING_EVERY_S, they ask it nothing)

    def exists(self, id: str) -> bool:
        return is_training_run_id(id) and _asked(self, lambda: bool(self.r.hexists(run_key(id), "request")), False)

    def ids(self) -> list[str]:
        return _asked(self, lambda: [as_text(id) for id in self.r.zrevrange(RUNS, 0, -1)], [])

    @_reaching
    def queue(self) -> list[str]:
        return [as_text(id) for id in self.r.zrange(QUEUE, 0, -1)]

    def _fields(self, id: str, *names: str) -> list[bytes | None]:
        return [None if v is None else as_bytes(v) for v in self.r.hmget(run_key(checked_run_id(id)), names)]

    @_reaching
    def request(self, id: str) -> dict:
        [raw] = self._fields(id, "request")
        if raw is None:
            raise KeyError(id)
        return json.loads(raw)

    @_reaching
    def settings(self, id: str) -> TrainSettings:
        raw, text = self._fields(id, "request", "text")
        if raw is None:
            raise KeyError(id)
        fields = dict(json.loads(raw)["settings"])
        if text is not None:
            fields["text"] = text.decode()
        return TrainSettings(**fields)

    @_reaching
    def state(self, id: str) -> dict:
        state, status, error = self._fields(id, "state", "status", "error")
        return (_json(state) or {"records": []}) | {"status": _decode(status) or "queued", "error": _decode(error)}

    def stored_status(self, id: str) -> str | None:
        """The status as written (None: no such run), without reading whether anyone holds the lease."""
        [status] = self._fields(id, "status")
        return _decode(status)

    @_reaching
    def is_training(self, id: str) -> bool:
        return bool(self.r.exists(lock_key(id)))

    @_reaching
    def patterns(self, id: str, step: int) -> list | None:
        [raw] = self._fields(id, f"patterns:{step}")
        return _json(raw)

    @_reaching
    def info(self, id: str, queue: list[str] | None = None) -> TrainingRunInfo:
        info, _ = self._info(id, queue)
        return info

    def _info(self, id: str, queue: list[str] | None) -> tuple[TrainingRunInfo, bytes | None]:
        """The run and its stream's last event id, read in one transaction (so nothing falls between)."""
        checked_run_id(id)
        pipe = self.r.pipeline(transaction=True)
        pipe.hmget(run_key(id), ["request", "status", "error", "state", "progress", "worker", "model_dir"])
        pipe.hkeys(run_key(id))
        pipe.exists(lock_key(id))
        pipe.xrevrange(events_key(id), count=1)
        (req, stored, error, state, progress, worker, model_dir), keys, locked, last = pipe.execute()
        if req is None:
            raise KeyError(id)
        names = {k.decode() for k in keys}
        info = run_info(
            id,
            json.loads(req),
            (_json(state) or {}) | {"error": _decode(error), "model_dir": _decode(model_dir)},
            status=_shown_status(_decode(stored) or "queued", bool(locked)),
            progress=_json(progress),
            snapshots=sorted(int(k.split(":", 1)[1]) for k in names if k.startswith("patterns:")),
            resumable="snapshot" in names,
            queue=queue,
            worker=_json(worker),
            cursor=last[0][0].decode() if last else "0-0",
        )
        return info, (last[0][0] if last else None)

    def stats(self) -> dict:
        """Runs by status (as shown), the queue's length, worker processes seen in the last 30 s."""
        ids = self.ids()
        pipe = self.r.pipeline(transaction=False)
        for id in ids:
            pipe.hget(run_key(id), "status")
            pipe.exists(lock_key(id))
        answers = pipe.execute()
        counts = dict.fromkeys(STATUSES, 0)
        for stored, locked in zip(answers[::2], answers[1::2]):
            counts[_shown_status(_decode(stored) or "queued", bool(locked))] += 1
        seen = [json.loads(v) for v in self.r.hvals(WORKERS)]
        alive = [w for w in seen if w.get("seen", 0) > time.time() - 30]
        return {
            "runs": counts,
            "queue": int(self.r.zcard(QUEUE)),
            "workers": sum(w["processes"] for w in alive),
            "worker_nodes": len(alive),
        }

    def _unleased(self, ids: list[str]) -> list[tuple[str, bytes | None, bytes | None, bytes | None]]:
        """(id, status, sent, queued_at) of each of these runs whose lease nobody holds, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for id in ids:
            pipe.hmget(run_key(id), ["status", "sent", "queued_at"])
            pipe.exists(lock_key(id))
        answers = pipe.execute()
        return [(id, *fields) for id, fields, locked in zip(ids, answers[::2], answers[1::2]) if not locked]

    def waiting(self) -> list[str]:
        """Runs queued, or cut short, that nobody trains: what a worker sends again when it starts, in case
        their messages were lost (a replica that died before sending, a Redis that lost its last second)."""
        return [id for id, status, _, _ in self._unleased(self.ids()) if status in (b"queued", b"running")]

    def model_folder(self, id: str) -> Path | None:
        """The run's weights in this machine's cache (read from Redis once, named by their hash)."""
        if self.error is not None:
            return None
        try:
            model_dir, model_hash = self._fields(id, "model_dir", "model_hash")
            if model_dir is None or model_hash is None:
                return None
            folder = self.cache / id / f"{model_dir.decode()}-{model_hash.decode()[:16]}"
            if folder.is_dir():
                return folder
            with self._cache_lock:
                return folder if folder.is_dir() else _fetch_model(self.r, id, folder)
        except (redis.RedisError, InputError):
            return None

    @_reaching
    def changes(self, id: str, since: str | None) -> tuple[list[tuple[str, object]], str, bool]:
        """From the run's stream: the event ids are the stream's, so a client that reconnects to any replica
        with Last-Event-ID gets what it missed. A stream with no (or an unknown) id gets the whole run first;
        so does one whose new events include a status change (a `run` event), after a `resumed` if any."""
        if since is None or not STREAM_ID.match(since):
            return self._whole(id, [])
        pipe = self.r.pipeline(transaction=True)
        pipe.xrange(events_key(id), min=f"({since}", count=1000)
        pipe.hget(run_key(id), "status")
        pipe.xrange(events_key(id), count=1)
        pipe.xrevrange(events_key(id), count=1)
        entries, stored, first, last = pipe.execute()
        here = _stream_id(since.encode())
        if not first or _stream_id(first[0][0]) > here or _stream_id(last[0][0]) < here:
            return self._whole(id, [])  # trimmed past the client's place, or a place this stream never had
        events, status_changed = _events(entries)
        if status_changed:
            return self._whole(id, [e for e in events if e[0] == "resumed"])
        cursor = entries[-1][0].decode() if entries else since
        return events, cursor, (_decode(stored) or "queued") in FINISHED

    def _whole(self, id: str, before: list) -> tuple[list[tuple[str, object]], str, bool]:
        info, _ = self._info(id, self.queue())
        return before + [("run", info)], info.event_id, info.status in FINISHED

    # ---------------------------------------------------------------- changing

    @_reaching
    def create(self, s: TrainSettings, client: str, room: Room | None = None) -> tuple[str, bool]:
        id = training_run_id(s)
        fields = dataclasses.asdict(s)
        if s.text is not None:
            fields["text"] = None
        now = time.time()
        request = {
            "id": id,
            "settings": fields,
            "text_sha256": s.text and text_hash(s.text),
            "created_at": now,
            "client": client,
        }
        state = {"records": [], "updated_at": now}
        made, count = self._scripts["create"](
            keys=[run_key(id), RUNS, QUEUE, ACTIVE, client_key(client), events_key(id)],
            args=[id, dumps(request), s.text or "", dumps(state), repr(now), *_room_args(room), STREAM_MAXLEN],
        )
        _no_room(made, count)
        if made or self._unsent(id, SEND_GRACE_S):  # the same request again heals a run whose task was never sent
            self.submit(id)
        return id, bool(made)

    @_reaching
    def requeue(self, id: str, client: str | None = None, room: Room | None = None) -> None:
        req = self.request(id)
        made, count = self._scripts["requeue"](
            keys=[run_key(id), lock_key(id), QUEUE, ACTIVE, client_key(req["client"]), events_key(id)],
            args=[id, repr(req["created_at"]), *_room_args(room), repr(time.time()), STREAM_MAXLEN],
        )
        _no_room(made, count)
        if made:
            self.submit(id)

    def submit(self, id: str) -> None:
        """Send the run's task (`send`: Celery's, app/training/jobs.py), then mark the run as sent. Between its
        creation and this mark a run has no task that anyone knows of: a replica that dies there, or a broker
        that refuses the message, leaves it to the same request made again (create) or to a worker's sweep
        (`unsent`); a second message is harmless (a run trains once)."""
        if self.send is None:
            raise RuntimeError("this RedisStore sends no tasks: open it with app.training.open_redis")
        self.send(id)
        self.r.hset(run_key(id), "sent", repr(time.time()))

    def _unsent(self, id: str, older_than_s: float) -> bool:
        status, sent, queued_at = self._fields(id, "status", "sent", "queued_at")
        return _never_sent(status, sent, queued_at, older_than_s)

    @_reaching
    def unsent(self) -> list[str]:
        """Runs queued for longer than Timing.unsent_s whose task was never sent: a worker sends them."""
        ids = [as_text(id) for id in self.r.zrange(QUEUE, 0, -1)]
        unsent_s = self.timing.unsent_s
        return [id for id, status, sent, at in self._unleased(ids) if _never_sent(status, sent, at, unsent_s)]

    @_reaching
    def request_cancel(self, id: str) -> None:
        req = self.request(id)
        self._scripts["cancel"](
            keys=[run_key(id), lock_key(id), QUEUE, ACTIVE, client_key(req["client"]), events_key(id)],
            args=[id, STREAM_MAXLEN],
        )

    @_reaching
    def size(self, id: str) -> int:
        return sum(self.r.memory_usage(key, samples=0) or 0 for key in (run_key(id), events_key(id)))

    @_reaching
    def evict(self) -> list[str]:
        ids = self.ids()
        sizes = {id: self.size(id) for id in ids}
        total = sum(sizes.values())
        deleted = []
        for id in reversed(ids):  # oldest first
            if total <= self.max_bytes:
                break
            if self._scripts["delete"](keys=[run_key(id), lock_key(id), events_key(id), RUNS], args=[id]):
                total -= sizes[id]
                deleted.append(id)
        return deleted


def register_worker(store: RedisStore, node: str, processes: int, version: str) -> None:
    """A Celery worker says it is alive (app/worker.py, every few seconds): /metrics counts them."""
    store.r.hset(
        WORKERS,
        node,
        dumps({"host": HOST, "pid": os.getpid(), "processes": processes, "version": version, "seen": time.time()}),
    )


def unregister_worker(store: RedisStore, node: str) -> None:
    """A worker shutting down: gone from the count, and its trainers put their runs back (Lease)."""
    pipe = store.r.pipeline(transaction=True)
    pipe.hdel(WORKERS, node)
    pipe.set(stopping_key(node), "1", ex=max(60, int(store.timing.pickup_s)))
    pipe.execute()


def _asked(store: RedisStore, ask: Callable[[], Any], nothing: Any) -> Any:
    """A catalogue's question: `nothing` when Redis is known to be away, or does not answer."""
    if store.error is not None:
        return nothing
    try:
        return ask()
    except redis.RedisError:
        return nothing


def _fetch_model(r: redis.Redis, id: str, folder: Path) -> Path | None:
    """Read the run's weight files into `folder` (whole: a temporary folder renamed into place)."""
    names = [k for k in map(as_bytes, r.hkeys(run_key(id))) if k.startswith(b"model:")]
    pipe = r.pipeline(transaction=True)
    pipe.hmget(run_key(id), names or ["model:"])
    pipe.hget(run_key(id), "model_hash")
    files, model_hash = pipe.execute()
    if not names or model_hash is None or not folder.name.endswith(as_text(model_hash)[:16]):
        return None  # replaced while we read: the next request reads the new one
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    for name, data in zip(names, files):
        (tmp / name.decode().split(":", 1)[1]).write_bytes(data)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process of this machine made it first
        shutil.rmtree(tmp, ignore_errors=True)
    for old in folder.parent.iterdir():  # earlier exports of this run
        if old != folder and not old.name.startswith("."):
            shutil.rmtree(old, ignore_errors=True)
    return folder


def _room_args(room: Room | None) -> list:
    return [-1, 0] if room is None else [room.per_client, room.total]


def _no_room(made: int, count: int) -> None:
    if made == -1:
        raise NoRoom("client", count)
    if made == -2:
        raise NoRoom("server", count)


def _shown_status(stored: str, locked: bool) -> Status:
    if stored == "queued" and locked:
        return "running"  # taken up; the trainer has not written yet
    if stored == "running" and not locked:
        return "queued"  # its worker is gone: the run waits for another to take it up (app/training/jobs.py)
    return cast(Status, stored)  # what this store wrote: one of STATUSES


def _events(entries: list) -> tuple[list[tuple[str, object]], bool]:
    """A stream's new entries as a client gets them: each record (and `resumed`) as it came, the latest progress
    once at the end; and whether a `run` event (a status change) came, where reading stops: the whole run
    follows instead."""
    events: list[tuple[str, object]] = []
    progress = None
    for _entry, fields in entries:
        name, data = fields[b"event"].decode(), json.loads(fields[b"data"])
        if name == "run":
            return events, True
        if name == "progress":
            progress = data
        else:
            events.append((name, data))
    return events + ([("progress", progress)] if progress is not None else []), False


def _stream_id(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.decode().partition("-")
    return int(ms), int(seq or 0)
