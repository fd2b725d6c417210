"""compose.scale.yml and deploy/Caddyfile, read as Compose and Caddy read them: Caddy is the only way in
(load balancing, active health checks on /readyz, event streams unbuffered, no /metrics); three replicas
and two workers share one Redis that is never published, takes a password from an env file that is not
committed and keeps an append-only file on a volume. (scripts/image_test.py brings the stack up.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from app.settings import Settings
from tests.scale import services

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "compose.scale.yml").read_text())


def env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items()}


def test_caddy_is_the_only_way_in(compose):
    services_ = compose["services"]
    assert set(services_) == {"proxy", "app1", "app2", "app3", "worker1", "worker2", "redis"}
    published = {name for name, s in services_.items() if s.get("ports")}
    assert published == {"proxy"} and services_["proxy"]["ports"] == ["${PUBLISHED_PORT:-8000}:80"]
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in services_["proxy"]["volumes"]
    apps = [f"{name}:{env(services_[name])['EXPLORER_PORT']}" for name in ("app1", "app2", "app3")]
    assert env(services_["proxy"])["PROXY_UPSTREAMS"].split() == apps


def test_redis_takes_a_password_from_an_uncommitted_env_file_and_keeps_an_append_only_file(compose):
    redis = compose["services"]["redis"]
    assert redis["user"] == "redis"  # not root
    command = " ".join(redis["command"])
    assert '--requirepass "$$REDIS_PASSWORD"' in command and "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert env(redis)["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")  # no default: Compose refuses without
    assert "redis:/data" in redis["volumes"] and "redis" in compose["volumes"]
    assert "/.env" in (REPO / ".gitignore").read_text().splitlines()
    for name in ("app1", "worker1"):
        assert (
            env(compose["services"][name])["EXPLORER_REDIS_URL"].startswith("redis://:${REDIS_PASSWORD:?")
            and "@redis:6379/" in env(compose["services"][name])["EXPLORER_REDIS_URL"]
        )


def test_replicas_and_workers_run_the_one_image_with_settings_the_app_reads(compose):
    names = {f"EXPLORER_{name.upper()}" for name in Settings.model_fields}
    for name in ("app1", "app2", "app3", "worker1", "worker2"):
        service = compose["services"][name]
        assert service["image"] == "transformer-explorer:0.1.0" and service["read_only"] is True
        assert set(k for k in env(service) if k.startswith("EXPLORER_")) <= names
        # a replica serves all but training without Redis; a worker has nothing to do without it
        wanted = "service_started" if name.startswith("app") else "service_healthy"
        assert service["depends_on"]["redis"]["condition"] == wanted
    for name in ("worker1", "worker2"):
        worker = compose["services"][name]
        assert worker["command"] == ["python", "-m", "app.worker"]
        assert worker["healthcheck"]["test"] == ["CMD", "python", "-m", "app.worker", "--check"]


def test_the_caddyfile_balances_checks_readiness_streams_and_hides_metrics():
    caddy = services.need("caddy")
    adapted = subprocess.run(
        [caddy, "adapt", "--config", str(REPO / "deploy" / "Caddyfile"), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        env=os.environ | {"HOME": "/tmp"},
    )
    assert adapted.returncode == 0, adapted.stderr
    server = json.loads(adapted.stdout)["apps"]["http"]["servers"]["srv0"]
    routes = {json.dumps(r["match"]) if "match" in r else "*": r["handle"][0] for r in server["routes"]}
    assert routes['[{"path": ["/metrics"]}]'] == {"handler": "static_response", "status_code": 404}
    proxy = routes["*"]
    assert [u["dial"] for u in proxy["upstreams"]] == ["app1:8000", "app2:8000", "app3:8000"]
    assert proxy["health_checks"]["active"]["uri"] == "/readyz" and proxy["flush_interval"] == -1
    assert proxy["load_balancing"]["selection_policy"]["policy"] == "least_conn"
