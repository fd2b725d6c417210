// The attribution page (templates/attribution.html): the scores' downloads (CSV and JSON, from the numbers the
// server put in the results' data-attribution: the API's), and the arrow keys along the shaded tokens (← → move
// between tokens, Home and End to the first and last; Enter explains the prediction after one, as a click does).

import {csvCell, saveFile} from "./save-file.js";

function attributionData() {
  const box = document.getElementById("attribution-results");
  const raw = box && box.getAttribute("data-attribution");
  return raw ? JSON.parse(raw) : null;
}

// One row per token: its position, text, id and score.
export function scoresCsv(data) {
  const lines = [["position", "token", "token_id", "score"].join(",")];
  data.tokens.forEach(function (t, i) {
    lines.push([i, t, data.token_ids[i], data.scores[i]].map(csvCell).join(","));
  });
  return lines.join("\n") + "\n";
}

document.addEventListener("click", function (evt) {
  const button = evt.target.closest && evt.target.closest("#attribution-download-csv, #attribution-download-json");
  const data = button && attributionData();
  if (!data) return;
  const file = "attribution-" + data.method;
  if (button.id === "attribution-download-csv") saveFile(file + ".csv", "text/csv", scoresCsv(data));
  else saveFile(file + ".json", "application/json", JSON.stringify(data, null, 1));
});

document.addEventListener("keydown", function (evt) {
  const link = evt.target.closest && evt.target.closest("#attribution-text a.tok");
  if (!link) return;
  const all = Array.from(document.querySelectorAll("#attribution-text a.tok"));
  const at = all.indexOf(link);
  const to = {ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: all.length - 1}[evt.key];
  if (to === undefined || !all[to]) return;
  evt.preventDefault();
  all[to].focus();
});
