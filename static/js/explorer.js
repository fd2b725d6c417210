// The explorer's entry point (the figures of every page that extends templates/base.html): an ES
// module, loaded like every page script, <script type="module">, which the browser runs deferred, in
// document order, after htmx and Plotly (deferred scripts before it in base.html) and before
// DOMContentLoaded. htmx fires its first "htmx:load" (the page's body) after that, so the listener
// registered here sees every root htmx loads. The module layout is listed in explorer-main.js.
// No bundler and no inline script: same-origin modules pass the pages' CSP (script-src 'self').
import {start, load} from "./explorer-main.js";
import "./explorer-explain.js";

start();
htmx.onLoad(load);
