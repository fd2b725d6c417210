"""core/sae.py against SAELens (fixtures recorded by scripts/make_sae_fixtures.py with SAELens 6.54 on torch)
and against the formulas written out as loops.

SAELens computed in float32 through torch's matmul, core through NumPy's BLAS: the activations agree to
float32 rounding (atol 1e-5 on values of order 1), not bit for bit; the set of active features is equal.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from core.errors import InputError
from core.sae import SAE, SAEConfig, load_sae, save_sae

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDERS = FIXTURES / "saes"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_sae_fixtures.py"
CASES = ["standard", "standard-no-b-dec-in", "topk", "topk-rescaled", "jumprelu"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def recorded():
    with np.load(FIXTURES / "saes.npz") as z:
        return {k: z[k] for k in z.files}


def test_the_fixture_was_recorded_by_the_generator_as_it_is(recorded):
    assert str(recorded["meta_generator_sha256"]) == hashlib.sha256(GENERATOR.read_bytes()).hexdigest(), (
        "scripts/make_sae_fixtures.py changed since tests/fixtures/saes.npz was made: run make fixtures"
    )
    assert str(recorded["meta_sae_lens_version"]).startswith("6.")


@pytest.mark.parametrize("case", CASES)
def test_encode_and_decode_equal_saelens_within_float32_rounding(case, recorded):
    sae = load_sae(FOLDERS / case)
    x = recorded[f"{case}/x"]
    acts = sae.encode(x)
    assert acts.dtype == np.float32 and acts.shape == (x.shape[0], sae.cfg.d_sae)
    np.testing.assert_array_equal(acts > 0, recorded[f"{case}/acts"] > 0)  # the same features fire
    np.testing.assert_allclose(acts, recorded[f"{case}/acts"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(sae.decode(acts), recorded[f"{case}/recon"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("case", CASES)
def test_a_folder_written_here_opens_in_saelens_with_the_same_activations(case, recorded):
    """SAELens's load_from_disk read what save_sae wrote (in the generator) and encoded as core does."""
    sae = load_sae(FOLDERS / case)
    np.testing.assert_allclose(
        sae.encode(recorded[f"{case}/x"]), recorded[f"{case}/core_written_acts"], rtol=0, atol=ATOL
    )


@pytest.mark.parametrize("case", CASES)
def test_save_then_load_gives_the_same_sae(case, tmp_path):
    sae = load_sae(FOLDERS / case)
    again = load_sae(save_sae(sae, tmp_path / case))
    assert again.cfg == sae.cfg
    for name, array in sae.arrays().items():
        np.testing.assert_array_equal(getattr(again, name), array)  # no arithmetic: bit for bit
    assert json.loads((tmp_path / case / "cfg.json").read_text())["architecture"] == sae.cfg.architecture


def _loops(sae: SAE, x: np.ndarray) -> np.ndarray:
    """Each architecture's rule written out token by token, feature by feature, in float64."""
    W_enc, b_enc, b_dec = (np.asarray(a, dtype=np.float64) for a in (sae.W_enc, sae.b_enc, sae.b_dec))
    norms = np.sqrt((np.asarray(sae.W_dec, dtype=np.float64) ** 2).sum(axis=1))
    out = np.zeros((len(x), sae.cfg.d_sae))
    for t, row in enumerate(np.asarray(x, dtype=np.float64)):
        sae_in = [row[d] - (b_dec[d] if sae.cfg.apply_b_dec_to_input else 0.0) for d in range(sae.cfg.d_in)]
        pre = []
        for i in range(sae.cfg.d_sae):
            p = b_enc[i] + sum(sae_in[d] * W_enc[d, i] for d in range(sae.cfg.d_in))
            pre.append(p * norms[i] if sae.cfg.rescale_acts_by_decoder_norm else p)
        for i, p in enumerate(pre):
            if sae.cfg.architecture == "jumprelu":
                out[t, i] = p if p > sae.threshold[i] and p > 0 else 0.0
            elif sae.cfg.architecture == "topk":
                out[t, i] = max(p, 0.0) if sorted(pre, reverse=True).index(p) < sae.cfg.k else 0.0
            else:
                out[t, i] = max(p, 0.0)
    return out


@pytest.mark.parametrize("case", CASES)
def test_encode_equals_the_rule_written_as_loops(case, recorded):
    sae = load_sae(FOLDERS / case)
    x = recorded[f"{case}/x"][:4]
    np.testing.assert_allclose(sae.encode(x), _loops(sae, x), rtol=0, atol=ATOL)


def test_topk_keeps_exactly_k_features_and_the_largest(recorded):
    sae = load_sae(FOLDERS / "topk")
    pre = sae.hidden_pre(recorded["topk/x"])
    acts = sae.encode(recorded["topk/x"])
    assert ((acts > 0).sum(axis=1) <= sae.cfg.k).all()
    for p, a in zip(pre, acts):
        kth = np.sort(p)[-sae.cfg.k]
        assert (a[p < kth] == 0).all() and np.array_equal(a[p >= kth], np.maximum(p[p >= kth], 0))


def test_a_hook_z_sae_reads_the_heads_side_by_side(tmp_path):
    raw = json.loads((FOLDERS / "standard" / "cfg.json").read_text())
    folder = tmp_path / "z"
    shutil.copytree(FOLDERS / "standard", folder)
    raw["reshape_activations"] = "hook_z"
    (folder / "cfg.json").write_text(json.dumps(raw))
    flat = load_sae(FOLDERS / "standard")
    by_head = load_sae(folder)
    z = np.random.default_rng(0).standard_normal((5, 4, 4)).astype(np.float32)  # [pos, head_index, d_head]
    np.testing.assert_array_equal(by_head.encode(z), flat.encode(z.reshape(5, 16)))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architecture": "gated"}, "architecture is 'gated'"),
        ({"normalize_activations": "layer_norm"}, "normalises its input ('layer_norm')"),
        ({"dtype": "bfloat16"}, "dtype is 'bfloat16'"),
        ({"metadata": {}}, "names no metadata.hook_name"),
        ({"reshape_activations": "hook_q"}, "reshapes its input"),
        ({"d_in": 17}, "W_enc has shape (16, 48), its cfg.json says (17, 48)"),
    ],
)
def test_what_cannot_run_is_refused_with_the_reason(change, message, tmp_path):
    folder = tmp_path / "sae"
    shutil.copytree(FOLDERS / "standard", folder)
    raw = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**raw, **change}))
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_sae(folder)


def test_a_folder_without_its_files_is_refused(tmp_path):
    with pytest.raises(InputError, match="has no cfg.json"):
        load_sae(tmp_path)
    shutil.copy(FOLDERS / "standard" / "cfg.json", tmp_path / "cfg.json")
    with pytest.raises(InputError, match="has no sae_weights.safetensors"):
        load_sae(tmp_path)


def test_vectors_of_the_wrong_width_and_features_out_of_range_are_refused():
    sae = load_sae(FOLDERS / "standard")
    with pytest.raises(InputError, match="reads vectors of 16 numbers, the activations have 8"):
        sae.encode(np.zeros((3, 8)))
    with pytest.raises(InputError, match="feature 48 is not in this SAE: it has features 0 to 47"):
        sae.feature_direction(48)
    np.testing.assert_array_equal(sae.feature_direction(3), sae.W_dec[3])


def test_saving_never_overwrites(tmp_path):
    sae = load_sae(FOLDERS / "standard")
    save_sae(sae, tmp_path / "a")
    with pytest.raises(InputError, match="exists already"):
        save_sae(sae, tmp_path / "a")


def test_config_round_trips_through_cfg_json():
    cfg = SAEConfig.from_dict(json.loads((FOLDERS / "topk-rescaled" / "cfg.json").read_text()))
    assert cfg.k == 5 and cfg.rescale_acts_by_decoder_norm and cfg.hook_name == "blocks.0.hook_resid_post"
    assert SAEConfig.from_dict(cfg.to_dict()) == cfg


def _sorted_rows(acts: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Each row's non-zero activations, largest first, ties by the lower index, at most k: a plain sort."""
    return [
        sorted(((i, float(v)) for i, v in enumerate(row) if v > 0), key=lambda t: (-t[1], t[0]))[:k] for row in acts
    ]


def _assert_top(idx: np.ndarray, val: np.ndarray, want: list[list[tuple[int, float]]]) -> None:
    """top_activations' answer is the sort's: the same features in the same order, values within float32's last
    bits (a product shared out in pieces may round differently from the whole, core/threads.py)."""
    got = [[(int(i), float(v)) for i, v in zip(ri, rv) if i >= 0] for ri, rv in zip(idx, val)]
    assert [[i for i, _v in row] for row in got] == [[i for i, _v in row] for row in want]
    np.testing.assert_allclose([v for row in got for _i, v in row], [v for row in want for _i, v in row], rtol=1e-6)
    assert ((idx < 0) == (val == 0)).all()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("k", [1, 3, 50])
def test_top_activations_are_encodes_largest_of_each_row(case, k, recorded, monkeypatch):
    """SAE.top_activations (a block of rows at a time, only the entries above the rows' block-maximum floor sorted)
    gives what encode followed by a full sort of each row gives, on one thread or a team of two."""
    from concurrent.futures import ThreadPoolExecutor

    from core import sae as sae_module
    from core.threads import Team

    sae = load_sae(FOLDERS / case)
    monkeypatch.setattr(sae_module, "ENCODE_ELEMENTS", sae.cfg.d_sae * sae_module.ENCODE_ROWS_MIN)  # 64-row blocks
    one = recorded[f"{case}/x"]
    x = np.concatenate([one] * (sae_module.ENCODE_ROWS_MIN // len(one) + 2))  # more rows than one block
    acts = sae.encode(x)
    want = _sorted_rows(acts, k)
    with ThreadPoolExecutor(1) as pool:
        for team in (None, Team(2, pool)):
            dense = np.empty_like(acts)
            idx, val = sae.top_activations(x, k, dense=dense) if team is None else sae.top_activations(x, k, team=team)
            _assert_top(idx, val, want)
            if team is None:
                np.testing.assert_allclose(dense, acts, rtol=1e-6, atol=1e-6)  # rows in blocks: see _assert_top


# 300 features: blocks of TOP_BLOCK that do not divide the row (every entry compared with the floor); 1,024: they
# do (only the k blocks of the largest maxima compared, unless another block's maximum ties the floor)
@pytest.mark.parametrize("d_sae", [300, 1024])
def test_top_activations_keep_ties_in_index_order_and_leave_zero_rows_empty(d_sae):
    cfg = SAEConfig("standard", 2, d_sae, "blocks.0.hook_resid_post", "induction", apply_b_dec_to_input=False)
    sae = SAE(
        cfg,
        np.zeros((2, d_sae), np.float32),
        np.zeros(d_sae, np.float32),
        np.zeros((d_sae, 2), np.float32),
        np.zeros(2, np.float32),
    )
    last = d_sae - 1
    sae.W_enc[0, [5, 200, last]] = 2.0  # three equal activations in different blocks
    sae.W_enc[0, 7] = 1.0
    sae.W_enc[1, [last, 3]] = 1.5  # a row whose tie lies in the chosen block's lower-indexed rival
    sae.W_enc[1, 600 % d_sae] = 3.0
    x = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    idx, val = sae.top_activations(x, 3)  # as many blocks as k: every positive entry is a candidate
    assert idx.tolist()[0] == [5, 200, last] and val.tolist()[0] == [2.0, 2.0, 2.0]
    idx, val = sae.top_activations(x, 2)  # more blocks than k: the floor is the 2nd largest block maximum
    assert idx.tolist()[0] == [5, 200] and val.tolist()[0] == [2.0, 2.0]
    assert idx.tolist()[1] == [600 % d_sae, 3] and val.tolist()[1] == [3.0, 1.5]
    idx, val = sae.top_activations(np.zeros((1, 2), np.float32), 2)
    assert idx.tolist() == [[-1, -1]] and val.tolist() == [[0.0, 0.0]]  # nothing positive: no features


@pytest.mark.parametrize("d_sae", [1000, 1024])  # blocks of core.sae.TOP_BLOCK, the last one short or not
@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_top_activations_of_wide_saes_equal_a_sort(d_sae, architecture, monkeypatch):
    """Also on a team of two that shares each block's product by pieces of W_enc's columns (256 wide here)."""
    from concurrent.futures import ThreadPoolExecutor

    from core import sae as sae_module
    from core.threads import Team

    monkeypatch.setattr(sae_module, "ENCODE_COLUMNS_MIN", 256)
    monkeypatch.setattr(sae_module, "ENCODE_ELEMENTS", d_sae * 128)  # blocks of 128 rows: the last one short
    rng = np.random.default_rng(3)
    cfg = SAEConfig(
        architecture, 16, d_sae, "blocks.0.hook_resid_post", "induction", k=40 if architecture == "topk" else None
    )
    arrays = [rng.normal(0, 0.5, s).astype(np.float32) for s in ((16, d_sae), (d_sae,), (d_sae, 16), (16,))]
    sae = SAE(cfg, *arrays)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    with ThreadPoolExecutor(1) as pool:
        for k in (1, 10, 64):
            want = _sorted_rows(sae.encode(x), k)
            for team in (None, Team(2, pool)):
                idx, val = sae.top_activations(x, k) if team is None else sae.top_activations(x, k, team=team)
                _assert_top(idx, val, want)


def test_top_activations_read_hook_z_as_encode_does(tmp_path):
    raw = json.loads((FOLDERS / "standard" / "cfg.json").read_text())
    shutil.copytree(FOLDERS / "standard", tmp_path / "z")
    (tmp_path / "z" / "cfg.json").write_text(json.dumps(raw | {"reshape_activations": "hook_z"}))
    sae = load_sae(tmp_path / "z")
    z = np.random.default_rng(0).standard_normal((300, 4, 4)).astype(np.float32)  # [pos, head_index, d_head]
    idx, val = sae.top_activations(z, 5)
    assert idx.shape == (300, 5)
    got = [[(int(i), float(v)) for i, v in zip(ri, rv) if i >= 0] for ri, rv in zip(idx, val)]
    assert got == _sorted_rows(sae.encode(z), 5)
