// Transformer Explorer's pages in the browser, as ES modules (no bundler, no inline script, so the
// pages run under a strict Content-Security-Policy: script-src 'self' admits same-origin modules).
// templates/base.html loads explorer.js (<script type="module">, as every page script), which imports
// this module; the modules import one another:
//   plotly-adapter.js      the one place that reads Plotly's private state (also window.PlotlyAdapter)
//   explorer-figures.js    figure data (a `data-figure` attribute) -> Plotly traces, layout, config;
//                          the classroom size the layout follows
//   explorer-image.js      long inputs: a matrix painted as an image under Plotly's axes
//   explorer-zoom.js       drag-zoom and its way back, the cell under the pointer, hover
//   explorer-labels.js     token labels written beside the axes
//   explorer-values.js     a painted matrix's exact values (and another head's levels), read from the
//                          server when they are read
//   explorer-cells.js      the selected cell (keyboard, click) read out in a live region
//   explorer-cell.js       the selected cell of the four stages opened beside them ("This cell")
//   explorer-draw.js       Plotly.react, decorations, plots kept across htmx swaps
//   explorer-downloads.js  JSON and CSV downloads of a figure's data
//   explorer-explain.js    a click on a next-token bar opens /attribution for that token (its link's)
//   explorer-main.js       this file: page state and requests (classroom size, failed requests, the
//                          latest setting wins, morphing, paced typing) and the start
//   words.js               the page's words in its language (every page script's: not the explorer's only)
// The others only define functions and listeners; this one starts drawing when explorer.js calls
// start(), and draws what htmx loads from then on (load()).
import * as P from "./plotly-adapter.js";
import {isClassroom} from "./explorer-figures.js";
import {draw, drawAll, keepPlots, copyAttributes, headBeingRead} from "./explorer-draw.js";
import "./explorer-downloads.js";
import "./explorer-cell.js";
import {say} from "./words.js";

// ------------------------------------------------------------------ classroom size

// The "classroom" checkbox switches the projector-friendly size at once (its state also goes
// into the URL with the rest of the form; isClassroom, explorer-figures.js, reads it from the body).
function syncClassroom() {
  const box = document.querySelector("input[name=classroom][type=checkbox]");
  if (!box) return;
  if (box.checked !== isClassroom()) {
    document.body.classList.toggle("classroom", box.checked);
    document.querySelectorAll("[data-figure]").forEach(function (el) {
      el._explorerDrawn = null;  // the same data at another size
      draw(el);
    });
  }
}

// The size is part of the view, so the current URL says it too (a shared link keeps it);
// later requests carry it with the form (the checkbox belongs to it via form="...").
function rememberClassroom(on) {
  const url = new URL(location.href);
  if (on) url.searchParams.set("classroom", "1");
  else url.searchParams.delete("classroom");
  history.replaceState(Object.assign({}, history.state, {htmx: true}), "", url.pathname + url.search);
}

document.addEventListener("change", function (evt) {
  if (evt.target.matches("input[name=classroom]")) {
    syncClassroom();
    rememberClassroom(evt.target.checked);
  }
});

// ------------------------------------------------------------------ errors htmx could not swap

// Failed requests that the server could not answer in place (busy, network down, 5xx) show a
// message in the results area; 422s arrive as server-rendered HTML and are swapped like any page.
// The words, in the page's language: templates/base.html's data-request-words (words.js).
function messageFor(xhr) {
  if (!xhr || xhr.status === 0) return say("request", "unreachable");
  if (xhr.status === 503) return say("request", "busy");
  return say("request", "answered", {status: (xhr.status + " " + (xhr.statusText || "")).trim()});
}

function showRequestError(evt) {
  const target = (evt.detail && evt.detail.target) || document.getElementById("results");
  if (!target) return;
  let box = target.querySelector(":scope > .request-error");
  if (!box) {
    box = document.createElement("p");
    box.className = "error request-error";
    box.setAttribute("role", "alert");
    target.prepend(box);
  }
  box.textContent = messageFor(evt.detail && evt.detail.xhr);
}

document.addEventListener("htmx:responseError", showRequestError);
document.addEventListener("htmx:sendError", showRequestError);

// ------------------------------------------------------------------ the latest setting wins
//
// Forms sync with hx-sync="...:queue last": a change made while a request is in flight waits
// for it, then is sent with the values the controls have *then*. Swapping the in-flight
// (already stale) answer first would reset the radios inside the results (layer, head) and so
// lose a click made meanwhile; so an answer is swapped only if no request was triggered after
// it. (hx-sync "replace" would abort instead, which htmx logs as a console error; the server
// would finish the aborted computation all the same.)

let triggered = 0;
document.addEventListener("htmx:confirm", function () { triggered += 1; });

// A head picked in a long text: its whole pattern is being read and painted (explorer-draw.js); the
// form's request goes once that is on screen (or after HEAD_WAIT_MS), not beside it.
const HEAD_WAIT_MS = 400;
document.addEventListener("htmx:confirm", function (evt) {
  const reading = headBeingRead();
  const cause = evt.detail && evt.detail.triggeringEvent;
  if (!reading || !cause || !cause.target || !cause.target.matches || !cause.target.matches("input[name=head]")) return;
  evt.preventDefault();
  const go = function () { evt.detail.issueRequest(true); };
  Promise.race([reading, new Promise(function (resolve) { setTimeout(resolve, HEAD_WAIT_MS); })]).then(go, go);
});
document.addEventListener("htmx:beforeRequest", function (evt) {
  if (evt.detail.xhr) evt.detail.xhr._explorerSeq = triggered;
});
document.addEventListener("htmx:beforeSwap", function (evt) {
  const xhr = evt.detail.xhr;
  if (xhr && xhr._explorerSeq !== undefined && xhr._explorerSeq < triggered && !evt.detail.isError) {
    evt.detail.shouldSwap = false;
  }
  const source = evt.detail.requestConfig && evt.detail.requestConfig.elt;
  const swap = source && source.closest && source.closest("[hx-swap]");
  const morph = swap && swap.getAttribute("hx-swap").startsWith("morph");
  if (evt.detail.shouldSwap && evt.detail.target && !morph) keepPlots(evt.detail.target);
});

// old's children become next's: a child equal to the one at its place stays, another is replaced,
// the rest appended or removed.
function mergeByPosition(old, next) {
  const want = Array.from(next.childNodes);
  const have = Array.from(old.childNodes);
  for (let k = 0; k < want.length; k++) {
    if (k >= have.length) {
      old.append(...want.slice(k));
      break;
    }
    if (!have[k].isEqualNode(want[k])) have[k].replaceWith(want[k]);
  }
  for (let k = want.length; k < have.length; k++) have[k].remove();
}

// A morphing swap (idiomorph, hx-swap="morph") keeps every element that is still there: a drawn
// plot takes its successor's attributes (its new figure data) and keeps its drawing, which
// drawAll then updates; its own children (Plotly's SVG, the labels) are not touched.
if (window.Idiomorph) {
  Idiomorph.defaults.callbacks.beforeNodeMorphed = function (old, next) {
    // A long list (a long text's token chips, data-morph-whole) is merged position by position:
    // idiomorph matching a thousand unlabelled siblings one by one takes ~0.5 s, and replacing them
    // all would lay out a thousand chips again for a key typed at the end.
    if (old.nodeType === 1 && next.nodeType === 1 && old.hasAttribute("data-morph-whole")) {
      if (!old.isEqualNode(next)) {
        copyAttributes(next, old);
        mergeByPosition(old, next);
      }
      return false;
    }
    if (old.nodeType !== 1 || !old.hasAttribute("data-figure") || !P.isDrawn(old)) return true;
    if (next.nodeType !== 1 || !next.hasAttribute("data-figure")) return true;
    copyAttributes(next, old);
    old._explorerFigure = null;
    return false;
  };
}

// A head's card looks switched off as soon as its "ablate" box is ticked (the server's answer says so too).
document.addEventListener("change", function (evt) {
  const box = evt.target;
  if (box.matches && box.matches(".head input[name=ablate]")) box.closest(".head").classList.toggle("ablated", box.checked);
});

// Text and number boxes send their own request on input; the "change" they fire on blur would
// send the same values again through the form, so it stops here.
document.addEventListener("change", function (evt) {
  const t = evt.target;
  if (t.matches && t.matches("textarea[hx-trigger], input[type=number][hx-trigger]")) evt.stopPropagation();
}, true);

// ------------------------------------------------------------------ typing: first key at once, then paced

// A text box with `data-debounce-ms` is sent (its "explorer:edit" event, which its hx-trigger
// names) at once when a key follows a pause of that long, and otherwise that long after the
// last key: one request per pause in typing, and no wait for the first key after reading.
document.addEventListener("input", function (evt) {
  const box = evt.target;
  if (!box.hasAttribute || !box.hasAttribute("data-debounce-ms")) return;
  const wait = Number(box.getAttribute("data-debounce-ms")) || 0;
  const now = performance.now();
  clearTimeout(box._explorerTimer);
  const send = function () {
    box._explorerTimer = null;
    box._explorerLastSend = performance.now();
    if (box.value === box._explorerSent) return;  // e.g. a letter typed and deleted
    box._explorerSent = box.value;
    htmx.trigger(box, "explorer:edit");
  };
  if (!box._explorerTimer && now - (box._explorerLastSend || -Infinity) >= wait) send();
  else box._explorerTimer = setTimeout(send, wait);
});

// ------------------------------------------------------------------ htmx lifecycle

// The start, called once by explorer.js before htmx loads the page's body (which load() then draws).
let started = false;
export function start() {
  if (started) return;
  started = true;
  document.addEventListener("htmx:beforeCleanupElement", function (evt) {
    const el = evt.target;
    if (!el.hasAttribute || !el.hasAttribute("data-figure")) return;
    if (P.isDrawn(el)) Plotly.purge(el);
  });
  // printing (or saving as PDF) shows the whole page at once: draw whatever is still waiting
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("[data-figure]").forEach(function (el) { if (el._explorerPending) draw(el); });
  });
}

// What htmx loaded (htmx.onLoad: the page's body, then each swapped-in part) is drawn.
export function load(root) {
  syncClassroom();
  syncTyped(root);
  drawAll(root);
}

// A text box's text as the page was drawn with it has been sent; text typed before these modules
// came (a long page loads for a while) is sent now, once htmx has taken the box in.
function syncTyped(root) {
  const boxes = root.matches && root.matches("[data-debounce-ms]") ? [root] : [];
  if (root.querySelectorAll) boxes.push(...root.querySelectorAll("[data-debounce-ms]"));
  boxes.forEach(function (box) {
    if (box._explorerSent !== undefined) return;
    box._explorerSent = box.defaultValue;
    if (box.value !== box.defaultValue) {
      box._explorerSent = box.value;
      htmx.trigger(box, "explorer:edit");
    }
  });
}
