"""The training queue beyond one machine: Celery on the Redis broker (EXPLORER_REDIS_URL).

A replica that creates a run in Redis (app/training/redis_store.py) sends one task, `explorer.train`, with
the run's id and the code version that queued it; a worker (`python -m app.worker`, on any machine that
reaches Redis) trains it with the same loop as the embedded mode (app/training/worker.py `train`).

Configured for long CPU jobs, after Celery's "Tasks" guide:
- late acknowledgement (`task_acks_late`): the message is acknowledged when the run ends, not when it
  starts, so a run whose worker dies is still in the broker;
- `task_reject_on_worker_lost`: a training process killed under a live worker puts the message back at once;
- one task prefetched per worker process (`worker_prefetch_multiplier=1`): a worker never sits on runs
  another could start;
- JSON only (`task_serializer`, `accept_content`): no pickle, so a reachable broker cannot make a worker
  run code; the worker knows one task name and takes only a run id from it (the settings come from the
  run's request in Redis, checked by core.recipes as every request is); remote control is off.

When a whole worker machine dies, nobody rejects its message: Celery's Redis transport gives an
unacknowledged message to another worker once it is older than the visibility timeout. The timeout and
the run's lease are derived from one setting, EXPLORER_TRAIN_PICKUP_S (redis_store.Timing), so the run is
taken up within that time. The same timeout also redelivers a run that is still training when it takes
longer than the timeout: that delivery finds the lease held and asks again later (a retry), so it neither
trains the run a second time nor drops it, and takes the run up if the lease ever expires.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import redis
from celery import Celery
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from app import __version__
from app.settings import get_settings
from app.training.base import FINISHED, HOST, StoreUnavailable, is_training_run_id
from app.training.redis_store import RedisStore, Send, Timing, lock_key, unreachable
from app.training.redis_writer import LeaseLost, RedisWriter, acquire, fenced
from app.training.worker import train

log = logging.getLogger("app.training.jobs")

TASK = "explorer.train"
QUEUE = "explorer-training"
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError, StoreUnavailable)
REDIS_BACK_WAIT_S = 300  # how long a trainer that lost Redis waits for it to come back, to say "interrupted"

celery = Celery("explorer", set_as_current=False)


def configure(redis_url: str, timing: Timing, app: Celery = celery) -> Celery:
    """A Celery app (the worker's own, by default) on this broker, with the timeouts the pickup time sets."""
    t = timing
    app.conf.update(
        broker_url=redis_url,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker outlives a Redis restart
        broker_transport_options={
            "visibility_timeout": t.visibility_s,
            "unacked_restore_interval": t.restore_s,
            "unacked_restore_throttle": 1,  # every sweep looks
            "unacked_mutex_expire": max(5, t.restore_s),
            "socket_timeout": 10,
            "socket_connect_timeout": 5,
            "health_check_interval": 10,
        },
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
    )
    return app


_senders: dict[str, Celery] = {}  # a sending app per broker (a process may reach more than one: the tests)
_senders_lock = threading.Lock()


def sender(url: str, timing: Timing) -> Send:
    """How a store on this broker sends a run's task (RedisStore's `send`: from a replica, or a worker's
    sweep): the broker refusing the message is StoreUnavailable, which the service answers with 503."""

    def send(id: str) -> None:
        with _senders_lock:
            if url not in _senders:
                _senders[url] = configure(url, timing, Celery("explorer-sender", set_as_current=False))
            app = _senders[url]
        try:
            app.send_task(TASK, args=[id, __version__], queue=QUEUE)
        except OperationalError as e:
            raise StoreUnavailable(unreachable(url, e)) from e

    return send


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


_stores: dict[str, RedisStore] = {}


def _store() -> RedisStore:
    """The training processes' store: they read and write their runs and send no task (a run this worker puts
    back goes back through Celery itself, Reject below)."""
    s = get_settings()
    url = s.redis_url or ""  # set: Celery runs these processes only with Redis
    if url not in _stores:
        _stores[url] = RedisStore.from_settings(s)
    return _stores[url]


@celery.task(name=TASK, bind=True, max_retries=None, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def train_run(self, id: str, version: str) -> str:
    """Train one run, if it still needs training and nobody else is: returns what became of it."""
    if not isinstance(id, str) or not is_training_run_id(id) or not isinstance(version, str):
        log.error("refusing a task that is not a run: %r %r", id, version)
        return "refused"
    store = _store()
    if version_tuple(version) > version_tuple(__version__):
        log.warning(
            "refusing run %s: it was queued by version %s and this worker runs %s, which may not train it "
            "the same way; upgrade this worker (it goes back to the queue for another)",
            id,
            version,
            __version__,
        )
        raise self.retry(countdown=max(5.0, store.timing.pickup_s / 4))
    stored = store.stored_status(id)
    if stored is None or stored in FINISHED:
        return stored or "gone"  # done, stopped, or deleted: nothing to do (a second delivery)
    lease = acquire(store, id, os.environ.get("EXPLORER_WORKER_NODE"))
    if lease is None:  # another worker trains it now: ask again later, in case it dies
        raise self.retry(countdown=store.timing.retry_s)
    try:
        return _train_leased(store, id, lease)
    except LeaseLost:
        log.warning(
            "run %s: lost its lease (a stall longer than %.1f s); another delivery takes it up",
            id,
            store.timing.lease_s,
        )
        raise self.retry(countdown=store.timing.retry_s) from None
    finally:
        lease.release()


def _train_leased(store: RedisStore, id: str, lease) -> str:
    stored = store.stored_status(id)
    if stored in FINISHED:
        return stored
    writer = RedisWriter(store, id, lease)
    worker = {"host": HOST, "pid": os.getpid()}
    if stored == "running":  # cut short: its worker died (the lease expired)
        [beat, progress] = store._fields(id, "heartbeat_at", "progress")
        gap = time.time() - float(beat) if beat else None
        lost_at = max(json.loads(progress)["step"] if progress else 0, store.state(id).get("step", 0))
        writer.cut_short = {
            "id": id,
            "lost_at_step": lost_at,
            "lost_worker": _parse(store, id, "worker"),
            "worker": worker,
            "gap_s": gap,
        }
        log.info(
            "run %s: taking it up after %s s without a worker, from its snapshot",
            id,
            "?" if gap is None else f"{gap:.1f}",
        )
    writer.begin(worker)
    try:
        status = train(writer, lease.should_stop, lambda: lease.cancelled)
    except LeaseLost:
        raise
    except REDIS_AWAY:
        log.exception("run %s: Redis went away mid-run", id)
        return _after_redis_loss(store, id, lease)
    except Exception as exc:  # a bug, or a settings problem found late: the run says so
        log.exception("run %s failed", id)
        try:
            writer.write_state(
                store.state(id)
                | {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "finished_at": time.time()}
            )
        except REDIS_AWAY:
            return _after_redis_loss(store, id, lease)
        return "failed"
    if status == "interrupted" and lease.stopping:  # this worker is shutting down: another takes it up
        writer.write_state(store.state(id) | {"status": "queued"})
        lease.release()
        log.info("run %s: worker shutting down, back in the queue from its snapshot", id)
        raise Reject(requeue=True)
    if lease.lost:
        raise LeaseLost(id)
    return status


def _parse(store: RedisStore, id: str, field: str):
    [raw] = store._fields(id, field)
    return json.loads(raw) if raw else None


def _after_redis_loss(store: RedisStore, id: str, lease) -> str:
    """Wait for Redis to come back, then mark the run interrupted (resumable: the same request continues it
    from its last snapshot), unless another worker has taken it up meanwhile."""
    lease.release()  # stop renewing; the token below is ours again only if nobody took the run
    deadline = time.monotonic() + REDIS_BACK_WAIT_S
    while time.monotonic() < deadline:
        try:
            store.r.ping()
            break
        except redis.RedisError:
            time.sleep(0.5)
    else:
        return "lost"  # the run shows as waiting for a worker; its message comes back with Redis
    try:
        mine = store.r.get(lock_key(id)) == lease.token.encode()  # Redis came back before the lease expired
        if not mine and not store.r.set(lock_key(id), lease.token, nx=True, px=int(store.timing.lease_s * 1000)):
            return "taken up elsewhere"
        client = store.request(id)["client"]
        error = "Redis was unreachable mid-run: start the same run again to continue from its last snapshot"
        fenced(
            store,
            id,
            lease.token,
            set={"status": "interrupted", "error": error},
            events=[("run", {"status": "interrupted"})],
            mode="finish",
            client=client,
        )
        log.info("run %s: marked interrupted after Redis came back", id)
        return "interrupted"
    except (redis.RedisError, StoreUnavailable, LeaseLost):
        log.exception("run %s: could not mark it interrupted", id)
        return "lost"
    finally:
        lease.release()
