"""Every EXPLORER_* setting, changed, takes effect.

Request-time limits come from the settings dependency (app/deps.py): an app created with other
settings (create_app(Settings(...)), which overrides the dependency), or whose dependency is overridden,
refuses past them. The limits the request models state are read from those same injected settings when
a request is validated and when the OpenAPI is written (app/api/requests.py `Limit`), so the two agree;
the environment's are also checked in a fresh interpreter, as a deployment sets them. Process settings (host, port,
workers, log level) are checked on `python -m app` itself. (EXPLORER_BLAS_THREADS:
tests/security/test_http_edge.py;
EXPLORER_MAX_CONCURRENT_COMPUTE, EXPLORER_COMPUTE_QUEUE_S and EXPLORER_RETRY_AFTER_S: tests/security/test_compute_limit.py
and test_compute_queue.py;
EXPLORER_ACCESS_LOG: tests/deploy/test_access_log.py; EXPLORER_MAX_URL_BYTES: tests/security/test_http_edge.py;
EXPLORER_RUNS_DIR, _TRAIN_WORKERS, _TRAIN_MAX_PER_CLIENT, _TRAIN_MAX_RUNS, _RUNS_MAX_MB: tests/api/test_training.py.)
"""

from __future__ import annotations

import html
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.models.pretrained import minilm_folder
from app.settings import Settings, get_settings

from .conftest import half_precision_copy, messages

REPO = Path(__file__).resolve().parents[2]
FAMILIES = REPO / "tests" / "fixtures" / "families"
TOY = {"model": "toy", "text": "Ali makan"}


def test_every_setting_is_covered_here_or_named():
    """A new setting needs a test: this file's cases (or the file named in its docstring) cover each."""
    covered = {
        "max_tokens",
        "max_work",
        "max_elements",
        "max_params",
        "max_hook_values",
        "explorer_max_tokens",
        "explorer_max_values",
        "lesson_max_tokens",
        "max_body_bytes",
        "pretrained_memory_mb",
        "models_dir",
        "host",
        "port",
        "workers",
        "log_level",
        "max_pretrained_work",
    }
    covered |= set(SCHEMA_LIMITS)
    elsewhere = {
        "blas_threads",
        "lend_threads",  # tests/security/test_compute_limit.py, and below
        "max_concurrent_compute",
        "compute_queue_s",
        "retry_after_s",
        "access_log",
        "max_url_bytes",
        "runs_dir",
        "train_workers",
        "train_max_per_client",
        "train_max_runs",
        "runs_max_mb",
        "default_model",  # tests/pages/test_default_model.py
        "generate_max_values",  # tests/api/test_generate.py
        "patching_max_passes",
        "ov_max_sources",  # tests/api/test_circuits.py
        "redis_url",
        "redis_ca",  # tests/scale/test_redis_down.py (TLS), tests/deploy/test_readyz.py
        "train_pickup_s",
        "metrics",
        "class_idle_s",  # tests/api/test_classes.py, tests/scale/test_classes.py
        "class_max_students",
        "class_max_wrong_codes",
        "saes_dir",  # tests/api/test_saes.py, tests/browser/test_features.py
        "sae_scan_max_tokens",
    }  # tests/scale/ (Redis, Celery workers, /metrics)
    assert set(Settings.model_fields) == covered | elsewhere


def test_lent_threads_are_the_cpus_shared_by_the_workers_unless_set():
    import os

    from app.settings import lent_threads
    from core.threads import MAX_WIDTH

    cpus = len(os.sched_getaffinity(0))
    assert lent_threads(Settings()) == max(1, min(MAX_WIDTH, cpus))
    assert lent_threads(Settings(workers=cpus + 1)) == 1  # more workers than CPUs: nothing to lend
    assert lent_threads(Settings(lend_threads=1, workers=1)) == 1  # 1: never more than blas_threads
    assert lent_threads(Settings(lend_threads=3)) == 3


# ------------------------------------------------------------------ request-time limits (the dependency)


@pytest.mark.parametrize(
    ("setting", "value", "body", "says"),
    [
        ("max_tokens", 5, TOY, "more than the limit of 5"),
        ("max_work", 10_000, TOY, "more than this server's limit of 10,000"),
        ("max_elements", 100, TOY, "more than this server's limit of 100"),
        ("max_params", 1_000, TOY, "more than the limit of 1,000"),
        ("max_hook_values", 100, TOY | {"hooks": ["blocks.0.attn.hook_pattern"]}, "more than the limit of 100"),
    ],
)
def test_request_limits_follow_the_settings(client, client_with, setting, value, body, says):
    assert client.post("/api/v1/run", json=body).status_code == 200  # fine with the defaults
    r = client_with(**{setting: value}).post("/api/v1/run", json=body)
    assert r.status_code == 422 and says in messages(r)


def test_explorer_max_tokens_limits_the_pages(client, client_with):
    assert client.get("/", params={"text": "abcd"}).status_code == 200
    small = client_with(explorer_max_tokens=3)
    r = small.get("/", params={"text": "abcd"})
    assert r.status_code == 422 and "the explorer draws up to 3" in r.text
    assert "Up to 3 tokens." in small.get("/", params={"text": "abc"}).text  # the text box says so
    assert small.get("/lessons/attention", params={"text": "a b c d"}).status_code == 200  # lessons: their own
    r = client_with(lesson_max_tokens=3).get("/lessons/attention", params={"text": "a b c d"})
    assert r.status_code == 422 and "this page draws up to 3" in r.text
    assert small.post("/api/v1/run", json={**TOY, "text": "abcd"}).status_code == 200  # the API is not a page


def test_explorer_max_values_bounds_what_one_view_keeps(client_with):
    # the toy (2 layers, 4 heads of 16, d_model 64) at 40 tokens keeps layer 0's q, k, and the cell panel's
    # v and z (4 × 40 × 64), scores and pattern (2 × 4 × 40²) and 11 residual hooks (embeddings, 5 per layer)
    # of 40 × 64
    kept = 4 * 40 * 64 + 2 * 4 * 40**2 + 11 * 40 * 64
    r = client_with(explorer_max_values=kept - 1).get("/", params={"text": "a" * 40, "model": "toy"})
    assert r.status_code == 422
    assert (
        f"keep {kept:,} numbers (40 tokens, 2 layers, 4 heads), more than this server's limit of {kept - 1:,}"
        in html.unescape(r.text)
    )
    assert client_with(explorer_max_values=kept).get("/", params={"text": "a" * 40, "model": "toy"}).status_code == 200


def test_explorer_max_values_sets_the_text_limit_a_checkpoint_states(client_with):
    """A model of fixed sizes (here the trained python-docs: 2 layers, 4 heads, d_model 96, context 128)
    gets the longest text whose view fits as its limit, stated by the text box before anyone types."""

    def kept(n):  # as above: q, k, v and z, scores and pattern, 11 residual hooks
        return 4 * n * 96 + 2 * 4 * n**2 + 11 * n * 96

    client = client_with(explorer_max_values=kept(100))  # kept(101) is more
    page = client.get("/", params={"model": "python-docs", "text": "e" * 100})
    assert page.status_code == 200 and "Up to 100 tokens." in page.text
    r = client.get("/", params={"model": "python-docs", "text": "e" * 101})
    assert r.status_code == 422
    assert (
        f"the text has 101 tokens; the explorer draws up to 100 (a longer text's view of python-docs would keep "
        f"more than this server's limit of {kept(100):,} numbers)"
    ) in html.unescape(r.text)
    # the default limit is the model's context
    assert "Up to 128 tokens." in client_with().get("/", params={"model": "python-docs"}).text


def test_max_body_bytes_sets_the_413(client_with):
    c = client_with(max_body_bytes=2048)
    assert c.post("/api/v1/run", json={**TOY, "text": "a" * 900}).status_code == 200
    r = c.post("/api/v1/run", json={**TOY, "text": "a" * 2100})
    assert r.status_code == 413 and "2,048 bytes" in messages(r)


@pytest.fixture(scope="module")
def half_minilm(tmp_path_factory) -> Path:
    """An EXPLORER_MODELS_DIR holding MiniLM stored as float16: 87 MB once upcast, in the worker's own memory."""
    models = tmp_path_factory.mktemp("models")
    half_precision_copy(minilm_folder(), models / "minilm-half")
    return models


def test_pretrained_memory_budget(client_with, half_minilm):
    body = {"model": "minilm-half", "text": "hi"}
    assert client_with(models_dir=half_minilm).post("/api/v1/run", json=body).status_code == 200
    small = client_with(models_dir=half_minilm, pretrained_memory_mb=80)
    r = small.post("/api/v1/run", json=body)
    assert r.status_code == 422 and "EXPLORER_PRETRAINED_MEMORY_MB" in messages(r) and "80.0 MB" in messages(r)
    # the float32 original is memory-mapped, shared rather than this worker's own: the budget does not charge it
    assert small.post("/api/v1/run", json={"model": "all-MiniLM-L6-v2", "text": "hi"}).status_code == 200


def test_max_pretrained_work_prices_loaded_models_apart_from_toys(client_with):
    models = FAMILIES  # tests/fixtures/families: its subfolders are checkpoints
    llama = {"model": "llama-gqa", "text": "The cat sat on the mat"}
    tight = client_with(models_dir=models, max_pretrained_work=10_000)
    r = tight.post("/api/v1/run", json=llama)
    assert r.status_code == 422 and "limit of 10,000 for a pretrained model" in messages(r)
    assert tight.post("/api/v1/run", json=TOY).status_code == 200  # a toy's limit is max_work
    toys_tight = client_with(models_dir=models, max_work=10_000)
    assert toys_tight.post("/api/v1/run", json=llama).status_code == 200
    assert toys_tight.post("/api/v1/run", json=TOY).status_code == 422


# ------------------------------------------------------------------ limits the request models state

# setting -> (value, the request just past it, the field the 422 names)
SCHEMA_LIMITS = {
    "max_text_chars": (10, ("POST", "/api/v1/run", {"text": "a" * 11}), "text"),
    "max_d_model": (8, ("POST", "/api/v1/run", {"text": "a", "d_model": 12}), "d_model"),
    "max_heads": (2, ("POST", "/api/v1/run", {"text": "a", "n_heads": 4}), "n_heads"),
    "max_layers": (2, ("POST", "/api/v1/run", {"text": "a", "n_layers": 3}), "n_layers"),
    "max_d_mlp": (32, ("GET", "/api/v1/lessons/forward", {"d_mlp": 33}), "d_mlp"),
    "max_top_k": (3, ("POST", "/api/v1/run", {"text": "a", "top_k": 4}), "top_k"),
    "max_hooks": (1, ("POST", "/api/v1/run", {"text": "a", "hooks": ["hook_embed"] * 2}), "hooks"),
    "max_dims": (2, ("GET", "/api/v1/lessons/scaling", {"dims": "4,8,16"}), "dims"),
    "max_queries": (10, ("GET", "/api/v1/lessons/scaling", {"n_queries": 11}), "n_queries"),
    "max_ablations": (
        1,
        ("POST", "/api/v1/run", {"text": "a", "ablate": [{"layer": 0, "head": 0}, {"layer": 0, "head": 1}]}),
        "ablate",
    ),
    "max_new_tokens": (2, ("POST", "/api/v1/analysis/kv-cache", {"text": "a", "n_new": 3}), "n_new"),
    "calc_max_width": (100, ("GET", "/api/v1/params", {"d_model": 101}), "d_model"),
    "calc_max_vocab": (100, ("GET", "/api/v1/params", {"d_vocab": 101}), "d_vocab"),
    "calc_max_ctx": (100, ("GET", "/api/v1/params", {"n_ctx": 101}), "n_ctx"),
    "calc_max_layers": (3, ("GET", "/api/v1/params", {"n_layers": 4}), "n_layers"),
    "calc_max_batch": (2, ("GET", "/api/v1/kv-cache", {"batch": 3}), "batch"),
    "train_max_text_chars": (50, ("POST", "/api/v1/train", {"recipe": "text", "text": "a" * 51}), "text"),
    "generate_max_new_tokens": (2, ("POST", "/api/v1/generate", {"text": "a", "max_new_tokens": 3}), "max_new_tokens"),
    "max_steers": (
        1,
        (
            "POST",
            "/api/v1/run",
            {"text": "ab", "steer": [{"hook": "blocks.0.hook_resid_pre", "vector": [0.0] * 64, "coefficient": 0}] * 2},
        ),
        "steer",
    ),
    "steer_max_texts": (
        1,
        (
            "POST",
            "/api/v1/analysis/steering-vector",
            {"hook": "blocks.0.hook_resid_pre", "texts_a": ["a", "b"], "texts_b": ["c"]},
        ),
        "texts_a",
    ),
}

PROBE = """
import json, sys
from fastapi.testclient import TestClient
from app.main import app
cases = json.loads(sys.argv[1])
out = {}
with TestClient(app) as c:
    for name, (method, path, fields) in cases.items():
        if method == "POST":
            r = c.post(path, json=fields if path.endswith("/train") else {"model": "toy", **fields})
        else:
            r = c.get(path, params=fields)
        out[name] = [r.status_code, [d["msg"] for d in r.json().get("detail", [])] if r.status_code == 422 else []]
    out["openapi"] = c.get("/openapi.json").json()
print(json.dumps(out))
"""


def send(client: TestClient, method: str, path: str, fields: dict):
    if method == "POST":
        return client.post(path, json=fields if path.endswith("/train") else {"model": "toy", **fields})
    return client.get(path, params=fields)


def refused_by(response, field: str) -> bool:
    return response.status_code == 422 and any(d["msg"].startswith(field) for d in response.json()["detail"])


def test_injected_settings_set_both_what_is_refused_and_what_the_openapi_states(client, client_with):
    """create_app(Settings(...)): every limit a request model states is the injected one, refused and stated
    alike, beside an app of the default settings in the same process (nothing is fixed at import)."""
    lowered = client_with(**{name: value for name, (value, _, _) in SCHEMA_LIMITS.items()}, max_body_bytes=2048)
    for name, (_, (method, path, fields), field) in SCHEMA_LIMITS.items():
        assert not refused_by(send(client, method, path, fields), field), name
        assert refused_by(send(lowered, method, path, fields), field), name
    for c, chars, layers, hooks, body in ((client, 4096, 12, 256, 65536), (lowered, 10, 2, 1, 2048)):
        schema = c.get("/openapi.json").json()
        run = schema["components"]["schemas"]["RunRequest"]["properties"]
        assert run["text"]["maxLength"] == chars and f"at most {chars:,} characters" in run["text"]["description"]
        assert run["n_layers"]["anyOf"][0]["maximum"] == layers and run["hooks"]["maxItems"] == hooks
        assert f"at most {hooks}," in run["hooks"]["description"]
        assert (
            schema["paths"]["/api/v1/run"]["post"]["responses"]["413"]["description"]
            == f"The body is over {body:,} bytes"
        )
        text = next(p for p in schema["paths"]["/api/v1/lessons/attention"]["get"]["parameters"] if p["name"] == "text")
        assert text["schema"]["maxLength"] == chars and f"{chars:,} characters" in text["description"]
    # the pages validate with the same models, and say so in their controls
    page = lowered.get("/", params={"model": "toy", "n_layers": 3})
    assert page.status_code == 422 and "n_layers: Input should be less than or equal to 2" in page.text
    assert 'id="n_layers" name="n_layers" value="3"' in page.text and 'max="2"' in page.text
    assert 'maxlength="50"' in lowered.get("/train", params={"recipe": "text"}).text


def test_a_settings_dependency_override_sets_both_too():
    """app.dependency_overrides[get_settings]: the request models follow it, and so does the OpenAPI (written
    again when the override changes)."""
    app = create_app()
    with TestClient(app) as c:
        body = {"model": "toy", "text": "a", "n_layers": 3}
        assert c.post("/api/v1/run", json=body).status_code == 200
        assert (
            c.get("/openapi.json").json()["components"]["schemas"]["RunRequest"]["properties"]["n_layers"]["anyOf"][0][
                "maximum"
            ]
            == 12
        )
        app.dependency_overrides[get_settings] = lambda: Settings(max_layers=2)
        assert refused_by(c.post("/api/v1/run", json=body), "n_layers")
        assert (
            c.get("/openapi.json").json()["components"]["schemas"]["RunRequest"]["properties"]["n_layers"]["anyOf"][0][
                "maximum"
            ]
            == 2
        )


def probe(env: dict[str, str], cases: dict) -> dict:
    """Run the cases in a fresh interpreter whose environment sets `env` (settings are read at import)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cases)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EXPLORER_ACCESS_LOG": "false", **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_request_model_limits_follow_the_environment():
    cases = {name: request for name, (_, request, _) in SCHEMA_LIMITS.items()}
    with_defaults = probe({}, cases)
    lowered = probe({f"EXPLORER_{name.upper()}": str(value) for name, (value, _, _) in SCHEMA_LIMITS.items()}, cases)
    for name, (_, _, field) in SCHEMA_LIMITS.items():
        assert with_defaults[name][0] != 422 or not any(m.startswith(field) for m in with_defaults[name][1]), name
        status, msgs = lowered[name]
        assert status == 422 and any(m.startswith(field) for m in msgs), (name, status, msgs)
    # and the OpenAPI states the new limits
    run = lowered["openapi"]["components"]["schemas"]["RunRequest"]["properties"]
    assert run["text"]["maxLength"] == 10 and run["hooks"]["maxItems"] == 1
    assert run["d_model"]["anyOf"][0]["maximum"] == 8 and run["n_layers"]["anyOf"][0]["maximum"] == 2


# ------------------------------------------------------------------ the process: host, port, workers, log level


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers(pid: int) -> list[int]:
    """uvicorn's worker processes: the supervisor's children started by multiprocessing's spawn (not
    its resource tracker)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(p) for p in path.read_text().split()] if path.exists() else []
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def test_python_m_app_serves_on_the_settings_host_port_and_workers(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "EXPLORER_HOST": "127.0.0.1",
        "EXPLORER_PORT": str(port),
        "EXPLORER_WORKERS": "2",
        "EXPLORER_LOG_LEVEL": "warning",
    }
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "app"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        for _ in range(4):
            assert httpx.get(f"http://127.0.0.1:{port}/api/v1/models", timeout=30).status_code == 200
        # uvicorn's supervisor runs the two workers as its children
        deadline = time.monotonic() + 30
        while len(workers(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers(proc.pid)) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    # log level warning: neither the access log nor uvicorn's info lines
    text = (tmp_path / "server.log").read_text()
    assert '"path": "/healthz"' not in text and "Uvicorn running" not in text, text
