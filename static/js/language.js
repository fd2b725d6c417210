// The header's BM / EN switch (templates/base.html). The server writes each link as the page's URL in
// that language, but htmx moves the address bar on (hx-push-url) without redrawing the header: so at
// the moment of a click the link is pointed at the address bar's current URL, with its `lang` set.
// Without JavaScript the server's link still works (the state it was rendered with).
document.addEventListener("click", function (evt) {
  const link = evt.target.closest && evt.target.closest("a[data-language]");
  if (!link) return;
  const url = new URL(window.location.href);
  url.searchParams.set("lang", link.dataset.language);
  link.href = url.pathname + url.search + url.hash;
});
