"""Circuits through JSON: /analysis/patching, /analysis/qk-circuit, /analysis/composition, /analysis/ov-circuit
(the /circuits page that shows them: tests/pages/test_circuits_page.py).

Every expected number comes from core run directly on the same weights (core/patching.py, core/circuits.py,
the forward pass), so the service and the API add nothing but tokens, limits and JSON.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.models.catalog import build_catalog
from app.service.circuits import INDUCTION_PREFILL, prefill
from app.settings import get_settings
from core import forward
from core.circuits import composition_scores, ov_circuit
from core.patching import sweep

from .conftest import messages

INDUCTION = {
    "model": "induction",
    "clean": INDUCTION_PREFILL.clean,
    "corrupted": INDUCTION_PREFILL.corrupted,
    "answer": INDUCTION_PREFILL.answer,
    "wrong": INDUCTION_PREFILL.wrong,
}


def post(client, path, **body):
    r = client.post(f"/api/v1/analysis/{path}", json=body)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def error(client, path, **body) -> str:
    r = client.post(f"/api/v1/analysis/{path}", json=body)
    assert r.status_code == 422, r.text[:500]
    return messages(r)


def induction_model():
    model = build_catalog(get_settings())["induction"]
    return model, model.cfg, model.load_params(model.cfg, 0, None), model.tokenizer


def ids(tokenizer, text):
    return np.array(tokenizer.encode(text).ids)


# ------------------------------------------------------------------ patching


@pytest.mark.parametrize("target", ["resid_pre", "attn_head", "attn_head_pos", "pattern"])
@pytest.mark.parametrize("frozen", [False, True])
def test_patching_answers_cores_sweep(client, target, frozen):
    _, cfg, params, tok = induction_model()
    r = post(client, "patching", **INDUCTION, target=target, direction="noise", frozen_attention=frozen)
    a, w = tok.encode(r["answer"]["token"]).ids[0], tok.encode(r["wrong"]["token"]).ids[0]
    expected = sweep(
        params,
        cfg,
        ids(tok, INDUCTION["clean"]),
        ids(tok, INDUCTION["corrupted"]),
        a,
        w,
        target,
        direction="noise",
        frozen=frozen,
    )
    np.testing.assert_array_equal(r["raw_grid"], expected.raw)
    np.testing.assert_allclose(r["grid"], expected.normalised, atol=1e-15)
    assert (r["rows"], r["columns"]) == (expected.rows, expected.columns) and r["passes"] == expected.raw.size
    assert r["tokens"]["clean"] == list(INDUCTION["clean"]) and r["tokens"]["corrupted"] == list(INDUCTION["corrupted"])
    assert r["frozen_attention"] is frozen and r["target"] == target and r["metric"] == "logit_diff"


def test_the_metrics_are_the_two_runs_logit_differences(client):
    _, cfg, params, tok = induction_model()
    r = post(client, "patching", **INDUCTION)
    a, w = r["answer"]["id"], r["wrong"]["id"]
    for text, key in ((INDUCTION["clean"], "clean_metric"), (INDUCTION["corrupted"], "corrupted_metric")):
        logits = forward(params, cfg, ids(tok, text))[0][-1]
        assert r[key] == pytest.approx(float(logits[a] - logits[w]), abs=1e-4)
    prob = post(client, "patching", **INDUCTION, metric="prob")
    assert 0.5 < prob["clean_metric"] <= 1 and prob["corrupted_metric"] < prob["clean_metric"]


def test_the_induction_walk_holds_on_the_prefilled_example(client):
    """The guided walk's claim, through the API: noising L0H2's output takes away the clean run's lead; with
    later attention frozen it does not, so L0H2 acts through layer 1's attention."""
    recomputed = post(client, "patching", **INDUCTION, target="attn_head", direction="noise")
    frozen = post(client, "patching", **INDUCTION, target="attn_head", direction="noise", frozen_attention=True)
    assert recomputed["grid"][0][2] < 0.5 < frozen["grid"][0][2]
    composition = post(client, "composition", model="induction")
    l1h0 = composition["heads"].index("L1H0")
    assert int(np.nanargmax(np.array(composition["k"][l1h0], dtype=float))) == composition["heads"].index("L0H2")


def test_answer_and_wrong_default_to_the_two_runs_predictions(client):
    _, cfg, params, tok = induction_model()
    body = {k: v for k, v in INDUCTION.items() if k not in ("answer", "wrong")}
    r = post(client, "patching", **body)
    assert r["answer"]["id"] == int(np.argmax(forward(params, cfg, ids(tok, body["clean"]))[0][-1]))
    assert r["answer"]["token"] == INDUCTION["answer"]  # the model does predict the repeat
    assert r["wrong"]["id"] != r["answer"]["id"]


def test_a_token_is_found_as_the_texts_show_it(client):
    words = {"model": "toy", "clean": "the cat sat on", "corrupted": "the dog sat on", "target": "resid_post"}
    r = post(client, "patching", **words, answer="␣", wrong="m")  # the visible space, as the tokens show it
    assert r["answer"] == {"token": " ", "id": 0} and r["wrong"]["token"] == "m"


@pytest.mark.parametrize(
    "body, message",
    [
        (INDUCTION | {"corrupted": "abc"}, "the clean text has 47 tokens and the corrupted text 3"),
        (INDUCTION | {"answer": "ab"}, "answer 'ab' is 2 tokens for 'induction'"),
        (
            {"model": "nasi-lemak", "clean": "nasi ", "corrupted": "kasi ", "answer": "l", "wrong": "x"},
            "wrong 'x' is not a token of 'nasi-lemak'",
        ),
        (INDUCTION | {"wrong": "a"}, "the answer and the wrong token are the same"),
        (INDUCTION | {"target": "mlp_out"}, "attention-only: it has no MLP, so no mlp_out"),
        (INDUCTION | {"model": "all-MiniLM-L6-v2"}, "is an encoder, which predicts no next token"),
        (
            {"model": "toy", "clean": "a" * 700, "corrupted": "b" * 700, "target": "attn_head_pos"},
            "this sweep asks for 5,600 patched runs (2 layers × 4 heads × 700 positions), more than this server's limit "
            "of 4,096",
        ),
        ({"model": "toy", "clean": "the cat", "corrupted": "the cat", "causal": False}, "turn causal back on"),
        ({"model": "toy", "clean": "the cat", "corrupted": "the cat"}, "give the same logit_diff"),
    ],
)
def test_bad_patching_input_is_a_422_naming_the_problem(client, body, message):
    assert message in error(client, "patching", **body)


def test_the_limits_are_the_settings_and_refuse_before_anything_runs(client_with):
    client = client_with(max_work=10_000_000)
    r = client.post("/api/v1/analysis/patching", json={"model": "toy", "clean": "x" * 300, "corrupted": "y" * 300})
    assert r.status_code == 422 and "multiply-adds, more than this server's limit" in messages(r)
    few = client_with(ov_max_sources=2)
    assert "more than the 2 sources one request lists" in messages(
        few.post("/api/v1/analysis/ov-circuit", json={"model": "toy", "layer": 0, "head": 0, "text": "abc"})
    )
    limited = client_with(patching_max_passes=10)
    assert "more than this server's limit of 10" in messages(
        limited.post("/api/v1/analysis/patching", json={"model": "toy", "clean": "the cat", "corrupted": "the dog"})
    )
    schema = limited.get("/openapi.json").json()
    assert "patching_max_passes" in schema["paths"]["/api/v1/analysis/patching"]["post"]["description"]
    target = schema["components"]["schemas"]["PatchingRequest"]["properties"]["target"]["description"]
    assert "at most 10 on this server" in target and "rows L{layer}H{head}" in target  # the setting in effect
    properties = schema["components"]["schemas"]["PatchingRequest"]["properties"]
    assert properties["clean"]["maxLength"] == properties["corrupted"]["maxLength"] == get_settings().max_text_chars
    assert properties["answer"]["anyOf"][0]["maxLength"] == 200
    assert (
        "at most 2)"
        in few.get("/openapi.json").json()["components"]["schemas"]["OVCircuitRequest"]["properties"]["text"][
            "description"
        ]
    )


# ------------------------------------------------------------------ circuits


def test_qk_circuit_sums_to_the_score_and_names_the_previous_token_head(client):
    r = post(client, "qk-circuit", model="induction", text="mntyadvygiwlmntyadvygiw", layer=1, head=0, query=22)
    assert r["key"] == r["top_key"] == 11 and (r["query_token"], r["key_token"]) == ("w", "l")
    c = np.array(r["contributions"])
    assert c.shape == (len(r["query_parts"]), len(r["key_parts"]))
    assert c.sum() == pytest.approx(r["total"]) and abs(r["total"] - r["score"]) < 1e-4
    assert r["top_pairs"][0] | {"contribution": 0} == {"query_part": "embed", "key_part": "L0H2", "contribution": 0}
    assert r["query_parts"][:3] == ["embed", "pos_embed", "L0H0"] and r["query_parts"][-1] == "bias"
    assert sum(r["bias_terms"].values()) == pytest.approx(c[-1, :].sum() + c[:-1, -1].sum())


@pytest.mark.parametrize(
    "body, message",
    [
        ({"query": 2, "key": 5}, "key position 5 is after the query: the causal mask hides it"),
        ({"query": 99}, "query=99 is outside the text's 23 tokens"),
        ({"layer": 2}, "layer 2, head 0 does not exist: 'induction' has 2 layer(s) of 4 head(s)"),
    ],
)
def test_bad_qk_input_is_a_422(client, body, message):
    base = {"model": "induction", "text": "mntyadvygiwlmntyadvygiw", "layer": 1, "head": 0}
    assert message in error(client, "qk-circuit", **(base | body))


def test_composition_and_ov_answer_cores(client):
    _, cfg, params, tok = induction_model()
    r = post(client, "composition", model="induction")
    expected = composition_scores(params, cfg)
    for mode in "qkv":
        np.testing.assert_array_equal(np.array(r[mode], dtype=float), getattr(expected, mode))
    assert r["heads"] == expected.heads and r["baseline"] == expected.baseline
    assert r["k"][0] == [None] * 8  # a layer-0 head reads nothing earlier: null
    ov = post(client, "ov-circuit", model="induction", layer=1, head=0, top_k=3, text="abca")
    core_ov = ov_circuit(params, cfg, 1, 0, tok.encode("abc").ids)
    assert ov["copying_score"] == core_ov.copying_score > 0.9
    assert [s["token"] for s in ov["sources"]] == ["a", "b", "c"] and all(s["self_rank"] == 0 for s in ov["sources"])
    assert [t["logit"] for t in ov["sources"][0]["top"]] == core_ov.top(3)[1][0].tolist()
    assert len(ov["eigenvalues"]) == cfg.d_head


def test_circuits_refuse_what_they_cannot_read(client):
    assert "composition needs heads in two layers" in error(client, "composition", model="nasi-lemak")
    assert "is an encoder" in error(client, "ov-circuit", model="all-MiniLM-L6-v2", layer=0, head=0)
    assert "more than the 16 sources" in error(
        client, "ov-circuit", model="toy", layer=0, head=0, text="abcdefghijklmnopqrstuvwxyz"
    )
    assert "needs a pre-norm model" in error(
        client, "qk-circuit", model="all-MiniLM-L6-v2", text="the cat", layer=0, head=0
    )


def test_every_shipped_decoder_has_a_prefill_that_runs(client):
    catalog = build_catalog(get_settings())
    for name in ("toy", "spec-forward", "induction", "nasi-lemak", "python-docs", "python-docs-induction"):
        p = prefill(catalog[name])
        r = post(
            client,
            "patching",
            model=name,
            clean=p.clean,
            corrupted=p.corrupted,
            answer=p.answer,
            wrong=p.wrong,
            target=p.target,
            direction=p.direction,
        )
        assert r["clean_metric"] != r["corrupted_metric"], name


def test_python_docs_induction_continues_a_docs_sentence_through_both_heads(client):
    """The natural-text model's prefill: a docs sentence said again up to "over the e". The clean run predicts the
    first copy's "l"; noising the stream where the first copy's "e" is read (layer 0, position 46) or where its
    "l" holds "e came before me" (layer 1, position 47) takes the lead away, as does noising the previous-token
    head L0H3 or the induction head L1H0; with later attention frozen, L0H3's patch does little (it acts through
    L1H0's keys), and L1H0's score at the last token is mostly "my token" × "L0H3's output at the key"."""
    from core import run_with_cache
    from core.circuits import qk_decomposition

    p = prefill(build_catalog(get_settings())["python-docs-induction"])
    assert (p.target, p.direction) == ("attn_head", "noise")
    r = post(
        client,
        "patching",
        model="python-docs-induction",
        clean=p.clean,
        corrupted=p.corrupted,
        answer=p.answer,
        wrong=p.wrong,
        target="resid_pre",
        direction="noise",
    )
    assert r["clean_metric"] > 3 > -3 > r["corrupted_metric"] and len(r["tokens"]["clean"]) == 117
    assert r["tokens"]["clean"][46:48] == ["e", "l"] and r["grid"][0][46] < 0.5 and r["grid"][1][47] < 0.5
    assert np.median(r["grid"]) > 0.9  # elsewhere a single position's stream hardly matters
    heads = {
        frozen: post(
            client,
            "patching",
            model="python-docs-induction",
            clean=p.clean,
            corrupted=p.corrupted,
            answer=p.answer,
            wrong=p.wrong,
            target="attn_head",
            direction="noise",
            frozen_attention=frozen,
        )["grid"]
        for frozen in (False, True)
    }
    assert heads[False][0][3] < 0.5 and heads[False][1][0] < 0.5 and heads[True][0][3] > 0.75
    model = build_catalog(get_settings())["python-docs-induction"]
    params, tok = model.load_params(model.cfg, 0, None), model.tokenizer
    _, cache = run_with_cache(params, model.cfg, ids(tok, p.clean))
    assert int(np.argmax(cache["blocks.1.attn.hook_pattern"][0, -1])) == 47
    assert qk_decomposition(cache, 1, 0, 116, 47).top_pairs(1)[0][:2] == ("embed", "L0H3")
