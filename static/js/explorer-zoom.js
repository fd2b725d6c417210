// Zoom and the pointer on a painted matrix (explorer-image.js): drag zooms into a window of
// queries × keys (Plotly's own zoom box), the card's "Reset zoom" (or a double click) goes back to
// every token; the cell under the pointer is found from the axes, shown on hover and selected on
// click (explorer-cells.js says it in words).
import * as P from "./plotly-adapter.js";
import {isImage} from "./explorer-figures.js";
import {cellWords, selectCell} from "./explorer-cells.js";

// The cell under the pointer, from the axes' own pixel-to-data mapping; null outside the cells.
function cellAt(el, evt) {
  const figure = el._explorerShown;
  if (!P.isDrawn(el) || !figure || !el._cells) return null;
  const area = P.plotArea(el);
  const box = el.getBoundingClientRect();
  const x = evt.clientX - box.left, y = evt.clientY - box.top;
  if (x < area.left || y < area.top || x > area.left + area.width || y > area.top + area.height) return null;
  const i = Math.round(P.pixelToData(el, "y", y)), j = Math.round(P.pixelToData(el, "x", x));
  if (i < 0 || j < 0 || i >= el._cells.rows || j >= el._cells.cols) return null;
  return {i: i, j: j};
}

function hoverBox(el) {
  let box = el.querySelector(":scope > .cell-hover");
  if (!box) {
    box = document.createElement("div");
    box.className = "cell-hover";
    box.setAttribute("aria-hidden", "true");  // the readout below the figure says it for everyone
    el.appendChild(box);
  }
  return box;
}

function cellHover(evt) {
  const el = evt.currentTarget;
  const cell = evt.buttons ? null : cellAt(el, evt);  // no hover while dragging a zoom box
  const box = hoverBox(el);
  el._hovered = cell && {i: cell.i, j: cell.j, x: evt.clientX, y: evt.clientY};
  if (!cell) {
    box.hidden = true;
    return;
  }
  showHover(el);
}

// The hovered cell in words, beside the pointer on the side with room; again when its values come.
function showHover(el) {
  const cell = el._hovered, box = hoverBox(el);
  if (!cell || !el._explorerShown) return;
  box.textContent = cellWords(el, el._explorerShown, cell.i, cell.j);
  const bounds = el.getBoundingClientRect();
  const x = cell.x - bounds.left, y = cell.y - bounds.top;
  box.hidden = false;
  box.style.left = (x > bounds.width / 2 ? x - box.offsetWidth - 12 : x + 12) + "px";
  box.style.top = Math.max(0, y - box.offsetHeight - 8) + "px";
}

export function setupImage(el) {
  if (el._imageHandlers) return;
  el._imageHandlers = true;
  el.addEventListener("mousemove", function (evt) { if (isImage(el._explorerShown)) cellHover(evt); });
  el.addEventListener("mouseleave", function () { el._hovered = null; hoverBox(el).hidden = true; });
  el.addEventListener("explorer:values", function () { if (el._hovered && !hoverBox(el).hidden) showHover(el); });
  // a click (not the end of a zoom drag) selects the cell under the pointer
  el.addEventListener("mousedown", function (evt) { el._downAt = [evt.clientX, evt.clientY]; });
  el.addEventListener("click", function (evt) {
    const down = el._downAt;
    if (!isImage(el._explorerShown) || !down || Math.abs(evt.clientX - down[0]) + Math.abs(evt.clientY - down[1]) > 4) return;
    const cell = cellAt(el, evt);
    if (cell) selectCell(el, cell.i, cell.j);
  });
}

// A heatmap's initial window is the figure's own axis ranges; drag zooms (Plotly), and the
// card's "Reset zoom" button shows while the window is smaller.
function zoomButton(el) {
  const card = el.closest(".figure");
  return card && card.querySelector("[data-zoom-reset]");
}

function isZoomed(el) {
  const figure = el._explorerShown;
  if (!P.isDrawn(el) || !figure || !figure.layout || !figure.layout.xaxis || !figure.layout.xaxis.range) return false;
  const same = function (a, b) { return Math.abs(a[0] - b[0]) < 1e-6 && Math.abs(a[1] - b[1]) < 1e-6; };
  return !same(P.axisRange(el, "x"), figure.layout.xaxis.range) || !same(P.axisRange(el, "y"), figure.layout.yaxis.range);
}

export function syncZoomButton(el) {
  const button = zoomButton(el);
  if (button) button.hidden = !isZoomed(el);
}

function resetZoom(el) {
  const layout = el._explorerShown && el._explorerShown.layout;
  if (!layout || !P.isDrawn(el)) return Promise.resolve();
  return Plotly.relayout(el, {"xaxis.range": layout.xaxis.range.slice(), "yaxis.range": layout.yaxis.range.slice()});
}

// A zoom drag is not the first click of a double-click. Plotly counts a click train from the
// drag's mousedown (its doubleClickDelay, 500 ms), so a cell clicked soon after a drag ended was
// taken for a double-click and the zoom reset under it. When a drag ends (this capture listener
// runs before Plotly's own mouseup handler), the next mousedown starts a new train; two real
// clicks still make a double-click, which goes back as before.
window.addEventListener("mouseup", function () {
  document.querySelectorAll("[data-figure]").forEach(function (el) {
    if (P.wasDragged(el)) P.startNewClickTrain(el);
  });
}, true);

document.addEventListener("click", function (evt) {
  const button = evt.target.closest && evt.target.closest("[data-zoom-reset]");
  if (!button) return;
  const el = button.closest(".figure").querySelector("[data-figure]");
  if (el) resetZoom(el).then(function () { el.focus(); });
});
