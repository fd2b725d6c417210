// Drawing: every element with a `data-figure` attribute is drawn with Plotly.react, and then
// decorated (painted matrix, token labels, selected cell, zoom button).
// - Plots persist across htmx swaps: a drawn plot is taken out of the old content before the swap
//   and put back in place of its successor (same `data-plot-key`), then updated with Plotly.react,
//   which only redraws what changed. A figure whose JSON did not change is not redrawn at all.
// - The figure marked `data-draw-first` (the selected head's softmax weights) is drawn as soon as
//   the swap lands; the others follow one per task once it has been painted.
// - Picking another head redraws that heatmap at once from the head's thumbnail (the same pattern,
//   already in the page); the server's answer then brings the other stages, the URL and the rest.
import * as P from "./plotly-adapter.js";
import {readFigure, isImage, figureTraces, figureLayout, figureConfig} from "./explorer-figures.js";
import {paintImage} from "./explorer-image.js";
import {setupImage, syncZoomButton} from "./explorer-zoom.js";
import {drawLabels} from "./explorer-labels.js";
import {setupCells} from "./explorer-cells.js";
import {headLevels} from "./explorer-values.js";
import {say} from "./words.js";

// Draw `figure` (default: the element's own) into el; "explorer:drawn" fires once it is drawn.
export function draw(el, figure) {
  const json = figure ? null : el.getAttribute("data-figure");
  if (!figure) {
    el._explorerPending = false;
    if (P.isDrawn(el) && json === el._explorerDrawn) return Promise.resolve();  // nothing changed
    try {
      figure = readFigure(el);
    } catch {
      showFigureError(el, say("request", "unreadable"));
      return Promise.resolve();
    }
  }
  el._explorerDrawn = json;
  el._explorerShown = figure;
  return Promise.resolve(Plotly.react(el, figureTraces(el, figure), figureLayout(el, figure), figureConfig(el, figure)))
    .then(function () {
      if (!el._explorerAfterPlot) {
        el._explorerAfterPlot = true;
        el.on("plotly_afterplot", function () { decorate(el); });  // also after a resize or a zoom
        el.on("plotly_relayout", function () { decorate(el); });
      }
      decorate(el);
      // for scripts/explorer_latency.py and anyone waiting on a figure: its data is now on screen
      el.dispatchEvent(new CustomEvent("explorer:drawn", {bubbles: true}));
    });
}

// What these scripts add to a drawn plot: the painted matrix, its token labels, the selected cell.
function decorate(el) {
  const figure = el._explorerShown;
  if (!figure || !P.isDrawn(el)) return;
  const canvas = el.querySelector("canvas.matrix-image");
  if (isImage(figure)) paintImage(el, figure);
  else if (canvas) canvas.remove();
  drawLabels(el, figure);
  if (!el.hasAttribute("data-static")) {
    setupCells(el, figure);
    if (isImage(figure)) setupImage(el);
    syncZoomButton(el);
  }
}

function showFigureError(el, message) {
  const p = document.createElement("p");
  p.className = "error";
  p.textContent = message;
  el.replaceChildren(p);
}

// The figures after the first, one per task in page order, starting after the first figure has
// been painted (a frame, then a task): the heatmap a reader looks at comes first.
let queue = [];
let pumping = false;
function pump() {
  const el = queue.shift();
  if (el && el.isConnected && el._explorerPending) draw(el);
  if (queue.length) setTimeout(pump, 0);
  else pumping = false;
}
function drawLater(els) {
  queue = queue.filter(function (q) { return els.indexOf(q) < 0; }).concat(els);
  if (!pumping && queue.length) {
    pumping = true;
    requestAnimationFrame(function () { setTimeout(pump, 0); });
  }
}

// Plots drawn before the latest swap, by key, waiting to be reused by the new content.
const kept = new Map();

function plotKey(el) {
  return el.getAttribute("data-plot-key");
}

// Before htmx swaps content out, its drawn plots leave it (htmx would otherwise walk their
// thousands of SVG nodes while cleaning up, ~70 ms) and wait in `kept`.
export function keepPlots(target) {
  target.querySelectorAll("[data-figure]").forEach(function (el) {
    if (!P.isDrawn(el)) return;
    const key = plotKey(el);
    el.replaceWith(document.createElement(el.tagName));
    if (key && !kept.has(key)) kept.set(key, el);
    else setTimeout(function () { Plotly.purge(el); }, 0);
  });
}

// `to` takes `from`'s attributes, and only those (tabindex and the like, added here, stay), and
// keeps the class Plotly gave it: taking it away and back would re-style the plot's whole SVG twice
// (Plotly's style rules all start with .js-plotly-plot), most of an update's style work.
const OWN_ATTRIBUTES = ["tabindex", "aria-roledescription"];
const OWN_CLASSES = ["js-plotly-plot"];
export function copyAttributes(from, to) {
  for (const attr of Array.from(to.attributes)) {
    if (!from.hasAttribute(attr.name) && OWN_ATTRIBUTES.indexOf(attr.name) < 0) to.removeAttribute(attr.name);
  }
  for (const attr of Array.from(from.attributes)) {
    let value = attr.value;
    if (attr.name === "class") {
      const own = OWN_CLASSES.filter(function (c) { return to.classList.contains(c) && !from.classList.contains(c); });
      if (own.length) value = (value + " " + own.join(" ")).trim();
    }
    if (to.getAttribute(attr.name) !== value) to.setAttribute(attr.name, value);
  }
}

// The new content's figure elements take the kept plot of the same key: its attributes move
// onto the drawn plot, which replaces the new (empty) element.
function reusePlot(el) {
  const key = plotKey(el);
  const old = key && kept.get(key);
  if (!old) return el;
  kept.delete(key);
  copyAttributes(el, old);
  old._explorerFigure = null;
  el.replaceWith(old);
  return old;
}

export function drawAll(root) {
  const found = [];
  if (root.matches && root.matches("[data-figure]")) found.push(root);
  if (root.querySelectorAll) found.push(...root.querySelectorAll("[data-figure]"));
  const later = [];
  found.map(reusePlot).forEach(function (el) {
    if (P.isDrawn(el)) syncZoomButton(el);  // a morph resets the button to the template's (hidden)
    el._explorerPending = true;
    if (el.hasAttribute("data-draw-first")) draw(el);
    else later.push(el);
  });
  // plots with no successor in the new content are released once it is drawn
  if (kept.size) {
    const gone = Array.from(kept.values());
    kept.clear();
    setTimeout(function () { gone.forEach(function (el) { Plotly.purge(el); }); }, 0);
  }
  drawLater(later);
}

// A head picked: the selected head's weights heatmap shows its pattern at once, while the server
// prepares the rest (the other stages, the URL): from the head's thumbnail (the same numbers,
// app/pages/explorer.py), or, where the thumbnail is pooled (a long text), from that head's colour
// levels read from the server (explorer-values.js; the view it read them from is cached there).
// Listening in the capture phase, so that read leaves first; the form's request waits for the paint
// (headBeingRead, explorer-main.js), so on a small server the two never share its cores.
let picked = 0;
let reading = null;
export function headBeingRead() {
  return reading;
}
document.addEventListener("change", function (evt) {
  const input = evt.target;
  if (!input.matches || !input.matches("input[type=radio][name=head]")) return;
  const thumb = document.querySelector("[data-plot-key='thumb-" + input.value + "']");
  const weights = document.querySelector("#stage-weights [data-figure]");
  if (!thumb || !weights || !P.isDrawn(weights)) return;
  const shown = readFigure(weights);
  const head = readFigure(thumb);
  const mine = ++picked;
  // still the figure this pick started from, and no head picked since
  const current = function () { return mine === picked && weights._explorerFigure === shown; };
  if (!shown.export.levels) {
    const z = head.data[0].z;
    if (!z || z.length !== shown.data[0].z.length) return;  // a pooled thumbnail: wait for the server
    draw(weights, Object.assign({}, shown, {data: shown.data.map(function (trace, i) {
      return i === 0 ? Object.assign({}, trace, {z: z}) : trace;
    })}));
    return;
  }
  // its levels; its values are read once the server's answer names the new head ("read" dropped)
  const withLevels = function (levels) {
    return Object.assign({}, shown, {export: Object.assign({}, shown.export, {levels: levels, read: null})});
  };
  if (head.export.levels && !head.export.pooled) {
    draw(weights, withLevels(head.export.levels));
    return;
  }
  const read = reading = headLevels(weights, input.value).then(function (levels) {
    if (current()) return draw(weights, withLevels(levels));
  }, function () { /* the server's answer draws it */ }).finally(function () {
    if (reading === read) reading = null;
  });
}, true);
