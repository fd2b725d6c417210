// The teacher's page, /class (templates/class_teacher.html; app/pages/classroom.py): start a class (POST
// /api/v1/classes sets the teacher's cookies; the page then reloads to show the code, link and QR code),
// count the students, ask a poll and watch its answers come in, reveal the model's answer, end the class.
// Every question and option is written with textContent, never as HTML.
import {say} from "./words.js";

const page = document.querySelector(".class-page");
const code = page && page.dataset.classCode;
const note = document.getElementById("class-status");
const api = "/api/v1/classes/" + (code ? encodeURIComponent(code) : "");
let poll = null;  // the poll shown: {id, question, options, kind}
let pollTimer = null;
let preset = {kind: "free", question: null};  // the ready-made question chosen last

// What the server computed as the model's answer (a next-token or induction-head poll), in words.
function modelSaid(detail) {
  if (!detail) return "";
  if (detail.kind === "next_token") {
    return say("class", "model_token", {model: detail.model, token: detail.token, prob: detail.prob.toFixed(3)});
  }
  return say("class", "model_head", {model: detail.model, head: detail.head, score: detail.score.toFixed(3)});
}

// The error an API answer carries ({"detail": [{"msg"}]} or {"detail": "..."}), in the page's words.
async function failed(answer) {
  let detail = "";
  try {
    const body = await answer.json();
    detail = Array.isArray(body.detail) ? body.detail.map((d) => d.msg).join("; ") : String(body.detail || "");
  } catch {
    detail = answer.statusText;
  }
  note.textContent = say("class", "failed", {status: answer.status, detail});
}

async function call(method, url, body) {
  try {
    const answer = await fetch(url, {
      method,
      headers: body === undefined ? {} : {"Content-Type": "application/json"},
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!answer.ok) {
      await failed(answer);
      return null;
    }
    return answer.status === 204 ? {} : await answer.json();
  } catch {
    note.textContent = say("class", "unreachable");
    return null;
  }
}

// ------------------------------------------------------------------ no class yet

const start = document.getElementById("start-class");
if (start) {
  start.addEventListener("click", async () => {
    start.disabled = true;
    note.textContent = say("class", "starting");
    if (await call("POST", "/api/v1/classes")) location.reload();
    else start.disabled = false;
  });
}

// ------------------------------------------------------------------ a class running

async function countStudents() {
  try {
    const answer = await fetch(api);
    if (answer.status === 404) {
      location.reload();  // ended elsewhere, or expired: the page offers a new one
      return;
    }
    if (!answer.ok) return;  // a replica gone: the next count will do
    const live = await answer.json();
    document.getElementById("student-count").textContent = say("class", "students", {n: live.students}, live.students);
  } catch {
    // the network: the next count will do
  }
}

function drawCounts(result) {
  const bars = document.getElementById("poll-bars");
  const total = result.counts.reduce((a, b) => a + b, 0);
  const most = Math.max(1, ...result.counts);
  bars.replaceChildren(...result.options.map((option, i) => {
    const item = document.createElement("li");
    const label = document.createElement("span");
    label.className = "poll-option";
    label.textContent = option;
    const track = document.createElement("span");
    track.className = "poll-track";
    const bar = document.createElement("span");
    bar.className = "poll-bar" + (result.answer === option ? " poll-bar-answer" : "");
    bar.style.width = (100 * result.counts[i] / most) + "%";
    track.append(bar);
    const count = document.createElement("span");
    count.className = "poll-count";
    count.dataset.option = option;
    count.textContent = String(result.counts[i]);
    item.append(label, track, count);
    return item;
  }));
  document.getElementById("poll-total").textContent = say("class", "answers", {n: total}, total);
}

function stopPolling() {
  clearInterval(pollTimer);
  pollTimer = null;
}

async function refreshPoll() {
  if (!poll) return;
  const id = poll.id;
  try {
    const answer = await fetch(api + "/polls/" + id);
    if (!answer.ok || !poll || poll.id !== id) return;
    const result = await answer.json();
    drawCounts(result);
    if (result.closed) {
      stopPolling();
      document.getElementById("poll-reveal").disabled = true;
    }
  } catch {
    // the network, or a replica gone: the next second will do
  }
}

function showPoll(shown) {
  poll = shown;
  const live = document.getElementById("poll-live");
  live.hidden = false;
  document.getElementById("poll-live-question").textContent = shown.question;
  const select = document.getElementById("poll-answer");
  select.replaceChildren(...shown.options.map((option) => {
    const choice = document.createElement("option");
    choice.value = option;
    choice.textContent = option;
    return choice;
  }));
  document.getElementById("poll-reveal").disabled = false;
  const computed = Boolean(shown.kind) && shown.kind !== "free";  // the server works the answer out
  document.getElementById("poll-pick").hidden = computed;
  document.getElementById("poll-computed").hidden = !computed;
  drawCounts({...shown, counts: shown.options.map(() => 0), answer: null});
  stopPolling();
  const every = JSON.parse(page.dataset.timings).poll_ms;
  pollTimer = setInterval(refreshPoll, every);
  refreshPoll();
}

if (code) {
  setInterval(countStudents, JSON.parse(page.dataset.timings).students_ms);

  document.getElementById("end-class").addEventListener("click", async () => {
    if (await call("DELETE", api)) location.reload();
  });

  const question = document.getElementById("poll-question");
  const options = document.getElementById("poll-options");
  for (const button of document.querySelectorAll("[data-preset]")) {
    button.addEventListener("click", () => {
      question.value = button.dataset.question;
      options.value = button.dataset.options ? JSON.parse(button.dataset.options).join("\n") : "";
      preset = {kind: button.dataset.kind, question: button.dataset.question};
      options.focus();
    });
  }

  document.getElementById("poll-form").addEventListener("submit", async (evt) => {
    evt.preventDefault();
    const lines = options.value.split("\n").map((l) => l.trim()).filter((l) => l);
    if (lines.length < 2) {
      note.textContent = say("class", "need_options");
      return;
    }
    // A ready-made question the teacher left as it was is answered by the model; any other is free text.
    const kind = question.value.trim() === preset.question ? preset.kind : "free";
    const asked = await call("POST", api + "/polls", {question: question.value.trim(), options: lines, kind});
    if (asked) {
      showPoll(asked);
      note.textContent = say("class", "asked", {question: asked.question});
    }
  });

  document.getElementById("poll-reveal").addEventListener("click", async () => {
    if (!poll) return;
    const free = !poll.kind || poll.kind === "free";
    const body = free ? {answer: document.getElementById("poll-answer").value} : {};
    document.getElementById("poll-reveal").disabled = true;
    const result = await call("POST", api + "/polls/" + poll.id + "/close", body);
    if (result) {
      stopPolling();
      drawCounts(result);
      note.textContent = [say("class", "revealed", {answer: result.answer}), modelSaid(result.detail)].join(" ").trim();
    } else {
      document.getElementById("poll-reveal").disabled = false;
    }
  });

  const opened = document.getElementById("poll-live").dataset.poll;
  if (opened) showPoll(JSON.parse(opened));
}
