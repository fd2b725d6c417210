"""core/sae_train.py: the gradients against central differences of the objective, and training that learns.

Central differences in float64 (step 1e-6) are independent of the formulas written in loss_and_grads; the
top-k auxiliary loss's residual is held at its value before the step (SAELens detaches it), so the
difference quotient is taken with it held too.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import InputError
from core.sae import SAEConfig
from core.sae_train import SAETraining, init_sae, loss_and_grads, train_sae


def _cfg(architecture: str, **extra) -> SAEConfig:
    return SAEConfig(
        architecture=architecture,
        d_in=6,
        d_sae=10,
        hook_name="blocks.0.hook_resid_pre",
        model_name="toy",
        dtype="float64",
        **extra,
    )


def _sae(cfg: SAEConfig, seed: int = 0):
    sae = init_sae(cfg, SAETraining(seed=seed, decoder_init_norm=1.0))
    rng = np.random.default_rng(seed + 7)
    sae.b_enc[:] = rng.standard_normal(cfg.d_sae) * 0.3  # so that some features fire and some do not
    sae.b_dec[:] = rng.standard_normal(cfg.d_in) * 0.3
    sae.W_enc[:] += rng.standard_normal(sae.W_enc.shape) * 0.2
    return sae


def _objective(sae, x, training, dead, residual):
    """The loss as a plain function of the arrays (the auxiliary residual given, not recomputed)."""
    sae_in = x - sae.b_dec
    pre = sae_in @ sae.W_enc + sae.b_enc
    acts = sae.activate(pre)
    x_hat = acts @ sae.W_dec + sae.b_dec
    loss = ((x_hat - x) ** 2).sum() / len(x)
    if sae.cfg.architecture == "standard":
        loss += training.l1_coefficient * (acts * np.linalg.norm(sae.W_dec, axis=1)).sum() / len(x)
    elif dead is not None and dead.any():
        k_aux = min(x.shape[1] // 2, int(dead.sum()))
        scale = min(dead.sum() / (x.shape[1] // 2), 1.0)
        aux = np.zeros_like(pre)
        for b in range(len(x)):  # the k_aux largest dead pre-activations of each row, the long way
            order = sorted(np.flatnonzero(dead), key=lambda i: -pre[b, i])[:k_aux]
            aux[b, order] = pre[b, order]
        loss += training.aux_coefficient * scale * ((aux @ sae.W_dec - residual) ** 2).sum() / len(x)
    return loss


@pytest.mark.parametrize(
    "architecture, extra, dead",
    [("standard", {}, None), ("topk", {"k": 3}, None), ("topk", {"k": 3}, np.arange(10) % 3 == 0)],
    ids=["standard", "topk", "topk-with-dead-features"],
)
def test_gradients_equal_central_differences(architecture, extra, dead):
    cfg = _cfg(architecture, **extra)
    sae = _sae(cfg)
    training = SAETraining(l1_coefficient=0.7, aux_coefficient=0.5)
    x = np.random.default_rng(3).standard_normal((8, cfg.d_in))
    losses, grads, _, x_hat = loss_and_grads(sae, x, training, dead)
    residual = x - x_hat
    assert losses["loss"] == pytest.approx(_objective(sae, x, training, dead, residual), rel=1e-12)
    if dead is not None:
        assert losses["aux"] > 0
    eps = 1e-6
    for name, array in sae.arrays().items():
        numeric = np.zeros_like(array)
        for idx in np.ndindex(array.shape):
            keep = array[idx]
            array[idx] = keep + eps
            up = _objective(sae, x, training, dead, residual)
            array[idx] = keep - eps
            down = _objective(sae, x, training, dead, residual)
            array[idx] = keep
            numeric[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_training_learns_a_sparse_code_of_sparse_data():
    """Data made of 3-of-16 directions: a top-k SAE of 32 features with k=3 explains most of its variance."""
    rng = np.random.default_rng(0)
    directions = rng.standard_normal((16, 8))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    codes = np.zeros((4096, 16))
    for row in codes:
        row[rng.choice(16, 3, replace=False)] = rng.uniform(0.5, 2.0, 3)
    x = codes @ directions
    cfg = SAEConfig(architecture="topk", d_in=8, d_sae=32, k=3, hook_name="h", model_name="m")
    sae, records = train_sae(x, cfg, SAETraining(steps=1000, batch_size=256, lr=1e-2))
    assert records[0].explained_variance < 0.5 < 0.9 < records[-1].explained_variance
    assert all(r.l0 <= 3 for r in records)
    assert sae.W_enc.dtype == np.float32  # the SAE's own dtype
    held_out = (codes[:256] @ directions).astype(np.float32)
    err = sae.decode(sae.encode(held_out)) - held_out
    assert (err**2).sum() / ((held_out - held_out.mean(0)) ** 2).sum() < 0.1


def test_a_standard_sae_trades_reconstruction_for_sparsity():
    x = np.random.default_rng(1).standard_normal((2048, 8))
    cfg = SAEConfig(architecture="standard", d_in=8, d_sae=32, hook_name="h", model_name="m")
    l0 = {}
    for c in (0.01, 3.0):
        _, records = train_sae(x, cfg, SAETraining(steps=300, batch_size=256, lr=3e-3, l1_coefficient=c))
        l0[c] = records[-1].l0
    assert l0[3.0] < l0[0.01] / 2


def test_a_cancel_stops_training_and_the_same_seed_trains_the_same():
    x = np.random.default_rng(2).standard_normal((512, 8))
    cfg = SAEConfig(architecture="topk", d_in=8, d_sae=16, k=2, hook_name="h", model_name="m")
    a, records = train_sae(x, cfg, SAETraining(steps=50, batch_size=64), on_step=lambda r, _: r.step == 10)
    assert len(records) == 10
    b, _ = train_sae(x, cfg, SAETraining(steps=10, batch_size=64))
    np.testing.assert_array_equal(a.W_dec, b.W_dec)


def test_what_cannot_be_trained_here_is_refused():
    with pytest.raises(InputError, match="with no rescaling"):
        init_sae(_cfg("topk", k=3, rescale_acts_by_decoder_norm=True), SAETraining())
    with pytest.raises(InputError, match="trains on vectors of 6 numbers, not \\(10, 5\\)"):
        train_sae(np.zeros((10, 5)), _cfg("standard"), SAETraining())
