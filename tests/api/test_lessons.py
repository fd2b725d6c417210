"""The spec's printed numbers, through the JSON API, at the spec's printed precision.

Expected values are copied from ../shared/spec/transformers-in-depth.txt.
"""

import numpy as np
import pytest


def rounded(a, decimals):
    return np.round(np.asarray(a, dtype=float), decimals).tolist()


def get(client, path, **params):
    r = client.get(f"/api/v1/lessons/{path}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


class TestAttention:
    def test_defaults_print_the_spec_table(self, client):
        a = get(client, "attention")
        assert a["tokens"] == ["Ali", "makan", "nasi", "lemak"]
        assert a["shapes"]["Q"] == a["shapes"]["K"] == a["shapes"]["V"] == [4, 4]
        assert a["shapes"]["output"] == [4, 4]
        assert rounded(a["weights"], 2) == [
            [0.89, 0.02, 0.08, 0.01],
            [0.51, 0.15, 0.21, 0.13],
            [0.09, 0.17, 0.59, 0.15],
            [0.96, 0.03, 0.01, 0.00],
        ]
        assert rounded(np.sum(a["weights"], axis=1), 2) == [1.0] * 4
        assert rounded(a["scores"][3], 2) == [4.15, 0.69, -0.52, -2.84]

    def test_full_precision_and_the_four_stages(self, client):
        a = get(client, "attention")
        raw, scaled = np.array(a["raw_scores"]), np.array(a["scaled_scores"])
        assert a["divisor"] == 2.0  # √d_k, d_k = 4
        np.testing.assert_allclose(scaled, raw / 2.0, rtol=0, atol=0)
        np.testing.assert_array_equal(np.array(a["scores"]), scaled)  # no mask by default
        assert not np.any(a["mask"])
        # full precision, not rounded: many more digits than the spec prints
        assert a["weights"][0][0] != round(a["weights"][0][0], 6)

    def test_causal_section(self, client):
        a = get(client, "attention", causal="true")
        assert np.array(a["mask"], dtype=int).tolist() == [[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]
        assert rounded(a["weights"], 2) == [
            [1.0, 0.0, 0.0, 0.0],
            [0.78, 0.22, 0.0, 0.0],
            [0.11, 0.2, 0.69, 0.0],
            [0.96, 0.03, 0.01, 0.0],
        ]
        # masked scores are null in JSON, exactly above the diagonal
        nulls = [[s is None for s in row] for row in a["scores"]]
        assert nulls == a["mask"]
        assert all(v is not None for row in a["scaled_scores"] for v in row)

    def test_unscaled(self, client):
        a = get(client, "attention", scale="false")
        assert a["divisor"] == 1.0
        np.testing.assert_array_equal(a["scores"], a["raw_scores"])

    def test_parameters_change_the_result(self, client):
        a = get(client, "attention", text="the cat sat", seed=3, d_model=6, d_k=2)
        assert a["tokens"] == ["the", "cat", "sat"]
        assert a["shapes"]["X"] == [3, 6] and a["shapes"]["Q"] == [3, 2]


def test_scaling_table(client):
    rows = get(client, "scaling")["rows"]
    assert [r["d"] for r in rows] == [4, 64, 512]
    assert [round(r["std"], 1) for r in rows] == [2.0, 8.0, 22.5]
    assert [round(r["top_weight_unscaled"], 2) for r in rows] == [0.43, 0.84, 0.95]
    assert [round(r["top_weight_scaled"], 2) for r in rows] == [0.24, 0.24, 0.25]


def test_scaling_parameters(client):
    rows = get(client, "scaling", dims="2,8", n_queries=50, n_keys=4, seed=1)["rows"]
    assert [r["d"] for r in rows] == [2, 8]


def test_multihead_rows(client):
    m = get(client, "multihead")
    assert m["shapes"]["Q"] == [2, 4, 4] and m["shapes"]["weights"] == [2, 4, 4] and m["shapes"]["output"] == [4, 8]
    assert len(m["heads"]) == 2 and m["d_head"] == 4
    assert rounded(m["heads"][0]["weights"][-1], 2) == [0.27, 0.18, 0.26, 0.28]
    assert rounded(m["heads"][1]["weights"][-1], 2) == [0.21, 0.23, 0.36, 0.2]
    assert np.array(m["output"]).shape == (4, 8)


def test_multihead_causal_masks_every_head(client):
    m = get(client, "multihead", causal="true", n_heads=4)
    assert len(m["heads"]) == 4
    for head in m["heads"]:
        assert [[s is None for s in row] for row in head["scores"]] == np.triu(np.ones((4, 4), bool), 1).tolist()


def test_positions(client):
    p = get(client, "positions")
    assert np.array(p["encoding"]).shape == (50, 16)
    assert rounded(np.array(p["encoding"])[:3, :6], 2) == [
        [0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
        [0.84, 0.54, 0.31, 0.95, 0.1, 1.0],
        [0.91, -0.42, 0.59, 0.81, 0.2, 0.98],
    ]
    dots = {(d["i"], d["j"]): f"{d['dot']:.2f}" for d in p["dots"]}
    assert dots == {
        (10, 10): "8.00",
        (10, 11): "7.49",
        (10, 12): "6.37",
        (10, 15): "6.14",
        (10, 30): "5.78",
        (30, 35): "6.14",
    }


def test_positions_pairs_and_small_n_pos(client):
    small = get(client, "positions", n_pos=20)
    assert {(d["i"], d["j"]) for d in small["dots"]} == {(10, 10), (10, 11), (10, 12), (10, 15)}
    chosen = get(client, "positions", pairs="0:1,3:4")
    assert [(d["i"], d["j"]) for d in chosen["dots"]] == [(0, 1), (3, 4)]
    assert chosen["dots"][0]["dot"] == pytest.approx(chosen["dots"][1]["dot"], abs=0.2)


def test_forward_pass(client):
    f = get(client, "forward")
    assert [(s["name"], s["shape"]) for s in f["steps"]] == [
        ("embed", [5, 16]),
        ("qkv", [5, 48]),
        ("scores", [2, 5, 5]),
        ("after attn", [5, 16]),
        ("after mlp", [5, 16]),
        ("logits", [5, 9]),
    ]
    assert {c: round(p, 3) for c, p in f["next_token_probs"].items()} == {
        " ": 0.211,
        "a": 0.115,
        "e": 0.112,
        "i": 0.123,
        "k": 0.062,
        "l": 0.151,
        "m": 0.076,
        "n": 0.09,
        "s": 0.06,
    }
    assert list(f["next_token_probs"]) == f["vocab"] == [" ", "a", "e", "i", "k", "l", "m", "n", "s"]


def test_forward_pass_parameters(client):
    f = get(client, "forward", prompt="lemak", d_model=8, n_heads=4, d_mlp=16, seed=1)
    assert f["steps"][2] == {"name": "scores", "shape": [4, 5, 5]}
    assert sum(f["next_token_probs"].values()) == pytest.approx(1.0)
