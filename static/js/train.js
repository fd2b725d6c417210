// The training page's live parts (templates/train.html). The figures come from the server and are drawn
// by explorer.js; the run's block re-renders itself on every record of the run it follows (the htmx SSE
// extension, hx-trigger="sse:record"). This script does what needs no server:
// - on every `progress` event (several a second), the step, loss, status and progress bar of that run;
// - the sae recipe's architecture: only the chosen architecture's settings are shown and sent (the server drops
//   the others' too, so the form works without this script);
// - the step slider and Play: the chosen head's pattern at every snapshot step is already in the page
//   (data-history), so scrubbing swaps the heatmap's values at once, and the step goes into the URL.
import {say, words} from "./words.js";

const PLAY_MS = 400;  // one snapshot step per tick

document.body.addEventListener("htmx:sseMessage", function (evt) {
  if (!evt.detail || evt.detail.type !== "progress") return;
  const p = JSON.parse(evt.detail.data);
  const line = document.querySelector('[data-run-status="' + p.id + '"]');
  if (!line) return;
  line.querySelector('[data-field="step"]').textContent = p.step;
  line.querySelector('[data-field="status"]').textContent = (words("train").status || {})[p.status] || p.status;
  if (p.loss !== null && p.loss !== undefined) {
    line.querySelector('[data-field="loss"]').textContent = Number(p.loss).toFixed(3);
  }
  const bar = line.querySelector("progress");
  if (bar) bar.value = p.step;
});

let timer = null;

function showStep(slider) {
  const steps = JSON.parse(slider.dataset.steps);
  const index = Number(slider.value);
  const plot = document.querySelector("#train-pattern [data-history]");
  if (!plot) return;
  // the pattern at every snapshot step, [step][query][key]
  const patterns = plot._patterns || (plot._patterns = JSON.parse(plot.dataset.history));
  const out = document.getElementById("pattern-step");
  if (out) out.textContent = steps[index];
  slider.setAttribute("aria-valuetext", say("train", "step", {step: steps[index]}));
  if (window.Plotly && plot.data) Plotly.restyle(plot, {z: [patterns[index]]}, [0]);
  const url = new URL(location.href);
  url.searchParams.set("step", steps[index]);
  history.replaceState(history.state, "", url);
}

function stopPlaying(button) {
  if (timer) clearInterval(timer);
  timer = null;
  if (button) { button.textContent = say("train", "play"); button.setAttribute("aria-pressed", "false"); }
}

document.body.addEventListener("input", function (evt) {
  if (evt.target.id === "step-slider") showStep(evt.target);
});

document.body.addEventListener("click", function (evt) {
  const button = evt.target.closest("#play");
  if (!button) return;
  const slider = document.getElementById("step-slider");
  if (timer) { stopPlaying(button); return; }
  if (Number(slider.value) >= Number(slider.max)) slider.value = 0;
  button.textContent = say("train", "pause");
  button.setAttribute("aria-pressed", "true");
  showStep(slider);
  timer = setInterval(function () {
    const current = document.getElementById("step-slider");
    if (!current || Number(current.value) >= Number(current.max)) { stopPlaying(document.getElementById("play")); return; }
    current.value = Number(current.value) + 1;
    showStep(current);
  }, PLAY_MS);
});

// A new record re-renders the run's block: a slider that was playing stops.
document.body.addEventListener("htmx:beforeSwap", function (evt) {
  if (evt.detail.target && evt.detail.target.id === "run-results") stopPlaying(null);
});

function showArchitecture(select) {
  document.querySelectorAll("#train [data-architecture]").forEach(function (field) {
    const mine = field.dataset.architecture === select.value;
    field.hidden = !mine;
    field.querySelectorAll("input").forEach(function (input) { input.disabled = !mine; });
  });
}

const architecture = document.getElementById("train-architecture");
if (architecture) {
  showArchitecture(architecture);
  architecture.addEventListener("change", function () { showArchitecture(architecture); });
}
