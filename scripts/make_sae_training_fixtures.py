"""Record SAELens's own encode of SAEs trained here and downloaded through the API (a top-k one and a JumpReLU
one), for tests/api/test_sae_training.py (`make fixtures`).

Runs in the SAELens venv (the Makefile's SAEENV, pinned by SAE_PINS), never in the app's. It asks the app's own
Python (--app-python, the Makefile's $(PY)) to train a small SAE of each with the sae recipe in process (a
TestClient on a fresh runs folder: POST /api/v1/train, then GET /api/v1/saes/{id}/download) and to read the SAE's
hook on a text (POST /api/v1/run); it unpacks the zip into tests/fixtures/sae-trained/ (the JumpReLU one:
sae-trained-jumprelu/) as the API sent it, opens that folder with SAELens's `SAE.load_from_disk` and records
SAELens's `encode` of the hook's vectors in tests/fixtures/sae_trained.npz (sae_trained_jumprelu.npz), with the
request, so the test can ask for the same SAE again.

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
FIXTURES = REPO / "tests" / "fixtures"
REQUEST = {"recipe": "sae", "model": "induction", "hook": "blocks.0.hook_resid_post", "d_sae": 128, "k": 8}
REQUEST |= {"steps": 60, "batch_size": 64, "eval_interval": 20}
JUMPRELU = {k: v for k, v in REQUEST.items() if k != "k"} | {"architecture": "jumprelu", "l0_coefficient": 0.5}
# (folder, record, request)
SAES = [
    (FIXTURES / "sae-trained", FIXTURES / "sae_trained.npz", REQUEST),
    (FIXTURES / "sae-trained-jumprelu", FIXTURES / "sae_trained_jumprelu.npz", JUMPRELU),
]
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
    for out, record, request in SAES:
        make(args.app_python, out, record, request)


def make(app_python: str, out: Path, record_file: Path, request: dict) -> None:
    done = subprocess.run(
        [app_python, "-c", IN_APP, json.dumps(request), TEXT],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        env={"EXPLORER_ACCESS_LOG": "false", "PATH": "/usr/bin:/bin"},
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if out.exists():
        shutil.rmtree(out)
    with zipfile.ZipFile(io.BytesIO(bytes.fromhex(answer["zip"]))) as z:
        for name in z.namelist():  # <id>/cfg.json, <id>/sae_weights.safetensors
            (out / Path(name).name).parent.mkdir(parents=True, exist_ok=True)
            (out / Path(name).name).write_bytes(z.read(name))
    sae = SAE.load_from_disk(str(out))
    x = torch.tensor(answer["x"], dtype=torch.float32)
    with torch.no_grad():
        acts = sae.encode(x)
    record = {
        "x": x.numpy(),
        "acts": acts.numpy(),
        "request": np.array(json.dumps(request)),
        "id": np.array(answer["id"]),
        "saelens_class": np.array(type(sae).__name__),
        "meta_generator_sha256": np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest()),
    }
    for package in ("sae-lens", "torch"):
        record[f"meta_{package.replace('-', '_')}_version"] = np.array(version(package))
    np.savez_compressed(record_file, **record)
    l0 = float((acts > 0).float().sum(-1).mean())
    print(f"{answer['id']}: {type(sae).__name__}, L0 {l0:.2f}; wrote {out}, {record_file}")


if __name__ == "__main__":
    main()
