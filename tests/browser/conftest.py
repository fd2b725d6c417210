"""Browser tests: a real uvicorn server in a subprocess, driven by Debian's headless Chromium.

The server runs exactly as `make serve` runs it (a separate process on a free 127.0.0.1 port);
the browser is the system's `chromium` (Playwright's own browser downloads are never used, so the
tests need no network). Without /usr/bin/chromium the tests skip locally, but fail when
EXPLORER_REQUIRE_BROWSER=1 (set by .ci/run), so CI cannot silently skip them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SERVER_START_TIMEOUT_S = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server did not answer /healthz within {SERVER_START_TIMEOUT_S}s:\n"
                       f"{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def live_server(tmp_path_factory) -> Iterator[str]:
    """Base URL of a real uvicorn server running the app in its own process."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "EXPLORER_ACCESS_LOG": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's Chromium, headless, with a fresh profile and no background network traffic.

    Module-scoped: Playwright's sync API keeps an asyncio loop marked as running on this thread
    while it is open, which would break any later test in the session that calls asyncio.run()."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("EXPLORER_REQUIRE_BROWSER") == "1":
            pytest.fail(message + " and EXPLORER_REQUIRE_BROWSER=1")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="explorer-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
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
