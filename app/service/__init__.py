"""The service layer: what the JSON API and the pages both show, prepared once per view.

One `Service` per request (app/deps.py) holds the model catalogue and the settings and offers each
domain's views: `views` (a run's activations, the explorer), `inspect` (looking inside a run),
`lessons` (the spec's lessons), `training` (training runs), `generation` (writing with a model);
`calculators` needs neither catalogue nor settings and is a module of functions; `capabilities`
answers what a model can do (write, give gradients, be patched, be decomposed) and why not, for every
view that asks. Each view takes a typed `RunSpec` (what to run) and its own arguments, checks the cost
against the limits *before* computing, prepares the model once (tokens, config, weights), asks core
for the numbers and returns a plain dataclass with token strings resolved. No JSON, no HTML: the
faces (app/api/, app/pages/) format.

Bad input raises core's InputError with a message a learner can act on (app/http/errors.py: 422);
anything else that escapes is a bug (500). ARCHITECTURE.md follows one request through here.

The run's knobs (the toggles a request may set) are declared once, in app/models/knobs.py, and
re-exported here (`knobs`, and its class `Knobs`) for the faces.

May import: `core`, `app.models` (the catalogue), `app.training` (the training store) and
`app.settings`. Never the faces or the HTTP plumbing.
"""

from __future__ import annotations

from app.models import knobs
from app.models.catalog import Catalog, Model
from app.models.knobs import Knobs
from app.service import calculators
from app.service.attribution import AttributionViews
from app.service.circuits import CircuitViews
from app.service.errors import NotFound, Unavailable
from app.service.features import FeatureViews
from app.service.generation import GenerationViews
from app.service.inspect import InspectViews
from app.service.lessons import Lessons
from app.service.limits import Limits
from app.service.spec import AblatedHead, Method, RunSpec
from app.service.steering import SteeringViews
from app.service.training import TrainingService
from app.service.views import ModelViews
from app.settings import Settings
from app.training.base import FINISHED, RUN_ID_MAX_LENGTH, RUN_ID_MIN_LENGTH, RUN_ID_PATTERN, STATUSES, TrainingRunInfo
from core import InputError

__all__ = [
    "FINISHED",
    "STATUSES",
    "AblatedHead",
    "InputError",
    "Knobs",
    "Method",
    "Model",
    "NotFound",
    "RUN_ID_MAX_LENGTH",
    "RUN_ID_MIN_LENGTH",
    "RUN_ID_PATTERN",
    "RunSpec",
    "Service",
    "TrainingRunInfo",
    "Unavailable",
    "calculators",
    "knobs",
]


class Service:
    """The catalogue and the limits one request is served with, and each domain's views on them."""

    def __init__(self, catalog: Catalog, settings: Settings):
        self.catalog = catalog
        self.settings = settings
        self.limits = Limits(settings)
        self.views = ModelViews(catalog, settings, self.limits)
        self.inspect = InspectViews(self.views)
        self.circuits = CircuitViews(self.views)  # patching, QK and OV circuits, composition
        self.features = FeatureViews(self.views)  # sparse autoencoders' features and dashboards
        self.attribution = AttributionViews(self.views)  # token attribution, direct logit by head and source
        self.lessons = Lessons(catalog, self.limits)
        self.training = TrainingService(catalog, settings)
        self.generation = GenerationViews(self.views)
        self.steering = SteeringViews(self.views)  # steered runs, steering vectors (generation steers through it)

    @property
    def preparations(self) -> int:
        """Models prepared (weights loaded) for this request: one per view."""
        return self.views.preparations
