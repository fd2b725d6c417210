"""A live class in real Chromium (issue 35): a teacher and students in separate browser contexts (separate
cookies), on one real server. The teacher starts a class on /class, students join by the link and by the
typed code, and every student's framed view follows the teacher's explorer (its "Classroom size" toggle
too) and lessons without their own page navigating, on one process and on two workers sharing their
classes through SQLite; a student a full class refuses is told so; "Explore on my own" and "Follow the teacher"; a poll's answers on the teacher's page and
its reveal on the students'; the end of the class. In English and in Malay. axe-core on both pages."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from .conftest import CHROMIUM, CHROMIUM_ARGS, PageWatch, require_chromium

pytestmark = pytest.mark.browser

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
PHONE = {"width": 390, "height": 844}
RUN_AXE = """async (tags) => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                       nodes: v.nodes.slice(0, 5).map(n => n.target.join(' '))}));
}"""
# The student's framed page: its path and query, once it has loaded.
FRAMED = """() => { const w = document.getElementById('class-view').contentWindow;
  return w.document.readyState === 'complete' ? w.location.pathname + w.location.search : null; }"""


@pytest.fixture(scope="module")
def chromium():
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def people(chromium):
    """people(n): n tabs, each in a browser context of its own (its own cookies): a teacher, students."""
    contexts = []

    def make(n: int, **options) -> list:
        tabs = []
        for _ in range(n):
            context = chromium.new_context(viewport={"width": 1200, "height": 900}, **options)
            contexts.append(context)
            tab = context.new_page()
            tab.watch = PageWatch(tab)
            tab.set_default_timeout(20_000)
            tabs.append(tab)
        return tabs

    yield make
    for context in contexts:
        context.close()


MAX_STUDENTS = 2  # the two-worker server's cap: the follow test's two students fit, a third is refused


@pytest.fixture(scope="module")
def two_workers():
    """`python -m app` with two worker processes and no Redis, as `docker compose up` runs it: the classes
    live in the SQLite file the workers share, and a teacher's and a student's requests reach either."""
    import tempfile

    from .conftest import SERVER_START_TIMEOUT_S, liveserver

    env = {"EXPLORER_WORKERS": "2", "EXPLORER_ACCESS_LOG": "false", "EXPLORER_CLASS_MAX_STUDENTS": str(MAX_STUDENTS)}
    with (
        tempfile.TemporaryDirectory(prefix="explorer-browser-classes-") as runs,
        liveserver.live_server(
            env={**env, "EXPLORER_RUNS_DIR": runs}, entry_point=True, startup_timeout_s=2 * SERVER_START_TIMEOUT_S
        ) as server,
    ):
        yield server.url


def start_class(teacher, live_server, lang: str = "en") -> str:
    teacher.goto(f"{live_server}/class?lang={lang}")
    teacher.locator("#start-class").click()
    teacher.wait_for_selector("#class-code")
    return teacher.locator("#class-code").text_content().strip()


def pin(student) -> None:
    """Mark the student's top-level page: a full reload or a navigation would lose the mark."""
    student.evaluate("() => { window.__notReloaded = true; }")


def still_pinned(student) -> bool:
    return student.evaluate("() => window.__notReloaded === true")


def framed_query(student) -> dict:
    return parse_qs(urlparse(student.evaluate(FRAMED) or "").query)


def wait_framed(student, predicate_js: str) -> None:
    """Wait until the framed page's URL (path + query, a URL object `u`) satisfies `predicate_js`."""
    student.wait_for_function(
        f"() => {{ const p = ({FRAMED})(); if (!p) return false; const u = new URL(p, location.origin); return {predicate_js}; }}"
    )


@pytest.mark.parametrize("server", ["one process", "two workers"])
def test_students_follow_the_teacher_and_answer_a_poll(people, request, server):
    live_server = request.getfixturevalue("live_server" if server == "one process" else "two_workers")
    teacher, by_link, by_code = people(3)
    code = start_class(teacher, live_server)
    link = teacher.locator("#join-link").get_attribute("href")
    assert link == f"{live_server}/class/{code}"
    assert teacher.locator(".class-qr svg").count() == 1

    by_link.goto(link)
    by_code.goto(live_server + "/class")
    by_code.locator("#join-code").fill(code.lower())
    by_code.get_by_role("button", name="Join", exact=True).click()
    by_code.wait_for_url(f"{live_server}/class/{code}")
    students = [by_link, by_code]
    for s in students:
        wait_framed(s, "u.pathname === '/'")
        pin(s)
    teacher.wait_for_function("() => /^2 students/.test(document.getElementById('student-count').textContent)")

    # The teacher's explorer, in a second tab of the teacher's browser: text and layer.
    explorer = teacher.context.new_page()
    explorer.watch = PageWatch(explorer)
    explorer.goto(live_server + "/")
    assert explorer.locator("#presenting-bar").is_visible()
    explorer.wait_for_selector("#stage-weights [data-figure]")
    explorer.locator("#text").fill("the cat sat")
    explorer.wait_for_function("() => new URL(location.href).searchParams.get('text') === 'the cat sat'")
    explorer.locator("label[for=layer-1]").click()
    explorer.wait_for_function("() => new URL(location.href).searchParams.get('layer') === '1'")
    for s in students:
        wait_framed(s, "u.searchParams.get('text') === 'the cat sat' && u.searchParams.get('layer') === '1'")
        assert still_pinned(s)
    # "Classroom size" moves the address bar by itself (replaceState, no htmx event): pushed all the same.
    explorer.locator("input[name=classroom][type=checkbox]").check()
    for s in students:
        wait_framed(s, "u.searchParams.get('classroom') === '1' && u.searchParams.get('text') === 'the cat sat'")

    # A lesson.
    explorer.goto(live_server + "/lessons/causal")
    for s in students:
        wait_framed(s, "u.pathname === '/lessons/causal'")
        assert still_pinned(s)

    # One student explores alone; the other still follows; following again goes to the teacher's view.
    by_link.get_by_role("button", name="Explore on my own", exact=True).click()
    assert "Exploring on your own" in by_link.locator("#class-mode").text_content()
    explorer.goto(live_server + "/lessons/positions")
    wait_framed(by_code, "u.pathname === '/lessons/positions'")
    by_link.wait_for_timeout(500)
    assert by_link.evaluate(FRAMED).startswith("/lessons/causal")
    by_link.get_by_role("button", name="Follow the teacher", exact=True).click()
    wait_framed(by_link, "u.pathname === '/lessons/positions'")
    assert by_link.locator("#class-announce").text_content() == "Following the teacher"
    assert by_link.locator("#class-announce").get_attribute("aria-live") == "polite"
    assert "Following the teacher" in by_link.locator("#class-mode").text_content()

    # A poll: asked on /class, answered by both (one changes their mind), counted live, revealed.
    teacher.bring_to_front()
    teacher.get_by_role("button", name="Which token comes next?").click()
    teacher.locator("#poll-options").fill("sat\n<b>mat</b>")
    teacher.get_by_role("button", name="Ask", exact=True).click()
    for s in students:
        s.wait_for_selector("#student-poll:not([hidden])")
        assert s.locator("#student-poll-question").text_content() == "Which token comes next?"
        s.wait_for_function("() => document.getElementById('class-announce').textContent.startsWith('New poll')")
    by_link.get_by_role("button", name="sat", exact=True).click()
    by_code.get_by_role("button", name="<b>mat</b>", exact=True).click()  # the option's text is its name
    by_code.wait_for_function("() => /<b>mat<\\/b>/.test(document.getElementById('student-poll-status').textContent)")
    by_code.get_by_role("button", name="sat", exact=True).click()  # replaces the first answer
    by_code.wait_for_function("() => /: sat$/.test(document.getElementById('student-poll-status').textContent)")
    teacher.wait_for_function(
        "() => document.querySelector('.poll-count[data-option=\"sat\"]')?.textContent === '2'"
        " && document.querySelector('.poll-count[data-option=\"<b>mat</b>\"]')?.textContent === '0'"
    )
    # "Which token comes next?" as it was: the server reveals the model's prediction on the class's page (here
    # /lessons/positions: the explorer's default model and its text), not a pick of the teacher's.
    assert teacher.locator("#poll-answer").is_hidden() and teacher.locator("#poll-computed").is_visible()
    models = {m["name"]: m for m in httpx.get(live_server + "/api/v1/models").json()["models"]}
    teacher.get_by_role("button", name="Reveal", exact=True).click()
    for s in students:
        s.wait_for_function(
            "() => /^The answer: .+ The model .+ predicts “.*” with probability 0\\.\\d{3}\\.$/.test("
            "document.getElementById('student-poll-status').textContent)"
        )
        assert s.locator("#student-poll-results li").count() == 2
    status = students[0].locator("#student-poll-status").text_content()
    name = status.split(" The model ")[1].split(" predicts ")[0]
    text = models[name]["default_text"]
    top = httpx.post(live_server + "/api/v1/run", json={"model": name, "text": text, "top_k": 1}).json()["top_k"][0]
    assert f"predicts “{top['token']}” with probability {top['prob']:.3f}" in status, (status, top)
    assert "The model" in teacher.locator("#class-status").text_content()
    for s in students:
        assert s.get_by_role("button", name="sat", exact=True).is_disabled()
        assert still_pinned(s)

    # The end.
    teacher.get_by_role("button", name="End class", exact=True).click()
    teacher.wait_for_selector("#start-class")
    for s in students:
        s.wait_for_selector("#class-ended:not([hidden])")
        assert "ended" in s.locator("#class-ended").text_content()
    explorer.reload()
    assert explorer.locator("#presenting-bar").count() == 0
    for tab in (teacher, explorer, *students):
        assert tab.watch.page_errors == [], tab.watch.page_errors


def test_a_class_in_malay(people, live_server):
    teacher, student = people(2)
    code = start_class(teacher, live_server, "ms")
    assert teacher.get_by_role("button", name="Tamatkan kelas").is_visible()
    student.goto(f"{live_server}/class/{code}?lang=ms")
    wait_framed(student, "u.searchParams.get('lang') === 'ms'")
    pin(student)
    assert student.get_by_role("button", name="Teroka sendiri", exact=True).is_visible()
    assert student.get_by_role("button", name="Ikut guru", exact=True).is_visible()
    explorer = teacher.context.new_page()
    explorer.goto(live_server + "/lessons/attention?lang=ms")
    assert "Membentang" in explorer.locator("#presenting-bar").text_content()
    wait_framed(student, "u.pathname === '/lessons/attention' && u.searchParams.get('lang') === 'ms'")
    assert still_pinned(student)
    teacher.bring_to_front()
    teacher.get_by_role("button", name="Kepala manakah kepala induksi?").click()
    assert teacher.locator("#poll-options").input_value().startswith("L0H0\nL0H1")
    teacher.get_by_role("button", name="Tanya", exact=True).click()
    student.wait_for_function("() => document.getElementById('class-announce').textContent.startsWith('Undian baharu')")
    student.get_by_role("button", name="L1H1", exact=True).click()
    student.wait_for_function(
        "() => document.getElementById('student-poll-status').textContent === 'Jawapan anda: L1H1'"
    )
    teacher.wait_for_function("() => document.querySelector('.poll-count[data-option=\"L1H1\"]')?.textContent === '1'")
    # The server reveals the head with the highest induction score, in Malay on the student's page.
    teacher.get_by_role("button", name="Dedahkan", exact=True).click()
    student.wait_for_function(
        "() => /^Jawapannya: L\\dH\\d Dalam model .+, L\\dH\\d mempunyai skor induksi tertinggi, [\\d.]+\\.$/"
        ".test(document.getElementById('student-poll-status').textContent)"
    )


@pytest.mark.parametrize("lang", ["en", "ms"])
def test_a_student_the_full_class_refuses_is_told_so_once(people, two_workers, lang):
    """A class at its cap (two here): a third student's page says the class is full, in the page's language,
    in an alert, and stops asking (no retries in a loop)."""
    teacher, *students = people(MAX_STUDENTS + 2, bypass_csp=True)
    code = start_class(teacher, two_workers, lang)
    *admitted, late = students
    for s in admitted:
        s.goto(f"{two_workers}/class/{code}?lang={lang}")
        wait_framed(s, "u.pathname === '/'")
    teacher.wait_for_function(f"() => /^{MAX_STUDENTS}\\b/.test(document.getElementById('student-count').textContent)")
    asked = []
    late.on("request", lambda r: asked.append(r.url) if r.url.endswith("/events") else None)
    late.goto(f"{two_workers}/class/{code}?lang={lang}")
    notice = late.locator("#class-ended")
    notice.wait_for(state="visible")
    said = {"en": "This class is full", "ms": "Kelas ini sudah penuh"}[lang]
    assert notice.text_content().startswith(said) and notice.get_attribute("role") == "alert"
    assert late.locator("#class-view").is_hidden() and late.locator("#class-banner").is_hidden()
    tries = len(asked)
    late.wait_for_timeout(3000)
    assert len(asked) == tries <= 3, asked  # the stream, the probe that read its 403; then nothing
    for s in admitted:
        assert s.locator("#class-ended").is_hidden()  # those already in stay in
    late.set_viewport_size(PHONE)  # on a phone: axe-clean, nothing wider than the screen
    assert axe(late) == []
    sizes = late.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], sizes
    assert late.watch.page_errors == []


def axe(tab) -> list:
    tab.add_script_tag(path=str(AXE))
    return tab.evaluate(RUN_AXE, WCAG_TAGS)


@pytest.mark.parametrize("width", [PHONE["width"], 1200])
def test_the_class_pages_pass_axe_and_fit_a_phone(people, live_server, width):
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run make setup (npm ci installs axe-core)")
    teacher, student = people(2, bypass_csp=True)
    for tab in (teacher, student):
        tab.set_viewport_size({"width": width, "height": PHONE["height"]})
    teacher.goto(live_server + "/class")
    assert axe(teacher) == []
    code = start_class(teacher, live_server)
    teacher.locator("#poll-question").fill("Which?")
    teacher.locator("#poll-options").fill("a\nb")
    teacher.get_by_role("button", name="Ask", exact=True).click()
    teacher.wait_for_selector("#poll-live:not([hidden]) .poll-count")
    student.goto(f"{live_server}/class/{code}")
    student.wait_for_selector("#student-poll:not([hidden]) button")
    wait_framed(student, "u.pathname === '/'")
    for tab in (teacher, student):
        violations = axe(tab)
        assert violations == [], "\n".join(f"{v['id']}: {v['help']} at {v['nodes']}" for v in violations)
        sizes = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
        assert sizes[0] <= sizes[1], f"{tab.url} is {sizes[0]} px wide in a {sizes[1]} px window"
    # From the keyboard: the student's buttons are reached with Tab and pressed with Enter.
    student.locator("#explore-own").focus()
    student.keyboard.press("Enter")
    assert student.locator("#explore-own").get_attribute("aria-pressed") == "true"
    student.keyboard.press("Tab")
    student.keyboard.press("Enter")
    assert student.locator("#follow-teacher").get_attribute("aria-pressed") == "true"


def test_a_class_over_two_replicas_in_redis_follows_on_when_one_is_killed(people):
    """The Redis mode: two replicas behind Caddy (deploy/Caddyfile), a teacher and three students in
    Chromium. A replica is killed under the class; the teacher's next page reaches every student's frame
    within 5 s, their pages never reloaded, and a poll still goes round."""
    import time

    from tests.scale.services import caddy, redis_server, replica

    with (
        redis_server() as server,
        replica(server.url) as a,
        replica(server.url) as b,
        caddy([a.hostport, b.hostport]) as proxy,
    ):
        teacher, *students = people(4)
        code = start_class(teacher, proxy.url)
        for s in students:
            s.goto(f"{proxy.url}/class/{code}")
            wait_framed(s, "u.pathname === '/'")
            pin(s)
        explorer = teacher.context.new_page()
        explorer.watch = PageWatch(explorer)
        explorer.goto(proxy.url + "/lessons/attention")
        for s in students:
            wait_framed(s, "u.pathname === '/lessons/attention'")
        a.kill()  # a replica's machine lost, under the class
        killed = time.monotonic()
        explorer.goto(proxy.url + "/lessons/causal")
        for s in students:
            wait_framed(s, "u.pathname === '/lessons/causal'")
        back = time.monotonic() - killed
        assert back < 5.0, back  # the promise: every follower back within 5 s
        for s in students:
            assert still_pinned(s)
        teacher.bring_to_front()
        teacher.locator("#poll-question").fill("After the kill?")
        teacher.locator("#poll-options").fill("yes\nno")
        teacher.get_by_role("button", name="Ask", exact=True).click()
        for s in students:
            s.get_by_role("button", name="yes", exact=True).click()
        teacher.wait_for_function(
            "() => document.querySelector('.poll-count[data-option=\"yes\"]')?.textContent === '3'"
        )
        assert b.proc.poll() is None
