"""Words for people, in the reader's language: stdlib gettext, with the language chosen per context.

core writes what it tells people (error messages, a lesson's labels) in English, marked for the
message catalogue with `_()`; a string that must be marked where it is written but translated where it
is shown (a module-level table) is marked with `N_()` and passed through `_()` when shown. Placeholders
are named, so a translation can put them in its own order:

    raise InputError(_("d_model={d_model} is not divisible by n_heads={n_heads}").format(...))

Which language `_()` answers in is the caller's: `use(translations)` (any `gettext.NullTranslations`)
sets it for the current context, a thread or an asyncio task, and every copy of that context (a worker
thread the request's work runs in). Without it, English. core holds no catalogue: the app loads one per
language (app/http/language.py) and sets it for each request; a notebook may do the same with
`gettext.translation(...)`.
"""

from __future__ import annotations

import gettext
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

ENGLISH = gettext.NullTranslations()
_current: ContextVar[gettext.NullTranslations] = ContextVar("translations", default=ENGLISH)


def _(message: str) -> str:
    """`message` in the current language (itself in English, or where the catalogue lacks it)."""
    return _current.get().gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    """The form of a message for `n` things, in the current language (Malay has one form, English two)."""
    return _current.get().ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Marks `message` for the catalogue without translating it: it is translated where it is shown."""
    return message


def current() -> gettext.NullTranslations:
    return _current.get()


def use(translations: gettext.NullTranslations) -> None:
    """Answer in `translations`' language from now on, in this context (and the contexts copied from it)."""
    _current.set(translations)


@contextmanager
def using(translations: gettext.NullTranslations) -> Iterator[None]:
    """Answer in `translations`' language inside the `with` block only."""
    token = _current.set(translations)
    try:
        yield
    finally:
        _current.reset(token)
