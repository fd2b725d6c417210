"""Start the app as a real uvicorn subprocess on a free loopback port, for the security and browser
tests, scripts/fuzz.py, scripts/soak.py and the benchmarks (bench/). A real process (not TestClient) so
that concurrency, the event loop, RSS and the process's sockets are the ones a user meets.

    with live_server(env={"EXPLORER_MAX_CONCURRENT_COMPUTE": "2"}) as server:
        httpx.get(server.url + "/healthz")
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # scripts/ run as files: make the app importable for its constants
from app.http.bodylimit import HTTP_PROTOCOL  # noqa: E402

# A folder holding only sitecustomize.py; on PYTHONPATH it makes the server refuse (and report)
# every connection that does not go to a loopback address.
NO_OUTBOUND_DIR = Path(__file__).resolve().parent / "no_outbound"
BLOCKED_MARK = "OUTBOUND-BLOCKED"  # what the guard prints on stderr for each refused attempt
GUARD_MARK = "outbound guard active"


@dataclass
class LiveServer:
    url: str
    pid: int
    log_path: Path
    returncode: int | None = None  # after the with-block: how the server exited on SIGTERM (None: killed)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(
    env: dict[str, str] | None = None,
    *,
    no_outbound: bool = False,
    entry_point: bool = False,
    startup_timeout_s: float = 60.0,
    python: str | os.PathLike | None = None,
) -> Iterator[LiveServer]:
    """entry_point=True runs `python -m app` (the image's command: host, port, workers and log level
    from EXPLORER_* settings) instead of the uvicorn command line; `env` may also set PYTHONPATH.
    python: the interpreter to run the app with (default this one; the benchmarks, which run in a
    venv with torch, pass the app's own .venv's)."""
    port = free_port()
    child_env = {**os.environ, **(env or {})}
    python = str(python or sys.executable)
    # The same HTTP protocol as `python -m app` (app/__main__.py): it answers an over-long URL with a JSON 414.
    cmd = [
        python,
        "-m",
        "uvicorn",
        "app.main:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--http",
        HTTP_PROTOCOL,
    ]
    if entry_point:
        cmd = [python, "-m", "app"]
        child_env |= {"EXPLORER_HOST": "127.0.0.1", "EXPLORER_PORT": str(port)}
    if no_outbound:
        # asyncio's loop connects through Python's socket module, where the guard sits (uvloop
        # would connect from C); the server is otherwise the same.
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NO_OUTBOUND_DIR), child_env.get("PYTHONPATH")]))
        cmd += ["--loop", "asyncio"]
    log = tempfile.NamedTemporaryFile(prefix="explorer-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(url=f"http://127.0.0.1:{port}", pid=proc.pid, log_path=Path(log.name))
    try:
        _wait_ready(server, proc, startup_timeout_s)
        yield server
    finally:
        proc.terminate()
        try:
            server.returncode = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        server.log_path.unlink(missing_ok=True)  # read the log inside the with-block


def _wait_ready(server: LiveServer, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not ready after {timeout_s} s:\n{server.log()}")
