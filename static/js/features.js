// The features page (templates/features.html): the heatmap's downloads (CSV and JSON, from the numbers the
// server put in the results' data-heatmap: the API's activations), and the arrow keys along the token links
// (← → move between tokens, Home and End to the first and last; Enter opens one, as a click does).

import {csvCell, saveFile} from "./save-file.js";

function heatmapData() {
  const box = document.getElementById("features-results");
  const raw = box && box.getAttribute("data-heatmap");
  return raw ? JSON.parse(raw) : null;
}

// One row per feature, one column per token: the activation (0 where the feature is off).
export function heatmapCsv(data) {
  const lines = [["feature", "label"].concat(data.tokens).map(csvCell).join(",")];
  data.features.forEach(function (f, i) {
    lines.push([f, data.labels[i] || ""].concat(data.values[i]).map(csvCell).join(","));
  });
  return lines.join("\n") + "\n";
}

document.addEventListener("click", function (evt) {
  const button = evt.target.closest && evt.target.closest("#features-download-csv, #features-download-json");
  const data = button && heatmapData();
  if (!data) return;
  if (button.id === "features-download-csv") saveFile("features-heatmap.csv", "text/csv", heatmapCsv(data));
  else saveFile("features-heatmap.json", "application/json", JSON.stringify(data, null, 1));
});

document.addEventListener("keydown", function (evt) {
  const link = evt.target.closest && evt.target.closest("#features-heatmap a.tok");
  if (!link) return;
  const all = Array.from(document.querySelectorAll("#features-heatmap a.tok"));
  const at = all.indexOf(link);
  const to = {ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: all.length - 1}[evt.key];
  if (to === undefined || !all[to]) return;
  evt.preventDefault();
  all[to].focus();
});
