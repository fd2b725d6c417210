"""Time from a text edit to the redrawn heatmap in the explorer, in headless Chromium.

    .venv/bin/python scripts/explorer_latency.py [--edits 20] [--text "The cat sat on the mat"]

Each edit appends one character in the page (as a keystroke would: value changed, "input"
fired) and the clock stops when the softmax-weights heatmap has been redrawn by Plotly with
one row more. The time includes htmx's 250 ms debounce, the request, the server's run and
figures, the swap and Plotly's drawing of every figure in the results. Measured, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import sync_playwright  # noqa: E402

from scripts.liveserver import live_server  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

DEBOUNCE_MS = 250  # templates/explorer.html: hx-trigger="input changed delay:250ms"

EDIT_AND_WAIT = """async (text) => {
  const box = document.getElementById('text');
  const t0 = performance.now();
  box.value = text;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  return await new Promise(resolve => {
    (function check() {
      const el = document.querySelector('#stage-weights .plot');
      if (el && el._fullLayout && el.data && el.data[0].z.length === text.length) resolve(performance.now() - t0);
      else requestAnimationFrame(check);
    })();
  });
}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--text", default="The cat sat on the mat")
    ap.add_argument("--query", default="", help="extra query string for the page, e.g. 'n_layers=4'")
    args = ap.parse_args()

    with live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(f"{server.url}/?{args.query}")
        page.wait_for_function("() => document.querySelector('#stage-weights .plot')?._fullLayout")
        page.evaluate(EDIT_AND_WAIT, args.text)  # warm-up: the first run draws the weights
        times = [page.evaluate(EDIT_AND_WAIT, args.text + "abcdefghijklmnopqrstuvwxyz"[: i + 1])
                 for i in range(args.edits)]
        browser.close()

    median = statistics.median(times)
    print(f"edit -> redrawn heatmap over {args.edits} edits ({len(args.text) + 1}..{len(args.text) + args.edits} "
          f"tokens, {args.query or 'toy defaults'}), load average {os.getloadavg()[0]:.1f}:")
    print(f"  median {median:.0f} ms (of which {DEBOUNCE_MS} ms debounce), "
          f"min {min(times):.0f} ms, max {max(times):.0f} ms")


if __name__ == "__main__":
    main()
