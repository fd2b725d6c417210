"""The /attribution page shows POST /api/v1/analysis/attribution's numbers (the shaded text's scores, the bars, the
heads heatmap), keeps its state in the URL, says bad input in place with 422 in both languages; the explorer's
next-token bars link to it; the lesson "Which words mattered?" on the induction model; the notebook's figures."""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from app.service.classes import check_path

from .figure_data import cards

TEXT = "Ali makan nasi lemak. Ali makan nasi"
HX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def english(client):
    """The session's client: a Malay page's language cookie must not follow into the next test."""
    client.cookies.clear()
    yield
    client.cookies.clear()


def page_data(html: str) -> dict:
    """The numbers the page shows (its results' data-attribution: what the downloads hold)."""
    return json.loads(unescape(re.search(r"data-attribution='([^']*)'", html).group(1)))


def api(client, **body) -> dict:
    r = client.post("/api/v1/analysis/attribution", json={"model": "induction", "text": TEXT, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "occlusion"])
def test_the_shaded_text_holds_the_apis_scores(client, method):
    r = client.get("/attribution", params={"model": "induction", "text": TEXT, "method": method})
    assert r.status_code == 200, r.text
    shown = page_data(r.text)
    want = api(client, method=method)
    assert shown["tokens"] == want["tokens"] and shown["token_ids"] == want["token_ids"]
    assert shown["scores"] == pytest.approx(want["scores"], rel=1e-9, abs=1e-12)
    assert shown["metric"] == pytest.approx(want["metric"])
    # each token's label says its score (a screen reader's way to the numbers), to 4 decimals
    labels = re.findall(r'aria-label="token (\d+) “[^”]*”: score (-?[\d.]+)"', unescape(r.text))
    assert [int(i) for i, _ in labels] == list(range(len(want["tokens"])))
    assert [float(s) for _, s in labels] == pytest.approx(want["scores"], abs=6e-5)
    bars = cards(r.text)["attribution-scores"]
    assert bars["data"][0]["y"] == pytest.approx(want["scores"])


def test_integrated_gradients_says_its_completeness(client):
    r = client.get("/attribution", params={"model": "induction", "text": TEXT, "steps": 16})
    want = api(client, method="integrated_gradients", steps=16)
    body = unescape(r.text)
    assert "completeness" in body
    assert f"{want['metric'] - want['baseline_metric']:.4f}" in body and f"{sum(want['scores']):.4f}" in body


def test_direct_logit_draws_the_heads_by_source_token(client):
    r = client.get("/attribution", params={"model": "induction", "text": TEXT, "method": "direct_logit"})
    assert r.status_code == 200, r.text
    want = api(client, method="direct_logit")
    fig = cards(r.text)["attribution-heads"]
    heads = np.asarray(want["heads"])  # [layer][head][source pos]
    z = np.asarray(fig["data"][0]["z"], dtype=float)
    assert z.shape == (heads.shape[0] * heads.shape[1], len(want["tokens"]))
    np.testing.assert_allclose(z, heads.reshape(z.shape[0], -1)[:, : z.shape[1]], rtol=1e-12, atol=1e-12)
    assert fig["data"][0]["y"][0] == "L0H0" and fig["data"][0]["colorscale"][0][1] == "#2d004b"


def test_the_url_holds_the_state_and_restores_it(client):
    params = {"model": "induction", "text": TEXT, "position": 5, "method": "saliency", "contrast": "a"}
    r = client.get("/attribution", params=params, headers=HX)
    assert r.status_code == 200, r.text
    pushed = r.headers["HX-Push-Url"]
    assert pushed.startswith("/attribution?") and "HX-Request" in r.headers["Vary"]
    query = parse_qs(urlsplit(pushed).query, keep_blank_values=True)
    assert query == {
        "model": ["induction"],
        "text": [TEXT],
        "position": ["5"],
        "contrast": ["a"],
        "method": ["saliency"],
    }
    again = client.get(pushed)
    assert again.status_code == 200
    assert '<option value="saliency" selected' in again.text and 'name="position" type="number"' in again.text
    assert re.search(r'id="a-position"[^>]*value="5"', again.text) and re.search(
        r'id="a-contrast"[^>]*value="a"', again.text
    )
    assert page_data(again.text)["scores"] == pytest.approx(
        api(client, position=5, method="saliency", contrast="a")["scores"]
    )
    # a token's link explains the prediction after it: its position, the target and contrast back to the defaults
    link = re.search(r'<a class="tok[^"]*" data-pos="2" href="([^"]*)"', again.text).group(1)
    assert parse_qs(urlsplit(unescape(link)).query) == {
        "model": ["induction"],
        "text": [TEXT],
        "position": ["2"],
        "method": ["saliency"],
    }


@pytest.mark.parametrize(
    "params",
    [
        {"position": 999},
        {"position": "two"},
        {"method": "guessing"},
        {"target": "no such token"},
        {"steps": 10**6},
    ],
)
def test_bad_input_is_said_in_place_with_422(client, params):
    r = client.get("/attribution", params={"model": "induction", "text": TEXT, **params}, headers=HX)
    assert r.status_code == 422
    assert 'role="alert"' in r.text and 'id="attribution-error"' in r.text
    assert r.text.lstrip().startswith('<section id="attribution-results"')  # in place: the results block only
    assert r.headers["HX-Push-Url"].startswith("/attribution?")  # the learner's values stay in the URL and the form


def test_in_malay_the_page_and_its_errors(client):
    r = client.get("/attribution", params={"model": "induction", "text": TEXT, "lang": "ms"})
    assert r.status_code == 200 and 'lang="ms"' in r.text
    assert "Perkataan mana yang penting?" in unescape(r.text)
    bad = client.get("/attribution", params={"model": "induction", "text": TEXT, "position": 999, "lang": "ms"})
    said = client.post(
        "/api/v1/analysis/attribution",
        json={"model": "induction", "text": TEXT, "position": 999},
        headers={"Accept-Language": "ms"},
    )
    assert bad.status_code == 422 and said.status_code == 422
    detail = said.json()["detail"]
    message = detail if isinstance(detail, str) else detail[0]["msg"]
    assert message in unescape(bad.text)
    assert "ms" in r.text and "/attribution?" in unescape(bad.text)


def test_the_explorers_next_token_bars_link_here(client):
    r = client.get("/", params={"model": "induction", "text": TEXT})
    assert r.status_code == 200
    links = re.findall(r'<a href="(/attribution\?[^"]*)"\s+data-bar="(\d+)"', r.text)
    bars = cards(r.text)["next-token"]
    assert len(links) == len(bars["export"]["x"]) > 1
    for (href, _bar), token in zip(links, bars["export"]["x"]):
        query = parse_qs(urlsplit(unescape(href)).query, keep_blank_values=True)
        assert query["model"] == ["induction"] and query["text"] == [TEXT] and query["target"] == [token]
    first = client.get(unescape(links[0][0]))
    assert first.status_code == 200
    shown = page_data(first.text)
    assert shown["target"] == bars["export"]["x"][0] and shown["position"] == len(shown["tokens"]) - 1


def test_a_class_can_show_the_page():
    assert check_path("/attribution?model=induction&method=saliency") == "/attribution?model=induction&method=saliency"


def test_the_lesson_runs_on_the_induction_model(client):
    r = client.get("/lessons/attribution")
    assert r.status_code == 200, r.text
    body = unescape(r.text)
    gaps = [float(g) for g in re.findall(r"<td class=\"num\">(-?[\d.]+e[-+]\d+)</td>", body)]
    assert len(gaps) >= 4 and abs(gaps[-1]) <= abs(gaps[0])  # more steps, a smaller gap
    assert "Which words mattered?" in body and 'href="/lessons/attribution"' in r.text
    ms = client.get("/lessons/attribution", params={"lang": "ms"})
    assert ms.status_code == 200 and "Perkataan mana yang penting?" in unescape(ms.text)
    assert client.get("/lessons/attribution", params={"shown": 99}).status_code == 422


def test_the_notebook_draws_the_pages_figures(client):
    from app.pages.notebook import attribution_figures

    figs = attribution_figures(TEXT, model="induction", method="direct_logit")
    assert set(figs) == {"scores", "heads"}
    r = client.get("/attribution", params={"model": "induction", "text": TEXT, "method": "direct_logit"})
    page = cards(r.text)
    assert list(figs["scores"].data[0].y) == pytest.approx(page["attribution-scores"]["data"][0]["y"])
    assert np.asarray(figs["heads"].data[0].z, dtype=float) == pytest.approx(
        np.asarray(page["attribution-heads"]["data"][0]["z"], dtype=float)
    )


def test_the_explorers_toggles_go_with_its_links(client):
    """The toy with another seed and two heads: the bars' links carry the toggles, and the page runs with them
    (its numbers are the API's for that configuration, and its form keeps them)."""
    r = client.get("/", params={"model": "toy", "text": "Ali makan nasi", "seed": 3, "n_heads": 2})
    assert r.status_code == 200, r.text
    href = unescape(re.search(r'<a href="(/attribution\?[^"]*)"\s+data-bar="0"', r.text).group(1))
    query = parse_qs(urlsplit(href).query)
    assert query["seed"] == ["3"] and query["n_heads"] == ["2"]
    page = client.get(href)
    assert page.status_code == 200, page.text
    shown = page_data(page.text)
    body = {"model": "toy", "text": "Ali makan nasi", "seed": 3, "n_heads": 2, "target": shown["target"]}
    want = client.post("/api/v1/analysis/attribution", json=body).json()
    assert shown["scores"] == pytest.approx(want["scores"]) and shown["metric"] == pytest.approx(want["metric"])
    other = client.post("/api/v1/analysis/attribution", json={**body, "seed": 0}).json()
    assert shown["metric"] != pytest.approx(other["metric"])  # the toggles mattered
    assert '<input type="hidden" name="seed" value="3">' in page.text
    assert '<input type="hidden" name="n_heads" value="2">' in page.text


def test_the_lesson_has_no_numpy_snippet_and_its_route_says_so(client):
    """The other lessons' snippets are the spec's code with the page's values; this one's numbers come from the
    attribution API, so its snippet route answers 404 with where to look, not a server error."""
    r = client.get("/lessons/attribution/snippet.py")
    assert r.status_code == 404 and "no NumPy snippet" in r.text
    assert "/snippet.py" not in client.get("/lessons/attribution").text
