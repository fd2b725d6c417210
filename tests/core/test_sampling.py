"""core/sampling.py: each setting against transformers' own processors, the one ranking, and draws that
follow the warped distribution.

tests/fixtures/generation.npz was written by scripts/make_generation_fixtures.py (transformers 5.24 on
PyTorch, in its own environment; this test needs no torch): for given float64 logits, the softmax after
each processor generate() builds for a setting, in the order it builds them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from core import InputError, Sampling, sampler, warp
from core.sampling import apply_top_k, apply_top_p, draw, rank_of, ranked, sample

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "generation.npz"
TOLERANCE = 1e-7  # the bound; the two agree to about 1e-16 (float64, no BLAS)
# transformers' processor classes, by the stage each is here
STAGE_OF = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
}


@pytest.fixture(scope="module")
def reference():
    return np.load(FIXTURE)


def warp_cases(reference) -> list[str]:
    return [f"warp{i}_" for i in range(sum(1 for k in reference.files if k.endswith("_settings")))]


def settings(row) -> Sampling:
    t, k, p, r = row
    return Sampling(temperature=float(t), top_k=int(k) or None, top_p=float(p), repetition_penalty=float(r))


def test_each_setting_keeps_the_same_tokens_with_the_same_probabilities_as_transformers(reference):
    cases = warp_cases(reference)
    assert len(cases) >= 10
    for c in cases:
        s = settings(reference[c + "settings"])
        w = warp(reference[c + "logits"], s, reference[c + "previous"])
        # the same stages in the same order as generate() builds its processors
        assert w.stages == ("model", *(STAGE_OF[str(name)] for name in reference[c + "order"])), c
        expected = reference[c + "probs"]  # [stage, d_vocab]
        got = np.stack(w.probs)
        np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0, err_msg=c)
        np.testing.assert_array_equal(got > 0, expected > 0, err_msg=f"{c}: the kept sets differ")


def test_the_fixture_cases_cut_something():
    """Every cutting setting of the fixture cuts tokens away (otherwise the comparison above is weak)."""
    reference = np.load(FIXTURE)
    for c in warp_cases(reference):
        s = settings(reference[c + "settings"])
        if s.top_k or s.top_p < 1:
            assert (reference[c + "probs"][-1] == 0).sum() > 0, c


# ------------------------------------------------------------------ the ranking and each setting


def test_ties_rank_by_the_lower_id_and_top_k_keeps_exactly_k():
    logits = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, -np.inf])
    assert ranked(logits).tolist() == [1, 3, 2, 4, 5, 0, 6]
    for n in range(1, 8):
        assert ranked(logits, n).tolist() == ranked(logits)[:n].tolist()
        assert [rank_of(logits, t) for t in ranked(logits)] == list(range(7))
    kept = np.isfinite(apply_top_k(logits, 3))
    assert kept.tolist() == [False, True, True, True, False, False, False]  # two of the three tied at 2.0 cut


def test_top_p_keeps_the_smallest_set_whose_probability_reaches_p():
    logits = np.log([0.5, 0.25, 0.125, 0.125])  # sums exact in binary: the boundaries are exact
    for p, n in [(0.5, 1), (0.5000001, 2), (0.75, 2), (0.7500001, 3), (0.875, 3), (0.88, 4), (1.0, 4), (1e-9, 1)]:
        assert np.isfinite(apply_top_p(logits, p)).sum() == n, p
    tied = np.log([0.25, 0.25, 0.25, 0.25])
    assert np.isfinite(apply_top_p(tied, 0.4)).tolist() == [True, True, False, False]  # the lower ids


def test_temperature_zero_is_greedy_and_draws_nothing():
    logits = np.array([0.1, 2.0, 2.0, -1.0])
    rng = sampler(5)
    token, w, u = sample(logits, Sampling(temperature=0, top_k=3, top_p=0.2), rng)
    assert token == 1 and u is None and w.stages == ("model", "greedy")
    assert w.final.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert rng.random() == sampler(5).random()  # the stream was not touched


def test_a_tiny_temperature_does_not_overflow():
    w = warp(np.array([1000.0, 999.0, -1000.0]), Sampling(temperature=1e-300))
    assert np.isfinite(w.final).all() and w.final.tolist() == [1.0, 0.0, 0.0]


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    w = warp(np.array([2.0, -2.0, 1.0]), Sampling(repetition_penalty=2.0), previous=[0, 1, 1])
    assert w.logits[1].tolist() == [1.0, -4.0, 1.0]


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
    ],
)
def test_bad_settings_say_what_to_change(changes, says):
    with pytest.raises(InputError, match=says):
        Sampling(**changes)


def test_the_table_lists_the_kept_tokens_first_and_the_drawn_one_wherever_it_ranks():
    logits = np.linspace(3, -3, 40)  # token 0 most likely
    w = warp(logits, Sampling(temperature=1.5, top_p=0.97))
    kept = set(w.kept.tolist())
    rows = w.table(5, also=[30])
    assert [r.rank for r in rows] == [0, 1, 2, 3, 4, 30] and [r.id for r in rows] == [0, 1, 2, 3, 4, 30]
    assert all(r.kept == (r.id in kept) for r in rows)
    assert rows[-1].cut_by == ("top_p" if 30 not in kept else None)
    assert [len(r.probs) for r in rows] == [3] * 6 and rows[0].probs[0] == pytest.approx(w.probs[0][0])


# ------------------------------------------------------------------ the draws

SIGNIFICANCE = 0.001  # a chi-square test at this level: a correct sampler fails it one time in a thousand
DRAWS = 2000


def chi_square_sf(x: float, df: int) -> float:
    """P(X ≥ x) for X ~ χ²(df): 1 − the regularised lower incomplete gamma P(df/2, x/2), by its series."""
    a, z = df / 2, x / 2
    term = total = 1 / a
    for n in range(1, 10_000):
        term *= z / (a + n)
        total += term
        if term < total * 1e-15:
            break
    return 1 - math.exp(a * math.log(z) - z - math.lgamma(a)) * total


def test_the_chi_square_survival_function_is_right():
    # table values: the upper 0.1% point of chi-square with 1, 5 and 10 degrees of freedom
    for x, df in [(10.828, 1), (20.515, 5), (29.588, 10)]:
        assert chi_square_sf(x, df) == pytest.approx(0.001, rel=1e-3)


@pytest.mark.parametrize(
    "setting, seed",
    [
        (Sampling(), 0),
        (Sampling(temperature=0.7, top_k=6), 1),
        (Sampling(top_p=0.8), 2),
        (Sampling(temperature=1.3, top_k=9, top_p=0.9), 3),
        (Sampling(repetition_penalty=1.5, top_k=5), 4),
    ],
)
def test_2000_draws_follow_the_warped_distribution_and_never_leave_the_kept_set(setting, seed):
    logits = np.random.default_rng(100 + seed).normal(0, 1.0, size=12)
    previous = [0, 3, 3]
    w = warp(logits, setting, previous)
    kept = w.final > 0
    rng = sampler(seed)
    draws = np.array([sample(logits, setting, rng, previous)[0] for _ in range(DRAWS)])
    assert kept[draws].all(), "a token the settings cut away was drawn"
    observed = np.bincount(draws, minlength=logits.size)[kept]
    expected = DRAWS * w.final[kept]
    assert expected.min() >= 5  # the chi-square approximation holds
    stat = float(((observed - expected) ** 2 / expected).sum())
    p_value = chi_square_sf(stat, int(kept.sum()) - 1) if kept.sum() > 1 else 1.0
    assert p_value > SIGNIFICANCE, f"χ² = {stat:.1f} on {kept.sum() - 1} degrees of freedom: p = {p_value:.2g}"


def test_the_draw_rule_is_the_stated_one():
    probs = np.array([0.125, 0.0, 0.5, 0.375])  # ranked: 2, 3, 0 (exact in binary); 1 can never be drawn
    assert [draw(probs, u) for u in (0.0, 0.49, 0.5, 0.87, 0.875, 0.9999999)] == [2, 2, 3, 3, 0, 0]
    with pytest.raises(InputError, match=r"u must lie in \[0, 1\), got 1\.0"):
        draw(probs, 1.0)
    first = sampler(42).random()
    token, _, u = sample(np.log(probs + 1e-300), Sampling(), sampler(42))
    assert u == first and token == draw(warp(np.log(probs + 1e-300), Sampling()).final, first)


def test_the_same_seed_gives_the_same_draws():
    logits = np.random.default_rng(7).normal(size=50)
    s = Sampling(temperature=0.9, top_p=0.95)

    def run(seed):
        rng = sampler(seed)
        return [sample(logits, s, rng)[0] for _ in range(50)]

    assert run(11) == run(11) and run(11) != run(12)
