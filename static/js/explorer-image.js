// Long inputs: an attention matrix the server marks export.draw = "image" (64 tokens or more,
// app/pages/figures.py) is painted as an image, one pixel per cell, into a canvas that lies under
// Plotly's (see-through) SVG, exactly over its plot area; Plotly draws the axes and colour bar.
// On the explorer such a matrix comes as its colour levels (a byte a cell); elsewhere as its values.
import * as P from "./plotly-adapter.js";

function rgb(hex) {  // "#rrggbb" -> [r, g, b]
  const v = parseInt(hex.slice(1), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
}

// 256 colours along a Plotly colorscale [[t, "#rrggbb"], ...], linear in RGB between stops as
// Plotly's heatmap interpolates: [r, g, b] at 3k.
const lutCache = new Map();
function colourTable(scale) {
  const key = JSON.stringify(scale);
  if (lutCache.has(key)) return lutCache.get(key);
  const stops = scale.map(function (s) { return [s[0]].concat(rgb(s[1])); });
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

// The masked cells, row-major, from the figure's export.mask (app/pages/figures.py): its "runs",
// [query row, first masked key, the key after the last] per run of masked keys in a row (a
// causal mask is one run a row, a sliding window at most two). null: nothing is masked.
function maskedCells(mask, rows, cols) {
  if (!mask || !mask.runs) return null;
  const out = new Uint8Array(rows * cols);
  for (const run of mask.runs) {
    const i = run[0], from = Math.max(0, run[1]), to = Math.min(cols, run[2]);
    if (i >= 0 && i < rows && from < to) out.fill(1, i * cols + from, i * cols + to);
  }
  return out;
}

const THUMB_MASK = "#eeeeee";  // a thumbnail's masked cells: plain and light, so the pattern shows

// The figure's matrix as a bitmap, one pixel per cell: from its colour levels (export.levels, one
// byte for each cell that is neither masked nor a gap, row-major: app/pages/figures.py `_levels`),
// else from its values (z), level k = the nearest of the table's 256 steps. Masked cells (and cells
// with no value) are hatched in the mask's colours, export.mask's bgcolor with an fgcolor cell every
// 4th diagonal (app/pages/figures.py MASK_FILL); in a thumbnail plain light grey. Without mask data
// a cell with no value is a gap, as Plotly draws it. Kept per matrix, so a redraw at another zoom
// only copies it.
const bitmaps = new WeakMap();
function matrixBitmap(figure, thumb) {
  const heat = figure.data[0];
  const ex = figure.export || {};
  const levels = ex.levels;
  const z = heat.z;
  const source = levels || z;
  if (bitmaps.has(source)) return bitmaps.get(source);
  const rows = levels ? ex.shape[0] : z.length, cols = levels ? ex.shape[1] : z[0].length;
  const canvas = document.createElement("canvas");
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(cols, rows);
  // one 32-bit word per pixel (RGBA bytes in memory order: little-endian ABGR), from a table
  const px = new Uint32Array(image.data.buffer);
  const rgba = function (r, g, b) { return ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0; };
  const table = colourTable(heat.colorscale);
  const lut = new Uint32Array(256);
  for (let k = 0; k < 256; k++) lut[k] = rgba(table[3 * k], table[3 * k + 1], table[3 * k + 2]);
  const mask = ex.mask;
  const hatch = !mask ? [0, 0] : (thumb ? [THUMB_MASK, THUMB_MASK] : [mask.bgcolor, mask.fgcolor])
    .map(function (hex) { return rgba.apply(null, rgb(hex)); });  // [paper, hatch]; 0: see-through
  const masked = maskedCells(mask, rows, cols);
  if (levels) {
    const gaps = maskedCells(ex.gaps && {runs: ex.gaps}, rows, cols);
    for (let o = 0, k = 0, i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++, o++) {
        if ((masked !== null && masked[o]) || (gaps !== null && gaps[o])) px[o] = hatch[(i + j) % 4 === 0 ? 1 : 0];
        else px[o] = lut[levels[k++]];
      }
    }
  } else {
    const lo = heat.zmin, scale = 255 / ((heat.zmax - heat.zmin) || 1);
    for (let i = 0, o = 0; i < rows; i++) {
      const row = z[i];
      for (let j = 0; j < cols; j++, o++) {
        const v = row[j];
        if (v !== v || (masked !== null && masked[o])) {  // NaN: no value
          px[o] = hatch[(i + j) % 4 === 0 ? 1 : 0];
        } else {
          const k = (v - lo) * scale;  // the nearest of 256 steps (round half up)
          px[o] = lut[k <= 0 ? 0 : k >= 255 ? 255 : (k + 0.5) | 0];
        }
      }
    }
  }
  ctx.putImageData(image, 0, 0);
  bitmaps.set(source, canvas);
  return canvas;
}

// The visible window of the axes (zoomed or not) copied from the bitmap into a canvas that
// lies exactly under Plotly's plot area: cells wider than a screen pixel as sharp blocks,
// narrower ones smoothed (nearest-neighbour would drop whole rows and columns).
export function paintImage(el, figure) {
  const holder = P.plotContainer(el);
  if (!holder) return;
  let canvas = holder.querySelector(":scope > canvas.matrix-image");
  if (!canvas) {
    canvas = document.createElement("canvas");
    canvas.className = "matrix-image";
    canvas.setAttribute("aria-hidden", "true");
    holder.prepend(canvas);  // under the SVG layers
  }
  const ratio = window.devicePixelRatio || 1;
  const z = figure.export.levels || figure.data[0].z;  // what is painted (levels, or values)
  const area = P.plotArea(el);
  const xr = P.axisRange(el, "x"), yr = P.axisRange(el, "y");
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
