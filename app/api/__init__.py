"""The JSON face: request models with their limits (requests.py; pages validate their state with
them too), response models read from the service's results (responses.py; circuit_models.py and
generation_models.py hold both for the circuits and generation), the REST API's routes under /api/v1
(routes/, one module per resource, with its own import rules), and health and readiness (health.py).

May import: `app.service` (what to compute), `app.http` (writing answers, who is asking), `app.deps`,
`app.settings`, `app.paths`. Never the pages, and never `core` (except requests.py and
responses.py, which state core's own defaults, constants and config type, so each is written once),
`app.models` or `app.training`: routes format, the service prepares, core computes.
"""
