"""The JSON face: request models with their limits (requests.py; pages validate their state with
them too), response models read from the service's results (responses.py), the REST API's routes
under /api/v1 (routes.py), health and readiness (health.py) and the offline API docs (docs.py).

May import: `app.service` (what to compute), `app.http.jsonio` and `app.http.errors` (writing
answers), `app.deps`, `app.settings`, `app.paths`, and `app.pages.web` for the docs page's template.
Never `core` (except requests.py and responses.py, which state core's own defaults, constants and
config type, so each is written once), `app.models` or `app.training`: routes format, the service
prepares, core computes.
"""
