"""Training a sparse autoencoder as a training run (recipe `sae`, core/sae_run.py): through the API in process,
and on real servers with real worker processes on both stores (the runs folder's trainer processes, and Redis
with a Celery worker), as tests/api/test_training.py trains models. A tiny SAE, few steps.

The run streams SAELens's batch metrics (MSE, explained variance, L0, dead fraction), is the same run for the
same request, cancels and resumes from its snapshot, and once it has weights is an SAE of GET /api/v1/saes
(named by the run's id, `sae` in the run's info), downloadable as a SAELens folder and usable by the features
endpoint; bad settings are readable 422s in both languages.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from core.sae import load_sae
from tests.api.test_training import (  # noqa: F401  (the fixtures, used by name)
    redis_replica,
    redis_stack,
    runs_dir,
    server,
    start,
    store,
    wait,
)
from tests.scale import services

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

HOOK = "blocks.0.hook_resid_post"
QUICK = {"recipe": "sae", "model": "induction", "hook": HOOK, "d_sae": 128, "k": 8, "steps": 40}
QUICK |= {"batch_size": 64, "eval_interval": 10}
LONG = QUICK | {"steps": 20000, "eval_interval": 50}  # long enough to stop mid-run
METRICS = ("mse", "explained_variance", "l0", "dead_fraction")


def test_an_sae_run_trains_in_a_worker_and_becomes_an_sae(store, server):  # noqa: F811 (fixtures)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/api/v1/train", json=QUICK)
        assert r.status_code == 202, r.text
        id = r.json()["id"]
        assert id.startswith("sae-")
        run = wait(c, id)
        assert run["status"] == "done" and run["step"] == 40 and run["sae"] == id and run["model"] is None
        m = run["metrics"]
        assert m["step"] == [10, 20, 30, 40] and all(len(m[k]) == 4 for k in METRICS)
        assert m["l0"] == [8.0] * 4  # top-k: exactly k features a token
        assert m["mse"][-1] < m["mse"][0] and m["explained_variance"][-1] > m["explained_variance"][0]
        assert all(0 <= d <= 1 for d in m["dead_fraction"]) and run["heads"]["step"] == []
        assert run["config"]["architecture"] == "topk" and run["config"]["d_sae"] == 128
        # an SAE of the server, not a model
        listed = {s["name"]: s for s in c.get("/api/v1/saes").json()["saes"]}
        assert listed[id]["model"] == "induction" and listed[id]["hook"] == HOOK
        assert (listed[id]["d_in"], listed[id]["d_sae"], listed[id]["architecture"]) == (64, 128, "topk")
        assert id not in [model["name"] for model in c.get("/api/v1/models").json()["models"]]
        # its download is a SAELens folder; the features endpoint reads the same numbers
        z = zipfile.ZipFile(io.BytesIO(c.get(f"/api/v1/saes/{id}/download").content))
        names = {n.rsplit("/", 1)[-1] for n in z.namelist()}
        assert {"cfg.json", "sae_weights.safetensors"} <= names
        cfg = json.loads(next(z.read(n) for n in z.namelist() if n.endswith("cfg.json")))
        assert cfg["k"] == 8 and cfg["metadata"]["hook_name"] == HOOK and cfg["metadata"]["model_name"] == "induction"
        text = "ali makan nasi lemak. ali makan nasi lemak."
        features = c.post("/api/v1/analysis/features", json={"model": "induction", "text": text, "sae": id, "top_k": 8})
        assert features.status_code == 200, features.text
        assert all(1 <= len(row) <= 8 for row in features.json()["features"])
        # the same request is the same run, done already
        again = c.post("/api/v1/train", json=QUICK).json()
        assert again["id"] == id and again["status"] == "done" and not again["queued"]


def test_the_events_stream_carries_the_sae_metrics(server):  # noqa: F811 (a fixture)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        id = c.post("/api/v1/train", json=QUICK | {"seed": 3, "steps": 200, "eval_interval": 20}).json()["id"]
        with c.stream("GET", f"/api/v1/runs/{id}/events") as stream:
            events = list(services.parse_events(stream.iter_lines()))
        assert events[0]["event"] == "run" and events[-1]["event"] == "end"
        records = [json.loads(e["data"]) for e in events if e["event"] == "record"]
        final = [json.loads(e["data"]) for e in events if e["event"] == "run"][-1]
        assert final["status"] == "done" and final["sae"] == id
        assert [r["step"] for r in records] == sorted({r["step"] for r in records})
        assert all(set(METRICS) <= set(r) for r in records)
        assert final["metrics"]["step"][-1] == 200 and len(final["metrics"]["mse"]) == 10


def test_cancel_keeps_the_sae_so_far_and_a_repeat_resumes_it(server):  # noqa: F811 (a fixture)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        id = c.post("/api/v1/train", json=LONG).json()["id"]
        run = wait(c, id, until=("running",))
        while run["step"] < 260:
            run = c.get(f"/api/v1/runs/{id}").json()
            time.sleep(0.1)
        assert c.delete(f"/api/v1/runs/{id}").status_code == 200
        run = wait(c, id)
        assert run["status"] == "cancelled" and run["resumable"] and run["sae"] == id
        at = run["step"]
        assert 260 <= at < LONG["steps"]
        assert id in [s["name"] for s in c.get("/api/v1/saes").json()["saes"]]  # what it learned so far
        again = c.post("/api/v1/train", json=LONG).json()
        assert again["id"] == id and again["queued"]
        run = wait(c, id, until=("running",))
        assert run["step"] >= 250 * (at // 250)  # from its snapshot (every 5 records), not from zero
        c.delete(f"/api/v1/runs/{id}")
        wait(c, id)


MODEL_RUN = {"recipe": "nasi-lemak", "steps": 40, "eval_interval": 10, "seed": 11}  # a learner's own model


def test_an_sae_learns_a_model_trained_here(store, server):  # noqa: F811 (fixtures)
    """A model run, once it has weights, is a model an SAE run reads (named by the run's id, as /api/v1/run
    names it); the SAE reads that model on /api/v1/analysis/features, lists and downloads like any other."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        model = c.post("/api/v1/train", json=MODEL_RUN).json()["id"]
        assert wait(c, model)["model"] == model
        body = QUICK | {"model": model, "d_sae": 32, "k": 4}
        r = c.post("/api/v1/train", json=body)
        assert r.status_code == 202, r.text
        id = r.json()["id"]
        run = wait(c, id)
        assert run["status"] == "done" and run["sae"] == id, run["error"]
        assert run["config"]["model"] == model and len(run["config"]["model_sha256"]) == 64
        assert run["metrics"]["l0"] == [4.0] * 4
        listed = {s["name"]: s for s in c.get("/api/v1/saes").json()["saes"]}
        assert (listed[id]["model"], listed[id]["hook"], listed[id]["d_in"]) == (model, HOOK, 16)
        features = c.post("/api/v1/analysis/features", json={"model": model, "text": "nasi lemak", "sae": id})
        assert features.status_code == 200, features.text
        assert len(features.json()["features"]) == len("nasi lemak") and any(features.json()["features"])
        z = zipfile.ZipFile(io.BytesIO(c.get(f"/api/v1/saes/{id}/download").content))
        cfg = json.loads(next(z.read(n) for n in z.namelist() if n.endswith("cfg.json")))
        assert cfg["metadata"]["model_name"] == model
        checkpoint = zipfile.ZipFile(io.BytesIO(c.get(f"/api/v1/runs/{id}/checkpoint").content))
        assert sorted(checkpoint.namelist()) == sorted(z.namelist())  # the run's weights: the SAELens folder
        again = c.post("/api/v1/train", json=body).json()
        assert again["id"] == id and not again["queued"]  # the same model's same weights: the same run
        # what cannot be learned from, said
        for wrong, says in [
            ("nasi-lemak-000000000000", "there is no run nasi-lemak-000000000000"),
            (id, "is an SAE's run"),
        ]:
            refused = c.post("/api/v1/train", json=body | {"model": wrong})
            assert refused.status_code == 422 and says in refused.json()["detail"][0]["msg"], refused.text
        assert c.get("/features", params={"model": model, "sae": id, "text": "nasi lemak"}).status_code == 200


def test_an_sae_of_a_model_run_is_named_by_the_weights_it_reads(client_with, tmp_path):
    """A model run without weights yet is refused; once stopped it has some (a checkpoint an SAE can learn), and
    after it trains further the same SAE request names another run: the weights' digest is in the id."""
    c = client_with(runs_dir=tmp_path / "runs")
    model = c.post("/api/v1/train", json=MODEL_RUN | {"steps": 20000, "eval_interval": 50}).json()["id"]
    body = QUICK | {"model": model, "d_sae": 32, "k": 4}
    early = c.post("/api/v1/train", json=body)
    assert early.status_code == 422 and "has no weights yet" in early.json()["detail"][0]["msg"], early.text
    malay = c.post("/api/v1/train", json=body, headers={"Accept-Language": "ms"})
    assert malay.status_code == 422 and malay.json()["detail"][0]["msg"] != early.json()["detail"][0]["msg"]
    ids = []
    for _ in range(2):  # train a while, stop: a checkpoint; then again from there, further
        while c.get(f"/api/v1/runs/{model}").json()["step"] < 100 * (len(ids) + 1):
            time.sleep(0.05)
        c.delete(f"/api/v1/runs/{model}")
        while (run := c.get(f"/api/v1/runs/{model}").json())["status"] != "cancelled":
            time.sleep(0.05)
        assert run["model"] == model
        r = c.post("/api/v1/train", json=body)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
        c.delete(f"/api/v1/runs/{ids[-1]}")
        if len(ids) == 1:
            assert c.post("/api/v1/train", json=MODEL_RUN | {"steps": 20000, "eval_interval": 50}).json()["queued"]
    assert ids[0] != ids[1]
    assert f'href="/train?recipe=sae&amp;model={model}"' in c.get("/train", params={"run": model}).text
    page = c.get("/train", params={"recipe": "sae", "model": model}).text  # the form offers the model run
    assert f'<option value="{model}" selected>' in page and f"{HOOK} (16)" in page
    digests = [c.get(f"/api/v1/runs/{id}").json()["config"]["model_sha256"] for id in ids]
    assert digests[0] != digests[1]


@pytest.mark.parametrize(
    "body, says",
    [
        ({"architecture": "gated"}, "architecture"),
        ({"architecture": "standard", "k": 4}, "k is the topk"),
        ({"l1_coefficient": 1.0}, "l1_coefficient is the standard"),
        ({"architecture": "jumprelu", "k": 4}, "k is the topk architecture's setting; a jumprelu SAE takes l0_coeff"),
        ({"l0_coefficient": 1.0}, "l0_coefficient is the jumprelu"),
        ({"architecture": "standard", "jumprelu_init_threshold": 0.1}, "jumprelu_init_threshold is the jumprelu"),
        ({"architecture": "jumprelu", "jumprelu_bandwidth": 0}, "jumprelu_bandwidth"),
        ({"architecture": "jumprelu", "l0_coefficient": 101}, "l0_coefficient"),
        ({"architecture": "jumprelu", "jumprelu_init_threshold": -0.1}, "jumprelu_init_threshold"),
        ({"model": "gpt2"}, "shipped"),
        ({"hook": "blocks.9.hook_resid_post"}, "blocks.0.hook_resid_post"),
        ({"n_layers": 3}, "n_layers"),
        ({"d_sae": 0}, "d_sae"),
        ({"d_sae": 5000}, "d_sae"),
        ({"d_sae": 16, "k": 32}, "k=32"),
        ({"hook": "x" * 101}, "hook"),
    ],
)
def test_bad_sae_settings_are_readable_422s(client, body, says):
    r = client.post("/api/v1/train", json={"recipe": "sae"} | body)
    assert r.status_code == 422, r.text
    assert says in " ".join(str(d["msg"]) + str(d.get("loc")) for d in r.json()["detail"])


def test_a_model_recipe_refuses_the_sae_settings_in_both_languages(client):
    english = client.post("/api/v1/train", json={"recipe": "induction", "d_sae": 64})
    malay = client.post("/api/v1/train", json={"recipe": "induction", "d_sae": 64}, headers={"Accept-Language": "ms"})
    assert english.status_code == malay.status_code == 422
    said, dikata = english.json()["detail"][0]["msg"], malay.json()["detail"][0]["msg"]
    assert "d_sae" in said and "d_sae" in dikata and said != dikata
    k = client.post(
        "/api/v1/train", json={"recipe": "sae", "architecture": "standard", "k": 4}, headers={"Accept-Language": "ms"}
    )
    assert k.status_code == 422 and "k is the topk" not in k.json()["detail"][0]["msg"]


def test_the_same_sae_request_names_the_same_run_in_process(client_with, tmp_path):
    """In process (TestClient and the app's own scheduler): the id is the settings' hash, defaults filled in."""
    c = client_with(runs_dir=tmp_path / "runs")
    first = c.post("/api/v1/train", json=QUICK)
    assert first.status_code == 202, first.text
    id = first.json()["id"]
    spelled = c.post("/api/v1/train", json=QUICK | {"architecture": "topk", "seed": 0, "lr": 1e-3})
    assert spelled.json()["id"] == id and not spelled.json()["queued"]
    assert c.post("/api/v1/train", json=QUICK | {"seed": 1}).json()["id"] != id
    deadline = time.monotonic() + 120
    while (run := c.get(f"/api/v1/runs/{id}").json())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert run["status"] == "done", run["error"]
    sae = c.get(f"/api/v1/saes/{id}/download")
    assert sae.status_code == 200 and sae.headers["content-type"] == "application/zip"
    assert np.isfinite(run["metrics"]["mse"]).all()


def test_a_jumprelu_sae_trains_is_listed_and_read_in_process(client_with, tmp_path):
    """A JumpReLU run (SAELens's objective: core/sae_train.py, checked against SAELens in tests/core/test_sae_jumprelu.py)
    streams the same four metrics, becomes an SAE of GET /api/v1/saes with its thresholds, and the features endpoint
    reads it (core/sae.py's jumprelu encode)."""
    c = client_with(runs_dir=tmp_path / "runs")
    body = {k: v for k, v in QUICK.items() if k != "k"} | {"architecture": "jumprelu", "jumprelu_init_threshold": 0.5}
    r = c.post("/api/v1/train", json=body)
    assert r.status_code == 202, r.text
    id = r.json()["id"]
    deadline = time.monotonic() + 120
    while (run := c.get(f"/api/v1/runs/{id}").json())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert run["status"] == "done" and run["sae"] == id, run["error"]
    m = run["metrics"]
    assert m["step"] == [10, 20, 30, 40] and all(len(m[k]) == 4 and np.isfinite(m[k]).all() for k in METRICS)
    assert 0 < m["l0"][-1] < 128 and len(set(m["l0"])) > 1  # thresholds, not a fixed k
    assert m["explained_variance"][-1] > m["explained_variance"][0]
    config = run["config"]
    assert (config["architecture"], config["k"], config["l0_coefficient"], config["jumprelu_bandwidth"]) == (
        "jumprelu",
        None,
        1.0,
        0.05,
    )
    listed = {s["name"]: s for s in c.get("/api/v1/saes").json()["saes"]}
    assert (listed[id]["architecture"], listed[id]["d_sae"], listed[id]["hook"]) == ("jumprelu", 128, HOOK)
    with zipfile.ZipFile(io.BytesIO(c.get(f"/api/v1/saes/{id}/download").content)) as z:
        z.extractall(tmp_path / "download")
    sae = load_sae(tmp_path / "download" / id)
    assert sae.threshold is not None and sae.threshold.shape == (128,) and (sae.threshold != 0.5).any()
    text = "ali makan nasi lemak. ali makan nasi lemak."
    features = c.post("/api/v1/analysis/features", json={"model": "induction", "text": text, "sae": id, "top_k": 8})
    assert features.status_code == 200, features.text
    x = c.post("/api/v1/run", json={"model": "induction", "text": text, "hooks": [HOOK]}).json()["hooks"][HOOK]
    acts = sae.encode(np.asarray(x, dtype=np.float32))
    for row, want in zip(features.json()["features"], acts):
        assert [f["index"] for f in row] == list(np.argsort(-want, kind="stable")[: len(row)])
        assert all(want[f["index"]] > sae.threshold[f["index"]] for f in row)


@pytest.mark.parametrize(
    "folder, record_file, saelens_class",
    [
        ("sae-trained", "sae_trained.npz", "TopKSAE"),
        ("sae-trained-jumprelu", "sae_trained_jumprelu.npz", "JumpReLUSAE"),
    ],
    ids=["topk", "jumprelu"],
)
def test_a_downloaded_sae_opens_in_saelens_with_the_same_activations(
    client_with, tmp_path, folder, record_file, saelens_class
):
    """tests/fixtures/sae-trained/ (a JumpReLU one: sae-trained-jumprelu/) is a download of
    GET /api/v1/saes/{id}/download, unpacked, and sae_trained.npz (sae_trained_jumprelu.npz) SAELens's
    `SAE.load_from_disk` of it and its `encode` of the hook's vectors on a text (scripts/make_sae_training_fixtures.py,
    SAELens 6.54.12): core reads the same activations from the folder, and the API downloads that folder for that
    request today (the same cfg.json, the weights within bounds)."""
    record = np.load(FIXTURES / record_file)
    assert str(record["saelens_class"]) == saelens_class
    sae = load_sae(FIXTURES / folder)
    assert sae.cfg.architecture == json.loads(str(record["request"])).get("architecture", "topk")
    acts = sae.encode(record["x"])
    assert np.array_equal(acts > 0, record["acts"] > 0)  # the same features of every token (top-k's k; jumprelu's)
    assert 0 < (acts > 0).sum(-1).mean() < sae.cfg.d_sae  # sparse, not empty
    np.testing.assert_allclose(acts, record["acts"], rtol=1e-5, atol=1e-5)
    request = json.loads(str(record["request"]))
    c = client_with(runs_dir=tmp_path / "runs")
    id = c.post("/api/v1/train", json=request).json()["id"]
    assert id == str(record["id"])  # the same request names the same run on any server
    deadline = time.monotonic() + 120
    while c.get(f"/api/v1/runs/{id}").json()["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with zipfile.ZipFile(io.BytesIO(c.get(f"/api/v1/saes/{id}/download").content)) as z:
        z.extractall(tmp_path / "download")
    again = tmp_path / "download" / id
    cfg = json.loads((FIXTURES / folder / "cfg.json").read_text())
    assert json.loads((again / "cfg.json").read_text()) == cfg
    fresh = load_sae(again)
    for name, array in sae.arrays().items():  # one BLAS thread: bit for bit on one machine, close on another
        np.testing.assert_allclose(getattr(fresh, name), array, rtol=1e-3, atol=1e-4)


def test_the_checkpoint_route_says_an_sae_runs_weights_are_a_saelens_folder(client):
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/api/v1/runs/{id}/checkpoint"]["get"]
    for said in (operation["summary"], operation["description"], operation["responses"]["200"]["description"]):
        assert "SAELens" in said and "GPT-2" in said
    links = spec["components"]["schemas"]["TrainingRunLinks"]["properties"]["checkpoint"]["description"]
    assert "SAELens" in links and "GPT-2" in links


def test_the_sae_catalogue_lists_its_folders_while_the_store_is_out_of_reach():
    """Redis down: GET /api/v1/saes still lists EXPLORER_SAES_DIR's SAEs; a trained one is missing meanwhile."""
    from app.models.saes import SAECatalog
    from app.training.base import StoreUnavailable

    class Away:
        def __getattr__(self, name):
            def unavailable(*args, **kwargs):
                raise StoreUnavailable("Redis is out of reach")

            return unavailable

    catalog = SAECatalog(FIXTURES / "saes", runs=Away())  # type: ignore[arg-type]
    assert list(catalog) == sorted(p.name for p in (FIXTURES / "saes").iterdir() if p.is_dir())
    with pytest.raises(Exception, match="unknown SAE"):
        catalog.get_entry("sae-0123456789ab")
