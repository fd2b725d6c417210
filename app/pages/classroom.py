"""The live class's pages (issue 35): /class, the teacher's, and /class/{code}, a student's; and the
"Presenting" bar every page of a presenting teacher carries (templates/base.html).

- /class: "Start a class" (static/js/class-teacher.js posts POST /api/v1/classes, which sets the teacher's
  cookies, then reloads this page); with a class running, its code (large, for a projector), the join link
  and its QR code (SVG drawn here by segno, from the link alone), the number of students, the polls and
  "End class". "Join a class" takes a typed code to /class/{code}.
- /class/{code}: the teacher's current page in an <iframe> of this site, followed through the class's
  events (static/js/class-student.js), the buttons "Explore on my own" / "Follow the teacher", the polls.
- `presenting`: a dependency of every page router (app/main.py) that puts the teacher's running class on
  `request.state.presenting` when this browser holds its teacher's cookies; the bar's script
  (static/js/presenting.js) then pushes every change of the page's URL to the class.

Nothing here computes; the rules (who drives, which paths, the rate limit) are app/service/classes.py's.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import segno
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from app.deps import CatalogDep, ClassesDep
from app.http.language import _, localized
from app.http.security import client_address
from app.pages import web
from app.service import InputError, NotFound, Unavailable
from app.service.classes import (
    MAX_OPTION_CHARS,
    MAX_OPTIONS,
    MAX_QUESTION_CHARS,
    PAGE_PREFIXES,
    PAGES,
    PRESENTING_COOKIE,
    teacher_cookie,
)

router = APIRouter(tags=["pages"], include_in_schema=False)

HEADS_MODEL = "induction"  # "Which head is the induction head?": this model's heads, unless the class shows another
STUDENTS_EVERY_MS = 2000  # how often the teacher's page asks how many students have joined
POLL_EVERY_MS = 1000  # how often the teacher's page asks an open poll's counts (the live histogram)


async def presenting(request: Request, classes: ClassesDep) -> None:
    """The running class this browser presents, on request.state.presenting (None when none): its code
    from the presenting cookie, checked against the class's teacher's token in the HttpOnly cookie."""
    code = request.cookies.get(PRESENTING_COOKIE)
    token = request.cookies.get(teacher_cookie(code)) if code else None
    request.state.presenting = await classes.presenting(code, token)


def class_pages() -> dict:
    """What templates/base.html's Presenting bar hands its script: the paths a class can show (others,
    such as /docs or this page, are not pushed)."""
    return {"pages": list(PAGES), "prefixes": list(PAGE_PREFIXES)}


web.templates.env.globals["class_pages"] = class_pages


def join_url(request: Request, code: str) -> str:
    """The students' link, absolute: this server as the teacher's browser reached it."""
    return f"{request.url.scheme}://{request.url.netloc}/class/{code}"


def qr_svg(url: str) -> Markup:
    """The QR code of `url` as an inline <svg>: modules only, no text (segno writes no title or
    description unless asked), so nothing of the URL appears in the markup."""
    svg = segno.make(url, error="m").svg_inline(scale=6, border=2, dark="#000", light="#fff", omitsize=False)
    return Markup(svg)


def induction_heads(catalog, path: str) -> list[str]:
    """The heads L0H0 … of the class's current model (the `model` of its page), else the induction model's."""
    names = parse_qs(urlsplit(path).query).get("model", []) + [HEADS_MODEL]
    for name in names:
        if name in catalog:
            cfg = catalog[name].cfg
            return [f"L{layer}H{head}" for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    return []


def words() -> dict[str, str]:
    """What static/js/class-teacher.js and class-student.js write, in the page's language."""
    return {
        "starting": _("Starting a class…"),
        "failed": _("The server answered {status}: {detail}"),
        "unreachable": _("The server could not be reached. Is it still running?"),
        "students_one": _("{n} student has joined"),
        "students": _("{n} students have joined"),
        "answers_one": _("{n} answer"),
        "answers": _("{n} answers"),
        "need_options": _("Write at least two options, one per line."),
        "asked": _("Asked: {question}"),
        "revealed": _("Revealed: {answer}"),
        "closed": _("The poll is closed."),
        "following": _("Following the teacher"),
        "exploring": _("Exploring on your own: the teacher's changes wait until you follow again."),
        "following_banner": _("Following the teacher: this page changes when the teacher's does."),
        "new_poll": _("New poll: {question}"),
        "your_answer": _("Your answer: {option}"),
        "answer_was": _("The answer: {answer}"),
        "ended": _("The class has ended. Thank you for taking part."),
        "full": _("This class is full: it has as many students as this server takes. Ask your teacher."),
        "reconnecting": _("Connection lost: reconnecting…"),
        "count_of": _("{option}: {n}"),
        "model_token": _("The model {model} predicts “{token}” with probability {prob}."),
        "model_head": _("In the model {model}, {head} has the highest induction score, {score}."),
    }


def _limits() -> dict:
    return {"question": MAX_QUESTION_CHARS, "option": MAX_OPTION_CHARS, "options": MAX_OPTIONS}


@router.get("/class", response_class=HTMLResponse)
async def teacher_page(request: Request, catalog: CatalogDep) -> Response:
    """Start a class, or the class this browser presents: its code, link, QR code, students and polls."""
    live = getattr(request.state, "presenting", None)
    context: dict[str, Any] = {"nav": "class", "words": words(), "limits": _limits(), "live": None}
    if live is not None:
        url = join_url(request, live.code)
        context |= {
            "live": live,
            "join_url": url,
            "qr": qr_svg(url),
            "heads": induction_heads(catalog, live.path),
            "poll": live.poll.public() if live.poll else None,
            "timings": {"students_ms": STUDENTS_EVERY_MS, "poll_ms": POLL_EVERY_MS},
        }
    return web.render(request, "class_teacher.html", context, url="/class")


@router.get("/class/join", response_class=HTMLResponse)
async def join_form(code: Annotated[str, Query(max_length=64)] = "") -> RedirectResponse:
    """The "Join a class" form (GET, so it works without JavaScript): to the typed code's page."""
    typed = "".join(c for c in code.upper() if not c.isspace() and c != "-")[:16]
    return RedirectResponse(localized(f"/class/{typed}" if typed else "/class"), status_code=303)


@router.get("/class/{code}", response_class=HTMLResponse)
async def student_page(request: Request, code: str, classes: ClassesDep) -> Response:
    """A student's page: the teacher's current view, followed in place; or why the code does not work."""
    context: dict[str, Any] = {"nav": "class", "words": words(), "live": None, "code": code[:16]}
    try:
        live = await classes.find(code, client_address(request))
    except (NotFound, InputError, Unavailable) as exc:
        status = 404 if isinstance(exc, NotFound) else web.error_status(exc)
        return web.render(request, "class_student.html", context, error=str(exc), status=status)
    context["live"] = live
    return web.render(request, "class_student.html", context, url=f"/class/{live.code}")
