import pytest
from fastapi.testclient import TestClient

from app.main import app


@pytest.fixture(scope="session")
def client():
    # raise_server_exceptions: a bug (anything the catch-all would answer with 500) fails the test
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c


def messages(response) -> str:
    """All `detail[].msg` of an error response, joined, for substring checks."""
    return " | ".join(d["msg"] for d in response.json()["detail"])
