"""Browser: what the explorer page costs a learner, in Debian's headless Chromium driven by Playwright.

1. Bytes of JavaScript and CSS the explorer transfers on a first visit (as sent: gzip-compressed
   when the server compresses), file by file.
2. Time from a text edit to the redrawn attention heatmap, over 20 edits on the toy model. The
   text box waits 250 ms after the last keystroke before asking (htmx `delay:250ms`, so typing
   does not send a request per key); that wait is reported apart from the time after it: the
   request, the server's forward pass and figures, the swap and Plotly's drawing.

    bench/.env/bin/python -m bench.browser [--edits 20]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from bench.common import ROOT, live_server, header, median, run_main, table, verdict

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BYTES_BUDGET = 600 * 1024
EDIT_BUDGET_MS = 100.0
TEXT = "The cat sat on the mat"


def debounce_ms() -> float:
    """The text box's htmx delay, read from the template so the two cannot disagree."""
    html = (ROOT / "templates" / "explorer.html").read_text(encoding="utf-8")
    m = re.search(r'id="text".*?hx-trigger="[^"]*delay:(\d+)ms', html, re.S)
    return float(m.group(1)) if m else 0.0


# One edit: set the text as typing would (value changed, "input" fired), note when htmx sends its
# request, and stop when the weights heatmap has been redrawn with one row per token of the text.
EDIT_AND_WAIT = """async (text) => {
  const box = document.getElementById('text');
  let sent = null;
  const onSend = () => { if (sent === null) sent = performance.now(); };
  document.body.addEventListener('htmx:beforeRequest', onSend);
  const t0 = performance.now();
  box.value = text;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  return await new Promise(resolve => {
    (function check() {
      const el = document.querySelector('#stage-weights .plot');
      if (el && el._fullLayout && el.data && el.data[0].z.length === text.length) {
        const t1 = performance.now();
        document.body.removeEventListener('htmx:beforeRequest', onSend);
        resolve({total: t1 - t0, after_send: sent === null ? null : t1 - sent});
      } else requestAnimationFrame(check);
    })();
  });
}"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=20)
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
                assets.append({"url": request.url.removeprefix(server.url), "type": request.resource_type,
                               "wire": sizes["responseBodySize"], "encoding": (r and r.header_value(
                                   "content-encoding")) or "identity"})

        page.on("requestfinished", on_finished)
        page.goto(f"{server.url}/?text={TEXT.replace(' ', '+')}", wait_until="networkidle")
        page.wait_for_function("() => document.querySelector('#stage-weights .plot')?._fullLayout")
        page.evaluate(EDIT_AND_WAIT, TEXT[:-1])  # warm-up (a different length, so the first edit redraws)
        edits = [page.evaluate(EDIT_AND_WAIT, TEXT + "abcdefghijklmnopqrstuvwxyz"[: i + 1])
                 for i in range(args.edits)]
        browser.close()

    (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "out" / "browser.json").write_text(json.dumps({"assets": assets, "edits": edits}, indent=1))
    total_bytes = sum(a["wire"] for a in assets)
    print(table("JS and CSS transferred on a first visit to / (bytes on the wire)",
                ["file", "type", "encoding", "KB"],
                [[a["url"], a["type"], a["encoding"], f"{a['wire'] / 1024:.1f}"] for a in assets]
                + [["all", "", "", f"{total_bytes / 1024:.1f}"]]))
    wait = debounce_ms()
    total = median([e["total"] for e in edits])
    after = median([e["after_send"] for e in edits if e["after_send"] is not None])
    print(table(f"Text edit -> redrawn weights heatmap, toy model ({len(TEXT) + 1}..{len(TEXT) + args.edits} "
                f"tokens), median of {args.edits} edits",
                ["measure", "ms"],
                [["edit -> redrawn (all)", f"{total:.0f}"], ["  of which the typing debounce (htmx delay)", f"{wait:.0f}"],
                 ["request sent -> redrawn", f"{after:.0f}"],
                 ["min / max of request sent -> redrawn",
                  f"{min(e['after_send'] for e in edits):.0f} / {max(e['after_send'] for e in edits):.0f}"]]))
    print(f"budget JS+CSS <= {BYTES_BUDGET // 1024} KB: {total_bytes / 1024:.0f} KB -> {verdict(total_bytes <= BYTES_BUDGET)}")
    print(f"budget edit -> redraw <= {EDIT_BUDGET_MS:.0f} ms (after the {wait:.0f} ms debounce): {after:.0f} ms -> "
          f"{verdict(after <= EDIT_BUDGET_MS)}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
