"""The /features page shows the API's numbers: the heatmap's cells are POST /api/v1/analysis/features'
activations (core's encode), a clicked token lists its top features, a clicked feature its dashboard; bad input
is said in place with 422; both languages."""

from __future__ import annotations

import re
from html import unescape

import numpy as np
import pytest

from core.sae import load_sae, save_sae
from tests.api.test_saes import HOOK, TEXT, _sae


@pytest.fixture(scope="module")
def saes_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("page-saes")
    save_sae(_sae(), root / "resid0")
    (root / "resid0" / "labels.json").write_text('[{"index": 3, "label": "a test label"}]')
    return root


@pytest.fixture(scope="module")
def web(saes_dir, tmp_path_factory):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings(saes_dir=saes_dir, runs_dir=tmp_path_factory.mktemp("runs")))
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c


def test_the_heatmap_cells_are_cores_activations(web, saes_dir):
    r = web.get("/features", params={"sae": "resid0", "model": "induction", "text": TEXT})
    assert r.status_code == 200, r.text
    x = web.post("/api/v1/run", json={"model": "induction", "text": TEXT, "hooks": [HOOK]}).json()["hooks"][HOOK]
    acts = load_sae(saes_dir / "resid0").encode(np.asarray(x))
    rows = re.findall(r'<tr><th scope="row"><a href="[^"]*feature=(\d+)[^"]*">.*?</tr>', r.text, re.S)
    assert rows, "no heatmap rows"
    peak = acts.max(axis=0)
    assert [int(f) for f in rows] == [int(i) for i in np.argsort(-peak, kind="stable")[: len(rows)]]
    first = re.search(r'<tr><th scope="row">.*?</tr>', r.text, re.S).group(0)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", first)
    want = [f"{v:.2f}" if v > 0 else "" for v in acts[:, int(rows[0])]]
    assert cells == want
    assert 'href="/features?' in r.text and "Features</a>" in r.text  # the nav links the page


def test_a_token_and_a_feature_open_their_panels(web):
    base = {"sae": "resid0", "model": "induction", "text": TEXT}
    r = web.get("/features", params={**base, "token": 2, "feature": 3})
    assert r.status_code == 200
    body = unescape(r.text)
    assert "Token 2" in body and "its top features" in body
    assert "Feature 3: a test label" in body
    d = web.get("/api/v1/saes/resid0/features/3").json()
    assert f"{d['density']:.4f}" in body
    for t in d["logit_effect"]["positive"]:
        assert f"{t['value']:.3f}" in body
    r = web.get("/features", params={**base, "q": "test"}, headers={"HX-Request": "true"})
    assert r.status_code == 200 and "#3 a test label" in unescape(r.text)
    assert r.headers["HX-Push-Url"].startswith("/features?") and "q=test" in r.headers["HX-Push-Url"]


@pytest.mark.parametrize(
    "params, says",
    [
        ({"sae": "nope"}, "unknown SAE"),
        ({"sae": "resid0", "model": "toy"}, "reads model"),
        ({"sae": "resid0", "model": "induction", "feature": 96}, "0 to 95"),
    ],
)
def test_bad_input_is_said_in_place_with_422(web, params, says):
    r = web.get("/features", params={"text": TEXT, **params})
    assert r.status_code == 422
    assert says in unescape(r.text) and 'role="alert"' in r.text


def test_in_malay(web):
    r = web.get("/features", params={"sae": "resid0", "model": "induction", "text": TEXT, "feature": 3, "lang": "ms"})
    assert r.status_code == 200
    assert 'lang="ms"' in r.text and "Ciri" in r.text


def test_no_saes_says_how_to_add_them(monkeypatch, tmp_path):
    """A server with no SAE at all (the shipped ones taken away: an install that left core/trained/saes out)."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.models import saes
    from app.settings import Settings

    monkeypatch.setattr(saes, "SHIPPED_SAES_DIR", tmp_path / "none")
    with TestClient(create_app(Settings(runs_dir=tmp_path))) as c:
        r = c.get("/features")
    assert r.status_code == 200 and "EXPLORER_SAES_DIR" in r.text  # a setting of the server, not bad input


def test_without_a_saes_dir_the_page_opens_on_the_shipped_sae(client):
    r = client.get("/features")
    assert r.status_code == 200 and "python-docs-induction-resid0" in r.text and 'role="alert"' not in r.text
