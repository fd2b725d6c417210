"""The message catalogues hold every word people read, and the Malay one translates all of it.

- Babel's extractor (babel.cfg: core's and the app's Python, the templates) finds exactly the messages
  app/locales/messages.pot and each language's .po list: a message added to the code without `make
  messages` fails here, and so does an entry nobody uses any more.
- Every Malay entry is translated and none is fuzzy; its placeholders are the English message's, so a
  translation can move them but never lose one; the compiled .mo is the .po's (`make setup`).
- No user-facing literal outside the catalogue: a template's text, its labels (title, aria-label,
  placeholder, alt) and the strings it hands to macros as labels, and a module's error messages, figure
  titles, captions and labels, must go through `{% trans %}`, `_()`, `N_()` or `ngettext()`. The modules
  and templates not yet translated are listed in PENDING with the reason; everything else is checked.
"""

from __future__ import annotations

import ast
import gettext
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.frontend import parse_mapping_cfg
from babel.messages.pofile import read_po
from jinja2 import nodes

from app.pages.web import templates

ROOT = Path(__file__).resolve().parent.parent
LOCALES = ROOT / "app" / "locales"
LANGUAGES = ["ms"]

# Written by people other than this catalogue's translators while it was made, translated next (the files
# named here are skipped by the literal checks below, and only by them).
PENDING: dict[str, str] = {}
# Words a Malay page keeps as they are: names from code and the field's symbols (also allowed in an
# English literal outside the catalogue, where they are all the literal says).
TECHNICAL = {
    "api",
    "json",
    "csv",
    "numpy",
    "python",
    "gpt",
    "bert",
    "relu",
    "rope",
    "rms",
    "swiglu",
    "softmax",
    "logit",
    "logits",
    "transformer",
    "explorer",
    "bm",
    "en",
    "kv",
    "mlp",
    "max",
    "sin",
    "cos",
    "pe",
    "dim",
    "ali",
    "makan",
    "nasi",
    "lemak",
    "goreng",
    "py",
    "float32",
    "float16",
    "bfloat16",
    "dtype",
    "learned",
    "rotary",
    "sinusoidal",
    "alibi",  # positional_embedding_type's values
    "top-k",
    "top-p",  # the sampling settings, named as transformers names them
}


def _ids(catalog) -> set:
    return {m.id if isinstance(m.id, str) else tuple(m.id) for m in catalog if m.id}


@pytest.fixture(scope="module")
def extracted() -> set:
    with open(ROOT / "babel.cfg", encoding="utf-8") as fh:
        method_map, options_map = parse_mapping_cfg(fh)
    found = set()
    for _file, _line, message, _comments, _context in extract_from_dir(
        str(ROOT), method_map, options_map, strip_comment_tags=True
    ):
        found.add(message if isinstance(message, str) else tuple(message[:2]))
    return found


def catalogue(lang: str | None = None):
    path = LOCALES / "messages.pot" if lang is None else LOCALES / lang / "LC_MESSAGES" / "messages.po"
    with open(path, "rb") as fh:
        return read_po(fh, locale=lang)


def test_the_template_catalogue_lists_exactly_the_messages_in_the_code(extracted):
    listed = _ids(catalogue())
    assert sorted(map(str, extracted - listed)) == [], "new messages: run `make messages` and translate them"
    assert sorted(map(str, listed - extracted)) == [], "messages no longer used: run `make messages`"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_message_is_translated_and_none_is_fuzzy(extracted, lang):
    po = catalogue(lang)
    assert sorted(map(str, extracted - _ids(po))) == [], f"run `make messages`: {lang}'s .po lacks these"
    untranslated = [m.id for m in po if m.id and not all(m.string if isinstance(m.string, tuple) else (m.string,))]
    fuzzy = [m.id for m in po if m.id and m.fuzzy]
    assert untranslated == [] and fuzzy == []


PLACEHOLDER = re.compile(r"%\([a-z_]+\)s|\{[a-z_]+(?:[!:][^}]*)?\}")


@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_translation_keeps_every_placeholder(lang):
    wrong = []
    for m in catalogue(lang):
        if not m.id:
            continue
        english = m.id if isinstance(m.id, str) else m.id[-1]
        for translated in m.string if isinstance(m.string, tuple) else (m.string,):
            if sorted(PLACEHOLDER.findall(english)) != sorted(PLACEHOLDER.findall(translated)):
                wrong.append((english, translated))
    assert wrong == []


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_compiled_catalogue_is_the_po_files(lang):
    mo = LOCALES / lang / "LC_MESSAGES" / "messages.mo"
    assert mo.exists(), "compile the catalogues: make setup"
    with open(mo, "rb") as fh:
        compiled = gettext.GNUTranslations(fh)
    stale = [m.id for m in catalogue(lang) if isinstance(m.id, str) and m.id and compiled.gettext(m.id) != m.string]
    assert stale == [], "the .mo is older than the .po: make setup compiles it again"


# ------------------------------------------------------------------ no user-facing literal outside it

WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
FUNCTION_WORDS = {
    "the",
    "a",
    "an",
    "of",
    "to",
    "on",
    "in",
    "by",
    "for",
    "is",
    "with",
    "and",
    "or",
    "per",
    "at",
    "from",
    "its",
    "it",
    "this",
    "be",
    "not",
    "no",
    "as",
    "each",
    "every",
}


def english_words(text: str) -> list[str]:
    """The words of `text` a reader would have to read in English: not code names (with _ or digits), not
    single letters (Q, K, d), not the technical words both languages keep."""
    text = re.sub(r"\b\w*[_\d]\w*\b", " ", text)  # d_model, n_ctx, float32, L0H1
    return [w for w in WORD.findall(text) if len(w) > 1 and w.lower() not in TECHNICAL]


class _Text(HTMLParser):
    """Text a reader sees or hears in a flattened template: text nodes and the labelling attributes."""

    LABELS = {"title", "aria-label", "placeholder", "alt", "aria-valuetext"}
    SKIP = {"script", "style", "code", "pre"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in self.SKIP
        self.found += [v for k, v in attrs if k in self.LABELS and v]

    def handle_endtag(self, tag):
        self._skip -= tag in self.SKIP and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.found.append(data)


GETTEXT = {"_", "gettext", "ngettext", "N_"}


def _flatten(node, out: list[str], consts: list[str]) -> None:
    """The template's literal text in source order, every branch of every `if` included, "\\0" for what an
    expression writes; string constants that are not a gettext call's argument go to `consts`."""
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name in GETTEXT:
        return
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        consts.append(node.value)
    for child in node.iter_child_nodes():
        if isinstance(node, nodes.Output) and isinstance(child, nodes.TemplateData):
            out.append(child.data)
            continue
        if isinstance(node, nodes.Output):
            out.append("\0")
        _flatten(child, out, consts)


def _prose(const: str) -> bool:
    """A string constant in a template that reads as words for people (a label, a help text), not a name,
    a CSS class, an id or a format: capitalised words, or words joined by English function words."""
    words = english_words(const)
    return bool(words) and (
        const[:1].isupper()
        and any(c.islower() for c in const)
        or len(words) > 1
        and any(w.lower() in FUNCTION_WORDS for w in words)
    )


TEMPLATES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "templates").rglob("*.html"))


@pytest.mark.parametrize("name", [t for t in TEMPLATES if t not in PENDING])
def test_a_template_has_no_text_for_people_outside_the_catalogue(name):
    source = (ROOT / name).read_text(encoding="utf-8")
    out: list[str] = []
    consts: list[str] = []
    _flatten(templates.env.parse(source), out, consts)
    parser = _Text()
    parser.feed("".join(out))
    literal = [t.strip() for t in parser.found if english_words(t.replace("\0", " "))]
    assert literal == [], f"{name}: wrap these in {{% trans %}} or _()"
    assert [c for c in consts if _prose(c)] == [], f"{name}: pass these through _()"


# Modules whose text people read: every string in one of the places below must be a gettext call's argument.
CHECKED_MODULES = [
    "app/pages/lessons.py",
    "app/pages/inspect.py",
    "app/pages/train.py",
    "app/pages/web.py",
    "app/pages/glossary.py",
    "app/pages/explorer.py",
    "app/pages/generate.py",
    "app/pages/circuits.py",
    "app/http/errors.py",
]
RAISED = {"InputError", "NotFound", "Unavailable", "ValueError"}
SHOWN_KEYS = {"title", "caption", "label", "summary", "hint", "legend", "help", "note", "reason", "message"}
SHOWN_KEYWORDS = SHOWN_KEYS - {"summary"} | {"x_title", "y_title", "value_name"}  # summary=: OpenAPI's


def _is_gettext(node: ast.AST) -> bool:
    """_("...") or _("...").format(...)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        node = node.func.value
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in GETTEXT


def _literal_words(node: ast.AST) -> list[str]:
    """English words a literal (a string, an f-string, a concatenation or a conditional of them) writes
    outside a gettext call."""
    if _is_gettext(node):
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return english_words(node.value)
    if isinstance(node, ast.JoinedStr):
        return [w for v in node.values for w in _literal_words(v)]
    if isinstance(node, ast.BinOp):
        return _literal_words(node.left) + _literal_words(node.right)
    if isinstance(node, ast.IfExp):
        return _literal_words(node.body) + _literal_words(node.orelse)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "join"):
        return _literal_words(node.func.value)
    return []


def shown_literals(tree: ast.AST) -> list[tuple[int, list[str]]]:
    found = []
    for node in ast.walk(tree):
        shown = []
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            func = node.exc.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in RAISED:
                shown.append(node.exc.args[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "errors"
        ):
            shown += node.args
        elif isinstance(node, ast.Dict):
            shown += [
                v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value in SHOWN_KEYS
            ]
        if isinstance(node, ast.Call):
            shown += [k.value for k in node.keywords if k.arg in SHOWN_KEYWORDS]
        found += [(n.lineno, words) for n in shown if (words := _literal_words(n))]
    return found


@pytest.mark.parametrize("module", CHECKED_MODULES)
def test_a_module_shows_no_text_for_people_outside_the_catalogue(module):
    literals = shown_literals(ast.parse((ROOT / module).read_text(encoding="utf-8")))
    assert literals == [], f"{module}: pass these through _() (line, words)"


# The packages whose error messages reach people (the API's 422/404/503 details, a page's message in place of a
# figure, a notebook's exception): every module, a new one included, is read for an error built from a literal.
MESSAGE_PACKAGES = ["core", "app/service", "app/api", "app/training", "app/models", "app/http"]
# Modules whose error messages are not in the catalogue yet, and why.
PENDING_MODULES: dict[str, str] = {}
MESSAGE_MODULES = sorted(p.relative_to(ROOT).as_posix() for pkg in MESSAGE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))


# Functions whose arguments after the first become part of an error message (what a limit counts, what to
# reduce, the view that cannot run).
MESSAGE_PIECES = {
    "check_count",
    "check_cost",
    "check_hook_values",
    "load",
    "require_pre_norm",
    "require_causal_decoder",
    "decomposition",  # app/service/capabilities.py: the view that cannot run
}


def raised_literals(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """Error messages built from a literal outside a gettext call: the first argument of any InputError,
    NotFound, Unavailable or ValueError made (raised, returned or kept), and what goes into `errors`."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in RAISED or name == "append" and isinstance(func.value, ast.Name) and func.value.id == "errors":
            if words := _literal_words(node.args[0]):
                found.append((node.lineno, words))
        elif name == "PydanticCustomError" and len(node.args) > 1:  # (type, message template, context)
            if words := _literal_words(node.args[1]):
                found.append((node.lineno, words))
        elif name in MESSAGE_PIECES:  # the words an error message is built from, given by the caller
            found += [(node.lineno, words) for arg in node.args if (words := _literal_words(arg))]
    return found


@pytest.mark.parametrize("module", [m for m in MESSAGE_MODULES if m not in PENDING_MODULES])
def test_an_error_message_is_in_the_catalogue(module):
    literals = raised_literals(ast.parse((ROOT / module).read_text(encoding="utf-8")))
    assert literals == [], f"{module}: say these errors through _() with named placeholders (line, words)"


def test_every_pending_module_exists():
    assert set(PENDING_MODULES) <= set(MESSAGE_MODULES) and "core/config.py" in MESSAGE_MODULES


def test_the_literal_checks_find_what_they_look_for():
    """The checks themselves: each kind of place they look at, caught when it is not translated."""
    code = ast.parse(
        'raise InputError(f"d_model={d} is too large")\nerrors.append("not a number")\n'
        'x = {"title": "Head " + str(h)}\nchart(x_title="position")\nok = {"title": _("Head")}\n'
        'raise InputError(_("{n} is not a number").format(n=n))'
    )
    assert [line for line, _ in shown_literals(code)] == [1, 2, 3, 4]
    code = ast.parse(
        'raise NotFound(f"no run {id!r}")\nreturn Unavailable("training is off", retry_after_s=5)\n'
        'errors.append("not a number")\nraise InputError(_("{n} is not a number").format(n=n))\n'
        'raise InputError(reason)\nraise ValueError("its header is " + kind)\n'
        'raise PydanticCustomError("too_long", f"more than {most} pairs")\n'
        'raise PydanticCustomError("too_long", _("more than {most} pairs").format(most=most))\n'
        'self.limits.check_count("the text", n, limit, _("use a shorter text"))'
    )
    assert [line for line, _ in raised_literals(code)] == [1, 2, 3, 6, 7, 9]
    out, consts = [], []
    _flatten(
        templates.env.parse(
            '<p title="Hover me">Hello {{ x }}</p>{{ m.text("text", "Words") }}'
            '<p>{% trans %}Fine{% endtrans %} {{ _("Fine") }}</p>'
        ),
        out,
        consts,
    )
    parser = _Text()
    parser.feed("".join(out))
    assert [t for t in parser.found if english_words(t.replace("\0", " "))] == ["Hover me", "Hello \0"]
    assert [c for c in consts if _prose(c)] == ["Words"]
