// The writing page (templates/generate.html). The server renders the form and a results block holding
// the request (data-request: the body of POST /api/v1/generate). This script posts it asking for
// Server-Sent Events (fetch, so it can POST and Stop can abort it) and draws each event as it arrives:
//   start   the prompt's tokens            step   one new token (the API's steps[i])   end   why it ended
// New tokens appear at most every data-pace-ms, so a fast model's text can still be read as it grows;
// Stop aborts the stream (the server then computes no further token) and keeps what is shown.
// A click on a token (or ← → Home End among them) shows how it was chosen: its distribution before and
// after each setting, one head's attention row over the text, and every head's row as small multiples,
// sink heads marked. The token, layer and head shown go into the URL (step, layer, head).
import {say as pageSay} from "./words.js";
import {saveFile} from "./save-file.js";
import "./steer-rows.js";

let run = null;  // the generation on the page: {box, controller, start, steps, shown, end, ...}

// ------------------------------------------------------------------ small helpers

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

const fmt = (p) => (p >= 0.001 || p === 0 ? p.toFixed(3) : p.toExponential(1));

// The words this script writes, in the page's language (app/pages/generate.py script_words: the page's
// data-generate-words, read by words.js), with their {name} placeholders filled in; `n` picks a message's
// form for one or many.
const say = (key, vars, n) => pageSay("generate", key, vars, n);
// A token as the explorer labels it (app/pages/figures.py visible): whitespace as ␣ ↵ ⇥ ␍, the empty
// token as ∅, from the table the page carries (data-token-symbols). The text itself keeps its spaces.
let SYMBOLS = null;
function visible(token) {
  if (SYMBOLS === null) {
    const holder = document.querySelector(".generate-page[data-token-symbols]");
    SYMBOLS = holder ? JSON.parse(holder.dataset.tokenSymbols) : {whitespace: {}, empty: ""};
  }
  return Array.from(token, (c) => SYMBOLS.whitespace[c] || c).join("") || SYMBOLS.empty;
}

// a step of the distribution's pipeline (the API's stage names; top-k and top-p are said as they are)
const stageLabel = (stage) => (stage === "top_k" ? "top-k" : stage === "top_p" ? "top-p" : say("stage_" + stage));

function setUrl(params) {
  const url = new URL(location.href);
  for (const [k, v] of Object.entries(params)) {
    if (v === null || v === undefined) url.searchParams.delete(k);
    else url.searchParams.set(k, v);
  }
  history.replaceState(Object.assign({}, history.state, {htmx: true}), "", url.pathname + url.search);
}

function showStatus(text) {
  const s = document.getElementById("gen-status");
  if (s) s.textContent = text;
}

function stopButton(enabled) {
  const b = document.getElementById("gen-stop-button");
  if (b) b.disabled = !enabled;
}

function headLabel(layer, head) {
  const s = run.start;
  const kv = s.config.n_key_value_heads !== s.config.n_heads ? " · KV " + s.kv_heads[head] : "";
  return "L" + layer + "H" + head + kv;
}

// ------------------------------------------------------------------ the stream

function parseEvent(block) {
  let kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) kind = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  return data.length ? {name: kind, data: JSON.parse(data.join("\n"))} : null;
}

function fail(message) {
  if (!run) return;
  const box = run.box;
  finishRun();
  box.replaceChildren();
  const panel = el("div", {class: "error-panel", role: "alert", id: "gen-error"});
  panel.append(el("h2", {id: "gen-text-title"}, say("cannot")), el("p", {class: "error"}, message));
  box.append(panel);
}

async function start(box) {
  abort();
  const controller = new AbortController();
  run = {box: box, controller: controller, start: null, steps: [], shown: 0, end: null, stopped: false,
         pace: Number(box.dataset.paceMs) || 0, timer: null, lastShown: 0, selected: null,
         layer: Number(box.dataset.layer) || 0, head: Number(box.dataset.head) || 0,
         wanted: box.dataset.step === "" ? null : Number(box.dataset.step)};
  const mine = run;
  stopButton(true);
  showStatus(say("writing"));
  performance.mark("generate:request");
  let response;
  try {
    response = await fetch(box.dataset.api, {method: "POST", body: box.dataset.request, signal: controller.signal,
      headers: {"Content-Type": "application/json", "Accept": "text/event-stream"}});
  } catch {
    if (run === mine && !controller.signal.aborted) fail(say("unreachable"));
    return;
  }
  if (!response.ok) {
    let message = say("answered", {status: response.status});
    try {
      const body = await response.json();
      message = body.detail.map((d) => d.msg).join("; ");
    } catch { /* not JSON: keep the status */ }
    if (run === mine) fail(message);
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const message = parseEvent(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (message && run === mine) receive(message);
      }
    }
  } catch {
    if (run === mine && !controller.signal.aborted) fail(say("cut_off"));
  }
}

function receive(message) {
  if (message.name === "start") {
    run.start = message.data;
    drawPrompt();
  } else if (message.name === "step") {
    run.steps.push(message.data);
    pump();
  } else if (message.name === "end") {
    run.end = message.data;
    pump();
  }
}

// one token on screen at a time, at most every `pace` ms
function pump() {
  if (run.timer) return;
  const wait = run.lastShown + run.pace - performance.now();
  if (wait > 0) {
    run.timer = setTimeout(function () { run.timer = null; pump(); }, wait);
    return;
  }
  if (run.shown < run.steps.length) {
    showToken(run.steps[run.shown]);
    run.shown += 1;
    run.lastShown = performance.now();
    if (run.shown === 1) performance.mark("generate:first-token");
    showStatus(say("writing_n", {n: run.shown, max: run.start.settings.max_new_tokens}));
    run.timer = setTimeout(function () { run.timer = null; pump(); }, run.pace);
  } else if (run.end) {
    const reason = run.end.finish_reason === "stop" ? say("reason_stop") : "max_new_tokens";
    showStatus(say("done", {n: run.shown, reason: reason}, run.shown));
    finishRun();
  }
}

function finishRun() {
  if (!run) return;
  if (run.timer) clearTimeout(run.timer);
  run.timer = null;
  run.finished = true;
  stopButton(false);
  const json = document.getElementById("gen-download-json");
  if (json) json.disabled = run.shown === 0;
  if (run.shown && run.selected === null) {
    const wanted = run.wanted !== null && run.wanted < run.shown ? run.wanted : run.shown - 1;
    select(wanted, false);
  }
}

function abort() {
  if (run && !run.finished) {
    run.controller.abort();
    finishRun();
  }
}

// Stop: no more tokens appear; what is shown stays (steps received but not yet shown are dropped)
function stopWriting() {
  if (!run || run.finished) return;
  run.controller.abort();
  run.stopped = true;
  run.steps.length = run.shown;
  showStatus(say("stopped", {n: run.shown}, run.shown));
  finishRun();
}

// ------------------------------------------------------------------ the text

function drawPrompt() {
  const out = document.getElementById("gen-output");
  out.replaceChildren();
  for (const t of run.start.tokens) out.append(el("span", {class: "gen-prompt"}, t));
}

function showToken(step) {
  const out = document.getElementById("gen-output");
  const shade = Math.min(9, Math.floor(step.prob * 10));
  const b = el("button", {type: "button", class: "gen-tok p" + shade + (step.stop ? " stopped" : ""),
                          "data-index": step.index, "aria-pressed": "false",
                          "aria-label": say("token_label", {i: step.index + 1, token: step.token,
                                                              p: fmt(step.prob)})}, step.token);
  out.append(b);
}

function tokenButtons() {
  return Array.from(document.querySelectorAll("#gen-output button.gen-tok"));
}

// ------------------------------------------------------------------ one token's story

function select(index, takeFocus) {
  if (!run || index < 0 || index >= run.shown) return;
  run.selected = index;
  for (const b of tokenButtons()) b.setAttribute("aria-pressed", String(Number(b.dataset.index) === index));
  if (takeFocus) tokenButtons()[index].focus();
  const csv = document.getElementById("gen-download-csv");
  if (csv) csv.disabled = false;
  drawDetail();
  setUrl({step: index});
}

function drawDetail() {
  const step = run.steps[run.selected];
  const panel = document.getElementById("gen-detail");
  panel.hidden = false;
  document.getElementById("gen-detail-title").textContent =
    say("detail_title", {i: step.index + 1, token: visible(step.token)});
  const how = step.u === null
    ? say("greedy_how")
    : say("drawn_how", {u: step.u.toFixed(4), p: fmt(step.prob_after)});
  document.getElementById("gen-summary").textContent = [
    say("gave", {p: fmt(step.prob)}), how,
    say("kept", {n: step.kept_count, share: (100 * step.kept_mass).toFixed(1) + "%"}, step.kept_count),
    say("cache", {bytes: step.cache_bytes.toLocaleString("en")})].join(" ");
  drawTable(step);
  drawHeadPicks(step);
  drawStrip(step);
  drawHeads(step);
}

function drawTable(step) {
  const table = document.getElementById("gen-dist");
  const head = table.tHead;
  head.replaceChildren();
  const row = el("tr");
  row.append(el("th", {scope: "col"}, say("rank")), el("th", {scope: "col"}, say("token")));
  for (const s of step.stages) row.append(el("th", {scope: "col"}, say("after", {stage: stageLabel(s)})));
  head.append(row);
  head.rows[0].cells[2].textContent = say("the_model");
  const body = table.tBodies[0];
  body.replaceChildren();
  let cutShown = false;
  for (const c of step.top) {
    if (!c.kept && !cutShown) {
      cutShown = true;
      const line = el("tr", {class: "cutoff"});
      line.append(el("td", {colspan: String(2 + step.stages.length)},
                     say("cutoff", {n: step.kept_count, stage: stageLabel(c.cut_by)}, step.kept_count)));
      body.append(line);
    }
    const drawn = c.id === step.id;
    const tr = el("tr", {class: (c.kept ? "" : "cut") + (drawn ? " drawn" : "")});
    tr.append(el("td", {class: "num"}, String(c.rank + 1)));
    const tok = el("td");
    tok.append(el("span", {class: "tok"}, visible(c.token)));
    if (drawn) tok.append(el("span", {"aria-label": " " + say("drawn")}, " ★"));
    tr.append(tok);
    c.probs.forEach(function (p) {
      const cell = el("td", {class: "num"}, fmt(p));
      const bar = el("span", {class: "bar", "aria-hidden": "true"});
      bar.style.width = (100 * p).toFixed(1) + "%";
      cell.append(bar);
      tr.append(cell);
    });
    body.append(tr);
  }
}

function drawHeadPicks(step) {
  const nLayers = step.attention.length, nHeads = step.attention[0].length;
  run.layer = Math.min(run.layer, nLayers - 1);
  run.head = Math.min(run.head, nHeads - 1);
  const layer = document.getElementById("gen-layer"), head = document.getElementById("gen-head");
  if (layer.options.length !== nLayers) {
    layer.replaceChildren(...Array.from({length: nLayers}, (_, i) => el("option", {value: i}, String(i))));
  }
  if (head.options.length !== nHeads) {
    head.replaceChildren(...Array.from({length: nHeads}, (_, h) => el("option", {value: h}, headLabel(0, h).replace(/^L0H/, ""))));
  }
  layer.value = String(run.layer);
  head.value = String(run.head);
}

function keyTokens(step) {
  // the tokens the choosing query could see: the prompt and the new tokens before this one
  return run.start.tokens.concat(run.steps.slice(0, step.index).map((s) => s.token));
}

function drawStrip(step) {
  const row = step.attention[run.layer][run.head];
  const tokens = keyTokens(step);
  const strip = document.getElementById("gen-strip");
  strip.replaceChildren();
  let best = 0;
  row.forEach(function (w, i) {
    const k = el("span", {class: "key" + (i === row.length - 1 ? " query" : ""),
                          title: say("key_title", {i: i, token: visible(tokens[i]), w: fmt(w)})}, visible(tokens[i]));
    k.style.background = "rgba(230, 120, 0, " + Math.min(1, w).toFixed(3) + ")";
    strip.append(k);
    if (w > row[best]) best = i;
  });
  document.getElementById("gen-strip-title").textContent =
    say("strip_title", {head: headLabel(run.layer, run.head), token: visible(step.token)});
  const sink = row[0] > run.start.sink_threshold ? " " + say("parks", {w: fmt(row[0])}) : "";
  document.getElementById("gen-readout").textContent =
    say("readout", {head: headLabel(run.layer, run.head), i: best, token: visible(tokens[best]), w: fmt(row[best])}) + sink;
}

function drawHeads(step) {
  const grid = document.getElementById("gen-heads");
  grid.replaceChildren();
  const sinks = new Set(step.sink_heads.map((s) => s.layer + "." + s.head));
  step.attention.forEach(function (heads, layer) {
    heads.forEach(function (row, head) {
      const isSink = sinks.has(layer + "." + head);
      const chosen = layer === run.layer && head === run.head;
      const b = el("button", {type: "button", class: "gen-head" + (isSink ? " sink" : ""), "data-layer": layer,
                              "data-head": head, "aria-pressed": String(chosen),
                              "aria-label": say(isSink ? "head_sink" : "head_label",
                                                {head: headLabel(layer, head), w: fmt(row[0])})});
      const label = el("span", {"aria-hidden": "true"}, headLabel(layer, head));
      if (isSink) label.append(el("span", {class: "sink-mark"}, " " + say("sink")));
      const canvas = el("canvas", {width: String(row.length), height: "1", "aria-hidden": "true"});
      const ctx = canvas.getContext("2d");
      row.forEach(function (w, i) {
        ctx.fillStyle = "rgba(230, 120, 0, " + Math.min(1, w).toFixed(3) + ")";
        ctx.fillRect(i, 0, 1, 1);
      });
      b.append(label, canvas);
      grid.append(b);
    });
  });
  document.getElementById("gen-sinks").textContent = step.sink_heads.length
    ? say("sinks", {t: run.start.sink_threshold,
                    heads: step.sink_heads.map((s) => headLabel(s.layer, s.head) + " " + fmt(s.weight)).join(", ")})
    : say("no_sinks", {t: run.start.sink_threshold});
}

function pickHead(layer, head) {
  run.layer = layer;
  run.head = head;
  drawDetail();
  setUrl({layer: layer || null, head: head || null});  // 0 is the default: left out
}

// ------------------------------------------------------------------ downloads

function downloadJson() {
  const s = run.start;
  const steps = run.steps.slice(0, run.shown);
  const whole = Object.assign({}, s, {steps: steps,
    generated: {ids: steps.map((x) => x.id), tokens: steps.map((x) => x.token),
                text: run.end && !run.stopped ? run.end.generated.text : null},
    finish_reason: run.stopped ? null : run.end && run.end.finish_reason});
  saveFile("generation-" + s.model + "-seed" + s.seed + ".json", "application/json", JSON.stringify(whole));
}

function downloadCsv() {
  const step = run.steps[run.selected];
  const quote = (t) => '"' + String(t).replace(/"/g, '""') + '"';
  const lines = [["rank", "token", "id"].concat(step.stages, ["kept", "cut_by", "drawn"]).join(",")];
  for (const c of step.top) {
    lines.push([c.rank + 1, quote(c.token), c.id].concat(c.probs, [c.kept, c.cut_by || "", c.id === step.id])
               .join(","));
  }
  saveFile("token" + (step.index + 1) + "-distribution.csv", "text/csv", lines.join("\n") + "\n");
}

// ------------------------------------------------------------------ events

document.addEventListener("click", function (evt) {
  const tok = evt.target.closest("#gen-output button.gen-tok");
  if (tok) { select(Number(tok.dataset.index), false); return; }
  const head = evt.target.closest("#gen-heads button.gen-head");
  if (head) { pickHead(Number(head.dataset.layer), Number(head.dataset.head)); return; }
  if (evt.target.closest("#gen-stop-button")) { stopWriting(); return; }
  if (evt.target.closest("#gen-download-json") && run) { downloadJson(); return; }
  if (evt.target.closest("#gen-download-csv") && run && run.selected !== null) downloadCsv();
});

document.addEventListener("keydown", function (evt) {
  const tok = evt.target.closest && evt.target.closest("#gen-output button.gen-tok");
  if (!tok || !run) return;
  const i = Number(tok.dataset.index);
  const to = {ArrowLeft: i - 1, ArrowRight: i + 1, Home: 0, End: run.shown - 1}[evt.key];
  if (to === undefined) return;
  evt.preventDefault();
  select(Math.max(0, Math.min(run.shown - 1, to)), true);
});

document.addEventListener("change", function (evt) {
  const t = evt.target;
  if ((t.id === "gen-layer" || t.id === "gen-head") && run && run.selected !== null) {
    pickHead(Number(document.getElementById("gen-layer").value), Number(document.getElementById("gen-head").value));
  }
  if (t.matches("input[data-enables]")) {
    const target = document.getElementById(t.dataset.enables);
    target.disabled = !t.checked;
    showValue(target);
  }
});

// a slider's value beside its label
function showValue(input) {
  const out = document.querySelector('output[for="' + input.id + '"]');
  if (out) out.textContent = input.disabled ? say("off") : input.value;
}

document.addEventListener("input", function (evt) {
  if (evt.target.matches(".generate-form input[type=range]")) showValue(evt.target);
});

// a results block with a request starts its generation (the first page, and each Generate)
function onLoad(root) {
  const box = root.id === "generate-results" ? root : root.querySelector && root.querySelector("#generate-results");
  if (box && box.dataset.request) start(box);
  else if (box) abort();
}

if (window.htmx) htmx.onLoad(onLoad);
else document.addEventListener("DOMContentLoaded", function () { onLoad(document.body); });
