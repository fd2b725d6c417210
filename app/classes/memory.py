"""Classes kept in this process (the embedded default): one worker process, as `make serve` runs it.

Every method runs on the event loop, so the state needs no lock; a follower waiting for news awaits an
asyncio.Condition the writers notify. A class idle for `idle_s` (no teacher or student action) is
forgotten when any class is next touched.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

from app.classes.base import ClassEvent, ClassFull, ClassNotFound, LiveClass, Poll

LOG_LENGTH = 256  # events a class keeps for followers who reconnect; older ones get the snapshot


@dataclass
class _Class:
    info: LiveClass
    touched: float
    students: set[str] = field(default_factory=set)
    polls: dict[int, Poll] = field(default_factory=dict)
    answers: dict[int, dict[str, int]] = field(default_factory=dict)  # poll id -> student -> option
    log: list[ClassEvent] = field(default_factory=list)
    seq: int = 0
    ended: bool = False


class MemoryClassStore:
    def __init__(self, idle_s: float, clock=time.monotonic):
        self.idle_s = idle_s
        self.clock = clock
        self._classes: dict[str, _Class] = {}
        self._changed = asyncio.Condition()
        self._guesses: dict[str, deque[float]] = defaultdict(deque)  # client -> times of its wrong codes

    def _expire(self) -> None:
        now = self.clock()
        for code in [c for c, k in self._classes.items() if now - k.touched > self.idle_s]:
            del self._classes[code]

    def _live(self, code: str) -> _Class:
        self._expire()
        k = self._classes.get(code)
        if k is None or k.ended:
            raise ClassNotFound(code)
        return k

    async def _emit(self, k: _Class, name: str, data: dict) -> ClassEvent:
        k.seq += 1
        event = ClassEvent(str(k.seq), name, data)
        k.log = [*k.log[-(LOG_LENGTH - 1) :], event]
        k.info.last_event = event.id
        k.touched = self.clock()
        async with self._changed:
            self._changed.notify_all()
        return event

    async def create(self, code: str, teacher_hash: str, path: str) -> LiveClass:
        self._expire()
        if code in self._classes:
            raise KeyError(code)
        info = LiveClass(code=code, teacher_hash=teacher_hash, created_at=time.time(), path=path, students=0)
        k = self._classes[code] = _Class(info=info, touched=self.clock())
        await self._emit(k, "state", {"path": path})
        return info

    async def get(self, code: str) -> LiveClass:
        return self._live(code).info

    async def set_path(self, code: str, path: str) -> ClassEvent:
        k = self._live(code)
        k.info.path = path
        return await self._emit(k, "state", {"path": path})

    async def join(self, code: str, student: str, max_students: int) -> int:
        k = self._live(code)
        if student not in k.students:
            if len(k.students) >= max_students:
                raise ClassFull(code)
            k.students.add(student)
            k.info.students = len(k.students)
        k.touched = self.clock()
        return len(k.students)

    async def add_poll(self, code: str, question: str, options: list[str], kind: str = "free") -> Poll:
        k = self._live(code)
        if k.info.poll is not None:
            await self.close_poll(code, k.info.poll.id, None)
        poll = Poll(id=len(k.polls) + 1, question=question, options=list(options), counts=[0] * len(options), kind=kind)
        k.polls[poll.id], k.answers[poll.id] = poll, {}
        k.info.poll = poll
        await self._emit(k, "poll", poll.public())
        return poll

    async def answer(self, code: str, poll_id: int, student: str, option: int) -> None:
        k = self._live(code)
        poll = k.polls.get(poll_id)
        if poll is None or poll.closed:
            raise KeyError(poll_id)
        k.answers[poll_id][student] = option
        k.touched = self.clock()

    async def poll(self, code: str, poll_id: int) -> Poll:
        k = self._live(code)
        poll = k.polls.get(poll_id)
        if poll is None:
            raise KeyError(poll_id)
        counts = [0] * len(poll.options)
        for option in k.answers[poll_id].values():
            counts[option] += 1
        poll.counts = counts
        return poll

    async def close_poll(self, code: str, poll_id: int, answer: str | None, detail: dict | None = None) -> ClassEvent:
        poll = await self.poll(code, poll_id)
        k = self._live(code)
        poll.closed, poll.answer, poll.detail = True, answer, detail
        if k.info.poll is poll:
            k.info.poll = None
        return await self._emit(k, "poll_closed", poll.result())

    async def end(self, code: str) -> None:
        k = self._live(code)
        await self._emit(k, "ended", {})
        k.ended = True

    def _recent(self, client: str, window_s: float) -> deque[float]:
        times, now = self._guesses[client], self.clock()
        while times and now - times[0] > window_s:
            times.popleft()
        return times

    async def guesses(self, client: str, window_s: float) -> tuple[int, float]:
        times = self._recent(client, window_s)
        return len(times), (self.clock() - times[0] if times else 0.0)

    async def guessed(self, client: str, window_s: float) -> None:
        self._recent(client, window_s).append(self.clock())
        if len(self._guesses) > 100_000:  # an address flood: forget the oldest clients
            for stale in list(self._guesses)[:50_000]:
                del self._guesses[stale]

    def _after(self, k: _Class, after: str | None) -> list[ClassEvent]:
        ids = [e.id for e in k.log]
        if after is not None and after in ids:
            return k.log[ids.index(after) + 1 :]
        if after is not None and after.isdigit() and int(after) >= k.seq:
            return []  # up to date (or ahead of a class that restarted: nothing newer to send)
        snapshot = [ClassEvent(k.info.last_event or "0", "state", {"path": k.info.path})]
        if k.info.poll is not None:
            snapshot.append(ClassEvent(k.info.last_event or "0", "poll", k.info.poll.public()))
        return snapshot

    async def events(self, code: str, after: str | None, wait_s: float) -> list[ClassEvent]:
        k = self._classes.get(code)
        if k is None:
            raise ClassNotFound(code)
        found = self._after(k, after)
        if found or k.ended:
            return found
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(self._after(k, after))), wait_s)
            except TimeoutError:
                return []
        return self._after(k, after)

    async def close(self) -> None:
        self._classes.clear()
