"""Record SAELens's JumpReLU training, for tests/core/test_sae_jumprelu.py (`make fixtures`).

Runs in the SAELens venv (the Makefile's SAEENV, pinned by SAE_PINS), never in the app's. SAELens's
`JumpReLUTrainingSAE` (its own initial weights from a seeded torch generator; threshold
`jumprelu_init_threshold` everywhere) trains on random vectors for STEPS steps: each step its
`training_forward_pass` (which first projects the threshold onto ≥ 0), `loss.backward()` and torch's Adam
(betas 0.9, 0.999, as SAELens's SAETrainer builds it). SAETrainer itself also clips the gradient's norm to 1;
core/sae_train.py does not (for any architecture), so the optimiser is driven here directly, without the clip.

Recorded in tests/fixtures/sae_jumprelu_training.npz, for each case of CASES (keys "<case>/..."): the initial
arrays, the pool of vectors and each step's batch (row indices into the pool), the first step's loss terms and
every parameter's gradient, every step's losses, and the arrays after the last step.

    $(SAEENV)/bin/python scripts/make_sae_jumprelu_fixtures.py
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
from sae_lens.saes.sae import SAEMetadata, TrainStepInput

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "tests" / "fixtures" / "sae_jumprelu_training.npz"
D_IN, D_SAE, POOL, BATCH, STEPS = 16, 48, 256, 64, 8
# Two runs: SAELens's threshold and bandwidth with an L0 weight; and no L0 weight and a threshold so small that
# Adam's first steps take some thresholds below zero (the projection back to 0 at work).
CASES = {
    "l0": {"l0_coefficient": 0.3, "jumprelu_init_threshold": 0.01, "jumprelu_bandwidth": 0.05, "lr": 3e-3},
    "projected": {"l0_coefficient": 0.0, "jumprelu_init_threshold": 0.002, "jumprelu_bandwidth": 0.1, "lr": 3e-3},
}
NAMES = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")


def main() -> None:
    record: dict[str, np.ndarray] = {}
    for case, settings in CASES.items():
        record |= {f"{case}/{key}": a for key, a in run(settings).items()}
    record |= {
        "cases": np.array(json.dumps(CASES)),
        "meta_generator_sha256": np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest()),
    }
    for package in ("sae-lens", "torch"):
        record[f"meta_{package.replace('-', '_')}_version"] = np.array(version(package))
    np.savez_compressed(RECORD, **record)
    print(f"wrote {RECORD}")


def run(settings: dict) -> dict[str, np.ndarray]:
    """SAELens's training on the case's settings: what it records (see the module's docstring)."""
    torch.manual_seed(0)
    cfg = JumpReLUTrainingSAEConfig(
        d_in=D_IN,
        d_sae=D_SAE,
        dtype="float32",
        l0_coefficient=settings["l0_coefficient"],
        jumprelu_init_threshold=settings["jumprelu_init_threshold"],
        jumprelu_bandwidth=settings["jumprelu_bandwidth"],
        metadata=SAEMetadata(hook_name="blocks.0.hook_resid_post", model_name="toy"),
    )
    sae = JumpReLUTrainingSAE(cfg)
    rng = np.random.default_rng(0)
    # vectors made of a few directions, with an offset (so b_dec has something to learn)
    directions = rng.standard_normal((24, D_IN)).astype(np.float32)
    codes = rng.exponential(1.0, (POOL, 24)) * (rng.random((POOL, 24)) < 0.15)
    pool = (codes @ directions + 0.5).astype(np.float32)
    order = rng.integers(0, POOL, size=(STEPS, BATCH))
    initial = {name: getattr(sae, name).detach().numpy().copy() for name in NAMES}
    opt = torch.optim.Adam(sae.parameters(), lr=settings["lr"], betas=(0.9, 0.999))
    losses: dict[str, list[float]] = {"mse_loss": [], "l0_loss": [], "loss": []}
    record: dict[str, np.ndarray] = {}
    for step in range(STEPS):
        out = sae.training_forward_pass(
            TrainStepInput(
                sae_in=torch.from_numpy(pool[order[step]]),
                coefficients={"l0": settings["l0_coefficient"]},
                dead_neuron_mask=None,
                n_training_steps=step,
                is_logging_step=False,
            )
        )
        out.loss.backward()
        losses["loss"].append(float(out.loss.detach()))
        for key in ("mse_loss", "l0_loss"):
            losses[key].append(float(out.losses[key].detach()))
        if step == 0:
            for name in NAMES:
                record[f"grad_{name}"] = getattr(sae, name).grad.numpy().copy()
            record["acts_0"] = out.feature_acts.detach().numpy()
        opt.step()
        opt.zero_grad()
    record |= {f"initial_{name}": a for name, a in initial.items()}
    record |= {f"final_{name}": getattr(sae, name).detach().numpy().copy() for name in NAMES}
    record |= {f"losses_{key}": np.array(v) for key, v in losses.items()}
    record |= {"pool": pool, "order": order}
    near = np.abs(out.hidden_pre.detach().numpy() - record["final_threshold"]) < settings["jumprelu_bandwidth"] / 2
    print(
        f"{settings}: step-0 L0 {(record['acts_0'] > 0).sum(-1).mean():.2f}, loss {losses['loss'][0]:.4f} -> "
        f"{losses['loss'][-1]:.4f}; last step's pre-activations within the kernel {near.mean():.3f}; "
        f"thresholds at 0 after the last step's projection and update {(record['final_threshold'] <= 0).sum()}, "
        f"below 0 {(record['final_threshold'] < 0).sum()}"
    )
    return record


if __name__ == "__main__":
    main()
