// The lesson pages' one behaviour of their own: the snippet's Copy button.
// (Figures, downloads and errors are static/js/explorer.js's, shared with the explorer.)
// A `data-copy="#id"` button copies that element's text. The Clipboard API needs a secure context
// (https or localhost); on a classroom LAN over plain http the text is selected instead, so
// Ctrl+C copies it. No inline scripts: this file is loaded by templates/lessons/_layout.html.
(function () {
  "use strict";

  function say(button, message) {
    const status = button.parentElement && button.parentElement.querySelector(".copy-status");
    if (status) status.textContent = message;
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
        function () { say(button, "Copied"); },
        function () { selectText(source); say(button, "Selected: press Ctrl+C"); });
    } else {
      selectText(source);
      say(button, "Selected: press Ctrl+C");
    }
  });
})();
