// The selected cell, in words: a heatmap with hover text can be focused; arrow keys (Home/End,
// PageUp/PageDown for the first and last row) move its selected cell, a click selects the cell
// under the pointer, and the figure's live region says "query i a → key j b: weight 0.42" and
// where that query looks most. A painted matrix sent as colour levels has its values read from the
// server (explorer-values.js): the words say "…" until they come, then the exact value.
import * as P from "./plotly-adapter.js";
import {fillCell, cellParts, matrixShape} from "./explorer-figures.js";
import {isRead, knownRow} from "./explorer-values.js";

// Row i's values as the reader reads them: the figure's own, or a painted matrix's read from the
// server (null while they come, undefined if they cannot be read).
export function rowValues(el, figure, i) {
  const z = figure.data[0].z;
  if (z) return z[i];
  return isRead(figure) ? knownRow(el, figure, i) : undefined;
}

// words: the readout's words in the page's language, where it is not English (app/pages/figures.py)
function valueWords(figure, row, j) {
  const words = figure.export.words || {};
  if (row === null) return "…";
  if (row === undefined) return words.unavailable || "(not available)";
  return Number.isNaN(row[j]) ? (words.masked || "masked (no value)") : row[j].toFixed(2);
}

export function cellWords(el, figure, i, j) {
  const layout = figure.layout || {};
  const text = fillCell(cellParts(figure.export.cell_text), i, layout.yaxis.ticktext[i], j, layout.xaxis.ticktext[j]);
  const value = figure.export.value || "value";
  const label = document.createElement("span");
  label.innerHTML = text;  // the labels are escaped by the server (app/pages/figures.py): decode entities only
  return label.textContent + ": " + value + " " + valueWords(figure, rowValues(el, figure, i), j);
}

export function setupCells(el, figure) {
  const pattern = figure.export && figure.export.cell_text;
  const trace = (figure.data || [])[0];
  const shape = matrixShape(figure);
  if (!pattern || !trace || trace.type !== "heatmap" || !shape[0]) return;
  el._cells = {rows: shape[0], cols: shape[1]};
  if (!el.hasAttribute("tabindex")) el.setAttribute("tabindex", "0");
  el.setAttribute("aria-roledescription", "heatmap");
  const sel = el._selected;
  if (sel && (sel.i >= el._cells.rows || sel.j >= el._cells.cols)) el._selected = null;
  if (el._selected) showSelected(el);
  if (!el._cellHandlers) {
    el._cellHandlers = true;
    el.on("plotly_click", function (ev) {
      const p = ev.points && ev.points[0];
      if (!p || p.data.type !== "heatmap") return;
      selectCell(el, p.pointIndex[0], p.pointIndex[1]);
    });
    // the values of a painted matrix have come: say them
    el.addEventListener("explorer:values", function () { if (el._selected) showSelected(el); });
  }
}

function liveRegion(el) {
  const card = el.closest(".figure") || el.parentElement;
  let region = card.querySelector(":scope > .cell-readout");  // templates/partials/figure.html
  if (!region) {
    region = document.createElement("p");
    region.className = "cell-readout";
    region.setAttribute("aria-live", "polite");
    el.after(region);
  }
  return region;
}

function showSelected(el) {
  const sel = el._selected;
  if (!sel || !P.isDrawn(el)) return;
  const area = P.plotArea(el);
  const at = function (letter, k) { return P.dataToPixel(el, letter, k); };
  let box = el.querySelector(":scope > .cell-marker");
  if (!box) {
    box = document.createElement("div");
    box.className = "cell-marker";
    box.setAttribute("aria-hidden", "true");
    el.appendChild(box);
  }
  const x0 = at("x", sel.j - 0.5), x1 = at("x", sel.j + 0.5);
  const y0 = at("y", sel.i - 0.5), y1 = at("y", sel.i + 0.5);
  box.style.left = Math.min(x0, x1) + "px";
  box.style.top = Math.min(y0, y1) + "px";
  box.style.width = Math.abs(x1 - x0) + "px";
  box.style.height = Math.abs(y1 - y0) + "px";
  // outside a zoomed window the cell is not drawn: no marker (the readout still names it)
  box.hidden = Math.max(x0, x1) < area.left || Math.min(x0, x1) > area.left + area.width ||
    Math.max(y0, y1) < area.top || Math.min(y0, y1) > area.top + area.height;
  liveRegion(el).textContent = cellWords(el, el._explorerShown, sel.i, sel.j) + rowPeak(el, el._explorerShown, sel.i);
}

// Where the selected query looks most: its row's largest value and key (in a long text, the
// cell a reader would otherwise hunt for); nothing until the row's values are known.
function rowPeak(el, figure, i) {
  const row = rowValues(el, figure, i);
  if (!row) return "";
  let best = -1;
  for (let j = 0; j < row.length; j++) if (!Number.isNaN(row[j]) && (best < 0 || row[j] > row[best])) best = j;
  if (best < 0) return "";
  const label = document.createElement("span");
  label.innerHTML = figure.layout.xaxis.ticktext[best];  // escaped by the server: entities only
  const value = figure.export.value || "value", words = figure.export.words || {};
  const said = words.largest ? words.largest.replace("{value}", value).replace("{j}", best).replace("{x}", label.textContent)
    : "this row's largest " + value + ": key " + best + " " + label.textContent;
  return " · " + said + " (" + row[best].toFixed(2) + ")";
}

export function selectCell(el, i, j) {
  if (!el._cells) return;
  el._selected = {i: Math.max(0, Math.min(el._cells.rows - 1, i)), j: Math.max(0, Math.min(el._cells.cols - 1, j))};
  showSelected(el);
  // the cell opened beside the stages (explorer-cell.js)
  el.dispatchEvent(new CustomEvent("explorer:cell", {bubbles: true, detail: el._selected}));
}

document.addEventListener("keydown", function (evt) {
  const el = evt.target;
  if (!el || !el._cells || !el.matches("[data-figure]")) return;
  const sel = el._selected;
  const last = {i: el._cells.rows - 1, j: el._cells.cols - 1};
  const to = !sel ? {i: 0, j: 0} : {
    ArrowUp: {i: sel.i - 1, j: sel.j}, ArrowDown: {i: sel.i + 1, j: sel.j},
    ArrowLeft: {i: sel.i, j: sel.j - 1}, ArrowRight: {i: sel.i, j: sel.j + 1},
    Home: {i: sel.i, j: 0}, End: {i: sel.i, j: last.j}, PageUp: {i: 0, j: sel.j}, PageDown: {i: last.i, j: sel.j},
  }[evt.key];
  if (!to || !["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Home", "End", "PageUp", "PageDown"].includes(evt.key)) return;
  evt.preventDefault();
  selectCell(el, to.i, to.j);
});
