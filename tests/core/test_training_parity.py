"""core's trainer against PyTorch: the same model, initial weights and batches, 50 steps.

tests/fixtures/training_parity.npz was recorded by scripts/make_training_fixtures.py with torch autograd
and torch.optim.AdamW (gradient clipping by global norm, warm-up then cosine decay); this test needs no
torch. It runs core.train.optimisation_step, the step Training takes, on the same numbers: the loss at
every step, the first step's gradients and the final weights agree within 1e-8 (relative) in float64
and 1e-4 in float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core import TransformerConfig, backprop, init_params
from core.optim import AdamW, ParamVector, learning_rate
from core.train import optimisation_step

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "training_parity.npz"
TOLERANCE = {"float64": 1e-8, "float32": 1e-4}


def _cases() -> list[str]:
    with np.load(FIXTURE) as z:
        return sorted({key.split("/")[0] for key in z.files})


def _load(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(FIXTURE) as z:
        arrays = {key.split("/", 1)[1]: z[key] for key in z.files if key.startswith(name + "/")}
    return json.loads(str(arrays.pop("meta"))), arrays


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


@pytest.mark.parametrize("name", _cases())
def test_fifty_steps_match_torch(name):
    meta, ref = _load(name)
    cfg = TransformerConfig(**meta["cfg"])
    tol, opt = TOLERANCE[meta["dtype"]], meta["opt"]
    vector = ParamVector(init_params(cfg, dtype=np.dtype(meta["dtype"])))
    for name_, view in zip(vector.names, _views(vector)):
        view[...] = ref[f"initial/{name_}"]
    optimizer = AdamW(vector, betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"])

    batches = ref["batches"].astype(np.int64)
    _, grads = backprop.loss_and_grads(vector.params, cfg, batches[0][:, :-1], batches[0][:, 1:])
    for n in vector.names:
        assert _relative(_get(grads, n), ref[f"grad0/{n}"]) <= tol, f"first-step gradient of {n}"

    losses, norms = [], []
    for step, batch in enumerate(batches):
        lr = learning_rate(step, lr=opt["lr"], steps=meta["steps"], warmup=opt["warmup"], min_lr=opt["min_lr"])
        loss, norm = optimisation_step(vector, optimizer, cfg, batch, lr, opt["grad_clip"])
        losses.append(loss)
        norms.append(norm)
    np.testing.assert_allclose(losses, ref["losses"], rtol=tol, atol=0)
    np.testing.assert_allclose(norms, ref["grad_norms"], rtol=tol * 10, atol=0)
    for n, view in zip(vector.names, _views(vector)):
        assert view.dtype == np.dtype(meta["dtype"])
        assert _relative(view, ref[f"final/{n}"]) <= tol, f"final weights of {n}"


def _views(vector: ParamVector) -> list[np.ndarray]:
    return [_get(vector.params, n) for n in vector.names]


def _get(tree, name: str) -> np.ndarray:
    for key in name.split("."):
        tree = tree[int(key)] if key.isdigit() else tree[key]
    return tree


def test_the_fixture_covers_clipping_and_both_precisions():
    metas = [_load(name)[0] for name in _cases()]
    assert {m["dtype"] for m in metas} == {"float32", "float64"}
    assert any(0 < m["clipped_steps"] < m["steps"] for m in metas)  # clipped on some steps, not on others
    assert any(m["opt"]["grad_clip"] == 0 for m in metas)
    assert any(m["opt"]["warmup"] > 0 for m in metas)
