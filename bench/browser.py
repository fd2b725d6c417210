"""Browser: what the explorer page costs a learner, in Debian's headless Chromium driven by Playwright.

1. Bytes of JavaScript and CSS the explorer transfers on a first visit (as sent: gzip-compressed
   when the server compresses), file by file.
2. The explorer's latencies at 20, 128 and 1,024 tokens (toy model), measured by
   scripts/explorer_latency.py (its docstring says exactly what each includes): edit -> first
   heatmap redrawn (the typing debounce as the page applies it included) and, beside it, the same
   edits' server time (update sent -> first byte, from the browser's Resource Timing) and bytes as
   sent, edit -> every figure redrawn, the last key of a burst -> first heatmap, switching head and
   layer -> the heatmap redrawn, a first load of the page -> the weights heatmap and every figure
   drawn. Medians of 20 edits and 10 switches each (5 loads), with min and max; at 1,024 tokens a
   quarter as many. The columns side by side are the peers: 20 tokens (Plotly's per-cell heatmap),
   128 (the painted image, its colour levels) and 1,024 (the same, scores stages on request).

    bench/.env/bin/python -m bench.browser [--edits 20] [--switches 10] [--tokens 20 128 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.common import ROOT, header, live_server, median, run_main, table, verdict

sys.path.insert(0, str(ROOT))
from scripts import explorer_latency as latency  # noqa: E402  (the one measurement, shared with the script)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BYTES_BUDGET = 600 * 1024
FIRST_BUDGET_MS = 100.0  # edit -> first heatmap, debounce included (20 and 128 tokens)
ALL_BUDGET_MS = 200.0  # edit -> every figure
SWITCH_BUDGET_MS = 50.0  # head or layer -> its heatmap
# Long inputs: at 1,024 tokens, the most the explorer page draws (settings.explorer_max_tokens)
LONG_TOKENS = 1024
LONG_FIRST_BUDGET_MS = 400.0  # edit -> first heatmap
LONG_SERVER_BUDGET_MS = 150.0  # the same edit's update, sent -> first byte
LONG_SWITCH_BUDGET_MS = 150.0  # head -> its whole heatmap
LONG_UPDATE_BUDGET_BYTES = 1.5 * 2**20  # one update as sent
LONG_LOAD_BUDGET_MS = 2000.0  # first load -> the page drawn


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--switches", type=int, default=10)
    ap.add_argument("--tokens", type=int, nargs="+", default=[20, 128, LONG_TOKENS])
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    header("Browser: the explorer page in headless Chromium")
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing (apt-get install chromium): skipped\n")
        return 0
    assets: list[dict] = []
    with live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})

        def on_finished(request):
            if request.resource_type in ("script", "stylesheet"):
                r = request.response()
                sizes = request.sizes()
                assets.append(
                    {
                        "url": request.url.removeprefix(server.url),
                        "type": request.resource_type,
                        "wire": sizes["responseBodySize"],
                        "encoding": (r and r.header_value("content-encoding")) or "identity",
                    }
                )

        page.on("requestfinished", on_finished)
        page.goto(f"{server.url}/", wait_until="networkidle")
        page.remove_listener("requestfinished", on_finished)
        # a long text's edit takes several times a short one's here: fewer repetitions
        results = {
            n: latency.measure(
                page,
                server.url,
                n,
                args.edits if n < LONG_TOKENS else max(4, args.edits // 4),
                args.switches if n < LONG_TOKENS else max(3, args.switches // 3),
            )
            for n in args.tokens
        }
        browser.close()

    (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "out" / "browser.json").write_text(json.dumps({"assets": assets, "latency": results}, indent=1))
    total_bytes = sum(a["wire"] for a in assets)
    print(
        table(
            "JS and CSS transferred on a first visit to / (bytes on the wire)",
            ["file", "type", "encoding", "KB"],
            [[a["url"], a["type"], a["encoding"], f"{a['wire'] / 1024:.1f}"] for a in assets]
            + [["all", "", "", f"{total_bytes / 1024:.1f}"]],
        )
    )
    print(
        table(
            f"The explorer's latencies, toy model, median (min-max) ms; typing debounce {latency.debounce_ms():.0f} ms "
            f"(a key after a pause is sent at once); load average {os.getloadavg()[0]:.1f} at the end",
            ["measure"] + [f"{n} tokens" for n in results],
            latency.summary(results),
        )
    )
    print(
        f"budget JS+CSS <= {BYTES_BUDGET // 1024} KB: {total_bytes / 1024:.0f} KB -> {verdict(total_bytes <= BYTES_BUDGET)}"
    )
    for n, r in results.items():
        first, every = median(r["edit_first"]), median([x for x in r["edit_all"] if x is not None] or [float("inf")])
        server = median([x for x in r["edit_server"] if x is not None] or [float("nan")])
        if n >= LONG_TOKENS:
            load = median(r["load_all"])
            size = median([x for x in r["edit_bytes"] if x is not None] or [float("inf")])
            print(
                f"budget at {n} tokens: edit -> first heatmap <= {LONG_FIRST_BUDGET_MS:.0f} ms: {first:.0f} ms -> "
                f"{verdict(first <= LONG_FIRST_BUDGET_MS)} (server {server:.0f} ms of it); server <= "
                f"{LONG_SERVER_BUDGET_MS:.0f} ms: {server:.0f} ms -> {verdict(server <= LONG_SERVER_BUDGET_MS)}; "
                f"head switch <= {LONG_SWITCH_BUDGET_MS:.0f} ms: {median(r['head']):.0f} ms -> "
                f"{verdict(median(r['head']) <= LONG_SWITCH_BUDGET_MS)}; an update <= "
                f"{LONG_UPDATE_BUDGET_BYTES / 2**20:.1f} MB as sent: {size / 2**20:.2f} MB -> "
                f"{verdict(size <= LONG_UPDATE_BUDGET_BYTES)}; first load <= {LONG_LOAD_BUDGET_MS:.0f} ms: "
                f"{load:.0f} ms -> {verdict(load <= LONG_LOAD_BUDGET_MS)}"
            )
            continue
        switch = max(median(r["head"]), median(r["layer"]))
        print(
            f"budget at {n} tokens: edit -> first heatmap <= {FIRST_BUDGET_MS:.0f} ms: {first:.0f} ms -> "
            f"{verdict(first <= FIRST_BUDGET_MS)} (server {server:.0f} ms of it); every figure <= "
            f"{ALL_BUDGET_MS:.0f} ms: {every:.0f} ms -> {verdict(every <= ALL_BUDGET_MS)}; head/layer switch <= "
            f"{SWITCH_BUDGET_MS:.0f} ms: {switch:.0f} ms -> {verdict(switch <= SWITCH_BUDGET_MS)}"
        )
    print()
    return 0


if __name__ == "__main__":
    run_main(main)
