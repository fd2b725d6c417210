"""The model the explorer and Inspect open on: the product's choice (settings.default_model) is the
induction model trained here, opened on its induction head, so a newcomer's first view is a head that
training made mean something; a server that cannot run the chosen model opens on the toy.
(The rest of the tests open on the toy: tests/conftest.py sets EXPLORER_DEFAULT_MODEL.)"""

from __future__ import annotations

import html
import re

import numpy as np

from app.settings import Settings
from tests.pages.figure_data import cards


def selected_model(page: str) -> str:
    return re.search(r'<option value="([^"]+)" selected', page).group(1)


def test_the_product_opens_on_the_trained_induction_model():
    assert Settings.model_fields["default_model"].default == "induction"


def test_the_explorer_opens_on_the_induction_head_of_the_trained_model(client_with, catalog):
    client = client_with(default_model="induction")
    page = client.get("/").text
    model = catalog["induction"]
    assert selected_model(page) == "induction"
    assert model.default_text in html.unescape(page)
    layer, head = model.default_head
    assert layer == model.cfg.n_layers - 1  # an induction head needs a previous-token head before it
    assert client.get("/", params={"layer": layer, "head": head}).text == page  # the same view, spelled out
    # (that it is the model's best induction head: tests/api/test_trained_models_api.py)
    # and the heatmap drawn is that head's pattern
    weights = cards(page)["stage-weights"]["data"][0]["z"]
    run = client.post(
        "/api/v1/run",
        json={"model": "induction", "text": model.default_text, "hooks": [f"blocks.{layer}.attn.hook_pattern"]},
    ).json()
    # (the model's weights are float32: the API writes each number's shortest float32 spelling)
    pattern = np.array(run["hooks"][f"blocks.{layer}.attn.hook_pattern"], dtype=np.float32)[head]
    np.testing.assert_array_equal(np.array(weights, dtype=float).astype(np.float32), pattern)


def test_inspect_opens_on_the_same_model(client_with):
    page = html.unescape(client_with(default_model="induction").get("/inspect").text)
    assert re.search(r'<span class="config">induction · “Ali makan', page)


def test_a_default_model_this_server_cannot_run_falls_back_to_the_toy(client_with):
    client = client_with(default_model="no-such-model")
    r = client.get("/")
    assert r.status_code == 200 and selected_model(r.text) == "toy"
    assert "unknown model" not in r.text  # the server's choice is not the learner's error
