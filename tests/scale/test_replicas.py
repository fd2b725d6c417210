"""Two app replicas on one Redis, behind Debian's caddy running deploy/Caddyfile: the same request is the
same run whichever replica it reaches; the per-client and server-wide limits are counted in Redis, not
per process; and a page following a run through Caddy, whose replica is killed with SIGKILL, reconnects
to the other and misses no record (EventSource's Last-Event-ID is the run's stream id)."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.browser.conftest import PageWatch, browser  # noqa: F401  (the module's Chromium)
from tests.scale import services
from tests.scale.conftest import PICKUP_S, db_url, wait

DB = 2
LIMITS = {"train_max_per_client": 2, "train_max_runs": 3}
LONG = {"recipe": "nasi-lemak", "steps": 20000, "eval_interval": 50}  # still training when the limits are tried


@pytest.fixture(scope="module")
def stack(redis_server):
    """A worker; replica A; replica B, not ready (its models folder missing) until a test makes the folder,
    so that Caddy sends everything to A until then; Caddy in front of both."""
    url = db_url(redis_server, DB)
    with tempfile.TemporaryDirectory(prefix="explorer-replica-b-") as tmp:
        models = Path(tmp) / "models"
        with (
            services.worker(url, train_pickup_s=PICKUP_S) as worker,
            services.replica(url, train_pickup_s=PICKUP_S, **LIMITS) as a,
            services.replica(url, train_pickup_s=PICKUP_S, models_dir=models, **LIMITS) as b,
            services.caddy([a.hostport, b.hostport]) as proxy,
        ):
            yield {
                "worker": worker,
                "a": a,
                "b": b,
                "proxy": proxy,
                "b_models": models,
                "redis": services.redis.Redis.from_url(url),
            }


def post_all(bodies_and_urls: list[tuple[dict, str, dict]]) -> list[httpx.Response]:
    def post(item):
        body, url, headers = item
        return httpx.post(url + "/api/v1/train", json=body, headers=headers, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(len(bodies_and_urls)) as pool:
        return list(pool.map(post, bodies_and_urls))


def test_thirty_identical_requests_over_two_replicas_make_one_run(stack):
    replicas = itertools.cycle([stack["a"].url, stack["b"].url])
    body = {"recipe": "nasi-lemak", "steps": 40, "eval_interval": 10, "seed": 41}
    answers = post_all([(body, next(replicas), {}) for _ in range(30)])
    assert {a.status_code for a in answers} == {202}, [a.text for a in answers if a.status_code != 202]
    assert len({a.json()["id"] for a in answers}) == 1 and sum(a.json()["queued"] for a in answers) == 1
    id = answers[0].json()["id"]
    with httpx.Client(base_url=stack["proxy"].url, timeout=30) as c:
        assert wait(c, id)["status"] == "done"
    events = stack["redis"].xrange(f"explorer:run:{id}:events")
    started = [f for _, f in events if f[b"event"] == b"run" and json.loads(f[b"data"])["status"] == "running"]
    assert len(started) == 1  # trained once
    assert httpx.get(stack["proxy"].url + "/metrics").status_code == 404  # never through the proxy


def test_the_limits_hold_across_replicas(stack):
    """Each client may have 2 runs queued or training, the server 3 (LIMITS), counted in Redis: requests
    spread over both replicas at once never get past them. (X-Forwarded-For names the client: uvicorn
    trusts it from 127.0.0.1, as it trusts Caddy's in the compose stack.)"""
    a, b = stack["a"].url, stack["b"].url
    first = [(LONG | {"seed": 50 + i}, (a, b)[i % 2], {"X-Forwarded-For": "10.0.0.1"}) for i in range(6)]
    answers = post_all(first)
    codes = sorted(r.status_code for r in answers)
    assert codes == [202, 202, 429, 429, 429, 429], [r.text for r in answers]
    assert all(int(r.headers["retry-after"]) > 0 for r in answers if r.status_code == 429)
    second = [(LONG | {"seed": 60 + i}, (a, b)[i % 2], {"X-Forwarded-For": "10.0.0.2"}) for i in range(2)]
    answers_b = post_all(second)
    assert sorted(r.status_code for r in answers_b) == [202, 503], [r.text for r in answers_b]
    full = next(r for r in answers_b if r.status_code == 503)
    assert "3 runs queued or training" in full.json()["detail"][0]["msg"] and int(full.headers["retry-after"]) > 0
    ids = [r.json()["id"] for r in answers + answers_b if r.status_code == 202]
    with httpx.Client(base_url=b, timeout=30) as c:
        for id in ids:
            assert c.delete(f"/api/v1/runs/{id}").status_code == 200  # a cancel on either replica
        for id in ids:
            assert wait(c, id)["status"] == "cancelled"


FOLLOWED = {"recipe": "nasi-lemak", "steps": 3000, "eval_interval": 750}  # a second or more between records


def test_a_page_following_a_run_through_caddy_survives_its_replica(stack, browser):  # noqa: F811
    """The page follows through A alone (B is not ready); right after one of its event streams has started
    (a record re-renders the run and reconnects), A is killed and B made ready: EventSource reconnects
    through Caddy, which waits for B (lb_try_duration), with Last-Event-ID, and the page goes on."""
    proxy, a = stack["proxy"], stack["a"]
    page = browser.new_page()
    watch = PageWatch(page)
    page.set_default_timeout(30_000)
    # What Chromium sends on the wire (DevTools' Network domain): when each event stream was asked for, and
    # its Last-Event-ID; and when each was answered
    # (Chromium may report a request's headers on the wire before the request itself: both are kept by
    # request id and joined once the run is over)
    on_wire: dict[str, tuple[float, str | None]] = {}
    answered: list[tuple[float, int]] = []
    streams: set[str] = set()
    devtools = page.context.new_cdp_session(page)
    devtools.send("Network.enable")

    def sent(params) -> None:
        if "/events" in params["request"]["url"]:
            streams.add(params["requestId"])

    def headers_sent(params) -> None:
        headers = {k.lower(): v for k, v in params["headers"].items()}
        on_wire.setdefault(params["requestId"], (time.monotonic(), headers.get("last-event-id")))

    devtools.on("Network.requestWillBeSent", sent)
    devtools.on("Network.requestWillBeSentExtraInfo", headers_sent)
    page.on("response", lambda r: answered.append((time.monotonic(), r.status)) if "/events" in r.url else None)
    try:
        id = httpx.post(proxy.url + "/api/v1/train", json=FOLLOWED | {"seed": 71}, timeout=30).json()["id"]
        page.goto(f"{proxy.url}/train?run={id}")
        page.wait_for_function(
            "() => { const s = document.querySelector('#run-results [data-run-status] "
            '[data-field="step"]\'); return s && Number(s.textContent) >= 1; }'
        )
        # the next event stream (a record re-renders the run) and its first progress event, which has an id
        page.evaluate("""() => { window.sseSeen = [];
            document.body.addEventListener('htmx:sseOpen', () => window.sseSeen.push('open'));
            document.body.addEventListener('htmx:sseMessage', e => window.sseSeen.push(e.detail.type)); }""")
        page.wait_for_function(
            "() => { const s = window.sseSeen, i = s.lastIndexOf('open');"
            " return i >= 0 && s.slice(i).includes('progress'); }"
        )
        a.kill()  # SIGKILL: the page's event stream was A's, the only ready replica
        killed_at = time.monotonic()
        stack["b_models"].mkdir()  # B ready at Caddy's next health check (every 1 s here)
        page.wait_for_function(
            "() => { const s = document.querySelector('#run-results [data-run-status] "
            "[data-field=\"status\"]'); return s && s.textContent.trim() === 'done'; }",
            timeout=120_000,
        )
        with httpx.Client(base_url=proxy.url, timeout=30) as c:
            run = c.get(f"/api/v1/runs/{id}").json()
        assert run["status"] == "done"
        # the page reconnected through Caddy to B, saying where it was, and was answered
        asked = sorted((on_wire[r] for r in streams if r in on_wire), key=lambda t: t[0])
        resumed = [when for when, last in asked if when > killed_at and last]
        assert resumed, (
            "no reconnect with Last-Event-ID after the kill: asked "
            f"{[(round(w - killed_at, 2), last) for w, last in asked]}, answered "
            f"{[(round(w - killed_at, 2), st) for w, st in answered]}"
        )
        assert any(when > resumed[0] and status == 200 for when, status in answered)
        # and misses no record: the loss curves (training, held-out) have every record's step
        steps = page.evaluate("""() => { const el = document.querySelector('#train-loss .plot');
                                          return el && el.data ? el.data.map(t => Array.from(t.x)) : null; }""")
        want = list(range(0, FOLLOWED["steps"] + 1, FOLLOWED["eval_interval"]))
        assert run["metrics"]["step"] == want and sorted(set().union(*steps)) == want
        assert watch.page_errors == []
    finally:
        page.close()
