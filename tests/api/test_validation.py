"""Bad input answers 422 (404/413 where that is the word) with a message a learner can act on;
every size a request can choose has an upper bound stated in the OpenAPI."""

import json

import pytest

from app.settings import get_settings

from .conftest import messages

S = get_settings()


@pytest.mark.parametrize(
    "url,status,fragment",
    [
        ("/api/v1/lessons/multihead?n_heads=3", 422, "d_model=8 is not divisible by n_heads=3"),
        ("/api/v1/lessons/attention?text=%20%20%20", 422, "text: the text is empty or only spaces"),
        ("/api/v1/lessons/attention?text=", 422, "text: String should have at least 1 character"),
        ("/api/v1/lessons/attention?d_model=0", 422, "d_model: Input should be greater than or equal to 1"),
        (
            f"/api/v1/lessons/attention?d_model={S.max_d_model + 1}",
            422,
            f"d_model: Input should be less than or equal to {S.max_d_model}",
        ),
        ("/api/v1/lessons/attention?seed=-1", 422, "seed: Input should be greater than or equal to 0"),
        ("/api/v1/lessons/attention?causal=maybe", 422, "causal: Input should be a valid boolean"),
        ("/api/v1/lessons/attention?dmodel=8", 422, "dmodel: is not a field this endpoint accepts"),
        ("/api/v1/lessons/scaling?dims=4,,5", 422, "dims: String should match pattern"),
        ("/api/v1/lessons/scaling?dims=0", 422, "dims must each lie in 1"),
        (
            f"/api/v1/lessons/scaling?dims={','.join(['4'] * (S.max_dims + 1))}",
            422,
            f"more than the limit of {S.max_dims}",
        ),
        ("/api/v1/lessons/positions?d=15", 422, "sinusoidal encodings need an even width"),
        ("/api/v1/lessons/positions?pairs=1:60", 422, "position pair (1, 60) lies outside 0..49"),
        ("/api/v1/lessons/forward?prompt=xyz", 422, "characters 'xyz' are not in the vocabulary"),
        ("/api/v1/lessons/forward?d_model=10&n_heads=4", 422, "d_model=10 is not divisible by n_heads=4"),
        ("/api/v1/params?preset=gpt-5", 422, "preset: Input should be 'toy', 'gpt2-small'"),
        ("/api/v1/kv-cache?dtype=int4", 422, "dtype: Input should be 'float32', 'float16', 'bfloat16' or 'int8'"),
        ("/api/v1/kv-cache?d_model=100&n_heads=3", 422, "d_model=100 is not divisible by n_heads=3"),
        ("/api/v1/hooks?model=bert-huge", 422, "unknown model 'bert-huge'"),
        ("/api/v1/no-such-thing", 404, "is not an endpoint of this server"),
    ],
)
def test_get_errors(client, url, status, fragment):
    r = client.get(url)
    assert r.status_code == status, r.text
    assert fragment in messages(r)


@pytest.mark.parametrize(
    "body,fragment",
    [
        ("{not json", "the body is not valid JSON"),
        ("[1, 2]", "Input should be a valid dictionary"),
        ('{"text": "a", "temperature": NaN}', "temperature: Input should be a finite number"),
        ('{"text": "a", "temperature": Infinity}', "temperature: Input should be a finite number"),
        ('{"text": "a", "temperature": 0}', "temperature: Input should be greater than 0"),
        ('{"text": "a", "seed": NaN}', "seed:"),
        ('{"text": "a", "n_heads": 2.5}', "n_heads: Input should be a valid integer"),
        ('{"text": "   \\n "}', "text: the text is empty or only spaces"),
        ('{"text": ""}', "text: String should have at least 1 character"),
        ('{"text": "\\ud800"}', "text: contains an unpaired UTF-16 surrogate"),
        ('{"model": "toy"}', "text: Field required"),
        ('{"text": "a", "hookz": []}', "hookz: is not a field this endpoint accepts"),
        ('{"text": "a", "hooks": "hook_embed"}', "hooks: Input should be a valid list"),
        ('{"text": "a", "positional_embedding_type": "alibi"}', "positional_embedding_type: Input should be 'none'"),
        (
            json.dumps({"text": "a", "top_k": S.max_top_k + 1}),
            f"top_k: Input should be less than or equal to {S.max_top_k}",
        ),
        (
            json.dumps({"text": "a", "n_layers": S.max_layers + 1}),
            f"n_layers: Input should be less than or equal to {S.max_layers}",
        ),
        (
            json.dumps({"text": "a", "hooks": ["hook_embed"] * (S.max_hooks + 1)}),
            f"hooks: List should have at most {S.max_hooks}",
        ),
        (json.dumps({"text": "a" * (S.max_text_chars + 1)}), f"text: String should have at most {S.max_text_chars}"),
    ],
)
def test_run_body_errors(client, body, fragment):
    r = client.post("/api/v1/run", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert fragment in messages(r)


class TestCostLimits:
    def test_too_many_tokens(self, client):
        # the toy has one token per character; more than max_tokens characters but under the character limit
        r = client.post("/api/v1/run", json={"model": "toy", "text": "a" * (S.max_tokens + 1)})
        assert r.status_code == 422
        assert f"has {S.max_tokens + 1:,} tokens, more than the limit of {S.max_tokens:,}" in messages(r)

    def test_too_much_work(self, client):
        r = client.post(
            "/api/v1/run", json={"model": "toy", "text": "a" * 1000, "d_model": S.max_d_model, "n_layers": S.max_layers}
        )
        assert r.status_code == 422
        assert "reduce d_model or n_layers" in messages(r) or "multiply-adds" in messages(r)

    def test_work_limit_names_what_to_reduce(self, client):
        r = client.post("/api/v1/run", json={"model": "toy", "text": "a" * 1000, "d_model": 128, "n_layers": 6})
        assert r.status_code == 422
        assert "multiply-adds, more than this server's limit" in messages(r) and "reduce" in messages(r)

    def test_too_many_parameters(self, client):
        r = client.post(
            "/api/v1/run", json={"model": "toy", "text": "a", "d_model": S.max_d_model, "n_layers": S.max_layers}
        )
        assert r.status_code == 422
        assert f"more than the limit of {S.max_params:,}: reduce d_model or n_layers" in messages(r)

    def test_too_many_returned_numbers(self, client):
        r = client.post(
            "/api/v1/run", json={"model": "toy", "text": "a" * 1024, "hooks": ["blocks.0.attn.hook_pattern"]}
        )
        assert r.status_code == 422
        assert f"4,194,304 numbers, more than the limit of {S.max_hook_values:,}" in messages(r)

    def test_scaling_lesson_is_bounded(self, client):
        r = client.get("/api/v1/lessons/scaling", params={"dims": "4096", "n_queries": 100_000, "n_keys": 1024})
        assert r.status_code == 422 and "reduce n_queries, n_keys or the dims" in messages(r)

    def test_too_many_words(self, client):
        r = client.get("/api/v1/lessons/attention", params={"text": "a " * (S.max_tokens + 1)})
        assert r.status_code == 422 and "more than the limit" in messages(r)


class TestBodySize:
    def test_declared_length_over_the_limit(self, client):
        body = json.dumps({"text": "a" * S.max_body_bytes})
        r = client.post("/api/v1/run", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert f"limit of {S.max_body_bytes:,} bytes" in messages(r)

    def test_chunked_body_over_the_limit(self, client):
        def chunks():
            yield b'{"text": "'
            for _ in range(S.max_body_bytes // 1000 + 1):
                yield b"a" * 1000
            yield b'"}'

        r = client.post("/api/v1/run", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413

    def test_chunked_body_under_the_limit_still_runs(self, client):
        def chunks():
            yield b'{"model": "toy", '
            yield b'"text": "abc"}'

        r = client.post("/api/v1/run", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["tokens"] == ["a", "b", "c"]


def _bounded(schema: dict, components: dict) -> bool:
    """Does this JSON schema put an upper bound on its size (number, string, array)?"""
    if "$ref" in schema:
        return _bounded(components[schema["$ref"].rsplit("/", 1)[1]], components)
    if "anyOf" in schema:
        return all(_bounded(s, components) for s in schema["anyOf"])
    kind = schema.get("type")
    if "enum" in schema or "const" in schema or kind in ("boolean", "null"):
        return True
    if kind in ("integer", "number"):
        return "maximum" in schema or "exclusiveMaximum" in schema
    if kind == "string":
        return "maxLength" in schema or "pattern" in schema
    if kind == "array":
        return "maxItems" in schema and _bounded(schema.get("items", {}), components)
    if kind == "object":
        return all(_bounded(p, components) for p in schema.get("properties", {}).values())
    return False


def test_every_request_size_has_a_documented_upper_bound(client):
    spec = client.get("/openapi.json").json()
    components = spec["components"]["schemas"]
    checked = 0
    for path, ops in spec["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for op in ops.values():
            for p in op.get("parameters", []):
                assert _bounded(p["schema"], components), (path, p["name"])
                checked += 1
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                assert _bounded(body, components), path
                checked += 1
    assert checked > 30


def test_openapi_documents_models_and_examples(client):
    spec = client.get("/openapi.json").json()
    run = spec["paths"]["/api/v1/run"]["post"]
    assert run["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RunResponse"
    }
    assert "422" in run["responses"] and "413" in run["responses"]
    request = spec["components"]["schemas"]["RunRequest"]
    assert request["additionalProperties"] is False and request["examples"]
    for path in ("attention", "scaling", "multihead", "positions", "forward"):
        assert spec["paths"][f"/api/v1/lessons/{path}"]["get"]["responses"]["200"]["content"]["application/json"][
            "schema"
        ]
