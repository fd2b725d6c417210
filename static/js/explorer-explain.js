// The explorer's next-token bars (templates/explorer.html): a click on a bar opens the attribution page for that
// token, as its link under the figure does (#next-token-explain a[data-bar=i]: the keyboard's way there).
document.addEventListener("explorer:drawn", function (evt) {
  const el = evt.target;
  if (!el.closest || !el.closest("#next-token") || el._explainClick) return;
  el._explainClick = true;
  el.on("plotly_click", function (ev) {
    const point = ev.points && ev.points[0];
    const link = point && document.querySelector('#next-token-explain a[data-bar="' + point.pointIndex + '"]');
    if (link) link.click();
  });
});
