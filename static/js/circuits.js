// The circuits page (templates/circuits.html): a click on a grid whose rows or columns are heads picks that
// head, as choosing it in the form's Layer and Head would. The figures are drawn by explorer.js, which fires
// "explorer:drawn" on each plot once it is drawn; a plot is kept across htmx swaps, so the grid it now sits in
// (its `data-pick` wrapper: what its rows and columns are) is read at the click, not when it was drawn.

// [layer, head] of the cell at row i, column j of a grid of this kind, or null
function headAt(box, i, j) {
  const kind = box.getAttribute("data-pick");
  const nHeads = Number(box.getAttribute("data-n-heads")) || 1;
  if (kind === "heads") return [i, j];  // rows are layers, columns heads
  if (kind === "head-rows") return [Math.floor(i / nHeads), i % nHeads];  // rows L0H0, L0H1, ...
  if (kind === "composition") return [Math.floor(i / nHeads) + 1, i % nHeads];  // rows: the heads from layer 1 on
  return null;
}

function choose(layer, head) {
  const form = document.getElementById("circuits");
  if (!form) return;
  form.elements.layer.value = String(layer);
  form.elements.head.value = String(head);
  if (form.elements.key) form.elements.key.value = "";  // the new head's own favourite key
  form.requestSubmit();
}

document.addEventListener("explorer:drawn", function (evt) {
  const el = evt.target;
  if (!el.closest || !el.closest("#circuits") || el._circuitsPick) return;
  el._circuitsPick = true;
  el.on("plotly_click", function (ev) {
    const point = ev.points && ev.points[0];
    const box = el.closest("[data-pick]");
    if (!point || !point.pointIndex || !box) return;
    const pick = headAt(box, point.pointIndex[0], point.pointIndex[1]);
    if (pick) choose(pick[0], pick[1]);
  });
});

// explorer-draw.js (copyAttributes) gives a plot it keeps across a swap the new element's attributes, class
// included, which drops Plotly's own "js-plotly-plot": Plotly's stylesheet needs it to stack the plot's
// layers, so a kept plot whose data did not change (it is not redrawn: a composition grid when another head
// is picked) stops answering clicks. Until it keeps that class itself, it is put back here.
document.addEventListener("htmx:afterSettle", function () {
  document.querySelectorAll("#circuits [data-figure]").forEach(function (el) {
    if (el._circuitsPick && !el.classList.contains("js-plotly-plot")) el.classList.add("js-plotly-plot");
  });
});
