"""The layers hold (ARCHITECTURE.md): core imports nothing from app; each package of app/ imports only
what its docstring allows (the faces reach the service, never core, the catalogue or the training
store); app/ stays small at the top and no module or class outgrows a reader; one request prepares its
model once; every API operation is documented."""

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
APP = ROOT / "app"

# What each package of app/ may import from the app (besides itself), and whether it may import core.
# The faces (api, pages) format; the service prepares; core computes (ARCHITECTURE.md).
# The JSON face never reaches into the HTML face; the pages validate their state with the API's request models.
API_MAY_IMPORT = {
    "app.service",
    "app.http.jsonio",
    "app.http.errors",
    "app.http.security",
    "app.http.sse",
    "app.http.language",
    "app.deps",
    "app.settings",
    "app.paths",
    "app",
}
PAGES_MAY_IMPORT = API_MAY_IMPORT | {"app.api.requests"}
# The routes (app/api/routes/, one module per resource) read requests and write responses with the API's
# models, ask the service, and answer through app/http's JSON and event streams.
ROUTES_MAY_IMPORT = {
    "app.api.requests",
    "app.api.responses",
    "app.api.circuit_models",
    "app.api.generation_models",
    "app.api.class_models",
    "app.api.sae_models",
    "app.api.attribution_models",
    "app.service",
    "app.http.jsonio",
    "app.http.sse",
    "app.http.security",
    "app.deps",
}
MAY_IMPORT: dict[str, tuple[set[str], bool]] = {
    "app.http": ({"app.settings", "app.service.errors"}, True),  # core: only InputError, to map it to 422
    "app.training": ({"app.settings"}, True),
    # of the training store, its interface and the package's factory (`from app.training import open_store`)
    "app.models": ({"app.settings", "app.training.base", "=app.training"}, True),
    "app.classes": ({"app.settings"}, False),
    "app.service": ({"app.settings", "app.models", "app.training", "app.classes"}, True),
    "app.api": (API_MAY_IMPORT, False),
    "app.api.routes": (ROUTES_MAY_IMPORT, False),
    "app.pages": (PAGES_MAY_IMPORT, False),
}
PACKAGES = sorted(MAY_IMPORT)
# The request models state core's own defaults and constants (the spec's values, the presets, a recipe's
# limits), so that each is written once, in core; they compute nothing with it.
MAY_IMPORT_CORE = {"app.api.requests", "app.api.responses"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[str]:
    """The absolute name of every module a file imports (relative imports resolved)."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from app.pages import web` imports the module app.pages.web
            out += [
                f"{base}.{a.name}"
                if (ROOT / (base + "." + a.name).replace(".", "/")).with_suffix(".py").exists()
                else base
                for a in node.names
            ]
    return out


def allowed(name: str, rules: set[str]) -> bool:
    """A rule names a module and everything under it; "=name" that module alone (a package's own names)."""
    return (
        any(name == r or name.startswith(r + ".") for r in rules if r != "app" and not r.startswith("="))
        or f"={name}" in rules
        or name == "app"
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_docstring_allows(package):
    rules, may_import_core = MAY_IMPORT[package]
    bad = []
    for path in sorted((ROOT / package.replace(".", "/")).glob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            if top == "core" and not (may_import_core or module_name(path) in MAY_IMPORT_CORE):
                bad.append(f"{path.name}: {name}")
            elif top == "app" and not (name.startswith(package + ".") or name == package or allowed(name, rules)):
                bad.append(f"{path.name}: {name}")
    assert bad == [], f"{package} imports {bad}: see its docstring and ARCHITECTURE.md"


def test_every_package_of_the_app_has_rules_and_says_them():
    found = {module_name(p.parent) for p in APP.glob("*/__init__.py")}
    top = {package for package in MAY_IMPORT if package.count(".") == 1}
    assert found == top, "a new package of app/ needs its import rules here and in its docstring"
    for package in MAY_IMPORT:  # a subpackage with rules of its own (app.api.routes) says them too
        doc = ast.get_docstring(ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"{package}/__init__.py says what it may import"


def test_a_route_module_imports_no_other_route_module():
    """Each resource's routes stand alone: what they share is app/api/routes/shared.py, nothing else."""
    routes = sorted((APP / "api" / "routes").glob("*.py"))
    assert len(routes) >= 8
    for path in routes:
        if path.name != "__init__.py":
            own = {name for name in imports(path) if name.startswith("app.api.routes")}
            assert own <= {"app.api.routes.shared"}, f"{path.name} imports {own}"


def test_the_top_of_the_app_stays_small():
    """A newcomer finds a concern by its folder: the top level holds only the entry points and wiring."""
    assert len(list(APP.glob("*.py"))) <= 8


def test_no_module_or_class_grows_past_what_a_reader_can_hold():
    too_long = []
    for path in [*APP.rglob("*.py"), *(ROOT / "core").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 700:
            too_long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300:
                too_long.append(f"{path.relative_to(ROOT)}:{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_core_imports_nothing_from_the_app():
    for path in (ROOT / "core").rglob("*.py"):
        for module in imports(path):
            assert module.split(".")[0] not in ("app", "fastapi", "starlette", "pydantic"), (
                f"{path.relative_to(ROOT)} imports {module}"
            )


def import_graph() -> dict[str, set[str]]:
    """Every module of app/ and core/ -> the modules of app/ and core/ it imports, wherever the import is
    written: at the top, inside a function (a late import still runs, and still makes a circle), or under
    TYPE_CHECKING. `from a.b import c` is an edge to the module a.b.c when there is one, else to a.b (its
    __init__ defines or re-exports c); `import a.b.c` is an edge to a.b.c. The parent packages Python runs
    first are not edges, so a package whose __init__ imports its own submodules (to re-export them, or a
    factory choosing one) makes no circle with them; a submodule reading a name from its package's
    __init__ (`from a import x`) is an edge to it, and makes one."""
    files = {module_name(p): p for top in ("app", "core") for p in (ROOT / top).rglob("*.py")}

    def ours(name: str) -> str | None:  # the deepest module of ours that `name` names (a.b.C -> a.b)
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {ours(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else ours(base) for a in node.names}
        graph[name] = found - {None, name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each is a set of
    modules that import one another round a circle, listed as one circle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_circle_through(graph, component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One import circle inside a strongly connected component, from its first module back to it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to `start`
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(component)


def test_the_circle_finder_finds_a_circle_and_passes_a_package_that_imports_its_own_modules():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"p": {"p.x", "p.y"}, "p.x": {"p.y"}, "p.y": set()}) == []


def test_no_module_of_app_or_core_imports_itself_round_a_circle():
    """An import circle holds together only by where its imports are written (inside functions, after the
    definitions the other side needs): move one and it breaks, and no layer can be read on its own. Each
    package imports downwards (ARCHITECTURE.md); app/training, for one, from its interface (base.py) up."""
    graph = import_graph()
    assert "app.training.jobs" in graph["app.worker"]  # imported inside main(): late imports are seen
    assert circles(graph) == [], "modules that import each other round a circle: " + "; ".join(
        " -> ".join(c) for c in circles(graph)
    )


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


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"view": "compare"},
        {"ablate": "0.1"},
        {"view": "compare", "ablate": ["0.1", "1.2"], "rollout": 1},
        {"model": "spec-forward", "view": "compare"},
    ],
)
def test_one_explorer_request_prepares_its_model_once(counted, query):
    """Compare (the mask flipped), an ablation's baseline and rollout reuse the one preparation."""
    client, services = counted
    r = client.get("/", params=query)
    assert r.status_code == 200, r.text
    assert len(services) == 1 and services[0].preparations == 1


def test_every_api_operation_has_a_description(client):
    schema = client.get("/openapi.json").json()
    missing = [
        f"{method.upper()} {path}"
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if not (op.get("description") or "").strip() or not (op.get("summary") or "").strip()
    ]
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
    with caplog.at_level(logging.ERROR, logger="app.http.errors"):
        r = client.get("/api/v1/test-bug")
    assert r.status_code == 500 and "reshape" not in r.text and r.json()["detail"][0]["type"] == "internal_error"
    assert any("reshape" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)
