"""The layers hold (ARCHITECTURE.md): core imports nothing from app; routers reach only the service and
the web helpers, never core, the model catalogue or each other; one request prepares its model once;
every API operation is documented."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from app.deps import get_service
from app.main import create_app
from app.service import Service
from app.settings import get_settings

ROOT = Path(__file__).resolve().parent.parent
ROUTERS = sorted((ROOT / "app" / "routers").glob("*.py"))
# What a router may import from the app: the service and the web helpers, and the app's plumbing
# (request/response models, figure builders, snippets, JSON, dependencies).
ROUTER_MAY_IMPORT = {"service", "web", "schemas", "figures", "snippets", "jsonio", "deps", "settings", "paths",
                     "__version__"}


def imports(path: Path) -> list[tuple[str, int]]:
    """(module, level) of every import in a file: `from ..service import X` -> ("service", 2)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level and node.module is None:  # from .. import web, figures
                out += [(alias.name, node.level) for alias in node.names]
            else:
                out.append((node.module or "", node.level))
    return out


@pytest.mark.parametrize("path", ROUTERS, ids=lambda p: p.name)
def test_routers_reach_only_the_service_and_the_web_helpers(path):
    bad = []
    for module, level in imports(path):
        top = module.split(".")[0]
        if level == 0 and top in ("core", "app"):
            bad.append(module)  # core, or the app by absolute name
        elif level == 1 and module:  # a sibling router
            bad.append("." + module)
        elif level == 2 and top not in ROUTER_MAY_IMPORT:
            bad.append(".." + module)  # the catalogue, pretrained checkpoints...
    assert bad == [], f"{path.name} imports {bad}: routers format, the service prepares, core computes"


def test_core_imports_nothing_from_the_app():
    for path in (ROOT / "core").rglob("*.py"):
        for module, level in imports(path):
            assert level or module.split(".")[0] not in ("app", "fastapi", "starlette", "pydantic"), \
                f"{path.relative_to(ROOT)} imports {module}"


@pytest.fixture
def counted():
    """A started app that keeps every request's Service, to count the models it prepared."""
    app = create_app()
    services: list[Service] = []

    def keep(request: Request) -> Service:
        services.append(Service(request.app.state.catalog, get_settings()))
        return services[-1]

    app.dependency_overrides[get_service] = keep
    with TestClient(app) as client:
        yield client, services


@pytest.mark.parametrize("query", [
    {}, {"view": "compare"}, {"ablate": "0.1"}, {"view": "compare", "ablate": ["0.1", "1.2"], "rollout": 1},
    {"model": "spec-forward", "view": "compare"},
])
def test_one_explorer_request_prepares_its_model_once(counted, query):
    """Compare (the mask flipped), an ablation's baseline and rollout reuse the one preparation."""
    client, services = counted
    r = client.get("/", params=query)
    assert r.status_code == 200, r.text
    assert len(services) == 1 and services[0].preparations == 1


def test_every_api_operation_has_a_description(client):
    schema = client.get("/openapi.json").json()
    missing = [f"{method.upper()} {path}" for path, ops in schema["paths"].items() for method, op in ops.items()
               if not (op.get("description") or "").strip() or not (op.get("summary") or "").strip()]
    assert missing == []


def test_only_input_errors_are_422_and_a_valueerror_from_a_bug_is_a_logged_500(caplog):
    """core and the service raise InputError for what the user can fix: 422 with its message. Any other
    exception, a ValueError from NumPy or a bug included, is a 500 without internals, logged."""
    import logging

    import numpy as np

    from core import InputError

    app = create_app()

    def user_error():
        raise InputError("d_model=10 is not divisible by n_heads=4: choose a multiple")

    def bug():
        np.zeros(3).reshape(2, 2)  # ValueError: cannot reshape array of size 3 into shape (2,2)

    app.add_api_route("/api/v1/test-user-error", user_error)
    app.add_api_route("/api/v1/test-bug", bug)
    client = TestClient(app, raise_server_exceptions=False)
    r = client.get("/api/v1/test-user-error")
    assert r.status_code == 422 and r.json()["detail"][0]["msg"].startswith("d_model=10 is not divisible")
    with caplog.at_level(logging.ERROR, logger="app.errors"):
        r = client.get("/api/v1/test-bug")
    assert r.status_code == 500 and "reshape" not in r.text and r.json()["detail"][0]["type"] == "internal_error"
    assert any("reshape" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)
