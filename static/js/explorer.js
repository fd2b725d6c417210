// Transformer Explorer's one script: draws the server's figures and wires their downloads.
//
// - Every element with a `data-figure` attribute (a figure dict of app/figures.py as JSON, its
//   matrices packed as base64 float64 by app/web.py) is drawn with Plotly.react. `figureTraces`
//   is the one place that turns figure data into Plotly traces (unpacking, hover text).
// - Plots persist across htmx swaps: a drawn plot is taken out of the old content before the swap
//   and put back in place of its successor (same `data-plot-key`), then updated with Plotly.react,
//   which only redraws what changed. A figure whose JSON did not change is not redrawn at all.
// - The figure marked `data-draw-first` (the selected head's softmax weights) is drawn as soon as
//   the swap lands; the others follow one per task once it has been painted.
// - Picking another head redraws that heatmap at once from the head's thumbnail (the same pattern,
//   already in the page); the server's answer then brings the other stages, the URL and the rest.
// - The text box asks as soon as a key is pressed after a pause, and at most every DEBOUNCE ms
//   while typing goes on (the last keystroke always sends): `data-debounce-ms` on the text box.
// - A heatmap with hover text is a keyboard widget too: focus it, move the selected cell with the
//   arrow keys (or click a cell), and a live region says "query i a → key j b: weight 0.42".
// - Long inputs: an attention matrix the server marks `export.draw = "image"` (64 tokens or more,
//   app/figures.py) is painted by this script as an image, one pixel per cell, into a canvas under
//   Plotly's axes; hover and the selected cell read the values from the figure's own data. Drag
//   zooms into a window of queries × keys (labels follow, thinned to what fits); "Reset zoom" (or
//   a double click) goes back to every token.
// - Buttons with `data-download="json"|"csv"` inside a `.figure` card download the data behind
//   that card's figure; PNG export is Plotly's own modebar button.
// - Failed requests that the server could not answer in place (busy, network down, 5xx) show a
//   message in the results area; 422s arrive as server-rendered HTML and are swapped like any page.
// - The "classroom" checkbox switches the projector-friendly size at once (its state also goes
//   into the URL with the rest of the form).
// No inline scripts anywhere, so the pages run under a strict Content-Security-Policy.
(function () {
  "use strict";

  const CLASSROOM_FONT_SCALE = 1.3;

  function isClassroom() {
    return document.body.classList.contains("classroom");
  }

  // ------------------------------------------------------------------ figure data -> Plotly

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

  function readFigure(el) {
    if (!el._explorerFigure) el._explorerFigure = unpack(JSON.parse(el.getAttribute("data-figure")));
    return el._explorerFigure;
  }

  // A heatmap's rows as plain arrays, NaN (no value: masked) as null: what downloads hold.
  function plainRows(z) {
    return Array.from(z || [], function (row) {
      return Array.from(row, function (v) { return Number.isNaN(v) ? null : v; });
    });
  }

  // Each heatmap cell's hover text, from the figure's "cell_text" pattern and its (already
  // escaped) tick labels: "query {i} {y} → key {j} {x}". Built here so the server sends n labels,
  // not n² strings; kept per pattern and labels, so a new head or layer reuses them.
  function fillCell(parts, i, y, j, x) {
    // replacement by position, never String.replace: a label such as "$&" is only text
    const values = {"{i}": i, "{y}": y, "{j}": j, "{x}": x};
    let s = "";
    for (const part of parts) s += part in values ? values[part] : part;
    return s;
  }
  function cellParts(pattern) {
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

  // THE place where a figure becomes Plotly traces. An image figure's cells are not a trace
  // (paintImage draws them): Plotly gets its colour bar and the mask's legend entry only.
  function figureTraces(el, figure) {
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

  function scaledFont(font, factor) {
    const out = Object.assign({}, font || {});
    if (out.size) out.size = Math.round(out.size * factor);
    return out;
  }

  // The figure's own layout, with fonts enlarged in classroom mode.
  function figureLayout(el, figure) {
    const layout = Object.assign({}, figure.layout || {});
    const factor = isClassroom() ? CLASSROOM_FONT_SCALE : 1;
    if (factor !== 1) {
      layout.font = scaledFont(layout.font, factor);
      if (layout.hoverlabel) layout.hoverlabel = Object.assign({}, layout.hoverlabel, {font: scaledFont(layout.hoverlabel.font, factor)});
      if (layout.margin) {
        // margins were sized for the labels at the normal font (app/figures.py)
        layout.margin = Object.fromEntries(Object.entries(layout.margin).map(function (kv) {
          return [kv[0], typeof kv[1] === "number" ? Math.round(kv[1] * factor) : kv[1]];
        }));
      }
    }
    const bands = (figure.export && figure.export.label_px) || {};
    for (const letter in bands) {
      const name = letter + "axis";
      const axis = layout[name] || {};
      layout[name] = Object.assign({}, axis, {
        showticklabels: false,
        // no tick per token for Plotly to lay out (1,024 of them cost it ~100 ms): drawLabels
        // writes the labels from the figure's own ticktext
        tickmode: "auto", tickvals: undefined, ticktext: undefined, nticks: 1,
        title: Object.assign({}, axis.title, {standoff: Math.round(bands[letter] * factor)}),
      });
    }
    if (isImage(figure)) {
      // the canvas lies under Plotly's SVG (so the zoom box shows above it): the SVG is see-through
      layout.paper_bgcolor = "rgba(0,0,0,0)";
      layout.plot_bgcolor = "rgba(0,0,0,0)";
      layout.hovermode = false;  // hover is this script's (cellHover), from the figure's data
      layout.dragmode = el.hasAttribute("data-static") ? false : "zoom";
    }
    for (const name of ["xaxis", "yaxis"]) {
      // Plotly writes a zoom into the range it was given: the figure's own stays the way back
      const axis = layout[name];
      if (axis && Array.isArray(axis.range)) layout[name] = Object.assign({}, axis, {range: axis.range.slice()});
    }
    layout.autosize = true;
    return layout;
  }

  // ------------------------------------------------------------------ dense matrices as images

  function isImage(figure) {
    return !!(figure && figure.export && figure.export.draw === "image");
  }

  function overlayTrace(figure) {
    return (figure.data || []).find(function (t) { return t.type === "scatter" && t.fill === "toself"; });
  }

  function imageTraces(figure) {
    const heat = figure.data[0];
    const traces = [{
      // no points: the colour bar only (its scale and range are the heatmap's)
      type: "scatter", mode: "markers", x: [null], y: [null], hoverinfo: "skip", showlegend: false,
      marker: {color: [heat.zmin], colorscale: heat.colorscale, cmin: heat.zmin, cmax: heat.zmax,
        showscale: heat.showscale !== false, colorbar: heat.colorbar},
    }];
    const overlay = overlayTrace(figure);
    if (overlay && overlay.showlegend) {  // the legend's "masked" swatch; the cells are in the image
      traces.push(Object.assign({}, overlay, {x: [null], y: [null], hoverinfo: "skip"}));
    }
    return traces;
  }

  // 256 colours along a Plotly colorscale [[t, "#rrggbb"], ...], linear in RGB between stops as
  // Plotly's heatmap interpolates: [r, g, b] at 3k.
  const lutCache = new Map();
  function colourTable(scale) {
    const key = JSON.stringify(scale);
    if (lutCache.has(key)) return lutCache.get(key);
    const stops = scale.map(function (s) {
      const v = parseInt(s[1].slice(1), 16);
      return [s[0], (v >> 16) & 255, (v >> 8) & 255, v & 255];
    });
    const lut = new Uint8ClampedArray(256 * 3);
    for (let k = 0, s = 0; k < 256; k++) {
      const t = k / 255;
      while (s < stops.length - 2 && t > stops[s + 1][0]) s++;
      const a = stops[s], b = stops[s + 1];
      const f = b[0] > a[0] ? Math.min(1, Math.max(0, (t - a[0]) / (b[0] - a[0]))) : 0;
      for (let c = 1; c <= 3; c++) lut[3 * k + c - 1] = Math.round(a[c] + (b[c] - a[c]) * f);
    }
    lutCache.set(key, lut);
    return lut;
  }

  // Masked cells, row-major, from the overlay's rectangles (x0, x1, x1, x0, x0, break per run of
  // masked cells in a row, app/figures.py _mask_overlay).
  function maskedCells(figure, rows, cols) {
    const overlay = overlayTrace(figure);
    if (!overlay) return null;
    const out = new Uint8Array(rows * cols);
    for (let r = 0; r + 4 < overlay.x.length; r += 6) {
      const row = Math.round(overlay.y[r] + 0.5);
      const to = Math.min(cols, Math.round(overlay.x[r + 1] + 0.5));
      for (let j = Math.max(0, Math.round(overlay.x[r] + 0.5)); j < to; j++) out[row * cols + j] = 1;
    }
    return out;
  }

  const MASK_RGB = [[0xd9, 0xd9, 0xd9], [0x73, 0x73, 0x73]];  // app/figures.py MASK_FILL: paper, hatch
  const THUMB_MASK_RGB = [[0xee, 0xee, 0xee], [0xee, 0xee, 0xee]];  // a thumbnail's: plain and light

  // The figure's matrix as a bitmap, one pixel per cell; masked cells hatched grey (a darker cell
  // every 4th diagonal; in a thumbnail plain light grey, so the pattern is what shows). Kept per
  // matrix, so a redraw at another zoom only copies it.
  const bitmaps = new WeakMap();
  function matrixBitmap(figure, thumb) {
    const heat = figure.data[0];
    const z = heat.z;
    if (bitmaps.has(z)) return bitmaps.get(z);
    const rows = z.length, cols = z[0].length;
    const canvas = document.createElement("canvas");
    canvas.width = cols;
    canvas.height = rows;
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(cols, rows);
    // one 32-bit word per pixel (RGBA bytes in memory order: little-endian ABGR), from a table
    const px = new Uint32Array(image.data.buffer);
    const rgba = function (r, g, b) { return ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0; };
    const rgb = colourTable(heat.colorscale);
    const lut = new Uint32Array(256);
    for (let k = 0; k < 256; k++) lut[k] = rgba(rgb[3 * k], rgb[3 * k + 1], rgb[3 * k + 2]);
    const grey = (thumb ? THUMB_MASK_RGB : MASK_RGB).map(function (c) { return rgba(c[0], c[1], c[2]); });
    const lo = heat.zmin, scale = 255 / ((heat.zmax - heat.zmin) || 1);
    const masked = maskedCells(figure, rows, cols);
    for (let i = 0, o = 0; i < rows; i++) {
      const row = z[i];
      for (let j = 0; j < cols; j++, o++) {
        const v = row[j];
        if (v !== v || (masked !== null && masked[o])) {  // NaN: no value
          px[o] = grey[(i + j) % 4 === 0 ? 1 : 0];
        } else {
          const k = (v - lo) * scale;  // the nearest of 256 steps (round half up)
          px[o] = lut[k <= 0 ? 0 : k >= 255 ? 255 : (k + 0.5) | 0];
        }
      }
    }
    ctx.putImageData(image, 0, 0);
    bitmaps.set(z, canvas);
    return canvas;
  }

  // The visible window of the axes (zoomed or not) copied from the bitmap into a canvas that
  // lies exactly under Plotly's plot area: cells wider than a screen pixel as sharp blocks,
  // narrower ones smoothed (nearest-neighbour would drop whole rows and columns).
  function paintImage(el, figure) {
    const holder = PlotlyAdapter.plotContainer(el);
    if (!holder) return;
    let canvas = holder.querySelector(":scope > canvas.matrix-image");
    if (!canvas) {
      canvas = document.createElement("canvas");
      canvas.className = "matrix-image";
      canvas.setAttribute("aria-hidden", "true");
      holder.prepend(canvas);  // under the SVG layers
    }
    const ratio = window.devicePixelRatio || 1;
    const z = figure.data[0].z;
    const area = PlotlyAdapter.plotArea(el);
    const xr = PlotlyAdapter.axisRange(el, "x"), yr = PlotlyAdapter.axisRange(el, "y");
    const key = [area.left, area.top, area.width, area.height, ratio, xr.join(), yr.join()].join();
    if (canvas._painted === z && canvas._paintedAt === key) return;  // decorate runs after every plot event
    canvas._painted = z;
    canvas._paintedAt = key;
    canvas.style.left = area.left + "px";
    canvas.style.top = area.top + "px";
    canvas.style.width = area.width + "px";
    canvas.style.height = area.height + "px";
    canvas.width = Math.max(1, Math.round(area.width * ratio));
    canvas.height = Math.max(1, Math.round(area.height * ratio));
    const bitmap = matrixBitmap(figure, el.hasAttribute("data-static"));
    const x0 = Math.min(xr[0], xr[1]) + 0.5, x1 = Math.max(xr[0], xr[1]) + 0.5;
    const y0 = Math.min(yr[0], yr[1]) + 0.5, y1 = Math.max(yr[0], yr[1]) + 0.5;
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = canvas.width < (x1 - x0) || canvas.height < (y1 - y0);
    ctx.imageSmoothingQuality = "high";
    ctx.drawImage(bitmap, x0, y0, x1 - x0, y1 - y0, 0, 0, canvas.width, canvas.height);
  }

  // The cell under the pointer, from the axes' own pixel-to-data mapping; null outside the cells.
  function cellAt(el, evt) {
    const figure = el._explorerShown;
    if (!PlotlyAdapter.isDrawn(el) || !figure || !el._cells) return null;
    const area = PlotlyAdapter.plotArea(el);
    const box = el.getBoundingClientRect();
    const x = evt.clientX - box.left, y = evt.clientY - box.top;
    if (x < area.left || y < area.top || x > area.left + area.width || y > area.top + area.height) return null;
    const i = Math.round(PlotlyAdapter.pixelToData(el, "y", y)), j = Math.round(PlotlyAdapter.pixelToData(el, "x", x));
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
    if (!cell) {
      box.hidden = true;
      return;
    }
    box.textContent = cellWords(el, el._explorerShown, cell.i, cell.j);
    const bounds = el.getBoundingClientRect();
    const x = evt.clientX - bounds.left, y = evt.clientY - bounds.top;
    box.hidden = false;
    // beside the pointer, on the side with room
    box.style.left = (x > bounds.width / 2 ? x - box.offsetWidth - 12 : x + 12) + "px";
    box.style.top = Math.max(0, y - box.offsetHeight - 8) + "px";
  }

  function setupImage(el) {
    if (el._imageHandlers) return;
    el._imageHandlers = true;
    el.addEventListener("mousemove", function (evt) { if (isImage(el._explorerShown)) cellHover(evt); });
    el.addEventListener("mouseleave", function () { hoverBox(el).hidden = true; });
    // a click (not the end of a zoom drag) selects the cell under the pointer
    el.addEventListener("mousedown", function (evt) { el._downAt = [evt.clientX, evt.clientY]; });
    el.addEventListener("click", function (evt) {
      const down = el._downAt;
      if (!isImage(el._explorerShown) || !down || Math.abs(evt.clientX - down[0]) + Math.abs(evt.clientY - down[1]) > 4) return;
      const cell = cellAt(el, evt);
      if (cell) selectCell(el, cell.i, cell.j);
    });
  }

  // ------------------------------------------------------------------ zoom and its way back

  // A heatmap's initial window is the figure's own axis ranges; drag zooms (Plotly), and the
  // card's "Reset zoom" button shows while the window is smaller.
  function zoomButton(el) {
    const card = el.closest(".figure");
    return card && card.querySelector("[data-zoom-reset]");
  }

  function isZoomed(el) {
    const figure = el._explorerShown;
    if (!PlotlyAdapter.isDrawn(el) || !figure || !figure.layout || !figure.layout.xaxis || !figure.layout.xaxis.range) return false;
    const same = function (a, b) { return Math.abs(a[0] - b[0]) < 1e-6 && Math.abs(a[1] - b[1]) < 1e-6; };
    return !same(PlotlyAdapter.axisRange(el, "x"), figure.layout.xaxis.range) ||
      !same(PlotlyAdapter.axisRange(el, "y"), figure.layout.yaxis.range);
  }

  function syncZoomButton(el) {
    const button = zoomButton(el);
    if (button) button.hidden = !isZoomed(el);
  }

  function resetZoom(el) {
    const layout = el._explorerShown && el._explorerShown.layout;
    if (!layout || !PlotlyAdapter.isDrawn(el)) return Promise.resolve();
    return Plotly.relayout(el, {"xaxis.range": layout.xaxis.range.slice(), "yaxis.range": layout.yaxis.range.slice()});
  }

  // A zoom drag is not the first click of a double-click. Plotly counts a click train from the
  // drag's mousedown (its doubleClickDelay, 500 ms), so a cell clicked soon after a drag ended was
  // taken for a double-click and the zoom reset under it. When a drag ends (this capture listener
  // runs before Plotly's own mouseup handler), the next mousedown starts a new train; two real
  // clicks still make a double-click, which goes back as before.
  window.addEventListener("mouseup", function () {
    document.querySelectorAll("[data-figure]").forEach(function (el) {
      if (PlotlyAdapter.wasDragged(el)) PlotlyAdapter.startNewClickTrain(el);
    });
  }, true);

  document.addEventListener("click", function (evt) {
    const button = evt.target.closest && evt.target.closest("[data-zoom-reset]");
    if (!button) return;
    const el = button.closest(".figure").querySelector("[data-figure]");
    if (el) resetZoom(el).then(function () { el.focus(); });
  });

  // ------------------------------------------------------------------ token labels, written here

  // Axes named in a figure's export.label_px show their tick labels (the tokens) written by this
  // script into the band the server's margins keep for them: Plotly would measure each label's box
  // (a forced layout per label, most of a heatmap's time at 128 tokens). When cells are narrower
  // than a line of text, every k-th label is shown, so labels never overlap.
  function labelHtml(labels, cls, place) {
    let html = "";
    for (let k = 0; k < labels.length; k++) {
      const at = place(k);
      if (at !== null) html += '<span class="' + cls + '" data-index="' + k + '" style="' + at + '">' + labels[k] + "</span>";
    }
    return html;  // labels are escaped by the server (app/figures.py token_label): text only
  }

  function drawLabels(el, figure) {
    const bands = figure.export && figure.export.label_px;
    let layer = el.querySelector(":scope > .axis-labels");
    if (!bands || !PlotlyAdapter.isDrawn(el)) {
      if (layer) layer.remove();
      return;
    }
    if (!layer) {
      layer = document.createElement("div");
      layer.className = "axis-labels";
      layer.setAttribute("aria-hidden", "true");  // the figure's label and cell readout say it in words
      el.appendChild(layer);
    }
    const font = PlotlyAdapter.font(el);
    layer.style.fontFamily = font.family;
    layer.style.fontSize = font.size + "px";
    layer.style.color = font.color;
    const line = (font.size || 13) * 1.25;
    const area = PlotlyAdapter.plotArea(el);
    const at = function (letter, k) { return PlotlyAdapter.dataToPixel(el, letter, k); };
    // the cells in the window (all of them, or a zoomed part): a label names its cell's centre
    const inside = function (letter, k) {
      const range = PlotlyAdapter.axisRange(el, letter);
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
      const top = area.top + area.height + 4;
      html += labelHtml(labels, upright ? "x-label" : "x-label x-label-turned", function (k) {
        return k % step || !inside("x", k) ? null : "left:" + at("x", k) + "px;top:" + top + "px";
      });
    }
    layer.innerHTML = html;
  }

  const STATIC_CONFIG = {staticPlot: true, responsive: true, displayModeBar: false};

  function figureConfig(el, figure) {
    const name = (figure.export && figure.export.name) || "figure";
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
      toImageButtonOptions: {format: "png", filename: name, scale: 2},
    };
  }

  // ------------------------------------------------------------------ drawing

  // Draw `figure` (default: the element's own) into el; "explorer:drawn" fires once it is drawn.
  function draw(el, figure) {
    const json = figure ? null : el.getAttribute("data-figure");
    if (!figure) {
      el._explorerPending = false;
      if (PlotlyAdapter.isDrawn(el) && json === el._explorerDrawn) return Promise.resolve();  // nothing changed
      try {
        figure = readFigure(el);
      } catch (err) {
        showFigureError(el, "This figure's data could not be read.");
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

  // What this script adds to a drawn plot: its token labels, and the selected cell.
  function decorate(el) {
    const figure = el._explorerShown;
    if (!figure || !PlotlyAdapter.isDrawn(el)) return;
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
  function keepPlots(target) {
    target.querySelectorAll("[data-figure]").forEach(function (el) {
      if (!PlotlyAdapter.isDrawn(el)) return;
      const key = plotKey(el);
      el.replaceWith(document.createElement(el.tagName));
      if (key && !kept.has(key)) kept.set(key, el);
      else setTimeout(function () { Plotly.purge(el); }, 0);
    });
  }

  // `to` takes `from`'s attributes, and only those (tabindex and the like, added here, stay).
  const OWN_ATTRIBUTES = ["tabindex", "aria-roledescription"];
  function copyAttributes(from, to) {
    for (const attr of Array.from(to.attributes)) {
      if (!from.hasAttribute(attr.name) && OWN_ATTRIBUTES.indexOf(attr.name) < 0) to.removeAttribute(attr.name);
    }
    for (const attr of Array.from(from.attributes)) {
      if (to.getAttribute(attr.name) !== attr.value) to.setAttribute(attr.name, attr.value);
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

  function drawAll(root) {
    const found = [];
    if (root.matches && root.matches("[data-figure]")) found.push(root);
    if (root.querySelectorAll) found.push(...root.querySelectorAll("[data-figure]"));
    const later = [];
    found.map(reusePlot).forEach(function (el) {
      if (PlotlyAdapter.isDrawn(el)) syncZoomButton(el);  // a morph resets the button to the template's (hidden)
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

  // ------------------------------------------------------------------ a head picked: its pattern at once

  // The selected head's weights heatmap shows a newly picked head's pattern from the head's
  // thumbnail (the same numbers, app/routers/explorer.py) while the server prepares the rest.
  document.addEventListener("change", function (evt) {
    const input = evt.target;
    if (!input.matches || !input.matches("input[type=radio][name=head]")) return;
    const thumb = document.querySelector("[data-plot-key='thumb-" + input.value + "']");
    const weights = document.querySelector("#stage-weights [data-figure]");
    if (!thumb || !weights || !PlotlyAdapter.isDrawn(weights)) return;
    const figure = Object.assign({}, readFigure(weights));
    const z = readFigure(thumb).data[0].z;
    if (z.length !== figure.data[0].z.length) return;  // a pooled thumbnail (long inputs): wait for the server
    figure.data = figure.data.map(function (trace, i) { return i === 0 ? Object.assign({}, trace, {z: z}) : trace; });
    draw(weights, figure);
  });

  // ------------------------------------------------------------------ the selected cell, in words

  // A heatmap with hover text can be focused; arrow keys (Home/End, PageUp/PageDown for the first
  // and last row) move its selected cell, a click selects the cell under the pointer, and the
  // figure's live region says which cell it is and its value.
  function cellWords(el, figure, i, j) {
    const trace = figure.data[0];
    const layout = figure.layout || {};
    const text = fillCell(cellParts(figure.export.cell_text), i, layout.yaxis.ticktext[i], j, layout.xaxis.ticktext[j]);
    const value = trace.z[i][j];
    const name = figure.export.value || "value";
    const label = document.createElement("span");
    label.innerHTML = text;  // the labels are escaped by the server (app/figures.py): decode entities only
    return label.textContent + ": " + name + " " + (Number.isNaN(value) ? "masked (no value)" : value.toFixed(2));
  }

  function setupCells(el, figure) {
    const pattern = figure.export && figure.export.cell_text;
    const trace = (figure.data || [])[0];
    if (!pattern || !trace || trace.type !== "heatmap" || !trace.z || !trace.z.length) return;
    el._cells = {rows: trace.z.length, cols: trace.z[0].length};
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
    if (!sel || !PlotlyAdapter.isDrawn(el)) return;
    const area = PlotlyAdapter.plotArea(el);
    const at = function (letter, k) { return PlotlyAdapter.dataToPixel(el, letter, k); };
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
    liveRegion(el).textContent = cellWords(el, el._explorerShown, sel.i, sel.j) + rowPeak(el._explorerShown, sel.i);
  }

  // Where the selected query looks most: its row's largest value and key (in a long text, the
  // cell a reader would otherwise hunt for).
  function rowPeak(figure, i) {
    const row = figure.data[0].z[i];
    let best = -1;
    for (let j = 0; j < row.length; j++) if (!Number.isNaN(row[j]) && (best < 0 || row[j] > row[best])) best = j;
    if (best < 0) return "";
    const label = document.createElement("span");
    label.innerHTML = figure.layout.xaxis.ticktext[best];  // escaped by the server: entities only
    return " · this row's largest " + (figure.export.value || "value") + ": key " + best + " " + label.textContent +
      " (" + row[best].toFixed(2) + ")";
  }

  function selectCell(el, i, j) {
    if (!el._cells) return;
    el._selected = {i: Math.max(0, Math.min(el._cells.rows - 1, i)), j: Math.max(0, Math.min(el._cells.cols - 1, j))};
    showSelected(el);
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

  // ------------------------------------------------------------------ downloads

  function csvCell(value) {
    if (value === null || value === undefined) return "";
    const s = String(value);
    return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }

  // The data behind a figure, with the raw (unescaped) labels the server put in `export`.
  function exportTable(figure) {
    const ex = figure.export || {};
    const trace = (figure.data || [])[0] || {};
    if (ex.kind === "matrix") {
      return {
        name: ex.name, x_title: ex.x_title, y_title: ex.y_title, value: ex.value,
        x: ex.x, y: ex.y, values: plainRows(trace.z),
      };
    }
    if (ex.kind === "bars") {
      return {name: ex.name, x_title: ex.x_title, value: ex.value, x: ex.x, values: trace.x};
    }
    if (ex.kind === "series") {  // line charts: one (name, x, y) per line
      return {name: ex.name, x_title: ex.x_title, y_title: ex.y_title, series: ex.series};
    }
    return {name: ex.name || "figure", data: figure.data};
  }

  function toCsv(table) {
    const rows = [];
    if (table.y) {
      rows.push([table.y_title + " \\ " + table.x_title].concat(table.x));
      table.values.forEach(function (row, i) { rows.push([table.y[i]].concat(row)); });
    } else if (table.x) {
      rows.push([table.x_title, table.value]);
      table.x.forEach(function (label, i) { rows.push([label, table.values[i]]); });
    } else if (table.series) {
      // long format, one row per point: what a spreadsheet or pandas pivots or plots directly
      rows.push(["series", table.x_title, table.y_title]);
      table.series.forEach(function (s) {
        s.x.forEach(function (x, i) { rows.push([s.name, x, s.y[i]]); });
      });
    } else {
      rows.push(["data"], [JSON.stringify(table.data)]);
    }
    return rows.map(function (r) { return r.map(csvCell).join(","); }).join("\r\n") + "\r\n";
  }

  function save(filename, type, text) {
    const url = URL.createObjectURL(new Blob([text], {type: type}));
    const a = document.createElement("a");
    a.href = url;
    a.download = filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
  }

  document.addEventListener("click", function (evt) {
    const button = evt.target.closest("[data-download]");
    if (!button) return;
    const card = button.closest(".figure");
    const el = card && card.querySelector("[data-figure]");
    if (!el) return;
    evt.preventDefault();
    const table = exportTable(readFigure(el));
    if (button.getAttribute("data-download") === "csv") {
      save(table.name + ".csv", "text/csv", toCsv(table));
    } else {
      save(table.name + ".json", "application/json", JSON.stringify(table, null, 1));
    }
  });

  // ------------------------------------------------------------------ classroom size

  function syncClassroom() {
    const box = document.querySelector("input[name=classroom][type=checkbox]");
    if (!box) return;
    if (box.checked !== isClassroom()) {
      document.body.classList.toggle("classroom", box.checked);
      document.querySelectorAll("[data-figure]").forEach(function (el) {
        el._explorerDrawn = null;  // the same data at another size
        draw(el);
      });
    }
  }

  // The size is part of the view, so the current URL says it too (a shared link keeps it);
  // later requests carry it with the form (the checkbox belongs to it via form="...").
  function rememberClassroom(on) {
    const url = new URL(location.href);
    if (on) url.searchParams.set("classroom", "1");
    else url.searchParams.delete("classroom");
    history.replaceState(Object.assign({}, history.state, {htmx: true}), "", url.pathname + url.search);
  }

  document.addEventListener("change", function (evt) {
    if (evt.target.matches("input[name=classroom]")) {
      syncClassroom();
      rememberClassroom(evt.target.checked);
    }
  });

  // ------------------------------------------------------------------ errors htmx could not swap

  function messageFor(xhr) {
    if (!xhr || xhr.status === 0) return "The server could not be reached. Is it still running?";
    if (xhr.status === 503) return "The server is busy with other requests; change a setting again in a moment.";
    return "The server answered " + xhr.status + " " + (xhr.statusText || "") + ". Try another setting.";
  }

  function showRequestError(evt) {
    const target = (evt.detail && evt.detail.target) || document.getElementById("results");
    if (!target) return;
    let box = target.querySelector(":scope > .request-error");
    if (!box) {
      box = document.createElement("p");
      box.className = "error request-error";
      box.setAttribute("role", "alert");
      target.prepend(box);
    }
    box.textContent = messageFor(evt.detail && evt.detail.xhr);
  }

  document.addEventListener("htmx:responseError", showRequestError);
  document.addEventListener("htmx:sendError", showRequestError);

  // ------------------------------------------------------------------ the latest setting wins
  //
  // Forms sync with hx-sync="...:queue last": a change made while a request is in flight waits
  // for it, then is sent with the values the controls have *then*. Swapping the in-flight
  // (already stale) answer first would reset the radios inside the results (layer, head) and so
  // lose a click made meanwhile; so an answer is swapped only if no request was triggered after
  // it. (hx-sync "replace" would abort instead, which htmx logs as a console error; the server
  // would finish the aborted computation all the same.)

  let triggered = 0;
  document.addEventListener("htmx:confirm", function () { triggered += 1; });
  document.addEventListener("htmx:beforeRequest", function (evt) {
    if (evt.detail.xhr) evt.detail.xhr._explorerSeq = triggered;
  });
  document.addEventListener("htmx:beforeSwap", function (evt) {
    const xhr = evt.detail.xhr;
    if (xhr && xhr._explorerSeq !== undefined && xhr._explorerSeq < triggered && !evt.detail.isError) {
      evt.detail.shouldSwap = false;
    }
    const source = evt.detail.requestConfig && evt.detail.requestConfig.elt;
    const swap = source && source.closest && source.closest("[hx-swap]");
    const morph = swap && swap.getAttribute("hx-swap").startsWith("morph");
    if (evt.detail.shouldSwap && evt.detail.target && !morph) keepPlots(evt.detail.target);
  });

  // A morphing swap (idiomorph, hx-swap="morph") keeps every element that is still there: a drawn
  // plot takes its successor's attributes (its new figure data) and keeps its drawing, which
  // drawAll then updates; its own children (Plotly's SVG, the labels) are not touched.
  if (window.Idiomorph) {
    Idiomorph.defaults.callbacks.beforeNodeMorphed = function (old, next) {
      // A long list (a long text's token chips, data-morph-whole) is taken whole when it changed:
      // idiomorph matching a thousand unlabelled siblings one by one takes ~0.5 s.
      if (old.nodeType === 1 && next.nodeType === 1 && old.hasAttribute("data-morph-whole")) {
        if (!old.isEqualNode(next)) {
          copyAttributes(next, old);
          old.replaceChildren(...next.childNodes);
        }
        return false;
      }
      if (old.nodeType !== 1 || !old.hasAttribute("data-figure") || !PlotlyAdapter.isDrawn(old)) return true;
      if (next.nodeType !== 1 || !next.hasAttribute("data-figure")) return true;
      copyAttributes(next, old);
      old._explorerFigure = null;
      return false;
    };
  }

  // Text and number boxes send their own request on input; the "change" they fire on blur would
  // send the same values again through the form, so it stops here.
  document.addEventListener("change", function (evt) {
    const t = evt.target;
    if (t.matches && t.matches("textarea[hx-trigger], input[type=number][hx-trigger]")) evt.stopPropagation();
  }, true);

  // ------------------------------------------------------------------ typing: first key at once, then paced

  // A text box with `data-debounce-ms` is sent (its "explorer:edit" event, which its hx-trigger
  // names) at once when a key follows a pause of that long, and otherwise that long after the
  // last key: one request per pause in typing, and no wait for the first key after reading.
  document.addEventListener("input", function (evt) {
    const box = evt.target;
    if (!box.hasAttribute || !box.hasAttribute("data-debounce-ms")) return;
    const wait = Number(box.getAttribute("data-debounce-ms")) || 0;
    const now = performance.now();
    clearTimeout(box._explorerTimer);
    const send = function () {
      box._explorerTimer = null;
      box._explorerLastSend = performance.now();
      if (box.value === box._explorerSent) return;  // e.g. a letter typed and deleted
      box._explorerSent = box.value;
      htmx.trigger(box, "explorer:edit");
    };
    if (!box._explorerTimer && now - (box._explorerLastSend || -Infinity) >= wait) send();
    else box._explorerTimer = setTimeout(send, wait);
  });

  // ------------------------------------------------------------------ htmx lifecycle

  function start() {
    document.querySelectorAll("[data-debounce-ms]").forEach(function (box) { box._explorerSent = box.value; });
    htmx.onLoad(function (root) {
      syncClassroom();
      drawAll(root);
    });
    document.addEventListener("htmx:beforeCleanupElement", function (evt) {
      const el = evt.target;
      if (!el.hasAttribute || !el.hasAttribute("data-figure")) return;
      if (PlotlyAdapter.isDrawn(el)) Plotly.purge(el);
    });
    // printing (or saving as PDF) shows the whole page at once: draw whatever is still waiting
    window.addEventListener("beforeprint", function () {
      document.querySelectorAll("[data-figure]").forEach(function (el) { if (el._explorerPending) draw(el); });
    });
  }

  if (window.htmx && window.Plotly) {
    start();
  } else {
    document.addEventListener("DOMContentLoaded", start);
  }
})();
