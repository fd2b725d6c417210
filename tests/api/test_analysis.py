"""Looking inside through JSON: /run's ablations and the /analysis/* endpoints.

Invariants, not snapshots: every expected number comes from another endpoint or from core run
directly, so a wrong formula anywhere in the chain fails.
"""

import numpy as np
import pytest

from app.models.catalog import build_catalog
from app.settings import get_settings
from core import run_with_cache
from core.params import forward_work

from .conftest import messages

TEXT = "the cat sat on the mat. the cat"
MINILM_NAME = "all-MiniLM-L6-v2"  # bundled by app/models/pretrained.py when its package is installed


def post(client, path, **body):
    r = client.post(f"/api/v1/{path}", json=body)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def error(client, path, **body) -> str:
    r = client.post(f"/api/v1/{path}", json=body)
    assert r.status_code == 422, r.text[:500]
    return messages(r)


def toy_model(text, **toggles):
    """The toy model's config, weights and token ids exactly as the API builds them (for core checks)."""
    model = build_catalog(get_settings())["toy"]
    encoding = model.tokenizer.encode(text)
    cfg = model.configure(
        {k: v for k, v in toggles.items() if k in ("n_heads", "n_layers", "d_model")}, len(encoding.ids)
    )
    return cfg, model.load_params(cfg, model.default_seed, encoding), np.array(encoding.ids)


# ------------------------------------------------------------------ ablation through /run


def test_ablation_changes_downstream_hooks_only(client):
    hooks = [
        "blocks.0.hook_resid_post",
        "blocks.1.attn.hook_pattern",
        "blocks.1.attn.hook_z",
        "blocks.1.hook_attn_out",
        "blocks.1.hook_resid_post",
    ]
    base = post(client, "run", text=TEXT, hooks=hooks)
    late = post(client, "run", text=TEXT, hooks=hooks, ablate=[{"layer": 1, "head": 2}])

    def same(name, r):
        return np.array_equal(np.array(base["hooks"][name]), np.array(r["hooks"][name]))

    # layer 1's own pattern is computed before its heads' outputs are replaced
    assert same("blocks.0.hook_resid_post", late) and same("blocks.1.attn.hook_pattern", late)
    assert not same("blocks.1.hook_attn_out", late) and not same("blocks.1.hook_resid_post", late)
    z = np.array(late["hooks"]["blocks.1.attn.hook_z"])  # [pos, head_index, d_head]
    assert np.all(z[:, 2] == 0) and np.array_equal(
        z[:, [0, 1, 3]], np.array(base["hooks"]["blocks.1.attn.hook_z"])[:, [0, 1, 3]]
    )

    early = post(client, "run", text=TEXT, hooks=hooks, ablate=[{"layer": 0, "head": 1}])
    assert not same("blocks.0.hook_resid_post", early) and not same("blocks.1.attn.hook_pattern", early)
    assert early["top_k"] != base["top_k"]


def test_mean_ablation_writes_the_heads_mean_output(client):
    hook = "blocks.0.attn.hook_z"
    base = np.array(post(client, "run", text=TEXT, hooks=[hook])["hooks"][hook])
    mean = np.array(
        post(client, "run", text=TEXT, hooks=[hook], ablate=[{"layer": 0, "head": 3, "method": "mean"}])["hooks"][hook]
    )
    np.testing.assert_allclose(mean[:, 3], np.broadcast_to(base[:, 3].mean(axis=0), mean[:, 3].shape))
    assert np.array_equal(mean[:, :3], base[:, :3])


def test_ablation_effect_compares_with_the_unablated_run(client):
    base = post(client, "run", text=TEXT, top_k=5)
    assert base["ablation_effect"] is None
    r = post(client, "run", text=TEXT, top_k=5, ablate=[{"layer": 0, "head": 0}, {"layer": 1, "head": 3}])
    effect = r["ablation_effect"]
    assert effect["baseline_top_k"] == base["top_k"]
    after = {t["id"]: t["prob"] for t in r["top_k"]}
    for change, before in zip(effect["changes"], base["top_k"]):
        assert change["id"] == before["id"] and change["baseline_prob"] == before["prob"]
        assert change["delta"] == pytest.approx(change["prob"] - change["baseline_prob"])
        if change["id"] in after:
            assert change["prob"] == pytest.approx(after[change["id"]], abs=1e-15)
    assert any(abs(c["delta"]) > 1e-6 for c in effect["changes"])


def test_ablating_nothing_changes_nothing(client):
    hooks = ["blocks.1.hook_resid_post"]
    assert post(client, "run", text=TEXT, hooks=hooks, ablate=[]) == post(client, "run", text=TEXT, hooks=hooks)


# ------------------------------------------------------------------ decomposition


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"pos": 3, "target": 40},
        {"positional_embedding_type": "rotary", "pos": -2},
        {"ablate": [{"layer": 0, "head": 2}], "target": 7},
    ],
)
def test_decomposition_sums_to_the_logit_through_json(client, body):
    d = post(client, "analysis/decompose", text=TEXT, **body)
    assert abs(sum(d["direct_logit"]) + d["logit_bias"] - d["logit"]) < 1e-5
    assert len(d["labels"]) == len(d["direct_logit"]) == len(d["parts"]) == len(d["part_norms"])
    run = post(
        client,
        "run",
        text=TEXT,
        hooks=["blocks.1.hook_resid_post"],
        top_k=1,
        **{k: v for k, v in body.items() if k not in ("pos", "target")},
    )
    pos = body.get("pos", -1)
    np.testing.assert_allclose(
        np.array(d["parts"]).sum(axis=0), np.array(run["hooks"]["blocks.1.hook_resid_post"])[pos], atol=1e-10
    )
    if body in ({}, {"ablate": body.get("ablate")}) and "target" not in body:
        assert d["target"]["id"] == run["top_k"][0]["id"]  # the default target: the model's own prediction
    assert d["pos"] == pos % len(d["tokens"])


def test_decomposition_logit_is_the_models_logit(client):
    d = post(client, "analysis/decompose", text=TEXT, pos=5, target=33)
    cfg, params, ids = toy_model(TEXT)
    logits, _ = run_with_cache(params, cfg, ids, names=())
    assert d["logit"] == pytest.approx(logits[5, 33], abs=1e-12) and d["target"]["token"] == "A"


# ------------------------------------------------------------------ logit lens


@pytest.mark.parametrize("toggles", [{}, {"causal": False, "n_layers": 3}])
def test_last_lens_point_is_runs_top_k(client, toggles):
    lens = post(client, "analysis/logit-lens", text=TEXT, top_k=5, **toggles)
    run = post(client, "run", text=TEXT, top_k=5, **toggles)
    n_layers = lens["config"]["n_layers"]
    assert len(lens["points"]) == 2 * n_layers + 1 and lens["points"][-1] == f"blocks.{n_layers - 1}.hook_resid_post"
    assert np.array(lens["top_k"], dtype=object).shape[:3] == (2 * n_layers + 1, len(TEXT), 5)
    last = lens["top_k"][-1][-1]
    assert [c["id"] for c in last] == [t["id"] for t in run["top_k"]]
    np.testing.assert_allclose([c["prob"] for c in last], [t["prob"] for t in run["top_k"]], rtol=1e-12)


def test_lens_equals_cores_logit_lens(client):
    lens = post(client, "analysis/logit-lens", text="Ali makan", top_k=3, ablate=[{"layer": 1, "head": 1}])
    cfg, params, ids = toy_model("Ali makan")
    _, cache = run_with_cache(params, cfg, ids, ablate={(1, 1): "zero"})
    points = [f"blocks.{layer}.hook_resid_{p}" for layer in range(cfg.n_layers) for p in ("pre", "mid")]
    points.append(f"blocks.{cfg.n_layers - 1}.hook_resid_post")
    assert lens["points"] == points
    for point, got in zip(points, lens["top_k"]):
        # written out here, independently of core: the final layer norm, then the tied unembedding
        x = cache[point]
        x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + cfg.eps)
        x = x * params["ln_final"]["w"] + params["ln_final"]["b"]
        logits = x @ params["embed"]["W_E"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :3]
        assert [[c["id"] for c in cell] for cell in got] == top.tolist()
        np.testing.assert_allclose(
            [[c["prob"] for c in cell] for cell in got], np.take_along_axis(probs, top, -1), rtol=1e-12
        )


# ------------------------------------------------------------------ detectors


def test_detectors_shapes_and_flags(client):
    r = post(
        client, "analysis/detectors", text=TEXT, n_layers=3, n_heads=2, d_model=32, random_length=10, threshold=0.3
    )
    assert set(r["detectors"]) == {"previous_token", "duplicate_token", "induction"}
    for by in r["detectors"].values():
        for on in ("text", "random"):
            grid = np.array(by[on], dtype=float)
            assert grid.shape == (3, 2) and np.all((grid >= 0) & (grid <= 1 + 1e-12))
    ids = r["random_token_ids"]
    assert len(ids) == 20 and ids[:10] == ids[10:] and len(r["random_tokens"]) == 20
    flagged = {(f["detector"], f["on"], f["layer"], f["head"]): f["score"] for f in r["flagged"]}
    for name, by in r["detectors"].items():
        for on, grid in by.items():
            for layer, row in enumerate(grid):
                for head, score in enumerate(row):
                    assert ((name, on, layer, head) in flagged) == (score is not None and score >= 0.3)
    assert [f["score"] for f in r["flagged"]] == sorted((f["score"] for f in r["flagged"]), reverse=True)


def test_detectors_on_text_with_no_repeats_are_null(client):
    r = post(client, "analysis/detectors", text="abcdef")
    assert all(v is None for row in r["detectors"]["duplicate_token"]["text"] for v in row)
    assert all(v is not None for row in r["detectors"]["previous_token"]["text"] for v in row)


# ------------------------------------------------------------------ KV cache


def test_kv_cache_steps_agree_with_full_recomputation(client):
    r = post(client, "analysis/kv-cache", text="Ali makan", n_new=6)
    n, cfg = len("Ali makan"), r["config"]
    steps = r["steps"]
    assert len(steps) == n + 6 and [s["generated"] for s in steps] == [False] * n + [True] * 6
    assert r["max_abs_diff"] < 1e-9 and all(s["max_abs_diff"] <= r["max_abs_diff"] for s in steps)
    per_token = 2 * cfg["n_layers"] * cfg["n_heads"] * cfg["d_head"] * 8  # float64 toy weights
    for s in steps:
        assert s["k_shape"] == s["v_shape"] == [cfg["n_heads"], s["pos"] + 1, cfg["d_head"]]
        assert s["cache_bytes"] == (s["pos"] + 1) * per_token
    for before, after in zip(steps[n - 1 :], steps[n:]):  # greedy: each new token is the last step's top
        assert after["id"] == before["top"]["id"]
    # the generated continuation is what /run predicts for the text plus what came before
    run = post(client, "run", text="Ali makan" + r["generated_text"][:2], top_k=1)
    assert run["top_k"][0]["id"] == steps[n + 2]["id"]


# ------------------------------------------------------------------ compare and rollout


def test_compare_mask_on_off(client):
    hook = "blocks.1.attn.hook_pattern"
    r = post(client, "analysis/compare", text=TEXT, layer=1, head=3, other={"causal": False})
    a, b = np.array(r["a"]["pattern"]), np.array(r["b"]["pattern"])
    assert r["a"]["config"]["attention_dir"] == "causal" and r["b"]["config"]["attention_dir"] == "bidirectional"
    np.testing.assert_array_equal(a, np.array(post(client, "run", text=TEXT, hooks=[hook])["hooks"][hook])[3])
    np.testing.assert_array_equal(
        b, np.array(post(client, "run", text=TEXT, hooks=[hook], causal=False)["hooks"][hook])[3]
    )
    np.testing.assert_allclose(np.array(r["difference"]), b - a)
    assert r["note"] is None


def test_compare_texts_of_different_lengths_has_no_difference(client):
    r = post(client, "analysis/compare", text="the cat", other={"text": "the dogs"})
    assert r["difference"] is None and "7 and 8 tokens" in r["note"]
    assert r["b"]["tokens"] == list("the dogs")


def test_compare_an_ablated_head(client):
    r = post(client, "analysis/compare", text=TEXT, layer=1, other={"ablate": [{"layer": 0, "head": 0}]})
    assert r["a"]["ablate"] == [] and r["b"]["ablate"] == [{"layer": 0, "head": 0, "method": "zero"}]
    assert np.abs(np.array(r["difference"])).max() > 1e-6


@pytest.mark.parametrize("toggles", [{}, {"causal": False, "ablate": [{"layer": 0, "head": 1}]}])
def test_rollout_rows_sum_to_one(client, toggles):
    r = post(client, "analysis/rollout", text=TEXT, **toggles)
    roll = np.array(r["rollout"])
    assert roll.shape == (2, len(TEXT), len(TEXT))
    np.testing.assert_allclose(roll.sum(axis=-1), 1.0, rtol=1e-12)
    if not toggles:  # causal: nothing flows back from a later token
        assert np.all(roll[:, np.triu(np.ones((len(TEXT),) * 2, bool), 1)] == 0)


# ------------------------------------------------------------------ the encoder


@pytest.fixture(scope="module")
def minilm():
    model = build_catalog(get_settings()).get(MINILM_NAME)
    if model is None or model.error:
        pytest.skip(f"{MINILM_NAME} is not runnable here: {model and model.error}")
    return MINILM_NAME


def test_encoder_refuses_what_needs_a_next_token(client, minilm):
    for path in ("analysis/decompose", "analysis/logit-lens"):
        assert "encoder" in error(client, path, model=minilm, text="the cat")
    assert "encoder" in error(client, "analysis/kv-cache", model=minilm, text="the cat")


def test_encoder_detectors_and_rollout(client, minilm):
    roll = np.array(post(client, "analysis/rollout", model=minilm, text="the cat sat")["rollout"])
    assert roll.shape[0] == 6
    np.testing.assert_allclose(roll.sum(axis=-1), 1.0, rtol=1e-5)
    r = post(client, "analysis/detectors", model=minilm, text="the cat sat. the cat sat.", random_length=8)
    assert np.array(r["detectors"]["induction"]["random"], dtype=float).shape == (6, 12)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "path, body, expected",
    [
        ("run", {"ablate": [{"layer": 2, "head": 0}]}, "layer 2 head 0 does not exist"),
        ("run", {"ablate": [{"layer": 0, "head": 1}, {"layer": 0, "head": 1, "method": "mean"}]}, "listed twice"),
        ("run", {"ablate": [{"layer": 0, "head": 0, "method": "half"}]}, "ablate[0].method"),
        ("run", {"ablate": [{"layer": -1, "head": 0}]}, "ablate[0].layer"),
        ("run", {"ablate": [{"layer": 0}]}, "ablate[0].head"),
        ("analysis/decompose", {"pos": 99}, "outside the text's"),
        ("analysis/decompose", {"target": 10_000}, "not a token id"),
        ("analysis/logit-lens", {"top_k": 0}, "top_k"),
        ("analysis/kv-cache", {"causal": False}, "causal mask"),
        ("analysis/kv-cache", {"ablate": []}, "ablate"),
        ("analysis/compare", {"other": {"causal": False}, "layer": 2}, "layer 2, head 0 does not exist"),
        ("analysis/compare", {"other": {"n_heads": 2}}, "other.n_heads"),
        ("analysis/compare", {}, "other"),
        ("analysis/detectors", {"random_length": 1}, "random_length"),
        ("analysis/rollout", {"text": "x" * 1000, "n_layers": 12}, "use a shorter text"),
    ],
)
def test_bad_analysis_requests_answer_422(client, path, body, expected):
    assert expected in error(client, path, **({"text": "the cat sat"} | body))


def test_limits_are_in_the_schema_and_enforced(client):
    s = get_settings()
    too_many = [{"layer": 0, "head": h % 4, "method": "zero"} for h in range(s.max_ablations + 1)]
    assert "ablate" in error(client, "run", text="abc", ablate=too_many)
    assert "n_new" in error(client, "analysis/kv-cache", text="abc", n_new=s.max_new_tokens + 1)
    assert "exceed the context" in error(client, "analysis/kv-cache", model="spec-forward", text="nasi ", n_new=1)
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for name in ("decompose", "logit-lens", "detectors", "kv-cache", "compare", "rollout"):
        assert "post" in paths[f"/api/v1/analysis/{name}"]
    components = schema["components"]["schemas"]
    for request in (
        "RunRequest",
        "DecomposeRequest",
        "LogitLensRequest",
        "DetectorsRequest",
        "CompareRequest",
        "RolloutRequest",
    ):
        assert components[request]["properties"]["ablate"]["maxItems"] == s.max_ablations
    assert components["KVStepsRequest"]["properties"]["n_new"]["maximum"] == s.max_new_tokens


def test_a_pass_without_logits_is_priced_without_the_unembedding():
    cfg = build_catalog(get_settings())["toy"].cfg
    assert forward_work(cfg, 10) - forward_work(cfg, 10, logits=False) == 10 * cfg.d_model * cfg.d_vocab
