"""Work caps: the heaviest request the limits allow finishes, one a little heavier is refused
before any computing, and /healthz keeps answering while the heaviest ones run side by side;
past the concurrency limit the server answers 503 + Retry-After.

The heaviest request is found with the cost model written out here from the toy's architecture
(not with the service's own functions), so the server's 200 for it and its 422 for one token more
confirm the service prices a run as documented: drawing the weights, plus two forward passes (a
run with an ablated head also runs the model without the ablation)."""

from __future__ import annotations

import asyncio
import time

import httpx
import liveserver
import pytest

from app.settings import get_settings

S = get_settings()
RUN = "/api/v1/run"
HEALTH_WITHIN_S = 5.0  # generous: a liveness probe must not wait behind the computations
N_HEADS = 4


def toy_facts(client) -> tuple[int, int]:
    """(d_vocab, n_ctx) of the built-in toy, as /api/v1/models describes it."""
    (toy,) = [m for m in client.get("/api/v1/models").json()["models"] if m["name"] == "toy"]
    return toy["config"]["d_vocab"], toy["config"]["n_ctx"]


def toy_cost(d: int, layers: int, n: int, vocab: int, n_ctx: int) -> tuple[int, int, int]:
    """(parameters, work, largest array) of a toy run on n tokens with one ablated head.

    A GPT-2 block with biases: W_QKV d×3d + 3d, W_O d×d + d, W_in d×4d + 4d, W_out 4d×d + d, two layer
    norms 2d each; the model adds token and position tables and a final norm, and ties W_U to W_E.
    A forward pass does one multiply-add per block weight per token, QKᵀ and pattern·V (n² d each,
    per layer) and the unembedding of the last position (d vocab: the next-token prediction needs no
    other position's logits). Drawing the weights costs one draw per parameter."""
    per_block = 12 * d * d + 13 * d
    params = vocab * d + n_ctx * d + layers * per_block + 2 * d
    forward = n * layers * per_block + layers * 2 * n * n * d + d * vocab
    largest = max(N_HEADS * n * n, vocab * d, n_ctx * d, 3 * d * d, 4 * d * d)
    return params, params + 2 * forward, largest


def heaviest_toy_run(client) -> tuple[dict, dict]:
    """The allowed toy run with the most work, and one token more (refused)."""
    vocab, n_ctx = toy_facts(client)

    def allowed(d, layers, n) -> bool:
        params, work, largest = toy_cost(d, layers, n, vocab, n_ctx)
        return params <= S.max_params and work <= S.max_work and largest <= S.max_elements

    best = None
    for d_model in (64, 128, 256, 512):
        for n_layers in range(1, S.max_layers + 1):
            if not allowed(d_model, n_layers, 1):
                continue
            lo, hi = 1, S.max_tokens  # the longest text this config may run (cost grows with n)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if allowed(d_model, n_layers, mid) else (lo, mid - 1)
            work = toy_cost(d_model, n_layers, lo, vocab, n_ctx)[1]
            if best is None or work > best[0]:
                best = (work, {"d_model": d_model, "n_layers": n_layers, "n_heads": N_HEADS}, lo)
    work, sizes, n = best
    # Return as many attention patterns as the response limit allows: serialising them is work too.
    per_pattern = N_HEADS * n * n
    hooks = [
        f"blocks.{layer}.attn.hook_pattern" for layer in range(min(sizes["n_layers"], S.max_hook_values // per_pattern))
    ]
    body = {"model": "toy", "text": "a" * n, **sizes, "ablate": [{"layer": 0, "head": 0}], "hooks": hooks, "top_k": 5}
    assert n < S.max_tokens and not allowed(sizes["d_model"], sizes["n_layers"], n + 1)
    heavier = {**body, "text": "a" * (n + 1)}
    print(f"heaviest allowed toy run: {sizes}, {n} tokens, ~{work:,} multiply-adds, {len(hooks)} pattern hooks")
    return body, heavier


@pytest.fixture(scope="module")
def heaviest(client):
    return heaviest_toy_run(client)


@pytest.fixture(scope="module")
def limited_server():
    """A server that lets two computations run at once and turns the next away at once (no wait for a slot:
    tests/security/test_compute_queue.py checks the wait)."""
    env = {"EXPLORER_MAX_CONCURRENT_COMPUTE": "2", "EXPLORER_COMPUTE_QUEUE_S": "0", "EXPLORER_ACCESS_LOG": "false"}
    with liveserver.live_server(env=env) as s:
        yield s


def test_heavier_than_allowed_is_refused_before_computing(client, heaviest):
    _, heavier = heaviest
    r = client.post(RUN, json=heavier)
    assert r.status_code == 422
    msg = " ".join(d["msg"] for d in r.json()["detail"])
    assert "limit" in msg and "reduce" in msg, msg


def test_heaviest_allowed_requests_finish_while_healthz_answers(limited_server, heaviest):
    body, _ = heaviest
    cheap_compute = "/api/v1/lessons/positions?n_pos=2&d=2"  # a compute route that takes a slot for a moment

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
                    if not busy and len(probes) > 2:  # the heavy runs have long been sent and started
                        # Once both heavy runs hold the two slots, any compute request is turned away at once.
                        r = await probe.get(cheap_compute)
                        if r.status_code == 503:
                            busy.append(r)
                    await asyncio.sleep(0.05)
            done = await asyncio.gather(*heavy)
            return done, probes, busy, time.perf_counter() - started

    done, probes, busy, elapsed = asyncio.run(scenario())
    assert [r.status_code for r in done] == [200, 200], [r.text[:300] for r in done]
    assert len(done[0].json()["hooks"]) == len(body["hooks"])
    assert probes and all(status == 200 for status, _ in probes)
    latencies = sorted(t for _, t in probes)
    print(
        f"2 heaviest runs took {elapsed:.1f} s; /healthz answered {len(probes)} times, "
        f"median {latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    assert busy, "the two heaviest runs never held both compute slots at once"
    r = busy[0]
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
