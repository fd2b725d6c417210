"""Retraining the shipped python-docs-induction model (core/trained/python-docs-induction) with the command that
`make trained-models` runs, and what of it reproduces where.

Bit for bit only with the card's NumPy and CPython (the corpus is that Python's pydoc topics: the card records
its SHA-256), the card's BLAS kernel (OPENBLAS_CORETYPE=Haswell on x86-64) and one BLAS thread. Elsewhere a
3,000-step run drifts from the shipped weights: another kernel adds a product's terms in another order, and a
long run carries the last bits further (the induction model retrained on SkylakeX instead of Haswell ends 0.82
from its shipped weights, docs/training.md). Measured on 2026-12-02 on a 2-core AMD EPYC (NumPy 2.4.6, OpenBLAS
0.3.31, Python 3.11.7): under the card's Haswell kernel the four files byte for byte; under the CPU's own SkylakeX
kernel weights 1.4e-4 (max abs) from the shipped ones, head scores and copy loss the same to 3 decimals. So what
is held on any CPU is what the model does, not its bytes:

- the card and the tokenizer are the shipped ones, but for the machine's fields (NumPy, Python, BLAS);
- a previous-token head forms in layer 0 and an induction head in layer 1, each scoring at least 0.4 on a
  sentence said twice (issue 25's bar), each layer's best score within 0.1 of the shipped model's;
- the second copy of a docs sentence is predicted from the first: its characters cost at most 0.5 nats each
  (python-docs, the same recipe without repeats, 0.95; the shipped model 0.24), within 0.1 of the shipped model;
- on the card's kernel, NumPy and Python: the shipped model.safetensors, byte for byte.

Retraining takes about 25 minutes on one free core (longer on a busy machine), so it runs only when asked:

    EXPLORER_RETRAIN=1 .venv/bin/python -m pytest -q -rP tests/core/test_python_docs_induction_retrain.py
    EXPLORER_RETRAIN=/tmp/out/python-docs-induction ...   # check a folder retrained before with the same command
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core import run_with_cache
from core.checkpoints import load_checkpoint, trained_models

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = trained_models()["python-docs-induction"]
SENTENCES = ("The for statement is used to iterate over the elements of a sequence.", "Ali makan nasi lemak di kedai.")
HEAD_BAR = 0.4  # issue 25: each head at least 0.4 on a repeated sentence
SCORES_ATOL = 0.1
COPY_NATS_MAX, COPY_NATS_ATOL = 0.5, 0.1
MACHINE = ("numpy", "python", "blas")  # the card's fields that say where it was trained

pytestmark = pytest.mark.skipif(
    not os.environ.get("EXPLORER_RETRAIN"),
    reason="retrains python-docs-induction (about 25 minutes): set EXPLORER_RETRAIN=1, or to a folder retrained before",
)


def make_command(out: Path) -> list[str]:
    """make trained-models' line for this model, its output folder replaced (the test runs what make runs)."""
    line = next(
        ln.strip()
        for ln in (ROOT / "Makefile").read_text().splitlines()
        if ln.strip().endswith("--out core/trained/python-docs-induction")
    )
    args = shlex.split(line)
    assert args[0] == "$(PY)" and args[1:3] == ["-m", "core.train"], line
    return [sys.executable, *args[1:-1], str(out)]


@pytest.fixture(scope="module")
def retrained(tmp_path_factory) -> Path:
    given = os.environ["EXPLORER_RETRAIN"]
    if given != "1":
        return Path(given)
    out = tmp_path_factory.mktemp("retrained") / "python-docs-induction"
    subprocess.run(make_command(out), cwd=ROOT, check=True, timeout=4 * 3600)
    return out


def behaviour(folder: Path) -> dict:
    """Per sentence said twice: layer 0's previous-token and layer 1's induction scores, and the mean nats per
    character of the second copy."""
    ckpt = load_checkpoint(folder)
    out = {}
    for sentence in SENTENCES:
        ids = np.array(ckpt.tokenizer.encode(f"{sentence} {sentence}").ids[: ckpt.cfg.n_ctx])
        logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ids)
        scores = cache.head_detector_scores()
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        second = np.arange(len(sentence) + 1, len(ids) - 1)  # predicting the second copy's characters
        out[sentence] = {
            "previous_token": scores["previous_token"][0],
            "induction": scores["induction"][1],
            "copy_nats": float(-logp[second, ids[second + 1]].mean()),
        }
    return out


def card(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_the_command_is_make_trained_models():
    command = make_command(Path("/tmp/x"))
    assert command[1:] == [
        "-m",
        "core.train",
        "text",
        "--repeats",
        "1.0",
        "--min-lr",
        "0.003",
        "--eval-interval",
        "250",
        "--quiet",
        "--out",
        "/tmp/x",
    ]
    settings = card(SHIPPED)["transformer_explorer"]["settings"]
    assert (settings["repeats"], settings["min_lr"], settings["eval_interval"]) == (1.0, 0.003, 250)


def test_the_retrain_writes_the_shipped_card_and_tokenizer(retrained):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (retrained / name).read_bytes() == (SHIPPED / name).read_bytes(), name

    def without_machine(c: dict) -> dict:
        return c | {"transformer_explorer": {k: v for k, v in c["transformer_explorer"].items() if k not in MACHINE}}

    assert without_machine(card(retrained)) == without_machine(card(SHIPPED))


def test_the_retrain_has_both_heads_and_copies_as_the_shipped_model(retrained):
    got, shipped = behaviour(retrained), behaviour(SHIPPED)
    for sentence in SENTENCES:
        for name in ("previous_token", "induction"):
            best = float(got[sentence][name].max())
            print(f"{sentence[:20]!r} {name}: retrained {best:.3f}, shipped {shipped[sentence][name].max():.3f}")
            assert best >= HEAD_BAR, (sentence, name)
            assert abs(best - float(shipped[sentence][name].max())) <= SCORES_ATOL, (sentence, name)
    docs = SENTENCES[0]
    print(f"copy nats: retrained {got[docs]['copy_nats']:.3f}, shipped {shipped[docs]['copy_nats']:.3f}")
    assert got[docs]["copy_nats"] <= COPY_NATS_MAX
    assert abs(got[docs]["copy_nats"] - shipped[docs]["copy_nats"]) <= COPY_NATS_ATOL


def test_on_the_cards_kernel_the_retrain_is_the_shipped_weights_byte_for_byte(retrained):
    shipped, here = card(SHIPPED)["transformer_explorer"], card(retrained)["transformer_explorer"]
    if [here.get(k) for k in MACHINE] != [shipped.get(k) for k in MACHINE]:
        pytest.skip(
            f"trained on {here.get('blas')}, NumPy {here['numpy']}, Python {here['python']}; the card's: "
            f"{shipped['blas']}, NumPy {shipped['numpy']}, Python {shipped['python']} "
            "(OPENBLAS_CORETYPE=Haswell forces the card's kernel where the CPU can run it)"
        )
    assert (retrained / "model.safetensors").read_bytes() == (SHIPPED / "model.safetensors").read_bytes()
