"""The page scripts (static/js): every one an ES module, loaded the same way by every page; the words they
write come from the page (its data-<set>-words attributes) through one module, static/js/words.js, and
every word a script asks for is in the attribute the page renders. (The JS linter, eslint with
eslint.config.js, runs in `make test`; the browser tests run the scripts.)"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from app.pages import classroom
from app.paths import STATIC_DIR
from app.paths import TEMPLATES_DIR as TEMPLATES

JS = STATIC_DIR / "js"
PAGES = [
    "/",
    "/lessons/attention",
    "/lessons",
    "/params",
    "/glossary",
    "/inspect",
    "/train",
    "/generate",
    "/circuits",
    "/docs",
]


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts: list[dict] = []
        self.words: dict[str, dict] = {}  # set -> its words (the first element holding them)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts.append(a)
        for name, value in a.items():
            found = re.fullmatch(r"data-([a-z]+)-words", name)
            if found:
                self.words.setdefault(found.group(1), json.loads(value))


def parsed(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    return tags


@pytest.mark.parametrize("path", PAGES)
def test_every_page_script_is_a_module(client, path):
    r = client.get(path)
    assert r.status_code == 200
    scripts = parsed(r.text).scripts
    ours = [s for s in scripts if s["src"].startswith("/static/js/")]
    assert ours and all(s.get("type") == "module" and "defer" not in s for s in ours), ours
    # the libraries (classic scripts that set window.htmx, window.Plotly, ...) come first, so a module
    # (deferred: run in document order) finds them
    kinds = [s["src"].startswith("/static/js/") for s in scripts]
    assert kinds == sorted(kinds), [s["src"] for s in scripts]


def test_every_script_file_is_loaded_or_imported():
    files = {p.name for p in JS.glob("*.js")}
    templates = "\n".join(p.read_text(encoding="utf-8") for p in TEMPLATES.rglob("*.html"))
    loaded = set(re.findall(r'<script type="module" src="/static/js/([\w-]+\.js)"></script>', templates))
    imported = set()
    for p in JS.glob("*.js"):
        imported |= set(re.findall(r'^import .*?"\./([\w-]+\.js)";$', p.read_text(encoding="utf-8"), re.M))
    assert files == loaded | imported, files ^ (loaded | imported)
    assert "words.js" in imported and not re.search(r'src="/static/js/[\w-]+\.js"(?! ?>)', templates)


def test_only_words_js_reads_the_pages_words():
    for p in JS.glob("*.js"):
        code = "\n".join(
            line for line in p.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("//")
        )
        reads = re.findall(r"dataset\.\w*[wW]ords|-words\b", code)
        assert (p.name == "words.js") == bool(reads), (p.name, reads)


def said(path) -> set[tuple[str, str]]:
    """(set, key) of every say("set", "key", ...) with both spelled out in one script."""
    return set(re.findall(r'\bsay\("([a-z]+)", "(\w+)"', path.read_text(encoding="utf-8")))


def test_the_words_a_script_asks_for_are_on_its_page(client):
    pages = {"request": "/", "copy": "/lessons/attention", "generate": "/generate?model=toy&text=Ali"}
    asked = set().union(*(said(p) for p in JS.glob("*.js")))
    assert {s for s, _ in asked} >= {"request", "copy", "train"}
    # generate.js asks through its own say(key, ...): the keys it spells out
    generate = JS / "generate.js"
    asked |= {("generate", k) for k in re.findall(r'\bsay\("(\w+)"[,)]', generate.read_text(encoding="utf-8"))}
    # train.html's words appear on a run's page only: read from the template (the same literal keys)
    train = re.search(r"data-train-words='\{\{ \{(.*?)\} \| tojson \}\}'", (TEMPLATES / "train.html").read_text())
    have = {"train": set(re.findall(r'"(\w+)":', train.group(1)))}
    # the live class's: its two pages render classroom.words(); the Presenting bar, only on a teacher's pages
    have["class"] = set(classroom.words())
    bar = re.search(r"data-presenting-words='\{\{ \{(.*?)\} \| tojson \}\}'", (TEMPLATES / "base.html").read_text())
    have["presenting"] = set(re.findall(r'"(\w+)":', bar.group(1)))
    for name, path in pages.items():
        have[name] = set(parsed(client.get(path).text).words[name])
    missing = {(s, k) for s, k in asked if k not in have[s]}
    assert not missing, missing
    # and every word a page sends is used (generate's by keys made at run time too: stage_*, *_one)
    unused = have["request"] - {k for s, k in asked if s == "request"}
    assert not unused, unused


@pytest.mark.parametrize("lang", ["en", "ms"])
def test_the_copy_buttons_words_follow_the_page(client_with, lang):
    client = client_with()  # its own: ?lang= sets the language cookie, which the shared client would keep
    words = parsed(client.get("/lessons/attention", params={"lang": lang}).text).words["copy"]
    assert set(words) == {"copied", "selected"}
    assert (words["copied"] == "Copied") == (lang == "en")
