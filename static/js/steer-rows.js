// The /generate page's steers (templates/generate.html, app/pages/steer.py): one row a steer, up to the server's
// limit (#steer-rows data-limit). "Add a steer" copies the row template (#steer-row-template); a row's Remove button
// takes it out. Rows are numbered again after each change, so their fields' names are the URL's: the first steer's
// steer, steer_sae, ..., the second's steer2, steer2_sae, ... (each field's data-key is its name's ending, data-id
// its id's). Focus goes to the added row, or after a removal to the row now in its place (else Add); a live region
// says what happened. After each Generate (an htmx swap of the results), each row shows its own problems, from the
// results block's data-steer-errors ({row: [messages]}).

import {say as pageSay} from "./words.js";

function rowsBox() {
  return document.getElementById("steer-rows");
}

// the page's words (app/pages/generate.py script_words, through words.js), steer n's
const say = (key, n) => pageSay("generate", "steer_" + key, {n: n});

function announce(text) {
  const live = document.getElementById("steer-announce");
  if (live) live.textContent = text;
}

function renumber() {
  const box = rowsBox();
  if (!box) return;
  const rows = box.querySelectorAll("[data-steer-row]");
  rows.forEach((row, i) => {
    const p = i === 0 ? "steer" : "steer" + (i + 1);
    row.querySelectorAll("[data-key]").forEach((field) => { field.name = p + field.dataset.key; });
    row.querySelectorAll("[data-id]").forEach((node) => { node.id = p + node.dataset.id; });
    row.querySelectorAll("label[data-for]").forEach((label) => { label.htmlFor = p + label.dataset.for; });
    row.querySelectorAll("[data-describedby]").forEach((node) => {
      node.setAttribute("aria-describedby", p + node.dataset.describedby);
    });
    const legend = row.querySelector("[data-steer-legend]");
    if (legend) legend.textContent = say("legend", i + 1);
    const remove = row.querySelector("[data-steer-remove]");
    if (remove) remove.textContent = say("remove", i + 1);
  });
  const add = document.getElementById("steer-add");
  if (add) add.disabled = rows.length >= Number(box.dataset.limit || 8);
}

function addRow() {
  const box = rowsBox();
  const template = document.getElementById("steer-row-template");
  if (!box || !template) return;
  if (box.querySelectorAll("[data-steer-row]").length >= Number(box.dataset.limit || 8)) return;
  const row = template.content.firstElementChild.cloneNode(true);
  box.appendChild(row);
  renumber();
  const means = row.querySelector("input[type=radio][value=means]");  // a new row steers: by a difference of means
  if (means) means.checked = true;
  const n = box.querySelectorAll("[data-steer-row]").length;
  (row.querySelector("input[type=radio]:checked") || row.querySelector("input, select, textarea")).focus();
  announce(say("added", n));
}

function removeRow(button) {
  const row = button.closest("[data-steer-row]");
  const box = rowsBox();
  if (!row || !box) return;
  const rows = Array.from(box.querySelectorAll("[data-steer-row]"));
  const i = rows.indexOf(row);
  row.remove();
  renumber();
  const left = box.querySelectorAll("[data-steer-row]");
  const next = left[Math.min(i, left.length - 1)];
  const target = next ? next.querySelector("input[type=radio]:checked") || next.querySelector("input")
    : document.getElementById("steer-add");
  if (target) target.focus();
  announce(say("removed", i + 1));
}

// each row's problems from the last results block (none: every row's list emptied and hidden)
function showErrors(results) {
  const box = rowsBox();
  if (!box || !results || results.dataset.steerErrors === undefined) return;
  const errors = JSON.parse(results.dataset.steerErrors || "{}");
  box.querySelectorAll("[data-steer-row]").forEach((row, i) => {
    const list = row.querySelector("ul.steer-error");
    if (!list) return;
    const mine = errors[String(i)] || [];
    list.replaceChildren(...mine.map((m) => Object.assign(document.createElement("li"), {textContent: m})));
    list.hidden = mine.length === 0;
    row.querySelectorAll("[data-key]").forEach((field) => {
      if (mine.length) field.setAttribute("aria-invalid", "true");
      else field.removeAttribute("aria-invalid");
    });
  });
}

document.addEventListener("click", function (evt) {
  const t = evt.target;
  if (!(t instanceof Element)) return;
  if (t.id === "steer-add") addRow();
  else if (t.matches("[data-steer-remove]")) removeRow(t);
});

function onLoad(root) {
  const results = root.id === "generate-results" ? root : root.querySelector && root.querySelector("#generate-results");
  if (results) showErrors(results);
}

if (window.htmx) htmx.onLoad(onLoad);
else document.addEventListener("DOMContentLoaded", function () { onLoad(document.body); });
