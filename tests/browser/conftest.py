"""Browser tests: a real uvicorn server in a subprocess, driven by Debian's headless Chromium.

The server is scripts/liveserver.py's (the one the security tests, fuzz and soak runs start): a
separate uvicorn process on a free 127.0.0.1 port. The browser is the system's `chromium`
(Playwright's own browser downloads are never used, so the tests need no network). Without
/usr/bin/chromium the tests skip locally, but fail when EXPLORER_REQUIRE_BROWSER=1 (set by .ci/run),
so CI cannot silently skip them.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_TIMEOUT_S = 30


def require_chromium() -> None:
    """Skip without /usr/bin/chromium, or fail where EXPLORER_REQUIRE_BROWSER=1 (CI): every fixture that opens
    Chromium calls this first."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("EXPLORER_REQUIRE_BROWSER") == "1":
            pytest.fail(message + " and EXPLORER_REQUIRE_BROWSER=1")
        pytest.skip(message)


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """Base URL of a real uvicorn server running the app in its own process."""
    # Its own runs folder: the runs other tests queue cannot keep its training waiting.
    with (
        tempfile.TemporaryDirectory(prefix="explorer-browser-runs-") as runs,
        liveserver.live_server(
            env={"EXPLORER_ACCESS_LOG": "false", "EXPLORER_RUNS_DIR": runs}, startup_timeout_s=SERVER_START_TIMEOUT_S
        ) as server,
    ):
        yield server.url


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's Chromium, headless, with a fresh profile and no background network traffic.

    Module-scoped: Playwright's sync API keeps an asyncio loop marked as running on this thread
    while it is open, which would break any later test in the session that calls asyncio.run()."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="explorer-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


class PageWatch:
    """Everything a page did that a test may want to check: requests, console errors, page errors."""

    def __init__(self, page) -> None:
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))


@pytest.fixture
def page(browser, live_server):
    """A fresh tab on the live server; `page.watch` records its requests and errors."""
    page = browser.new_page()
    page.watch = PageWatch(page)
    page.set_default_timeout(15_000)
    try:
        yield page
    finally:
        page.close()
