"""Live classes under /api/v1/classes (app/service/classes.py says the rules): a teacher starts one and
drives it, students follow its events and answer its polls.

The teacher's token comes back once, from POST /api/v1/classes, and as an HttpOnly cookie for the
teacher's browser; after that it travels as `Authorization: Bearer` or as that cookie, never in a URL.
A student is a random id in a cookie of its own (`explorer_student`), set on first contact.
These routes compute nothing (no model runs), so they are `async` and run on the event loop, and the
compute limiter never queues them; a follower's event stream waits on the class store.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Annotated, TypeVar

from fastapi import Header, Path, Request, Response

from app.api.class_models import (
    AnswerRequest,
    ClassState,
    PollRequest,
    PollResult,
    Pushed,
    RevealRequest,
    Started,
    StartRequest,
    StateRequest,
)
from app.api.routes.shared import api_router, errors
from app.deps import ClassesDep, ServiceDep
from app.http.jsonio import FastJSONResponse
from app.http.security import client_address
from app.http.sse import Event, ResumeFrom, event_stream
from app.service.classes import EVENTS_WAIT_S, PRESENTING_COOKIE, teacher_cookie

router = api_router()
R = TypeVar("R", bound=Response)

STUDENT_COOKIE = "explorer_student"
RETRY_MS = 1000  # how soon a follower's EventSource reconnects (a replica gone): within the 5 s promised

SAID = {
    401: "No teacher's token: send it as `Authorization: Bearer`, or the teacher's cookie",
    403: "Not this class's teacher, or the class is full",
    404: "No class has this code (or it has ended, or expired)",
    422: "Not a page of this site, or a question or an option out of bounds: `detail[].msg` says",
    429: "Too many wrong class codes from this client in the last minute (Retry-After)",
}
FINDING = errors(404, 429, said=SAID)
TEACHING = errors(401, 403, 404, 422, 429, said=SAID)
ANSWERING = errors(403, 404, 422, 429, said=SAID)

Code = Annotated[
    str, Path(min_length=1, max_length=16, description="the class's code, as the teacher's screen shows it")
]
PollId = Annotated[int, Path(ge=1, le=1_000_000, description="the poll's number in the class")]
Authorization = Annotated[str | None, Header(max_length=512, description="`Bearer <teacher_token>`")]


def teacher_token(request: Request, code: str, authorization: str | None) -> str | None:
    """The teacher's token: the Authorization header's Bearer, else the teacher's cookie for this class."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return request.cookies.get(teacher_cookie(code))


def with_cookies(answer: R, set_on: Response) -> R:
    """`answer` with the cookies a dependency set on `set_on` (a route that returns its own response)."""
    for key, value in set_on.headers.items():
        if key == "set-cookie":
            answer.headers.append(key, value)
    return answer


def student_id(request: Request, response: Response) -> str:
    """The student's random id (nothing personal), set as a cookie on first contact."""
    student = request.cookies.get(STUDENT_COOKIE)
    if not student or len(student) > 64:
        student = secrets.token_urlsafe(16)
        response.set_cookie(STUDENT_COOKIE, student, httponly=True, samesite="lax", max_age=7 * 86400)
    return student


def _result(poll) -> FastJSONResponse:
    return FastJSONResponse(PollResult.model_validate(poll.result()).model_dump())


@router.post(
    "/classes", status_code=201, response_model=Started, responses=errors(422, said=SAID), summary="Start a live class"
)
async def start(classes: ClassesDep, response: Response, body: StartRequest | None = None) -> FastJSONResponse:
    """A new class on `path` (default the explorer): its code, the students' join link, and the teacher's
    token, also set as the teacher's HttpOnly cookie. Students open /class/{code}."""
    started = await classes.start((body or StartRequest()).path)
    code = started.live.code
    answer = FastJSONResponse(
        Started(code=code, join_url=f"/class/{code}", teacher_token=started.token, path=started.live.path).model_dump(),
        status_code=201,
    )
    answer.set_cookie(teacher_cookie(code), started.token, httponly=True, samesite="strict", max_age=86400)
    # Not secret: which class this browser presents (its pages' "Presenting" bar); the token decides.
    answer.set_cookie(PRESENTING_COOKIE, code, httponly=True, samesite="strict", max_age=86400)
    return answer


@router.get("/classes/{code}", response_model=ClassState, responses=FINDING, summary="Where a class is now")
async def state(code: Code, request: Request, classes: ClassesDep) -> FastJSONResponse:
    """The teacher's current page, the number of students and the open poll. A wrong code is counted
    against the client (429 after too many)."""
    live = await classes.find(code, client_address(request))
    poll = live.poll.public() if live.poll else None
    return FastJSONResponse(ClassState(code=live.code, path=live.path, students=live.students, poll=poll).model_dump())


@router.put("/classes/{code}/state", response_model=Pushed, responses=TEACHING, summary="The teacher shows a page")
async def push(
    code: Code, body: StateRequest, request: Request, classes: ClassesDep, authorization: Authorization = None
) -> FastJSONResponse:
    """Every follower's page moves to `path` (a page of this site with its URL state). Teacher only."""
    event = await classes.push(code, teacher_token(request, code, authorization), body.path, client_address(request))
    return FastJSONResponse(Pushed(id=event.id, path=event.data["path"]).model_dump())


@router.get(
    "/classes/{code}/events",
    responses={
        **ANSWERING,
        200: {"content": {"text/event-stream": {}}, "description": "state, poll, poll_closed, ended"},
    },
    summary="Follow a class (Server-Sent Events)",
)
async def events(code: Code, request: Request, classes: ClassesDep, after: ResumeFrom = None):
    """`state` {path} whenever the teacher moves, `poll` {id, question, options}, `poll_closed` {…, counts,
    answer} and `ended`. The first events are where the class is now; a client that reconnects with
    `Last-Event-ID` gets what it missed. Joining counts the student (at most the class's cap: 403)."""
    probe = Response()
    student = student_id(request, probe)
    live = await classes.join(code, student, client_address(request))

    async def source() -> AsyncIterator[Event]:
        cursor = after
        while not await request.is_disconnected():
            for event in await classes.events(live.code, cursor):
                cursor = event.id
                yield event.id, event.name, event.data
                if event.name == "ended":
                    return

    return with_cookies(event_stream(source(), retry_ms=RETRY_MS, keepalive_s=EVENTS_WAIT_S + 5), probe)


@router.post(
    "/classes/{code}/polls", status_code=201, response_model=PollResult, responses=TEACHING, summary="Ask the class"
)
async def ask(
    code: Code, body: PollRequest, request: Request, classes: ClassesDep, authorization: Authorization = None
) -> FastJSONResponse:
    """A question with 2 to 8 options, pushed to every follower as a `poll` event (closing the one open
    before). Teacher only."""
    poll = await classes.ask(
        code,
        teacher_token(request, code, authorization),
        body.question,
        body.options,
        client_address(request),
        body.kind,
    )
    answer = _result(poll)
    answer.status_code = 201
    return answer


@router.post(
    "/classes/{code}/polls/{poll_id}/answers",
    response_model=PollResult,
    responses=ANSWERING,
    summary="A student answers",
)
async def answer(
    code: Code, poll_id: PollId, body: AnswerRequest, request: Request, response: Response, classes: ClassesDep
) -> FastJSONResponse:
    """One answer per student (by the student's cookie): a second replaces the first. Answers the poll
    as it stood before, without counts (students see the counts when the teacher reveals them)."""
    student = student_id(request, response)
    poll = await classes.answer(code, poll_id, student, body.option, client_address(request))
    result = FastJSONResponse({**PollResult.model_validate(poll.result()).model_dump(), "counts": []})
    return with_cookies(result, response)


@router.get(
    "/classes/{code}/polls/{poll_id}", response_model=PollResult, responses=FINDING, summary="A poll and its counts"
)
async def poll(code: Code, poll_id: PollId, request: Request, classes: ClassesDep) -> FastJSONResponse:
    """The poll and its answers so far, per option (the teacher's live histogram)."""
    return _result(await classes.results(code, poll_id, client_address(request)))


@router.post(
    "/classes/{code}/polls/{poll_id}/close",
    response_model=PollResult,
    responses=TEACHING,
    summary="The teacher closes a poll and reveals the answer",
)
async def reveal(
    code: Code,
    poll_id: PollId,
    request: Request,
    classes: ClassesDep,
    svc: ServiceDep,
    body: RevealRequest | None = None,
    authorization: Authorization = None,
) -> FastJSONResponse:
    """No more answers; every follower gets `poll_closed` with the counts and `answer`: the teacher's for a
    free-text poll, the model's (computed on the class's current page, with `detail`) for a next_token or
    induction_head poll. Teacher only."""
    poll = await classes.reveal(
        code,
        teacher_token(request, code, authorization),
        poll_id,
        (body or RevealRequest()).answer,
        client_address(request),
        svc.views,
    )
    return _result(poll)


@router.delete("/classes/{code}", status_code=204, responses=TEACHING, summary="End a class")
async def end(code: Code, request: Request, classes: ClassesDep, authorization: Authorization = None) -> Response:
    """Followers get `ended`, and the code stops working. Teacher only."""
    await classes.end(code, teacher_token(request, code, authorization), client_address(request))
    answer = Response(status_code=204)
    answer.delete_cookie(teacher_cookie(code))
    if request.cookies.get(PRESENTING_COOKIE, "").upper() == code.strip().upper():
        answer.delete_cookie(PRESENTING_COOKIE)
    return answer
