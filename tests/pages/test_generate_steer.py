"""The /generate page's steer (app/pages/steer.py): the three continuations it shows side by side are the API's
with the page's seed (unsteered, steered with attention recomputed, frozen), its URL keeps the steer, the stream
it starts is the steered one, and a steer that does not fit is said in place (422), in Malay too."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from core.sae import SAE, SAEConfig, save_sae

TEXT = "ali makan nasi. ali makan"
STEER = {
    "model": "induction",
    "text": TEXT,
    "max_new_tokens": "6",
    "temperature": "0.8",
    "seed": "3",
    "steer": "means",
    "steer_hook": "blocks.1.hook_resid_pre",
    "steer_a": "ali ali ali\nali makan",
    "steer_b": "nasi nasi",
    "steer_coef": "6",
}


def columns(page: str) -> dict[str, list[str]]:
    """Each column's new tokens, as shown."""
    out = {}
    for key, body in re.findall(r'data-steer-column="(\w+)".*?<p class="gen-text steer-text">(.*?)</p>', page, re.S):
        out[key] = [html.unescape(t) for t in re.findall(r'<span class="gen-tok[^"]*"[^>]*>(.*?)</span>', body)]
    return out


def request_of(page: str) -> dict:
    return json.loads(html.unescape(re.search(r'data-request="([^"]*)"', page).group(1)))


def test_the_three_columns_are_the_apis_continuations_with_the_pages_seed(client):
    page = client.get("/generate", params=STEER)
    assert page.status_code == 200, page.text
    shown = columns(page.text)
    assert list(shown) == ["unsteered", "recomputed", "frozen"]
    vector = client.post(
        "/api/v1/analysis/steering-vector",
        json={
            "model": "induction",
            "hook": "blocks.1.hook_resid_pre",
            "texts_a": ["ali ali ali", "ali makan"],
            "texts_b": ["nasi nasi"],
        },
    ).json()["vector"]
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 6, "temperature": 0.8, "seed": 3}
    steer = [{"hook": "blocks.1.hook_resid_pre", "vector": vector, "coefficient": 6.0}]
    for key, extra in (
        ("unsteered", {}),
        ("recomputed", {"steer": steer}),
        ("frozen", {"steer": steer, "frozen_attention": True}),
    ):
        api = client.post("/api/v1/generate", json=body | extra).json()
        assert shown[key] == api["generated"]["tokens"], key
    assert shown["recomputed"] != shown["unsteered"]  # the push changes the text: the test can fail
    sent = request_of(page.text)  # the stream the page starts: the steered one, attention recomputed
    assert sent["steer"][0]["hook"] == "blocks.1.hook_resid_pre" and len(sent["steer"][0]["vector"]) == 64
    np.testing.assert_allclose(sent["steer"][0]["vector"], vector, rtol=0, atol=1e-9)


def test_the_url_keeps_the_steer_and_no_steer_shows_no_columns(client):
    r = client.get("/generate", params=STEER, headers={"HX-Request": "true"})
    pushed = r.headers["HX-Push-Url"]
    for key in ("steer=means", "steer_hook=blocks.1.hook_resid_pre", "steer_coef=6.0", "steer_a=ali"):
        assert key in pushed
    plain = client.get("/generate", params={"model": "induction", "text": TEXT, "steer": ""})
    assert plain.status_code == 200 and "data-steer-column" not in plain.text
    assert "steer" not in request_of(plain.text)


@pytest.mark.parametrize(
    "change, english, malay",
    [
        ({"steer_b": ""}, "a steering vector takes 1 to 32 texts on each side, got 0", "vektor kemudi"),
        ({"steer": "feature"}, "choose an SAE of this model", "pilih SAE"),
        ({"steer_coef": "5000"}, "coefficient 5000 is beyond ±1000", "pekali 5000"),
        ({"steer_mode": "push"}, "steer_mode='push': choose add or clamp", "pilih add atau clamp"),
    ],
)
def test_a_steer_that_does_not_fit_is_said_in_place(client, change, english, malay):
    r = client.get("/generate", params=STEER | change | {"lang": "en"})
    assert r.status_code == 422 and english in html.unescape(r.text)
    ms = client.get("/generate", params=STEER | change | {"lang": "ms"})
    client.cookies.delete("lang")  # the page set it: the session's other tests read English
    assert ms.status_code == 422 and malay in html.unescape(ms.text)


def test_a_feature_of_an_sae_steers_at_its_own_hook(client_with, tmp_path):
    rng = np.random.default_rng(1)
    cfg = SAEConfig.from_dict(
        {
            "architecture": "standard",
            "d_in": 64,
            "d_sae": 32,
            "metadata": {"hook_name": "blocks.0.hook_resid_post", "model_name": "induction"},
        }
    )
    sae = SAE(
        cfg,
        W_enc=rng.normal(0, 0.3, (64, 32)).astype(np.float32),
        b_enc=np.zeros(32, np.float32),
        W_dec=rng.normal(0, 1.0, (32, 64)).astype(np.float32),
        b_dec=np.zeros(64, np.float32),
    )
    save_sae(sae, tmp_path / "resid0")
    c = client_with(saes_dir=tmp_path, access_log=False)
    params = STEER | {"steer": "feature", "steer_sae": "resid0", "steer_feature": "4", "steer_coef": "8"}
    page = c.get("/generate", params=params)
    assert page.status_code == 200, page.text
    assert 'value="resid0" selected' in page.text
    assert request_of(page.text)["steer"] == [
        {
            "hook": "blocks.0.hook_resid_post",
            "coefficient": 8.0,
            "mode": "add",
            "feature": {"sae": "resid0", "index": 4},
        }
    ]
    assert len(columns(page.text)["frozen"]) == 6
    out_of_range = c.get("/generate", params=params | {"steer_feature": "32"})
    assert out_of_range.status_code == 422 and "feature 32 is not in SAE &#39;resid0&#39;" in out_of_range.text


def test_the_explorers_bars_show_the_steered_prediction_when_the_view_carries_a_steer(client):
    """The explorer's URL with the /generate page's steer (its link): the next-token bars are POST /api/v1/run's
    steered top-k, the form keeps the steer as the text changes, and the pushed URL keeps it."""
    page = client.get("/generate", params=STEER | {"lang": "en"})
    link = html.unescape(re.search(r'<a href="(/\?[^"]*)">The explorer', page.text).group(1))
    r = client.get(link, headers={"HX-Request": "true"})
    assert r.status_code == 200 and "Most likely next tokens after the text, steered" in r.text
    shown = [html.unescape(t) for t in re.findall(r'data-bar="\d+"[^>]*><code>(.*?)</code>', r.text)]
    vector = client.post(
        "/api/v1/analysis/steering-vector",
        json={
            "model": "induction",
            "hook": "blocks.1.hook_resid_pre",
            "texts_a": ["ali ali ali", "ali makan"],
            "texts_b": ["nasi nasi"],
        },
    ).json()["vector"]
    api = client.post(
        "/api/v1/run",
        json={
            "model": "induction",
            "text": TEXT,
            "top_k": len(shown),
            "steer": [{"hook": "blocks.1.hook_resid_pre", "vector": vector, "coefficient": 6.0}],
        },
    ).json()
    assert shown == [t["token"].replace(" ", "␣") for t in api["top_k"]]
    assert shown != [t["token"].replace(" ", "␣") for t in api["steering_effect"]["baseline_top_k"]]
    # the same steer with every attention pattern frozen: the second figure, the API's frozen_attention run
    frozen = client.post(
        "/api/v1/run",
        json={
            "model": "induction",
            "text": TEXT,
            "top_k": len(shown),
            "frozen_attention": True,
            "steer": [{"hook": "blocks.1.hook_resid_pre", "vector": vector, "coefficient": 6.0}],
        },
    ).json()
    segment = r.text[r.text.index('id="next-token-frozen"') :]
    figure = json.loads(html.unescape(re.search(r'data-figure="([^"]*)"', segment).group(1)))
    np.testing.assert_allclose(figure["data"][0]["x"], [t["prob"] for t in frozen["top_k"]], rtol=0, atol=1e-9)
    assert [t["id"] for t in frozen["top_k"]] != [t["id"] for t in api["top_k"]] or not np.allclose(
        [t["prob"] for t in frozen["top_k"]], [t["prob"] for t in api["top_k"]]
    )
    assert "steer=means" in r.headers["HX-Push-Url"] and "steer_coef=6.0" in r.headers["HX-Push-Url"]
    full = client.get(link)
    assert '<input type="hidden" name="steer" value="means">' in full.text
    assert '<input type="hidden" name="steer_hook" value="blocks.1.hook_resid_pre">' in full.text
    plain = client.get("/", params={"model": "induction", "text": TEXT})
    assert "steered" not in plain.text and 'name="steer"' not in plain.text


# ------------------------------------------------------------------ several steers

SECOND = {
    "steer2": "means",
    "steer2_hook": "blocks.0.hook_resid_post",
    "steer2_a": "nasi",
    "steer2_b": "makan",
    "steer2_coef": "-2.5",
    "steer2_mode": "clamp",
    "steer2_pos": "0, -1",
}


def vector_of(client, hook: str, a: list[str], b: list[str]) -> list[float]:
    body = {"model": "induction", "hook": hook, "texts_a": a, "texts_b": b}
    return client.post("/api/v1/analysis/steering-vector", json=body).json()["vector"]


def rows_of(page: str) -> list[str]:
    """Each steer row of the editor, as rendered (the row template left out)."""
    editor = page[page.index('id="steer-rows"') : page.index('id="steer-row-template"')]
    return editor.split("data-steer-row>")[1:]


def test_two_steers_are_the_apis_with_both_each_with_its_own_settings(client):
    page = client.get("/generate", params=STEER | SECOND)
    assert page.status_code == 200, page.text
    first = vector_of(client, "blocks.1.hook_resid_pre", ["ali ali ali", "ali makan"], ["nasi nasi"])
    second = vector_of(client, "blocks.0.hook_resid_post", ["nasi"], ["makan"])
    steer = [
        {"hook": "blocks.1.hook_resid_pre", "vector": first, "coefficient": 6.0},
        {
            "hook": "blocks.0.hook_resid_post",
            "vector": second,
            "coefficient": -2.5,
            "mode": "clamp",
            "positions": [0, -1],
        },
    ]
    sent = request_of(page.text)["steer"]
    assert [(s["hook"], s["coefficient"], s["mode"], s.get("positions")) for s in sent] == [
        ("blocks.1.hook_resid_pre", 6.0, "add", None),
        ("blocks.0.hook_resid_post", -2.5, "clamp", [0, -1]),
    ]
    np.testing.assert_allclose(sent[1]["vector"], second, rtol=0, atol=1e-9)
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 6, "temperature": 0.8, "seed": 3}
    shown = columns(page.text)
    for key, extra in (("recomputed", {"steer": steer}), ("frozen", {"steer": steer, "frozen_attention": True})):
        api = client.post("/api/v1/generate", json=body | extra).json()
        assert shown[key] == api["generated"]["tokens"], key
    one = client.post("/api/v1/generate", json=body | {"steer": steer[:1]}).json()["generated"]["tokens"]
    assert shown["recomputed"] != one  # the second steer changes the text: the test can fail
    rows = rows_of(page.text)
    assert len(rows) == 2 and 'name="steer2_pos"' in rows[1] and 'value="0, -1"' in rows[1]
    assert "blocks.0.hook_resid_post: clamp, coefficient -2.5, positions 0, -1" in html.unescape(page.text)
    pushed = client.get("/generate", params=STEER | SECOND, headers={"HX-Request": "true"}).headers["HX-Push-Url"]
    for key in ("steer=means", "steer2=means", "steer2_mode=clamp", "steer2_pos=0%2C+-1", "steer2_coef=-2.5"):
        assert key in pushed


@pytest.mark.parametrize(
    "change, english, malay",
    [
        ({"steer2_b": ""}, "steer 2: a steering vector takes 1 to 32 texts on each side, got 0", "kemudi 2: "),
        ({"steer2_pos": "0, x"}, "steer 2: steer2_pos='0, x': give the prompt's positions", "kedudukan gesaan"),
        ({"steer2_pos": "99"}, "steer 2: pos=99 is outside the text's", "kemudi 2: "),
        ({"steer2_coef": "5000"}, "steer 2: coefficient 5000 is beyond ±1000", "pekali 5000"),
        ({"steer2_mode": "push"}, "steer 2: steer2_mode='push': choose add or clamp", "pilih add atau clamp"),
    ],
)
def test_a_second_steer_that_does_not_fit_is_said_under_its_own_row(client, change, english, malay):
    r = client.get("/generate", params=STEER | SECOND | change | {"lang": "en"})
    text = html.unescape(r.text)
    assert r.status_code == 422 and english in text
    first, second = rows_of(text)
    problem = english.split(": ", 1)[1]
    assert problem in second and problem not in first  # in place: under the second row, not the first
    assert re.search(r'<ul class="error steer-error" id="steer2-error"[^>]*role="status"\s*>', second)
    assert json.loads(re.search(r"data-steer-errors='([^']*)'", r.text).group(1)).keys() == {"1"}
    assert "data-request=" not in r.text  # nothing for the script to stream beside the error
    ms = client.get("/generate", params=STEER | SECOND | change | {"lang": "ms"})
    client.cookies.delete("lang")
    assert ms.status_code == 422 and malay in html.unescape(ms.text)


def test_more_steers_than_the_limit_are_refused(client_with):
    c = client_with(max_steers=2, access_log=False)
    r = c.get("/generate", params=STEER | SECOND | {"steer3": "means", "steer3_a": "a", "steer3_b": "b"})
    assert r.status_code == 422 and "at most 2 steers: remove some" in html.unescape(r.text)
    page = c.get("/generate", params=STEER | SECOND)
    assert page.status_code == 200 and re.search(r'<button type="button" id="steer-add"\s+disabled', page.text)


def test_the_explorer_takes_both_steers_from_the_link(client):
    page = client.get("/generate", params=STEER | SECOND | {"lang": "en"})
    link = html.unescape(re.search(r'<a href="(/\?[^"]*)">The explorer', page.text).group(1))
    assert "steer2_pos=0%2C+-1" in link or "steer2_pos=0%2C%20-1" in link
    r = client.get(link, headers={"HX-Request": "true"})
    assert r.status_code == 200, r.text
    shown = [html.unescape(t) for t in re.findall(r'data-bar="\d+"[^>]*><code>(.*?)</code>', r.text)]
    first = vector_of(client, "blocks.1.hook_resid_pre", ["ali ali ali", "ali makan"], ["nasi nasi"])
    second = vector_of(client, "blocks.0.hook_resid_post", ["nasi"], ["makan"])
    steer = [
        {"hook": "blocks.1.hook_resid_pre", "vector": first, "coefficient": 6.0},
        {
            "hook": "blocks.0.hook_resid_post",
            "vector": second,
            "coefficient": -2.5,
            "mode": "clamp",
            "positions": [0, -1],
        },
    ]
    api = client.post("/api/v1/run", json={"model": "induction", "text": TEXT, "top_k": len(shown), "steer": steer})
    assert shown == [t["token"].replace(" ", "␣") for t in api.json()["top_k"]]
    bad = client.get(link.replace("steer2_pos=0", "steer2_pos=77"), headers={"HX-Request": "true"})
    assert bad.status_code == 422 and "steer 2: pos=77 is outside" in html.unescape(bad.text)
