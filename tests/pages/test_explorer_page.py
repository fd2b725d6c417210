"""The explorer page's server side: full page vs htmx fragment, the URL as the state, errors in place,
and figures that hold exactly the numbers the JSON API returns."""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, urlparse

import numpy as np

from app.settings import get_settings
from tests.pages.figure_data import cards as figures_by_card

HX = {"HX-Request": "true"}


def test_plain_get_is_the_full_page_and_htmx_gets_only_the_results(client):
    full = client.get("/")
    assert full.status_code == 200 and full.text.lstrip().startswith("<!doctype html>")
    assert 'id="explorer"' in full.text and 'id="results"' in full.text
    assert "HX-Request" in full.headers["vary"]
    part = client.get("/", headers=HX)
    assert part.status_code == 200
    assert part.text.lstrip().startswith('<section id="results"') and "<html" not in part.text
    assert "HX-Request" in part.headers["vary"]
    # every figure of the page, and no inline script anywhere
    cards = figures_by_card(full.text)
    assert {"stage-raw", "stage-scaled", "stage-masked", "stage-weights", "residual", "writes", "next-token"} <= set(
        cards
    )
    assert re.search(r"<script(?![^>]*\bsrc=)", full.text) is None
    assert not re.search(r"\son[a-z]+=", full.text)  # no inline event handlers


def test_the_page_shows_the_numbers_the_api_returns(client):
    text, layer, head = "the cat sat", 1, 2
    page = client.get("/", params={"text": text, "layer": layer, "head": head, "positional_embedding_type": "rotary"})
    cards = figures_by_card(page.text)
    api = client.post(
        "/api/v1/run",
        json={
            "model": "toy",
            "text": text,
            "positional_embedding_type": "rotary",
            "top_k": 10,
            "hooks": [f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_attn_scores"],
        },
    ).json()
    weights = np.array(api["hooks"][f"blocks.{layer}.attn.hook_pattern"][head])
    np.testing.assert_array_equal(np.array(cards["stage-weights"]["data"][0]["z"]), weights)
    scores = api["hooks"][f"blocks.{layer}.attn.hook_attn_scores"][head]
    assert cards["stage-masked"]["data"][0]["z"] == scores  # null exactly where the API has null (masked)
    bars = cards["next-token"]
    assert bars["export"]["x"] == [t["token"] for t in api["top_k"]]
    assert bars["data"][0]["x"] == [t["prob"] for t in api["top_k"]]


def test_changing_the_model_answers_the_whole_form_with_that_models_defaults(client):
    r = client.get(
        "/",
        params={"model": "spec-forward", "text": "Ali makan nasi lemak", "n_heads": "4", "d_model": "64"},
        headers=HX | {"HX-Trigger-Name": "model"},
    )
    assert r.status_code == 200
    assert r.text.lstrip().startswith('<form id="explorer"')
    assert re.search(r'id="n_heads"[^>]*value="2"', r.text)  # the spec's model: 2 heads, d_model 16
    assert re.search(r'id="d_model"[^>]*value="16"', r.text)
    assert ">nasi </textarea>" in r.text  # the default text follows the model
    assert re.search(r'id="n_layers"[^>]*disabled', r.text)  # a toggle this model does not take
    assert r.headers["hx-push-url"] == "/?model=spec-forward"


def test_the_pushed_url_is_the_shortest_that_restores_the_view(client):
    # what the form sends: every control, checkboxes as hidden "0" then "1"
    form = [
        ("text", "hello"),
        ("model", "toy"),
        ("causal", "0"),
        ("causal", "1"),
        ("scale", "0"),
        ("temperature", "1.0"),
        ("positional_embedding_type", "learned"),
        ("n_heads", "2"),
        ("d_model", "64"),
        ("n_layers", "2"),
        ("seed", "0"),
        ("layer", "1"),
        ("head", "7"),
    ]
    r = client.get("/", params=form, headers=HX)
    pushed = r.headers["hx-push-url"]
    # defaults dropped; scale off kept; the head is clamped to the 2 heads there are
    assert parse_qs(urlparse(pushed).query) == {
        "text": ["hello"],
        "scale": ["0"],
        "n_heads": ["2"],
        "layer": ["1"],
        "head": ["1"],
    }
    restored = client.get(pushed)
    assert 'id="head-1" name="head" value="1" checked' in restored.text
    assert figures_by_card(restored.text)["stage-weights"] == figures_by_card(r.text)["stage-weights"]


def test_a_bad_setting_renders_its_message_in_place_with_422(client):
    r = client.get("/", params={"text": "hi", "n_heads": "3", "layer": "1", "head": "2"}, headers=HX)
    assert r.status_code == 422
    assert "d_model=64 is not divisible by n_heads=3" in r.text
    assert "data-figure" not in r.text
    # the chosen layer and head survive, so fixing the setting restores the view
    assert 'name="layer" value="1"' in r.text and 'name="head" value="2"' in r.text
    for params, fragment in [
        ({"n_heads": "many"}, "is not a whole number"),
        ({"temperature": "0"}, "temperature"),
        ({"model": "nope"}, "unknown model 'nope'"),
        ({"n_layers": "999"}, "n_layers"),
    ]:
        r = client.get("/", params=params, headers=HX)
        assert r.status_code == 422 and fragment in html.unescape(r.text), params


def test_a_history_restore_of_a_bad_setting_is_a_full_page_htmx_will_swap(client):
    r = client.get("/?n_heads=3", headers=HX | {"HX-History-Restore-Request": "true"})
    assert r.status_code == 200  # htmx ignores a restore answered with >= 400
    assert "<!doctype html>" in r.text and "not divisible" in r.text


def test_a_text_too_long_to_draw_is_refused_with_the_limit(client):
    n = get_settings().explorer_max_tokens + 1
    r = client.get("/", params={"text": "a" * n}, headers=HX)
    assert r.status_code == 422 and f"the explorer draws up to {n - 1:,}" in r.text


def test_a_view_too_big_to_draw_names_what_the_page_can_reduce(client):
    s = get_settings()
    # the largest toy shape at the explorer's longest text: more numbers than a response may hold
    params = {"text": "a" * s.explorer_max_tokens, "n_layers": str(s.max_layers), "d_model": str(s.max_d_model)}
    r = client.get("/", params=params, headers=HX)
    assert r.status_code == 422
    message = html.unescape(r.text)
    assert f"limit of {s.explorer_max_values:,}" in message and "fewer layers" in message
    assert "hooks" not in message  # the page has no hooks to ask for fewer of


def test_user_text_is_escaped_in_the_html_and_in_the_figures(client):
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    r = client.get("/", params={"text": evil})
    assert r.status_code == 200
    assert "<script>alert" not in r.text and "<img src=x" not in r.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text  # the textarea shows it as text
    labels = figures_by_card(r.text)["stage-weights"]["layout"]["yaxis"]["ticktext"]
    assert "&lt;" in labels and "<" not in labels  # Plotly labels escaped too


def test_the_classroom_size_lives_in_the_url(client):
    assert 'class="classroom"' in client.get("/?classroom=1").text
    assert 'class="classroom"' not in client.get("/").text
