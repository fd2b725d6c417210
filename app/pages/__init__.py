"""The HTML face: the Jinja environment, htmx render helper and page state (web.py), figures as
Plotly dicts (figures.py), the NumPy snippets the lessons show (snippets.py), the explorer's figures
for a notebook (notebook.py), and the page routers (explorer, lessons, inspect, train, classroom: the live
class's pages, and docs.py: Swagger UI over /openapi.json, offline).

May import: `app.service`, `app.api.requests` (the API's request models validate a page's state, so
both faces share one set of limits), `app.http`'s JSON, error, client and language helpers, `app.deps`, `app.settings`,
`app.paths`. Never `core`, `app.models` or `app.training`.
"""
