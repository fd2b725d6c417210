"""Long inputs: the toy model at 1024 tokens (the API's longest text) through the JSON API and the
explorer page: time per update, bytes sent, and where the server says no (413/422).

    bench/.env/bin/python -m bench.long_inputs [--repeat 5]

Sizes are the body as sent (gzip when the server compresses: `wire`) and as decoded (`JSON`). The
explorer's reads come after its update (the same URL with `values=` or `levels=`, as the page asks
for them): a hover's block of rows of the weights' exact values, a download's every row, another
head's colour levels (a click on its thumbnail), each answered from the matrices the update kept.
"""

from __future__ import annotations

import argparse
import html
import re
import time

from bench.common import header, live_server, median, run_main, table

TEXT = "the cat sat on the mat. "  # the toy model is character-level: one character, one token


def text(n: int) -> str:
    return (TEXT * (n // len(TEXT) + 1))[:n]


def limits() -> dict:
    from app.settings import get_settings

    s = get_settings()
    return {
        "max_tokens": s.max_tokens,
        "max_text_chars": s.max_text_chars,
        "max_body_bytes": s.max_body_bytes,
        "max_hook_values": s.max_hook_values,
        "explorer_max_tokens": s.explorer_max_tokens,
        "explorer_max_values": s.explorer_max_values,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    import httpx

    header("Long inputs: the toy model at 1024 tokens")
    lim = limits()
    n = lim["max_tokens"]
    run = "/api/v1/run"
    cases = [  # (what, method, path, json body or query params, extra headers)
        (f"run, {n} tokens, top_k only", "POST", run, {"model": "toy", "text": text(n)}, {}),
        (
            f"run, {n} tokens, + hook_resid_post of each layer",
            "POST",
            run,
            {"model": "toy", "text": text(n), "hooks": ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]},
            {},
        ),
        (
            f"run, {n} tokens, + one layer's hook_pattern",
            "POST",
            run,
            {"model": "toy", "text": text(n), "hooks": ["blocks.0.attn.hook_pattern"]},
            {},
        ),
        (
            "run, 256 tokens, + one layer's hook_pattern",
            "POST",
            run,
            {"model": "toy", "text": text(256), "hooks": ["blocks.0.attn.hook_pattern"]},
            {},
        ),
        (f"run, {n + 1} tokens", "POST", run, {"model": "toy", "text": text(n + 1)}, {}),
        (
            f"run, body over {lim['max_body_bytes']:,} bytes",
            "POST",
            run,
            {"model": "toy", "text": text(lim["max_body_bytes"])},
            {},
        ),
        # the explorer page (up to explorer_max_tokens, 1,024): 128 tokens is the peer
        (
            "explorer page update (htmx), 128 tokens",
            "GET",
            "/",
            {"model": "toy", "text": text(128)},
            {"HX-Request": "true"},
        ),
        (
            f"explorer page update (htmx), {lim['explorer_max_tokens']} tokens",
            "GET",
            "/",
            {"model": "toy", "text": text(lim["explorer_max_tokens"])},
            {"HX-Request": "true"},
        ),
        (
            f"explorer page update (htmx), {lim['explorer_max_tokens']} tokens, all four stages",
            "GET",
            "/",
            {"model": "toy", "text": text(lim["explorer_max_tokens"]), "stages": "1"},
            {"HX-Request": "true"},
        ),
        (
            f"explorer: the weights' exact values, 8 rows (a hover), {lim['explorer_max_tokens']} tokens",
            "GET",
            "/",
            {"model": "toy", "text": text(lim["explorer_max_tokens"]), "values": "stage-weights", "rows": "512-520"},
            {},
        ),
        (
            f"explorer: every value of the weights (a download), {lim['explorer_max_tokens']} tokens",
            "GET",
            "/",
            {
                "model": "toy",
                "text": text(lim["explorer_max_tokens"]),
                "values": "stage-weights",
                "rows": f"0-{lim['explorer_max_tokens']}",
            },
            {},
        ),
        (
            f"explorer: head 1's colour levels (a click on it), {lim['explorer_max_tokens']} tokens",
            "GET",
            "/",
            {"model": "toy", "text": text(lim["explorer_max_tokens"]), "levels": "head-1"},
            {},
        ),
        (
            f"explorer whole page, {lim['explorer_max_tokens']} tokens",
            "GET",
            "/",
            {"model": "toy", "text": text(lim["explorer_max_tokens"])},
            {},
        ),
        (
            f"explorer page update (htmx), {lim['explorer_max_tokens'] + 1} tokens",
            "GET",
            "/",
            {"model": "toy", "text": text(lim["explorer_max_tokens"] + 1)},
            {"HX-Request": "true"},
        ),
    ]
    rows = []
    with (
        live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server,
        httpx.Client(base_url=server.url, timeout=120) as c,
    ):
        for what, method, path, payload, headers in cases:
            kw = {"json": payload} if method == "POST" else {"params": payload}
            times, r = [], None
            for i in range(args.repeat + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                r = c.request(method, path, headers=headers, **kw)
                if i:
                    times.append(time.perf_counter() - t0)
            detail = ""
            if r.status_code != 200:
                try:
                    detail = r.json()["detail"][0]["msg"][:90]
                except Exception:  # a page: its message in place of the figures
                    found = re.search(r'<p class="error">([^<]*)</p>', r.text)
                    detail = html.unescape(found.group(1) if found else r.text)[:90]
            rows.append(
                [
                    what,
                    r.status_code,
                    f"{median(times) * 1e3:.0f}",
                    f"{r.num_bytes_downloaded / 1024:.1f}",
                    f"{len(r.content) / 1024:.1f}",
                    detail,
                ]
            )
    print(
        table(
            f"Time per update and response size (median of {args.repeat}, after a warm-up)",
            ["request", "status", "ms", "wire KB", "JSON/HTML KB", "message"],
            rows,
        )
    )
    print("limits (app/settings.py): " + ", ".join(f"{k} {v:,}" for k, v in lim.items()) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
