// Transformer Explorer's one script: draws the server's figures and wires their downloads.
//
// - Every element with a `data-figure` attribute (Plotly figure JSON built by app/figures.py) is
//   drawn with Plotly.react whenever htmx loads content (first page load, swaps, history restores),
//   and purged when htmx removes it, so swapped-out plots leak nothing. (Reusing the old plots
//   with Plotly.react was measured: no faster than a new plot, since every label changes.)
// - The figure marked `data-draw-first` (the selected head's softmax weights) is drawn as soon as
//   the swap lands; the others follow one per task as they come near the viewport.
// - Buttons with `data-download="json"|"csv"` inside a `.figure` card download the data behind
//   that card's figure; PNG export is Plotly's own modebar button.
// - Failed requests that the server could not answer in place (busy, network down, 5xx) show a
//   message in the results area; 422s arrive as server-rendered HTML and are swapped like any page.
// - The "classroom" checkbox switches the projector-friendly size at once (its state also goes
//   into the URL with the rest of the form).
// No inline scripts anywhere, so the pages run under a strict Content-Security-Policy.
(function () {
  "use strict";

  const CLASSROOM_FONT_SCALE = 1.3;

  function isClassroom() {
    return document.body.classList.contains("classroom");
  }

  function readFigure(el) {
    if (!el._explorerFigure) {
      el._explorerFigure = JSON.parse(el.getAttribute("data-figure"));
    }
    return el._explorerFigure;
  }

  function scaledFont(font, factor) {
    const out = Object.assign({}, font || {});
    if (out.size) out.size = Math.round(out.size * factor);
    return out;
  }

  // The figure's own layout, with fonts enlarged in classroom mode and the element's height.
  function layoutFor(el, figure) {
    const layout = Object.assign({}, figure.layout || {});
    const factor = isClassroom() ? CLASSROOM_FONT_SCALE : 1;
    if (factor !== 1) {
      layout.font = scaledFont(layout.font, factor);
      if (layout.hoverlabel) layout.hoverlabel = Object.assign({}, layout.hoverlabel, {font: scaledFont(layout.hoverlabel.font, factor)});
      if (layout.margin) {
        // margins were sized for the labels at the normal font (app/figures.py)
        layout.margin = Object.fromEntries(Object.entries(layout.margin).map(function (kv) {
          return [kv[0], typeof kv[1] === "number" ? Math.round(kv[1] * factor) : kv[1]];
        }));
      }
    }
    layout.autosize = true;
    return layout;
  }

  function configFor(el, figure) {
    const name = (figure.export && figure.export.name) || "figure";
    if (el.hasAttribute("data-static")) {
      return {staticPlot: true, responsive: true, displayModeBar: false};
    }
    return {
      responsive: true,
      displaylogo: false,
      // Plotly 4 offers to upload the chart to its cloud by default: this app never sends data away.
      showSendToCloud: false,
      showEditInChartStudio: false,
      scrollZoom: false,
      // The PNG export stays (toImage); the rest of the bar is trimmed to what a learner needs.
      modeBarButtonsToRemove: ["sendChartToCloud", "select2d", "lasso2d", "autoScale2d", "toggleSpikelines",
        "hoverClosestCartesian", "hoverCompareCartesian"],
      toImageButtonOptions: {format: "png", filename: name, scale: 2},
    };
  }

  // Each heatmap cell's hover text, from the figure's "cell_text" pattern and its (already
  // escaped) tick labels: "query {i} {y} → key {j} {x}". Built here so the server sends n labels,
  // not n² strings.
  function withCellText(figure) {
    const pattern = figure.export && figure.export.cell_text;
    const layout = figure.layout || {};
    const xt = (layout.xaxis || {}).ticktext;
    const yt = (layout.yaxis || {}).ticktext;
    if (!pattern || !xt || !yt) return figure.data || [];
    return (figure.data || []).map(function (trace) {
      if (trace.type !== "heatmap" || trace.text || !trace.z) return trace;
      const text = yt.map(function (y, i) {
        return xt.map(function (x, j) {
          // replacement functions: a label such as "$&" must not be read as a replacement pattern
          return pattern.replace("{i}", function () { return i; }).replace("{y}", function () { return y; })
            .replace("{j}", function () { return j; }).replace("{x}", function () { return x; });
        });
      });
      return Object.assign({}, trace, {text: text});
    });
  }

  function draw(el) {
    let figure;
    try {
      figure = readFigure(el);
    } catch (err) {
      showFigureError(el, "This figure's data could not be read.");
      return;
    }
    const data = el.hasAttribute("data-static") ? (figure.data || []) : withCellText(figure);
    el._explorerPending = false;
    Promise.resolve(Plotly.react(el, data, layoutFor(el, figure), configFor(el, figure))).then(function () {
      // for scripts/explorer_latency.py and anyone waiting on a figure: its data is now on screen
      el.dispatchEvent(new CustomEvent("explorer:drawn", {bubbles: true}));
    });
  }

  // Figures are drawn when they come near the viewport (one screen ahead), not all at once: a
  // swap then costs only the figures a reader can see, and the rest draw as the page scrolls.
  // One figure per task, full-size figures first and thumbnails (data-static) last, so the
  // browser paints each heatmap as soon as it is drawn instead of after the whole batch.
  let queue = [];
  let pumping = false;
  function pump() {
    const el = queue.shift();
    if (el && el.isConnected && el._explorerPending) draw(el);
    if (queue.length) setTimeout(pump, 0);
    else pumping = false;
  }
  function enqueue(el) {
    if (el.hasAttribute("data-static")) queue.push(el);
    else {
      const firstThumb = queue.findIndex(function (q) { return q.hasAttribute("data-static"); });
      if (firstThumb < 0) queue.push(el);
      else queue.splice(firstThumb, 0, el);
    }
    if (!pumping) {
      pumping = true;
      setTimeout(pump, 0);
    }
  }

  const nearViewport = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (entry) {
      if (!entry.isIntersecting) return;
      nearViewport.unobserve(entry.target);
      if (entry.target.isConnected) enqueue(entry.target);
    });
  }, {rootMargin: "100% 0px"}) : null;

  // Printing (or saving as PDF) shows the whole page at once: draw whatever is still waiting.
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("[data-figure]").forEach(function (el) {
      if (el._explorerPending) {
        if (nearViewport) nearViewport.unobserve(el);
        draw(el);
      }
    });
  });

  function drawAll(root) {
    const els = [];
    if (root.matches && root.matches("[data-figure]")) els.push(root);
    if (root.querySelectorAll) els.push(...root.querySelectorAll("[data-figure]"));
    els.forEach(function (el) {
      el._explorerPending = true;
      if (el.hasAttribute("data-draw-first") || !nearViewport) draw(el);
      else nearViewport.observe(el);
    });
  }

  function showFigureError(el, message) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = message;
    el.replaceChildren(p);
  }

  // ------------------------------------------------------------------ downloads

  function csvCell(value) {
    if (value === null || value === undefined) return "";
    const s = String(value);
    return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }

  // The data behind a figure, with the raw (unescaped) labels the server put in `export`.
  function exportTable(figure) {
    const ex = figure.export || {};
    const trace = (figure.data || [])[0] || {};
    if (ex.kind === "matrix") {
      return {
        name: ex.name, x_title: ex.x_title, y_title: ex.y_title, value: ex.value,
        x: ex.x, y: ex.y, values: trace.z,
      };
    }
    if (ex.kind === "bars") {
      return {name: ex.name, x_title: ex.x_title, value: ex.value, x: ex.x, values: trace.x};
    }
    if (ex.kind === "series") {  // line charts: one (name, x, y) per line
      return {name: ex.name, x_title: ex.x_title, y_title: ex.y_title, series: ex.series};
    }
    return {name: ex.name || "figure", data: figure.data};
  }

  function toCsv(table) {
    const rows = [];
    if (table.y) {
      rows.push([table.y_title + " \\ " + table.x_title].concat(table.x));
      table.values.forEach(function (row, i) { rows.push([table.y[i]].concat(row)); });
    } else if (table.x) {
      rows.push([table.x_title, table.value]);
      table.x.forEach(function (label, i) { rows.push([label, table.values[i]]); });
    } else if (table.series) {
      // long format, one row per point: what a spreadsheet or pandas pivots or plots directly
      rows.push(["series", table.x_title, table.y_title]);
      table.series.forEach(function (s) {
        s.x.forEach(function (x, i) { rows.push([s.name, x, s.y[i]]); });
      });
    } else {
      rows.push(["data"], [JSON.stringify(table.data)]);
    }
    return rows.map(function (r) { return r.map(csvCell).join(","); }).join("\r\n") + "\r\n";
  }

  function save(filename, type, text) {
    const url = URL.createObjectURL(new Blob([text], {type: type}));
    const a = document.createElement("a");
    a.href = url;
    a.download = filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
  }

  document.addEventListener("click", function (evt) {
    const button = evt.target.closest("[data-download]");
    if (!button) return;
    const card = button.closest(".figure");
    const el = card && card.querySelector("[data-figure]");
    if (!el) return;
    evt.preventDefault();
    const table = exportTable(readFigure(el));
    if (button.getAttribute("data-download") === "csv") {
      save(table.name + ".csv", "text/csv", toCsv(table));
    } else {
      save(table.name + ".json", "application/json", JSON.stringify(table, null, 1));
    }
  });

  // ------------------------------------------------------------------ classroom size

  function syncClassroom() {
    const box = document.querySelector("input[name=classroom][type=checkbox]");
    if (!box) return;
    if (box.checked !== isClassroom()) {
      document.body.classList.toggle("classroom", box.checked);
      document.querySelectorAll("[data-figure]").forEach(draw);
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

  function messageFor(xhr) {
    if (!xhr || xhr.status === 0) return "The server could not be reached. Is it still running?";
    if (xhr.status === 503) return "The server is busy with other requests; change a setting again in a moment.";
    return "The server answered " + xhr.status + " " + (xhr.statusText || "") + ". Try another setting.";
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
  // it. (hx-sync "replace" would abort instead, which htmx logs as a console error.)

  let triggered = 0;
  document.addEventListener("htmx:confirm", function () { triggered += 1; });
  document.addEventListener("htmx:beforeRequest", function (evt) {
    if (evt.detail.xhr) evt.detail.xhr._explorerSeq = triggered;
  });
  document.addEventListener("htmx:beforeSwap", function (evt) {
    const xhr = evt.detail.xhr;
    if (xhr && xhr._explorerSeq !== undefined && xhr._explorerSeq < triggered && !evt.detail.isError) {
      evt.detail.shouldSwap = false;
    }
    // Drawn plots leave the old content before htmx cleans it up (htmx walks every element it
    // removes, and a plot is thousands of SVG nodes: ~70 ms a swap) and are purged after the new
    // content's first figure is drawn.
    if (evt.detail.shouldSwap && evt.detail.target) {
      evt.detail.target.querySelectorAll("[data-figure]").forEach(function (el) {
        if (!el._fullLayout) return;
        if (nearViewport) nearViewport.unobserve(el);
        el.replaceWith(document.createElement(el.tagName));
        setTimeout(function () { Plotly.purge(el); }, 0);
      });
    }
  });

  // Text and number boxes send their own debounced request on input; the "change" they fire on
  // blur would send the same values again through the form, so it stops here.
  document.addEventListener("change", function (evt) {
    const t = evt.target;
    if (t.matches && t.matches("textarea[hx-trigger], input[type=number][hx-trigger]")) evt.stopPropagation();
  }, true);

  // ------------------------------------------------------------------ htmx lifecycle

  function start() {
    htmx.onLoad(function (root) {
      syncClassroom();
      drawAll(root);
    });
    document.addEventListener("htmx:beforeCleanupElement", function (evt) {
      const el = evt.target;
      if (!el.hasAttribute || !el.hasAttribute("data-figure")) return;
      if (nearViewport) nearViewport.unobserve(el);
      if (el._fullLayout) Plotly.purge(el);
    });
  }

  if (window.htmx && window.Plotly) {
    start();
  } else {
    document.addEventListener("DOMContentLoaded", start);
  }
})();
