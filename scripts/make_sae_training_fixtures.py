"""Record SAELens's own encode of an SAE trained here and downloaded through the API, for
tests/api/test_sae_training.py (`make fixtures`).

Runs in the SAELens venv (the Makefile's SAEENV, pinned by SAE_PINS), never in the app's. It asks the app's own
Python (--app-python, the Makefile's $(PY)) to train a small top-k SAE with the sae recipe in process (a TestClient
on a fresh runs folder: POST /api/v1/train, then GET /api/v1/saes/{id}/download) and to read the SAE's hook on a
text (POST /api/v1/run); it unpacks the zip into tests/fixtures/sae-trained/ as the API sent it, opens that folder
with SAELens's `SAE.load_from_disk` and records SAELens's `encode` of the hook's vectors in
tests/fixtures/sae_trained.npz (with the request, so the test can ask for the same SAE again).

    $(SAEENV)/bin/python scripts/make_sae_training_fixtures.py --app-python .venv/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import zipfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from sae_lens import SAE

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "sae-trained"
RECORD = REPO / "tests" / "fixtures" / "sae_trained.npz"
REQUEST = {"recipe": "sae", "model": "induction", "hook": "blocks.0.hook_resid_post", "d_sae": 128, "k": 8}
REQUEST |= {"steps": 60, "batch_size": 64, "eval_interval": 20}
TEXT = "ali makan nasi lemak. ali makan nasi lemak."

# What the app's Python runs: train, download, read the hook; prints {"id", "zip" (hex), "x"} as JSON.
IN_APP = """
import json, sys, tempfile, time
from fastapi.testclient import TestClient
from app.main import create_app
from app.settings import Settings
request, text = json.loads(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory() as runs, TestClient(create_app(Settings(runs_dir=runs))) as c:
    id = c.post("/api/v1/train", json=request).json()["id"]
    while (run := c.get(f"/api/v1/runs/{id}").json())["status"] not in ("done", "failed"):
        time.sleep(0.2)
    assert run["status"] == "done", run["error"]
    zipped = c.get(f"/api/v1/saes/{id}/download").content
    hook = request["hook"]
    x = c.post("/api/v1/run", json={"model": request["model"], "text": text, "hooks": [hook]}).json()
    print(json.dumps({"id": id, "zip": zipped.hex(), "x": x["hooks"][hook]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--app-python", default=str(REPO / ".venv" / "bin" / "python"))
    args = ap.parse_args()
    done = subprocess.run(
        [args.app_python, "-c", IN_APP, json.dumps(REQUEST), TEXT],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        env={"EXPLORER_ACCESS_LOG": "false", "PATH": "/usr/bin:/bin"},
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if OUT.exists():
        shutil.rmtree(OUT)
    with zipfile.ZipFile(io.BytesIO(bytes.fromhex(answer["zip"]))) as z:
        for name in z.namelist():  # <id>/cfg.json, <id>/sae_weights.safetensors
            (OUT / Path(name).name).parent.mkdir(parents=True, exist_ok=True)
            (OUT / Path(name).name).write_bytes(z.read(name))
    sae = SAE.load_from_disk(str(OUT))
    x = torch.tensor(answer["x"], dtype=torch.float32)
    with torch.no_grad():
        acts = sae.encode(x)
    record = {
        "x": x.numpy(),
        "acts": acts.numpy(),
        "request": np.array(json.dumps(REQUEST)),
        "id": np.array(answer["id"]),
        "saelens_class": np.array(type(sae).__name__),
        "meta_generator_sha256": np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest()),
    }
    for package in ("sae-lens", "torch"):
        record[f"meta_{package.replace('-', '_')}_version"] = np.array(version(package))
    np.savez_compressed(RECORD, **record)
    l0 = float((acts > 0).float().sum(-1).mean())
    print(f"{answer['id']}: {type(sae).__name__}, L0 {l0:.2f}; wrote {OUT}, {RECORD}")


if __name__ == "__main__":
    main()
