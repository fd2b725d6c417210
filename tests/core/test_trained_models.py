"""The trained models that ship in core/trained/: they load, transformers computes the same logits, the
heads the explorer promises are there, and the smallest one retrains bit for bit.

tests/fixtures/trained_logits.npz holds what Hugging Face transformers (on PyTorch) computed from each
folder as it is (scripts/make_training_fixtures.py); this test needs no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from core import run_with_cache, run_with_kv_cache
from core.analysis import lens_points
from core.checkpoints import load_checkpoint, trained_models
from core.recipes import TrainSettings
from core.train import Training

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained_logits.npz"
MODELS = trained_models()
REPEATED = "Ali makan nasi lemak. Ali makan nasi lemak."  # the learner's repeated sentence


def test_the_three_models_ship():
    assert set(MODELS) == {"induction", "nasi-lemak", "python-docs"}
    total = sum(f.stat().st_size for folder in MODELS.values() for f in folder.iterdir())
    assert total < 4_000_000  # a few MB at most, in the wheel


def _cases():
    with np.load(FIXTURE) as z:
        return sorted({key.rsplit("_", 1)[0] for key in z.files})


@pytest.mark.parametrize("case", _cases())
def test_transformers_computes_the_same_logits(case):
    name = case.split("/")[0]
    with np.load(FIXTURE) as z:
        text, ids, logits = str(z[case + "_text"]), z[case + "_ids"], z[case + "_logits"]
    ckpt = load_checkpoint(MODELS[name])
    ours = ckpt.tokenizer.encode(text).ids[: ckpt.cfg.n_ctx]
    assert ours == ids.tolist()  # the same tokenizer.json, read by tokenizers in both
    np.testing.assert_allclose(run_with_cache(ckpt.params, ckpt.cfg, np.array(ours))[0], logits, atol=1e-4, rtol=0)


def test_the_induction_model_has_a_previous_token_head_and_an_induction_head_on_a_learners_text():
    ckpt = load_checkpoint(MODELS["induction"])
    assert ckpt.cfg.attn_only and ckpt.cfg.n_layers == 2 and ckpt.cfg.n_ctx >= len(REPEATED)
    scores = run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode(REPEATED).ids), logits=False)[1].head_detector_scores()
    assert scores["previous_token"][0].max() > 0.5  # layer 0 looks one token back...
    assert scores["induction"][1].max() > 0.5  # ...so layer 1 can look up what followed last time


def test_the_python_docs_model_has_a_previous_token_head():
    ckpt = load_checkpoint(MODELS["python-docs"])
    text = "The for statement is used to iterate over the elements of a sequence."
    scores = run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode(text).ids), logits=False)[1].head_detector_scores()
    assert scores["previous_token"].max() > 0.5


def test_nasi_lemak_predicts_l_after_nasi():
    ckpt = load_checkpoint(MODELS["nasi-lemak"])
    logits = run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode("nasi ").ids))[0][-1]
    p = np.exp(logits - logits.max())
    assert p[ckpt.tokenizer.encode("l").ids[0]] / p.sum() > 0.9


def test_nasi_lemak_retrains_bit_for_bit(tmp_path):
    """The whole run that made the shipped folder, from the settings its config.json records."""
    folder = MODELS["nasi-lemak"]
    recorded = json.loads((folder / "config.json").read_text())["transformer_explorer"]
    with threadpool_limits(1, user_api="blas"):  # the command's default, which reproducibility assumes
        run = Training(TrainSettings(**recorded["settings"]))
        run.run()
    again = run.export(tmp_path / "nasi-lemak")
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (folder / name).read_bytes(), name
    config = json.loads((again / "config.json").read_text())
    assert config == json.loads((folder / "config.json").read_text()) | {
        "transformer_explorer": recorded | {k: config["transformer_explorer"][k] for k in ("numpy", "python")}}


def test_every_question_of_the_cache_works_on_the_attention_only_model():
    """No MLP and no resid_mid: the decomposition, the lens, the residual norms and KV stepping follow."""
    ckpt = load_checkpoint(MODELS["induction"])
    cfg, ids = ckpt.cfg, np.array(ckpt.tokenizer.encode(REPEATED).ids)
    logits, cache = run_with_cache(ckpt.params, cfg, ids)
    token = int(np.argmax(logits[-1]))
    d = cache.decompose_resid(token)
    assert not any("mlp" in label for label in d.labels)
    np.testing.assert_allclose(d.parts.sum(0), cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"][-1], atol=1e-4)
    assert abs(d.direct_logit.sum() + d.logit_bias - d.logit) < 1e-3 and d.logit == logits[-1, token]
    assert lens_points(cfg) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
    lens = cache.logit_lens(3)
    assert lens.top_tokens[-1, -1, 0] == token
    norms = cache.residual_norms()
    assert norms.writes_names == ["0 attn_out", "1 attn_out"] and norms.stream.shape == (len(ids), 5)
    kv = run_with_kv_cache(ckpt.params, cfg, ids[:10], n_new=5)
    full, _ = run_with_cache(ckpt.params, cfg, kv.tokens, names=())
    np.testing.assert_allclose(np.stack([s.logits for s in kv.steps]), full, atol=1e-4)
