"""`steer` on POST /api/v1/run and /api/v1/generate, and POST /api/v1/analysis/steering-vector (issue 34, items 5
and 6): the steered hooks are the unsteered ones pushed as the formulas say, a zero push changes nothing, the same
seed draws the same numbers, and every steer that does not fit is a 422 saying why, in English and in Malay.

The SAEs are written in the test (core.sae.save_sae, random weights) under a temporary EXPLORER_SAES_DIR: one on
the induction model's blocks.0.hook_resid_post, one on the toy's."""

from __future__ import annotations

import numpy as np
import pytest

from core.sae import SAE, SAEConfig, save_sae

from .conftest import messages

HOOK = "blocks.0.hook_resid_post"
D, D_SAE = 64, 48
TEXT = "ali makan nasi. ali makan"


def _sae(model: str = "induction", hook: str = HOOK) -> SAE:
    rng = np.random.default_rng(5)
    cfg = SAEConfig.from_dict(
        {"architecture": "standard", "d_in": D, "d_sae": D_SAE, "metadata": {"hook_name": hook, "model_name": model}}
    )
    return SAE(
        cfg,
        W_enc=rng.normal(0, 0.3, (D, D_SAE)).astype(np.float32),
        b_enc=rng.normal(0.1, 0.1, D_SAE).astype(np.float32),
        W_dec=rng.normal(0, 0.3, (D_SAE, D)).astype(np.float32),
        b_dec=rng.normal(0, 0.1, D).astype(np.float32),
    )


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    root = tmp_path_factory.mktemp("saes")
    save_sae(_sae(), root / "resid0")
    save_sae(_sae(model="toy"), root / "for-toy")
    settings = Settings(saes_dir=root, runs_dir=tmp_path_factory.mktemp("runs"))
    with TestClient(create_app(settings), raise_server_exceptions=True) as c:
        yield c


VECTOR = np.random.default_rng(0).standard_normal(D)


def _run(api, steer=None, hooks=(HOOK, "blocks.1.hook_resid_pre"), **fields):
    body = {"model": "induction", "text": TEXT, "hooks": list(hooks), "top_k": 5, **fields}
    if steer is not None:
        body["steer"] = steer
    r = api.post("/api/v1/run", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _hook(body, name=HOOK) -> np.ndarray:
    return np.asarray(body["hooks"][name], dtype=np.float64)


def test_an_added_vector_is_in_the_stream_at_its_positions(api):
    plain = _run(api)
    steered = _run(api, [{"hook": HOOK, "vector": VECTOR.tolist(), "coefficient": 3.0, "positions": [1, -1]}])
    want = _hook(plain)
    want[[1, -1]] += 3.0 * VECTOR
    np.testing.assert_allclose(_hook(steered), want, rtol=0, atol=1e-4)
    # the next block reads it: its input is the pushed stream, and the prediction moves
    np.testing.assert_allclose(_hook(steered, "blocks.1.hook_resid_pre"), want, rtol=0, atol=1e-4)
    assert steered["steering_effect"]["baseline_top_k"] == plain["top_k"]
    assert any(abs(c["delta"]) > 1e-3 for c in steered["steering_effect"]["changes"])


def test_a_feature_adds_its_decoder_row_and_a_clamp_sets_its_activation(api):
    sae = _sae()
    plain = _hook(_run(api))
    added = _run(api, [{"hook": HOOK, "feature": {"sae": "resid0", "index": 5}, "coefficient": 2.0}])
    np.testing.assert_allclose(_hook(added), plain + 2.0 * sae.W_dec[5], rtol=0, atol=1e-4)
    clamped = _run(api, [{"hook": HOOK, "feature": {"sae": "resid0", "index": 5}, "coefficient": 4.0, "mode": "clamp"}])
    # the SAE's reconstruction with a_5 = 4, plus its error: x + (4 - a_5(x)) W_dec[5]
    a5 = sae.encode(plain.astype(np.float32))[:, 5].astype(np.float64)
    np.testing.assert_allclose(_hook(clamped), plain + (4.0 - a5)[:, None] * sae.W_dec[5], rtol=0, atol=1e-4)
    assert np.abs(4.0 - a5).max() > 0.5


def test_a_vector_clamp_sets_the_component_along_it(api):
    body = _run(api, [{"hook": HOOK, "vector": VECTOR.tolist(), "coefficient": -1.5, "mode": "clamp"}])
    along = _hook(body) @ VECTOR / (VECTOR @ VECTOR)
    np.testing.assert_allclose(along, -1.5, rtol=0, atol=1e-4)


@pytest.mark.parametrize("frozen", [False, True])
def test_a_zero_push_changes_nothing(api, frozen):
    plain = _run(api, hooks=["blocks.1.attn.hook_pattern"])
    steer = [{"hook": "blocks.0.hook_resid_pre", "vector": VECTOR.tolist(), "coefficient": 0.0}]
    zero = _run(api, steer, hooks=["blocks.1.attn.hook_pattern"], frozen_attention=frozen)
    assert [t["id"] for t in zero["top_k"]] == [t["id"] for t in plain["top_k"]]
    np.testing.assert_allclose([t["prob"] for t in zero["top_k"]], [t["prob"] for t in plain["top_k"]], atol=1e-6)


def test_frozen_attention_returns_the_unsteered_patterns_it_used(api):
    name = "blocks.1.attn.hook_pattern"
    steer = [{"hook": HOOK, "vector": VECTOR.tolist(), "coefficient": 6.0}]
    plain = _run(api, hooks=[name])
    frozen = _run(api, steer, hooks=[name], frozen_attention=True)
    recomputed = _run(api, steer, hooks=[name])
    np.testing.assert_allclose(_hook(frozen, name), _hook(plain, name), rtol=0, atol=1e-6)
    assert np.abs(_hook(recomputed, name) - _hook(plain, name)).max() > 1e-3
    assert frozen["top_k"] != recomputed["top_k"]


def _generate(api, steer=None, **fields):
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 6, "temperature": 0, **fields}
    if steer is not None:
        body["steer"] = steer
    r = api.post("/api/v1/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_steered_generation_differs_and_a_zero_push_writes_the_same_text(api):
    plain = _generate(api)
    zero = _generate(api, [{"hook": HOOK, "vector": VECTOR.tolist(), "coefficient": 0.0}], frozen_attention=True)
    assert zero["generated"]["ids"] == plain["generated"]["ids"]
    pushed = [{"hook": HOOK, "vector": VECTOR.tolist(), "coefficient": 8.0}]
    recomputed, frozen = _generate(api, pushed), _generate(api, pushed, frozen_attention=True)
    assert recomputed["generated"]["ids"] != plain["generated"]["ids"]
    assert [len(s["attention"][0][0]) for s in frozen["steps"]] == [len(TEXT) - 1 + i + 1 for i in range(6)]


def test_the_same_seed_draws_the_same_numbers_steered_or_not(api):
    pushed = [{"hook": HOOK, "vector": VECTOR.tolist(), "coefficient": 8.0}]
    plain = _generate(api, temperature=1.0, seed=4)
    steered = _generate(api, pushed, temperature=1.0, seed=4)
    assert [s["u"] for s in plain["steps"]] == [s["u"] for s in steered["steps"]]


def test_a_steering_vector_is_the_difference_of_the_means(api):
    a, b = ["ali makan nasi", "ali makan"], ["nasi lemak sedap sekali"]
    r = api.post(
        "/api/v1/analysis/steering-vector", json={"model": "induction", "hook": HOOK, "texts_a": a, "texts_b": b}
    )
    assert r.status_code == 200, r.text
    body = r.json()

    def acts(texts):
        return np.concatenate([_hook(_run(api, hooks=[HOOK], text=t)) for t in texts])

    want = acts(a).mean(axis=0) - acts(b).mean(axis=0)
    np.testing.assert_allclose(body["vector"], want, rtol=0, atol=1e-5)
    assert body["tokens_a"] == len("ali makan nasi") + len("ali makan") and body["tokens_b"] == len(b[0])
    assert body["norm"] == pytest.approx(np.linalg.norm(want), abs=1e-4)


BAD = {
    "wrong vector length": (
        {"steer": [{"hook": HOOK, "vector": [1.0] * 3, "coefficient": 1}]},
        "steer[0]: the vector has 3 numbers",
        "steer[0]: vektor",
    ),
    "unknown SAE": (
        {"steer": [{"hook": HOOK, "feature": {"sae": "nope", "index": 0}, "coefficient": 1}]},
        "unknown SAE 'nope'",
        "SAE 'nope'",
    ),
    "feature index out of range": (
        {"steer": [{"hook": HOOK, "feature": {"sae": "resid0", "index": D_SAE}, "coefficient": 1}]},
        f"feature {D_SAE} is not in SAE 'resid0': it has features 0 to {D_SAE - 1}",
        f"ciri {D_SAE}",
    ),
    "an SAE of another model": (
        {"steer": [{"hook": HOOK, "feature": {"sae": "for-toy", "index": 0}, "coefficient": 1}]},
        "SAE 'for-toy' reads model 'toy', not 'induction'",
        "'toy'",
    ),
    "an SAE of another hook": (
        {"steer": [{"hook": "blocks.1.hook_resid_pre", "feature": {"sae": "resid0", "index": 0}, "coefficient": 1}]},
        f"SAE 'resid0' reads {HOOK}, not blocks.1.hook_resid_pre",
        "blocks.1.hook_resid_pre",
    ),
    "too many steers": (
        {"steer": [{"hook": HOOK, "vector": [0.0] * D, "coefficient": 1}] * 9},
        "steer: List should have at most 8 items",
        "paling banyak 8",
    ),
    "coefficient out of bounds": (
        {"steer": [{"hook": HOOK, "vector": [0.0] * D, "coefficient": 1001}]},
        "steer[0].coefficient: Input should be less than or equal to 1000",
        "1000",
    ),
    "neither vector nor feature": (
        {"steer": [{"hook": HOOK, "coefficient": 1}]},
        "give either a vector or a feature",
        "vektor",
    ),
    "a position past the text": (
        {"steer": [{"hook": HOOK, "vector": [0.0] * D, "coefficient": 1, "positions": [99]}]},
        "steer[0]: pos=99 is outside the text's",
        "pos=99",
    ),
    "a hook that is not the residual stream": (
        {"steer": [{"hook": "blocks.0.attn.hook_z", "vector": [0.0] * D, "coefficient": 1}]},
        "'blocks.0.attn.hook_z' cannot be steered",
        "blocks.0.attn.hook_z",
    ),
    "steer with ablate": (
        {"steer": [{"hook": HOOK, "vector": [0.0] * D, "coefficient": 1}], "ablate": [{"layer": 0, "head": 0}]},
        "steer and ablate cannot be combined",
        "steer",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("path", ["/api/v1/run", "/api/v1/generate"])
def test_a_steer_that_does_not_fit_is_a_422_saying_why_in_both_languages(api, case, path):
    fields, english, malay = BAD[case]
    if path.endswith("generate") and "ablate" in fields:
        pytest.skip("a generation takes no ablations")
    body = {"model": "induction", "text": TEXT, **fields}
    r = api.post(path, json=body)
    assert r.status_code == 422, r.text
    assert english in messages(r)
    assert "extra" not in r.text  # a known field, refused for its value
    ms = api.post(path, json=body, headers={"Accept-Language": "ms"})
    assert ms.status_code == 422 and malay in messages(ms)
    assert messages(ms) != messages(r)


def test_the_schema_states_the_limits(api):
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    for request in ("RunRequest", "GenerateRequest"):
        assert schemas[request]["properties"]["steer"]["maxItems"] == 8
    steer = schemas["SteerItem"]["properties"]
    assert steer["coefficient"]["maximum"] == 1000 and steer["coefficient"]["minimum"] == -1000
    assert schemas["SteeringVectorRequest"]["properties"]["texts_a"]["maxItems"] == 32


def test_a_steering_vector_refuses_what_it_cannot_average(api):
    r = api.post(
        "/api/v1/analysis/steering-vector",
        json={"model": "induction", "hook": "blocks.0.attn.hook_z", "texts_a": ["a"], "texts_b": ["b"]},
    )
    assert r.status_code == 422 and "cannot be steered" in messages(r)
    r = api.post(
        "/api/v1/analysis/steering-vector",
        json={"model": "induction", "hook": HOOK, "texts_a": ["a"] * 33, "texts_b": ["b"]},
    )
    assert r.status_code == 422 and "texts_a" in messages(r)
