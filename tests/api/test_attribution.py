"""POST /api/v1/analysis/attribution through JSON, on the GPT-2 fixture checkpoint served from EXPLORER_MODELS_DIR,
the Llama and GPT-NeoX family fixtures and the bundled toys.

Expected numbers come from core run directly on the same float32 weights (core/attribution.py is checked against
Captum and torch autograd in tests/core/test_attribution.py) and from invariants: direct logit parts sum to the
metric, integrated gradients' scores sum to metric − baseline_metric up to the reported delta, the metric is the
logit difference /run gives, the default target is the top prediction. Bad input: 422 saying why, in Malay too."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.models.catalog import build_catalog
from app.settings import get_settings
from core import attribution as A
from core.checkpoints import load_checkpoint

from .conftest import messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXT = "The cat sat on the mat."
ENCODER = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    shutil.copytree(FIXTURES / "gpt2-tiny", models / "gpt2-tiny")
    for name in ("llama-gqa", "gpt-neox-parallel"):
        shutil.copytree(FIXTURES / "families" / name, models / name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXPLORER_MODELS_DIR", str(models))
        get_settings.cache_clear()
        try:
            with TestClient(create_app(), raise_server_exceptions=True) as c:
                yield c
        finally:
            get_settings.cache_clear()
    get_settings.cache_clear()


def post(client, **body) -> dict:
    r = client.post("/api/v1/analysis/attribution", json={"model": "gpt2-tiny", "text": TEXT} | body)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def refused(client, headers=None, **body) -> str:
    r = client.post("/api/v1/analysis/attribution", json={"model": "gpt2-tiny", "text": TEXT} | body, headers=headers)
    assert r.status_code == 422, r.text[:500]
    return messages(r)


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient", "integrated_gradients", "occlusion"])
def test_scores_are_cores_on_the_served_weights(client, method):
    got = post(client, method=method, position=5, target=260, contrast=270, steps=8)
    ckpt = load_checkpoint(FIXTURES / "gpt2-tiny")
    ids = np.array(got["token_ids"])
    want = A.token_attribution(ckpt.params, ckpt.cfg, ids, 5, A.readout(ckpt.params, ckpt.cfg, 260, 270), method, 8)
    np.testing.assert_allclose(got["scores"], want.scores, rtol=1e-5, atol=1e-6)
    assert got["metric"] == pytest.approx(want.metric, abs=1e-5)
    assert got["baseline_metric"] == pytest.approx(want.baseline_metric, abs=1e-5)
    assert got["scores"][6:] == [0.0] * (len(ids) - 6)  # after the position: nothing under the causal mask
    assert (got["target"]["id"], got["contrast"]["id"], got["position"]) == (260, 270, 5)


def test_the_metric_is_the_logit_difference_run_gives_and_the_default_target_is_the_top_prediction(client):
    got = post(client, method="saliency")
    run = client.post("/api/v1/run", json={"model": "gpt2-tiny", "text": TEXT, "top_k": 1}).json()
    top = run["top_k"][0]
    assert got["target"]["id"] == top["id"] == got["predictions"][0]["id"]
    assert got["position"] == len(got["tokens"]) - 1
    contrast = post(client, method="saliency", contrast=got["predictions"][1]["id"])
    # logit(a) − logit(b) = log(p(a) / p(b))
    p = {t["id"]: t["prob"] for t in got["predictions"]}
    assert contrast["metric"] == pytest.approx(np.log(p[top["id"]] / p[got["predictions"][1]["id"]]), abs=1e-4)


def test_integrated_gradients_reports_its_completeness(client):
    got = post(client, method="integrated_gradients", steps=32)
    assert got["steps"] == 32
    gap = sum(got["scores"]) - (got["metric"] - got["baseline_metric"])
    assert got["convergence_delta"] == pytest.approx(gap, abs=1e-5)
    assert abs(got["convergence_delta"]) < 1e-3 * abs(got["metric"] - got["baseline_metric"])


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-gqa", "gpt-neox-parallel", "induction"])
def test_direct_logit_parts_sum_to_the_metric_on_every_family(client, model):
    body = {"model": model, "text": "Ali makan nasi lemak. Ali makan", "method": "direct_logit"}
    got = post(client, **body)
    heads = np.array(got["heads"])  # [layer][head][source]
    cfg = got["config"]
    assert heads.shape == (cfg["n_layers"], cfg["n_heads"], len(got["tokens"]))
    total = heads.sum() + sum(part["value"] for part in got["parts"])
    assert total == pytest.approx(got["metric"], abs=1e-4)
    np.testing.assert_allclose(got["scores"], heads.sum(axis=(0, 1)), atol=1e-5)
    assert got["baseline_metric"] is None and got["steps"] is None
    assert "final bias" in [part["label"] for part in got["parts"]]


def test_a_target_given_as_text_is_the_token_with_that_text(client):
    tokens = post(client, method="saliency")["tokens"]
    by_text = post(client, method="saliency", target=tokens[3])  # as the tokens are shown: '␣sat'
    by_id = post(client, method="saliency", target=by_text["target"]["id"])
    assert by_text["target"]["token"] == by_id["target"]["token"]
    assert by_text["scores"] == by_id["scores"]


def test_bad_input_says_why(client):
    assert "2 tokens" in refused(client, target=" cat")
    assert "is not in 'gpt2-tiny''s vocabulary" in refused(client, contrast=320)
    assert "the target itself" in refused(client, target=5, contrast=5)
    assert "outside the text's 9 tokens" in refused(client, position=9)
    assert "less than or equal to 512" in refused(client, steps=513)


@pytest.fixture
def rms_without_gradients(monkeypatch):
    """A backward pass that does not implement RMS norm, as core/backprop.py's was before every family."""
    from core import backprop

    monkeypatch.setitem(backprop.TRAINABLE, "normalization_type", backprop.Only(("LN", "LNPre"), "RMS norm"))


def test_a_model_without_gradients_is_refused_saying_so(client, rms_without_gradients):
    message = refused(client, model="llama-gqa", method="integrated_gradients")
    assert "needs the model's gradients, which core does not compute for 'llama-gqa' yet" in message
    assert "normalization_type='RMS'" in message
    assert post(client, model="llama-gqa", method="direct_logit")["heads"]  # direct_logit needs none


def test_bad_input_says_why_in_malay(client, rms_without_gradients):
    ms = {"Accept-Language": "ms"}
    assert "di luar" in refused(client, headers=ms, position=9)
    assert "memerlukan kecerunan model" in refused(client, headers=ms, model="llama-gqa", method="saliency")


@pytest.mark.parametrize("model", ["llama-gqa", "gpt-neox-parallel"])
def test_every_method_runs_on_the_families(client, model):
    """Llama (RMS norm, SwiGLU, grouped keys) and GPT-NeoX (per-head fused QKV, parallel blocks): the scores are
    core's on the served weights (core's equal Captum's on these fixtures: tests/core/test_attribution.py)."""
    ckpt = load_checkpoint(FIXTURES / "families" / model)
    for method in ("saliency", "integrated_gradients", "occlusion"):
        got = post(client, model=model, method=method, steps=4, contrast=7)
        ids = np.array(got["token_ids"])
        read = A.readout(ckpt.params, ckpt.cfg, got["target"]["id"], 7)
        want = A.token_attribution(ckpt.params, ckpt.cfg, ids, -1, read, method, 4)
        np.testing.assert_allclose(got["scores"], want.scores, rtol=1e-5, atol=1e-6)


def test_an_encoder_is_refused_saying_it_has_no_language_model_head(client):
    model = build_catalog(get_settings()).get(ENCODER)
    if model is None or model.error:
        pytest.skip(f"{ENCODER} is not runnable here: {model and model.error}")
    assert "without a language-model head" in refused(client, model=ENCODER)


def test_integrated_gradients_steps_are_priced(client):
    """A pretrained model's work limit counts every step's backward pass: a tight limit refuses many steps."""
    from app.settings import Settings

    with TestClient(create_app(Settings(max_pretrained_work=20_000_000, access_log=False))) as tight:
        ok = tight.post("/api/v1/analysis/attribution", json={"model": "induction", "text": "ali makan", "steps": 2})
        assert ok.status_code == 200, ok.text[:300]
        r = tight.post("/api/v1/analysis/attribution", json={"model": "induction", "text": "ali makan", "steps": 500})
        assert r.status_code == 422 and "reduce the text's length, or steps" in messages(r)


def test_the_schemas_examples_answer(client):
    from app.api.attribution_models import AttributionRequest

    for example in AttributionRequest.model_config["json_schema_extra"]["examples"]:
        got = post(client, **example)
        assert got["method"] == example["method"]
