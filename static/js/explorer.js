// The explorer's entry point, the one script templates/base.html loads for it: a classic deferred
// script (so every page's HTML stays as it was) that loads the explorer's ES modules with a dynamic
// import() of explorer-main.js (the module layout is listed there). No bundler and no inline
// script: import() of a same-origin file is allowed by the pages' CSP (script-src 'self').
//
// The start: htmx fires its first "htmx:load" (the page's body) a task after DOMContentLoaded, and
// the modules arrive whenever the network brings them, before or after it. So the htmx.onLoad
// listener is registered here, as this script runs (like the single explorer.js before it: after
// htmx and Plotly, before DOMContentLoaded); it keeps the roots htmx loads until the modules are
// there, then main.start() draws those and main.load() each one after. Nothing is drawn twice,
// and the module graph is evaluated once (the browser's module map).
(function () {
  "use strict";

  // resolved against this script's own URL, whatever the page's
  const MAIN = new URL("explorer-main.js", document.currentScript.src).href;

  let main = null;
  const early = [];  // roots htmx loaded before the modules arrived

  function listen() {
    htmx.onLoad(function (root) {
      if (main) main.load(root);
      else early.push(root);
    });
  }

  if (window.htmx) listen();
  else document.addEventListener("DOMContentLoaded", listen);

  import(MAIN).then(function (module) {
    main = module;
    main.start(early.splice(0));
  }, function (err) {
    console.error("explorer.js: the explorer's modules did not load (" + MAIN + "); figures are not drawn.", err);
  });
})();
