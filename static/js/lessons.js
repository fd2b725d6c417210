// The lesson pages' one behaviour of their own: the snippet's Copy button.
// (Figures, downloads and errors are static/js/explorer.js's, shared with the explorer.) What it says
// comes in the page's language from the status line's data-copy-words (words.js).
// A `data-copy="#id"` button copies that element's text. The Clipboard API needs a secure context
// (https or localhost); on a classroom LAN over plain http the text is selected instead, so
// Ctrl+C copies it. No inline scripts: this file is loaded by templates/lessons/_layout.html.
import {say} from "./words.js";

function tell(button, message) {
  const line = button.parentElement && button.parentElement.querySelector(".copy-status");
  if (line) line.textContent = message;
}

function selectText(el) {
  const range = document.createRange();
  range.selectNodeContents(el);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

document.addEventListener("click", function (evt) {
  const button = evt.target.closest("[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.getAttribute("data-copy"));
  if (!source) return;
  evt.preventDefault();
  const text = source.textContent;
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(
      function () { tell(button, say("copy", "copied")); },
      function () { selectText(source); tell(button, say("copy", "selected")); });
  } else {
    selectText(source);
    tell(button, say("copy", "selected"));
  }
});
