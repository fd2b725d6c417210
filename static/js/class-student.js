// A student's page, /class/{code} (templates/class_student.html; app/pages/classroom.py). The teacher's
// current view is an <iframe> of this site; the class's events (GET /api/v1/classes/{code}/events, an
// EventSource) move it whenever the teacher moves, while the student follows. "Explore on my own" stops
// following (the framed page is the student's), "Follow the teacher" goes back to the teacher's current
// view. Polls: one button per option (its text is its name), a second click replaces the first answer.
// Reconnecting: EventSource resumes by itself with Last-Event-ID; if it gives up (a 502 from a replica just
// killed) a new one starts, and the server answers it with where the class is now; a class that is full
// (403) says so and stops there. What the student chose
// (following or not, their answer) is kept in sessionStorage, so a reload keeps it too.
// Questions and options are written with textContent, never as HTML.
import {say} from "./words.js";

const root = document.querySelector(".class-student");
const code = root.dataset.classCode;
const frame = document.getElementById("class-view");
const announce = document.getElementById("class-announce");
const lang = document.documentElement.lang;
const REOPEN_MS = [1000, 2000, 4000];
const eventsUrl = "/api/v1/classes/" + encodeURIComponent(code) + "/events";  // after an EventSource gave up: again, and less often

const saved = JSON.parse(sessionStorage.getItem("class:" + code) || "{}");
let following = saved.following !== false;
let teacherPath = root.dataset.classPath;
let poll = null;  // the poll shown: {id, question, options}
let chosen = saved.poll !== undefined ? {poll: saved.poll, option: saved.option} : null;
let ended = false;
let source = null;
let failures = 0;

function remember() {
  const kept = {following};
  if (chosen) Object.assign(kept, chosen);
  sessionStorage.setItem("class:" + code, JSON.stringify(kept));
}

function say_(key, vars) {
  announce.textContent = say("class", key, vars);
}

// The teacher's path in this student's language.
function inMyLanguage(path) {
  const url = new URL(path, location.origin);
  if (lang && lang !== "en") url.searchParams.set("lang", lang);
  else url.searchParams.delete("lang");
  return url.pathname + url.search;
}

function framed() {
  try {
    return frame.contentWindow.location.pathname + frame.contentWindow.location.search;
  } catch {
    return null;
  }
}

function showTeacherView() {
  const wanted = inMyLanguage(teacherPath);
  if (framed() === wanted) return;
  try {
    frame.contentWindow.location.replace(wanted);  // no new entry in the tab's history
  } catch {
    frame.src = wanted;
  }
}

function showMode() {
  const mode = document.getElementById("class-mode");
  mode.dataset.following = String(following);
  mode.textContent = say("class", following ? "following_banner" : "exploring");
  document.getElementById("follow-teacher").setAttribute("aria-pressed", String(following));
  document.getElementById("explore-own").setAttribute("aria-pressed", String(!following));
}

document.getElementById("explore-own").addEventListener("click", () => {
  following = false;
  remember();
  showMode();
  say_("exploring");
});

document.getElementById("follow-teacher").addEventListener("click", () => {
  following = true;
  remember();
  showMode();
  showTeacherView();
  say_("following");
});

// ------------------------------------------------------------------ polls

function markChosen() {
  for (const button of document.querySelectorAll("#student-poll-options button")) {
    const mine = chosen && poll && chosen.poll === poll.id && chosen.option === button.dataset.option;
    button.setAttribute("aria-pressed", String(Boolean(mine)));
  }
  const line = document.getElementById("student-poll-status");
  line.textContent = chosen && poll && chosen.poll === poll.id ? say("class", "your_answer", {option: chosen.option}) : "";
}

async function choose(option) {
  if (!poll) return;
  const id = poll.id;
  try {
    const answer = await fetch("/api/v1/classes/" + encodeURIComponent(code) + "/polls/" + id + "/answers", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({option}),
    });
    if (!answer.ok) return;  // closed meanwhile: poll_closed says so
  } catch {
    return;
  }
  chosen = {poll: id, option};
  remember();
  markChosen();
}

function showPoll(shown) {
  const box = document.getElementById("student-poll");
  const fresh = !poll || poll.id !== shown.id;
  poll = shown;
  box.hidden = false;
  document.getElementById("student-poll-question").textContent = shown.question;
  document.getElementById("student-poll-results").hidden = true;
  document.getElementById("student-poll-options").replaceChildren(...shown.options.map((option) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = option;
    button.dataset.option = option;
    button.addEventListener("click", () => choose(option));
    return button;
  }));
  markChosen();
  if (fresh) say_("new_poll", {question: shown.question});
}

// What the server computed as the model's answer (a next-token or induction-head poll), in words.
function modelSaid(detail) {
  if (detail.kind === "next_token") {
    return say("class", "model_token", {model: detail.model, token: detail.token, prob: detail.prob.toFixed(3)});
  }
  return say("class", "model_head", {model: detail.model, head: detail.head, score: detail.score.toFixed(3)});
}

function showResults(result) {
  if (!poll || poll.id !== result.id) showPoll(result);
  for (const button of document.querySelectorAll("#student-poll-options button")) button.disabled = true;
  const list = document.getElementById("student-poll-results");
  list.replaceChildren(...result.options.map((option, i) => {
    const item = document.createElement("li");
    item.textContent = say("class", "count_of", {option, n: result.counts[i]});
    if (option === result.answer) item.className = "poll-answer";
    return item;
  }));
  list.hidden = false;
  const line = document.getElementById("student-poll-status");
  line.textContent = result.answer ? say("class", "answer_was", {answer: result.answer}) : say("class", "closed");
  if (result.detail) line.textContent += " " + modelSaid(result.detail);
  announce.textContent = line.textContent;
}

// ------------------------------------------------------------------ following the class

function end() {
  ended = true;
  if (source) source.close();
  const notice = document.getElementById("class-ended");
  notice.textContent = say("class", "ended");
  notice.hidden = false;
  document.getElementById("class-banner").hidden = true;
  sessionStorage.removeItem("class:" + code);
}

function listen() {
  source = new EventSource(eventsUrl);
  source.addEventListener("open", () => {
    failures = 0;
    document.getElementById("class-connection").textContent = "";
  });
  source.addEventListener("state", (evt) => {
    teacherPath = JSON.parse(evt.data).path;
    if (following) showTeacherView();
  });
  source.addEventListener("poll", (evt) => showPoll(JSON.parse(evt.data)));
  source.addEventListener("poll_closed", (evt) => showResults(JSON.parse(evt.data)));
  source.addEventListener("ended", end);
  source.addEventListener("error", () => {
    if (ended) return;
    document.getElementById("class-connection").textContent = say("class", "reconnecting");
    if (source.readyState !== EventSource.CLOSED) return;  // CONNECTING: it retries by itself
    // It gave up (an answer that was not a stream: a 502 while a replica restarts, or the class is gone).
    const delay = REOPEN_MS[Math.min(failures, REOPEN_MS.length - 1)];
    failures += 1;
    setTimeout(reopen, delay);
  });
}

// A class that will not take this student (it has as many as its teacher's server allows): said, in the
// page's language, and no more retries.
function refused() {
  ended = true;
  if (source) source.close();
  const notice = document.getElementById("class-ended");
  notice.textContent = say("class", "full");
  notice.hidden = false;
  document.getElementById("class-banner").hidden = true;
  document.getElementById("class-connection").textContent = "";
  frame.hidden = true;
  sessionStorage.removeItem("class:" + code);
}

// Why the stream gave up: its own answer's status (EventSource does not tell), read by a fetch that stops
// at the headers. 404: the class is gone; 403: it is full; anything else: open the stream again.
async function reopen() {
  if (ended) return;
  const headersOnly = new AbortController();
  try {
    const answer = await fetch(eventsUrl, {signal: headersOnly.signal, headers: {Accept: "text/event-stream"}});
    headersOnly.abort();
    if (answer.status === 404) {
      end();
      return;
    }
    if (answer.status === 403) {
      refused();
      return;
    }
  } catch {
    // the network: try the stream anyway
  }
  listen();
}

showMode();
if (!following) say_("exploring");
listen();
