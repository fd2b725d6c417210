"""Fixtures for the security tests: the app in-process (TestClient) and as a real server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import liveserver  # noqa: E402  (scripts/ is not a package)

from app.main import create_app  # noqa: E402


@pytest.fixture(scope="module")
def client() -> TestClient:
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture(scope="session")
def server() -> liveserver.LiveServer:
    """One real uvicorn process shared by the tests that only read from it."""
    with liveserver.live_server() as s:
        yield s
