"""Train the SAE that ships with the app (core/trained/saes/python-docs-induction-resid0) and label its features.

    .venv/bin/python scripts/train_shipped_sae.py [--out core/trained/saes/python-docs-induction-resid0]

`make trained-models` runs it after the models. What it does, on one BLAS thread (so that a rerun on the same
machine, NumPy and CPython writes the same bytes; another BLAS kernel moves the last bits, as for the models,
docs/training.md):

1. Runs core/trained/python-docs-induction over the text it was trained on (Python's docs, its first nine tenths:
   core.recipes.Text never trains on the last tenth) in windows of the model's context (128 characters), keeping
   blocks.0.hook_resid_post, the residual stream after layer 0.
2. Trains a top-k SAE on those vectors with core/sae_train.py (768 features, k = 8: 8× the stream's 96 numbers).
3. Labels features: for each rule of tests/core/test_shipped_sae.py's RULES (a label and the code that marks the
   characters it names), the feature whose activation best separates the marked characters from the others
   (ROC AUC) on a stretch of the training text, when that AUC is at least LABEL_AUC. The test checks each label
   again on the held-out tenth, which neither the model nor the SAE saw.
4. Writes the folder in SAELens's format (cfg.json, sae_weights.safetensors) and labels.json, which the SAE
   catalogue (app/models/saes.py) reads; a folder already there is replaced.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core import run_with_cache  # noqa: E402
from core.checkpoints import load_checkpoint, trained_models  # noqa: E402
from core.recipes import Text, python_docs  # noqa: E402
from core.sae import SAEConfig, save_sae  # noqa: E402
from core.sae_train import SAETraining, train_sae  # noqa: E402
from tests.core.test_shipped_sae import HOOK, MODEL, NAME, RULES, auc, marks  # noqa: E402

OUT = ROOT / "core" / "trained" / "saes" / NAME
D_SAE, K = 768, 8
TRAINING = SAETraining(steps=1500, batch_size=1024, lr=1e-3, seed=0)
TRAIN_WINDOWS = 3000  # 384,000 characters of the training text
LABEL_FROM, LABEL_WINDOWS = 100_000, 250  # where the labels are chosen: 32,000 characters of the training text
LABEL_AUC = 0.95  # the least AUC a label is given at (the test asks 0.9 on held-out text)
SHORTLIST = 20  # features per rule whose AUC is computed: those most larger on the marked characters


def training_text() -> str:
    text = python_docs()
    return text[: len(text) - int(len(text) * Text.held_out_fraction)]


def stream(ckpt, text: str, windows: int) -> tuple[np.ndarray, list[str]]:
    """[windows * n_ctx, d_model] vectors of HOOK over consecutive windows of the text, and the windows' text."""
    n = ckpt.cfg.n_ctx
    ids = np.asarray(ckpt.tokenizer.encode(text).ids)
    assert len(ids) == len(text), "a character model: one token per character"
    vectors, pieces = [], []
    for start in range(0, min(windows * n, len(ids) - n + 1), n):
        _logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ids[start : start + n], names=[HOOK], logits=False)
        vectors.append(np.asarray(cache[HOOK], dtype=np.float32))
        pieces.append(text[start : start + n])
    return np.concatenate(vectors), pieces


def choose_labels(acts: np.ndarray, pieces: list[str]) -> list[dict]:
    """For each rule, its best feature by AUC (at least LABEL_AUC); a feature keeps the label it separates best."""
    best: dict[int, tuple[float, str]] = {}
    for label, rule in RULES.items():
        y = marks(rule, pieces)
        gap = acts[y].mean(axis=0) - acts[~y].mean(axis=0)
        shortlist = np.argsort(-gap)[:SHORTLIST]
        score, index = max((auc(acts[:, i], y), int(i)) for i in shortlist)
        print(f"  {label!r}: feature {index}, AUC {score:.3f}")
        if score >= LABEL_AUC and score > best.get(index, (0.0, ""))[0]:
            best[index] = (score, label)
    return [{"index": i, "label": label} for i, (_score, label) in sorted(best.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    with threadpool_limits(1, user_api="blas"):
        ckpt = load_checkpoint(trained_models()[MODEL])
        text = training_text()
        x, _pieces = stream(ckpt, text, TRAIN_WINDOWS)
        cfg = SAEConfig.from_dict(
            {
                "architecture": "topk",
                "d_in": x.shape[1],
                "d_sae": D_SAE,
                "k": K,
                "metadata": {
                    "hook_name": HOOK,
                    "model_name": MODEL,
                    "dataset_path": "Python's documentation (pydoc_data.topics), its first nine tenths",
                    "context_size": ckpt.cfg.n_ctx,
                },
            }
        )
        sae, records = train_sae(x, cfg, TRAINING)
        last = records[-1]
        print(
            f"trained {len(x):,} vectors, {TRAINING.steps} steps in {time.perf_counter() - t0:.0f} s: "
            f"explained variance {last.explained_variance:.3f}, L0 {last.l0:.1f}, dead {last.dead_fraction:.3f}"
        )
        acts, pieces = stream(ckpt, text[LABEL_FROM:], LABEL_WINDOWS)
        labels = choose_labels(sae.encode(acts), pieces)
    if a.out.exists():
        shutil.rmtree(a.out)
    save_sae(sae, a.out)
    (a.out / "labels.json").write_text(json.dumps(labels, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for path in (a.out, *a.out.iterdir()):  # readable by all, as a checkout's files (save_sae's mkdtemp makes 0700)
        path.chmod(0o755 if path.is_dir() else 0o644)
    print(f"{a.out}: {len(labels)} labelled features ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
