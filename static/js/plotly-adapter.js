// The one place that reads Plotly's private state (fields starting with "_", the axes' own
// pixel <-> data functions, its container's class name). Plotly's public API (Plotly.react,
// relayout, purge, el.on("plotly_..."), el.data) is used directly by the explorer's scripts;
// what Plotly does not publish is asked for here, so a Plotly upgrade is checked in one file.
//
// Written against plotly.js-cartesian-dist-min PLOTLY_VERSION (package.json, package-lock.json;
// tests/browser/test_plotly_adapter.py fails when the vendored Plotly is another version). At
// start-up the page's Plotly.version is compared with it: a mismatch logs a console warning.
//
// An ES module (no bundler): the explorer's modules import it (import * as P from
// "./plotly-adapter.js"); it also stays on window.PlotlyAdapter for the browser tests (and a
// console), the one object it puts on window.
//
// Pixels are CSS pixels from the graph element's top-left corner (el.getBoundingClientRect()),
// the coordinates the explorer positions its own layers in; data coordinates are the axes' own
// (a heatmap's cell k spans k - 0.5 .. k + 0.5).
export const PLOTLY_VERSION = "4.1.1";

// Has Plotly drawn into el (and not been purged since)?
export function isDrawn(el) {
  return !!(el && el._fullLayout);
}

function axis(el, letter) {
  return el._fullLayout[letter + "axis"];
}

// The plot area (inside the axes) in el's pixels: {left, top, width, height}.
export function plotArea(el) {
  const xa = axis(el, "x"), ya = axis(el, "y");
  return {left: xa._offset, top: ya._offset, width: xa._length, height: ya._length};
}

// The window an axis shows now (zoomed or not), as drawn: [from, to], a copy.
export function axisRange(el, letter) {
  return axis(el, letter).range.slice();
}

// A data coordinate on axis "x" or "y" as a pixel of el, and back.
export function dataToPixel(el, letter, value) {
  const a = axis(el, letter);
  return a._offset + a.l2p(value);
}
export function pixelToData(el, letter, pixel) {
  const a = axis(el, letter);
  return a.p2l(pixel - a._offset);
}

// The font the plot is drawn with, the layout's own with Plotly's defaults filled in.
export function font(el) {
  return el._fullLayout.font || {};
}

// The element holding Plotly's layers: a child prepended to it lies under the SVG.
export function plotContainer(el) {
  return el.querySelector(".svg-container");
}

// Plotly counts a double-click from the mousedown that started a click train (its
// doubleClickDelay, 500 ms), a zoom drag's press included. Called when a drag ends, before
// Plotly's own mouseup handler: the next mousedown starts a new train.
export function wasDragged(el) {
  return !!(el._dragging && el._dragged);
}
export function startNewClickTrain(el) {
  el._mouseDownTime = 0;
}

// Does the page's Plotly match the one this file was written against? Logs a warning if not.
export function checkVersion() {
  const found = window.Plotly && window.Plotly.version;
  if (found === PLOTLY_VERSION) return true;
  console.warn("plotly-adapter.js was written against Plotly " + PLOTLY_VERSION + ", the page has " +
    (found || "no Plotly") + ": zoom, hover and painted matrices may misbehave (check static/js/plotly-adapter.js)");
  return false;
}

window.PlotlyAdapter = {
  PLOTLY_VERSION: PLOTLY_VERSION,
  isDrawn: isDrawn, plotArea: plotArea, axisRange: axisRange, dataToPixel: dataToPixel,
  pixelToData: pixelToData, font: font, plotContainer: plotContainer, wasDragged: wasDragged,
  startNewClickTrain: startNewClickTrain, checkVersion: checkVersion,
};

// A module runs after the page's classic deferred scripts (Plotly among them, templates/base.html),
// once: the start-up check.
checkVersion();
