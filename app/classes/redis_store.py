"""Classes in Redis (EXPLORER_REDIS_URL): a teacher on one replica and students on others stay in step,
and a replica killed under a class loses nobody (its followers reconnect to another, with Last-Event-ID).

Five keys a class, all expiring together `idle_s` after the class's last write:

    explorer:class:{code}            hash: teacher_hash, created_at, path, poll (the open poll's id), polls, ended
    explorer:class:{code}:events     stream: the log followers read (XREAD BLOCK), ids as Redis makes them
    explorer:class:{code}:students   set: the students' random ids
    explorer:class:{code}:polls      hash: poll id -> {question, options, closed, answer} as JSON
    explorer:class:{code}:answers    hash: "{poll id}:{student}" -> the option's index

and, for the rate limit on wrong codes, explorer:class-guesses:{client} (a sorted set by time, expiring).
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, FieldT

from app.classes.base import ClassEvent, ClassFull, ClassNotFound, LiveClass, Poll, StoreDown

LOG_LENGTH = 256  # about: XADD's MAXLEN ~ trims in whole nodes

# Count a student in, atomically across replicas: -1 no class, -2 full, else the number of students.
JOIN = """
if redis.call('HGET', KEYS[1], 'ended') ~= '0' then return -1 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return redis.call('SCARD', KEYS[2]) end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[2]) then return -2 end
redis.call('SADD', KEYS[2], ARGV[1])
return redis.call('SCARD', KEYS[2])
"""


P = ParamSpec("P")
T = TypeVar("T")


def _reaching(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Redis away (refused, timed out) is StoreDown, which the service answers with 503 + Retry-After."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise StoreDown(str(e)) from None

    return call


def _key(code: str, part: str = "") -> str:
    return f"explorer:class:{code}" + (f":{part}" if part else "")


def _guesses_key(client: str) -> str:
    """A sorted set of the wrong codes one client tried (scored by time), shared by every replica."""
    return f"explorer:class-guesses:{client[:64]}"


class RedisClassStore:
    def __init__(self, url: str, idle_s: float):
        # A hung Redis answers nothing: every read gives up after socket_timeout (StoreDown, 503), longer than
        # a follower's blocking XREAD (app/service/classes.py EVENTS_WAIT_S).
        self.r = aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=2, socket_timeout=15, health_check_interval=10
        )
        self.idle_s = idle_s
        self._join = self.r.register_script(JOIN)

    async def _touch(self, code: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        for part in ("", "events", "students", "polls", "answers"):
            pipe.expire(_key(code, part), int(self.idle_s))
        await pipe.execute()

    async def _fields(self, code: str) -> dict:
        fields = await self.r.hgetall(_key(code))
        if not fields or fields.get("ended") != "0":
            raise ClassNotFound(code)
        return fields

    async def _emit(self, code: str, name: str, data: dict) -> ClassEvent:
        id = await self.r.xadd(
            _key(code, "events"), {"name": name, "data": json.dumps(data)}, maxlen=LOG_LENGTH, approximate=True
        )
        await self._touch(code)
        return ClassEvent(str(id), name, data)  # a decoding client: the id is a str

    async def _poll(self, code: str, poll_id: int) -> Poll:
        raw = await self.r.hget(_key(code, "polls"), str(poll_id))
        if raw is None:
            raise KeyError(poll_id)
        p = json.loads(raw)
        return Poll(
            id=poll_id,
            question=p["question"],
            options=p["options"],
            closed=p["closed"],
            answer=p["answer"],
            kind=p.get("kind", "free"),
            detail=p.get("detail"),
        )

    @_reaching
    async def create(self, code: str, teacher_hash: str, path: str) -> LiveClass:
        created_at = time.time()
        fields: dict[FieldT, EncodableT] = {
            "teacher_hash": teacher_hash,
            "created_at": created_at,
            "path": path,
            "poll": "",
            "polls": 0,
        }
        if not await self.r.hsetnx(_key(code), "ended", "0"):
            raise KeyError(code)
        await self.r.hset(_key(code), mapping=fields)
        event = await self._emit(code, "state", {"path": path})
        return LiveClass(code, teacher_hash, created_at, path, 0, None, event.id)

    @_reaching
    async def get(self, code: str) -> LiveClass:
        fields = await self._fields(code)
        pipe = self.r.pipeline(transaction=False)
        pipe.scard(_key(code, "students"))
        pipe.xrevrange(_key(code, "events"), count=1)
        students, last = await pipe.execute()
        poll = await self._poll(code, int(fields["poll"])) if fields.get("poll") else None
        return LiveClass(
            code=code,
            teacher_hash=fields["teacher_hash"],
            created_at=float(fields["created_at"]),
            path=fields["path"],
            students=int(students),
            poll=poll,
            last_event=last[0][0] if last else None,
        )

    @_reaching
    async def set_path(self, code: str, path: str) -> ClassEvent:
        await self._fields(code)
        await self.r.hset(_key(code), "path", path)
        return await self._emit(code, "state", {"path": path})

    @_reaching
    async def join(self, code: str, student: str, max_students: int) -> int:
        n = await self._join(keys=[_key(code), _key(code, "students")], args=[student, max_students])
        if n == -1:
            raise ClassNotFound(code)
        if n == -2:
            raise ClassFull(code)
        await self._touch(code)
        return int(n)

    @_reaching
    async def add_poll(self, code: str, question: str, options: list[str], kind: str = "free") -> Poll:
        fields = await self._fields(code)
        if fields.get("poll"):
            await self.close_poll(code, int(fields["poll"]), None)
        poll_id = int(await self.r.hincrby(_key(code), "polls", 1))
        poll = Poll(id=poll_id, question=question, options=list(options), counts=[0] * len(options), kind=kind)
        record = {"question": question, "options": poll.options, "closed": False, "answer": None, "kind": kind}
        await self.r.hset(_key(code, "polls"), str(poll_id), json.dumps(record))
        await self.r.hset(_key(code), "poll", str(poll_id))
        await self._emit(code, "poll", poll.public())
        return poll

    @_reaching
    async def answer(self, code: str, poll_id: int, student: str, option: int) -> None:
        await self._fields(code)
        if (await self._poll(code, poll_id)).closed:
            raise KeyError(poll_id)
        await self.r.hset(_key(code, "answers"), f"{poll_id}:{student}", option)
        await self._touch(code)

    @_reaching
    async def poll(self, code: str, poll_id: int) -> Poll:
        await self._fields(code)
        poll = await self._poll(code, poll_id)
        counts = [0] * len(poll.options)
        async for _, option in self.r.hscan_iter(_key(code, "answers"), match=f"{poll_id}:*", count=500):
            counts[int(option)] += 1
        poll.counts = counts
        return poll

    @_reaching
    async def close_poll(self, code: str, poll_id: int, answer: str | None, detail: dict | None = None) -> ClassEvent:
        poll = await self.poll(code, poll_id)
        poll.closed, poll.answer, poll.detail = True, answer, detail
        record = {
            "question": poll.question,
            "options": poll.options,
            "closed": True,
            "answer": answer,
            "kind": poll.kind,
            "detail": detail,
        }
        await self.r.hset(_key(code, "polls"), str(poll_id), json.dumps(record))
        fields = await self.r.hgetall(_key(code))
        if fields.get("poll") == str(poll_id):
            await self.r.hset(_key(code), "poll", "")
        return await self._emit(code, "poll_closed", poll.result())

    @_reaching
    async def end(self, code: str) -> None:
        await self._fields(code)
        await self.r.hset(_key(code), "ended", "1")
        await self._emit(code, "ended", {})

    @_reaching
    async def guesses(self, client: str, window_s: float) -> tuple[int, float]:
        now, key = time.time(), _guesses_key(client)
        pipe = self.r.pipeline(transaction=False)
        pipe.zremrangebyscore(key, "-inf", now - window_s)
        pipe.zcard(key)
        pipe.zrange(key, 0, 0, withscores=True)
        _, n, oldest = await pipe.execute()
        return int(n), (now - float(oldest[0][1]) if oldest else 0.0)

    @_reaching
    async def guessed(self, client: str, window_s: float) -> None:
        now, key = time.time(), _guesses_key(client)
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(key, {f"{now}:{secrets.token_hex(4)}": now})
        pipe.expire(key, int(window_s) + 1)
        await pipe.execute()

    async def _snapshot(self, code: str) -> list[ClassEvent]:
        info = await self.get(code)
        snapshot = [ClassEvent(info.last_event or "0-0", "state", {"path": info.path})]
        if info.poll is not None:
            snapshot.append(ClassEvent(info.last_event or "0-0", "poll", info.poll.public()))
        return snapshot

    @staticmethod
    def _event(id: str, fields: dict) -> ClassEvent:
        return ClassEvent(id, fields["name"], json.loads(fields["data"]))

    @_reaching
    async def events(self, code: str, after: str | None, wait_s: float) -> list[ClassEvent]:
        stream = _key(code, "events")
        first = await self.r.xrange(stream, count=1)
        if not first:
            raise ClassNotFound(code)
        if after is None or not _is_stream_id(after) or _older(after, str(first[0][0])):
            return await self._snapshot(code)  # a new follower, or one the trimmed log no longer reaches
        # a decoding client's XREAD reply: [(stream, [(id, fields), ...])]
        found = cast(
            list[tuple[str, list[tuple[str, dict[str, str]]]]],
            await self.r.xread({stream: after}, count=LOG_LENGTH, block=max(1, int(wait_s * 1000))),
        )
        return [self._event(id, fields) for _, entries in found for id, fields in entries]

    async def close(self) -> None:
        await self.r.aclose()


def _is_stream_id(text: str) -> bool:
    ms, _, seq = text.partition("-")
    return ms.isdigit() and seq.isdigit()


def _older(a: str, b: str) -> bool:
    """Is stream id a before b (a follower's last id before the first the log still holds)?"""
    return tuple(map(int, a.split("-"))) < tuple(map(int, b.split("-")))
