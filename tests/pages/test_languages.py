"""English and Bahasa Melayu (TestClient): which language a request gets, that it persists through
links, forms, htmx's pushed URLs and the cookie, that a Malay page leaves no English for its reader but
the technical words and the terms it marks as English, and that no number changes with the language,
on the pages or in the API."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient

from app.main import app
from app.pages.web import INSPECT_VIEWS
from tests.test_catalogue import TECHNICAL, catalogue

from .figure_data import load_figure

LESSONS = ["attention", "scaling", "causal", "multihead", "positions", "params", "forward"]
ALL_PAGES = (
    [
        "/",
        "/?view=compare&rollout=1&ablate=0.1",
        "/lessons",
        "/params",
        "/params?preset=tinyllama-1.1b",
        "/glossary",
        "/train",
        "/train?recipe=text",
        "/train?recipe=sae&architecture=jumprelu",
    ]
    + [f"/lessons/{name}" for name in LESSONS]
    + [f"/inspect?view={view}" for view in INSPECT_VIEWS]
    + [
        "/generate",
        "/generate?model=nasi-lemak&top_k=5&repetition_penalty=1.2&stop=.",
        "/circuits",
        "/circuits?target=attn_head_pos&direction=denoise&metric=prob&layer=1&head=1&query=3",
        "/circuits?model=toy&target=resid_mid",
        "/attribution",
        "/attribution?method=direct_logit&contrast=b",
        "/lessons/attribution",
    ]
)
# Pages whose words are not all in the catalogue yet, and what they still show in English.
PENDING: dict[str, str] = {}
PAGES = [p for p in ALL_PAGES if p not in PENDING]
HX = {"HX-Request": "true"}


@pytest.fixture(scope="module")
def web():
    """Its own client: a language's cookie must not follow the other tests' requests."""
    with TestClient(app) as c:
        yield c


@pytest.fixture(autouse=True)
def no_cookie(web):
    web.cookies.clear()
    yield
    web.cookies.clear()


def in_malay(path: str) -> str:
    return path + ("&" if "?" in path else "?") + "lang=ms"


def html_lang(text: str) -> str:
    return re.search(r'<html lang="([^"]+)"', text).group(1)


# ------------------------------------------------------------------ choosing the language


def test_english_by_default_and_malay_when_the_browser_prefers_it(web):
    assert html_lang(web.get("/lessons").text) == "en"
    r = web.get("/lessons/causal", headers={"Accept-Language": "ms-MY,ms;q=0.9,en;q=0.8"})
    assert html_lang(r.text) == "ms" and r.headers["content-language"] == "ms"
    assert "Accept-Language" in r.headers["vary"] and "HX-Request" in r.headers["vary"]
    assert html_lang(web.get("/lessons", headers={"Accept-Language": "en-GB,ms;q=0.5"}).text) == "en"
    assert html_lang(web.get("/lessons", headers={"Accept-Language": "fr, id;q=0.9"}).text) == "en"


def test_the_url_chooses_and_the_cookie_remembers(web):
    r = web.get("/lessons/attention?lang=ms")
    assert html_lang(r.text) == "ms" and "lang=ms" in r.headers["set-cookie"]
    assert html_lang(web.get("/params").text) == "ms"  # the cookie, on a link without lang
    r = web.get("/params?lang=en", headers={"Accept-Language": "ms"})
    assert html_lang(r.text) == "en" and "lang=en" in r.headers["set-cookie"]
    assert html_lang(web.get("/params", headers={"Accept-Language": "ms"}).text) == "en"  # the cookie wins


def test_a_malay_page_keeps_its_language_in_every_link_form_and_pushed_url(web):
    r = web.get("/lessons/attention?lang=ms")
    links = re.findall(r'href="(/[^"]*)"', r.text)
    switch = re.search(r'<nav class="language-switch".*?</nav>', r.text, re.S).group(0)
    own = [
        u
        for u in links
        if not u.startswith(("/static/", "/api/", "/docs")) and not u.endswith("snippet.py") and u not in switch
    ]
    assert own and all("lang=ms" in u for u in own), [u for u in own if "lang=ms" not in u]
    assert '<input type="hidden" name="lang" value="ms">' in r.text  # the settings form sends it with htmx
    part = web.get("/lessons/attention?lang=ms&seed=3", headers=HX)
    assert parse_qs(urlparse(part.headers["hx-push-url"]).query) == {"seed": ["3"], "lang": ["ms"]}
    inspect = web.get("/inspect?view=lens&lang=ms")
    tabs = re.findall(
        r'href="(/inspect\?[^"]*)"', re.search(r'<nav class="tabs".*?</nav>', inspect.text, re.S).group(0)
    )
    assert len(tabs) == len(INSPECT_VIEWS) and all("lang=ms" in t for t in tabs)


def test_the_switch_links_this_page_in_each_language(web):
    text = web.get("/lessons/scaling?seed=7&lang=ms").text
    switch = re.search(r'<nav class="language-switch".*?</nav>', text, re.S).group(0)
    assert (
        'href="/lessons/scaling?seed=7&amp;lang=ms"' in switch
        and 'href="/lessons/scaling?seed=7&amp;lang=en"' in switch
    )
    assert re.search(r'lang="ms"[^>]*aria-current="true"', switch)


def test_the_training_form_comes_back_to_the_run_in_malay(web):
    r = web.post("/train?lang=ms", data={"recipe": "nasi-lemak", "steps": "3"}, follow_redirects=False)
    assert r.status_code == 303 and "lang=ms" in r.headers["location"]


# ------------------------------------------------------------------ no English left on a Malay page


def _english_vocabulary() -> set[str]:
    """The words of the interface's English (every English message) that its Malay never uses."""

    def words(text: str) -> set[str]:
        text = re.sub(r"<[^>]+>|%\(\w+\)s|\{\w+[^}]*\}", " ", text)  # markup and placeholders
        text = re.sub(r"\b\w*[_\d]\w*\b", " ", text)  # identifiers and numbers
        return {w.lower() for w in re.findall(r"[A-Za-z]{2,}", text)}

    english, malay = set(), set()
    for m in catalogue("ms"):
        if m.id:
            english |= words(" ".join(m.id) if isinstance(m.id, tuple) else m.id)
            translated = " ".join(m.string) if isinstance(m.string, tuple) else m.string
            malay |= words(re.sub(r'<i lang="en">.*?</i>', " ", translated))  # an English term in brackets
    return english - malay - TECHNICAL


class _Visible(HTMLParser):
    """What a reader sees or hears: text and labelling attributes, outside code, scripts, a text box's text
    and any element marked lang="en" (an English term in brackets, a name)."""

    LABELS = {"title", "aria-label", "placeholder", "alt", "aria-valuetext"}
    VOID = {"input", "br", "meta", "link", "img", "hr", "source"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []
        self.found: list[str] = []

    def _hidden(self) -> bool:
        return any(hidden for _, hidden in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        hidden = tag in ("script", "style", "code", "pre", "option") or a.get("lang") == "en"
        if not self._hidden() and not hidden:
            self.found += [v for k, v in attrs if k in self.LABELS and v]
        if tag not in self.VOID:
            self.stack.append((tag, hidden))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        # a text box's text is what the model reads (the learner's, or the model's own default: English for
        # a model trained on English), not the page's words; its labels above are still the page's
        if not self._hidden() and not any(tag == "textarea" for tag, _ in self.stack):
            self.found.append(data)


ENGLISH = _english_vocabulary()


# Model and recipe names are names, in any language (the trained "induction" model, "toy", the "text" recipe).
NAMES = {"toy", "induction", "python", "docs", "spec", "forward", "all", "minilm", "text"}


def english_left(text: str) -> list[str]:
    p = _Visible()
    p.feed(text)
    return sorted(
        {
            w
            for t in p.found
            for w in re.findall(r"[A-Za-z]{2,}", re.sub(r"\b\w*[_\d]\w*\b", " ", t))
            if w.lower() in ENGLISH - NAMES
        }
    )


def figures(text: str) -> list[dict]:
    """Every figure of a page as the browser reads it (its data-figure attribute)."""
    return [load_figure(html.unescape(a)) for a in re.findall(r'data-figure="([^"]*)"', text)]


def figure_texts(text: str) -> list[str]:
    """The words a figure draws: its title, axis and colour-bar titles, legend entries and hover labels."""
    out = []
    for fig in figures(text):
        layout = fig.get("layout", {})
        for key, value in layout.items():
            if key.startswith(("xaxis", "yaxis", "coloraxis")) and isinstance(value, dict):
                out.append(str(value.get("title", {}).get("text", "")))
        out.append(str(layout.get("title", {}).get("text", "")) if isinstance(layout.get("title"), dict) else "")
        for trace in fig.get("data", []):
            out += [str(trace.get("name", "")), str(trace.get("hovertemplate", ""))]
            out.append(str(trace.get("colorbar", {}).get("title", {}).get("text", "")))
    return out


def test_the_english_vocabulary_is_the_interfaces():
    assert {"the", "attention", "weights", "layer"} <= ENGLISH and "token" not in ENGLISH


@pytest.mark.parametrize("path", ALL_PAGES)
def test_every_page_says_its_language_in_english_too(web, path):
    r = web.get(path)
    assert r.status_code == 200 and html_lang(r.text) == "en" and r.headers["content-language"] == "en"


@pytest.mark.parametrize("path", PAGES)
def test_a_malay_page_has_no_english_left(web, path):
    r = web.get(in_malay(path))
    assert r.status_code == 200 and html_lang(r.text) == "ms"
    assert english_left(r.text) == []
    drawn = [
        w
        for t in figure_texts(r.text)
        for w in re.findall(r"[A-Za-z]{2,}", re.sub(r"<[^>]+>|%\{[^}]*\}", " ", t))
        if w.lower() in ENGLISH
    ]
    assert drawn == [], "the figures' titles, axes, legends or hover text"


def test_every_models_description_is_said_in_malay_and_the_api_keeps_its_english():
    """The explorer's model card (Model.described()): the toys', the checkpoints' and the trained models', with
    their family, sizes, recipe and origin, in Malay; the API's `description` stays the English one."""
    from app.http.language import translations
    from app.models.catalog import build_catalog
    from app.settings import get_settings
    from core.i18n import using

    catalog = build_catalog(get_settings())
    models = list(catalog.values())
    assert {"toy", "spec-forward", "induction", "nasi-lemak", "python-docs", "all-MiniLM-L6-v2"} <= {
        m.name for m in models
    }
    for m in models:
        english = m.described()
        assert english == m.description, m.name  # the same words, said in English
        with using(translations("ms")):
            malay = m.described()
        assert malay != english and english_left(f"<p>{html.escape(malay)}</p>") == [], (m.name, malay)
        assert re.findall(r"\d+", malay) == re.findall(r"\d+", english), m.name  # the same sizes


# ------------------------------------------------------------------ the numbers never change


def _numbers(text: str) -> list[str]:
    """Every number a page prints in its tables and text, in order of size (a translation may reorder a
    sentence's numbers; the figures' data is compared apart)."""
    body = re.sub(r'data-figure="[^"]*"', "", text)
    body = html.unescape(re.sub(r"<[^>]+>", " ", body))
    return sorted(re.findall(r"[−-]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?", body))


@pytest.mark.parametrize(
    "path", [f"/lessons/{name}" for name in LESSONS] + ["/params", "/circuits", "/lessons/attribution", "/attribution"]
)
def test_a_lesson_prints_the_same_numbers_in_both_languages(web, path):
    english, malay = web.get(path).text, web.get(in_malay(path)).text
    assert _numbers(malay) == _numbers(english)
    drawn = lambda page: [[{k: t.get(k) for k in ("x", "y", "z")} for t in f["data"]] for f in figures(page)]  # noqa: E731
    assert drawn(malay) == drawn(english)


def test_the_spec_tables_are_the_same_in_malay(web):
    """The lessons' printed tables (tests/pages/test_lesson_pages.py checks them in English): every cell."""
    from tests.pages.test_lesson_pages import tables

    count = 0
    for name in LESSONS:
        english = tables(web.get(f"/lessons/{name}", params={"lang": "en"}).text)
        malay = tables(web.get(f"/lessons/{name}", params={"lang": "ms"}).text)
        assert english.keys() == malay.keys()
        for key in english:
            cells = [[c for c in row[1:] if re.fullmatch(r"−?-?[\d,.]+|−∞", c)] for row in english[key][1:]]
            assert cells == [[c for c in row[1:] if re.fullmatch(r"−?-?[\d,.]+|−∞", c)] for row in malay[key][1:]]
            count += sum(map(len, cells))
    assert count >= 94


API_GETS = [
    "/api/v1/lessons/attention",
    "/api/v1/lessons/scaling",
    "/api/v1/lessons/multihead",
    "/api/v1/lessons/positions",
    "/api/v1/lessons/forward",
    "/api/v1/params?preset=gpt2-small",
    "/api/v1/kv-cache?preset=gpt2-xl",
    "/api/v1/models",
    "/api/v1/hooks",
]


@pytest.mark.parametrize("path", API_GETS)
def test_the_api_answers_the_same_json_whatever_the_language(web, path):
    english = web.get(path)
    malay = web.get(path, headers={"Accept-Language": "ms"})
    assert english.status_code == malay.status_code == 200
    assert malay.json() == english.json()  # every float to the last bit, every field name


API_POSTS = [
    ("/api/v1/run", {"model": "toy", "text": "Ali makan nasi lemak", "hooks": ["blocks.0.attn.hook_pattern"]}),
    ("/api/v1/generate", {"model": "toy", "text": "Ali makan", "max_new_tokens": 4, "temperature": 0.8, "seed": 3}),
    (
        "/api/v1/analysis/patching",
        {"model": "induction", "clean": "abcab", "corrupted": "abcaa", "target": "attn_head"},
    ),
]


@pytest.mark.parametrize("path, body", API_POSTS, ids=[p for p, _ in API_POSTS])
def test_the_apis_posts_answer_the_same_json_whatever_the_language(web, path, body):
    english = web.post(path, json=body)
    malay = web.post(path, json=body, headers={"Accept-Language": "ms"})
    assert english.status_code == malay.status_code == 200, english.text
    assert malay.json() == english.json()


def test_the_api_says_its_errors_in_malay_for_accept_language_ms(web):
    english = web.get("/api/v1/lessons/attention", params={"d_model": 0})
    malay = web.get("/api/v1/lessons/attention", params={"d_model": 0}, headers={"Accept-Language": "ms"})
    assert english.status_code == malay.status_code == 422
    e, m = english.json()["detail"][0], malay.json()["detail"][0]
    assert e.keys() == m.keys() and e["loc"] == m["loc"] and e["type"] == m["type"]
    assert e["msg"] == "d_model: Input should be greater than or equal to 1"
    assert m["msg"] == "d_model: Input mesti lebih besar daripada atau sama dengan 1"
    # the API ignores the pages' cookie and URL parameter: a script gets English unless it asks
    web.get("/lessons?lang=ms")
    assert web.get("/api/v1/lessons/attention", params={"d_model": 0}).json()["detail"][0]["msg"] == e["msg"]


# ------------------------------------------------------------------ errors in the reader's language

# (method, path, body or params, status, English message, Malay message): core's, the service's and pydantic's
API_ERRORS = [
    (
        "GET",
        "/api/v1/lessons/multihead",
        {"d_model": 10, "n_heads": 4},
        422,
        "d_model=10 is not divisible by n_heads=4: each head gets d_model / n_heads dimensions",
        "d_model=10 tidak boleh dibahagi dengan n_heads=4: setiap kepala mendapat d_model / n_heads dimensi",
    ),
    (
        "POST",
        "/api/v1/run",
        {"model": "nope", "text": "Ali"},
        422,
        "unknown model 'nope': choose one of ",
        "model 'nope' tidak dikenali: pilih salah satu daripada ",
    ),
    (
        "POST",
        "/api/v1/generate",
        {"model": "toy", "text": "Ali", "top_k": 5000},
        422,
        "top_k=5000 is more than 'toy''s vocabulary of 96 tokens",
        "top_k=5000 melebihi kosa kata 'toy' yang berjumlah 96 token",
    ),
    (
        "POST",
        "/api/v1/generate",
        {"model": "all-MiniLM-L6-v2", "text": "Ali"},
        422,
        "'all-MiniLM-L6-v2' is an encoder (BERT-style)",
        "'all-MiniLM-L6-v2' ialah pengekod (gaya BERT)",
    ),
    (
        "POST",
        "/api/v1/generate",
        {"model": "toy", "text": "Ali", "top_p": 1.5},
        422,
        "top_p: Input should be less than or equal to 1",
        "top_p: Input mesti kurang daripada atau sama dengan 1",
    ),
    (
        "POST",
        "/api/v1/analysis/patching",
        {"model": "induction", "clean": "abc", "corrupted": "ab"},
        422,
        "the clean text has 3 tokens and the corrupted text 2: patching swaps activations position by position",
        "teks bersih mempunyai 3 token dan teks rosak 2: penampalan menukar pengaktifan kedudukan demi kedudukan",
    ),
    (
        "POST",
        "/api/v1/run",
        {"model": "toy", "text": "   "},
        422,
        "text: the text is empty or only spaces",
        "text: teks kosong atau hanya ruang",
    ),  # the app's own pydantic error
    (
        "GET",
        "/api/v1/lessons/scaling",
        {"dims": "4,0"},
        422,
        "dims: dims must each lie in 1 … 65,536; got 0",
        "dims: setiap dims mesti terletak dalam 1 … 65,536; tetapi diberi 0",
    ),
    (
        "GET",
        "/api/v1/runs/induction-000000000000",
        None,
        404,
        "there is no run 'induction-000000000000' on this server: GET /api/v1/runs lists them",
        "tiada larian 'induction-000000000000' pada pelayan ini: GET /api/v1/runs menyenaraikannya",
    ),
]


@pytest.mark.parametrize("method, path, given, status, english, malay", API_ERRORS, ids=[e[1] for e in API_ERRORS])
def test_an_api_error_is_said_in_malay_and_nothing_else_changes(web, method, path, given, status, english, malay):
    def ask(lang: str):
        kwargs = {"json": given} if method == "POST" else {"params": given}
        return web.request(method, path, headers={"Accept-Language": lang}, **kwargs)

    e, m = ask("en"), ask("ms")
    assert e.status_code == m.status_code == status
    assert [{k: v for k, v in d.items() if k != "msg"} for d in e.json()["detail"]] == [
        {k: v for k, v in d.items() if k != "msg"} for d in m.json()["detail"]
    ]  # loc and type: the same
    (e_msg,), (m_msg,) = [d["msg"] for d in e.json()["detail"]], [d["msg"] for d in m.json()["detail"]]
    assert e_msg.startswith(english) and m_msg.startswith(malay)
    assert re.findall(r"\d+(?:\.\d+)?", e_msg) == re.findall(r"\d+(?:\.\d+)?", m_msg)  # the same numbers


@pytest.mark.parametrize(
    "path, malay",
    [
        (
            "/lessons/multihead?d_model=10&n_heads=4",
            "d_model=10 tidak boleh dibahagi dengan n_heads=4: setiap kepala mendapat d_model / n_heads dimensi",
        ),
        ("/generate?top_p=1.5", "top_p mesti terletak dalam (0, 1]: bahagian kebarangkalian yang disimpan"),
        ("/generate?model=toy&max_new_tokens=100000", "max_new_tokens=100000 melebihi had pelayan ini"),
        ("/lessons/attention?d_model=0", "d_model: Input mesti lebih besar daripada atau sama dengan 1"),
        ("/inspect?view=decompose&pos=99", "pos=99 berada di luar "),
        (
            "/circuits?model=induction&clean=abc&corrupted=ab",
            "teks bersih mempunyai 3 token dan teks rosak 2: penampalan",
        ),
    ],
)
def test_a_malay_page_says_an_error_in_place_in_malay(web, path, malay):
    r = web.get(in_malay(path))
    assert r.status_code == 422 and html_lang(r.text) == "ms"
    assert malay in r.text
    assert english_left(r.text) == []
