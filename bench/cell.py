"""Browser: the explorer's "This cell" panel (issue 36), in Debian's headless Chromium driven by Playwright.

Opening a cell cold (selecting one on the weights heatmap, as a click does, far from any cell asked for before:
one round trip for `part=cell`, app/pages/explorer_cell.py), and by a click as a hand makes it (the pointer
resting on the cell first, which asks for its panel: at 20 and 128 tokens, where a cell is pixels wide) and moving it with the arrow keys (each key pressed once the previous
panel is shown, as a held key; static/js/explorer-cell.js asks for the neighbours' panels once a cell is shown),
at 20, 128 and 1,024 tokens of the toy model. Each time is the page's own: performance.now() from the selection
to the panel swapped in (window.explorerCellTimings). Beside them, the server's part of a `part=cell` answer
(request sent -> first byte, Resource Timing) and its size as sent. Budget: <= 50 ms at 128 tokens.

    .venv/bin/python -m bench.cell [--opens 8] [--moves 20] [--tokens 20 128 1024]
"""

from __future__ import annotations

import argparse
import os
from urllib.parse import quote_plus

from bench.browser import CHROMIUM, CHROMIUM_ARGS
from bench.common import header, live_server, median, run_main, table, verdict

BUDGET_MS = 50
BUDGET_TOKENS = 128
SENTENCE = "ali makan nasi lemak di kedai. "
SETTLED = """() => [...document.querySelectorAll('[data-figure]')].every(el => el._fullLayout && !el._explorerPending)
  && !document.querySelector('.htmx-request')"""
# A selection as a click makes it (explorer-cells.js selectCell, the module the page runs): a click's pixel is
# a cell's only while cells are wider than a pixel, not at 1,024 tokens.
SELECT = """async ([i, j]) => { const m = await import('/static/js/explorer-cells.js');
  m.selectCell(document.querySelector('#stage-weights [data-figure]'), i, j); }"""
CLICK = """([i, j]) => { const el = document.querySelector('#stage-weights [data-figure]');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis;
  return {x: xa._offset + xa.l2p(j), y: ya._offset + ya.l2p(i)}; }"""
SELECT_AT = """async ([x, y]) => { const m = await import('/static/js/explorer-cells.js');
  const el = document.querySelector('#stage-weights [data-figure]');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis;
  m.selectCell(el, Math.round(ya.p2l(y - ya._offset)), Math.round(xa.p2l(x - xa._offset))); }"""
CLICK_MAX_TOKENS = 128  # cells a few pixels wide at least: the pointer can rest on one
REST_MS = 300  # the pointer on the cell before the press, as a hand clicks
SERVER = """() => performance.getEntriesByType('resource').filter(e => e.name.includes('part=cell'))
  .map(e => [e.responseStart - e.requestStart, e.transferSize])"""


def measure(page, url: str, n: int, opens: int, moves: int) -> dict:
    text = (SENTENCE * (n // len(SENTENCE) + 1))[:n]
    page.goto(f"{url}/?model=toy&text={quote_plus(text)}")
    page.wait_for_function(SETTLED, timeout=120_000)
    plot = page.locator("#stage-weights [data-figure]")
    count = 0
    # cells far apart (none of them asked for before), the last one with room for the moves left and up
    cells = [(n // 2 - 1 - (k * 3) % (n // 4), (k * 5) % (n // 3)) for k in range(opens - 1)] + [(n - 1, n // 2 + 1)]
    for i, j in cells:
        page.evaluate(SELECT, [i, j])
        count += 1
        page.wait_for_function(f"() => window.explorerCellTimings.length === {count}")
    clicked = []
    if n <= CLICK_MAX_TOKENS:  # a click as a hand makes it: the pointer rests on the cell, then presses
        plot.scroll_into_view_if_needed()
        box = plot.bounding_box()  # in the window's pixels, where the mouse moves
        for i, j in cells[:-1]:  # beside the cold ones (not their neighbours, asked for when they were shown)
            i, j = i - 2, j + 2
            at = page.evaluate(CLICK, [i, j])
            page.mouse.move(box["x"] + at["x"], box["y"] + at["y"])
            page.wait_for_timeout(REST_MS)
            # the press: the hovered cell selected as a click selects it (a real press's clicks come within
            # Plotly's double-click time of each other in this loop, and a double click selects nothing)
            page.evaluate(SELECT_AT, [at["x"], at["y"]])
            count += 1
            page.wait_for_function(f"() => window.explorerCellTimings.length === {count}")
        clicked = page.evaluate("() => window.explorerCellTimings")[opens:]
        page.evaluate(SELECT, list(cells[-1]))
        count += 1
        page.wait_for_function(f"() => window.explorerCellTimings.length === {count}")
    plot.focus()
    for k in range(moves):
        page.keyboard.press("ArrowLeft" if k < moves // 2 else "ArrowUp")
        count += 1
        page.wait_for_function(f"() => window.explorerCellTimings.length === {count}")
    timings = page.evaluate("() => window.explorerCellTimings")
    server = page.evaluate(SERVER)
    return {
        "open": timings[:opens],
        "click": clicked,
        "move": timings[opens + (len(clicked) + 1 if clicked else 0) :],
        "server": [s[0] for s in server],
        "bytes": [s[1] for s in server if s[1]],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=8)
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--tokens", type=int, nargs="+", default=[20, 128, 1024])
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    header("The explorer's cell panel: open and move, in the browser")
    with live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        results = {n: measure(page, server.url, n, args.opens, args.moves) for n in args.tokens}
        browser.close()

    def cell(xs: list[float]) -> str:
        return f"{median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "-"

    print(
        table(
            f"median (min-max) ms, toy model; load average {os.getloadavg()[0]:.1f} at the end",
            ["measure"] + [f"{n} tokens" for n in results],
            [
                ["open a cell, cold (selection -> panel)"] + [cell(r["open"]) for r in results.values()],
                [f"open by a click after the pointer rests {REST_MS} ms"]
                + [cell(r["click"]) for r in results.values()],
                ["move it (arrow key -> panel)"] + [cell(r["move"]) for r in results.values()],
                ["server, part=cell (sent -> first byte)"] + [cell(r["server"]) for r in results.values()],
                ["part=cell as sent (KB)"]
                + [f"{median(r['bytes']) / 1024:.1f}" if r["bytes"] else "-" for r in results.values()],
            ],
        )
    )
    if BUDGET_TOKENS in results:
        r = results[BUDGET_TOKENS]
        worst = max(median(r["click"]), median(r["move"]))
        print(
            f"budget at {BUDGET_TOKENS} tokens: open or move -> panel <= {BUDGET_MS} ms: a click {median(r['click']):.1f} "
            f"ms (cold {median(r['open']):.1f} ms), a move {median(r['move']):.1f} ms -> {verdict(worst <= BUDGET_MS)}"
        )
    return 0


if __name__ == "__main__":
    run_main(main)
