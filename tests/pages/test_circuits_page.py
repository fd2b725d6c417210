"""The /circuits page and the explorer's links to it (TestClient): the page holds the numbers
/api/v1/analysis/* returns and core computes on the same weights, the guided walk, a head's OV circuit as a
heatmap, the explorer's ablation recomputed and frozen side by side, and every error in place.

tests/api/test_circuits.py checks the JSON endpoints themselves against core.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.pages.figures import AXIS_TITLE_PX, CHAR_PX, MAX_LABEL_PX
from app.service.circuits import INDUCTION_PREFILL
from core import forward
from core.circuits import ov_circuit
from tests.api.test_circuits import INDUCTION, ids, induction_model, post
from tests.pages.figure_data import cards

# ------------------------------------------------------------------ the page


def test_the_page_shows_the_apis_numbers_and_the_walk(client):
    page = client.get("/circuits?model=induction").text
    r = post(client, "patching", **INDUCTION, target="attn_head", direction="noise")
    assert f"clean run <strong>{r['clean_metric']:.4f}</strong>" in page
    assert "A guided walk" in page and "L1H0 reads L0H2 through its keys" in page
    assert f"falls to <strong>{r['grid'][0][2]:.2f}</strong>" in page
    assert 'id="patching-recomputed"' in page and 'id="patching-frozen"' in page and 'data-pick="heads"' in page
    assert "query side: the token&#39;s embedding × key side: L0H2&#39;s output" in page
    # the walk's first step: L0H2 at a query of the first half looks at the token just before, by position
    step = client.get("/circuits", params={"model": "induction", "layer": 0, "head": 2, "query": 11}).text
    assert "Query 11 “x” → key 10 “q”" in step
    assert "query side: the position embedding × key side: the position embedding" in step


def test_python_docs_induction_opens_on_its_heads_and_without_the_induction_models_walk(client):
    """Its heads grid at once (8 patched runs twice: a quick page), clickable; the walk's words are the induction
    model's (L1H0's strongest K-composition is not L0H3 here), so it is not shown."""
    from tests.pages.figure_data import cards

    page = client.get("/circuits?model=python-docs-induction").text
    figs = cards(page)
    assert np.array(figs["patching-recomputed"]["data"][0]["z"]).shape == (2, 4) and 'data-pick="heads"' in page
    assert (
        figs["patching-recomputed"]["data"][0]["z"][0][3] < 0.1 < 0.75 < figs["patching-frozen"]["data"][0]["z"][0][3]
    )
    assert 'id="walk"' not in page and 'role="alert"' not in page


def test_the_page_says_its_errors_in_place(client):
    r = client.get("/circuits", params={"model": "induction", "clean": "abc", "corrupted": "ab"})
    assert r.status_code == 422
    assert "the clean text has 3 tokens and the corrupted text 2" in r.text and 'id="qk"' in r.text
    r = client.get("/circuits", params={"model": "induction", "target": "sideways"})
    assert r.status_code == 422 and "target=&#39;sideways&#39; is not one of" in r.text
    fragment = client.get("/circuits?model=toy&layer=1&head=3", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="results"')
    assert fragment.headers["HX-Push-Url"].endswith("layer=1&head=3")
    whole = client.get("/circuits?model=toy", headers={"HX-Request": "true", "HX-Target": "circuits"})
    assert whole.text.lstrip().startswith('<form id="circuits"')


def test_a_model_without_gradients_keeps_its_exact_sweeps_and_says_why_there_is_no_estimate(client, monkeypatch):
    import core.attribution_patching as atp
    from core import InputError

    def refuse(cfg):
        raise InputError("training does not support gated_mlp=True")

    monkeypatch.setattr(atp, "check_trainable", refuse)
    r = client.get("/circuits", params={"model": "induction"})
    assert r.status_code == 200 and 'id="patching-recomputed"' in r.text and 'id="patching-frozen"' in r.text
    assert 'id="attribution-error"' in r.text and "gated_mlp" in r.text and 'id="patching-attribution"' not in r.text


# ------------------------------------------------------------------ the explorer: ablation frozen or recomputed, the link


def test_the_explorers_ablation_shows_later_attention_recomputed_and_frozen_side_by_side(client):
    """Ablating L0H2 (the previous-token head) on the induction example: with later attention recomputed the
    repeat's prediction collapses; with every later pattern frozen most of it stays, since L0H2 acts through
    layer 1's attention. Both bar charts hold core's numbers (forward with the ablation, ablated_logits frozen)."""
    from core.model import next_token_probs
    from core.patching import ablated_logits
    from tests.pages.figure_data import cards

    _, cfg, params, tok = induction_model()
    text = INDUCTION_PREFILL.clean
    page = client.get("/", params={"model": "induction", "text": text, "ablate": "0.2", "layer": 0, "head": 2}).text
    figs = cards(page)
    tokens = ids(tok, text)
    before = next_token_probs(forward(params, cfg, tokens)[0])
    recomputed = next_token_probs(forward(params, cfg, tokens, ablate={(0, 2): "zero"})[0])
    frozen = next_token_probs(ablated_logits(params, cfg, tokens, {(0, 2): "zero"}, frozen=True)[None])
    top = [tok.encode(t).ids[0] for t in figs["next-token"]["export"]["x"]]
    assert figs["next-token-frozen"]["export"]["x"] == figs["next-token"]["export"]["x"]  # the same tokens
    for card, probs in (("next-token", recomputed), ("next-token-frozen", frozen)):
        without, with_ = figs[card]["data"]
        np.testing.assert_allclose(without["x"], before[top], atol=1e-6)
        np.testing.assert_allclose(with_["x"], probs[top], atol=1e-6)
    answer = tok.encode(INDUCTION_PREFILL.answer).ids[0]
    assert top[0] == answer and recomputed[answer] < 0.5 * before[answer] < frozen[answer]
    effect = re.search(r'<span id="ablation-frozen">(.*?)</span>', page, re.S).group(1)
    assert f"<strong>{frozen[answer]:.4f}</strong>" in effect
    # the head picker's link to this head's circuits
    assert '<a href="/circuits?model=induction&amp;layer=0&amp;head=2" id="head-circuits">' in page


def test_the_explorer_links_no_circuits_and_freezes_nothing_where_they_cannot_run(client):
    encoder = client.get("/", params={"model": "all-MiniLM-L6-v2", "text": "the cat", "ablate": "0.1"}).text
    assert 'id="head-circuits"' not in encoder and 'id="next-token-frozen"' not in encoder
    bidirectional = client.get("/", params={"text": "the cat sat", "causal": 0, "ablate": "0.1"}).text
    assert 'id="ablation-effect"' in bidirectional and 'id="next-token-frozen"' not in bidirectional
    plain = client.get("/", params={"text": "the cat sat"}).text
    assert 'id="head-circuits"' in plain and 'id="next-token-frozen"' not in plain


@pytest.mark.parametrize(
    "query, status, message",
    [
        ({"model": "induction", "answer": "ab"}, 422, "answer &#39;ab&#39; is 2 tokens for &#39;induction&#39;"),
        (
            {"model": "nasi-lemak", "clean": "nasi ", "corrupted": "kasi ", "answer": "l", "wrong": "x"},
            422,
            "wrong &#39;x&#39; is not a token of &#39;nasi-lemak&#39;",
        ),
        (
            {"model": "toy", "clean": "a" * 700, "corrupted": "b" * 700, "target": "attn_head_pos"},
            422,
            "this sweep asks for 11,200 patched runs (2 layers × 4 heads × 700 positions × 2 (frozen and not)), more than "
            "this server&#39;s limit of 4,096",
        ),
        ({"model": "all-MiniLM-L6-v2"}, 422, "is an encoder, which predicts no next token"),
        ({"model": "induction", "query": 99}, 200, "query=99 is outside the text&#39;s 47 tokens"),
        (
            {"model": "induction", "query": 2, "key": 5},
            200,
            "key position 5 is after the query: the causal mask hides it",
        ),
    ],
)
def test_the_page_says_each_bad_input_in_place(client, query, status, message):
    """Each problem in the section it concerns (role=alert), the rest of the page still there: the sweep's own
    problems answer 422, a QK position the sweep does not use answers 200 with the sweep drawn."""
    r = client.get("/circuits", params=query)
    assert r.status_code == status
    errors = re.findall(r'<p class="error"[^>]*role="alert"[^>]*>(.*?)</p>', r.text, re.S)
    assert any(message in e for e in errors), errors
    assert 'id="c-clean"' in r.text and 'id="qk"' in r.text  # the form and the sections stay
    assert ('id="patching-recomputed"' in r.text) == (status == 200)


def test_the_pages_ov_figure_is_cores_circuit_among_the_texts_tokens(client):
    """The chosen head's OV circuit among the text's first eight distinct tokens, as a heatmap with its downloads:
    row = the token attended to, column = the logit raised for each; the induction head L1H0 copies, so each row's
    largest entry is its own token."""
    from tests.pages.figure_data import cards

    _, cfg, params, tok = induction_model()
    page = client.get("/circuits", params={"model": "induction", "layer": 1, "head": 0}).text
    fig = cards(page)["ov-circuit"]
    sources = list(dict.fromkeys(tok.encode(INDUCTION_PREFILL.clean).ids))[:8]
    block = ov_circuit(params, cfg, 1, 0, sources).logits[:, sources]
    np.testing.assert_allclose(np.array(fig["data"][0]["z"], dtype=float), block, rtol=1e-6, atol=1e-6)
    labels = [tok.token_str(i) for i in sources]
    assert fig["data"][0]["y"] == fig["data"][0]["x"] == labels and fig["export"]["name"] == "ov-L1H0"
    assert (np.argmax(block, axis=1) == np.arange(len(sources))).all()
    card = re.search(r'<figure class="figure" id="ov-circuit">.*?</figure>', page, re.S).group(0)
    assert 'data-download="csv"' in card and 'data-download="json"' in card


# ------------------------------------------------------------------ the heatmaps' labels


def test_every_heatmaps_long_column_labels_are_turned_with_room_below(client):
    """Columns labelled as the explorer's token axes are (figures.column_labels): one or two characters
    upright, longer ones turned, with the room they need below the axis, so "pos_embed" never runs into
    "embed" beside it (that the labels drawn do not overlap: tests/browser/test_circuits.py)."""
    page = client.get("/circuits?model=induction")
    assert page.status_code == 200
    figures = cards(page.text)
    assert {"qk-circuit", "patching-recomputed", "patching-frozen"} <= set(figures)
    qk = figures["qk-circuit"]["data"][0]["x"]
    assert "pos_embed" in qk and "embed" in qk  # the labels that ran together
    for card, fig in figures.items():
        columns = fig["data"][0].get("x")
        if not columns or not isinstance(columns[0], str):
            continue
        longest = max(len(c) for c in columns)
        layout = fig["layout"]
        if longest <= 2:
            assert layout["xaxis"]["tickangle"] == 0, card
            continue
        assert layout["xaxis"]["tickangle"] == -90, card
        # the turned labels and the axis title fit in the bottom margin, the rows' labels in the left one
        assert layout["margin"]["b"] >= AXIS_TITLE_PX + min(MAX_LABEL_PX, CHAR_PX * longest), card
        rows = max(len(r) for r in fig["data"][0]["y"])
        assert layout["margin"]["l"] >= AXIS_TITLE_PX + min(MAX_LABEL_PX, CHAR_PX * rows), card
