"""What a live class is, and what every place that keeps classes answers (the `ClassStore` protocol).

A class is a teacher's view pushed to students: its code, the teacher's token (kept only as a hash), the
path of the page the teacher is on, its polls, and an ordered log of events the students follow:

    state        {"path": "/?text=..."}                         the teacher moved
    poll         {"id", "question", "options"}                   a question was asked
    poll_closed  {"id", "question", "options", "counts", "answer"}  its answers, and the model's answer
    ended        {}                                              the teacher ended the class

Each event has an id, opaque to clients and increasing within a class: a student's EventSource sends the
last one back as Last-Event-ID when it reconnects (to any replica, in the Redis store) and gets what it
missed. Nothing personal is kept: a student is a random id from a cookie, counted and answering polls.

Three stores implement the protocol: memory.py (in process: the embedded default, one worker process),
sqlite_store.py (one file every worker process of a machine shares: several workers without Redis) and
redis_store.py (EXPLORER_REDIS_URL: every replica sees every class). All are async: the class routes run
on the event loop (they compute nothing), and a follower's stream waits on the store without a thread.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Protocol

# Codes are typed from a projector or read aloud: no 0/O, 1/I/L, 5/S, 8/B, 2/Z. 26 symbols, 8 of them:
# 2.1 × 10¹¹ codes, and guessing is rate-limited (app/service/classes.py).
ALPHABET = "34679ACDEFGHJKMNPQRTUVWXY"
CODE_LENGTH = 8
EVENT_NAMES = ("state", "poll", "poll_closed", "ended")
# What a poll asks: free text (the teacher reveals their own pick), or a question the server answers from the
# model of the class's page when the teacher reveals (app/service/class_answers.py).
POLL_KINDS = ("free", "next_token", "induction_head")


class ClassNotFound(LookupError):
    """No class has this code (never had, expired, or ended)."""


class ClassFull(Exception):
    """The class has as many students as the settings allow."""


class StoreDown(Exception):
    """The place classes live cannot be reached now (Redis away): try again shortly."""


def new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What is stored of a teacher's token: a hash (the token itself is only in the teacher's hands)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class ClassEvent:
    id: str
    name: str  # one of EVENT_NAMES
    data: dict


@dataclass
class Poll:
    id: int
    question: str
    options: list[str]
    counts: list[int] = field(default_factory=list)  # answers per option, in the options' order
    closed: bool = False
    answer: str | None = None  # what the teacher revealed as the model's answer, when closed
    kind: str = "free"  # one of POLL_KINDS
    detail: dict | None = None  # the model's answer as computed: its model, token and probability, or head and score

    def public(self) -> dict:
        return {"id": self.id, "question": self.question, "options": self.options, "kind": self.kind}

    def result(self) -> dict:
        return {
            **self.public(),
            "counts": self.counts,
            "closed": self.closed,
            "answer": self.answer,
            "detail": self.detail,
        }


@dataclass
class LiveClass:
    code: str
    teacher_hash: str
    created_at: float
    path: str  # the teacher's current page
    students: int  # students who have joined
    poll: Poll | None = None  # the poll open now, if any
    last_event: str | None = None  # the id of the newest event


class ClassStore(Protocol):
    """Where classes live. Every method raises ClassNotFound for a code that is not a running class."""

    async def create(self, code: str, teacher_hash: str, path: str) -> LiveClass:
        """A new class (False-free: a code already in use raises KeyError, the caller draws another)."""
        ...

    async def get(self, code: str) -> LiveClass: ...

    async def set_path(self, code: str, path: str) -> ClassEvent: ...

    async def join(self, code: str, student: str, max_students: int) -> int:
        """Count a student in (once); raise ClassFull beyond max_students. Returns the number of students."""
        ...

    async def add_poll(self, code: str, question: str, options: list[str], kind: str = "free") -> Poll:
        """A new open poll (closing the one open before, if any)."""
        ...

    async def answer(self, code: str, poll_id: int, student: str, option: int) -> None:
        """A student's answer: one per student, a second replaces the first. KeyError: no such open poll."""
        ...

    async def poll(self, code: str, poll_id: int) -> Poll:
        """The poll with its counts. KeyError: no such poll."""
        ...

    async def close_poll(
        self, code: str, poll_id: int, answer: str | None, detail: dict | None = None
    ) -> ClassEvent: ...

    async def end(self, code: str) -> None:
        """End the class: followers get `ended`, and the code stops working."""
        ...

    async def guesses(self, client: str, window_s: float) -> tuple[int, float]:
        """The wrong codes `client` tried in the last window_s seconds, and how long ago the oldest of them
        was: counted wherever the store is shared (every worker, every replica), so the limit holds there."""
        ...

    async def guessed(self, client: str, window_s: float) -> None:
        """One more wrong code from `client`, forgotten window_s seconds later."""
        ...

    async def events(self, code: str, after: str | None, wait_s: float) -> list[ClassEvent]:
        """The events after `after`, waiting up to wait_s for one when there are none. `after` None, or
        an id the log no longer holds, gets where the class is now: its state, and its open poll."""
        ...

    async def close(self) -> None:
        """Release connections (at shutdown)."""
        ...
