"""Schema-driven fuzzing against a real running server (bounded; `make fuzz` runs the big one).

tests/api/ fuzzes the app in-process; this one goes through uvicorn and the network stack, and
also checks that every 4xx says what to fix."""

from __future__ import annotations

import fuzz  # scripts/fuzz.py (conftest puts scripts/ on sys.path)

EXAMPLES_PER_OPERATION_AND_MODE = 12


def test_no_5xx_and_every_4xx_is_readable(server):
    tally = fuzz.fuzz(server.url, EXAMPLES_PER_OPERATION_AND_MODE, seed=1)
    print(tally.summary())
    assert tally.requests > 0
    assert not tally.problems, tally.summary() + "\n--- server log ---\n" + server.log()[-3000:]


def test_the_readability_check_rejects_bare_errors():
    """The judge itself must be able to fail: a 4xx with no message, or a stack trace, is a problem."""
    import requests

    def response(status: int, body: bytes) -> requests.Response:
        r = requests.Response()
        r.status_code, r._content = status, body
        r.headers["content-type"] = "application/json"
        return r

    assert fuzz.readable_message(response(422, b'{"detail": [{"msg": "Field required"}]}')) == "Field required"
    assert fuzz.readable_message(response(404, b'{"detail": "Unknown model \'x\'"}'))
    assert fuzz.readable_message(response(422, b'{"detail": [{"loc": ["body"]}]}')) is None
    assert fuzz.readable_message(response(400, b"Bad Request")) is None
    assert fuzz.readable_message(response(422, b'{"detail": "Traceback (most recent call last)"}')) is None
    assert fuzz.readable_message(response(422, b'{"detail": []}')) is None
