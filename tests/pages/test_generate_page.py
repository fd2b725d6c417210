"""The /generate page (TestClient): it holds the API's request for its URL, its default length fits the
model's context, and it says what is wrong in place. tests/api/test_generate.py checks POST /api/v1/generate.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from app.pages import generate
from app.pages.figures import EMPTY_TOKEN, VISIBLE_WHITESPACE, visible
from app.pages.generate import WRITING_MODEL

# ------------------------------------------------------------------ the page


def request_of(page_html: str) -> dict | None:
    found = re.search(r'data-request="([^"]*)"', page_html)
    return json.loads(html.unescape(found.group(1))) if found else None


def test_the_page_holds_the_apis_request_for_its_url(client):
    r = client.get(
        "/generate",
        params={"model": "toy", "text": "Ali makan", "temperature": 0.5, "top_k": 7, "seed": 3, "stop": "."},
    )
    assert r.status_code == 200
    assert request_of(r.text) == {
        "model": "toy",
        "text": "Ali makan",
        "max_new_tokens": 32,
        "temperature": 0.5,
        "top_k": 7,
        "top_p": 1.0,
        "seed": 3,
        "stop": ".",
        "repetition_penalty": 1.0,
    }
    assert client.post("/api/v1/generate", json=request_of(r.text) | {"max_new_tokens": 2}).status_code == 200


def test_the_pages_default_length_fits_the_models_context(client):
    page = client.get("/generate", params={"model": "induction"})
    assert page.status_code == 200
    body = request_of(page.text)
    assert body["model"] == "induction" and body["max_new_tokens"] == 64 - 43  # n_ctx 64, its text 43 tokens


@pytest.mark.parametrize("server_default", ["toy", "induction", "all-MiniLM-L6-v2"])
def test_the_page_opens_on_a_model_trained_on_natural_text(client_with, catalog, server_default):
    """Not the explorer's model (the induction model writes random letters), whatever the server's choice."""
    page = client_with(default_model=server_default, access_log=False).get("/generate")
    assert page.status_code == 200
    body = request_of(page.text)
    model = catalog[WRITING_MODEL]
    assert body["model"] == WRITING_MODEL and body["text"] == model.default_text
    assert model.kind == "trained" and "Python" in model.description  # its corpus: Python's documentation
    assert f'<option value="{WRITING_MODEL}" selected' in page.text
    # the model the page opens on is left out of its URL (the shortest URL restoring it)
    pushed = client_with(default_model=server_default).get("/generate", headers={"HX-Request": "true"})
    assert pushed.headers["HX-Push-Url"] == "/generate"


def test_a_server_that_cannot_write_with_it_opens_on_its_own_choice(client_with, monkeypatch):
    monkeypatch.setattr(generate, "WRITING_MODEL", "no-such-model")
    assert request_of(client_with(default_model="induction").get("/generate").text)["model"] == "induction"
    # an encoder cannot write: the toy
    assert request_of(client_with(default_model="all-MiniLM-L6-v2").get("/generate").text)["model"] == "toy"


def test_the_page_carries_the_explorers_whitespace_symbols(client):
    """generate.js shows a token's whitespace as the explorer's labels do (figures.visible), from this table."""
    page = client.get("/generate", params={"model": "toy", "text": "Ali"}).text
    found = re.search(r"data-token-symbols='([^']*)'", page)
    symbols = json.loads(html.unescape(found.group(1)))
    assert symbols == {"whitespace": VISIBLE_WHITESPACE, "empty": EMPTY_TOKEN}
    for token in (" ", " the\n", "\t", ""):  # the script's substitution, done here, is figures.visible's
        said = "".join(symbols["whitespace"].get(c, c) for c in token) or symbols["empty"]
        assert said == visible(token) and said.strip()


@pytest.mark.parametrize(
    "query, says",
    [
        ({"temperature": "-1"}, "temperature must be 0 (greedy) or a positive number"),
        ({"top_p": "0"}, "top_p must lie in (0, 1]"),
        ({"top_k": "0"}, "top_k must be a whole number of tokens, at least 1"),
        ({"max_new_tokens": "999"}, "more than this server's limit of 256"),
        ({"model": "all-MiniLM-L6-v2"}, "is an encoder"),
        ({"seed": "x"}, "seed='x' is not a whole number"),
    ],
)
def test_the_page_says_what_is_wrong_in_place(client, query, says):
    r = client.get("/generate", params={"model": "toy", "text": "Ali"} | query)
    assert r.status_code == 422 and request_of(r.text) is None
    assert says in html.unescape(re.search(r'class="error">(.*?)</p>', r.text, re.S).group(1))
    fragment = client.get("/generate", params={"model": "toy", "text": "Ali"} | query, headers={"HX-Request": "true"})
    assert fragment.status_code == 422 and fragment.text.lstrip().startswith('<section id="generate-results"')
