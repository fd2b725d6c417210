"""/healthz says the process answers; /readyz says it can serve: the front-end files are there and
the models folder, when one is set, can be read. Not ready -> 503 with reasons an operator can act on.
Redis out of reach only degrades it (200 "degraded", naming Redis): everything but training is served."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.health import VENDOR_LIST, models_dir_problems, vendor_asset_problems
from app.main import create_app
from app.paths import STATIC_DIR
from app.settings import Settings, get_settings, redis_connection_url


@pytest.fixture
def app():
    app = create_app()
    yield app
    app.dependency_overrides.clear()


def _client_with(app, **settings) -> TestClient:
    app.dependency_overrides[get_settings] = lambda: Settings(**settings)
    return TestClient(app)


def test_healthz_is_alive(app):
    r = TestClient(app).get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_ready_with_the_assets_and_no_models_dir(app):
    r = _client_with(app, models_dir=None).get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready", "reasons": []}


def test_ready_with_a_readable_models_dir(app, tmp_path):
    (tmp_path / "gpt2").mkdir()
    r = _client_with(app, models_dir=tmp_path).get("/readyz")
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("make", ["missing", "file"])
def test_not_ready_when_models_dir_is_not_a_folder(app, tmp_path, make):
    target = tmp_path / "models"
    if make == "file":
        target.write_text("not a folder")
    r = _client_with(app, models_dir=target).get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "not ready"
    assert body["reasons"] == [f"EXPLORER_MODELS_DIR={target} is not a folder"]


def test_readyz_is_documented_with_its_503(app):
    responses = TestClient(app).get("/openapi.json").json()["paths"]["/readyz"]["get"]["responses"]
    assert {"200", "503"} <= responses.keys()
    assert "degraded" in responses["200"]["description"]
    schema = TestClient(app).get("/openapi.json").json()["components"]["schemas"]["Readiness"]
    assert schema["properties"]["status"]["enum"] == ["ready", "degraded", "not ready"]
    assert schema["required"] == ["status"]  # the fields of before, no new one: old clients read it as they did


def _unreachable_redis() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://:pw-not-shown@127.0.0.1:{port}/0"


def test_redis_out_of_reach_is_degraded_not_unready():
    """Served (200) and named: the proxy keeps the replica, an operator sees what to fix; training is a 503."""
    with TestClient(create_app(Settings(redis_url=_unreachable_redis(), models_dir=None))) as c:
        r = c.get("/readyz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "degraded" and len(body["reasons"]) == 1
        assert "Redis" in body["reasons"][0] and "EXPLORER_REDIS_URL" in body["reasons"][0]
        assert "pw-not-shown" not in r.text
        train = c.post("/api/v1/train", json={"recipe": "nasi-lemak", "steps": 20})
        assert train.status_code == 503 and int(train.headers["retry-after"]) > 0
        assert c.post("/api/v1/run", json={"model": "toy", "text": "Ali makan"}).status_code == 200


def test_not_ready_names_what_is_degraded_too(tmp_path):
    missing = tmp_path / "models"
    with TestClient(create_app(Settings(redis_url=_unreachable_redis(), models_dir=missing))) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "not ready"
    assert body["reasons"][0] == f"EXPLORER_MODELS_DIR={missing} is not a folder" and "Redis" in body["reasons"][1]


def test_the_redis_url_over_tls_checks_the_certificate():
    """Every client of Redis (the store, Celery's broker) is given this URL: over TLS the certificate is checked,
    against EXPLORER_REDIS_CA when set; a URL's own choice stays; plain redis:// is left alone."""
    tls = "rediss://:pw@redis.school:6380/0"
    assert redis_connection_url(Settings(redis_url=tls)) == tls + "?ssl_cert_reqs=required"
    with_ca = redis_connection_url(Settings(redis_url=tls, redis_ca="/etc/school/ca.pem"))
    assert with_ca == tls + "?ssl_cert_reqs=required&ssl_ca_certs=/etc/school/ca.pem"
    own = tls + "?ssl_cert_reqs=optional"
    assert redis_connection_url(Settings(redis_url=own)) == own
    plain = "redis://:pw@redis:6379/0"
    assert redis_connection_url(Settings(redis_url=plain, redis_ca="/etc/school/ca.pem")) == plain
    with pytest.raises(ValueError, match="EXPLORER_REDIS_URL is not set"):  # called only when Redis is configured
        redis_connection_url(Settings(redis_url=None))


def test_models_dir_problems_none_when_unset():
    assert models_dir_problems(None) == []


def _static_copy(tmp_path: Path) -> Path:
    """A static/ folder with the real list and the real vendored files, to break one at a time."""
    static = tmp_path / "static"
    (static / "vendor").mkdir(parents=True)
    (static / VENDOR_LIST).write_text((STATIC_DIR / VENDOR_LIST).read_text())
    for asset in (STATIC_DIR / "vendor").iterdir():
        (static / "vendor" / asset.name).write_bytes(asset.read_bytes())
    return static


def _listed_names() -> list[str]:
    lines = (STATIC_DIR / VENDOR_LIST).read_text().splitlines()
    return [Path(line).name for line in lines if line.strip() and not line.startswith("#")]


def test_every_listed_vendor_file_is_served(app):
    client = TestClient(app)
    assert _listed_names(), "static/vendor-files.txt lists no file"
    for name in _listed_names():
        assert client.get(f"/static/vendor/{name}").status_code == 200, name


def test_vendor_assets_complete(tmp_path):
    assert vendor_asset_problems(_static_copy(tmp_path)) == []


def test_missing_or_empty_vendor_file_is_named(tmp_path):
    static = _static_copy(tmp_path)
    gone, emptied = _listed_names()[:2]
    (static / "vendor" / gone).unlink()
    (static / "vendor" / emptied).write_bytes(b"")
    problems = vendor_asset_problems(static)
    assert len(problems) == 2
    assert gone in problems[0] and emptied in problems[1]


def test_missing_vendor_list_is_a_problem(tmp_path):
    static = _static_copy(tmp_path)
    (static / VENDOR_LIST).unlink()
    assert len(vendor_asset_problems(static)) == 1


def test_every_redis_client_is_given_the_checked_url(tmp_path):
    """The training store (replicas and workers, Celery's broker from its URL) and the live classes' store: none
    reads EXPLORER_REDIS_URL but through redis_connection_url, so EXPLORER_REDIS_CA reaches them all."""
    from app.classes import open_class_store
    from app.training import open_store

    ca = tmp_path / "ca.pem"
    settings = Settings(redis_url="rediss://:pw@127.0.0.1:6380/0", redis_ca=ca)
    checked = redis_connection_url(settings)
    assert open_store(settings).url == checked
    kwargs = open_class_store(settings).r.connection_pool.connection_kwargs
    assert kwargs["ssl_ca_certs"] == str(ca) and kwargs["ssl_cert_reqs"] == "required"
