"""The real parts of the Redis mode, started on free 127.0.0.1 ports and stopped however a test ends:
Debian's `redis-server`, Celery workers (`python -m app.worker`, each in its own process group, as a
machine of its own), app replicas (scripts/liveserver.py) and Debian's `caddy` with deploy/Caddyfile.
The tests (tests/scale/, tests/api/test_runs_store.py, tests/api/test_training.py) and bench/scale.py
use them.

Without redis-server or caddy the tests skip with the reason; with EXPLORER_REQUIRE_SERVICES=1 (set by
.ci/run, which installs both) they fail instead, so CI cannot skip them silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package)

CADDYFILE = REPO / "deploy" / "Caddyfile"
START_TIMEOUT_S = 60
PYTHON = sys.executable


def need(binary: str) -> str:
    """The binary's path; else skip (fail with EXPLORER_REQUIRE_SERVICES=1) saying how to install it."""
    path = shutil.which(binary) or (f"/usr/bin/{binary}" if Path(f"/usr/bin/{binary}").exists() else None)
    if path is None:
        message = f"{binary} is missing (apt-get install {'redis-server' if binary == 'redis-server' else binary})"
        if os.environ.get("EXPLORER_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " and EXPLORER_REQUIRE_SERVICES=1")
        pytest.skip(message)
    return path


def free_port() -> int:
    return liveserver.free_port()


def wait_until(check, timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(every_s)


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the process's whole group, then SIGKILL to what is left."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its children, if any outlived it
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# ------------------------------------------------------------------ Redis


def make_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A certificate authority of the test's own and a server certificate it signed for 127.0.0.1 (openssl):
    (ca.pem, server.pem, server.key). No system authority knows the CA, so only a client given it connects."""
    openssl = need("openssl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Explorer test CA")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    run(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
    )  # fmt: skip
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@dataclass
class RedisServer:
    """redis-server with append-only persistence in a folder of its own (restartable on the same port); with
    `tls`, it speaks only TLS (Debian's redis-server 7 has --tls-port) with a certificate from make_tls_files."""

    port: int
    folder: Path
    password: str | None = None
    proc: subprocess.Popen | None = None
    tls: bool = False

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{':' + self.password + '@' if self.password else ''}127.0.0.1:{self.port}/0"

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, **({"ssl_ca_certs": str(self.ca)} if self.tls else {}))

    def start(self) -> RedisServer:
        if self.tls:
            if not self.ca.exists():
                make_tls_files(self.folder)
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            listen += [
                "--tls-cert-file",
                str(self.folder / "server.pem"),
                "--tls-key-file",
                str(self.folder / "server.key"),
            ]
            listen += ["--tls-ca-cert-file", str(self.ca)]
        else:
            listen = ["--port", str(self.port)]
        args = [
            need("redis-server"),
            *listen,
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        log = open(self.folder / "redis.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_until(self._answers, 10, "redis-server answering")
        return self

    def _answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            if self.proc.poll() is not None:
                raise RuntimeError((self.folder / "redis.log").read_text()[-2000:]) from None
            return False

    def kill(self) -> None:
        """SIGKILL: what a lost machine does (the append-only file keeps what reached it)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM: Redis writes what it has and exits."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def redis_server(password: str | None = None, tls: bool = False) -> Iterator[RedisServer]:
    need("redis-server")
    with tempfile.TemporaryDirectory(prefix="explorer-redis-") as folder:
        server = RedisServer(free_port(), Path(folder), password, tls=tls)
        try:
            yield server.start()
        finally:
            server.stop()


# ------------------------------------------------------------------ Celery workers


@dataclass
class Worker:
    """`python -m app.worker` in a process group of its own: a machine, as far as the run can tell."""

    proc: subprocess.Popen
    log_path: Path
    node: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pids(self) -> set[int]:
        """Every process of its group: the main process and its training processes."""
        out = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.proc.pid:
                        out.add(int(entry.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return out

    def kill_machine(self) -> None:
        """SIGKILL to the whole group at once: a worker machine lost."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def worker_env(redis_url: str, **settings) -> dict[str, str]:
    env = {"EXPLORER_REDIS_URL": redis_url, "EXPLORER_TRAIN_WORKERS": "1", "EXPLORER_LOG_LEVEL": "info"}
    return env | {f"EXPLORER_{k.upper()}": str(v) for k, v in settings.items()}


@contextlib.contextmanager
def worker(
    redis_url: str, *, cwd: Path = REPO, pythonpath: str | None = None, wait: bool = True, **settings
) -> Iterator[Worker]:
    """A worker with these settings (EXPLORER_<NAME>=value), ready (registered in Redis) when yielded."""
    env = {**os.environ, **worker_env(redis_url, **settings)}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    log = tempfile.NamedTemporaryFile(prefix="explorer-worker-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [PYTHON, "-m", "app.worker"], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    w = Worker(proc, Path(log.name), f"explorer-{proc.pid}@{os.uname().nodename}")
    try:
        if wait:
            ca = settings.get("redis_ca")  # over TLS, the test's own certificate authority
            r = redis.Redis.from_url(redis_url, **({"ssl_ca_certs": str(ca)} if ca else {}))

            def ready() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited {proc.returncode}:\n{w.log()[-3000:]}")
                return bool(r.hexists("explorer:workers", w.node))

            wait_until(ready, START_TIMEOUT_S, f"worker {w.node} ready", every_s=0.1)
        yield w
    finally:
        stop_group(proc)
        log.close()
        w.log_path.unlink(missing_ok=True)


# ------------------------------------------------------------------ app replicas and Caddy


@dataclass
class Replica:
    """An app server process (uvicorn, as scripts/liveserver.py starts it) on the Redis store."""

    url: str
    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the replica's machine lost."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@contextlib.contextmanager
def replica(redis_url: str, *, port: int | None = None, **settings) -> Iterator[Replica]:
    """A replica with these settings (EXPLORER_<NAME>=value), answering /healthz when yielded."""
    port = port or free_port()
    env = {**os.environ, "EXPLORER_REDIS_URL": redis_url, "EXPLORER_ACCESS_LOG": "false"}
    env |= {f"EXPLORER_{k.upper()}": str(v) for k, v in settings.items()}
    log = tempfile.NamedTemporaryFile(prefix="explorer-replica-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [
            PYTHON,
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
            liveserver.HTTP_PROTOCOL,
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    r = Replica(f"http://127.0.0.1:{port}", proc, Path(log.name))
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the replica exited {proc.returncode}:\n{r.log()[-3000:]}")
            try:
                return httpx.get(r.url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, START_TIMEOUT_S, "replica answering", every_s=0.1)
        yield r
    finally:
        stop_group(proc, grace_s=15)
        log.close()
        r.log_path.unlink(missing_ok=True)


@dataclass
class Caddy:
    url: str
    proc: subprocess.Popen
    log_path: Path
    upstreams: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def caddy(upstreams: list[str], **env) -> Iterator[Caddy]:
    """Debian's caddy running the repository's deploy/Caddyfile, in front of these host:port upstreams."""
    binary = need("caddy")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="explorer-caddy-") as home:
        environ = {
            **os.environ,
            "HOME": home,
            "XDG_DATA_HOME": home,
            "XDG_CONFIG_HOME": home,
            "PROXY_PORT": str(port),
            "PROXY_BIND": "127.0.0.1",
            "PROXY_UPSTREAMS": " ".join(upstreams),
            "PROXY_HEALTH_INTERVAL": "1s",
            **env,
        }
        log_path = Path(home) / "caddy.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [binary, "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        c = Caddy(f"http://127.0.0.1:{port}", proc, log_path, upstreams)
        try:

            def up() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"caddy exited {proc.returncode}:\n{c.log()[-3000:]}")
                try:
                    return httpx.get(c.url + "/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, 30, "caddy answering", every_s=0.1)
            yield c
        finally:
            stop_group(proc, grace_s=5)


# ------------------------------------------------------------------ following a run


def parse_events(lines):
    """Server-Sent Events from a stream's lines: {"id", "event", "data"} each."""
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if "event" in event:
                yield event
            event = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            event[key] = value


class Follower:
    """A client following a run's events in a thread, reconnecting with Last-Event-ID as EventSource does,
    until the `end` event: `events` is everything it was sent, `connections` how many streams it opened."""

    def __init__(self, base_url: str, id: str, timeout_s: float = 120):
        import threading

        self.url = f"{base_url}/api/v1/runs/{id}/events"
        self.events: list[dict] = []
        self.connections = 0
        self.done = threading.Event()
        self.deadline = time.monotonic() + timeout_s
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        last = None
        with httpx.Client(timeout=httpx.Timeout(30, read=30)) as client:
            while time.monotonic() < self.deadline:
                headers = {"Last-Event-ID": last} if last else {}
                try:
                    self.connections += 1
                    with client.stream("GET", self.url, headers=headers) as stream:
                        for event in parse_events(stream.iter_lines()):
                            self.events.append(event)
                            last = event.get("id", last)
                            if event["event"] == "end":
                                self.done.set()
                                return
                except httpx.HTTPError:
                    time.sleep(0.2)

    def wait(self, timeout_s: float = 120) -> list[dict]:
        assert self.done.wait(timeout_s), f"no end event; got {[e['event'] for e in self.events][-10:]}"
        return self.events
