"""Work caps: the heaviest request the limits allow finishes, one a little heavier is refused
before any computing, and /healthz keeps answering while the heaviest ones run side by side;
past the concurrency limit the server answers 503 + Retry-After.

The heaviest request is found with the service's own cost formulas (core/params.py), so the test
follows the limits wherever they are set; the server then confirms it is allowed (200)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import liveserver
from app.catalog import build_catalog
from app.settings import get_settings
from core import count_params
from core.params import forward_work, largest_array

S = get_settings()
RUN = "/api/v1/run"
HEALTH_WITHIN_S = 5.0  # generous: a liveness probe must not wait behind the computations


def _cost(cfg, n: int) -> tuple[int, int]:
    """(multiply-adds incl. drawing the weights, largest array) of a run with one ablated head,
    which the service prices as two forward passes."""
    return count_params(cfg).total + 2 * forward_work(cfg, n), largest_array(cfg, n)


def _allowed(cfg, n: int) -> bool:
    work, largest = _cost(cfg, n)
    return count_params(cfg).total <= S.max_params and work <= S.max_work and largest <= S.max_elements


def heaviest_toy_run() -> tuple[dict, dict]:
    """The allowed toy run with the most work, and one token more (refused)."""
    toy = build_catalog(S)["toy"]
    best = None
    for d_model in (64, 128, 256, 512):
        for n_layers in range(1, S.max_layers + 1):
            sizes = {"d_model": d_model, "n_layers": n_layers, "n_heads": 4}
            if not _allowed(toy.configure(sizes, 1), 1):
                continue
            lo, hi = 1, S.max_tokens  # the longest text this config may run (cost grows with n)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if _allowed(toy.configure(sizes, mid), mid) else (lo, mid - 1)
            work = _cost(toy.configure(sizes, lo), lo)[0]
            if best is None or work > best[0]:
                best = (work, sizes, lo)
    work, sizes, n = best
    cfg = toy.configure(sizes, n)
    # Return as many attention patterns as the response limit allows: serialising them is work too.
    per_pattern = cfg.n_heads * n * n
    hooks = [f"blocks.{layer}.attn.hook_pattern" for layer in range(min(cfg.n_layers, S.max_hook_values // per_pattern))]
    body = {"model": "toy", "text": "a" * n, **sizes, "ablate": [{"layer": 0, "head": 0}], "hooks": hooks, "top_k": 5}
    assert not _allowed(cfg, n + 1) or n == S.max_tokens
    heavier = {**body, "text": "a" * (n + 1)} if n < S.max_tokens else {**body, "n_layers": sizes["n_layers"] + 1}
    print(f"heaviest allowed toy run: {sizes}, {n} tokens, ~{work:,} multiply-adds, {len(hooks)} pattern hooks")
    return body, heavier


@pytest.fixture(scope="module")
def heaviest():
    return heaviest_toy_run()


@pytest.fixture(scope="module")
def limited_server():
    """A server that lets two computations run at once."""
    with liveserver.live_server(env={"EXPLORER_MAX_CONCURRENT_COMPUTE": "2", "EXPLORER_ACCESS_LOG": "false"}) as s:
        yield s


def test_heavier_than_allowed_is_refused_before_computing(client, heaviest):
    _, heavier = heaviest
    r = client.post(RUN, json=heavier)
    assert r.status_code == 422
    msg = " ".join(d["msg"] for d in r.json()["detail"])
    assert "limit" in msg and "reduce" in msg, msg


def test_heaviest_allowed_requests_finish_while_healthz_answers(limited_server, heaviest):
    body, _ = heaviest

    async def scenario():
        async with httpx.AsyncClient(base_url=limited_server.url, timeout=600) as c:
            started = time.perf_counter()
            heavy = [asyncio.create_task(c.post(RUN, json=body)) for _ in range(2)]
            probes: list[tuple[int, float]] = []
            busy: list[httpx.Response] = []
            async with httpx.AsyncClient(base_url=limited_server.url, timeout=HEALTH_WITHIN_S) as probe:
                while not all(t.done() for t in heavy):
                    t0 = time.perf_counter()
                    r = await probe.get("/healthz")  # raises ReadTimeout past HEALTH_WITHIN_S
                    probes.append((r.status_code, time.perf_counter() - t0))
                    if not busy and len(probes) > 2:
                        # Both slots are taken now: a third heavy request is turned away at once.
                        busy.append(await probe.post(RUN, json=body))
                    await asyncio.sleep(0.2)
            done = await asyncio.gather(*heavy)
            return done, probes, busy, time.perf_counter() - started

    done, probes, busy, elapsed = asyncio.run(scenario())
    assert [r.status_code for r in done] == [200, 200], [r.text[:300] for r in done]
    assert len(done[0].json()["hooks"]) == len(body["hooks"])
    assert probes and all(status == 200 for status, _ in probes)
    latencies = sorted(t for _, t in probes)
    print(f"2 heaviest runs took {elapsed:.1f} s; /healthz answered {len(probes)} times, "
          f"median {latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")
    if busy:  # the heavy runs outlasted the first probes (always, on any machine we know)
        r = busy[0]
        assert r.status_code == 503, r.text[:300]
        assert int(r.headers["retry-after"]) == S.retry_after_s
        assert "busy" in r.json()["detail"][0]["msg"]


def test_past_the_limit_the_server_answers_503_with_retry_after(limited_server):
    """Many at once, more than the limit: some run, the rest are told to come back."""
    body = {"model": "toy", "text": "the cat sat on the mat " * 20, "hooks": ["blocks.0.attn.hook_pattern"]}

    async def burst():
        async with httpx.AsyncClient(base_url=limited_server.url, timeout=600) as c:
            return await asyncio.gather(*(c.post(RUN, json=body) for _ in range(12)))

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1, statuses
    for r in responses:
        if r.status_code == 503:
            assert int(r.headers["retry-after"]) >= 1
            assert "try again" in r.json()["detail"][0]["msg"]
            assert r.headers["x-content-type-options"] == "nosniff"
