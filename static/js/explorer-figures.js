// Figure data -> Plotly: a `data-figure` attribute (a figure dict of app/pages/figures.py as JSON,
// its matrices packed as base64 by app/pages/web.py) read into traces, a layout and a config for
// Plotly.react. `figureTraces` is the one place that turns figure data into Plotly traces
// (unpacking, hover text). Also the page's classroom size, which the layout's fonts follow.

const CLASSROOM_FONT_SCALE = 1.3;

// The projector-friendly size (the "Classroom size" checkbox, explorer-main.js) is on the body.
export function isClassroom() {
  return document.body.classList.contains("classroom");
}

const ARRAY_TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, u1: Uint8Array};

// Plotly's typed-array spec {dtype, bdata (base64), shape "rows,cols"} as an array of typed rows
// (views on one buffer, no copy); anything else as it is, with its parts unpacked.
function unpack(value) {
  if (Array.isArray(value)) return value.map(unpack);
  if (!value || typeof value !== "object") return value;
  if (typeof value.bdata === "string" && value.dtype in ARRAY_TYPES) {
    const bytes = atob(value.bdata);
    const buffer = new Uint8Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) buffer[i] = bytes.charCodeAt(i);
    const Type = ARRAY_TYPES[value.dtype];
    const flat = new Type(buffer.buffer);
    const shape = String(value.shape || flat.length).split(",").map(Number);
    if (shape.length === 1) return flat;
    const rows = [];
    for (let r = 0; r < shape[0]; r++) rows.push(flat.subarray(r * shape[1], (r + 1) * shape[1]));
    return rows;
  }
  const out = {};
  for (const key in value) out[key] = unpack(value[key]);
  return out;
}

export function readFigure(el) {
  if (!el._explorerFigure) el._explorerFigure = unpack(JSON.parse(el.getAttribute("data-figure")));
  return el._explorerFigure;
}

// Each heatmap cell's hover text, from the figure's "cell_text" pattern and its (already
// escaped) tick labels: "query {i} {y} → key {j} {x}". Built here so the server sends n labels,
// not n² strings; kept per pattern and labels, so a new head or layer reuses them.
export function fillCell(parts, i, y, j, x) {
  // replacement by position, never String.replace: a label such as "$&" is only text
  const values = {"{i}": i, "{y}": y, "{j}": j, "{x}": x};
  let s = "";
  for (const part of parts) s += part in values ? values[part] : part;
  return s;
}
export function cellParts(pattern) {
  return pattern.split(/(\{[ijxy]\})/);
}

const cellTextCache = new Map();
function cellText(pattern, xt, yt) {
  const key = pattern + "\u0000" + xt.join("\u0001") + "\u0000" + yt.join("\u0001");
  let text = cellTextCache.get(key);
  if (text) return text;
  const parts = cellParts(pattern);
  text = yt.map(function (y, i) {
    return xt.map(function (x, j) { return fillCell(parts, i, y, j, x); });
  });
  if (cellTextCache.size > 16) cellTextCache.clear();
  cellTextCache.set(key, text);
  return text;
}

function axisLabels(figure, axis) {
  return ((figure.layout || {})[axis] || {}).ticktext;
}

// A matrix the server marks export.draw = "image" (long inputs) is painted by explorer-image.js.
export function isImage(figure) {
  return !!(figure && figure.export && figure.export.draw === "image");
}

// [rows, columns] of a heatmap's matrix: its values' (z), or a painted matrix's (export.shape, when
// it came as colour levels).
export function matrixShape(figure) {
  const z = figure.data && figure.data[0] && figure.data[0].z;
  if (z && z.length) return [z.length, z[0].length];
  return (figure.export && figure.export.shape) || [0, 0];
}

// THE place where a figure becomes Plotly traces. An image figure's cells are not a trace
// (paintImage draws them, masked cells from export.mask): Plotly gets its colour bar, and of
// its other traces (the mask's overlay) their legend entries only.
export function figureTraces(el, figure) {
  const data = figure.data || [];
  if (isImage(figure)) return imageTraces(figure);
  const pattern = figure.export && figure.export.cell_text;
  const xt = axisLabels(figure, "xaxis");
  const yt = axisLabels(figure, "yaxis");
  if (el.hasAttribute("data-static") || !pattern || !xt || !yt) return data;
  return data.map(function (trace) {
    if (trace.type !== "heatmap" || trace.text || !trace.z) return trace;
    return Object.assign({}, trace, {text: cellText(pattern, xt, yt)});
  });
}

function imageTraces(figure) {
  const heat = figure.data[0];
  const traces = [{
    // no points: the colour bar only (its scale and range are the heatmap's)
    type: "scatter", mode: "markers", x: [null], y: [null], hoverinfo: "skip", showlegend: false,
    marker: {color: [heat.zmin], colorscale: heat.colorscale, cmin: heat.zmin, cmax: heat.zmax,
      showscale: heat.showscale !== false, colorbar: heat.colorbar},
  }];
  figure.data.slice(1).forEach(function (trace) {  // the legend's "masked" swatch; the cells are in the image
    if (trace.showlegend) traces.push(Object.assign({}, trace, {x: [null], y: [null], hoverinfo: "skip"}));
  });
  return traces;
}

function scaledFont(font, factor) {
  const out = Object.assign({}, font || {});
  if (out.size) out.size = Math.round(out.size * factor);
  return out;
}

// The figure's own layout, with fonts enlarged in classroom mode.
export function figureLayout(el, figure) {
  const layout = Object.assign({}, figure.layout || {});
  const factor = isClassroom() ? CLASSROOM_FONT_SCALE : 1;
  if (factor !== 1) {
    layout.font = scaledFont(layout.font, factor);
    if (layout.hoverlabel) layout.hoverlabel = Object.assign({}, layout.hoverlabel, {font: scaledFont(layout.hoverlabel.font, factor)});
    if (layout.margin) {
      // margins were sized for the labels at the normal font (app/pages/figures.py)
      layout.margin = Object.fromEntries(Object.entries(layout.margin).map(function (kv) {
        return [kv[0], typeof kv[1] === "number" ? Math.round(kv[1] * factor) : kv[1]];
      }));
    }
  }
  const bands = (figure.export && figure.export.label_px) || {};
  for (const letter in bands) {
    const key = letter + "axis";
    const axis = layout[key] || {};
    layout[key] = Object.assign({}, axis, {
      showticklabels: false,
      // no tick per token for Plotly to lay out (1,024 of them cost it ~100 ms): explorer-labels.js
      // writes the labels from the figure's own ticktext
      tickmode: "auto", tickvals: undefined, ticktext: undefined, nticks: 1,
      title: Object.assign({}, axis.title, {standoff: Math.round(bands[letter] * factor)}),
    });
  }
  if (isImage(figure)) {
    // the canvas lies under Plotly's SVG (so the zoom box shows above it): the SVG is see-through
    layout.paper_bgcolor = "rgba(0,0,0,0)";
    layout.plot_bgcolor = "rgba(0,0,0,0)";
    layout.hovermode = false;  // hover is explorer-zoom.js's (cellHover), from the figure's data
    layout.dragmode = el.hasAttribute("data-static") ? false : "zoom";
  }
  for (const key of ["xaxis", "yaxis"]) {
    // Plotly writes a zoom into the range it was given: the figure's own stays the way back
    const axis = layout[key];
    if (axis && Array.isArray(axis.range)) layout[key] = Object.assign({}, axis, {range: axis.range.slice()});
  }
  layout.autosize = true;
  return layout;
}

const STATIC_CONFIG = {staticPlot: true, responsive: true, displayModeBar: false};

export function figureConfig(el, figure) {
  const filename = (figure.export && figure.export.name) || "figure";
  if (el.hasAttribute("data-static")) return STATIC_CONFIG;
  return {
    responsive: true,
    displaylogo: false,
    // Plotly 4 offers to upload the chart to its cloud by default: this app never sends data away.
    showSendToCloud: false,
    showEditInChartStudio: false,
    scrollZoom: false,
    // Double-click goes back to the figure's own window, never to Plotly's autorange: a painted
    // matrix's traces are placeholders, so an autorange fits a window of two rows.
    doubleClick: "reset",
    // The PNG export stays (toImage); the rest of the bar is trimmed to what a learner needs.
    modeBarButtonsToRemove: ["sendChartToCloud", "select2d", "lasso2d", "autoScale2d", "toggleSpikelines",
      "hoverClosestCartesian", "hoverCompareCartesian"],
    toImageButtonOptions: {format: "png", filename: filename, scale: 2},
  };
}

