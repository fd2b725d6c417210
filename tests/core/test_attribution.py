"""core/attribution.py against Captum and torch autograd (scripts/make_attribution_fixtures.py, in float64), against
finite differences, and the direct logit attribution's exact sum.

GPT-2 (tests/fixtures/gpt2-tiny), Llama (families/llama-gqa: grouped keys, SwiGLU, RMS norm), Qwen3 (qwen3-qk-norm:
query and key norms) and GPT-NeoX (gpt-neox-parallel: parallel blocks, a quarter of each head rotated), all within
1e-9 of torch autograd: the generator gives transformers' float32 steps (rotary angles, RMS norms, the eager
softmax) float64 formulas. A family core/backprop.py could not differentiate would wait in AWAITING_BACKWARD
(skipped with the reason core gives; a test fails once it trains, so that it is moved back in)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from core import InputError, run_with_cache
from core import attribution as A
from core.backprop import metric_gradients
from core.checkpoints import load_checkpoint

from .test_parity import as_float64

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_attribution_fixtures.py"
FOLDERS = {
    "gpt2": "gpt2-tiny",
    "llama": "families/llama-gqa",
    "qwen3": "families/qwen3-qk-norm",
    "neox": "families/gpt-neox-parallel",
}
# core/backprop.py gives every family's gradients now (core/backprop_blocks.py): none waits
AWAITING_BACKWARD: set[str] = set()
CASES = ("last", "contrast")
ATOL = 1e-9  # float64 throughout, on both sides
CAPTUM_IG_ATOL = 1e-6  # Captum multiplies by the Gauss–Legendre weights as float32 (torch.tensor(...).float())


@pytest.fixture(scope="module")
def recorded():
    with np.load(FIXTURES / "attribution.npz") as z:
        return {k: z[k] for k in z.files}


_models: dict[str, tuple] = {}


def model(name: str):
    if name not in _models:
        ckpt = load_checkpoint(FIXTURES / FOLDERS[name])
        _models[name] = (as_float64(ckpt.params), ckpt.cfg)
    return _models[name]


def case(recorded, name: str, which: str) -> dict:
    prefix = f"{name}/{which}/"
    return {k[len(prefix) :]: v for k, v in recorded.items() if k.startswith(prefix)}


def needs_backward(name: str) -> None:
    if name in AWAITING_BACKWARD:
        reason = A.gradient_support(*model(name))
        assert reason, f"core/backprop.py now gives {name}'s gradients: move it out of AWAITING_BACKWARD"
        pytest.skip(f"core/backprop.py has no backward pass for the {name} family yet: {reason}")


def test_the_fixture_was_recorded_by_the_generator_as_it_is(recorded):
    assert str(recorded["meta_generator_sha256"]) == hashlib.sha256(GENERATOR.read_bytes()).hexdigest(), (
        "scripts/make_attribution_fixtures.py changed since tests/fixtures/attribution.npz was made: run make fixtures"
    )


def test_the_families_awaiting_the_backward_pass_are_still_refused():
    """When core/backprop.py learns a family, move it out of AWAITING_BACKWARD: its Captum comparisons then run."""
    for name in AWAITING_BACKWARD:
        assert A.gradient_support(*model(name)), name


def _readout(params, cfg, rec):
    contrast = int(rec["contrast"])
    return A.readout(params, cfg, int(rec["target"]), None if contrast < 0 else contrast)


@pytest.mark.parametrize("which", CASES)
@pytest.mark.parametrize("name", list(FOLDERS))
def test_gradient_and_metric_equal_torch_autograd(name, which, recorded):
    needs_backward(name)
    params, cfg = model(name)
    rec = case(recorded, name, which)
    position, read = int(rec["position"]), _readout(params, cfg, rec)
    x = params["embed"]["W_E"][rec["ids"]]
    metric, grad = metric_gradients(params, cfg, x[None], position, read.direction, read.bias)
    np.testing.assert_allclose(metric[0], rec["metric"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(grad[0], rec["grad"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient", "integrated_gradients", "occlusion"])
@pytest.mark.parametrize("which", CASES)
@pytest.mark.parametrize("name", list(FOLDERS))
def test_each_method_equals_captum(name, which, method, recorded):
    needs_backward(name)
    params, cfg = model(name)
    rec = case(recorded, name, which)
    position, read = int(rec["position"]), _readout(params, cfg, rec)
    got = A.token_attribution(params, cfg, rec["ids"], position, read, method, steps=int(recorded["meta_steps"]))
    atol = ATOL
    np.testing.assert_allclose(got.metric, rec["metric"], rtol=0, atol=atol)
    np.testing.assert_allclose(got.baseline_metric, rec["baseline_metric"], rtol=0, atol=atol)
    if method != "integrated_gradients":
        np.testing.assert_allclose(got.scores, rec[method], rtol=0, atol=atol)
        return
    np.testing.assert_allclose(got.scores, rec["ig_float64"], rtol=0, atol=atol)  # torch autograd, float64 weights
    np.testing.assert_allclose(got.scores, rec[method], rtol=0, atol=CAPTUM_IG_ATOL)  # Captum's own
    # Captum's delta: Σ attributions − (f(x) − f(baseline)), its attributions carrying float32 weights
    np.testing.assert_allclose(got.convergence_delta, rec["ig_delta"], rtol=0, atol=CAPTUM_IG_ATOL)


@pytest.mark.parametrize("which", CASES)
@pytest.mark.parametrize("name", list(FOLDERS))
def test_direct_logit_by_head_and_source_sums_to_the_logit(name, which, recorded):
    """Every family (no gradient needed): heads by source, embeddings, MLPs and biases sum to torch's metric."""
    params, cfg = model(name)
    rec = case(recorded, name, which)
    position, read = int(rec["position"]), _readout(params, cfg, rec)
    logits, cache = run_with_cache(params, cfg, rec["ids"], names=A.direct_logit_hooks(cfg))
    d = A.direct_logit_by_source(cache, position, read)
    total = d.heads.sum() + sum(value for _label, value in d.parts)
    assert total == pytest.approx(float(read.of_logits(logits[position])), abs=1e-11)  # exactly, up to rounding
    assert d.metric == pytest.approx(float(rec["metric"]), abs=ATOL)  # the logits are torch's
    assert not d.heads[:, :, position + 1 :].any()  # nothing moves from a later token under the causal mask
    # each head's sources sum to its whole write, as the residual decomposition reads it (core/cache.py)
    dec = cache_decomposition(params, cfg, rec["ids"], position, read)
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            assert d.heads[layer, head].sum() == pytest.approx(dec[f"L{layer}H{head}"], abs=ATOL)


def cache_decomposition(params, cfg, ids, position, read) -> dict[str, float]:
    """decompose_resid's direct logit of each part for the target, minus the contrast's."""
    from core.cache import decomposition_hooks

    _logits, cache = run_with_cache(params, cfg, ids, names=decomposition_hooks(cfg))
    d = cache.decompose_resid(read.target, position)
    values = dict(zip(d.labels, d.direct_logit))
    if read.contrast is not None:
        c = cache.decompose_resid(read.contrast, position)
        values = {k: v - w for (k, v), w in zip(values.items(), c.direct_logit)}
    return values


def test_gradient_equals_finite_differences_at_a_scaled_input():
    """Away from the text (α = 0.4, where integrated gradients reads it): central differences, h = 1e-5."""
    params, cfg = model("gpt2")
    ids = np.array([5, 17, 200, 33, 9, 150])
    read = A.readout(params, cfg, 12, 40)
    x = 0.4 * params["embed"]["W_E"][ids]
    _m, grad = metric_gradients(params, cfg, x[None], 4, read.direction, read.bias)
    rng = np.random.default_rng(0)
    for _ in range(6):
        i, j = int(rng.integers(0, 5)), int(rng.integers(0, cfg.d_model))
        h = 1e-5
        up, down = x.copy(), x.copy()
        up[i, j] += h
        down[i, j] -= h
        f = lambda e: metric_gradients(params, cfg, e[None], 4, read.direction, read.bias, grad=False)[0][0]  # noqa: E731
        assert grad[0, i, j] == pytest.approx((f(up) - f(down)) / (2 * h), abs=1e-8)
    assert not grad[0, 5].any()  # position 5 is after the metric's position 4


def test_integrated_gradients_is_complete_with_enough_steps():
    """Σ scores → metric − baseline_metric: the Gauss–Legendre error shrinks with the steps."""
    params, cfg = model("gpt2")
    ids = np.array([5, 17, 200, 33, 9, 150, 7])
    read = A.readout(params, cfg, 12)
    deltas = [
        abs(A.token_attribution(params, cfg, ids, -1, read, "integrated_gradients", s).convergence_delta)
        for s in (2, 32)
    ]
    assert deltas[1] < 1e-9 < deltas[0]


def test_batches_of_any_size_give_the_same_scores(monkeypatch):
    params, cfg = model("gpt2")
    ids = np.array([5, 17, 200, 33, 9, 150, 7])
    read = A.readout(params, cfg, 12, 13)
    whole = A.token_attribution(params, cfg, ids, -1, read, "integrated_gradients", 9)
    monkeypatch.setattr(A, "BATCH_VALUES", 1)  # one row per batch
    one = A.token_attribution(params, cfg, ids, -1, read, "integrated_gradients", 9)
    np.testing.assert_allclose(one.scores, whole.scores, rtol=0, atol=1e-12)


def test_gauss_legendre_is_captums_rule():
    alphas, weights = A.gauss_legendre(4)
    assert weights.sum() == pytest.approx(1.0)
    assert ((0 < alphas) & (alphas < 1)).all()
    assert (alphas * weights).sum() == pytest.approx(0.5)  # ∫₀¹ α dα
    assert (alphas**7 * weights).sum() == pytest.approx(1 / 8)  # exact to degree 2·4 − 1


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda p, c: A.readout(p, c, 320), "outside the vocabulary"),
        (lambda p, c: A.readout(p, c, 3, 3), "the target itself"),
        (lambda p, c: A.check_steps(A.MAX_STEPS + 1), "steps"),
        (lambda p, c: A.token_attribution(p, c, np.array([1, 2]), 2, A.readout(p, c, 3), "saliency"), "position 2"),
        (lambda p, c: A.token_attribution(p, c, np.array([1, 2]), 0, A.readout(p, c, 3), "direct_logit"), "method"),
    ],
)
def test_bad_input_is_refused_saying_why(call, words):
    params, cfg = model("gpt2")
    with pytest.raises(InputError, match=words):
        call(params, cfg)


def test_metric_gradients_equal_backprop_gradients_embed():
    """The same gradient through core/backprop.py's public gradients(): dlogits one-hot (+1 target, −1 contrast)."""
    from core.backprop import gradients

    params, cfg = model("gpt2")
    ids = np.array([[5, 17, 200, 33, 9, 150, 7]])
    dlogits = np.zeros((*ids.shape, cfg.d_vocab))
    dlogits[0, 4, 12], dlogits[0, 4, 40] = 1.0, -1.0
    logits, grads = gradients(params, cfg, ids, dlogits, hooks=False, param_grads=False)
    read = A.readout(params, cfg, 12, 40)
    metric, grad = metric_gradients(params, cfg, params["embed"]["W_E"][ids[:, :5]], 4, read.direction, read.bias)
    assert metric[0] == pytest.approx(logits[0, 4, 12] - logits[0, 4, 40], abs=1e-12)
    np.testing.assert_allclose(grad[0], grads.embed[0, :5], rtol=0, atol=1e-12)
    assert not grads.embed[0, 5:].any()
