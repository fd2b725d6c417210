// Downloads: buttons with `data-download="json"|"csv"` inside a `.figure` card download the data
// behind that card's figure, with the raw (unescaped) labels the server put in its `export`;
// PNG export is Plotly's own modebar button. A painted matrix that came as colour levels is
// downloaded with its exact values, read from the server when the button is pressed
// (explorer-values.js): every bit the API gives, never the drawing's levels.
import {readFigure} from "./explorer-figures.js";
import {isRead, allRows} from "./explorer-values.js";
import {csvCell, saveFile} from "./save-file.js";

// A heatmap's rows as plain arrays, NaN (no value: masked) as null: what downloads hold.
function plainRows(z) {
  return Array.from(z || [], function (row) {
    return Array.from(row, function (v) { return Number.isNaN(v) ? null : v; });
  });
}

// The data behind a figure, with the raw (unescaped) labels the server put in `export`.
async function exportTable(el, figure) {
  const ex = figure.export || {};
  const trace = (figure.data || [])[0] || {};
  if (ex.kind === "matrix") {
    return {
      name: ex.name, x_title: ex.x_title, y_title: ex.y_title, value: ex.value,
      x: ex.x, y: ex.y, values: plainRows(isRead(figure) ? await allRows(el, figure) : trace.z),
    };
  }
  if (ex.kind === "bars") {
    // a bar's value is along x when the bars lie down (orientation "h"), else along y
    return {name: ex.name, x_title: ex.x_title, value: ex.value, x: ex.x, values: trace.orientation === "h" ? trace.x : trace.y};
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

document.addEventListener("click", function (evt) {
  const button = evt.target.closest("[data-download]");
  if (!button) return;
  const card = button.closest(".figure");
  const el = card && card.querySelector("[data-figure]");
  if (!el) return;
  evt.preventDefault();
  const csv = button.getAttribute("data-download") === "csv";
  button.setAttribute("aria-busy", "true");
  exportTable(el, readFigure(el)).then(function (table) {
    if (csv) saveFile(table.name + ".csv", "text/csv", toCsv(table));
    else saveFile(table.name + ".json", "application/json", JSON.stringify(table, null, 1));
  }, function (err) {
    console.warn("download: the figure's values could not be read (" + err.message + ")");
  }).finally(function () { button.removeAttribute("aria-busy"); });
});
