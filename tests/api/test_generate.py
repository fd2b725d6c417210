"""POST /api/v1/generate through the app (the /generate page: tests/pages/test_generate_page.py): the
contract's fields, the stream equal to the JSON, the settings' limits stated in the OpenAPI and refused (422,
with the reason) before anything is computed, and a checkpoint's end-of-text, decoding and grouped-query heads.

Expected numbers come from core (tests/core/test_generate.py checks core against transformers) and from
the API's own /run for the same text.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.api.conftest import messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BODY = {
    "model": "toy",
    "text": "Ali makan nasi",
    "max_new_tokens": 8,
    "temperature": 0.8,
    "top_k": 20,
    "top_p": 0.9,
    "seed": 1,
}


def generate(client, **changes):
    r = client.post("/api/v1/generate", json=BODY | changes)
    assert r.status_code == 200, r.text
    return r.json()


def stream(client, body) -> list[tuple[str, dict]]:
    with client.stream("POST", "/api/v1/generate", json=body, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith("id: "))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_the_answer_has_the_contracts_fields(client):
    g = generate(client)
    assert g["tokens"] == list("Ali makan nasi") and g["finish_reason"] == "length"
    assert len(g["generated"]["ids"]) == len(g["steps"]) == 8
    assert g["generated"]["text"] == "".join(g["generated"]["tokens"])  # the toy's tokens are characters
    n, cfg = len(g["tokens"]), g["config"]
    for i, step in enumerate(g["steps"]):
        assert step["id"] == g["generated"]["ids"][i] and step["token"] == g["generated"]["tokens"][i]
        assert 0 < step["prob"] <= 1 and 0 < step["prob_after"] <= 1 and 0 <= step["u"] < 1
        attention = np.array(step["attention"])
        assert attention.shape == (cfg["n_layers"], cfg["n_heads"], n + i)  # every key so far
        np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-12)
        assert step["sink_heads"] == [
            {"layer": int(a), "head": int(b), "weight": attention[a, b, 0]}
            for a, b in zip(*np.nonzero(attention[:, :, 0] > g["sink_threshold"]))
        ]
        top = step["top"]
        assert step["stages"] == ["model", "temperature", "top_k", "top_p"]
        assert [c["rank"] for c in top[:20]] == list(range(20)) and step["id"] in [c["id"] for c in top]
        kept = [c for c in top if c["kept"]]
        assert len(kept) == step["kept_count"] and top[: len(kept)] == kept  # the cut-off is one line
        assert all(c["prob_before"] == c["probs"][0] and c["prob_after"] == c["probs"][-1] for c in top)
        assert all(c["cut_by"] in ("top_k", "top_p") and c["prob_after"] == 0 for c in top if not c["kept"])
        assert sum(c["prob_after"] for c in kept) == pytest.approx(1.0)
        assert step["cache_bytes"] == 2 * cfg["n_layers"] * cfg["n_key_value_heads"] * cfg["d_head"] * 8 * (n + i)


def test_the_same_seed_writes_the_same_text_and_another_seed_another(client):
    a, b, c = generate(client), generate(client), generate(client, seed=2)
    assert a["generated"] == b["generated"] and a["steps"][3]["u"] == b["steps"][3]["u"]
    assert c["generated"]["ids"] != a["generated"]["ids"] and c["seed"] == 2


def test_greedy_writes_the_explorers_prediction_first(client):
    g = generate(client, temperature=0, max_new_tokens=3)
    run = client.post("/api/v1/run", json={"model": "toy", "text": BODY["text"], "top_k": 1}).json()
    assert g["steps"][0]["id"] == run["top_k"][0]["id"]
    assert g["steps"][0]["prob"] == pytest.approx(run["top_k"][0]["prob"], abs=1e-12)
    assert all(s["u"] is None and s["stages"] == ["model", "greedy"] and s["kept_count"] == 1 for s in g["steps"])


def test_the_stream_is_the_json_step_by_step(client):
    whole = generate(client)
    events = stream(client, BODY)
    names = [name for name, _ in events]
    assert names == ["start"] + ["step"] * 8 + ["end"]
    start, end = events[0][1], events[-1][1]
    assert start["tokens"] == whole["tokens"] and start["settings"] == whole["settings"]
    assert "steps" not in start and "generated" not in start
    assert [data for name, data in events if name == "step"] == whole["steps"]
    assert end == {"finish_reason": whole["finish_reason"], "generated": whole["generated"]}


def test_a_stop_string_ends_the_generation(client):
    free = generate(client, max_new_tokens=20)["generated"]
    stop = free["text"][5:7]
    g = generate(client, max_new_tokens=20, stop=stop)
    tokens = g["generated"]["tokens"]
    # it ends with the token that completes the string (which may go on past it: a token is several characters)
    assert g["finish_reason"] == "stop" and g["steps"][-1]["stop"] and tokens == free["tokens"][: len(tokens)]
    assert stop in "".join(tokens) and stop not in "".join(tokens[:-1])


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"temperature": -0.5}, "temperature: Input should be greater than or equal to 0"),
        ({"top_p": 0}, "top_p: Input should be greater than 0"),
        ({"top_p": 1.2}, "top_p: Input should be less than or equal to 1"),
        ({"top_k": 0}, "top_k: Input should be greater than or equal to 1"),
        ({"max_new_tokens": 257}, "max_new_tokens: Input should be less than or equal to 256"),
        (
            {"max_new_tokens": 30, "text": "x" * 1000},
            "1000 tokens of text + max_new_tokens=30 exceed the model's context "
            "of n_ctx=1024 tokens: reduce max_new_tokens to at most 24",
        ),
        ({"model": "all-MiniLM-L6-v2", "text": "the cat"}, "is an encoder"),
        ({"model": "spec-forward", "text": "nasi "}, "no position left to write into"),
        ({"causal": False}, "generation needs causal attention"),
        ({"top_k": 500}, "top_k=500 is more than 'toy''s vocabulary of 96 tokens"),
    ],
)
def test_bad_input_is_a_422_with_the_reason(client, changes, says):
    for headers in ({}, {"Accept": "text/event-stream"}):  # refused before any stream begins
        r = client.post("/api/v1/generate", json=BODY | changes, headers=headers)
        assert r.status_code == 422 and says in messages(r), messages(r)


def test_the_limits_are_the_injected_settings_stated_in_the_openapi(client_with):
    small = client_with(generate_max_new_tokens=4, access_log=False)
    schema = small.get("/openapi.json").json()["components"]["schemas"]["GenerateRequest"]["properties"]
    assert schema["max_new_tokens"]["maximum"] == 4
    r = small.post("/api/v1/generate", json=BODY | {"max_new_tokens": 5})
    assert r.status_code == 422 and "less than or equal to 4" in messages(r)
    values = client_with(generate_max_values=100, access_log=False)
    r = values.post("/api/v1/generate", json=BODY)
    assert r.status_code == 422 and "attention weights" in messages(r) and "reduce max_new_tokens" in messages(r)


def test_the_whole_generation_is_priced_before_anything_is_computed(client_with):
    tight = client_with(max_work=5_000_000, access_log=False)  # the toy: 1.6 million for one token, 29 for 200
    r = tight.post("/api/v1/generate", json=BODY | {"max_new_tokens": 200})
    assert r.status_code == 422 and "multiply-adds" in messages(r) and "max_new_tokens" in messages(r)
    assert tight.post("/api/v1/generate", json=BODY | {"max_new_tokens": 1}).status_code == 200


def test_the_openapi_documents_the_stream(client):
    op = client.get("/openapi.json").json()["paths"]["/api/v1/generate"]["post"]
    assert "text/event-stream" in op["responses"]["200"]["content"]
    assert "PCG64" in op["description"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    models = tmp_path_factory.mktemp("models")
    for folder in ("gpt2-tiny", "families/llama-gqa"):
        shutil.copytree(FIXTURES / folder, models / Path(folder).name)
    with TestClient(create_app(Settings(models_dir=models, access_log=False))) as c:
        yield c


def test_a_checkpoint_stops_at_its_end_of_text_and_decodes_with_its_tokenizer(checkpoints):
    g = checkpoints.post(
        "/api/v1/generate",
        json={"model": "gpt2-tiny", "text": "The cat sat", "max_new_tokens": 20, "temperature": 1.5, "seed": 4},
    ).json()
    assert g["stop_ids"] == [0]  # config.json's eos_token_id
    tok = Tokenizer.from_file(str(FIXTURES / "gpt2-tiny" / "tokenizer.json"))
    assert g["generated"]["text"] == tok.decode(g["generated"]["ids"], skip_special_tokens=False)
    for seed in range(14, 54):  # a seed whose text reaches the end-of-text token (14 does): it is the last step
        g = checkpoints.post(
            "/api/v1/generate",
            json={"model": "gpt2-tiny", "text": "The", "max_new_tokens": 28, "temperature": 2.0, "seed": seed},
        ).json()
        if 0 in g["generated"]["ids"]:
            assert g["generated"]["ids"].index(0) == len(g["steps"]) - 1 and g["finish_reason"] == "stop"
            break
    else:
        pytest.fail("no seed reached the end-of-text token")


def test_grouped_query_heads_say_which_key_value_head_they_read(checkpoints):
    g = checkpoints.post(
        "/api/v1/generate", json={"model": "llama-gqa", "text": "The cat", "max_new_tokens": 3, "temperature": 0}
    ).json()
    assert g["kv_heads"] == [0, 0, 1, 1] and g["config"]["n_key_value_heads"] == 2
    assert np.array(g["steps"][0]["attention"]).shape[:2] == (2, 4)  # every query head
    assert g["steps"][0]["cache_bytes"] == 2 * 2 * 2 * 8 * 4 * len(g["tokens"])  # K and V of the 2 K/V heads


def test_a_client_that_leaves_ends_the_generation_on_the_server():
    """The page's Stop aborts its stream: the server computes (and sends) no further step. Checked on a real
    server's access log, by the bytes it sent for a stream left after two steps against the whole answer's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import liveserver

    body = BODY | {"text": "The", "max_new_tokens": 120, "d_model": 256, "n_layers": 8}  # ~10 ms a token
    with (
        liveserver.live_server(env={"EXPLORER_ACCESS_LOG": "true"}) as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        whole = len(http.post("/api/v1/generate", json=body).content)
        with http.stream("POST", "/api/v1/generate", json=body, headers={"Accept": "text/event-stream"}) as r:
            steps = 0
            for line in r.iter_lines():
                steps += line == "event: step"
                if steps == 2:
                    break
        for _ in range(100):  # the access line is written when the stream has ended
            lines = [json.loads(line) for line in server.log().splitlines() if '"path": "/api/v1/generate"' in line]
            if len(lines) == 2:
                break
            time.sleep(0.1)
    assert lines[1]["status"] == 200 and lines[1]["bytes"] < whole / 10, (lines[1], whole)
