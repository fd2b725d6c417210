"""The HTTP edge of a real server started as the image starts it (`python -m app`): a request too
large for the server gets an answer every ordinary client can read, in JSON, with the security
headers; and EXPLORER_BLAS_THREADS takes effect inside the server process.

- A 5 MB body: 413, read by urllib, http.client, httpx and a bare socket, which all send the whole
  body before they read (the server must not reset the connection under them).
- A 100,000-character query string: 414 naming the limit (uvicorn alone answers a plain-text 400).
- The URL limit at its exact boundary.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import liveserver
import pytest

from app.http.security import SECURITY_HEADERS
from app.settings import get_settings

S = get_settings()
RUN = "/api/v1/run"
FIVE_MB = 5 * 2**20
BLAS_REPORT_DIR = Path(__file__).resolve().parent / "blas_report"  # a sitecustomize.py, see its docstring


@pytest.fixture(scope="module")
def entry():
    with liveserver.live_server(entry_point=True) as server:
        yield server


def _address(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length, read from a bare socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection before answering: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection in the middle of its answer"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _raw(server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(_address(server), timeout=30) as sock:
        sock.sendall(request)
        return _read_response(sock)


def _assert_readable_error(status: int, headers, body: bytes, expected: int, type_: str, limit: int) -> None:
    assert status == expected, body[:300]
    headers = {k.lower(): v for k, v in headers.items()}
    assert headers["content-type"] == "application/json"
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, name
    (detail,) = json.loads(body)["detail"]
    assert detail["type"] == type_ and f"limit of {limit:,}" in detail["msg"], detail


# ------------------------------------------------------------------ 413: a 5 MB body


def _five_mb_body() -> bytes:
    body = json.dumps({"model": "toy", "text": "a" * FIVE_MB}).encode()
    assert len(body) > FIVE_MB > S.max_body_bytes
    return body


def test_a_5mb_body_gets_a_json_413_that_urllib_reads(entry):
    request = urllib.request.Request(
        entry.url + RUN, data=_five_mb_body(), headers={"content-type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError, match="^HTTP Error 413") as refused:  # not URLError("connection reset")
        urllib.request.urlopen(request, timeout=60)
    _assert_readable_error(
        refused.value.code, dict(refused.value.headers), refused.value.read(), 413, "body_too_large", S.max_body_bytes
    )


def test_a_5mb_body_gets_a_json_413_that_http_client_httpx_and_a_socket_read(entry):
    body = _five_mb_body()
    conn = http.client.HTTPConnection(*_address(entry), timeout=60)
    conn.request("POST", RUN, body=body, headers={"content-type": "application/json"})
    r = conn.getresponse()
    _assert_readable_error(r.status, dict(r.getheaders()), r.read(), 413, "body_too_large", S.max_body_bytes)
    conn.close()

    r = httpx.post(entry.url + RUN, content=body, headers={"content-type": "application/json"}, timeout=60)
    _assert_readable_error(r.status_code, r.headers, r.content, 413, "body_too_large", S.max_body_bytes)

    head = f"POST {RUN} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    _assert_readable_error(*_raw(entry, head.encode() + body), 413, "body_too_large", S.max_body_bytes)
    assert httpx.get(entry.url + "/healthz").status_code == 200


def test_a_client_that_waits_for_100_continue_is_refused_without_sending_its_body(entry):
    head = (
        f"POST {RUN} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
        f"Content-Length: {FIVE_MB}\r\n\r\n"
    )
    with socket.create_connection(_address(entry), timeout=30) as sock:
        sock.sendall(head.encode())
        status, headers, body = _read_response(sock)  # a final answer, not "100 Continue"
        assert sock.recv(1) == b""  # and the connection is closed: the body it announced is not wanted
    _assert_readable_error(status, headers, body, 413, "body_too_large", S.max_body_bytes)
    assert headers["connection"] == "close"


# ------------------------------------------------------------------ 414: a long URL


def _get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


@pytest.mark.parametrize("path", ["/api/v1/lessons/attention", "/"])
def test_a_100k_character_query_string_gets_a_json_414(entry, path):
    before = len(_access_lines(entry))
    _assert_readable_error(*_raw(entry, _get(path + "?text=" + "a" * 100_000)), 414, "url_too_long", S.max_url_bytes)
    deadline = time.monotonic() + 10  # the line is written once the answer has gone out
    while len(_access_lines(entry)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    (line,) = _access_lines(entry)[before:]
    assert {"path": path, "status": 414}.items() <= line.items()  # the access log saw it too


def _access_lines(server) -> list[dict]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith('{"ts"')]


def test_a_long_path_gets_a_json_414_too(entry):
    _assert_readable_error(*_raw(entry, _get("/" + "p" * 70_000)), 414, "url_too_long", S.max_url_bytes)


def test_the_url_limit_is_exact(entry):
    prefix = "/healthz?pad="
    at_limit = prefix + "a" * (S.max_url_bytes - len(prefix))
    assert len(at_limit.encode()) == S.max_url_bytes
    status, _, body = _raw(entry, _get(at_limit))
    assert status == 200 and json.loads(body)["status"] == "ok"
    _assert_readable_error(*_raw(entry, _get(at_limit + "a")), 414, "url_too_long", S.max_url_bytes)


# ------------------------------------------------------------------ EXPLORER_BLAS_THREADS


def _default_blas_threads() -> int:
    """What BLAS would use in a fresh process on this machine without the setting."""
    probe = "import json, numpy, threadpoolctl; print(json.dumps(threadpoolctl.threadpool_info()))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return max(lib["num_threads"] for lib in json.loads(out) if lib["user_api"] == "blas")


def test_blas_threads_setting_takes_effect_in_the_server_process(tmp_path):
    default = _default_blas_threads()
    wanted = 1 if default > 1 else 2  # differs from the default, so the setting is what we see
    report = tmp_path / "blas.json"
    env = {
        "EXPLORER_BLAS_THREADS": str(wanted),
        "EXPLORER_ACCESS_LOG": "false",
        "PYTHONPATH": str(BLAS_REPORT_DIR),
        "BLAS_REPORT_FILE": str(report),
    }
    with liveserver.live_server(env=env, entry_point=True) as server:
        r = httpx.post(server.url + RUN, json={"model": "toy", "text": "the cat sat on the mat"}, timeout=60)
        assert r.status_code == 200
    assert report.exists(), f"no report: the server exited with {server.returncode}"
    blas = [lib for lib in json.loads(report.read_text()) if lib["user_api"] == "blas"]
    assert blas, "the server process had no BLAS library loaded"
    assert {lib["num_threads"] for lib in blas} == {wanted}, (default, blas)
