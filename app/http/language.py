"""The reader's language: English or Bahasa Melayu, chosen per request, and the catalogues that say it.

Which language a request is answered in:
- a page: the URL's `lang` (the BM / EN switch in the header sets it, and every link and form of a
  Malay page carries it, so a copied or shared URL keeps the language), else the `lang` cookie (set
  whenever a page is asked for with `lang`), else the browser's Accept-Language, else English;
- the JSON API: Accept-Language only (English by default). Only error messages change: field names
  and numbers are the same in every language.

`LanguageMiddleware` decides it before any route runs and puts the language's catalogue in effect for the
request (core/i18n.py `use`): everything that speaks to people, core's InputError messages, the service's,
the templates (`{% trans %}`, `_()`, app/pages/web.py) and the error handlers, reads it from there.
The catalogues are Babel's: `app/locales/<lang>/LC_MESSAGES/messages.po`, reviewed like code, compiled
to `.mo` when the app is installed (`make setup`, the Dockerfile); ARCHITECTURE.md, "Languages".
"""

from __future__ import annotations

import gettext
import re
from contextvars import ContextVar
from functools import cache
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from core.i18n import ENGLISH, N_, _, ngettext, use

__all__ = [
    "LANGUAGES",
    "DEFAULT",
    "LanguageMiddleware",
    "_",
    "N_",
    "ngettext",
    "current",
    "translations",
    "negotiate",
    "localized",
    "switched",
]

LANGUAGES = {"en": "English", "ms": "Bahasa Melayu"}  # code -> its own name
DEFAULT = "en"
PARAM = COOKIE = "lang"
COOKIE_MAX_AGE_S = 365 * 24 * 3600
LOCALES_DIR = Path(__file__).resolve().parent.parent / "locales"
DOMAIN = "messages"

_language: ContextVar[str] = ContextVar("language", default=DEFAULT)


@cache
def translations(lang: str) -> gettext.NullTranslations:
    """The catalogue of `lang` (English: the messages as written)."""
    if lang == DEFAULT:
        return ENGLISH
    try:
        return gettext.translation(DOMAIN, LOCALES_DIR, languages=[lang])
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"{LOCALES_DIR}/{lang}/LC_MESSAGES/{DOMAIN}.mo is missing: compile the catalogues "
            "with `make setup` (pybabel compile -d app/locales)"
        ) from exc


def current() -> str:
    """The code of the language this request is answered in."""
    return _language.get()


def set_language(lang: str) -> None:
    _language.set(lang)
    use(translations(lang))


_RANGE = re.compile(r"\s*([A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8})*|\*)\s*(?:;\s*q\s*=\s*([0-9.]+))?\s*")


def from_accept_language(header: str | None) -> str | None:
    """The supported language the browser prefers most (RFC 9110 quality values), or None."""
    best, best_q = None, 0.0
    for part in (header or "").split(",")[:32]:
        m = _RANGE.fullmatch(part)
        if not m:
            continue
        try:
            q = float(m.group(2)) if m.group(2) else 1.0
        except ValueError:
            continue
        primary = m.group(1).split("-")[0].lower()
        primary = "ms" if primary == "zsm" else primary  # Standard Malay's ISO 639-3 code
        if primary in LANGUAGES and q > best_q:
            best, best_q = primary, q
    return best


def negotiate(param: str | None, cookie: str | None, accept_language: str | None) -> str:
    for choice in (param, cookie):
        if choice in LANGUAGES:
            return choice
    return from_accept_language(accept_language) or DEFAULT


def localized(url: str, lang: str | None = None) -> str:
    """`url` as a link of a page in `lang` (this request's): a Malay page's links carry lang=ms, so
    the language follows the reader and a shared URL; English, the default, carries nothing."""
    lang = lang or current()
    return url if lang == DEFAULT else switched(url, lang)


def switched(url: str, lang: str) -> str:
    """`url` with its `lang` parameter set to `lang` (the header's switch)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != PARAM] + [(PARAM, lang)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _is_api(path: str) -> bool:
    return path.startswith("/api/") or path in ("/openapi.json", "/healthz", "/readyz")


class LanguageMiddleware:
    """Puts the request's language in effect (see the module's docstring); a page asked for with `lang`
    sets the cookie, and every answer says what it varies with."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in (b"cookie", b"accept-language")
        }
        api = _is_api(scope["path"])
        param = None
        if not api:
            param = next(
                (v for k, v in reversed(parse_qsl(scope.get("query_string", b"").decode("latin-1"))) if k == PARAM),
                None,
            )
        cookie = None
        if not api and "cookie" in headers:
            jar = SimpleCookie()
            try:
                jar.load(headers["cookie"])
            except Exception:  # a malformed cookie header is not the reader's language
                jar = SimpleCookie()
            cookie = jar[COOKIE].value if COOKIE in jar else None
        lang = negotiate(param, cookie, headers.get("accept-language"))
        set_language(lang)
        vary = b"Accept-Language" if api else b"Accept-Language, Cookie"
        remember = param in LANGUAGES and param != cookie

        async def send_with_language(message) -> None:
            if message["type"] == "http.response.start":
                out = list(message.get("headers", []))
                i = next((n for n, (k, _v) in enumerate(out) if k.lower() == b"vary"), None)
                if i is None:
                    out.append((b"vary", vary))
                else:
                    out[i] = (out[i][0], out[i][1] + b", " + vary)
                if not api:
                    out.append((b"content-language", lang.encode()))
                if remember:
                    out.append(
                        (b"set-cookie", f"{COOKIE}={lang}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; SameSite=Lax".encode())
                    )
                message = {**message, "headers": out}
            await send(message)

        await self.app(scope, receive, send_with_language)
