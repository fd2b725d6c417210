"""Exception handlers: every error answers in FastAPI's shape, {"detail": [{"loc", "msg", "type"}]}.

- request validation (pydantic): 422, each message prefixed by the field it is about;
- InputError, raised by core/ and the service for input the user can fix: 422 with its message
  (any other exception, a ValueError from a bug included, is a 500);
- Unavailable (training off, or full: 503; one client's share used: 429), with Retry-After when waiting
  helps; NotFound (no such run): 404; Forbidden (not a class's teacher): 401 without a token, 403 with another;
- HTTP errors under /api/ (404, 405): the same shape, saying where the API is documented;
- anything else is a bug: logged with its traceback, answered with a generic 500 (`unexpected`,
  which app/main.py installs as a middleware inside the security headers, not here: Starlette calls
  the handlers registered for Exception from its outermost layer, outside every middleware).

Messages are in the request's language (app/http/language.py): core's and the service's are translated
where they are raised; pydantic's own, in English, are said again from PYDANTIC in another language.
Field names, `loc` and `type` never change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.http.jsonio import FastJSONResponse
from app.http.language import DEFAULT, N_, _, current
from app.service.errors import Forbidden, NotFound, Unavailable
from core import InputError

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


# pydantic's messages (pydantic-core words them in English), by error type, with their context's names; in
# English the message is pydantic's own, in another language this one translated.
PYDANTIC = {
    "missing": N_("Field required"),
    "greater_than_equal": N_("Input should be greater than or equal to {ge}"),
    "greater_than": N_("Input should be greater than {gt}"),
    "less_than_equal": N_("Input should be less than or equal to {le}"),
    "less_than": N_("Input should be less than {lt}"),
    "int_parsing": N_("Input should be a valid integer, unable to parse string as an integer"),
    "int_from_float": N_("Input should be a valid integer, got a number with a fractional part"),
    "int_type": N_("Input should be a valid integer"),
    "float_parsing": N_("Input should be a valid number, unable to parse string as a number"),
    "float_type": N_("Input should be a valid number"),
    "finite_number": N_("Input should be a finite number"),
    "bool_parsing": N_("Input should be a valid boolean, unable to interpret input"),
    "bool_type": N_("Input should be a valid boolean"),
    "string_type": N_("Input should be a valid string"),
    "string_too_short": N_("String should have at least {min_length} characters"),
    "string_too_long": N_("String should have at most {max_length} characters"),
    "list_type": N_("Input should be a valid list"),
    "too_short": N_("List should have at least {min_length} items after validation, not {actual_length}"),
    "too_long": N_("List should have at most {max_length} items after validation, not {actual_length}"),
    "literal_error": N_("Input should be {expected}"),
    "enum": N_("Input should be {expected}"),
    "dict_type": N_("Input should be a valid dictionary"),
    "model_type": N_("Input should be a valid dictionary or object"),
    "value_error": N_("Value error, {error}"),
}


def _pydantic_message(err: Mapping[str, Any]) -> str:
    """pydantic's message in the request's language (its own English where this has no translation)."""
    msg = err.get("msg", "invalid value")
    template = PYDANTIC.get(err.get("type", ""))
    if current() == DEFAULT or template is None:
        return msg
    # a bound as pydantic-core writes it (le=1.0 is "1"), so a number reads the same in every language
    ctx = {k: str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for k, v in err.get("ctx", {}).items()}
    if "expected" in ctx:  # "'zero' or 'mean'"
        ctx["expected"] = ctx["expected"].replace(" or ", " " + _("or") + " ")
    try:
        return _(template).format(**ctx)
    except (KeyError, IndexError):  # a context this version of pydantic does not give
        return msg


def readable(err: Mapping[str, Any]) -> dict:
    """A pydantic error as this API words it: the field first, then what is wrong with it."""
    field = _field(tuple(err.get("loc", ())))
    msg = _pydantic_message(err)
    if err.get("type") == "extra_forbidden":
        msg = _("is not a field this endpoint accepts (check its spelling against /docs)")
    elif err.get("type") == "json_invalid":  # loc is ("body", character offset)
        return {
            "loc": ["body"],
            "type": "json_invalid",
            "msg": _("the body is not valid JSON: {error} at character {at}").format(
                error=err.get("ctx", {}).get("error", "syntax error"), at=err["loc"][-1]
            ),
        }
    elif err.get("type") == "string_unicode":
        msg = _("contains an unpaired UTF-16 surrogate, which is not a character: remove it")
    return {
        "loc": list(err.get("loc", ())),
        "msg": f"{field}: {msg}" if field else msg,
        "type": err.get("type", "value_error"),
    }


async def validation_error(request: Request, exc: RequestValidationError) -> FastJSONResponse:
    # The offending input is not echoed: it may be large, or not representable in JSON (NaN).
    return FastJSONResponse({"detail": [readable(e) for e in exc.errors()]}, status_code=422)


async def bad_input(request: Request, exc: Exception) -> FastJSONResponse:
    return FastJSONResponse(error_body(str(exc)), status_code=422)


async def unavailable(request: Request, exc: Unavailable) -> FastJSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return FastJSONResponse(
        error_body(str(exc), type_="unavailable" if exc.status_code == 503 else "too_many"),
        status_code=exc.status_code,
        headers=headers,
    )


async def not_found(request: Request, exc: NotFound) -> FastJSONResponse:
    return FastJSONResponse(error_body(str(exc), type_="not_found"), status_code=404)


async def forbidden(request: Request, exc: Forbidden) -> FastJSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return FastJSONResponse(
        error_body(str(exc), type_="unauthorized" if exc.status_code == 401 else "forbidden"),
        status_code=exc.status_code,
        headers=headers,
    )


async def http_error(request: Request, exc: StarletteHTTPException):
    if not request.url.path.startswith("/api/"):
        return await http_exception_handler(request, exc)  # pages keep FastAPI's default
    msg = exc.detail if isinstance(exc.detail, str) else "error"
    if exc.status_code == 404:
        msg = _("{path} is not an endpoint of this server: see /docs for the API").format(path=request.url.path)
    return FastJSONResponse(
        error_body(msg, type_=f"http_{exc.status_code}"),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def unexpected(request: Request, exc: Exception) -> FastJSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return FastJSONResponse(
        error_body(_("internal error: this is a bug in the server, not in your request"), type_="internal_error"),
        status_code=500,
    )


def install(app: FastAPI) -> None:
    # Starlette types a handler as taking any Exception; each of these is installed for its own class only.
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(InputError, bad_input)
    app.add_exception_handler(Unavailable, unavailable)  # type: ignore[arg-type]
    app.add_exception_handler(NotFound, not_found)  # type: ignore[arg-type]
    app.add_exception_handler(Forbidden, forbidden)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
