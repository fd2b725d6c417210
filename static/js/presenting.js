// A teacher presenting a live class (templates/base.html's Presenting bar; app/pages/classroom.py): every
// change of this page's URL state is pushed to the class with PUT /api/v1/classes/{code}/state, which the
// teacher's HttpOnly cookie authorises, and every student's page follows. A change is the page as it
// loads, htmx moving the address bar (htmx:pushedIntoHistory, htmx:replacedInHistory), a script moving it
// (history.pushState/replaceState, watched below) and Back/Forward (popstate). Only the pages a class can show are pushed (the bar lists them, from app/service/classes.py);
// the language is left out, so each student keeps their own. Pushes go in order, and a 502 or 503 (a
// replica just killed, Caddy trying the next) is retried a few times before the bar says so.
import {say} from "./words.js";

const bar = document.getElementById("presenting-bar");
const RETRIES = 4;
const RETRY_MS = 300;  // doubled each time: 0.3 + 0.6 + 1.2 + 2.4 s, within the class's 5 s

let queue = Promise.resolve();
let lastPushed = null;

function showable(pathname) {
  const {pages, prefixes} = JSON.parse(bar.dataset.classPages);
  return pages.includes(pathname) || prefixes.some((p) => pathname.startsWith(p) && pathname.length > p.length);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function push(path) {
  const note = document.getElementById("presenting-status");
  for (let attempt = 0; ; attempt++) {
    let answer = null;
    try {
      answer = await fetch("/api/v1/classes/" + encodeURIComponent(bar.dataset.classCode) + "/state", {
        method: "PUT",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify({path}),
      });
    } catch {
      answer = null;  // the network, or a replica gone mid-request: retried like a 502
    }
    if (answer && answer.ok) {
      note.textContent = "";
      return;
    }
    const retryable = !answer || answer.status === 502 || answer.status === 503;
    if (!retryable || attempt >= RETRIES) {
      note.textContent = answer ? say("presenting", "failed", {status: answer.status}) : say("presenting", "unreachable");
      if (lastPushed === path) lastPushed = null;  // the same page again later is pushed again
      return;
    }
    await sleep(RETRY_MS * 2 ** attempt);
  }
}

function pushHere() {
  // A page framed by a student's page (the teacher trying the student's view) never drives the class.
  if (!bar || window.top !== window) return;
  const url = new URL(location.href);
  if (!showable(url.pathname)) return;
  url.searchParams.delete("lang");
  const path = url.pathname + url.search;
  if (path === lastPushed) return;
  lastPushed = path;
  queue = queue.then(() => push(path));
}

// A script that moves the address bar itself, with no htmx event (the "Classroom size" toggle, the
// explorer's cell panel, Write's settings): every history.pushState and replaceState of this page is a
// change of view too. The same path twice is pushed once (lastPushed).
function watchHistory() {
  for (const method of ["pushState", "replaceState"]) {
    const original = history[method];
    history[method] = function (...args) {
      const result = original.apply(this, args);
      pushHere();
      return result;
    };
  }
}

if (bar) {
  watchHistory();
  document.addEventListener("htmx:pushedIntoHistory", pushHere);
  document.addEventListener("htmx:replacedInHistory", pushHere);
  window.addEventListener("popstate", pushHere);
  pushHere();
}
