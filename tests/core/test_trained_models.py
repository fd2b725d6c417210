"""The trained models that ship in core/trained/: they load, transformers computes the same logits, the
heads the explorer promises are there, and the smallest one retrains: on any CPU to the bounds
tests/core/nasi_lemak_reproduction.py states and measured, bit for bit only twice on the same one.

tests/fixtures/trained_logits.npz holds what Hugging Face transformers (on PyTorch) computed from each
folder as it is (scripts/make_training_fixtures.py); this test needs no torch. The other two models
take minutes to retrain and are not retrained here; nothing here claims they reproduce bit for bit
on another machine (docs/training.md). tests/core/test_blas_kernels.py retrains nasi-lemak under
several OpenBLAS kernels on one machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core import InputError, run_with_cache, run_with_kv_cache
from core.analysis import lens_points
from core.checkpoints import load_checkpoint, trained_models
from core.recipes import make_recipe
from core.run_settings import settings

from . import nasi_lemak_reproduction as nasi

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained_logits.npz"
MODELS = trained_models()
REPEATED = "Ali makan nasi lemak. Ali makan nasi lemak."  # the learner's repeated sentence


def test_the_four_models_ship():
    assert set(MODELS) == {"induction", "nasi-lemak", "python-docs", "python-docs-induction"}
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
    scores = run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode(REPEATED).ids), logits=False)[
        1
    ].head_detector_scores()
    assert scores["previous_token"][0].max() > 0.5  # layer 0 looks one token back...
    assert scores["induction"][1].max() > 0.5  # ...so layer 1 can look up what followed last time


def test_the_python_docs_model_has_a_previous_token_head():
    ckpt = load_checkpoint(MODELS["python-docs"])
    text = "The for statement is used to iterate over the elements of a sequence."
    scores = run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode(text).ids), logits=False)[
        1
    ].head_detector_scores()
    assert scores["previous_token"].max() > 0.5


@pytest.mark.parametrize(
    "sentence",
    ["The for statement is used to iterate over the elements of a sequence.", "Ali makan nasi lemak di kedai."],
)
def test_python_docs_induction_has_both_heads_on_a_repeated_sentence(sentence):
    """Trained on Python's documentation with repeated passages mixed in (its card: repeats 1.0), it has a
    previous-token head in layer 0 and an induction head in layer 1, each scoring at least 0.4 on a sentence said
    twice (python-docs, the same text without repeats, reaches 0.14 as an induction head)."""
    ckpt = load_checkpoint(MODELS["python-docs-induction"])
    assert (
        json.loads((MODELS["python-docs-induction"] / "config.json").read_text())["transformer_explorer"]["settings"][
            "repeats"
        ]
        == 1.0
    )
    ids = ckpt.tokenizer.encode(f"{sentence} {sentence}").ids[: ckpt.cfg.n_ctx]
    scores = run_with_cache(ckpt.params, ckpt.cfg, np.array(ids), logits=False)[1].head_detector_scores()
    assert scores["previous_token"][0].max() >= 0.4
    assert scores["induction"][1].max() >= 0.4


def test_the_text_recipes_repeats_copy_a_passage_further_on_and_leave_the_text_alone_without():
    plain, repeated = (make_recipe(settings("text", steps=10, repeats=r)) for r in (0.0, 1.0))
    rng = lambda: np.random.default_rng(7)  # noqa: E731
    windows = plain._windows(plain.train_ids, rng())
    np.testing.assert_array_equal(plain.batch(rng()), windows)  # no repeats: the data stream as before
    rows = repeated.batch(rng())
    np.testing.assert_array_equal(rows[:, 0], windows[:, 0])  # the same windows, with a passage copied into each
    assert (rows != windows).any(axis=1).sum() >= len(rows) - 1  # (a copy may land on the same letters)
    with pytest.raises(InputError, match="repeats mixes repeated passages into the text recipe's data"):
        settings("induction", repeats=0.5)


def test_nasi_lemak_predicts_l_after_nasi():
    ckpt = load_checkpoint(MODELS["nasi-lemak"])
    logits = run_with_cache(ckpt.params, ckpt.cfg, np.array(ckpt.tokenizer.encode("nasi ").ids))[0][-1]
    p = np.exp(logits - logits.max())
    assert p[ckpt.tokenizer.encode("l").ids[0]] / p.sum() > 0.9


@pytest.fixture(scope="module")
def retrained(tmp_path_factory) -> tuple[Path, str]:
    """nasi-lemak retrained here (under 1 s): its folder and its run's ReLU pattern."""
    return nasi.retrain(tmp_path_factory.mktemp("retrained"))


def test_nasi_lemak_retrained_on_any_cpu_matches_the_shipped_weights_within_0_1(retrained):
    folder, _ = retrained
    difference = nasi.max_abs_difference(nasi.weights(folder), nasi.weights(nasi.SHIPPED))
    assert difference <= nasi.WEIGHTS_ATOL, difference


def test_nasi_lemak_retrained_on_any_cpu_matches_the_shipped_weights_within_1e_5_where_its_relus_agree(retrained):
    """Where every ReLU saw the same side of 0 as in the shipped run, the runs differ only by rounding."""
    folder, pattern = retrained
    if pattern != nasi.SHIPPED_RELU_PATTERN:
        pytest.skip(
            "with this CPU's BLAS a pre-activation within rounding of 0 fell on the other side of a "
            "ReLU than in the shipped run (nasi_lemak_reproduction.py: as at step 22): the run went on "
            "from a nearby place, so only the 0.1 bound holds"
        )
    difference = nasi.max_abs_difference(nasi.weights(folder), nasi.weights(nasi.SHIPPED))
    assert difference <= nasi.WEIGHTS_ATOL_SAME_RELUS, difference


def test_nasi_lemak_retrained_on_any_cpu_predicts_as_the_shipped_model(retrained):
    """p('l' | "nasi ") within 1e-4 and the same argmax next token at every position of three phrases.
    (Not "the same to 3 decimals": the shipped 0.99252 is 2e-5 from 0.9925, where rounding turns.)"""
    got, shipped = nasi.predictions(retrained[0]), nasi.predictions(nasi.SHIPPED)
    assert shipped["next_tokens"] == nasi.NEXT_TOKENS and shipped["p_target"] > 0.99
    assert got["next_tokens"] == shipped["next_tokens"]
    assert got["p_target"] == pytest.approx(shipped["p_target"], abs=nasi.P_ATOL, rel=0)


def test_nasi_lemak_retrained_on_any_cpu_has_the_shipped_head_scores_within_1e_2(retrained):
    got, shipped = nasi.predictions(retrained[0]), nasi.predictions(nasi.SHIPPED)
    for text in nasi.SCORE_TEXTS:
        assert (
            got["head_scores"][text].keys()
            == shipped["head_scores"][text].keys()
            == {"previous_token", "duplicate_token", "induction"}
        )
        for name, scores in shipped["head_scores"][text].items():
            np.testing.assert_allclose(
                got["head_scores"][text][name], scores, atol=nasi.SCORES_ATOL, rtol=0, err_msg=f"{name} on {text!r}"
            )


def test_nasi_lemak_retrained_on_any_cpu_writes_the_shipped_tokenizer_and_card(retrained):
    """No arithmetic decides these: the same bytes, and the card the same but for the versions and BLAS
    of the machine that trained it."""
    folder, _ = retrained
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (nasi.SHIPPED / name).read_bytes(), name
    config, shipped = (json.loads((f / "config.json").read_text()) for f in (folder, nasi.SHIPPED))
    blas = config["transformer_explorer"].get("blas")  # None where threadpoolctl sees no BLAS (Accelerate)
    assert blas is None or blas["threads"] == 1  # retrain() trains on one BLAS thread, and the card says so

    def without_machine(c: dict) -> dict:
        return c | {
            "transformer_explorer": {
                k: v for k, v in c["transformer_explorer"].items() if k not in ("numpy", "python", "blas")
            }
        }

    assert without_machine(config) == without_machine(shipped)


def test_nasi_lemak_retrained_twice_on_one_cpu_is_the_same_bit_for_bit(retrained, tmp_path):
    """Same machine, kernel and thread count: the same folder, byte for byte (its ReLU pattern too)."""
    folder, pattern = retrained
    again, pattern_again = nasi.retrain(tmp_path)
    assert pattern_again == pattern
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (folder / name).read_bytes(), name


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
