"""Classes in one SQLite file that every worker process of one machine shares (EXPLORER_WORKERS > 1 without
EXPLORER_REDIS_URL: `docker compose up` runs two). A student's requests may reach any worker, and each
worker sees every class. The file is `.classes.sqlite3` in the runs folder (EXPLORER_RUNS_DIR, the
image's /data/runs volume), in WAL mode: readers never wait for the writer, and a write is a few rows.

    classes   code, teacher_hash, created_at, path, poll (the open poll's id), polls, seq, ended, touched
    events    code, seq, name, data (JSON): the log followers read, the last LOG_LENGTH of each class
    students  code, student: the students' random ids
    polls     code, id, question, options (JSON), closed, answer, kind, detail (JSON: the model's answer)
    answers   code, poll, student, option: one row per student and poll, a second answer replaces it
    guesses   client, at: the wrong codes a client tried, for the rate limit every worker counts

News reaches a waiting follower at once from a write in its own process, and within WATCH_S from
another process's: one task per process asks SQLite every WATCH_S whether anyone else wrote
(`PRAGMA data_version`, no read of a table), and only then reads the `seq` of the classes its followers
wait on. So a process's cost of watching is the same for one follower as for sixty.

Every statement is a few rows on an indexed key (well under a millisecond): they run on the event
loop itself, as the memory store's do, with no thread; a write waits at most BUSY_MS for another
process's write to finish. A class idle for `idle_s` is deleted by the next write that looks (at most
every SWEEP_S). Ids are the class's event numbers, as text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from app.classes.base import ClassEvent, ClassFull, ClassNotFound, LiveClass, Poll

LOG_LENGTH = 256  # events a class keeps for followers who reconnect; older ones get the snapshot
WATCH_S = 0.05  # how often a process looks for another process's writes while it has followers waiting
BUSY_MS = 5000  # how long a write waits for another process's to finish
SWEEP_S = 60.0  # how often idle classes and old guesses are deleted, at most
FILE_NAME = ".classes.sqlite3"

SCHEMA = """
CREATE TABLE IF NOT EXISTS classes (
    code TEXT PRIMARY KEY, teacher_hash TEXT NOT NULL, created_at REAL NOT NULL, path TEXT NOT NULL,
    poll INTEGER, polls INTEGER NOT NULL DEFAULT 0, seq INTEGER NOT NULL DEFAULT 0,
    ended INTEGER NOT NULL DEFAULT 0, touched REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    code TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (code, seq));
CREATE TABLE IF NOT EXISTS students (code TEXT NOT NULL, student TEXT NOT NULL, PRIMARY KEY (code, student));
CREATE TABLE IF NOT EXISTS polls (
    code TEXT NOT NULL, id INTEGER NOT NULL, question TEXT NOT NULL, options TEXT NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0, answer TEXT, kind TEXT NOT NULL DEFAULT 'free', detail TEXT,
    PRIMARY KEY (code, id));
CREATE TABLE IF NOT EXISTS answers (
    code TEXT NOT NULL, poll INTEGER NOT NULL, student TEXT NOT NULL, option INTEGER NOT NULL,
    PRIMARY KEY (code, poll, student));
CREATE TABLE IF NOT EXISTS guesses (client TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS guesses_by_client ON guesses (client, at);
"""


def class_file(runs_dir: Path) -> Path:
    """Where the shared classes live: beside the training runs (a dot file, never listed as a run)."""
    return runs_dir / FILE_NAME


class SQLiteClassStore:
    def __init__(self, path: Path, idle_s: float, clock=time.time):
        self.path, self.idle_s, self.clock = path, idle_s, clock
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_MS / 1000)
        self.db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        for attempt in range(50):  # two workers starting at once: one sets WAL and makes the tables
            try:
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute("PRAGMA synchronous = NORMAL")
                self.db.executescript(SCHEMA)
                self._add_columns()
                break
            except sqlite3.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        self._seqs: dict[str, int] = {}  # the newest event of each class a follower here waits on
        self._waiting: dict[str, int] = {}  # code -> followers waiting on it in this process
        self._changed = asyncio.Condition()
        self._watcher: asyncio.Task | None = None
        self._swept = 0.0

    def _add_columns(self) -> None:
        """A file made before polls had a kind and the model's answer (the first version of this store)."""
        have = {row[1] for row in self.db.execute("PRAGMA table_info(polls)")}
        for column, declared in (("kind", "TEXT NOT NULL DEFAULT 'free'"), ("detail", "TEXT")):
            if column not in have:
                self.db.execute(f"ALTER TABLE polls ADD COLUMN {column} {declared}")

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the file's write lock at once (BEGIN IMMEDIATE: two processes'
        read-then-write never deadlock)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _sweep(self, db: sqlite3.Connection) -> None:
        now = self.clock()
        if now - self._swept < SWEEP_S:
            return
        self._swept = now
        stale = [c for (c,) in db.execute("SELECT code FROM classes WHERE touched < ?", (now - self.idle_s,))]
        for code in stale:
            for table in ("classes", "events", "students", "polls", "answers"):
                db.execute(f"DELETE FROM {table} WHERE code = ?", (code,))  # noqa: S608 (our own names)
        db.execute("DELETE FROM guesses WHERE at < ?", (now - 3600,))

    def _row(self, db: sqlite3.Connection, code: str, *, ended_too: bool = False) -> tuple:
        row = db.execute(
            "SELECT teacher_hash, created_at, path, poll, polls, seq, ended, touched FROM classes WHERE code = ?",
            (code,),
        ).fetchone()
        if row is None or row[7] < self.clock() - self.idle_s or (row[6] and not ended_too):
            raise ClassNotFound(code)
        return row

    def _emit(self, db: sqlite3.Connection, code: str, name: str, data: dict) -> ClassEvent:
        (seq,) = db.execute(
            "UPDATE classes SET seq = seq + 1, touched = ? WHERE code = ? RETURNING seq", (self.clock(), code)
        ).fetchone()
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (code, seq, name, json.dumps(data)))
        db.execute("DELETE FROM events WHERE code = ? AND seq <= ?", (code, seq - LOG_LENGTH))
        self._seqs[code] = seq
        return ClassEvent(str(seq), name, data)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _touch(self, db: sqlite3.Connection, code: str) -> None:
        db.execute("UPDATE classes SET touched = ? WHERE code = ?", (self.clock(), code))

    # ------------------------------------------------------------------ the teacher

    async def create(self, code: str, teacher_hash: str, path: str) -> LiveClass:
        created_at = time.time()
        with self._writing() as db:
            self._sweep(db)
            row = db.execute("SELECT touched FROM classes WHERE code = ?", (code,)).fetchone()
            if row is not None and row[0] >= self.clock() - self.idle_s:
                raise KeyError(code)
            for table in ("classes", "events", "students", "polls", "answers"):  # an expired class of that code
                db.execute(f"DELETE FROM {table} WHERE code = ?", (code,))  # noqa: S608 (our own names)
            db.execute(
                "INSERT INTO classes (code, teacher_hash, created_at, path, touched) VALUES (?, ?, ?, ?, ?)",
                (code, teacher_hash, created_at, path, self.clock()),
            )
            event = self._emit(db, code, "state", {"path": path})
        await self._notify()
        return LiveClass(code, teacher_hash, created_at, path, 0, None, event.id)

    async def get(self, code: str) -> LiveClass:
        db = self.db
        teacher_hash, created_at, path, poll_id, _polls, seq, _ended, _touched = self._row(db, code)
        (students,) = db.execute("SELECT COUNT(*) FROM students WHERE code = ?", (code,)).fetchone()
        poll = self._poll(db, code, poll_id) if poll_id is not None else None
        return LiveClass(code, teacher_hash, created_at, path, students, poll, str(seq))

    async def set_path(self, code: str, path: str) -> ClassEvent:
        with self._writing() as db:
            self._row(db, code)
            db.execute("UPDATE classes SET path = ? WHERE code = ?", (path, code))
            event = self._emit(db, code, "state", {"path": path})
        await self._notify()
        return event

    async def add_poll(self, code: str, question: str, options: list[str], kind: str = "free") -> Poll:
        with self._writing() as db:
            open_id, polls = self._row(db, code)[3:5]
            if open_id is not None:
                self._close(db, code, open_id, None)
            poll = Poll(id=polls + 1, question=question, options=list(options), counts=[0] * len(options), kind=kind)
            db.execute(
                "INSERT INTO polls (code, id, question, options, kind) VALUES (?, ?, ?, ?, ?)",
                (code, poll.id, question, json.dumps(poll.options), kind),
            )
            db.execute("UPDATE classes SET poll = ?, polls = ? WHERE code = ?", (poll.id, poll.id, code))
            self._emit(db, code, "poll", poll.public())
        await self._notify()
        return poll

    def _poll(self, db: sqlite3.Connection, code: str, poll_id: int) -> Poll:
        row = db.execute(
            "SELECT question, options, closed, answer, kind, detail FROM polls WHERE code = ? AND id = ?",
            (code, poll_id),
        ).fetchone()
        if row is None:
            raise KeyError(poll_id)
        options = json.loads(row[1])
        counts = [0] * len(options)
        for option, n in db.execute(
            "SELECT option, COUNT(*) FROM answers WHERE code = ? AND poll = ? GROUP BY option", (code, poll_id)
        ):
            counts[option] = n
        detail = json.loads(row[5]) if row[5] else None
        return Poll(poll_id, row[0], options, counts, bool(row[2]), row[3], row[4], detail)

    def _close(
        self, db: sqlite3.Connection, code: str, poll_id: int, answer: str | None, detail: dict | None = None
    ) -> ClassEvent:
        poll = self._poll(db, code, poll_id)
        poll.closed, poll.answer, poll.detail = True, answer, detail
        db.execute(
            "UPDATE polls SET closed = 1, answer = ?, detail = ? WHERE code = ? AND id = ?",
            (answer, json.dumps(detail) if detail else None, code, poll_id),
        )
        db.execute("UPDATE classes SET poll = NULL WHERE code = ? AND poll = ?", (code, poll_id))
        return self._emit(db, code, "poll_closed", poll.result())

    async def poll(self, code: str, poll_id: int) -> Poll:
        self._row(self.db, code)
        return self._poll(self.db, code, poll_id)

    async def close_poll(self, code: str, poll_id: int, answer: str | None, detail: dict | None = None) -> ClassEvent:
        with self._writing() as db:
            self._row(db, code)
            event = self._close(db, code, poll_id, answer, detail)
        await self._notify()
        return event

    async def end(self, code: str) -> None:
        with self._writing() as db:
            self._row(db, code)
            self._emit(db, code, "ended", {})
            db.execute("UPDATE classes SET ended = 1 WHERE code = ?", (code,))
        await self._notify()

    # ------------------------------------------------------------------ the students

    async def join(self, code: str, student: str, max_students: int) -> int:
        with self._writing() as db:
            self._row(db, code)
            (n,) = db.execute("SELECT COUNT(*) FROM students WHERE code = ?", (code,)).fetchone()
            known = db.execute("SELECT 1 FROM students WHERE code = ? AND student = ?", (code, student)).fetchone()
            if known is None:
                if n >= max_students:
                    raise ClassFull(code)
                db.execute("INSERT INTO students VALUES (?, ?)", (code, student))
                n += 1
            self._touch(db, code)
        return n

    async def answer(self, code: str, poll_id: int, student: str, option: int) -> None:
        with self._writing() as db:
            self._row(db, code)
            row = db.execute("SELECT closed FROM polls WHERE code = ? AND id = ?", (code, poll_id)).fetchone()
            if row is None or row[0]:
                raise KeyError(poll_id)
            db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?)", (code, poll_id, student, option))
            self._touch(db, code)

    # ------------------------------------------------------------------ guessing codes

    async def guesses(self, client: str, window_s: float) -> tuple[int, float]:
        now = self.clock()
        n, oldest = self.db.execute(
            "SELECT COUNT(*), MIN(at) FROM guesses WHERE client = ? AND at > ?", (client, now - window_s)
        ).fetchone()
        return n, (now - oldest if oldest is not None else 0.0)

    async def guessed(self, client: str, window_s: float) -> None:
        with self._writing() as db:
            self._sweep(db)
            db.execute("INSERT INTO guesses VALUES (?, ?)", (client, self.clock()))
            db.execute("DELETE FROM guesses WHERE client = ? AND at <= ?", (client, self.clock() - window_s))

    # ------------------------------------------------------------------ following

    def _after(self, code: str, after: str | None) -> list[ClassEvent]:
        db = self.db
        teacher_hash, created_at, path, poll_id, _polls, seq, ended, touched = self._row(db, code, ended_too=True)
        self._seqs[code] = seq
        if after is not None and after.isdigit():
            if int(after) >= seq:
                return []  # up to date (or ahead of a class that restarted: nothing newer to send)
            rows = db.execute(
                "SELECT seq, name, data FROM events WHERE code = ? AND seq > ? ORDER BY seq", (code, int(after))
            ).fetchall()
            if rows and rows[0][0] == int(after) + 1:
                return [ClassEvent(str(s), name, json.loads(data)) for s, name, data in rows]
        snapshot = [ClassEvent(str(seq), "state", {"path": path})]  # a new follower, or one the log lost
        if poll_id is not None:
            snapshot.append(ClassEvent(str(seq), "poll", self._poll(db, code, poll_id).public()))
        return snapshot

    async def _watch(self) -> None:
        """While followers wait here: every WATCH_S, has another process written? Then which of their
        classes moved? Wake their followers."""
        (version,) = self.db.execute("PRAGMA data_version").fetchone()
        while self._waiting:
            await asyncio.sleep(WATCH_S)
            (now,) = self.db.execute("PRAGMA data_version").fetchone()
            if now == version:
                continue
            version = now
            codes = list(self._waiting)
            marks = ",".join("?" * len(codes))
            moved = False
            for code, seq in self.db.execute(f"SELECT code, seq FROM classes WHERE code IN ({marks})", codes):  # noqa: S608
                moved |= self._seqs.get(code) != seq
                self._seqs[code] = seq
            if moved:
                await self._notify()
        self._watcher = None

    async def events(self, code: str, after: str | None, wait_s: float) -> list[ClassEvent]:
        found = self._after(code, after)
        if found or self._row(self.db, code, ended_too=True)[6]:
            return found
        self._waiting[code] = self._waiting.get(code, 0) + 1
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: after is None or self._seqs.get(code, 0) > int(after)), wait_s
                )
        except TimeoutError:
            return []
        finally:
            self._waiting[code] -= 1
            if not self._waiting[code]:
                del self._waiting[code]
        return self._after(code, after)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        self.db.close()
