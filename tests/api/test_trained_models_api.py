"""The trained models that ship with core (core/trained) through the app: listed as trained models,
their heads found by the detectors on /api/v1 and /inspect, the explorer opening on a head that means
something."""

from __future__ import annotations

import html
import re

import pytest

REPEATED = "Ali makan nasi lemak. Ali makan nasi lemak."


def test_the_shipped_models_are_listed_as_trained(client):
    models = {m["name"]: m for m in client.get("/api/v1/models").json()["models"]}
    for name in ("induction", "nasi-lemak", "python-docs"):
        assert models[name]["kind"] == "trained" and models[name]["runnable"], models[name]
    assert models["induction"]["config"]["attn_only"] and models["induction"]["default_text"] == REPEATED


def test_the_detectors_find_the_induction_models_heads_on_a_learners_text(client):
    r = client.post("/api/v1/analysis/detectors", json={"model": "induction", "text": REPEATED, "threshold": 0.4})
    assert r.status_code == 200, r.text
    flagged = {(f["detector"], f["on"], f["layer"]) for f in r.json()["flagged"]}
    assert ("previous_token", "text", 0) in flagged  # layer 0 looks at the token before
    assert ("induction", "text", 1) in flagged and ("induction", "random", 1) in flagged  # layer 1 looks back
    page = client.get("/inspect", params={"view": "detectors", "model": "induction", "text": REPEATED})
    assert page.status_code == 200 and "Induction heads" in page.text and "L1H" in page.text


@pytest.mark.parametrize(("model", "detector"), [("induction", "induction"), ("python-docs", "previous_token")])
def test_the_explorer_opens_a_trained_model_on_the_head_its_recipe_teaches(client, model, detector):
    """The induction model on its best induction head, the text model on its clearest previous-token
    head: the head whose detector score on the model's default text is highest."""
    page = client.get("/", params={"model": model})
    assert page.status_code == 200
    m = re.search(r'<h2 id="attn-title">Attention, layer (\d+) head (\d+)</h2>', page.text)
    text = html.unescape(re.search(r'<textarea[^>]*name="text"[^>]*>([^<]*)</textarea>', page.text).group(1))
    detectors = client.post("/api/v1/analysis/detectors", json={"model": model, "text": text}).json()
    scores = detectors["detectors"][detector]["text"]  # [n_layers][n_heads]
    best = max(
        ((layer, head) for layer in range(len(scores)) for head in range(len(scores[0]))),
        key=lambda lh: scores[lh[0]][lh[1]] or -1,
    )
    assert (int(m.group(1)), int(m.group(2))) == best
    assert scores[best[0]][best[1]] > 0.5  # a head that means something, not the best of noise


def test_the_nasi_lemak_model_makes_l_likely_after_nasi(client):
    top = client.post("/api/v1/run", json={"model": "nasi-lemak", "text": "nasi ", "top_k": 1}).json()["top_k"]
    assert top[0]["token"] == "l" and top[0]["prob"] > 0.9
