"""Live classes as the API and the pages use them: who may drive, what may be pushed, who may join.

One `Classes` lives for the app (app/main.py's lifespan, `app.state.classes`), around the store the
settings name (app/classes/). The rules (issue 35):
- only the teacher drives: every change needs the teacher's token (401 without one, 403 with another);
- a pushed path is a page of this site (422 otherwise): never another site, never the API;
- codes are not guessable at any useful rate: a client's wrong codes are counted, and beyond
  `class_max_wrong_codes` a minute it gets 429 until the minute has passed;
- a class takes at most `class_max_students` students, and is forgotten after `class_idle_s` idle;
- questions and options are kept as text (the pages escape them); a student is a random cookie id.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.classes.base import (
    ALPHABET,
    CODE_LENGTH,
    ClassEvent,
    ClassFull,
    ClassNotFound,
    ClassStore,
    LiveClass,
    Poll,
    StoreDown,
    new_code,
    new_token,
    token_hash,
)
from app.service.class_answers import model_answer
from app.service.errors import Forbidden, NotFound, Unavailable
from app.service.views import ModelViews
from app.settings import Settings
from core.errors import InputError
from core.i18n import _

# The pages a class may show (their paths; a lesson is any page under /lessons/). Not the class pages
# themselves, not the API, not the docs.
PAGES = (
    "/",
    "/lessons",
    "/params",
    "/inspect",
    "/circuits",
    "/generate",
    "/features",
    "/attribution",
    "/train",
    "/glossary",
)
PAGE_PREFIXES = ("/lessons/",)
MAX_PATH_CHARS = 8192  # a page's whole state is in its URL; a class's path longer than this is refused
MAX_QUESTION_CHARS = 300  # a poll's question, and each of its options: the API's schema states them
MAX_OPTION_CHARS = 80
MAX_OPTIONS = 8
WRONG_CODE_WINDOW_S = 60.0
EVENTS_WAIT_S = 10.0  # a follower's stream asks the store at least this often (and sends a keep-alive)
# The teacher's browser carries two cookies per class: the token (HttpOnly, the secret) and, beside it, the
# class's code (not secret), so every page of the teacher's knows which class it presents (the pages'
# "Presenting" bar, app/pages/classroom.py).
PRESENTING_COOKIE = "explorer_presenting"


def teacher_cookie(code: str) -> str:
    """The name of the cookie holding the teacher's token for class `code`."""
    return f"explorer_teacher_{code.strip().upper()[:16]}"


STORE_RETRY_S = 5  # Retry-After while the class store (Redis) cannot be reached
PRESENTING_CHECK_S = 0.5  # what a page waits, at most, to learn whether its reader presents a class


def _available(method):
    """The store away (Redis down) is 503 + Retry-After, not a 500 or a wrong 404."""

    @functools.wraps(method)
    async def call(*args, **kwargs):
        try:
            return await method(*args, **kwargs)
        except StoreDown:
            raise Unavailable(
                _("live classes cannot be reached just now: try again in a few seconds"), retry_after_s=STORE_RETRY_S
            ) from None

    return call


@dataclass(frozen=True)
class Started:
    live: LiveClass
    token: str  # the teacher's secret: returned once, never stored


def check_path(path: str) -> str:
    """The path itself if it is one of this site's pages, else InputError (422) saying why."""
    parts = urlsplit(path)
    if len(path) > MAX_PATH_CHARS or parts.scheme or parts.netloc or not path.startswith("/") or "\\" in path:
        raise InputError(
            _("a class can show this site's pages only: a path such as {example}").format(example="/lessons/attention")
        )
    if not (parts.path in PAGES or any(parts.path.startswith(p) and len(parts.path) > len(p) for p in PAGE_PREFIXES)):
        raise InputError(
            _(
                "{path} is not a page a class can show: the explorer, the lessons, Inspect, circuits, Write, "
                "Features or Attribution"
            ).format(path=parts.path[:80])
        )
    return path


def check_code(code: str) -> str:
    code = code.strip().upper()
    if len(code) != CODE_LENGTH or any(c not in ALPHABET for c in code):
        raise NotFound(_("no class has the code {code}: check it on the teacher's screen").format(code=code[:16]))
    return code


class Classes:
    def __init__(self, store: ClassStore, settings: Settings):
        # The store is shared by everything that serves this site's classes (app/classes/open_class_store:
        # this process, this machine's worker processes, or every replica through Redis), and so is the
        # count of a client's wrong codes.
        self.store = store
        self.settings = settings

    # ------------------------------------------------------------------ finding a class

    async def _guessing(self, client: str) -> None:
        """429 while this client has tried too many wrong codes in the last minute."""
        n, oldest_s = await self.store.guesses(client, WRONG_CODE_WINDOW_S)
        if n >= self.settings.class_max_wrong_codes:
            wait = int(WRONG_CODE_WINDOW_S - oldest_s) + 1
            raise Unavailable(
                _("Too many wrong class codes from here: try again in {seconds} s.").format(seconds=wait),
                retry_after_s=wait,
                status_code=429,
            )

    @_available
    async def find(self, code: str, client: str) -> LiveClass:
        """The class with this code, counting a wrong one against the client (404, then 429)."""
        await self._guessing(client)
        try:
            return await self.store.get(check_code(code))
        except (ClassNotFound, NotFound):
            await self.store.guessed(client, WRONG_CODE_WINDOW_S)
            raise NotFound(
                _("no class has the code {code}: check it on the teacher's screen").format(code=code[:16])
            ) from None

    @_available
    async def teacher(self, code: str, token: str | None, client: str) -> LiveClass:
        """The class, if `token` is its teacher's (401 without a token, 403 with another)."""
        live = await self.find(code, client)
        if not token:
            raise Forbidden(_("only the class's teacher can do this: sign in with the teacher's link"), 401)
        if not hmac.compare_digest(token_hash(token), live.teacher_hash):
            raise Forbidden(_("this is not the teacher's token for class {code}").format(code=live.code), 403)
        return live

    async def presenting(self, code: str | None, token: str | None) -> LiveClass | None:
        """The running class `code` if `token` is its teacher's, else None: what a teacher's page asks on
        every request, so a wrong or stale code is not counted as guessing."""
        if not code or not token or len(code) > 16 or len(token) > 512:
            return None
        try:  # a page never waits long for the bar, and never fails for it (Redis away: no bar)
            live = await asyncio.wait_for(self.store.get(check_code(code)), PRESENTING_CHECK_S)
        except (ClassNotFound, NotFound, StoreDown, TimeoutError):
            return None
        return live if hmac.compare_digest(token_hash(token), live.teacher_hash) else None

    # ------------------------------------------------------------------ the teacher

    @_available
    async def start(self, path: str = "/") -> Started:
        token = new_token()
        for _attempt in range(8):  # 2.1 × 10¹¹ codes: a collision is rare, eight in a row impossible
            try:
                live = await self.store.create(new_code(), token_hash(token), check_path(path))
                return Started(live, token)
            except KeyError:
                continue
        raise Unavailable(_("no free class code was found: try again"), retry_after_s=1)

    @_available
    async def push(self, code: str, token: str | None, path: str, client: str) -> ClassEvent:
        live = await self.teacher(code, token, client)
        return await self.store.set_path(live.code, check_path(path))

    @_available
    async def ask(
        self, code: str, token: str | None, question: str, options: list[str], client: str, kind: str = "free"
    ) -> Poll:
        live = await self.teacher(code, token, client)
        if len(set(options)) != len(options):
            raise InputError(_("each option of a poll must be different"))
        return await self.store.add_poll(live.code, question, options, kind)

    @_available
    async def reveal(
        self, code: str, token: str | None, poll_id: int, answer: str | None, client: str, views: ModelViews
    ) -> Poll:
        """Close the poll and reveal its answer: the teacher's pick for a free-text poll; for a next-token or
        induction-head poll, the model's, computed on the class's current page (app/service/class_answers.py)."""
        live = await self.teacher(code, token, client)
        try:
            poll = await self.store.poll(live.code, poll_id)
            detail = None
            if poll.kind != "free" and not poll.closed:
                found = await asyncio.to_thread(
                    model_answer, views, poll.kind, live.path, poll.options, self.settings.default_model
                )
                answer, detail = found.answer[:MAX_OPTION_CHARS], found.detail
            await self.store.close_poll(live.code, poll_id, answer, detail)
            return await self.store.poll(live.code, poll_id)
        except KeyError:
            raise NotFound(_("class {code} has no poll {id}").format(code=live.code, id=poll_id)) from None

    @_available
    async def end(self, code: str, token: str | None, client: str) -> None:
        live = await self.teacher(code, token, client)
        await self.store.end(live.code)

    # ------------------------------------------------------------------ the students

    @_available
    async def join(self, code: str, student: str, client: str) -> LiveClass:
        live = await self.find(code, client)
        try:
            await self.store.join(live.code, student, self.settings.class_max_students)
        except ClassFull:
            raise Forbidden(
                _("class {code} is full: it takes {n} students").format(
                    code=live.code, n=self.settings.class_max_students
                ),
                403,
            ) from None
        return live

    @_available
    async def answer(self, code: str, poll_id: int, student: str, option: str, client: str) -> Poll:
        live = await self.join(code, student, client)
        try:
            poll = await self.store.poll(live.code, poll_id)
            if poll.closed:
                raise KeyError(poll_id)
            if option not in poll.options:
                raise InputError(
                    _("{option!r} is not an option of this poll: choose one of {options}").format(
                        option=option[:80], options=", ".join(poll.options)
                    )
                )
            await self.store.answer(live.code, poll_id, student, poll.options.index(option))
        except KeyError:
            raise NotFound(_("class {code} has no open poll {id}").format(code=live.code, id=poll_id)) from None
        return poll

    @_available
    async def results(self, code: str, poll_id: int, client: str) -> Poll:
        live = await self.find(code, client)
        try:
            return await self.store.poll(live.code, poll_id)
        except KeyError:
            raise NotFound(_("class {code} has no poll {id}").format(code=live.code, id=poll_id)) from None

    async def events(self, code: str, after: str | None) -> list[ClassEvent]:
        """What a follower has not seen yet (waiting up to EVENTS_WAIT_S for it); `ended` once the class is
        gone (ended, or expired while followed)."""
        try:
            return await self.store.events(code, after, EVENTS_WAIT_S)
        except ClassNotFound:
            return [ClassEvent(after or "0", "ended", {})]
        except StoreDown:  # the stream stays open (keep-alives) and asks again; the page's state is kept
            await asyncio.sleep(1)
            return []
