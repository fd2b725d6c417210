"""The REST API's routes under /api/v1, one module per resource: `lessons` (the spec's lessons),
`models` (the models, their hooks, parameter and KV-cache calculators), `run` (a model on a text),
`analysis` (looking inside a run, token attribution), `circuits` (patching and the QK/OV circuits), `saes` (sparse
autoencoders and their features), `generate` (writing with a model), `training` (training runs) and
`classes` (live classes). `shared` holds what they all use: the router each starts from, `respond()`
and the one table of error answers.

A route validates its request model (app/api/requests.py, circuit_models.py, generation_models.py, sae_models.py,
attribution_models.py),
asks the service (app/service/), reads the result into its response model (app/api/responses.py and
the same modules; `from_attributes`) and sends it with orjson (app/http/jsonio.py: arrays straight
from NumPy, -inf and NaN as null); an event stream is framed by app/http/sse.py. A route that computes
is a plain `def`, so FastAPI runs it in its threadpool and NumPy work never blocks the event loop (the
two streams are `async` and send their NumPy work to a thread themselves). Routes format; they do
not compute, and they never import each other's names.

May import: the API's request and response models (`app.api.requests`, `app.api.responses`,
`app.api.circuit_models`, `app.api.generation_models`, `app.api.sae_models`, `app.api.class_models`,
`app.api.attribution_models`),
`app.service`, `app.http.jsonio`, `app.http.sse`, `app.http.security` (who is asking), `app.deps`. Never
`app.api.health`, the pages or `core`.
"""

from __future__ import annotations

from app.api.routes import analysis, circuits, classes, generate, lessons, models, run, saes, training

# In this order in the OpenAPI document (its paths are listed as the routers are included).
ROUTERS = (
    lessons.router,
    models.router,
    run.router,
    analysis.router,
    training.router,
    circuits.router,
    saes.router,
    generate.router,
    classes.router,
)
