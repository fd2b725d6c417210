"""Fixtures every test folder may use: the app as TestClient, and the service it serves with."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

# Training runs the tests start go to a folder of their own, never the user's (every server the tests
# start, in-process or live, inherits it).
os.environ.setdefault("EXPLORER_RUNS_DIR", tempfile.mkdtemp(prefix="explorer-test-runs-"))
# The explorer and Inspect open on the toy in the tests (the product opens on the trained induction
# model: tests/pages/test_default_model.py checks that choice): most page tests type their own text,
# which the toy tokenises word by word, where the induction model knows only its training characters.
os.environ.setdefault("EXPLORER_DEFAULT_MODEL", "toy")

import pytest
from fastapi.testclient import TestClient

from app.main import app, create_app
from app.models.catalog import Catalog, build_catalog
from app.service import Service
from app.settings import Settings, get_settings


@pytest.fixture(scope="session")
def client() -> Iterator[TestClient]:
    """The app with the environment's settings, started (its lifespan builds the model catalogue).
    raise_server_exceptions: a bug (anything the catch-all would answer with 500) fails the test."""
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    """The model catalogue the default settings describe, as the app builds it at start-up."""
    return build_catalog(get_settings())


@pytest.fixture
def svc(catalog: Catalog) -> Service:
    """The service one request is served with, for tests that call it directly."""
    return Service(catalog, get_settings())


@pytest.fixture
def client_with() -> Iterator[Callable[..., TestClient]]:
    """client_with(models_dir=..., max_tokens=...): a started app whose settings differ from the defaults."""
    opened = []

    def make(**changes) -> TestClient:
        c = TestClient(create_app(Settings(**changes)), raise_server_exceptions=True)
        opened.append(c.__enter__())
        return opened[-1]

    yield make
    for c in opened:
        c.__exit__(None, None, None)


# What `make test-fast` (the edit loop: `pytest -m "not slow and not browser"`) leaves out and `make test`
# runs: each takes tens of seconds of a quiet core or more, and what it covers changes seldom. Keyed by
# pytest's node id (a module, or one test with all its parameters), with the reason.
SLOW = {
    "tests/api/test_training.py": "real servers with trainer processes, redis-server and a Celery worker",
    **{
        f"tests/api/test_sae_training.py::{name}": "SAE runs on real servers with trainer processes, and on Redis"
        for name in (
            "test_an_sae_run_trains_in_a_worker_and_becomes_an_sae",
            "test_the_events_stream_carries_the_sae_metrics",
            "test_cancel_keeps_the_sae_so_far_and_a_repeat_resumes_it",
        )
    },
    "tests/core/test_blas_kernels.py": "nasi-lemak retrained under seven OpenBLAS kernels, in subprocesses",
    "tests/core/test_python_docs_induction_retrain.py": "python-docs-induction retrained (with EXPLORER_RETRAIN)",
    "tests/core/test_training.py::test_an_induction_head_forms_and_the_one_layer_control_forms_none": (
        "two models trained until an induction head forms"
    ),
}


# What `make test` runs in one process, after the rest has run on two (pytest-xdist): the folders whose tests
# start live servers, headless Chromium, redis-server, Caddy or containers and time what a user would see.
# Two of them at once on a two-core machine would measure each other's load, not the product.
SERIAL = ("tests/browser/", "tests/scale/", "tests/deploy/", "tests/security/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.nodeid == key or item.nodeid.startswith((key + "::", key + "[")) for key in SLOW):
            item.add_marker(pytest.mark.slow)
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
