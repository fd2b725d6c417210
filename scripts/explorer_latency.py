"""How fast the explorer answers a learner, in headless Chromium against a real server.

    .venv/bin/python scripts/explorer_latency.py [--edits 20] [--tokens 20 128] [--switches 10]

For each text length (the toy model reads one character per token, so N tokens is a text of N
characters) it measures, as a learner meets them:

- edit -> first heatmap: one character is appended in the page as a keystroke would (value
  changed, "input" fired) and the clock stops at the first animation frame after the selected
  head's weights heatmap (stage 4) has been drawn with the new text's N rows. It includes the text
  box's typing debounce as the page applies it (`data-debounce-ms`: a key after a pause is sent at
  once, keys in quick succession wait for a pause), the request, the server's run and figures, the
  swap and Plotly's drawing;
- of which the server: the same edit's update request, from sent to its first byte (the browser's
  Resource Timing, over loopback): the server's time beside the page's, in the same run; and its
  bytes as sent (gzip when the server compressed them);
- edit -> every figure: the same edit until every figure of the page has been redrawn;
- a burst: five keys 40 ms apart, timed from the last key (the debounce's wait is then included);
- switching head (a click on a head's thumbnail) and layer (a click on a layer chip) -> the weights
  heatmap redrawn with the new head's or layer's pattern;
- first load: a new visit to the explorer's URL with that text (navigation start, so the server's
  run and the whole page's transfer and parsing count) -> the weights heatmap drawn, and -> every
  figure drawn.

A heatmap is "drawn with N rows" when the figure it shows holds N rows: from 64 tokens explorer.js
paints the matrix itself (app/pages/figures.py IMAGE_MIN_TOKENS) from its colour levels, so the figure
is read from the element's `_explorerShown` (its matrix's shape, and a hash of what it paints), not
from Plotly's traces. A switch is done when the weights heatmap paints the new head's whole matrix
(a pooled thumbnail would not count).

Each figure is a median over repetitions separated by a pause (so the page is idle again). Measured,
not asserted: `make bench BENCH=browser` prints the same table beside its budgets.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.liveserver import live_server  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

SETTLE_MS = 600  # after each action, the page finishes drawing and idles before the next one
LETTERS = "abcdefghijklmnopqrstuvwxyz"

# The figure a heatmap element shows: its matrix's rows, and a hash of what it draws (its values, as
# Plotly draws them, or its colour levels, as explorer.js paints them).
SHOWN_ROWS = """(el => { const f = el._explorerShown; if (!f) return 0;
  return f.data[0].z ? f.data[0].z.length : f.export.shape[0]; })"""
SHOWN_HASH = """(el => { const f = el._explorerShown; if (!f) return null;
  const z = f.data[0].z;
  if (z) return JSON.stringify(Array.from(z[z.length - 1]));
  const a = f.export.levels;
  let h = 0;
  for (let k = 0; k < a.length; k++) h = (Math.imul(h, 31) + a[k]) | 0;
  return h; })"""

# Installed before each page's scripts: when the weights heatmap and then every figure are first drawn.
LOAD_WATCH = """
window.__explorerLoad = {first: null, all: null};
document.addEventListener('explorer:drawn', function (evt) {
  const load = window.__explorerLoad;
  if (load.first === null && evt.target === document.querySelector('#stage-weights [data-figure]')) {
    load.first = performance.now();
  }
  const every = [...document.querySelectorAll('[data-figure]')].every(el => el._fullLayout && !el._explorerPending);
  if (load.first !== null && load.all === null && every) load.all = performance.now();
}, true);
"""

# Shared by every measurement: resolves when `done()` holds at an animation frame after `act()`.
WATCH = """() => {
window.__explorerWatch = async function (act, first, settle) {
  const weights = () => document.querySelector('#stage-weights [data-figure]');
  const allDrawn = () => [...document.querySelectorAll('[data-figure]')]
    .every(el => el._fullLayout && !el._explorerPending) && !document.querySelector('.htmx-request');
  const frame = () => new Promise(r => requestAnimationFrame(() => r(performance.now())));
  let firstAt = null, sent = null;
  const onSend = () => { if (sent === null) sent = performance.now(); };
  const onDrawn = (evt) => { if (firstAt === null && evt.target === weights() && first(evt.target)) firstAt = -1; };
  document.addEventListener('htmx:beforeRequest', onSend);
  document.addEventListener('explorer:drawn', onDrawn);
  performance.clearResourceTimings();
  const t0 = performance.now();
  await act();
  let t1 = null, tAll = null;
  for (let i = 0; i < 3000; i++) {
    const now = await frame();
    if (firstAt === -1) { firstAt = now; t1 = now; }
    if (t1 !== null && allDrawn()) { tAll = now; break; }
  }
  document.removeEventListener('htmx:beforeRequest', onSend);
  document.removeEventListener('explorer:drawn', onDrawn);
  // the page's update (htmx's request): the server's time (request sent -> first byte, over loopback)
  // and its bytes as sent (gzip when the server compressed it)
  const update = performance.getEntriesByType('resource')
    .filter(r => r.initiatorType === 'xmlhttprequest' && r.startTime >= t0)[0];
  await new Promise(r => setTimeout(r, settle));
  return {first: t1 - t0, all: tAll === null ? null : tAll - t0, sent: sent === null ? null : sent - t0,
          server: update ? update.responseStart - update.requestStart : null,
          bytes: update ? update.encodedBodySize : null};
};
}"""

EDIT = (
    """async ([text, settle]) => {
  const box = document.getElementById('text');
  const rows = text.length;
  return await window.__explorerWatch(async () => {
    box.value = text;
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }, el => """
    + SHOWN_ROWS
    + """(el) === rows, settle);
}"""
)

BURST = (
    """async ([text, keys, gap, settle]) => {
  const box = document.getElementById('text');
  const rows = text.length + keys.length;
  const pause = ms => new Promise(r => setTimeout(r, ms));
  box.value = text;
  for (const k of keys.slice(0, -1)) {
    box.value += k;
    box.dispatchEvent(new Event('input', {bubbles: true}));
    await pause(gap);
  }
  return await window.__explorerWatch(async () => {
    box.value += keys[keys.length - 1];
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }, el => """
    + SHOWN_ROWS
    + """(el) === rows, settle);
}"""
)

# A click on a head thumbnail or a layer chip; done when the weights heatmap shows that head's whole
# pattern (as many rows as before, and another matrix) and, for a layer, the title says so.
SWITCH = (
    """async ([forId, settle]) => {
  const rows = """
    + SHOWN_ROWS
    + """, hash = """
    + SHOWN_HASH
    + """;
  const weights = document.querySelector('#stage-weights [data-figure]');
  const before = hash(weights), n = rows(weights);
  const layer = forId.startsWith('layer-') ? forId.slice(6) : null;
  return await window.__explorerWatch(async () => {
    document.querySelector('label[for=' + forId + ']').click();
  }, p => rows(p) === n && hash(p) !== before
       && (layer === null || document.querySelector('#attn-title').textContent.includes('layer ' + layer)), settle);
}"""
)


def debounce_ms() -> float:
    """The text box's typing debounce, read from the template so the two cannot disagree."""
    import re

    template = (Path(__file__).resolve().parent.parent / "templates" / "explorer.html").read_text(encoding="utf-8")
    m = re.search(r'id="text".*?data-debounce-ms="(\d+)"', template, re.S)
    return float(m.group(1)) if m else 0.0


def text_of(n: int) -> str:
    """A text the toy model reads as n tokens (one per character)."""
    base = "The cat sat on the mat. " * (n // 24 + 1)
    return base[:n]


def first_load(page, url: str, tokens: int, repeat: int) -> tuple[list[float], list[float]]:
    """ms from navigation start to the weights heatmap drawn, and to every figure drawn, per visit."""
    first, every = [], []
    for _ in range(repeat):
        page.goto(f"{url}/?model=toy&text={text_of(tokens).replace(' ', '+')}", wait_until="commit")
        page.wait_for_function("() => window.__explorerLoad && window.__explorerLoad.all !== null", timeout=120_000)
        load = page.evaluate("() => window.__explorerLoad")
        first.append(load["first"])
        every.append(load["all"])
    return first, every


def measure(page, url: str, tokens: int, edits: int, switches: int) -> dict[str, list[float]]:
    """Every measurement at one text length; each list holds ms per repetition."""
    if not getattr(page, "_explorer_load_watch", False):  # once per page: it stays for every later visit
        page.add_init_script(LOAD_WATCH)
        page._explorer_load_watch = True
    load_first, load_all = first_load(page, url, tokens, max(3, edits // 4))
    page.goto(f"{url}/?model=toy&text={text_of(tokens - 1).replace(' ', '+')}")
    page.wait_for_function("() => document.querySelector('#stage-weights [data-figure]')?._fullLayout")
    page.evaluate(WATCH)
    page.evaluate(EDIT, [text_of(tokens), SETTLE_MS])  # warm-up
    page.evaluate(EDIT, [text_of(tokens - 1), SETTLE_MS])
    out: dict[str, list[float]] = {
        "edit_first": [],
        "edit_all": [],
        "edit_server": [],
        "edit_bytes": [],
        "burst_first": [],
        "head": [],
        "layer": [],
        "load_first": load_first,
        "load_all": load_all,
    }
    for i in range(edits):
        # alternate n and n - 1 characters, a different last letter each time
        text = text_of(tokens - 1) + LETTERS[i % 26]
        r = page.evaluate(EDIT, [text, SETTLE_MS])
        out["edit_first"].append(r["first"])
        out["edit_all"].append(r["all"])
        out["edit_server"].append(r["server"])
        out["edit_bytes"].append(r["bytes"])
        page.evaluate(EDIT, [text_of(tokens - 1), SETTLE_MS])
    for i in range(max(1, edits // 4)):
        r = page.evaluate(BURST, [text_of(tokens - 5), list(LETTERS[i % 20 : i % 20 + 5]), 40, SETTLE_MS])
        out["burst_first"].append(r["first"])
        page.evaluate(EDIT, [text_of(tokens - 1), SETTLE_MS])
    n_heads = page.locator(".head-grid .head").count()
    n_layers = page.locator(".layers input").count()
    for i in range(switches):
        out["head"].append(page.evaluate(SWITCH, [f"head-{(i + 1) % n_heads}", SETTLE_MS])["first"])
    for i in range(switches):
        out["layer"].append(page.evaluate(SWITCH, [f"layer-{(i + 1) % n_layers}", SETTLE_MS])["first"])
    return out


def run(tokens: list[int], edits: int, switches: int) -> dict[int, dict[str, list[float]]]:
    from playwright.sync_api import sync_playwright

    results = {}
    with live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        for n in tokens:
            results[n] = measure(page, server.url, n, edits, switches)
        browser.close()
    return results


ROWS = [
    ("edit_first", "edit -> first heatmap redrawn"),
    ("edit_server", "  of which the server (update sent -> its first byte)"),
    ("edit_all", "edit -> every figure redrawn"),
    ("burst_first", "last key of a burst (5 keys, 40 ms apart) -> first heatmap"),
    ("head", "switch head -> its heatmap redrawn"),
    ("layer", "switch layer -> its heatmap redrawn"),
    ("load_first", "first load -> weights heatmap drawn"),
    ("load_all", "first load -> every figure drawn"),
]


def summary(results: dict[int, dict[str, list[float]]]) -> list[list[str]]:
    rows = []
    for key, label in ROWS:
        cells = [label]
        for r in results.values():
            xs = [x for x in r[key] if x is not None]
            cells.append(f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})" if xs else "-")
        rows.append(cells)
    sizes = [[x for x in r["edit_bytes"] if x is not None] for r in results.values()]
    rows.append(
        ["bytes of one update as sent (KB)"] + [f"{statistics.median(xs) / 1024:.0f}" if xs else "-" for xs in sizes]
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--tokens", type=int, nargs="+", default=[20, 128])
    ap.add_argument("--switches", type=int, default=10)
    args = ap.parse_args()
    results = run(args.tokens, args.edits, args.switches)
    print(
        f"toy model, median (min-max) ms, debounce {debounce_ms():.0f} ms (first key after a pause sent at once), "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| measure | " + " | ".join(f"{n} tokens" for n in results) + " |")
    print("|---|" + "---|" * len(results))
    for row in summary(results):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
