"""core/sae_train.py's JumpReLU training against SAELens's (tests/fixtures/sae_jumprelu_training.npz, recorded by
scripts/make_sae_jumprelu_fixtures.py from SAELens 6.54.12's JumpReLUTrainingSAE and torch's Adam).

From SAELens's initial arrays and batches: the first step's loss terms and the gradient of every array (the
threshold's being the rectangle kernel's pseudo-gradient, which no finite difference can check), then the
arrays after every step of core's SAETrainer (its projection of the threshold onto ≥ 0, AdamW without decay).
Float32 on both sides, so within float tolerances, not bit for bit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from core.sae import SAE, SAEConfig
from core.sae_train import SAETrainer, SAETraining, loss_and_grads

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_sae_jumprelu_fixtures.py"
RECORD = np.load(FIXTURES / "sae_jumprelu_training.npz")
CASES = json.loads(str(RECORD["cases"]))
NAMES = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")


def test_the_record_is_from_its_generator():
    assert str(RECORD["meta_generator_sha256"]) == hashlib.sha256(GENERATOR.read_bytes()).hexdigest(), (
        "scripts/make_sae_jumprelu_fixtures.py changed: make fixtures"
    )
    assert str(RECORD["meta_sae_lens_version"]) == "6.54.12"


def _case(case: str) -> tuple[dict, SAE, SAETraining]:
    get = lambda key: RECORD[f"{case}/{key}"]  # noqa: E731
    settings = CASES[case]
    W_enc = get("initial_W_enc")
    cfg = SAEConfig(architecture="jumprelu", d_in=W_enc.shape[0], d_sae=W_enc.shape[1], hook_name="h", model_name="toy")
    sae = SAE(cfg=cfg, **{name: get(f"initial_{name}").copy() for name in NAMES})
    training = SAETraining(
        steps=len(get("order")),
        batch_size=get("order").shape[1],
        lr=settings["lr"],
        l0_coefficient=settings["l0_coefficient"],
        jumprelu_init_threshold=settings["jumprelu_init_threshold"],
        jumprelu_bandwidth=settings["jumprelu_bandwidth"],
    )
    return {k.split("/", 1)[1]: RECORD[k] for k in RECORD.files if k.startswith(case + "/")}, sae, training


@pytest.mark.parametrize("case", CASES)
def test_the_first_step_s_losses_and_gradients_equal_saelens(case):
    rec, sae, training = _case(case)
    np.testing.assert_array_equal(sae.threshold, np.float32(training.jumprelu_init_threshold))  # SAELens's init
    x = rec["pool"][rec["order"][0]]
    losses, grads, acts, _ = loss_and_grads(sae, x, training)
    assert np.array_equal(acts > 0, rec["acts_0"] > 0)  # the same features pass their thresholds
    np.testing.assert_allclose(acts, rec["acts_0"], rtol=1e-5, atol=1e-6)
    assert losses["mse"] == pytest.approx(rec["losses_mse_loss"][0], rel=1e-5)
    assert losses["l0"] == pytest.approx(rec["losses_l0_loss"][0], rel=1e-6, abs=1e-12)
    assert losses["loss"] == pytest.approx(rec["losses_loss"][0], rel=1e-5)
    for name in NAMES:
        want = rec[f"grad_{name}"]
        assert np.abs(want).max() > 0, name  # each array has a gradient to compare
        np.testing.assert_allclose(grads[name], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("case", CASES)
def test_training_steps_end_where_saelens_s_end(case):
    """core's trainer on SAELens's batches: its own step (projection, objective, AdamW) for every step."""
    rec, sae, training = _case(case)
    batches = iter(rec["order"])

    class Order:  # the recorded batches, in place of the trainer's own draw
        def integers(self, low, high, size):
            return next(batches)

    trainer = SAETrainer(rec["pool"], sae.cfg, training, sae)
    trainer.rng = Order()  # type: ignore[assignment]
    losses = [trainer.train_step().loss for _ in range(training.steps)]
    np.testing.assert_allclose(losses, rec["losses_loss"], rtol=1e-4)
    for name in NAMES:
        want = rec[f"final_{name}"]
        start = rec[f"initial_{name}"]
        moved = np.abs(want - start).max()
        assert moved > 0, name
        # Adam moves each entry by about lr a step: agree to a small share of what the steps moved it
        np.testing.assert_allclose(getattr(trainer.sae, name), want, rtol=0, atol=2e-3 * moved, err_msg=name)
    if case == "projected":
        assert (rec["final_threshold"] < 0).any()  # SAELens's update took some below 0 after projecting ...
        assert (trainer.sae.threshold < 0).sum() == (rec["final_threshold"] < 0).sum()  # ... and so did core's
