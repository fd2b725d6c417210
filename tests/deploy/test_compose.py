"""docker-compose.yml, parsed as YAML and checked against what Compose needs and what we promise:
the service builds from this folder, publishes the app's port, keeps the image's /healthz check, restarts, runs
with a read-only root filesystem and mounts the optional models folder at EXPLORER_MODELS_DIR."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from .dockerfile import healthcheck_command, parse_dockerfile

REPO = Path(__file__).resolve().parents[2]
# Compose's top-level keys (compose-spec); anything else is rejected by `docker compose config`.
COMPOSE_TOP_LEVEL = {"version", "name", "include", "services", "networks", "volumes", "configs", "secrets"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def service(compose) -> dict:
    assert list(compose["services"]) == ["explorer"]
    return compose["services"]["explorer"]


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the KEY=value list form
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_top_level_keys_are_compose_keys(compose):
    assert set(compose) <= COMPOSE_TOP_LEVEL
    assert "version" not in compose  # obsolete in Compose v2; it only prints a warning


def test_service_builds_from_this_folder_with_the_dockerfile(service):
    build = service["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (REPO / context / dockerfile).is_file()


def test_port_published_is_the_port_the_container_listens_on(service):
    env = _env(service)
    container_ports = {str(p).split(":")[-1].split("/")[0] for p in service["ports"]}
    assert container_ports == {env["EXPLORER_PORT"]}
    # and the image EXPOSEs it
    runtime = parse_dockerfile((REPO / "Dockerfile").read_text())[-1]
    assert runtime.last("EXPOSE").args == env["EXPLORER_PORT"]


def test_health_is_the_images_own_check_stated_once(service):
    """Compose inherits the image's HEALTHCHECK; a second copy here could drift from it (and a CMD
    list with spaces in its arguments is split by podman's Docker API)."""
    assert "healthcheck" not in service
    runtime = parse_dockerfile((REPO / "Dockerfile").read_text())[-1]
    assert "/healthz" in " ".join(healthcheck_command(runtime))


def test_restarts_and_read_only_root_with_a_tmpfs(service):
    assert service["restart"] == "unless-stopped"
    assert service["read_only"] is True
    tmpfs = service["tmpfs"] if isinstance(service["tmpfs"], list) else [service["tmpfs"]]
    assert "/tmp" in [t.split(":")[0] for t in tmpfs]


def test_graceful_stop_outlasts_uvicorns_drain(service):
    from app.__main__ import GRACEFUL_SHUTDOWN_S

    grace = service["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace), "write the grace period in whole seconds"
    assert int(grace[:-1]) > GRACEFUL_SHUTDOWN_S


def test_models_volume_is_mounted_read_only_at_explorer_models_dir(service):
    models_dir = _env(service)["EXPLORER_MODELS_DIR"]
    mounts = [v.split(":") for v in service["volumes"]]
    matching = [m for m in mounts if m[1] == models_dir]
    assert len(matching) == 1, f"no volume mounted at EXPLORER_MODELS_DIR={models_dir}"
    assert matching[0][0].startswith("./") and matching[0][2:] == ["ro"]


def test_every_explorer_variable_is_a_setting(service):
    from app.settings import Settings

    names = {f"EXPLORER_{name.upper()}" for name in Settings.model_fields}
    unknown = [k for k in _env(service) if k.startswith("EXPLORER_") and k not in names]
    assert not unknown, f"not read by app/settings.py: {unknown}"


def test_the_scale_out_stack_is_its_own_file():
    """Replicas behind Caddy, training workers and Redis: compose.scale.yml, which this file points to
    (checked in tests/scale/test_compose_scale.py, and brought up by scripts/image_test.py)."""
    assert "compose.scale.yml" in (REPO / "docker-compose.yml").read_text()
    assert (REPO / "compose.scale.yml").is_file()
