"""Exception handlers: every error answers in FastAPI's shape, {"detail": [{"loc", "msg", "type"}]}.

- request validation (pydantic): 422, each message prefixed by the field it is about;
- InputError, raised by core/ and the service for input the user can fix: 422 with its message
  (any other exception, a ValueError from a bug included, is a 500);
- Unavailable (training off, or full: 503; one client's share used: 429), with Retry-After when waiting
  helps; NotFound (no such run): 404;
- HTTP errors under /api/ (404, 405): the same shape, saying where the API is documented;
- anything else is a bug: logged with its traceback, answered with a generic 500 (`unexpected`,
  which app/main.py installs as a middleware inside the security headers, not here: Starlette calls
  the handlers registered for Exception from its outermost layer, outside every middleware).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from core import InputError

from app.http.jsonio import FastJSONResponse
from app.service.errors import NotFound, Unavailable

log = logging.getLogger("app.http.errors")


def error_body(msg: str, loc: list | tuple = (), type_: str = "value_error") -> dict:
    return {"detail": [{"loc": list(loc), "msg": msg, "type": type_}]}


def _field(loc: tuple) -> str:
    # ("body", "hooks", 3) -> "hooks[3]"; ("query", "d_model") -> "d_model"
    parts = [p for p in loc if p not in ("body", "query", "path")]
    name = ""
    for p in parts:
        name += f"[{p}]" if isinstance(p, int) else (f".{p}" if name else str(p))
    return name


def readable(err: dict) -> dict:
    """A pydantic error as this API words it: the field first, then what is wrong with it."""
    field = _field(tuple(err.get("loc", ())))
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "is not a field this endpoint accepts (check its spelling against /docs)"
    elif err.get("type") == "json_invalid":  # loc is ("body", character offset)
        return {"loc": ["body"], "type": "json_invalid",
                "msg": f"the body is not valid JSON: {err.get('ctx', {}).get('error', 'syntax error')} "
                       f"at character {err['loc'][-1]}"}
    elif err.get("type") == "string_unicode":
        msg = "contains an unpaired UTF-16 surrogate, which is not a character: remove it"
    return {"loc": list(err.get("loc", ())), "msg": f"{field}: {msg}" if field else msg,
            "type": err.get("type", "value_error")}


async def validation_error(request: Request, exc: RequestValidationError) -> FastJSONResponse:
    # The offending input is not echoed: it may be large, or not representable in JSON (NaN).
    return FastJSONResponse({"detail": [readable(e) for e in exc.errors()]}, status_code=422)


async def bad_input(request: Request, exc: Exception) -> FastJSONResponse:
    return FastJSONResponse(error_body(str(exc)), status_code=422)


async def unavailable(request: Request, exc: Unavailable) -> FastJSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return FastJSONResponse(error_body(str(exc), type_="unavailable" if exc.status_code == 503 else "too_many"),
                            status_code=exc.status_code, headers=headers)


async def not_found(request: Request, exc: NotFound) -> FastJSONResponse:
    return FastJSONResponse(error_body(str(exc), type_="not_found"), status_code=404)


async def http_error(request: Request, exc: StarletteHTTPException):
    if not request.url.path.startswith("/api/"):
        return await http_exception_handler(request, exc)  # pages keep FastAPI's default
    msg = exc.detail if isinstance(exc.detail, str) else "error"
    if exc.status_code == 404:
        msg = f"{request.url.path} is not an endpoint of this server: see /docs for the API"
    return FastJSONResponse(error_body(msg, type_=f"http_{exc.status_code}"), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


async def unexpected(request: Request, exc: Exception) -> FastJSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return FastJSONResponse(error_body("internal error: this is a bug in the server, not in your request",
                                       type_="internal_error"), status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(InputError, bad_input)
    app.add_exception_handler(Unavailable, unavailable)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(StarletteHTTPException, http_error)
