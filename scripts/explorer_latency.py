"""Time from a text edit to the redrawn heatmap in the explorer, in headless Chromium.

    .venv/bin/python scripts/explorer_latency.py [--edits 20] [--text "The cat sat on the mat"]

Each edit appends one character in the page (as a keystroke would: value changed, "input"
fired) and the clock stops when the main heatmap (stage 4, the selected head's softmax weights)
has been redrawn with the new text's data: static/js/explorer.js fires "explorer:drawn" on a plot
once Plotly has drawn it, and the plot's data then has one row per character. The time includes
htmx's typing debounce (reported apart), the request, the server's run and figures, the swap and
Plotly's drawing of that heatmap; the other figures follow it. Measured, not asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import sync_playwright  # noqa: E402

from scripts.liveserver import live_server  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "explorer.html"
SETTLE_MS = 1500  # after each edit, let the other figures finish drawing before the next one


def debounce_ms() -> float:
    """The text box's htmx delay, read from the template so the two cannot disagree."""
    m = re.search(r'id="text".*?hx-trigger="[^"]*delay:(\d+)ms', TEMPLATE.read_text(encoding="utf-8"), re.S)
    return float(m.group(1)) if m else 0.0


# Resolves with {total, after_send} in ms once the stage-4 heatmap shows the new text's data.
EDIT_AND_WAIT = """async ([text, settle]) => {
  const box = document.getElementById('text');
  let sent = null;
  const onSend = () => { if (sent === null) sent = performance.now(); };
  document.addEventListener('htmx:beforeRequest', onSend);
  const t0 = performance.now();
  box.value = text;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  const t1 = await new Promise(resolve => {
    document.addEventListener('explorer:drawn', function onDrawn(evt) {
      const el = document.querySelector('#stage-weights .plot');
      if (evt.target === el && el.data && el.data[0].z.length === text.length) {
        document.removeEventListener('explorer:drawn', onDrawn);
        resolve(performance.now());
      }
    });
  });
  document.removeEventListener('htmx:beforeRequest', onSend);
  await new Promise(resolve => setTimeout(resolve, settle));
  return {total: t1 - t0, after_send: sent === null ? null : t1 - sent};
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
        page.evaluate(EDIT_AND_WAIT, [args.text, SETTLE_MS])  # warm-up: the first run draws the weights
        times = [page.evaluate(EDIT_AND_WAIT, [args.text + "abcdefghijklmnopqrstuvwxyz"[: i + 1], SETTLE_MS])
                 for i in range(args.edits)]
        browser.close()

    total = [t["total"] for t in times]
    after = [t["after_send"] for t in times if t["after_send"] is not None]
    print(f"edit -> redrawn main heatmap over {args.edits} edits ({len(args.text) + 1}..{len(args.text) + args.edits} "
          f"tokens, {args.query or 'toy defaults'}), load average {os.getloadavg()[0]:.1f}:")
    print(f"  edit -> redrawn:         median {statistics.median(total):.0f} ms (of which {debounce_ms():.0f} ms "
          f"debounce), min {min(total):.0f} ms, max {max(total):.0f} ms")
    print(f"  request sent -> redrawn: median {statistics.median(after):.0f} ms, "
          f"min {min(after):.0f} ms, max {max(after):.0f} ms")


if __name__ == "__main__":
    main()
