"""The SAE endpoints against core's own numbers: an SAE with random weights written in the test (core.sae.save_sae)
at the induction model's blocks.0.hook_resid_post, under a temporary EXPLORER_SAES_DIR; its activations are
core's encode of the run's own hook (from /api/v1/run), and the dashboard's numbers a direct computation's."""

from __future__ import annotations

import io
import json
import shutil
import zipfile

import numpy as np
import pytest

from app.api.sae_models import EXAMPLE_SAE
from core.sae import SAE, SAEConfig, load_sae, save_sae

HOOK = "blocks.0.hook_resid_post"
D_IN, D_SAE = 64, 96
TEXT = "Ali makan nasi lemak. Ali makan"


def _sae(architecture: str = "standard", model: str = "induction", hook: str = HOOK, d_in: int = D_IN, seed=0) -> SAE:
    rng = np.random.default_rng(seed)
    cfg = SAEConfig.from_dict(
        {
            "architecture": architecture,
            "d_in": d_in,
            "d_sae": D_SAE,
            "k": 8,
            "metadata": {"hook_name": hook, "model_name": model},
        }
    )
    return SAE(
        cfg,
        W_enc=rng.normal(0, 0.3, (d_in, D_SAE)).astype(np.float32),
        b_enc=rng.normal(-0.2, 0.1, D_SAE).astype(np.float32),
        W_dec=rng.normal(0, 0.3, (D_SAE, d_in)).astype(np.float32),
        b_dec=rng.normal(0, 0.1, d_in).astype(np.float32),
    )


@pytest.fixture(scope="module")
def saes_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("saes")
    save_sae(_sae(), root / "resid0")
    (root / "resid0" / "labels.json").write_text(json.dumps([{"index": 3, "label": "a test label"}]))
    save_sae(_sae("topk", seed=1), root / "topk0")
    save_sae(_sae(model="toy"), root / "for-toy")  # the toy's d_model is 64 too: usable, on another model
    save_sae(_sae(hook="blocks.7.hook_resid_post"), root / "no-such-hook")
    save_sae(_sae(d_in=32), root / "too-narrow")
    save_sae(_sae(model="gpt-9"), root / "unknown-model")
    (root / "broken").mkdir()
    (root / "broken" / "cfg.json").write_text("{not json")
    (root / "bad-labels").mkdir()
    save_sae(_sae(), root / "bad-labels" / "x")  # a folder within: its cfg.json is not at the top
    return root


@pytest.fixture(scope="module")
def api(saes_dir, tmp_path_factory):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    runs = tmp_path_factory.mktemp("runs")
    with TestClient(create_app(Settings(saes_dir=saes_dir, runs_dir=runs)), raise_server_exceptions=True) as c:
        yield c


def _hook(api, text=TEXT) -> np.ndarray:
    r = api.post("/api/v1/run", json={"model": "induction", "text": text, "hooks": [HOOK]})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["hooks"][HOOK], dtype=np.float64)


def test_the_list_names_every_folder_and_why_one_cannot_be_used(api):
    r = api.get("/api/v1/saes")
    assert r.status_code == 200
    by_name = {s["name"]: s for s in r.json()["saes"]}
    assert sorted(by_name) == sorted(
        ["resid0", "topk0", "for-toy", "no-such-hook", "too-narrow", "unknown-model", "broken", "bad-labels"]
        + [EXAMPLE_SAE]  # the shipped one, beside EXPLORER_SAES_DIR's
    )
    ok = by_name["resid0"]
    assert ok["problem"] is None and ok["model"] == "induction" and ok["hook"] == HOOK
    assert (ok["architecture"], ok["d_in"], ok["d_sae"]) == ("standard", D_IN, D_SAE)
    assert ok["labelled_features"] == [{"index": 3, "label": "a test label"}]
    assert by_name["for-toy"]["problem"] is None
    assert "does not have" in by_name["no-such-hook"]["problem"]
    assert "d_in is 32" in by_name["too-narrow"]["problem"]
    assert "gpt-9" in by_name["unknown-model"]["problem"]
    assert "not JSON" in by_name["broken"]["problem"]
    assert "cfg.json" in by_name["bad-labels"]["problem"]


@pytest.mark.parametrize("name", ["resid0", "topk0"])
def test_activations_are_cores_encode_of_the_runs_own_hook(api, saes_dir, name):
    top_k = 5
    r = api.post("/api/v1/analysis/features", json={"model": "induction", "text": TEXT, "sae": name, "top_k": top_k})
    assert r.status_code == 200, r.text
    body = r.json()
    acts = load_sae(saes_dir / name).encode(_hook(api))  # [pos, d_sae]
    assert len(body["features"]) == len(body["tokens"]) == acts.shape[0]
    for row, got in zip(acts, body["features"]):
        want = [i for i in np.argsort(-row, kind="stable") if row[i] > 0][:top_k]
        assert [f["index"] for f in got] == want
        np.testing.assert_allclose([f["activation"] for f in got], row[want], rtol=1e-5, atol=1e-6)
    assert any(body["features"])  # the test can fail: some token has active features
    assert body["labels"] == ({"3": "a test label"} if name == "resid0" else {})


def test_the_dashboard_is_a_direct_computation_over_the_models_text(api, saes_dir):
    from app.models.pretrained import TRAINED_DEFAULT_TEXT

    sae = load_sae(saes_dir / "resid0")
    text = TRAINED_DEFAULT_TEXT["induction"]  # the induction model's own text (its training data is random)
    x = _hook(api, text)
    acts = sae.encode(x)  # [pos, d_sae]
    index = int(np.argmax((acts > 0).sum(axis=0)))  # a feature that fires often
    r = api.get(f"/api/v1/saes/resid0/features/{index}")
    assert r.status_code == 200, r.text
    d = r.json()
    column = acts[:, index]
    assert d["tokens_scanned"] == len(column)
    assert d["density"] == pytest.approx(np.mean(column > 0))
    assert d["max_activation"] == pytest.approx(column.max(), rel=1e-5)
    counts, edges = np.histogram(column[column > 0], bins=20, range=(0, column.max()))
    assert d["histogram"]["counts"] == counts.tolist()
    np.testing.assert_allclose(d["histogram"]["edges"], edges, rtol=1e-5)
    tops = d["top_examples"]
    order = np.lexsort((np.arange(len(column)), -column))[: len(tops)]
    assert len(tops) == min(10, int((column > 0).sum()))
    tokens = api.post("/api/v1/run", json={"model": "induction", "text": text}).json()["tokens"]
    for example, pos in zip(tops, order):
        at = example["max_position"]
        assert example["tokens"][at] == tokens[pos]
        lo = pos - at
        assert example["tokens"] == tokens[lo : lo + len(example["tokens"])]
        np.testing.assert_allclose(
            example["activations"], column[lo : lo + len(example["tokens"])], rtol=1e-5, atol=1e-6
        )
    from app.deps import standalone_catalog

    params = standalone_catalog()["induction"].load_params(None, 0, None)
    effect = sae.W_dec[index].astype(np.float64) @ np.asarray(params["unembed"]["W_U"], dtype=np.float64)
    best = np.argsort(-effect, kind="stable")[:10]
    assert [t["id"] for t in d["logit_effect"]["positive"]] == best.tolist()
    np.testing.assert_allclose([t["value"] for t in d["logit_effect"]["positive"]], effect[best], rtol=1e-5)
    worst = np.argsort(-effect, kind="stable")[::-1][:10]
    assert [t["id"] for t in d["logit_effect"]["negative"]] == worst.tolist()
    assert api.get("/api/v1/saes/resid0/features/3").json()["label"] == "a test label"


def test_the_scan_is_kept_in_a_cache_file_written_whole(api, tmp_path_factory):
    api.get("/api/v1/saes/resid0/features/0")
    from app.service import features

    assert features._SCANS  # in memory
    runs = [p for p in tmp_path_factory.getbasetemp().glob("runs*/.sae-scans/*.npz")]
    assert runs and not list(runs[0].parent.glob(".scan-*"))  # a whole file, nothing half-written beside it


def test_the_download_is_the_folder_saelens_reads(api, saes_dir, tmp_path):
    r = api.get("/api/v1/saes/resid0/download")
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    zipfile.ZipFile(io.BytesIO(r.content)).extractall(tmp_path)
    assert sorted(p.name for p in (tmp_path / "resid0").iterdir()) == [
        "cfg.json",
        "labels.json",
        "sae_weights.safetensors",
    ]
    a, b = load_sae(tmp_path / "resid0"), load_sae(saes_dir / "resid0")
    np.testing.assert_array_equal(a.W_enc, b.W_enc)


@pytest.mark.parametrize(
    "body, says",
    [
        ({"sae": "nope"}, "unknown SAE 'nope'"),
        ({"sae": "for-toy"}, "reads model 'toy'"),
        ({"sae": "no-such-hook"}, "does not have"),
        ({"sae": "too-narrow"}, "d_in is 32"),
        ({"sae": "unknown-model"}, "gpt-9"),
        ({"sae": "broken"}, "not JSON"),
        ({"sae": "resid0", "top_k": 0}, "greater than or equal to 1"),
        ({"sae": "resid0", "top_k": 101}, "less than or equal to 100"),
        ({"sae": "resid0", "n_layers": 1, "model": "toy"}, "reads model 'induction'"),
    ],
)
def test_bad_input_is_a_422_with_the_reason(api, body, says):
    r = api.post("/api/v1/analysis/features", json={"model": "induction", "text": TEXT, **body})
    assert r.status_code == 422, r.text
    assert says in r.text


def test_a_toy_run_whose_hook_is_gone_is_refused(api):
    r = api.post("/api/v1/analysis/features", json={"model": "toy", "text": "abc", "sae": "for-toy", "n_layers": 1})
    assert r.status_code == 200  # layer 0 is still there
    r = api.post("/api/v1/analysis/features", json={"model": "toy", "text": "abc", "sae": "for-toy", "d_model": 32})
    assert r.status_code == 422 and "64" in r.text


@pytest.mark.parametrize(
    "path, says",
    [
        ("/api/v1/saes/resid0/features/96", "it has features 0 to 95"),
        ("/api/v1/saes/nope/features/0", "unknown SAE"),
        ("/api/v1/saes/too-narrow/features/0", "d_in is 32"),
        ("/api/v1/saes/resid0/features/-1", "greater than or equal to 0"),
        ("/api/v1/saes/broken/download", "cannot be downloaded"),
        ("/api/v1/saes/nope/download", "unknown SAE"),
    ],
)
def test_bad_dashboard_and_download_requests_are_422s_with_the_reason(api, path, says):
    r = api.get(path)
    assert r.status_code == 422, r.text
    assert says in r.text


def test_without_a_saes_dir_the_shipped_sae_is_listed_usable_with_its_labels(client_with, tmp_path):
    """core/trained/saes/ ships with the app (scripts/train_shipped_sae.py; its labels tested in
    tests/core/test_shipped_sae.py): a server with no EXPLORER_SAES_DIR lists it. Its own runs folder: the
    session's holds whatever SAE runs other tests trained (tests/api/test_fuzz.py posts the train examples)."""
    r = client_with(runs_dir=tmp_path).get("/api/v1/saes")
    assert r.status_code == 200
    (sae,) = r.json()["saes"]
    assert sae["name"] == EXAMPLE_SAE and sae["model"] == "python-docs-induction" and sae["problem"] is None
    assert len(sae["labelled_features"]) >= 8


def test_the_schemas_example_runs_on_the_shipped_sae(client):
    from app.api.sae_models import FeaturesRequest

    (example,) = FeaturesRequest.model_config["json_schema_extra"]["examples"]  # type: ignore[index]
    r = client.post("/api/v1/analysis/features", json=example)
    assert r.status_code == 200, r.text
    d = r.json()
    assert len(d["features"]) == len(d["tokens"]) and all(0 < len(f) <= 5 for f in d["features"])
    assert d["labels"]  # the labelled features, by index


def test_a_saes_dir_folder_named_as_the_shipped_one_takes_its_place(tmp_path):
    from app.models.saes import SHIPPED_SAES_DIR, open_saes

    shutil.copytree(SHIPPED_SAES_DIR / EXAMPLE_SAE, tmp_path / EXAMPLE_SAE)
    (tmp_path / EXAMPLE_SAE / "labels.json").write_text('[{"index": 0, "label": "mine"}]')
    entry = open_saes(tmp_path)[EXAMPLE_SAE]
    assert entry.folder == tmp_path / EXAMPLE_SAE and entry.label(0) == "mine"


def test_the_scan_reads_at_most_sae_scan_max_tokens(saes_dir, tmp_path):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    with TestClient(create_app(Settings(saes_dir=saes_dir, runs_dir=tmp_path, sae_scan_max_tokens=7))) as c:
        d = c.get("/api/v1/saes/topk0/features/0").json()  # topk0: no other test's scan of it is cached
    assert d["tokens_scanned"] == 7


def test_an_sae_of_weights_that_have_changed_since_is_refused_with_the_reason(tmp_path):
    """An SAE trained here on a model run carries that run's weights' digest (metadata.settings.model_sha256); when
    the model's weights are no longer those (the run trained further under its name), the SAE is listed with the
    reason and its features are a 422; with the model's own digest it is usable."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from core.checkpoints import trained_models
    from core.sae_run import weights_digest

    now = weights_digest(trained_models()["induction"])
    for name, digest in (("current", now), ("stale", "0" * 64)):
        sae = _sae()
        cfg = SAEConfig.from_dict(
            {
                **sae.cfg.to_dict(),
                "metadata": {**sae.cfg.to_dict()["metadata"], "settings": {"recipe": "sae", "model_sha256": digest}},
            }
        )
        save_sae(SAE(cfg, sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec), tmp_path / "saes" / name)
    with TestClient(create_app(Settings(saes_dir=tmp_path / "saes", runs_dir=tmp_path / "runs"))) as c:
        by_name = {s["name"]: s for s in c.get("/api/v1/saes").json()["saes"]}
        assert by_name["current"]["problem"] is None
        assert "before that run trained further" in by_name["stale"]["problem"]
        body = {"model": "induction", "text": TEXT, "top_k": 3}
        assert c.post("/api/v1/analysis/features", json=body | {"sae": "current"}).status_code == 200
        r = c.post("/api/v1/analysis/features", json=body | {"sae": "stale"})
        assert r.status_code == 422 and "train an SAE on its weights now" in r.text
