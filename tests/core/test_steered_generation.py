"""core.generate.generate_steered (a KV cache, core.steering.SteeredDecoder) against the whole-text reference
below: the steered run of the whole text so far at every step, as generate_steered did before it cached
(tests/core/test_steering.py checks both against torch hooks on the GPT-2 fixture). Several families (learned
positions, rotary, grouped-query, parallel, a local window), attention recomputed and frozen, vectors added and
clamped and SAE features added and clamped, at every position or at the prompt's: the same tokens, and every
step's logits and attention rows within ATOL (not bit for bit: the cached passes multiply other shapes)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from core import TransformerConfig, run_with_cache
from core.checkpoints import load_checkpoint
from core.generate import generate, generate_steered
from core.sae import SAE, SAEConfig
from core.sampling import Sampling, sample, sampler
from core.steering import Steer, steer_layer, steered_run

from .test_analysis import random_params
from .test_parity import as_float64

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ATOL = 1e-9
N_NEW = 6


def whole_text_reference(
    params, cfg, prompt, max_new_tokens: int, steers: Sequence[Steer], sampling: Sampling, frozen: bool, seed: int = 0
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(token, logits [d_vocab], attention rows [n_layers, n_heads, n_keys]) of each step, each step a steered run
    of the whole text so far (the prompt's positions made non-negative, so they stay on their tokens)."""
    prompt = np.asarray(prompt)
    n_prompt = prompt.size
    fixed = [
        s if s.positions is None else replace(s, positions=tuple(sorted({p % n_prompt for p in s.positions})))
        for s in steers
    ]
    first = min(steer_layer(s, cfg)[0] for s in fixed)
    frozen_from = min(steer_layer(s, cfg)[1] for s in fixed) if frozen else None
    patterns = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
    rng = None if sampling.greedy else sampler(seed)
    context = [int(t) for t in prompt]
    for _index in range(max_new_tokens):
        tokens = np.array(context)
        _logits, base = run_with_cache(
            params, cfg, tokens, names=[f"blocks.{first}.hook_resid_pre", *patterns], logits=False
        )
        used = [patterns[layer] for layer in range(first, cfg.n_layers) if frozen_from is None or layer < frozen_from]
        run = steered_run(params, cfg, tokens, fixed, frozen_attention=frozen, names=used, base=base)
        rows = np.stack([run.cache.get(name, base[name])[:, -1, :] for name in patterns])
        token, _warped, _u = sample(run.logits, sampling, rng, context)
        yield token, run.logits, rows
        context.append(token)


FAMILIES = {
    "GPT-2 (learned)": dict(n_heads=4),
    "rotary, rotate half, partial": dict(
        n_heads=4, positional_embedding_type="rotary", rotary_dim=2, rotary_adjacent_pairs=False
    ),
    "Llama (RMS rotary GQA gated)": dict(
        n_heads=4,
        positional_embedding_type="rotary",
        normalization_type="RMS",
        n_key_value_heads=2,
        gated_mlp=True,
        act_fn="silu",
        bias=False,
    ),
    "GPT-NeoX (parallel rotary)": dict(n_heads=4, parallel_attn_mlp=True, positional_embedding_type="rotary"),
    "local window": dict(n_heads=2, attn_types=("global", "local", "global"), window_size=3),
}


def _family(name: str):
    cfg = TransformerConfig(d_model=16, n_layers=3, d_vocab=29, n_ctx=24, d_mlp=32, **FAMILIES[name])
    return random_params(cfg, seed=5), cfg


def _sae(cfg: TransformerConfig, hook: str, seed: int) -> SAE:
    rng = np.random.default_rng(seed)
    d, d_sae = cfg.d_model, 3 * cfg.d_model
    return SAE(
        SAEConfig("standard", d, d_sae, hook, "toy", dtype="float64"),
        W_enc=rng.standard_normal((d, d_sae)) * 0.4,
        b_enc=rng.standard_normal(d_sae) * 0.1 + 0.2,
        W_dec=rng.standard_normal((d_sae, d)) * 0.4,
        b_dec=rng.standard_normal(d) * 0.1,
    )


def _steers(case: str, cfg: TransformerConfig) -> list[Steer]:
    rng = np.random.default_rng(11)
    v, w = rng.standard_normal(cfg.d_model), rng.standard_normal(cfg.d_model)
    return {
        "vector add, every position": [Steer("blocks.1.hook_resid_pre", v, 3.0)],
        "vector add, prompt positions": [Steer("blocks.0.hook_resid_mid", v, 4.0, positions=(1, -1))],
        "vector clamp at the first block's input": [Steer("blocks.0.hook_resid_pre", v, -2.0, mode="clamp")],
        "feature clamp and add, two layers": [
            Steer.of_feature(_sae(cfg, "blocks.1.hook_resid_pre", 3), 4, 6.0, mode="clamp"),
            Steer.of_feature(_sae(cfg, "blocks.2.hook_resid_pre", 4), 9, 3.0, positions=(0, 2)),
        ],
        "vector and feature at one hook, output of the last block": [
            Steer("blocks.2.hook_resid_post", w, 2.0),
            Steer.of_feature(_sae(cfg, "blocks.2.hook_resid_post", 5), 1, 4.0, mode="clamp", positions=(-2,)),
        ],
    }[case]


def _compare(params, cfg, prompt, steers, sampling, frozen, seed=0):
    steps = list(generate_steered(params, cfg, prompt, N_NEW, steers, sampling, frozen_attention=frozen, seed=seed))
    want = list(whole_text_reference(params, cfg, prompt, N_NEW, steers, sampling, frozen, seed))
    assert [s.token for s in steps] == [t for t, _l, _r in want]
    for step, (_token, logits, rows) in zip(steps, want):
        np.testing.assert_allclose(step.warped.logits[0], logits, rtol=0, atol=ATOL)
        np.testing.assert_allclose(step.attention, rows, rtol=0, atol=ATOL)
    return steps


@pytest.mark.parametrize("frozen", [False, True], ids=["recomputed", "frozen"])
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(
    "case",
    [
        "vector add, every position",
        "vector add, prompt positions",
        "vector clamp at the first block's input",
        "feature clamp and add, two layers",
        "vector and feature at one hook, output of the last block",
    ],
)
def test_the_cached_generation_equals_the_whole_text_one(case, family, frozen):
    params, cfg = _family(family)
    prompt = np.array([3, 17, 1, 7, 26, 9, 0, 7])
    steers = _steers(case, cfg)
    steps = _compare(params, cfg, prompt, steers, Sampling(temperature=0.0), frozen)
    plain = list(generate(params, cfg, prompt, N_NEW, Sampling(temperature=0.0)))
    moved = max(np.abs(s.warped.logits[0] - p.warped.logits[0]).max() for s, p in zip(steps, plain))
    assert moved > 1e-3  # the steers change the logits: the comparison can fail


@pytest.mark.parametrize("frozen", [False, True], ids=["recomputed", "frozen"])
def test_the_cached_generation_samples_as_the_whole_text_one(frozen):
    params, cfg = _family("Llama (RMS rotary GQA gated)")
    steers = _steers("feature clamp and add, two layers", cfg)
    _compare(params, cfg, np.array([5, 2, 8]), steers, Sampling(temperature=1.3, top_k=12), frozen, seed=7)


def test_a_one_token_prompt():
    params, cfg = _family("rotary, rotate half, partial")
    _compare(
        params,
        cfg,
        np.array([4]),
        [Steer("blocks.0.hook_resid_pre", np.ones(16), 1.5, positions=(0,))],
        Sampling(0.0),
        True,
    )


@pytest.mark.parametrize("frozen", [False, True], ids=["recomputed", "frozen"])
def test_the_gpt2_fixture_float32(frozen):
    """The checkpoint as it is stored (float32): within float32's rounding of the whole-text reference."""
    ckpt = load_checkpoint(FIXTURES / "gpt2-tiny")
    params, cfg = ckpt.params, ckpt.cfg
    v = np.random.default_rng(2).standard_normal(cfg.d_model).astype(np.float32)
    steers = [Steer("blocks.1.hook_resid_pre", v, 4.0), Steer("blocks.0.hook_resid_post", v, -1.0, positions=(2,))]
    prompt = np.array([5, 44, 17, 3, 90, 12])
    steps = list(generate_steered(params, cfg, prompt, N_NEW, steers, Sampling(0.0), frozen_attention=frozen))
    want = list(whole_text_reference(params, cfg, prompt, N_NEW, steers, Sampling(0.0), frozen))
    assert [s.token for s in steps] == [t for t, _l, _r in want]
    np.testing.assert_allclose(
        np.stack([s.warped.logits[0] for s in steps]), np.stack([l for _t, l, _r in want]), rtol=0, atol=1e-4
    )
    params64 = as_float64(params)
    _compare(params64, cfg, prompt, steers, Sampling(0.0), frozen)
