"""The live class's pages (issue 35): /class (the teacher's), /class/{code} (a student's) and the
"Presenting" bar every page of a presenting teacher carries. A teacher and students are TestClients of one
app, each with its own cookies. (tests/browser/test_class.py drives them in Chromium.)"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


@pytest.fixture
def clients():
    """clients(n): n clients of one app (one class store), each with its own cookies: a teacher, students."""
    opened = []

    def make(n: int = 2) -> list[TestClient]:
        app = create_app(Settings())
        first = TestClient(app).__enter__()
        opened.append(first)
        return [first, *(TestClient(app) for _ in range(n - 1))]

    yield make
    for c in opened:
        c.__exit__(None, None, None)


def start(teacher: TestClient) -> str:
    r = teacher.post("/api/v1/classes")
    assert r.status_code == 201, r.text
    return r.json()["code"]


class Texts(HTMLParser):
    """Every element's text and attributes, to find what the page shows without matching its markup."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parsed(html: str) -> Texts:
    page = Texts()
    page.feed(html)
    return page


def test_the_class_page_offers_to_start_and_to_join(clients):
    (someone,) = clients(1)
    r = someone.get("/class")
    assert r.status_code == 200
    page = parsed(r.text)
    assert any(t == "button" and a.get("id") == "start-class" for t, a in page.tags)
    assert any(t == "form" and a.get("action") == "/class/join" for t, a in page.tags)
    assert "presenting-bar" not in r.text  # no class yet


def test_a_running_class_shows_its_code_link_and_qr_code(clients):
    teacher, student = clients(2)
    code = start(teacher)
    r = teacher.get("/class")
    assert r.status_code == 200
    page = parsed(r.text)
    link = next(a for t, a in page.tags if t == "a" and a.get("id") == "join-link")
    assert link["href"] == f"http://testserver/class/{code}"  # absolute, from the request's host
    assert code in "".join(page.text)
    svg = re.search(r"<svg\b.*?</svg>", r.text, re.S).group(0)
    assert "<path" in svg
    # The QR code is modules only: nothing of the link (nor any other text) appears in its markup.
    assert code not in svg and "testserver" not in svg and "<text" not in svg and "<title" not in svg
    # A student's browser has no teacher's cookie: its /class offers to start a class of its own.
    assert "start-class" in student.get("/class").text


def test_the_qr_code_encodes_the_join_link(clients):
    """The same library drawing the same link draws the same symbol: the page's QR code is the link's."""
    import segno

    (teacher,) = clients(1)
    code = start(teacher)
    svg = re.search(r"<svg\b.*?</svg>", teacher.get("/class").text, re.S).group(0)
    expected = segno.make(f"http://testserver/class/{code}", error="m")
    assert re.search(r' d="([^"]+)"', svg).group(1) == re.search(
        r' d="([^"]+)"', expected.svg_inline(scale=6, border=2, dark="#000", light="#fff")
    ).group(1)
    other = segno.make(f"http://testserver/class/{code[:-1]}X", error="m").svg_inline(scale=6, border=2)
    assert re.search(r' d="([^"]+)"', svg).group(1) != re.search(r' d="([^"]+)"', other).group(1)


def test_the_presenting_bar_is_only_for_the_teacher_of_a_live_class(clients):
    teacher, student = clients(2)
    code = start(teacher)
    for path in ("/", "/lessons/attention", "/circuits", "/generate", "/class"):
        r = teacher.get(path)
        assert r.status_code == 200, path
        assert 'id="presenting-bar"' in r.text and f'data-class-code="{code}"' in r.text, path
        assert "/static/js/presenting.js" in r.text
    assert student.get(f"/class/{code}").status_code == 200
    for path in ("/", f"/class/{code}"):
        r = student.get(path)
        assert "presenting-bar" not in r.text and "presenting.js" not in r.text, path
    # A student who copies the code into the presenting cookie is still no teacher: the token decides.
    student.cookies.set("explorer_presenting", code)
    student.cookies.set(f"explorer_teacher_{code}", "not-the-token")
    assert "presenting-bar" not in student.get("/").text
    # Ended: the bar goes.
    assert teacher.delete(f"/api/v1/classes/{code}").status_code == 204
    assert "presenting-bar" not in teacher.get("/").text


def test_a_question_and_options_are_text_on_the_pages(clients):
    teacher, student = clients(2)
    code = start(teacher)
    question = "<b>Which</b> comes next? <script>alert(1)</script>"
    options = ["<i>a</i>", "b&c"]
    r = teacher.post(f"/api/v1/classes/{code}/polls", json={"question": question, "options": options})
    assert r.status_code == 201
    html = teacher.get("/class").text
    assert "<b>Which</b>" not in html and "<script>alert" not in html and "<i>a</i>" not in html
    assert "&lt;b&gt;Which&lt;/b&gt;" in html  # the question, as text
    shown = next(a for t, a in parsed(html).tags if a.get("id") == "poll-live")
    assert json.loads(shown["data-poll"])["options"] == options  # the open poll, as data the script sets as text


def test_the_student_page_frames_the_teachers_page_in_the_students_language(clients):
    teacher, student = clients(2)
    code = start(teacher)
    assert teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/?text=Ali+makan&layer=1"}).status_code == 200
    r = student.get(f"/class/{code}?lang=ms")
    assert r.status_code == 200
    page = parsed(r.text)
    frame = next(a for t, a in page.tags if t == "iframe")
    assert frame["src"] == "/?text=Ali+makan&layer=1&lang=ms" and frame["title"]
    buttons = {a.get("id"): a for t, a in page.tags if t == "button"}
    assert {"explore-own", "follow-teacher"} <= set(buttons)
    text = "".join(page.text)
    assert "Teroka sendiri" in text and "Ikut guru" in text
    assert "Explore on my own" in student.get(f"/class/{code}?lang=en").text
    assert any(a.get("aria-live") == "polite" and a.get("id") == "class-announce" for t, a in page.tags)


def test_a_wrong_code_says_so_and_is_counted(clients):
    (student,) = clients(1)
    r = student.get("/class/AAAAAAAA")
    assert r.status_code == 404
    assert "cannot be joined" in r.text
    # Typed codes go to their page, whatever their case and spaces.
    r = student.get("/class/join", params={"code": " abcd efgh "}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/class/ABCDEFGH"


def test_wrong_codes_on_the_page_are_rate_limited(clients):
    (student,) = clients(1)
    statuses = [student.get(f"/class/AAAAAAA{c}").status_code for c in "ACDEFGHJKMNPQRTUVWXY34679"]
    assert statuses[0] == 404 and statuses[-1] == 429
