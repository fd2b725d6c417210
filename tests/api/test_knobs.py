"""A knob added to the declaration (app/models/knobs.py, the class Knobs) is everywhere a toggle is: the
API's schema with its limit from the settings, what the API refuses and runs, the explorer's state from its
URL, its form.

The classes that inherit the declaration (RunSpec, the requests, the explorer's state) are made when their
modules are imported, so the knob is added in a fresh interpreter before the app is imported: there,
app/models/knobs.py is read with one line added to the class Knobs, as if it had been written there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.api import requests
from app.models import knobs

REPO = Path(__file__).resolve().parents[2]

# The hidden width of the MLP as a run toggle: a size of the toy's config, bounded by a setting.
PROBE = """
import ast, importlib.abc, importlib.util, json, re, sys
from pathlib import Path
from starlette.datastructures import QueryParams

FIELD = (
    '    d_mlp: Annotated[int | None, Field(ge=1, description="hidden width of each MLP"), Limit("le", "max_d_mlp"), '
    'Knob("size", "MLP width", config="d_mlp")] = None'
)
PATH = Path("app/models/knobs.py")
source = PATH.read_text(encoding="utf-8")
knobs_class = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Knobs")
lines = source.splitlines()
lines.insert(knobs_class.end_lineno, FIELD)  # the class's last line, then the new field


class WithTheField(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self, origin=str(PATH)) if name == "app.models.knobs" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile("\\n".join(lines), str(PATH), "exec"), module.__dict__)


sys.meta_path.insert(0, WithTheField())

from fastapi.testclient import TestClient
from app.main import create_app
from app.pages import web
from app.service import RunSpec
from app.settings import Settings

out = {"spec_fields": list(RunSpec.__dataclass_fields__)}
with TestClient(create_app(Settings(max_d_mlp=48))) as c:
    out["schema"] = c.get("/openapi.json").json()["components"]["schemas"]["RunRequest"]["properties"]["d_mlp"]
    out["toy_toggles"] = next(m["toggles"] for m in c.get("/api/v1/models").json()["models"] if m["name"] == "toy")
    r = c.post("/api/v1/run", json={"model": "toy", "text": "hi", "d_mlp": 32})
    out["ran"] = [r.status_code, r.json()["config"]["d_mlp"]]
    r = c.post("/api/v1/run", json={"model": "toy", "text": "hi", "d_mlp": 49})
    out["refused"] = [r.status_code, r.json()["detail"][0]["msg"]]
    r = c.post("/api/v1/run", json={"model": "all-MiniLM-L6-v2", "text": "hi", "d_mlp": 32})
    out["checkpoint"] = [r.status_code, r.json()["detail"][0]["msg"]]
    parsed = web.parse_explorer(QueryParams("model=toy&d_mlp=32&n_layers=1"), c.app.state.catalog, preferred="toy")
    out["state"] = {"controls": parsed.controls.d_mlp, "given": parsed.given, "defaults": parsed.defaults["d_mlp"],
                    "url": web.explorer_query(parsed), "errors": parsed.errors}
    bad = web.parse_explorer(QueryParams("model=toy&d_mlp=wide"), c.app.state.catalog, preferred="toy")
    out["bad"] = bad.errors
    page = c.get("/", params={"model": "toy", "d_mlp": 32})
    out["page"] = [page.status_code, re.sub(r"\\s+", " ", re.search(r'<input[^>]*id="d_mlp"[^>]*>', page.text).group(0)),
                   "d_mlp 32" in page.text]
    too_wide = c.get("/", params={"model": "toy", "d_mlp": 49})
    out["page_refused"] = [too_wide.status_code, "d_mlp: Input should be less than or equal to 48" in too_wide.text]
print(json.dumps(out))
"""


def test_an_added_knob_reaches_the_api_the_page_state_and_the_form():
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "EXPLORER_ACCESS_LOG": "false", "EXPLORER_TRAIN_WORKERS": "0"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert "d_mlp" in out["spec_fields"]  # the service's RunSpec
    # the API's schema: the knob's type, bound, description, and its limit from the app's settings
    assert out["schema"] == {
        "anyOf": [{"type": "integer", "minimum": 1, "maximum": 48}, {"type": "null"}],
        "title": "D Mlp",
        "description": "hidden width of each MLP",
    }
    assert "d_mlp" in out["toy_toggles"]  # a toy takes every knob
    assert out["ran"] == [200, 32]  # configure() set the config field
    assert out["refused"] == [422, "d_mlp: Input should be less than or equal to 48"]
    assert out["checkpoint"][0] == 422 and "does not accept d_mlp" in out["checkpoint"][1]  # trained weights: no
    # the explorer's state from its URL, and the shortest URL back (in the form's order: the end of its group)
    assert out["state"] == {
        "controls": 32,
        "given": {"n_layers": 1, "d_mlp": 32},
        "defaults": 256,
        "url": "/?n_layers=1&d_mlp=32",
        "errors": [],
    }
    assert out["bad"] == ["d_mlp='wide' is not a whole number"]
    # the form: a number input in the model-shape fieldset, bounded by the settings' limit
    status, control, shown = out["page"]
    assert status == 200 and shown
    assert control == (
        '<input type="number" id="d_mlp" name="d_mlp" value="32" min="1" max="48" step="1" '
        'inputmode="numeric" hx-get="/" hx-trigger="input changed delay:400ms" >'
    )
    assert out["page_refused"] == [422, True]


def test_the_declared_knobs_are_the_run_requests_toggles(client):
    """Without the extra knob: the API's run request has exactly the declared knobs beside its own fields."""
    props = client.get("/openapi.json").json()["components"]["schemas"]["RunRequest"]["properties"]
    assert list(props) == ["model", "text", *knobs.names(), "ablate", "steer", "frozen_attention", "hooks", "top_k"]
    toy = next(m for m in client.get("/api/v1/models").json()["models"] if m["name"] == "toy")
    assert tuple(toy["toggles"]) == knobs.names()


def test_the_requests_that_take_some_knobs_take_them_as_declared():
    """CompareSide and HooksQuery name the knobs they take (by their types in app/models/knobs.py): the second
    side of a comparison every knob that keeps the model's shape, the hooks query those that decide which
    activations exist. Their fields are the declared ones, with the same validation."""
    assert [n for n in requests.CompareSide.model_fields if n not in ("text", "ablate")] == [
        k.name for k in knobs.KNOBS if not k.reshapes
    ]
    for request in (requests.CompareSide, requests.HooksQuery):
        for name, field in request.model_fields.items():
            if name in knobs.names():
                assert field.annotation == requests.ModelRequest.model_fields[name].annotation
                assert field.metadata == requests.ModelRequest.model_fields[name].metadata
