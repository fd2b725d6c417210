"""The /train page's sae form: every architecture with its own settings (their bounds the API's schema's, their
defaults the recipe's), and a form sent with every field (as a browser without JavaScript sends it) starts the run
of the chosen architecture's settings only, the same run as the API's request."""

from __future__ import annotations

import re
import time
from urllib.parse import parse_qs, urlparse

import pytest

JUMPRELU = {"l0_coefficient": "1.0", "jumprelu_init_threshold": "0.01", "jumprelu_bandwidth": "0.05"}


def _field(html: str, name: str) -> str:
    """The <div class="field"> holding input `name`."""
    match = re.search(rf'<div class="field inline"[^>]*>\s*<label for="train-{name}">.*?</div>', html, re.S)
    assert match, name
    return match.group(0)


def test_the_sae_form_offers_jumprelu_with_its_own_settings(client):
    html = client.get("/train?recipe=sae").text
    assert re.search(r'<option value="jumprelu"\s*>jumprelu</option>', html)
    limits = client.get("/openapi.json").json()["components"]["schemas"]["TrainRequest"]["properties"]
    for name, default in JUMPRELU.items():
        field = _field(html, name)
        assert 'data-architecture="jumprelu"' in field
        assert f'value="{float(default)}"' in field  # the recipe's default (SAELens's), in view
        assert float(re.search(r'max="([^"]+)"', field).group(1)) == limits[name]["anyOf"][0]["maximum"]
        assert f"null: {float(default):g} (SAELens's default)" in limits[name]["description"]  # the API says it
    assert 'min="0"' not in _field(html, "jumprelu_bandwidth")  # above 0, not from 0: the schema's exclusiveMinimum
    assert 'data-architecture="topk"' in _field(html, "k")
    assert 'data-architecture="standard"' in _field(html, "l1_coefficient")
    assert "data-architecture" not in _field(html, "d_sae")  # every architecture's
    chosen = client.get("/train?recipe=sae&architecture=jumprelu").text
    assert re.search(r'<option value="jumprelu"\s*selected>', chosen)


def test_a_jumprelu_form_sends_its_own_settings_only(client_with, tmp_path):
    c = client_with(runs_dir=tmp_path / "runs")
    small = {"recipe": "sae", "architecture": "jumprelu", "d_sae": "16", "steps": "2", "batch_size": "8"}
    form = small | {"k": "16", "l1_coefficient": "1.0", "l0_coefficient": "0.5", "jumprelu_bandwidth": "0.1"}
    r = c.post("/train", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    id = parse_qs(urlparse(r.headers["location"]).query)["run"][0]
    api = c.post(
        "/api/v1/train",
        json={k: v for k, v in small.items()}
        | {"d_sae": 16, "steps": 2, "batch_size": 8}
        | {"l0_coefficient": 0.5, "jumprelu_bandwidth": 0.1},
    )
    assert api.json()["id"] == id  # the API's request of those settings: the same run
    deadline = time.monotonic() + 60
    while (run := c.get(f"/api/v1/runs/{id}").json())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    config = run["config"]
    assert (config["architecture"], config["k"], config["l1_coefficient"]) == ("jumprelu", None, None)
    assert (config["l0_coefficient"], config["jumprelu_bandwidth"], config["jumprelu_init_threshold"]) == (
        0.5,
        0.1,
        0.01,
    )


@pytest.mark.parametrize(
    "field, value, says",
    [("jumprelu_bandwidth", "0", "jumprelu_bandwidth"), ("l0_coefficient", "101", "l0_coefficient")],
)
def test_a_jumprelu_setting_out_of_bounds_is_said_on_the_form(client, field, value, says):
    r = client.post("/train", data={"recipe": "sae", "architecture": "jumprelu", field: value})
    assert r.status_code == 422 and says in r.text and 'id="train-error"' in r.text
