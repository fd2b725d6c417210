"""The sae recipe (core/sae_run.py): its settings, and a run that stops, is snapshotted and resumes exactly."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from core import InputError
from core.checkpoints import trained_models
from core.run_settings import settings
from core.sae import load_sae
from core.sae_run import (
    DEFAULT_K,
    DEFAULT_L1,
    POOL_PREFIX,
    SAERun,
    SourceModel,
    activations,
    run_model,
    shipped_model,
)
from core.sae_run import sae_settings as settings_of_sae
from core.sae_train import SAETraining
from core.train import Snapshot

TINY = dict(d_sae=64, k=4, steps=30, batch_size=32, eval_interval=10)


def test_defaults_fill_in_the_chosen_architecture_only():
    topk = settings("sae")
    assert (topk.architecture, topk.k, topk.l1_coefficient, topk.model) == ("topk", DEFAULT_K, None, "induction")
    standard = settings("sae", architecture="standard")
    assert (standard.k, standard.l1_coefficient) == (None, DEFAULT_L1)
    jumprelu = settings("sae", architecture="jumprelu", jumprelu_bandwidth=0.1)
    assert (jumprelu.k, jumprelu.l1_coefficient, jumprelu.jumprelu_bandwidth) == (None, None, 0.1)
    # SAELens's defaults (JumpReLUTrainingSAEConfig's)
    assert (
        (jumprelu.l0_coefficient, jumprelu.jumprelu_init_threshold)
        == (1.0, 0.01)
        == (
            SAETraining.l0_coefficient,
            SAETraining.jumprelu_init_threshold,
        )
    )
    assert topk.l0_coefficient is None and "l0_coefficient" not in topk.to_dict()  # a card as before jumprelu
    assert settings("sae", steps=10).eval_interval == 10  # a record at the last step at least


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(architecture="standard", k=3), "k is the topk"),
        (dict(l1_coefficient=0.5), "l1_coefficient is the standard"),
        (dict(architecture="jumprelu", k=3), "k is the topk architecture's setting; a jumprelu SAE takes l0_coeff"),
        (dict(l0_coefficient=0.5), "l0_coefficient is the jumprelu"),
        (dict(architecture="standard", jumprelu_bandwidth=0.1), "jumprelu_bandwidth is the jumprelu"),
        (dict(architecture="jumprelu", jumprelu_bandwidth=0.0), "jumprelu_bandwidth=0.0 must be a number above 0"),
        (dict(architecture="jumprelu", l0_coefficient=-1.0), "l0_coefficient=-1.0 must be a number from 0 to 100"),
        (dict(architecture="jumprelu", jumprelu_init_threshold=11), "jumprelu_init_threshold=11 must be a number"),
        (dict(model="gpt2"), "shipped"),
        (dict(hook="blocks.2.hook_resid_post"), "blocks.1.hook_resid_post"),
        (dict(seq_len=16), "seq_len"),
        (dict(d_sae=8, k=9), "k=9"),
        (dict(text="a"), "at least 2"),
    ],
)
def test_bad_settings_say_what_to_change(changes, says):
    with pytest.raises(InputError, match=says):
        settings("sae", **changes)


def test_a_model_recipe_refuses_an_sae_setting():
    with pytest.raises(InputError, match="hook is a setting of the sae recipe"):
        settings("induction", hook="blocks.0.hook_resid_post")


def test_the_activations_are_the_models_own_data_or_a_text():
    s = settings("sae", **TINY)
    x = activations(s)
    assert x.shape == (30 * 32, 64) and x.dtype == np.float32
    assert np.array_equal(x, activations(s))  # the seed fixes them
    assert not np.array_equal(x, activations(s.replace(seed=1)))
    text = activations(settings("sae", **TINY, text="ali makan nasi lemak. " * 4))
    assert text.shape == (88, 64)  # every token of the text, in windows of the model's context


JUMPRELU = {k: v for k, v in TINY.items() if k != "k"} | dict(architecture="jumprelu", l0_coefficient=0.1)


@pytest.mark.parametrize("tiny", [TINY, JUMPRELU], ids=["topk", "jumprelu"])
def test_a_stopped_run_resumes_bit_for_bit_and_exports_a_saelens_folder(tmp_path, tiny):
    s = settings("sae", **tiny)
    whole = SAERun(s)
    records = [r.to_dict() for r in whole.records()]
    assert [r["step"] for r in records] == [10, 20, 30]
    if s.architecture == "topk":
        assert all(r["l0"] == 4 for r in records)
    else:  # the thresholds learn (from 0.01, SAELens's start)
        assert whole.sae.threshold is not None and np.abs(whole.sae.threshold - 0.01).max() > 0.01
    cut = SAERun(s)
    first = [r.to_dict() for r in cut.records(stop=lambda: cut.step >= 15)]
    assert cut.step == 15 and [r["step"] for r in first] == [10]
    resumed = SAERun.resume(Snapshot.load(cut.snapshot().save(tmp_path / "snapshot.npz")))
    rest = [r.to_dict() for r in resumed.records()]
    assert [r["step"] for r in rest] == [20, 30]
    strip = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]
    assert strip == [{k: v for k, v in r.items() if k != "elapsed_s"} for r in first + rest]
    for name, array in whole.sae.arrays().items():
        assert np.array_equal(getattr(resumed.sae, name), array), name
    folder = resumed.export(tmp_path / "sae")
    loaded = load_sae(folder)
    assert loaded.cfg.hook_name == s.hook and loaded.cfg.model_name == s.model and loaded.cfg.k == s.k
    assert loaded.cfg.architecture == s.architecture and set(loaded.arrays()) == set(whole.sae.arrays())
    x = activations(s)[:50]
    assert np.array_equal(loaded.encode(x), resumed.sae.encode(x))
    assert resumed.export(tmp_path / "sae") == folder  # a second export replaces the first


def test_a_resumed_run_reads_its_kept_activations_and_ends_as_an_uninterrupted_one(tmp_path):
    """The pool is kept in the run's folder (activations-<digest>.npy) and read back on resume: the model is not
    run again (the loader handed in would fail), and the records and weights are the uninterrupted run's."""
    s = settings("sae", **TINY)
    whole = SAERun(s)
    records = [r.to_dict() for r in whole.records()]
    cut = SAERun(s, folder=tmp_path)
    [kept] = tmp_path.glob(f"{POOL_PREFIX}*.npy")
    assert np.array_equal(np.load(kept), activations(s))
    first = [r.to_dict() for r in cut.records(stop=lambda: cut.step >= 15)]
    snapshot = Snapshot.load(cut.snapshot().save(tmp_path / "snapshot.npz"))

    def never() -> SourceModel:
        raise AssertionError("the model ran again: the kept activations were not read")

    resumed = SAERun.resume(snapshot, never, tmp_path)
    rest = [r.to_dict() for r in resumed.records()]
    strip = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]
    assert strip == [{k: v for k, v in r.items() if k != "elapsed_s"} for r in first + rest]
    assert np.array_equal(resumed.sae.W_enc, whole.sae.W_enc) and np.array_equal(resumed.sae.b_dec, whole.sae.b_dec)


def test_a_short_texts_pool_is_kept_and_read_back_too(tmp_path):
    s = settings("sae", **TINY, text="ali makan nasi lemak. " * 4)  # 88 tokens: fewer than steps × batch_size
    x = SAERun(s, folder=tmp_path).trainer.data
    assert x.shape == (88, 64)

    def never() -> SourceModel:
        raise AssertionError("the model ran again: the kept activations were not read")

    assert np.array_equal(SAERun(s, never, tmp_path).trainer.data, x)


def test_a_damaged_or_foreign_pool_is_computed_again(tmp_path):
    s = settings("sae", **TINY)
    x = activations(s)
    SAERun(s, folder=tmp_path)
    [kept] = tmp_path.glob(f"{POOL_PREFIX}*.npy")
    damaged = x.copy()
    damaged[0, 0] += 1
    np.save(kept, damaged)  # the name no longer says its bytes
    np.save(tmp_path / f"{POOL_PREFIX}0000000000000000.npy", np.zeros((2 * len(x), 64), np.float32))  # too big
    assert np.array_equal(SAERun(s, folder=tmp_path).trainer.data, x)
    assert [p.name for p in tmp_path.glob(f"{POOL_PREFIX}*.npy")] == [kept.name]  # rewritten whole, once


def test_an_sae_learns_a_model_run_named_by_its_weights_digest(tmp_path):
    """A model run's weights are handed in (core finds only the shipped ones): their digest is a setting, and a
    run whose model's weights have changed since refuses to train on them."""
    folder = tmp_path / "model-40"
    shutil.copytree(trained_models()["nasi-lemak"], folder)
    card = shipped_model("nasi-lemak").settings
    name = "nasi-lemak-0123456789ab"
    model = run_model(name, folder, card)
    s = settings_of_sae({"model": name, "hook": "blocks.0.hook_resid_post"} | TINY, model)
    assert s.model_sha256 == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert s.to_dict()["model_sha256"] == s.model_sha256 and "model_sha256" not in settings("sae").to_dict()
    run = SAERun(s, model)
    assert run.cfg.model_name == name and run.cfg.d_in == 16
    assert np.array_equal(run.trainer.data, activations(s.replace(model="nasi-lemak", model_sha256=None)))
    with pytest.raises(InputError, match="not handed"):
        SAERun(s)
    with pytest.raises(InputError, match="SAE's run"):
        run_model(name, folder, s)
    weights = bytearray((folder / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # trained further: other weights in the same place
    (folder / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(InputError, match="changed since"):
        SAERun(s, run_model(name, folder, card))
