"""core/generate.py: greedy generation against transformers' generate(do_sample=False) on the GPT-2 fixture
and every decoder family's, each step's attention row against a run without the cache, and what a step
records.

tests/fixtures/generation.npz was written by scripts/make_generation_fixtures.py (transformers on
PyTorch, float32, in its own environment; this test needs no torch).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from core import (
    PRESETS,
    SINK_THRESHOLD,
    InputError,
    Sampling,
    generate,
    generate_ids,
    init_params,
    kv_cache_bytes,
    run_with_cache,
)
from core.checkpoints import load_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE = FIXTURES / "generation.npz"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_generation_fixtures.py"
FLOAT32 = 1e-4  # a checkpoint's float32 numbers against another implementation's
FLOAT64 = 1e-10  # float64 against float64, reached by another path (the cache)
TOY = PRESETS["toy"].replace(d_vocab=96, n_ctx=64)


def greedy_cases() -> list[str]:
    reference = np.load(REFERENCE)
    return [f"greedy{i}_" for i in range(sum(1 for k in reference.files if k.endswith("_prompt_ids")))]


def test_the_fixture_was_made_by_the_script_as_it_is():
    recorded = str(np.load(REFERENCE)["meta_script_sha256"])
    assert recorded == hashlib.sha256(SCRIPT.read_bytes()).hexdigest(), (
        "scripts/make_generation_fixtures.py changed since it wrote the fixture: run make fixtures"
    )


@pytest.mark.parametrize("case", greedy_cases())
def test_greedy_generation_equals_transformers_token_for_token(case):
    ref = np.load(REFERENCE)
    folder = str(ref[case + "folder"])
    ckpt = load_checkpoint(FIXTURES / folder)
    prompt = ckpt.tokenizer.encode(str(ref[case + "text"])).ids
    assert prompt == ref[case + "prompt_ids"].tolist()
    eos = int(ref[case + "eos"])
    expected = ref[case + "ids"]
    steps = list(
        generate(
            ckpt.params, ckpt.cfg, prompt, len(expected), Sampling(temperature=0), stop_ids=[eos] if eos >= 0 else []
        )
    )
    assert [s.token for s in steps] == expected.tolist(), folder
    # and from the same logits (each step's are the model's stage)
    np.testing.assert_allclose(np.stack([s.warped.logits[0] for s in steps]), ref[case + "logits"], atol=FLOAT32)


def test_the_greedy_cases_cover_gpt2_llama_and_every_family():
    ref = np.load(REFERENCE)
    folders = {str(ref[c + "folder"]) for c in greedy_cases()}
    assert {"gpt2-tiny", "families/llama-gqa"} <= folders
    assert {f"families/{p.name}" for p in (FIXTURES / "families").iterdir() if p.is_dir()} - folders <= {
        "families/gpt-neox-sequential",
        "families/qwen3-qk-norm-bf16",
    }


def rows_without_the_cache(params, cfg, prompt, steps) -> list[np.ndarray]:
    """Each step's choosing query's row of every layer's pattern, from one full run over the whole text."""
    text = np.concatenate([prompt, [s.token for s in steps]])
    _, cache = run_with_cache(params, cfg, text)
    out = []
    for s in steps:
        q = len(prompt) - 1 + s.index  # the position whose logits chose the token
        out.append(
            np.stack([cache[f"blocks.{layer}.attn.hook_pattern"][:, q, : q + 1] for layer in range(cfg.n_layers)])
        )
    return out


def test_each_steps_attention_row_equals_a_run_without_the_cache_in_float64():
    params = init_params(TOY, seed=3)
    prompt = np.array([40, 41, 42, 43, 44, 45])
    steps = list(generate(params, TOY, prompt, 12, Sampling(temperature=0.9, top_k=30), seed=5))
    for step, expected in zip(steps, rows_without_the_cache(params, TOY, prompt, steps)):
        assert step.attention.shape == (TOY.n_layers, TOY.n_heads, len(prompt) + step.index)
        np.testing.assert_allclose(step.attention, expected, atol=FLOAT64, rtol=0)
        np.testing.assert_allclose(step.attention.sum(-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("folder", ["families/llama-gqa", "families/mistral-window", "families/gpt-neo-local"])
def test_attention_rows_under_grouped_query_and_sliding_windows_equal_a_run_without_the_cache(folder):
    ckpt = load_checkpoint(FIXTURES / folder)
    prompt = np.array(ckpt.tokenizer.encode("The cat sat on the mat").ids)
    steps = list(generate(ckpt.params, ckpt.cfg, prompt, 8, Sampling(top_p=0.9), seed=1))
    for step, expected in zip(steps, rows_without_the_cache(ckpt.params, ckpt.cfg, prompt, steps)):
        assert step.attention.shape[:2] == (ckpt.cfg.n_layers, ckpt.cfg.n_heads)  # every query head
        np.testing.assert_allclose(step.attention, expected, atol=FLOAT32)


def test_a_step_records_its_cache_and_its_probabilities():
    params = init_params(TOY, seed=0)
    prompt = np.array([10, 11, 12])
    steps = list(generate(params, TOY, prompt, 5, Sampling(temperature=0.8, top_p=0.9), seed=2))
    for s in steps:
        n_cached = len(prompt) + s.index  # every token before the new one
        # the toy's drawn weights are float64: twice the calculator's float32 bytes
        assert s.cache_bytes == 2 * kv_cache_bytes(TOY, n_cached, dtype="float32").bytes
        assert s.prob == pytest.approx(s.warped.probs[0][s.token]) and s.drawn_prob > 0
        assert 0 <= s.u < 1
    assert [s.index for s in steps] == list(range(5))


def test_sink_heads_are_those_over_the_threshold_on_the_first_token():
    params = init_params(TOY, seed=0)
    first = next(generate(params, TOY, np.array([33]), 1, Sampling(temperature=0)))
    # a one-token prompt: its query sees only itself, the first token: every head is a sink
    assert first.sink_heads() == [(layer, head) for layer in range(TOY.n_layers) for head in range(TOY.n_heads)]
    steps = list(generate(params, TOY, np.arange(20, 40), 3, Sampling(temperature=0)))
    for s in steps:
        expected = {(int(a), int(b)) for a, b in zip(*np.nonzero(s.attention[:, :, 0] > SINK_THRESHOLD))}
        assert set(s.sink_heads()) == expected
        assert s.sink_heads(threshold=1.0) == []


def test_a_stop_token_ends_the_generation_and_is_the_last_step():
    params = init_params(TOY, seed=1)
    prompt = np.array([5, 6, 7])
    free = generate_ids(params, TOY, prompt, 10, Sampling(temperature=1.2), seed=4)
    stop = int(free[3])
    first = int(np.flatnonzero(free == stop)[0])
    steps = list(generate(params, TOY, prompt, 10, Sampling(temperature=1.2), seed=4, stop_ids=[stop]))
    assert [s.token for s in steps] == free[: first + 1].tolist()
    assert steps[-1].stopped and not any(s.stopped for s in steps[:-1])


def test_the_same_seed_writes_the_same_text():
    params = init_params(TOY, seed=0)
    prompt = np.array([1, 2, 3])
    s = Sampling(temperature=1.0, top_k=20)
    a, b = (generate_ids(params, TOY, prompt, 20, s, seed=9) for _ in range(2))
    assert a.tolist() == b.tolist()
    assert a.tolist() != generate_ids(params, TOY, prompt, 20, s, seed=10).tolist()


def test_what_cannot_be_generated_says_why():
    params = init_params(TOY, seed=0)
    with pytest.raises(InputError, match="causal"):
        list(generate(params, TOY.replace(attention_dir="bidirectional"), [1, 2], 3))
    with pytest.raises(InputError, match="at most 4"):
        list(generate(params, TOY, np.arange(60), 5))
    with pytest.raises(InputError, match="max_new_tokens"):
        list(generate(params, TOY, [1], -1))
    assert list(generate(params, TOY, [1], 0)) == []
