"""The container smoke test (`make image-test`): build the image and run it the way
docker-compose.yml runs it, then check it from outside as a user would.

    python scripts/image_test.py                 # build with the engine found, then check
    python scripts/image_test.py --no-build      # check the image already built
    python scripts/image_test.py --engine docker # choose: docker or podman
    python scripts/image_test.py --no-scale      # without bringing up compose.scale.yml

The engine is podman if it is installed (../shared/tools/local-docker.sh installs it where Docker
Hub is unreachable; through podman's Docker API some settings are lost), else docker if `docker
info` answers. The container gets compose's settings, read from docker-compose.yml (one place):
its environment, read-only root, tmpfs, init, stop grace period, and its volumes, with the models
folder replaced by a copy of the test checkpoint tests/fixtures/gpt2-tiny. Its port is published on
a free loopback port, so a server on 8000 does not get in the way.

Checks: /healthz, /readyz, /, /docs, /api/v1/models (the mounted checkpoint listed, and weights
shipped in the image) and a POST /api/v1/run of every listed model; the server runs as a non-root
uid with a gid that /etc/group names; the root filesystem and the models folder are read-only; the
image's HEALTHCHECK passes; SIGTERM ends it with exit code 0 within the grace period; it starts
again after that stop (as `docker compose restart` does) and serves. The training check's place is
TRAINING below. Then the whole-school stack, compose.scale.yml as it is (SCALE below; --no-scale skips it).
Prints one line per check and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FIXTURE_CHECKPOINT = REPO / "tests" / "fixtures" / "gpt2-tiny"  # 80 KB: config, safetensors, tokenizer
MODELS_SOURCE = "./models"  # compose's host folder for checkpoints; replaced by the fixture here
START_TIMEOUT_S = 90  # container start to /healthz: two workers import numpy and the app
REQUEST_TIMEOUT_S = 60  # one HTTP request (a model's first run loads its weights)


class CheckFailed(Exception):
    pass


# ------------------------------------------------------------------ the engine


def pick_engine(wanted: str | None) -> str:
    if wanted:
        if not shutil.which(wanted):
            sys.exit(f"image-test: {wanted} is not installed")
        return wanted
    if shutil.which("podman"):
        return "podman"
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    sys.exit(
        "image-test: no container engine. Install Docker, or podman with the base images "
        "(../shared/tools/local-docker.sh -f Dockerfile where Docker Hub is unreachable)."
    )


@dataclass
class Engine:
    name: str  # docker or podman

    def run(self, *args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run([self.name, *args], capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise CheckFailed(
                f"{self.name} {' '.join(args[:3])} ...: exit {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()[-800:]}"
            )
        return result

    def inspect(self, kind: str, name: str) -> dict:
        return json.loads(self.run(kind, "inspect", name).stdout)[0]


# ------------------------------------------------------------------ compose's settings


def seconds(duration: str) -> float:
    """A Compose duration of whole units: 15s, 2m, 1m30s."""
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    for ch in str(duration):
        if ch.isdigit() or ch == ".":
            number += ch
        else:
            total, number = total + float(number) * units[ch], ""
    return total + (float(number) if number else 0)


@dataclass
class Service:
    """What docker-compose.yml says about the explorer service, as `run` options."""

    image: str
    context: Path
    dockerfile: str
    container_port: str
    grace_s: float
    options: list[str] = field(default_factory=list)  # environment, read-only, tmpfs, init
    volumes: list[tuple[str, str, str]] = field(default_factory=list)  # (source, target, mode)


# The service's keys this test applies to its container, and those it leaves out (and why). A key in
# neither stops the test: a new compose setting must be run here too, or said why not.
APPLIED_KEYS = {"build", "image", "ports", "environment", "read_only", "tmpfs", "init", "stop_grace_period", "volumes"}
LEFT_OUT_KEYS = {"restart": "the test stops and starts the container itself"}


def read_compose(path: Path) -> Service:
    service = yaml.safe_load(path.read_text())["services"]["explorer"]
    unknown = set(service) - APPLIED_KEYS - set(LEFT_OUT_KEYS)
    if unknown:
        raise ValueError(f"{path.name}: image_test.py does not apply {sorted(unknown)}: add it to read_compose")
    build = service["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    [port] = service["ports"]
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    options = [f"--env={k}={v}" for k, v in env.items()]
    if service.get("read_only"):
        options.append("--read-only")
    tmpfs = service.get("tmpfs", [])
    options += [f"--tmpfs={t}" for t in ([tmpfs] if isinstance(tmpfs, str) else tmpfs)]
    if service.get("init"):
        options.append("--init")
    volumes = []
    for v in service.get("volumes", []):
        source, target, *mode = v.split(":")
        volumes.append((source, target, mode[0] if mode else "rw"))
    return Service(
        image=service["image"],
        context=(path.parent / context).resolve(),
        dockerfile=dockerfile,
        container_port=str(port).split(":")[-1].split("/")[0],
        grace_s=seconds(service.get("stop_grace_period", "10s")),
        options=options,
        volumes=volumes,
    )


# ------------------------------------------------------------------ HTTP from the host


def http(url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(url: str, path: str, body: dict | None = None, status: int = 200) -> dict:
    code, raw = http(url + path, body)
    if code != status:
        raise CheckFailed(f"{'POST' if body else 'GET'} {path}: {code} (expected {status}): {raw[:300]!r}")
    return json.loads(raw)


# ------------------------------------------------------------------ the run


class Smoke:
    def __init__(self, engine: Engine, service: Service, models_dir: Path):
        self.engine, self.service, self.models_dir = engine, service, models_dir
        self.container = f"explorer-image-test-{int(time.time())}"
        self.named_volumes: list[str] = []
        self.url = ""
        self.failures: list[str] = []
        self.passed = 0

    def check(self, name: str, fn) -> None:
        t0 = time.monotonic()
        try:
            detail = fn()
        except (CheckFailed, AssertionError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
            self.failures.append(name)
            print(f"FAIL  {name}: {e}", flush=True)
            return
        self.passed += 1
        print(f"ok    {name} ({time.monotonic() - t0:.1f} s){': ' + detail if detail else ''}", flush=True)

    # --- start and stop

    def mounts(self) -> list[str]:
        args = []
        for source, target, mode in self.service.volumes:
            if source == MODELS_SOURCE:
                source = str(self.models_dir)
            elif source.startswith((".", "/")):
                raise CheckFailed(f"compose mounts {source}: teach image_test.py what to put there")
            else:  # a named volume: a fresh one for this test, removed at the end
                source = f"{self.container}-{source}"
                self.engine.run("volume", "create", source)
                self.named_volumes.append(source)
            args.append(f"--volume={source}:{target}:{mode}")
        return args

    def start(self) -> str:
        s = self.service
        self.engine.run(
            "run",
            "--detach",
            f"--name={self.container}",
            *s.options,
            *self.mounts(),
            f"--publish=127.0.0.1::{s.container_port}",
            f"--stop-timeout={int(s.grace_s)}",
            s.image,
        )
        return self.wait_until_serving()

    def wait_until_serving(self) -> str:
        t0 = time.monotonic()
        port = self.engine.run("port", self.container, f"{self.service.container_port}/tcp").stdout.split()[0]
        self.url = "http://" + port.replace("0.0.0.0", "127.0.0.1")
        while time.monotonic() - t0 < START_TIMEOUT_S:
            state = self.engine.inspect("container", self.container)["State"]
            if not state["Running"]:
                raise CheckFailed(f"the container stopped (exit {state['ExitCode']}):\n{self.logs()}")
            try:
                if http(self.url + "/healthz")[0] == 200:
                    return f"{self.url} after {time.monotonic() - t0:.1f} s"
            except OSError:
                pass
            time.sleep(0.5)
        raise CheckFailed(f"/healthz did not answer within {START_TIMEOUT_S} s:\n{self.logs()}")

    def logs(self) -> str:
        r = self.engine.run("logs", "--tail=40", self.container, check=False)
        return (r.stdout + r.stderr)[-4000:]

    def remove(self) -> None:
        self.engine.run("rm", "--force", self.container, check=False)
        for v in self.named_volumes:
            self.engine.run("volume", "rm", "--force", v, check=False)

    # --- the checks

    def endpoints(self) -> str:
        assert get_json(self.url, "/healthz")["status"] == "ok"
        ready = get_json(self.url, "/readyz")  # 503 with reasons if the assets or /models are unusable
        assert ready["status"] == "ready", ready
        for path, mark in [("/", b"htmx"), ("/docs", b"swagger"), ("/openapi.json", b'"openapi"')]:
            code, raw = http(self.url + path)
            assert code == 200, f"GET {path}: {code}"
            assert mark in raw.lower(), f"GET {path}: no {mark!r} in the page"
        _, page = http(self.url + "/")  # the trained induction model ships in the image and opens the explorer
        assert b'<option value="induction" selected' in page, "the explorer does not open on the induction model"
        return "/healthz /readyz / (on the induction model) /docs /openapi.json"

    def models(self) -> str:
        models = get_json(self.url, "/api/v1/models")["models"]
        names = {m["name"]: m for m in models}
        mounted = {p.name for p in self.models_dir.iterdir() if p.is_dir()}
        assert mounted <= names.keys(), f"{sorted(mounted - names.keys())} in /models but not listed"
        broken = {m["name"]: m["error"] for m in models if not m["runnable"]}
        assert not broken, f"not runnable: {broken}"
        shipped = [n for n, m in names.items() if m["kind"] == "pretrained" and n not in mounted]
        assert shipped, "no pretrained weights inside the image (MiniLM's package)"
        assert any(m["kind"] == "toy" for m in models), "no toy model"
        ran = []
        for m in models:
            run = get_json(self.url, "/api/v1/run", {"model": m["name"], "text": m["default_text"], "top_k": 3})
            assert run["tokens"], f"{m['name']}: no tokens"
            if m["is_encoder"]:
                assert run["top_k"] == [], f"{m['name']}: an encoder predicts no next token"
            else:
                probs = [t["prob"] for t in run["top_k"]]
                assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6, (
                    f"{m['name']}: top_k {run['top_k']}"
                )
            ran.append(f"{m['name']} ({len(run['tokens'])} tokens)")
        return f"ran {', '.join(ran)}; from /models: {', '.join(sorted(mounted))}"

    def user(self) -> str:
        # The server process itself (not a shell started by exec): its real and effective ids.
        code = (
            "import grp, os, pwd\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
            "    if cmd[:3] == [b'python', b'-m', b'app']:\n"
            "        st = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status'))\n"
            "        uid, gid = int(st['Uid'].split()[1]), int(st['Gid'].split()[1])\n"
            "        user = pwd.getpwuid(uid)\n"
            "        print(uid, gid, user.pw_name, grp.getgrgid(gid).gr_name, user.pw_gid)\n"
            "        break\n"
        )
        out = self.engine.run("exec", self.container, "python", "-c", code).stdout.split()
        assert len(out) == 5, f"no `python -m app` process found, or its ids have no names: {out}"
        uid, gid, user, group, primary_gid = out
        assert uid != "0" and gid != "0", f"runs as uid {uid} gid {gid}"
        # podman adds /etc/group lines named by the number for ids the image lacks: gid=10001(10001).
        assert not group.isdigit(), f"gid {gid} has no name in the image's /etc/group"
        assert primary_gid == gid, f"runs with gid {gid}, but user {user}'s group is {primary_gid}"
        return f"python -m app runs as uid {uid}({user}) gid {gid}({group})"

    def read_only(self) -> str:
        target = next(t for s, t, _ in self.service.volumes if s == MODELS_SOURCE)
        for path in ("/srv/probe", f"{target}/probe"):
            r = self.engine.run("exec", self.container, "touch", path, check=False)
            assert r.returncode != 0, f"{path} is writable"
        self.engine.run("exec", self.container, "sh", "-c", "touch /tmp/probe && rm /tmp/probe")
        return f"/ and {target} refuse writes; /tmp takes them"

    def healthcheck(self) -> str:
        image = self.engine.inspect("image", self.service.image)
        hc = image["Config"].get("Healthcheck") or image.get("Healthcheck")  # docker | podman
        assert hc and hc.get("Test"), (
            "the image has no HEALTHCHECK (podman: build --format docker; the docker "
            "CLI on podman's API does not see it: use --engine podman)"
        )
        # The check must be able to fail: its command, pointed at a port nothing listens on.
        kind, *command = hc["Test"]
        probe = ["sh", "-c", command[0]] if kind == "CMD-SHELL" else command
        r = self.engine.run("exec", "--env=EXPLORER_PORT=1", self.container, *probe, check=False)
        assert r.returncode != 0, "the health check passes with nothing listening"
        if self.engine.name == "podman":
            # podman without systemd schedules no checks; `healthcheck run` runs the image's one now.
            r = self.engine.run("healthcheck", "run", self.container, check=False)
            assert r.returncode == 0, f"podman healthcheck run: exit {r.returncode} {r.stdout}{r.stderr}"
            return "podman healthcheck run: healthy (and its command fails on a closed port)"
        limit = sum(hc.get(k, 0) for k in ("StartPeriod", "Interval", "Timeout")) / 1e9 + 10
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            health = self.engine.inspect("container", self.container)["State"].get("Health", {})
            if health.get("Status") == "healthy":
                took = time.monotonic() - t0
                return f"docker inspect: healthy after {took:.0f} s (its command fails on a closed port)"
            time.sleep(1)
        raise CheckFailed(f"not healthy within {limit:.0f} s: {health}")

    def sigterm(self) -> str:
        # SIGTERM only (no SIGKILL after a timeout, as `stop` would): the exit code says how it ended.
        t0 = time.monotonic()
        self.engine.run("kill", "--signal=TERM", self.container)
        try:
            code = self.engine.run("wait", self.container, timeout=self.service.grace_s).stdout.strip()
        except subprocess.TimeoutExpired:
            raise CheckFailed(
                f"still running {self.service.grace_s:.0f} s after SIGTERM (compose would kill it)"
            ) from None
        took = time.monotonic() - t0
        assert code == "0", f"exit code {code} after SIGTERM:\n{self.logs()}"
        return f"exit 0 after {took:.1f} s (grace {self.service.grace_s:.0f} s)"

    def restart(self) -> str:
        self.engine.run("start", self.container)
        detail = self.wait_until_serving()
        models = {m["name"] for m in get_json(self.url, "/api/v1/models")["models"]}
        mounted = {p.name for p in self.models_dir.iterdir() if p.is_dir()}
        assert mounted <= models, "the mounted checkpoint is gone after the restart"
        return "serving again, " + detail


# ------------------------------------------------------------------ TRAINING
# A short nasi-lemak run through the API, trained in the container's worker process into the runs volume
# (a fresh named volume for the test, Smoke.mounts); after the restart it is still there, done, and its
# weights are a model the API runs.
TRAINING_CHECKED = True
TRAIN_REQUEST = {"recipe": "nasi-lemak", "steps": 20, "eval_interval": 10}
TRAIN_TIMEOUT_S = 120


def training_before_restart(smoke: Smoke, state: dict) -> str:
    accepted = get_json(smoke.url, "/api/v1/train", TRAIN_REQUEST, status=202)
    id = state["id"] = accepted["id"]
    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    while (run := get_json(smoke.url, f"/api/v1/runs/{id}"))["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise CheckFailed(f"run {id} still {run['status']} after {TRAIN_TIMEOUT_S} s")
        time.sleep(1)
    assert run["status"] == "done" and run["model"] == id, run
    files = smoke.engine.run("exec", smoke.container, "ls", f"/data/runs/{id}").stdout.split()
    assert "state.json" in files and "snapshot.npz" in files, files
    return f"{id} done at step {run['step']}; files {', '.join(sorted(files))}"


def training_after_restart(smoke: Smoke, state: dict) -> str:
    id = state["id"]
    run = get_json(smoke.url, f"/api/v1/runs/{id}")
    assert run["status"] == "done" and run["model"] == id, run
    body = get_json(smoke.url, "/api/v1/run", {"model": id, "text": "nasi ", "top_k": 1})
    return f"{id} still done; its model predicts {body['top_k'][0]['token']!r} after 'nasi '"


# ------------------------------------------------------------------ SCALE
# compose.scale.yml brought up as it is (podman-compose, or docker compose), from a folder holding a copy
# of it and of deploy/Caddyfile with the fixture checkpoint as ./models, a fresh REDIS_PASSWORD and a free
# PUBLISHED_PORT, on the image built above; checked from outside through Caddy, then taken down with its
# volume. Caddy in front of three replicas, two workers and Redis: the pages and a training run, whose
# model a replica reads back from Redis; Redis published nowhere and asking for its password; /metrics
# refused at the proxy; the workers healthy by their own check; a replica killed and the stack still serving.
SCALE_FILE = "compose.scale.yml"
SCALE_START_S = 240  # seven containers on a busy 2-core machine


class ScaleStack:
    def __init__(self, engine: Engine, root: Path, models_dir: Path):
        self.engine, self.root = engine, root
        self.name = f"explorer-scale-test-{int(time.time())}"
        (root / "deploy").mkdir()
        shutil.copy(REPO / SCALE_FILE, root / SCALE_FILE)
        shutil.copy(REPO / "deploy" / "Caddyfile", root / "deploy" / "Caddyfile")
        shutil.copytree(models_dir, root / "models")
        self.port = free_port()
        self.password = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.services = yaml.safe_load((root / SCALE_FILE).read_text())["services"]

    def compose(self, *args: str, timeout: float = SCALE_START_S) -> subprocess.CompletedProcess:
        command = ["podman-compose"] if self.engine.name == "podman" else ["docker", "compose"]
        env = os.environ | {"REDIS_PASSWORD": self.password, "PUBLISHED_PORT": str(self.port)}
        result = subprocess.run(
            [*command, "-p", self.name, "-f", str(self.root / SCALE_FILE), *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise CheckFailed(
                f"{' '.join(command)} {' '.join(args)}: exit {result.returncode}: "
                f"{(result.stderr or result.stdout)[-1500:]}"
            )
        return result

    def container(self, service: str) -> str:
        """The container Compose made for a service (podman-compose and docker compose name them differently)."""
        names = self.engine.run("ps", "--all", "--format", "{{.Names}}").stdout.split()
        found = [n for n in names if n.startswith(self.name) and n.rstrip("0123456789").rstrip("-_").endswith(service)]
        if len(found) != 1:
            raise CheckFailed(f"no single container for {service}: {found}")
        return found[0]

    def up(self) -> str:
        self.compose("up", "-d")
        t0 = time.monotonic()
        while time.monotonic() - t0 < SCALE_START_S:
            try:
                code, raw = http(self.url + "/readyz")  # "ready": Redis answers too, not only "degraded"
                if code == 200 and json.loads(raw)["status"] == "ready":
                    return f"{self.url} (Caddy) ready after {time.monotonic() - t0:.0f} s"
            except OSError:
                pass
            time.sleep(1)
        raise CheckFailed(
            f"no ready replica behind Caddy within {SCALE_START_S} s:\n"
            f"{self.engine.run('logs', '--tail=20', self.container('app1'), check=False).stderr}"
        )

    def down(self) -> None:
        names = [
            n
            for n in self.engine.run("ps", "--all", "--format", "{{.Names}}").stdout.split()
            if n.startswith(self.name)
        ]
        anonymous = [
            m["Name"]
            for n in names
            for m in self.engine.inspect("container", n).get("Mounts", [])
            if m.get("Type") == "volume" and m.get("Name") and not m["Name"].startswith(self.name)
        ]
        try:
            self.compose("down", "-v", timeout=120)
        except (CheckFailed, subprocess.TimeoutExpired) as e:
            print(f"      (compose down: {e})")
        for volume in anonymous:  # left by `down -v` under podman-compose
            self.engine.run("volume", "rm", "--force", volume, check=False)

    def pages_and_training(self) -> str:
        for path, mark in [("/", b"htmx"), ("/train", b"train"), ("/api/v1/models", b'"models"')]:
            code, raw = http(self.url + path)
            assert code == 200 and mark in raw.lower(), f"GET {path} through Caddy: {code}"
        accepted = get_json(self.url, "/api/v1/train", TRAIN_REQUEST, status=202)
        id = accepted["id"]
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while (run := get_json(self.url, f"/api/v1/runs/{id}"))["status"] in ("queued", "running"):
            if time.monotonic() > deadline:
                raise CheckFailed(f"run {id} still {run['status']} after {TRAIN_TIMEOUT_S} s")
            time.sleep(1)
        assert run["status"] == "done" and run["model"] == id, run
        answers = {
            json.dumps(get_json(self.url, "/api/v1/run", {"model": id, "text": "nasi ", "top_k": 1})["top_k"])
            for _ in range(6)
        }  # asked of several replicas: each reads the weights from Redis once
        assert len(answers) == 1, answers
        return f"{id} trained by a worker; its model answers alike through Caddy: {answers.pop()}"

    def redis_closed(self) -> str:
        redis = self.container("redis")
        assert not self.engine.run("port", redis, check=False).stdout.strip(), "Redis is published on the host"
        refused = self.engine.run("exec", redis, "redis-cli", "ping", check=False).stdout.strip()
        assert "NOAUTH" in refused, f"redis-cli ping without the password: {refused!r}"
        code, _ = http(self.url + "/metrics")
        assert code == 404, f"/metrics through Caddy: {code}"
        return "Redis has no host port and refuses commands without its password; Caddy refuses /metrics"

    def workers_healthy(self) -> str:
        for service in ("worker1", "worker2"):
            r = self.engine.run("exec", self.container(service), "python", "-m", "app.worker", "--check", check=False)
            assert r.returncode == 0, f"{service}: python -m app.worker --check exited {r.returncode}: {r.stderr}"
        return "python -m app.worker --check passes in both worker containers"

    def replica_lost(self) -> str:
        self.engine.run("kill", self.container("app1"))
        codes = [http(self.url + "/api/v1/runs")[0] for _ in range(12)]
        assert codes == [200] * 12, codes
        return "app1 killed; 12 requests through Caddy all answered 200"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scale_checks(engine: Engine, models_dir: Path, failures: list[str]) -> int:
    """Bring up compose.scale.yml and check it; returns the checks passed (failures appended)."""
    with tempfile.TemporaryDirectory(prefix="explorer-scale-test-") as tmp:
        stack = ScaleStack(engine, Path(tmp), models_dir)
        checker = Smoke(engine, None, models_dir)  # for its check() printer
        try:
            checker.check("scale: compose.scale.yml up (Caddy, 3 replicas, 2 workers, Redis)", stack.up)
            if not checker.failures:
                checker.check("scale: pages and a training run through Caddy", stack.pages_and_training)
                checker.check("scale: Redis closed, /metrics not served", stack.redis_closed)
                checker.check("scale: workers healthy", stack.workers_healthy)
                checker.check("scale: a replica lost", stack.replica_lost)
        finally:
            stack.down()
        failures += checker.failures
        return checker.passed


# ------------------------------------------------------------------ main


def models_folder(root: Path) -> Path:
    """A models folder like ./models, holding the fixture checkpoint, readable by the image's user."""
    folder = root / "models"
    shutil.copytree(FIXTURE_CHECKPOINT, folder / FIXTURE_CHECKPOINT.name)
    for p in [root, *folder.rglob("*"), folder]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["docker", "podman"], help="default: podman if installed, else docker")
    ap.add_argument("--no-build", action="store_true", help="check the image already built")
    ap.add_argument("--keep", action="store_true", help="leave the container for a look (rm it yourself)")
    ap.add_argument("--no-scale", action="store_true", help=f"skip bringing up {SCALE_FILE}")
    args = ap.parse_args()

    engine = Engine(pick_engine(args.engine))
    service = read_compose(REPO / "docker-compose.yml")
    t_all = time.monotonic()
    if not args.no_build:
        t0 = time.monotonic()
        fmt = ["--format=docker"] if engine.name == "podman" else []  # OCI would drop the HEALTHCHECK
        build = subprocess.run(
            [
                engine.name,
                "build",
                *fmt,
                "--tag",
                service.image,
                "--file",
                str(service.context / service.dockerfile),
                str(service.context),
            ]
        )
        if build.returncode != 0:
            print(f"FAIL  build: {engine.name} build exited {build.returncode}")
            return 1
        print(f"ok    build {service.image} with {engine.name} ({time.monotonic() - t0:.0f} s)", flush=True)
    size = engine.inspect("image", service.image)["Size"]
    print(f"      image {service.image}: {size / 1e6:.0f} MB", flush=True)

    with tempfile.TemporaryDirectory(prefix="explorer-image-test-") as tmp:
        smoke = Smoke(engine, service, models_folder(Path(tmp)))
        t_checks = time.monotonic()
        try:
            smoke.check("start as compose does", smoke.start)
            if not smoke.failures:
                smoke.check("endpoints", smoke.endpoints)
                smoke.check("models listed and run", smoke.models)
                smoke.check("non-root user, named group", smoke.user)
                smoke.check("read-only root and models folder", smoke.read_only)
                smoke.check("HEALTHCHECK", smoke.healthcheck)
                training: dict = {}
                if TRAINING_CHECKED:
                    smoke.check("training run writes to its volume", lambda: training_before_restart(smoke, training))
                smoke.check("SIGTERM", smoke.sigterm)
                smoke.check("restart", smoke.restart)
                if TRAINING_CHECKED:
                    smoke.check("training run survives the restart", lambda: training_after_restart(smoke, training))
                else:
                    print("skip  a training run survives a restart: no training in this app yet (TRAINING below)")
        finally:
            if args.keep:
                print(f"      kept container {smoke.container} ({smoke.url})")
            else:
                smoke.remove()
        if not args.no_scale:
            smoke.passed += scale_checks(engine, smoke.models_dir, smoke.failures)
    total = time.monotonic() - t_all
    print(
        f"image-test: {smoke.passed} passed, {len(smoke.failures)} failed; checks "
        f"{time.monotonic() - t_checks:.0f} s, all {total:.0f} s"
    )
    return 1 if smoke.failures else 0


if __name__ == "__main__":
    sys.exit(main())
