// "This cell" (templates/partials/cell.html, app/pages/explorer_cell.py): the cell selected on any of the
// four stage heatmaps (explorer-cells.js: a click, the arrow keys) opened beside them: q and k and their
// products, the score, the scaling, the mask, the softmax and the weighted values. The server renders the
// panel from the head it kept when it drew the view: one small request (`part=cell`) per cell, no new run; the
// open cell's four neighbours are asked for once it is shown, so an arrow key's panel is usually here already,
// and a cell the pointer rests on is asked for before the click.
// The open cell lives in the URL (`cell=QUERY,KEY`, replaced, not pushed: a move is not a new page) and in
// the form's hidden `cell` input, so the next view keeps it open.
import * as P from "./plotly-adapter.js";

const STAGES = ["stage-raw", "stage-scaled", "stage-masked", "stage-weights"];

// Milliseconds from a selection to its panel in the page (the request, the answer parsed and swapped in),
// the latest last: bench/browser.py and tests/browser/test_cell.py read them.
export const timings = [];
window.explorerCellTimings = timings;

let pending = null;  // the cell whose panel is awaited: an answer for another one is not shown

// Panels asked for, by URL (a promise of {ok, text}): the neighbours of the open cell are asked for once it is
// shown, so that the next arrow key finds its panel here instead of waiting for the server. The view's URL
// is part of the key, so a new view asks afresh; the oldest go past KEEP.
const answers = new Map();
const KEEP = 64;

function ask(url) {
  let got = answers.get(url);
  if (!got) {
    got = fetch(url, {headers: {Accept: "text/html"}})
      .then(function (r) { return r.text().then(function (text) { return {ok: r.ok, text: text}; }); });
    got.then(function (a) { if (!a.ok) answers.delete(url); }, function () { answers.delete(url); });
    answers.set(url, got);
    while (answers.size > KEEP) answers.delete(answers.keys().next().value);
  }
  return got;
}

function panelURL(box, i, j) {
  const base = box.dataset.cellBase || "/";
  return base + (base.includes("?") ? "&" : "?") + "cell=" + encodeURIComponent(i + "," + j) + "&part=cell";
}

function panel() { return document.getElementById("cell-panel"); }

function isStage(el) {
  const card = el.closest && el.closest("figure");
  return Boolean(card && STAGES.includes(card.id));
}

function rememberCell(cell) {
  const url = new URL(location.href);
  url.searchParams.set("cell", cell);
  history.replaceState(Object.assign({}, history.state, {htmx: true}), "", url.pathname + url.search);
}

// The cells an arrow key may open next: the four neighbours, and further on in the direction the last move
// went (a held key moves on), AHEAD of them.
const AHEAD = 4;
let last = null;  // the cell shown before, [i, j]

function askAround(box, i, j, size) {
  const wanted = [[i, j - 1], [i, j + 1], [i - 1, j], [i + 1, j]];
  if (last && Math.abs(i - last[0]) + Math.abs(j - last[1]) === 1) {
    for (let k = 2; k <= AHEAD; k++) wanted.push([i + k * (i - last[0]), j + k * (j - last[1])]);
  }
  last = [i, j];
  wanted.forEach(function ([a, b]) {
    if (a >= 0 && b >= 0 && a < size.rows && b < size.cols) ask(panelURL(box, a, b));
  });
}

// size: the heatmap's {rows, cols}, for the neighbours worth asking for
export function openCell(i, j, start, size) {
  const box = panel();
  if (!box) return;
  const cell = i + "," + j;
  if (box.dataset.cell === cell && !box.hasAttribute("aria-busy")) return;  // shown already (a redraw's reselection)
  box.dataset.cell = cell;
  const input = box.querySelector("input[name=cell]");
  input.value = cell;
  input.disabled = false;
  rememberCell(cell);
  pending = cell;
  box.setAttribute("aria-busy", "true");
  ask(panelURL(box, i, j)).then(function (answer) {
    if (pending !== cell || !box.isConnected) return;
    pending = null;
    box.removeAttribute("aria-busy");
    const said = box.querySelector("#cell-said");
    if (!answer.ok) {  // the server says why (a 422's message)
      said.textContent = answer.text;
      return;
    }
    const t = document.createElement("template");
    t.innerHTML = answer.text;
    const next = t.content.getElementById("cell-panel");
    box.querySelector("#cell-body").replaceWith(next.querySelector("#cell-body"));
    said.textContent = next.querySelector("#cell-said").textContent;
    timings.push(performance.now() - start);
    box.dataset.ms = timings[timings.length - 1].toFixed(1);
    if (size) setTimeout(function () { askAround(box, i, j, size); }, 0);
  }, function (err) {
    if (pending !== cell) return;
    pending = null;
    box.removeAttribute("aria-busy");
    box.querySelector("#cell-said").textContent = String(err);
  });
}

document.addEventListener("explorer:cell", function (evt) {
  if (isStage(evt.target)) openCell(evt.detail.i, evt.detail.j, performance.now(), evt.target._cells);
});

// A view drawn with a cell open (a link with cell=, or a new view keeping it): the stages mark that cell.
function markOpen() {
  const box = panel();
  const cell = box && box.dataset.cell;
  if (!cell) return;
  const [i, j] = cell.split(",").map(Number);
  STAGES.forEach(function (id) {
    const el = document.querySelector("#" + id + " [data-figure]");
    // marked when drawn (explorer-cells.js setupCells); one drawn already keeps the mark it has
    if (el && !el._selected) el._selected = {i: i, j: j};
  });
}

markOpen();
document.addEventListener("htmx:afterSettle", markOpen);

// A click follows the pointer's rest on a cell: a cell of a stage heatmap the pointer stays on for HOVER_MS has
// its panel asked for then, so that the click finds it here (one small answer per cell rested on, no run).
const HOVER_MS = 80;
let hoverTimer = null;
document.addEventListener("mousemove", function (evt) {
  clearTimeout(hoverTimer);
  const el = evt.target.closest && evt.target.closest("[data-figure]");
  const box = panel();
  if (!box || !el || !el._cells || evt.buttons || !isStage(el) || !P.isDrawn(el)) return;
  const bounds = el.getBoundingClientRect();
  const i = Math.round(P.pixelToData(el, "y", evt.clientY - bounds.top));
  const j = Math.round(P.pixelToData(el, "x", evt.clientX - bounds.left));
  if (i < 0 || j < 0 || i >= el._cells.rows || j >= el._cells.cols) return;
  hoverTimer = setTimeout(function () { ask(panelURL(box, i, j)); }, HOVER_MS);
}, {passive: true});
