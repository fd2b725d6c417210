"""core/steering.py against torch hooks on the GPT-2 fixture (scripts/make_steering_fixtures.py: a vector added
to a block's input or output, a feature clamped, attention recomputed or frozen; float64, within 1e-9 of torch's
float64 logits, not bit for bit: another BLAS), and against what steering must keep."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from core import TransformerConfig, init_params, run_with_cache
from core.checkpoints import load_checkpoint
from core.errors import InputError
from core.generate import generate, generate_steered
from core.sae import load_sae
from core.sampling import Sampling
from core.steering import Steer, difference_of_means, steered_run

from .test_parity import as_float64

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_steering_fixtures.py"
ATOL = 1e-9


@pytest.fixture(scope="module")
def recorded():
    with np.load(FIXTURES / "steering.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def gpt2():
    ckpt = load_checkpoint(FIXTURES / "gpt2-tiny")
    return as_float64(ckpt.params), ckpt.cfg


def test_the_fixture_was_recorded_by_the_generator_as_it_is(recorded):
    assert str(recorded["meta_generator_sha256"]) == hashlib.sha256(GENERATOR.read_bytes()).hexdigest(), (
        "scripts/make_steering_fixtures.py changed since tests/fixtures/steering.npz was made: run make fixtures"
    )


def _steers(case: str, vector: np.ndarray) -> list[Steer]:
    sae = load_sae(FIXTURES / "steering-sae")
    return {
        "pre1_add": [Steer("blocks.1.hook_resid_pre", vector, 4.0, positions=(3, 7, 9))],
        "post0_add": [Steer("blocks.0.hook_resid_post", vector, -3.0)],
        "pre0_add": [Steer("blocks.0.hook_resid_pre", vector, 2.5, positions=(-1,))],
        "pre1_clamp": [Steer.of_feature(sae, 7, 5.0, mode="clamp")],
        "pre1_vclamp": [Steer("blocks.1.hook_resid_pre", vector, -2.0, mode="clamp")],
        "gen_pre1_add": [Steer("blocks.1.hook_resid_pre", vector, 4.0)],
        "gen_pre1_clamp": [Steer.of_feature(sae, 7, 5.0, mode="clamp")],
    }[case]


@pytest.mark.parametrize("case", ["pre1_add", "post0_add", "pre0_add", "pre1_clamp", "pre1_vclamp"])
@pytest.mark.parametrize("frozen", [False, True], ids=["recomputed", "frozen"])
def test_steering_equals_torch_hooks_on_gpt2(case, frozen, recorded, gpt2):
    params, cfg = gpt2
    run = steered_run(params, cfg, recorded["ids"], _steers(case, recorded["vector"]), frozen_attention=frozen)
    want = recorded[f"{case}/{'frozen' if frozen else 'recomputed'}"]
    np.testing.assert_allclose(run.logits, want, rtol=0, atol=ATOL)
    assert np.abs(want - recorded["unsteered"]).max() > 1e-3  # the steer moves the logits: the test can fail


def test_greedy_generation_equals_torch_unsteered(recorded, gpt2):
    params, cfg = gpt2
    steps = list(generate(params, cfg, recorded["ids"], 8, Sampling(temperature=0.0)))
    np.testing.assert_array_equal([s.token for s in steps], recorded["gen/unsteered/tokens"])


@pytest.mark.parametrize("case", ["gen_pre1_add", "gen_pre1_clamp"])
@pytest.mark.parametrize("frozen", [False, True], ids=["recomputed", "frozen"])
def test_steered_generation_equals_torch_hooks_on_gpt2(case, frozen, recorded, gpt2):
    """Greedy, 8 tokens, steered at every position of every step: the same tokens, each step's logits within
    ATOL (torch: the whole text each step, frozen patterns from an unsteered pass over the same tokens)."""
    params, cfg = gpt2
    key = f"{case}/{'frozen' if frozen else 'recomputed'}"
    steers = _steers(case, recorded["vector"])
    steps = list(
        generate_steered(params, cfg, recorded["ids"], 8, steers, Sampling(temperature=0.0), frozen_attention=frozen)
    )
    np.testing.assert_array_equal([s.token for s in steps], recorded[f"{key}/tokens"])
    logits = np.stack([s.warped.logits[0] for s in steps])
    np.testing.assert_allclose(logits, recorded[f"{key}/logits"], rtol=0, atol=ATOL)
    assert not np.array_equal(recorded[f"{key}/tokens"], recorded["gen/unsteered/tokens"])  # the steer matters


def test_frozen_steered_generation_records_the_unsteered_patterns_it_used(recorded, gpt2):
    """With frozen attention, a step's attention rows are the unsteered model's over the same tokens."""
    params, cfg = gpt2
    steers = _steers("gen_pre1_clamp", recorded["vector"])
    steps = list(generate_steered(params, cfg, recorded["ids"], 3, steers, Sampling(0.0), frozen_attention=True))
    text = np.concatenate([recorded["ids"], [s.token for s in steps[:2]]])
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
    _logits, cache = run_with_cache(params, cfg, text, names=names)
    want = np.stack([cache[name][:, -1, :] for name in names])
    np.testing.assert_allclose(steps[2].attention, want, rtol=0, atol=1e-12)


def test_steered_generation_keeps_a_prompt_position_on_its_token():
    """positions are the prompt's: -1 stays on the prompt's last token as the text grows (a zero push
    elsewhere would be the same text as steering only there)."""
    params, cfg = _toy()
    ids = np.arange(8) % 20
    v = np.random.default_rng(1).standard_normal(16)
    at_last = [Steer("blocks.1.hook_resid_pre", v, 6.0, positions=(-1,))]
    at_seven = [Steer("blocks.1.hook_resid_pre", v, 6.0, positions=(7,))]
    a = [s.token for s in generate_steered(params, cfg, ids, 5, at_last, Sampling(0.0))]
    b = [s.token for s in generate_steered(params, cfg, ids, 5, at_seven, Sampling(0.0))]
    assert a == b
    with pytest.raises(InputError, match="pos=8 is outside"):
        next(generate_steered(params, cfg, ids, 5, [Steer("blocks.1.hook_resid_pre", v, 1.0, positions=(8,))]))


def test_the_same_seed_draws_with_the_same_numbers_steered_or_not():
    params, cfg = _toy()
    ids = np.arange(8) % 20
    v = np.random.default_rng(2).standard_normal(16)
    plain = list(generate(params, cfg, ids, 6, Sampling(temperature=1.0), seed=9))
    steered = list(
        generate_steered(params, cfg, ids, 6, [Steer("blocks.0.hook_resid_post", v, 3.0)], Sampling(1.0), seed=9)
    )
    assert [s.u for s in plain] == [s.u for s in steered]


def test_frozen_and_recomputed_differ_only_through_later_attention(recorded, gpt2):
    params, cfg = gpt2
    steer = _steers("pre0_add", recorded["vector"])
    recomputed = steered_run(params, cfg, recorded["ids"], steer).logits
    frozen = steered_run(params, cfg, recorded["ids"], steer, frozen_attention=True).logits
    assert np.abs(recomputed - frozen).max() > 1e-6


def _toy():
    cfg = TransformerConfig(n_layers=3, d_model=16, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=16)
    return init_params(cfg, seed=3), cfg


@pytest.mark.parametrize("frozen", [False, True])
def test_a_zero_push_changes_nothing(frozen):
    params, cfg = _toy()
    ids = np.arange(8) % 20
    logits, _ = run_with_cache(params, cfg, ids, names=[])
    run = steered_run(params, cfg, ids, [Steer("blocks.1.hook_resid_mid", np.ones(16), 0.0)], frozen_attention=frozen)
    np.testing.assert_allclose(run.logits, logits[-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("frozen", [False, True])
def test_a_blocks_output_is_the_next_blocks_input(frozen):
    params, cfg = _toy()
    ids = np.arange(8) % 20
    v = np.random.default_rng(0).standard_normal(16)
    after = steered_run(params, cfg, ids, [Steer("blocks.0.hook_resid_post", v, 2.0)], frozen_attention=frozen)
    before = steered_run(params, cfg, ids, [Steer("blocks.1.hook_resid_pre", v, 2.0)], frozen_attention=frozen)
    np.testing.assert_allclose(after.logits, before.logits, rtol=0, atol=1e-12)


def test_a_clamp_is_the_reconstruction_with_the_feature_set_plus_the_error(recorded, gpt2):
    """clamp at c: decode(a with a_i = c) + (x - decode(a)), written out with the SAE's own encode and decode."""
    params, cfg = gpt2
    sae = load_sae(FIXTURES / "steering-sae")
    hook = "blocks.1.hook_resid_pre"
    _logits, base = run_with_cache(params, cfg, recorded["ids"], names=[hook])
    x = base[hook]
    acts = sae.encode(x)
    clamped = acts.copy()
    clamped[:, 7] = 5.0
    want = sae.decode(clamped) + (x - sae.decode(acts))
    run = steered_run(params, cfg, recorded["ids"], [Steer.of_feature(sae, 7, 5.0, mode="clamp")], names=[hook])
    np.testing.assert_allclose(run.cache[hook], want, rtol=0, atol=1e-12)
    assert np.abs(run.cache[hook] - x).max() > 0.1


@pytest.mark.parametrize(
    "steer, message",
    [
        (Steer("blocks.0.attn.hook_z", np.zeros(16), 1.0), "cannot be steered"),
        (Steer("blocks.9.hook_resid_pre", np.zeros(16), 1.0), "cannot be steered"),
        (Steer("blocks.0.hook_resid_pre", np.zeros(15), 1.0), "d_model=16 numbers, not 15"),
        (Steer("blocks.0.hook_resid_pre", np.zeros(16), float("nan")), "must be finite"),
        (Steer("blocks.0.hook_resid_pre", np.zeros(16), 1.0, positions=(8,)), "pos=8 is outside"),
        (Steer("blocks.0.hook_resid_pre", np.zeros(16), 1.0, mode="clamp"), "not all zeros"),
        (Steer("blocks.0.hook_resid_pre", np.ones(16), 1001.0), "beyond ±1000"),
    ],
)
def test_what_cannot_be_steered_is_refused_with_the_reason(steer, message):
    params, cfg = _toy()
    with pytest.raises(InputError, match=message):
        steered_run(params, cfg, np.arange(8), [steer])


def test_difference_of_means_over_every_token():
    a = [np.array([[1.0, 0.0], [3.0, 0.0]]), np.array([[2.0, 3.0]])]
    b = [np.array([[0.0, 1.0]])]
    np.testing.assert_allclose(difference_of_means(a, b), [2.0, 0.0])
    with pytest.raises(InputError, match="texts on both sides"):
        difference_of_means(a, [])
