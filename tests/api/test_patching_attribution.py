"""Attribution patching through JSON: POST /api/v1/analysis/patching with `method: "attribution"` answers core's
estimate (core/attribution_patching.py, held against torch autograd in tests/core/test_patching.py) on the same
weights, in the exact sweep's grid and units, and refuses what it cannot estimate with a 422 saying why."""

from __future__ import annotations

import numpy as np
import pytest

from core.attribution_patching import attribution_sweep

from .test_circuits import INDUCTION, error, induction_model, post


@pytest.mark.parametrize("target", ["resid_pre", "attn_head_pos", "pattern"])
def test_attribution_answers_cores_estimate_in_the_exact_sweeps_grid(client, target):
    _, cfg, params, tok = induction_model()
    body = INDUCTION | {"target": target, "direction": "noise"}
    r = post(client, "patching", **body, method="attribution")
    exact = post(client, "patching", **body)
    a, w = tok.encode(r["answer"]["token"]).ids[0], tok.encode(r["wrong"]["token"]).ids[0]
    ids = [np.array(r["token_ids"][k]) for k in ("clean", "corrupted")]
    ours = attribution_sweep(params, cfg, *ids, a, w, target, direction="noise")
    assert r["method"] == "attribution" and exact["method"] == "exact" and r["passes"] == 0
    assert (r["rows"], r["columns"]) == (exact["rows"], exact["columns"])
    assert r["clean_metric"] == pytest.approx(exact["clean_metric"], abs=1e-4)
    assert r["corrupted_metric"] == pytest.approx(exact["corrupted_metric"], abs=1e-4)
    np.testing.assert_allclose(r["raw_grid"], ours.raw, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(r["grid"], ours.normalised, rtol=1e-6, atol=1e-6)


def test_attribution_refuses_frozen_attention_and_a_model_without_gradients(client, monkeypatch):
    said = error(client, "patching", **INDUCTION, method="attribution", frozen_attention=True)
    assert "frozen_attention needs method exact" in said
    import core.attribution_patching as atp
    from core import InputError

    def refuse(cfg):
        raise InputError("training does not support gated_mlp=True")

    monkeypatch.setattr(atp, "check_trainable", refuse)
    said = error(client, "patching", **INDUCTION, method="attribution")
    assert "needs the metric's gradient" in said and "gated_mlp" in said
    assert "method" in error(client, "patching", **INDUCTION, method="gradient")
