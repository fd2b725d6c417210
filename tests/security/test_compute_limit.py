"""The compute limiter in isolation: a route that holds its slot until released; the next ones turned away at
once (queue_s 0) or waiting their turn."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from threadpoolctl import threadpool_limits

from app.http.security import ComputeLimitMiddleware, SecurityHeadersMiddleware, is_compute


def _app(limit: int, release: asyncio.Event, started: list, queue_s: float = 0) -> ComputeLimitMiddleware:
    async def run(request):
        started.append(request.query_params.get("who", 1))
        await release.wait()
        return JSONResponse({"ok": True})

    async def boom(request):
        raise ValueError("handled below")

    async def healthz(request):
        return JSONResponse({"status": "ok"})

    inner = Starlette(
        routes=[
            Route("/api/v1/run", run, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/api/v1/lessons/boom", boom),
        ],
        exception_handlers={ValueError: lambda r, e: JSONResponse({"detail": str(e)}, 422)},
    )
    return SecurityHeadersMiddleware(ComputeLimitMiddleware(inner, limit=limit, retry_after_s=3, queue_s=queue_s))


def test_routes_classified():
    assert is_compute("/") and is_compute("/api/v1/run") and is_compute("/api/v1/lessons/attention")
    assert is_compute("/lessons/forward") and is_compute("/inspect") and is_compute("/api/v1/analysis/logit-lens")
    assert is_compute("/api/v1/generate") and is_compute("/circuits") and is_compute("/api/v1/analysis/patching")
    for cheap in (
        "/healthz",
        "/static/vendor/htmx.min.js",
        "/docs",
        "/openapi.json",
        "/api/v1/models",
        "/api/v1/params",
        "/api/v1/kv-cache",
        "/params",
        "/lessons",
        "/readyz",
        "/generate",
    ):
        assert not is_compute(cheap), cheap


# The API's routes that never run a model: health, listings and arithmetic, and training (a request only
# queues a run, which trains in its own processes; the runs' routes read what they wrote).
CHEAP_API = {
    "/healthz",
    "/readyz",
    "/api/v1/params",
    "/api/v1/kv-cache",
    "/api/v1/models",
    "/api/v1/hooks",
    # the SAEs' list reads what start-up found; a download zips a folder's files (a dashboard computes: limited)
    "/api/v1/saes",
    "/api/v1/saes/{name}/download",
    "/api/v1/train",
    "/api/v1/runs",
    "/api/v1/runs/{id}",
    "/api/v1/runs/{id}/events",
    "/api/v1/runs/{id}/checkpoint",
    "/api/v1/runs/{id}/patterns/{step}",
    # live classes: no model runs, a follower's stream waits on the class store
    "/api/v1/classes",
    "/api/v1/classes/{code}",
    "/api/v1/classes/{code}/state",
    "/api/v1/classes/{code}/events",
    "/api/v1/classes/{code}/polls",
    "/api/v1/classes/{code}/polls/{poll_id}",
    "/api/v1/classes/{code}/polls/{poll_id}/answers",
    "/api/v1/classes/{code}/polls/{poll_id}/close",
}


def test_every_api_route_is_limited_unless_it_is_known_to_be_cheap():
    """A new route in the OpenAPI fails here until it is classified: limited (app/http/security.py) or named
    here as cheap."""
    from app.main import create_app

    paths = set(create_app().openapi()["paths"])
    assert CHEAP_API <= paths, CHEAP_API - paths  # the list names routes that exist
    unlimited = {p for p in paths if not is_compute(p)}
    assert unlimited == CHEAP_API, f"routes that compute but are not limited: {sorted(unlimited - CHEAP_API)}"


def test_full_limiter_answers_503_with_retry_after_and_frees_slots():
    async def scenario():
        release, started = asyncio.Event(), []
        app = _app(2, release, started)
        limiter = app.app
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            held = [asyncio.create_task(c.post("/api/v1/run")) for _ in range(2)]
            while len(started) < 2:
                await asyncio.sleep(0.01)
            busy = await c.post("/api/v1/run")
            health = await c.get("/healthz")
            assert limiter.in_flight == 2
            release.set()
            done = await asyncio.gather(*held)
            after = await c.post("/api/v1/run")
            failed = await c.get("/api/v1/lessons/boom")
            return busy, health, done, after, failed, limiter.in_flight

    busy, health, done, after, failed, in_flight = asyncio.run(scenario())
    assert busy.status_code == 503
    assert busy.headers["retry-after"] == "3"
    assert busy.headers["x-frame-options"] == "SAMEORIGIN"  # headers on the limiter's own answer too
    msg = busy.json()["detail"][0]["msg"]
    assert "busy" in msg and "2" in msg and "3 s" in msg
    assert health.status_code == 200  # cheap routes never wait for a slot
    assert [r.status_code for r in done] == [200, 200]
    assert after.status_code == 200  # slots came back
    assert failed.status_code == 422
    assert in_flight == 0  # an error response releases its slot too


def test_page_gets_a_plain_text_busy_message():
    async def scenario():
        release, started = asyncio.Event(), []
        app = _app(1, release, started)
        # Hold the only slot with an API request, then ask for the explorer page.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            held = asyncio.create_task(c.post("/api/v1/run"))
            while not started:
                await asyncio.sleep(0.01)
            page = await c.get("/")
            release.set()
            await held
            return page

    page = asyncio.run(scenario())
    assert page.status_code == 503
    assert page.headers["content-type"].startswith("text/plain")
    assert "busy" in page.text


def test_a_full_limiter_serves_the_waiting_in_order_of_arrival():
    """One slot, a long wait: three requests wait behind the one holding it, and each is served in the order it
    came, the slot passing from one to the next (never back to the pool, where a newcomer could take it)."""

    async def scenario():
        release, started = asyncio.Event(), []
        app = _app(1, release, started, queue_s=30)
        limiter = app.app
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            first = asyncio.create_task(c.post("/api/v1/run?who=first"))
            while not started:
                await asyncio.sleep(0.01)
            waiting = []
            for who in ("a", "b", "c"):
                waiting.append(asyncio.create_task(c.post(f"/api/v1/run?who={who}")))
                while len(limiter.waiting) < len(waiting):
                    await asyncio.sleep(0.01)
            queued, in_flight = len(limiter.waiting), limiter.in_flight
            release.set()
            done = await asyncio.gather(first, *waiting)
            return started, queued, in_flight, done, limiter.in_flight, len(limiter.waiting)

    started, queued, in_flight, done, after, left = asyncio.run(scenario())
    assert (queued, in_flight) == (3, 1)
    assert [r.status_code for r in done] == [200] * 4
    assert started == ["first", "a", "b", "c"]
    assert (after, left) == (0, 0)


def test_a_wait_that_runs_out_is_a_503_and_a_client_that_leaves_keeps_no_place():
    async def scenario():
        release, started = asyncio.Event(), []
        app = _app(1, release, started, queue_s=0.2)
        limiter = app.app
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            held = asyncio.create_task(c.post("/api/v1/run"))
            while not started:
                await asyncio.sleep(0.01)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            busy = await c.post("/api/v1/run")
            waited = loop.time() - t0
            gone = asyncio.create_task(c.post("/api/v1/run"))  # a client that gives up while waiting
            while not limiter.waiting:
                await asyncio.sleep(0.01)
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
            left_waiting = len(limiter.waiting)
            release.set()
            await held
            return busy, waited, left_waiting, limiter.in_flight

    busy, waited, left_waiting, in_flight = asyncio.run(scenario())
    assert busy.status_code == 503 and busy.headers["retry-after"] == "3"
    assert 0.2 <= waited < 2, waited
    assert left_waiting == 0 and in_flight == 0  # neither the 503 nor the one that left holds anything


def test_a_request_computing_alone_is_lent_the_threads_and_one_beside_it_is_not():
    """lend=2 (settings.lend_threads): a compute request that starts while no other computes runs its handler
    (a sync route, on Starlette's threadpool, as the API's are) inside core.threads.lend(2), so its long passes
    take a team of two; one that starts beside it gets one thread; cheap routes are not lent anything."""
    import threading

    from core.threads import ROWS, team_for

    seen: list[tuple[str, int]] = []
    hold = threading.Event()

    def run(request):  # sync: run in the threadpool, as FastAPI runs the API's routes
        with team_for(4 * ROWS) as team:
            seen.append((request.query_params["who"], team.width))
        if request.query_params["who"] == "first":
            hold.wait(10)
        return JSONResponse({"ok": True})

    inner = Starlette(routes=[Route("/api/v1/run", run, methods=["POST"]), Route("/healthz", run)])
    app = ComputeLimitMiddleware(inner, limit=4, retry_after_s=1, queue_s=0, lend=2)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            first = asyncio.create_task(c.post("/api/v1/run?who=first"))
            while not seen:
                await asyncio.sleep(0.01)
            beside = await c.post("/api/v1/run?who=beside")
            hold.set()
            await first
            alone = await c.post("/api/v1/run?who=alone")
            cheap = await c.get("/healthz?who=cheap")
            return [r.status_code for r in (await first, beside, alone, cheap)]

    with threadpool_limits(1, user_api="blas"):
        assert asyncio.run(scenario()) == [200] * 4
    assert seen == [("first", 2), ("beside", 1), ("alone", 2), ("cheap", 1)]
