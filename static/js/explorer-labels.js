// Token labels, written here: axes named in a figure's export.label_px show their tick labels (the
// tokens) written into the band the server's margins keep for them. Plotly would measure each
// label's box (a forced layout per label, most of a heatmap's time at 128 tokens). When cells are
// narrower than a line of text, every k-th label is shown, so labels never overlap.
import * as P from "./plotly-adapter.js";

function labelHtml(labels, cls, place) {
  let html = "";
  for (let k = 0; k < labels.length; k++) {
    const at = place(k);
    if (at !== null) html += '<span class="' + cls + '" data-index="' + k + '" style="' + at + '">' + labels[k] + "</span>";
  }
  return html;  // labels are escaped by the server (app/pages/figures.py token_label): text only
}

export function drawLabels(el, figure) {
  const bands = figure.export && figure.export.label_px;
  let layer = el.querySelector(":scope > .axis-labels");
  if (!bands || !P.isDrawn(el)) {
    if (layer) layer.remove();
    return;
  }
  if (!layer) {
    layer = document.createElement("div");
    layer.className = "axis-labels";
    layer.setAttribute("aria-hidden", "true");  // the figure's label and cell readout say it in words
    el.appendChild(layer);
  }
  const font = P.font(el);
  layer.style.fontFamily = font.family;
  layer.style.fontSize = font.size + "px";
  layer.style.color = font.color;
  const line = (font.size || 13) * 1.25;
  const area = P.plotArea(el);
  const at = function (letter, k) { return P.dataToPixel(el, letter, k); };
  // the cells in the window (all of them, or a zoomed part): a label names its cell's centre
  const ranges = {x: P.axisRange(el, "x"), y: P.axisRange(el, "y")};
  const inside = function (letter, k) {
    const range = ranges[letter];
    return k >= Math.min(range[0], range[1]) && k <= Math.max(range[0], range[1]);
  };
  let html = "";
  if (bands.y) {
    const labels = (figure.layout.yaxis || {}).ticktext || [];
    const cell = Math.abs(at("y", 1) - at("y", 0)) || line;
    const step = Math.max(1, Math.ceil(line / cell));
    const right = el.clientWidth - area.left + 4;
    html += labelHtml(labels, "y-label", function (k) {
      return k % step || !inside("y", k) ? null : "right:" + right + "px;top:" + at("y", k) + "px";
    });
  }
  if (bands.x) {
    const labels = (figure.layout.xaxis || {}).ticktext || [];
    const cell = Math.abs(at("x", 1) - at("x", 0)) || line;
    const upright = !(figure.layout.xaxis || {}).tickangle;
    // upright labels (the server turns them when any is longer than 2 characters) need their width
    const chars = upright ? Math.max(1, ...labels.map(function (t) { return t.replace(/&[a-z]+;/g, "_").length; })) : 0;
    const step = Math.max(1, Math.ceil((upright ? chars * 0.62 * (font.size || 13) + 4 : line) / cell));
    const below = area.top + area.height + 4;
    html += labelHtml(labels, upright ? "x-label" : "x-label x-label-turned", function (k) {
      return k % step || !inside("x", k) ? null : "left:" + at("x", k) + "px;top:" + below + "px";
    });
  }
  layer.innerHTML = html;
}
