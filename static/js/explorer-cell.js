// "This cell" (templates/partials/cell.html, app/pages/explorer_cell.py): the cell selected on any of the
// four stage heatmaps (explorer-cells.js: a click, the arrow keys) opened beside them: q and k and their
// products, the score, the scaling, the mask, the softmax and the weighted values. The server renders the
// panel from the head it kept when it drew the view: one small request (`part=cell`) per move, no new run.
// The open cell lives in the URL (`cell=QUERY,KEY`, replaced, not pushed: a move is not a new page) and in
// the form's hidden `cell` input, so the next view keeps it open.
const STAGES = ["stage-raw", "stage-scaled", "stage-masked", "stage-weights"];

// Milliseconds from a selection to its panel in the page (the request, the answer parsed and swapped in),
// the latest last: bench/browser.py and tests/browser/test_cell.py read them.
export const timings = [];
window.explorerCellTimings = timings;

let pending = null;  // the request in flight: a newer move aborts it

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

export function openCell(i, j, start) {
  const box = panel();
  if (!box) return;
  const cell = i + "," + j;
  if (box.dataset.cell === cell && !box.hasAttribute("aria-busy")) return;  // shown already (a redraw's reselection)
  box.dataset.cell = cell;
  const input = box.querySelector("input[name=cell]");
  input.value = cell;
  input.disabled = false;
  rememberCell(cell);
  if (pending) pending.abort();
  const mine = pending = new AbortController();
  const base = box.dataset.cellBase || "/";
  const url = base + (base.includes("?") ? "&" : "?") + "cell=" + encodeURIComponent(cell) + "&part=cell";
  box.setAttribute("aria-busy", "true");
  fetch(url, {signal: mine.signal, headers: {Accept: "text/html"}})
    .then(function (r) { return r.text().then(function (text) { return {ok: r.ok, text: text}; }); })
    .then(function (answer) {
      if (mine !== pending) return;
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
    })
    .catch(function (err) {
      if (err.name === "AbortError" || mine !== pending) return;
      pending = null;
      box.removeAttribute("aria-busy");
      box.querySelector("#cell-said").textContent = String(err);
    });
}

document.addEventListener("explorer:cell", function (evt) {
  if (isStage(evt.target)) openCell(evt.detail.i, evt.detail.j, performance.now());
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
