"""The /generate page (TestClient): it holds the API's request for its URL, its default length fits the
model's context, and it says what is wrong in place. tests/api/test_generate.py checks POST /api/v1/generate.
"""

from __future__ import annotations

import html
import json
import re

import pytest

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


def test_the_pages_default_length_fits_the_models_context(client_with):
    page = client_with(default_model="induction", access_log=False).get("/generate")
    assert page.status_code == 200
    body = request_of(page.text)
    assert body["model"] == "induction" and body["max_new_tokens"] == 64 - 43  # n_ctx 64, its text 43 tokens


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
