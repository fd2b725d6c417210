"""A pass shared by a team of threads (core/threads.py) computes what one thread computes.

The team cuts a step into pieces: row ranges, attention's query blocks by head group. Attention's pieces
make the very BLAS calls a single thread makes, so its numbers are equal to the last bit on any kernel.
A product cut into row ranges can round differently in the last bit where the BLAS kernel blocks by the
matrix's size (OpenBLAS's Haswell kernel does), so a whole forward pass is held to the project's
tolerances (float64 1e-10, float32 1e-4) rather than to bits.
"""

from __future__ import annotations

import contextvars
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from core import TransformerConfig, hook_names, init_params, run_with_cache
from core.attention import reference_attention, scaled_dot_product_attention
from core.threads import MEMORY, ROWS, SERIAL, Slabs, Team, blas_threads, team_for

ROOT = Path(__file__).resolve().parents[2]

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-4}


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(3) as p:
        yield p


@pytest.mark.parametrize("n", [1, 63, 64, 65, 128, 130, 1000, 1024])
@pytest.mark.parametrize("width", [1, 2, 3])
def test_ranges_cover_every_row_once_in_pieces_of_at_least_rows(n, width, pool):
    pieces = Team(width, pool).ranges(n)
    assert pieces[0].start == 0 and pieces[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
    assert len(pieces) == 1 or all(p.stop - p.start >= ROWS and p.start % ROWS == 0 for p in pieces)
    assert len(pieces) <= 2 * width
    assert SERIAL.ranges(n) == [slice(0, n)]


def test_each_runs_every_piece_and_raises_the_first_error(pool):
    team, seen = Team(3, pool), []
    team.each(seen.append, list(range(50)))
    assert sorted(seen) == list(range(50))

    def fails(piece):
        if piece == 7:
            raise ValueError("piece 7")

    with pytest.raises(ValueError, match="piece 7"):
        team.each(fails, list(range(20)))


def test_a_team_holds_the_blas_to_one_thread_and_gives_it_back():
    with threadpool_limits(2, user_api="blas"):
        if blas_threads() != 2:
            pytest.skip("this BLAS cannot be given two threads")
        with team_for(4 * ROWS) as team:
            assert team.width == 2 and blas_threads() == 1
        assert blas_threads() == 2
        with pytest.raises(RuntimeError, match="a failed pass"), team_for(4 * ROWS):
            raise RuntimeError("a failed pass")
        assert blas_threads() == 2
        with team_for(2 * ROWS - 1) as team:  # too short to cut: the BLAS keeps its threads
            assert team is SERIAL and blas_threads() == 2
    with threadpool_limits(1, user_api="blas"), team_for(4 * ROWS) as team:
        assert team is SERIAL


def test_lent_threads_make_a_team_on_a_one_thread_blas_without_keeping_memory():
    """core.threads.lend (what the app lends a request computing alone): a long pass takes a team that wide while
    the BLAS has one thread; its arrays come from np.empty, not the kept Slabs; outside it, SERIAL again."""
    from core.threads import lend

    with threadpool_limits(1, user_api="blas"):
        with lend(2):
            with team_for(4 * ROWS) as team:
                assert team.width == 2 and team.memory is None and blas_threads() == 1
            with team_for(2 * ROWS - 1) as team:
                assert team is SERIAL  # too short to cut
            with lend(1), team_for(4 * ROWS) as team:
                assert team is SERIAL  # lent nothing inside

            def another_pass() -> int:
                with team_for(4 * ROWS) as other:
                    return other.width

            with ThreadPoolExecutor(1) as pool, team_for(4 * ROWS) as team:
                assert team.width == 2
                assert pool.submit(contextvars.copy_context().run, another_pass).result() == 1  # one team at a time
            assert contextvars.copy_context().run(another_pass) == 2  # the team is free again
        with team_for(4 * ROWS) as team:
            assert team is SERIAL
    with threadpool_limits(2, user_api="blas"), lend(3), team_for(4 * ROWS) as team:
        if blas_threads() == 2:
            assert team.width == 2 and team.memory is MEMORY  # a BLAS of several threads: its width, not the lent


CASES = {  # q, k, v shapes' leading axes and the attention's switches
    "heads, causal": dict(lead_q=(5,), lead_kv=(5,), causal=True),
    "heads, bidirectional, temperature": dict(lead_q=(5,), lead_kv=(5,), temperature=0.7),
    "grouped query, causal": dict(lead_q=(3, 2), lead_kv=(3, 1), causal=True),
    "local window": dict(lead_q=(4,), lead_kv=(4,), causal=True, window=70),
    "one head": dict(lead_q=(), lead_kv=(), causal=True),
    "kv cache: 40 new queries after 150 keys": dict(lead_q=(4,), lead_kv=(4,), causal=True, n_key=190, n_query=40),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("width", [2, 3])
def test_attention_shared_by_a_team_equals_one_thread_bit_for_bit(case, keep, width, pool):
    c = dict(CASES[case])
    n_query, n_key = c.pop("n_query", 200), c.pop("n_key", 200)
    lead_q, lead_kv = c.pop("lead_q"), c.pop("lead_kv")
    rng = np.random.default_rng(len(case))
    q = rng.standard_normal((*lead_q, n_query, 16)).astype(np.float32)
    k, v = (rng.standard_normal((*lead_kv, n_key, 16)).astype(np.float32) for _ in range(2))
    with threadpool_limits(1, user_api="blas"):
        one = scaled_dot_product_attention(q, k, v, keep=keep, **c)
        shared = scaled_dot_product_attention(q, k, v, keep=keep, team=Team(width, pool), **c)
    for name in ("scores", "weights", "output") if keep else ("output",):
        np.testing.assert_array_equal(getattr(shared, name), getattr(one, name), err_msg=name)
    plain = reference_attention(q, k, v, **c)
    np.testing.assert_allclose(one.output, plain.output, rtol=1e-5, atol=1e-6)


MODELS = {
    "gpt2": TransformerConfig(d_model=48, n_layers=2, n_heads=4, d_vocab=97, n_ctx=300),
    "llama-like": TransformerConfig(
        d_model=48,
        n_layers=2,
        n_heads=6,
        n_key_value_heads=2,
        d_head=8,
        d_vocab=97,
        n_ctx=300,
        normalization_type="RMS",
        act_fn="silu",
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        bias=False,
    ),
    "neox, local layers": TransformerConfig(
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_vocab=97,
        n_ctx=300,
        positional_embedding_type="rotary",
        rotary_dim=4,
        parallel_attn_mlp=True,
        window_size=50,
        attn_types=("local", "global"),
    ),
    "bert": TransformerConfig(
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_vocab=97,
        n_ctx=300,
        block_type="post_norm",
        attention_dir="bidirectional",
        act_fn="gelu",
        n_token_types=2,
    ),
}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_forward_pass_on_two_blas_threads_is_the_one_thread_pass(model, dtype):
    cfg = MODELS[model]
    params = init_params(cfg, seed=1, dtype=dtype)
    tokens = np.random.default_rng(2).integers(0, cfg.d_vocab, size=260)
    with threadpool_limits(1, user_api="blas"):
        logits, cache = run_with_cache(params, cfg, tokens)
    with threadpool_limits(2, user_api="blas"):
        if blas_threads() != 2:
            pytest.skip("this BLAS cannot be given two threads")
        with team_for(tokens.size) as team:
            assert team.width == 2  # what run_with_cache will be lent
        shared_logits, shared = run_with_cache(params, cfg, tokens)
    tol = TOLERANCE[dtype]
    if logits is not None:
        np.testing.assert_allclose(shared_logits, logits, rtol=tol, atol=tol)
    assert shared.keys() == cache.keys()
    for name in cache:
        np.testing.assert_allclose(shared[name], cache[name], rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_keeping_some_activations_gives_those_of_keeping_all(model):
    """Activations that are not kept share one array across layers (core.hooks.PassContext.REUSED): a kept
    one is never written over by a later layer's temporary."""
    cfg = MODELS[model]
    params = init_params(cfg, seed=1, dtype=np.float32)
    tokens = np.random.default_rng(3).integers(0, cfg.d_vocab, size=200)
    logits, full = run_with_cache(params, cfg, tokens)
    names = hook_names(cfg)
    for offset in range(3):
        some = names[offset::3]
        part_logits, part = run_with_cache(params, cfg, tokens, names=some)
        assert set(part) == set(some)
        for name in some:
            np.testing.assert_array_equal(part[name], full[name], err_msg=name)
        if logits is not None:
            np.testing.assert_array_equal(part_logits, logits)


# ------------------------------------------------------------------ a team's memory


def test_slabs_hand_memory_back_only_when_no_view_holds_it():
    slabs = Slabs(limit=64 << 20, keep_s=60)
    a = slabs.empty((1 << 20,), np.float32)  # 4 MiB: big enough to come from a slab
    where = a.ctypes.data
    view = a[::2]
    del a
    b = slabs.empty((1 << 20,), np.float32)
    assert b.ctypes.data != where  # the view still holds the first one
    del view
    c = slabs.empty((1 << 20,), np.float32)
    assert c.ctypes.data == where  # now it is free, and reused
    assert c.ctypes.data % Slabs.ALIGN == 0 and b.ctypes.data % Slabs.ALIGN == 0
    small = slabs.empty((10,), np.float64)
    assert small.base is None  # small arrays are plain np.empty
    del b, c
    assert slabs.release() == 2 * Slabs.size(4 << 20)


def test_slabs_keep_at_most_their_limit():
    slabs = Slabs(limit=Slabs.size(8 << 20), keep_s=60)
    arrays = [slabs.empty((8 << 20,), np.uint8) for _ in range(3)]
    del arrays
    assert slabs.release() == Slabs.size(8 << 20)  # one kept, two given back to the system


def test_slabs_give_back_what_waited_longer_than_keep_s(monkeypatch):
    import core.threads

    clock = [100.0]
    monkeypatch.setattr(core.threads.time, "monotonic", lambda: clock[0])
    slabs = Slabs(limit=64 << 20, keep_s=10)
    a = slabs.empty((1 << 20,), np.float32)
    del a  # back at 100
    clock[0] = 105.0
    b = slabs.empty((2 << 20,), np.float32)  # another size: comes fresh
    del b  # back at 105
    assert slabs.waiting == Slabs.size(4 << 20) + Slabs.size(8 << 20)
    clock[0] = 112.0
    slabs._expire()  # what the timer runs
    assert slabs.waiting == Slabs.size(8 << 20)  # the first waited 12 s and has gone, the second 7 s
    clock[0] = 116.0
    slabs._expire()
    assert slabs.waiting == 0  # an idle process keeps nothing


def test_the_timer_gives_memory_back_unasked():
    slabs = Slabs(limit=64 << 20, keep_s=0.05)
    a = slabs.empty((1 << 20,), np.float32)
    del a
    deadline = time.monotonic() + 10
    while slabs.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slabs.waiting == 0


def test_a_process_holding_a_slab_at_exit_exits():
    """A slab whose array lives until the interpreter's teardown, after the timer has given back all else: it
    used to come back to Slabs then, which armed a new timer, and a thread started during finalisation never
    runs, so Thread.start waited for it forever (a script or notebook that kept a pass's logits hung at exit)."""
    script = """
import time
import numpy as np
from core.threads import Slabs
slabs = Slabs(limit=1 << 30, keep_s=0.05)
a = slabs.empty((5 << 20,), np.uint8)
del a  # back to the slabs: a timer is armed
time.sleep(0.5)  # the timer has given it back and is gone
kept = slabs.empty((5 << 20,), np.uint8)  # still held when the interpreter exits
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_team_keeps_bounded_memory():
    assert MEMORY.limit <= 2 << 30 and MEMORY.keep_s <= 60
    assert SERIAL.memory is None  # one BLAS thread (the app's workers): plain np.empty, nothing kept


@pytest.mark.parametrize("nbytes", [4 << 20, (4 << 20) + 1, 100 << 20, (1 << 30) + 12345])
def test_slab_sizes_round_up_by_at_most_an_eighth(nbytes):
    size = Slabs.size(nbytes)
    assert nbytes <= size <= max(nbytes * 9 // 8 + Slabs.ALIGN, nbytes + Slabs.ALIGN) and size % Slabs.ALIGN == 0


def test_a_pass_on_a_team_never_writes_into_what_an_earlier_pass_returned():
    cfg = TransformerConfig(d_model=64, n_layers=2, n_heads=4, d_vocab=6000, n_ctx=300)  # logits: 6 MB
    params = init_params(cfg, seed=4, dtype=np.float32)
    one, two = (np.random.default_rng(seed).integers(0, cfg.d_vocab, size=256) for seed in (5, 6))
    with threadpool_limits(2, user_api="blas"):
        if blas_threads() != 2:
            pytest.skip("this BLAS cannot be given two threads")
        first_logits, first = run_with_cache(params, cfg, one)
        kept = {name: a.copy() for name, a in first.items()} | {"logits": first_logits.copy()}
        for tokens in (two, one, two):
            run_with_cache(params, cfg, tokens)  # dropped at once: its memory waits for the next pass
        np.testing.assert_array_equal(first_logits, kept["logits"])
        for name in first:
            np.testing.assert_array_equal(first[name], kept[name], err_msg=name)
        again_logits, again = run_with_cache(params, cfg, one)
        np.testing.assert_array_equal(again_logits, first_logits)
