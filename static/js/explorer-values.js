// A painted matrix's exact values, read from the server when a reader reads them. From 64 tokens
// the explorer sends a painted matrix as its colour levels only, a byte a cell (app/pages/figures.py
// `_levels`): enough to paint it, not to read it. Its export names it ("read": "stage-weights"), and
// the results hold the view's URL (`data-values`); that URL with `values=<read>&rows=<from>-<to>`
// answers those rows as float64 (the API's numbers, every bit: app/pages/explorer.py
// `explorer_values`). Rows come in blocks of about 64 KB, once per figure data; whoever waits for
// them hears "explorer:values" on the plot when they have come. A head's levels (a click on its
// thumbnail, when the thumbnail is pooled) come the same way, with `levels=head-<h>`.

const BLOCK_BYTES = 64 * 1024;

const known = new WeakMap();  // figure -> {rows: Map(row -> Float64Array), asked: Set(block), failed}

function store(figure) {
  let s = known.get(figure);
  if (!s) known.set(figure, s = {rows: new Map(), asked: new Set(), failed: null});
  return s;
}

// The URL of the view el shows, with `params` set; null when the page names none.
function viewUrl(el, params) {
  const holder = el.closest("[data-values]");
  if (!holder) return null;
  const url = new URL(holder.getAttribute("data-values"), location.href);
  for (const key in params) url.searchParams.set(key, params[key]);
  return url.pathname + url.search;
}

// Does this figure's data travel as levels, its values read from the server?
export function isRead(figure) {
  return !!(figure && figure.export && figure.export.levels && !figure.data[0].z);
}

async function fetchBytes(url) {
  const r = await fetch(url, {headers: {"Accept": "application/octet-stream"}});
  if (!r.ok) {
    const error = new Error(r.status === 503 ? "busy" : (await r.text()) || String(r.status));
    error.status = r.status;
    throw error;
  }
  return r.arrayBuffer();
}

function rowsOf(figure, from, to) {
  const s = store(figure);
  const out = [];
  for (let i = from; i < to; i++) out.push(s.rows.get(i));
  return out;
}

async function fetchRows(el, figure, from, to) {
  const cols = figure.export.shape[1];
  const url = viewUrl(el, {values: figure.export.read, rows: from + "-" + to});
  if (!url || !figure.export.read) throw new Error("this figure's values cannot be read yet");
  const values = new Float64Array(await fetchBytes(url));
  const s = store(figure);
  for (let i = from; i < to; i++) s.rows.set(i, values.subarray((i - from) * cols, (i - from + 1) * cols));
}

// Row i's values (a Float64Array, NaN where a score is masked), or null while they are on their way
// (asked for here; "explorer:values" fires on el when they come). undefined: they cannot be read.
export function knownRow(el, figure, i) {
  const s = store(figure);
  if (s.rows.has(i)) return s.rows.get(i);
  if (s.failed) return undefined;
  if (!figure.export.read) return null;  // drawn ahead of the server's answer, which will say where
  const block = Math.max(1, Math.floor(BLOCK_BYTES / (8 * figure.export.shape[1])));
  const first = i - (i % block);
  if (!s.asked.has(first)) {
    s.asked.add(first);
    fetchRows(el, figure, first, Math.min(figure.export.shape[0], first + block))
      .catch(function (err) {
        if (err.status === 503) s.asked.delete(first);  // busy: asked again at the next read
        else s.failed = err.message;
      })
      .then(function () { el.dispatchEvent(new CustomEvent("explorer:values", {bubbles: true})); });
  }
  return null;
}

// Every row's values, for a download: [Float64Array per row].
export async function allRows(el, figure) {
  const rows = figure.export.shape[0];
  const s = store(figure);
  if (s.rows.size < rows) await fetchRows(el, figure, 0, rows);
  return rowsOf(figure, 0, rows);
}

// The colour levels of head h of the view's layer (as its weights figure would carry them).
export async function headLevels(el, h) {
  const url = viewUrl(el, {levels: "head-" + h});
  if (!url) throw new Error("no view to read from");
  return new Uint8Array(await fetchBytes(url));
}
