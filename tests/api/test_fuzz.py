"""Schema-driven fuzzing in process: schemathesis draws valid and schema-breaking requests for every
/api/v1 operation from the OpenAPI; none may answer 5xx, and every 4xx carries a message.

Every operation the OpenAPI lists under /api/v1 (28 today) is reached: the test asserts that the operations it
sent requests to are exactly those. Where schemathesis cannot generate a kind of request (an operation with
nothing to break has no schema-breaking request) the pair is reported, as a warning in pytest's summary and
printed with the tally (pytest -rP), not skipped in silence; only a server error, an error without a message
or an operation never reached fails.

Bounded: EXAMPLES per operation and mode, so at most 28 operations × 2 modes × EXAMPLES requests.
"""

import collections
import warnings

import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given
from schemathesis import GenerationMode

from app.main import app

EXAMPLES = 7  # 28 operations × 2 modes × 7 = at most 392 requests
MODES = {"valid": GenerationMode.POSITIVE, "invalid": GenerationMode.NEGATIVE}

schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def client():
    """Valid POST /api/v1/train bodies queue real runs: cancel them when the fuzzing is over."""
    with TestClient(app) as c:
        yield c
        for run in c.get("/api/v1/runs").json()["runs"]:
            if run["status"] in ("queued", "running"):
                c.delete(f"/api/v1/runs/{run['id']}")


def fuzz(operation, mode, statuses: collections.Counter) -> None:
    """Up to EXAMPLES requests of one kind to one operation; counts each answer's status in `statuses`."""

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case):
        response = case.call()
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.path, case.query, case.body, response.text[:500])
        if response.status_code >= 400:
            detail = response.json()["detail"]
            assert detail and all(isinstance(d["msg"], str) and d["msg"] for d in detail), response.text

    one()


def test_every_api_operation_answers_fuzzed_requests_without_a_server_error(client):
    listed = {
        f"{method.upper()} {path}"
        for path, item in client.get("/openapi.json").json()["paths"].items()
        if path.startswith("/api/v1/")
        for method in item
    }
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().path.startswith("/api/v1/")]
    tally: dict[tuple[str, str], collections.Counter] = {}
    not_generated, failures = [], []
    for operation in operations:
        name = f"{operation.method.upper()} {operation.path}"
        for kind, mode in MODES.items():
            statuses = tally.setdefault((name, kind), collections.Counter())
            try:
                fuzz(operation, mode, statuses)
            except hypothesis.errors.Unsatisfiable:
                not_generated.append(f"{name} ({kind})")
            except Exception as e:  # a 5xx or a message-less error: collected, every operation still fuzzed
                failures.append(f"{name} ({kind}): {type(e).__name__}: {str(e)[:800]}")

    for (name, kind), statuses in sorted(tally.items()):
        print(f"{name:45} {kind:8} {sum(statuses.values()):2} requests: {dict(sorted(statuses.items()))}")
    if not_generated:
        print("schemathesis could not generate:", ", ".join(not_generated))
        warnings.warn(f"schemathesis could not generate requests for: {', '.join(not_generated)}", stacklevel=1)
    reached = {name for (name, _), statuses in tally.items() if statuses}
    assert not failures, "\n".join(failures)
    assert reached == listed, {
        "never reached": sorted(listed - reached),
        "not in the OpenAPI": sorted(reached - listed),
    }
    assert len(listed) >= 28
