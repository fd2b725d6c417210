"""The SAE that ships with the app (core/trained/saes/python-docs-induction-resid0, scripts/train_shipped_sae.py):
its folder loads, and every label in its labels.json is true on text neither the model nor the SAE was trained on.

A label is tested by its rule, written here as code: the rule marks the characters of a text the label names (a
digit, the character after an opening parenthesis, ...), and the labelled feature's activation must separate the
marked characters from all the others with a ROC AUC of at least 0.9 (1.0: every marked character activates the
feature more than every unmarked one; 0.5: no better than chance). The text is Python's documentation's last
tenth, which core.recipes.Text holds out of the model's training and scripts/train_shipped_sae.py out of the
SAE's, run in windows of the model's context as the script runs the training text. The script labels a feature
with one of these rules only where the rule separates it on the training text; here it must hold again.

    .venv/bin/python -m pytest -q -rP tests/core/test_shipped_sae.py   # -rP prints each label's AUC
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from core import run_with_cache
from core.checkpoints import TRAINED_DIR, load_checkpoint, trained_models
from core.recipes import Text, python_docs
from core.sae import load_sae

NAME = "python-docs-induction-resid0"
MODEL = "python-docs-induction"
HOOK = "blocks.0.hook_resid_post"
FOLDER = TRAINED_DIR / "saes" / NAME
AUC_BAR = 0.9
MIN_LABELS = 8
MAX_BYTES = 4 << 20  # it ships in the repository, the wheel and the image
HELD_OUT_WINDOWS = 350  # 44,800 characters of the held-out tenth


# ------------------------------------------------------------------ the rules, one per label


def _ends(s: str, suffix: str) -> np.ndarray:
    """Characters at which the text so far ends with `suffix` (within this window)."""
    return np.array([s[: i + 1].endswith(suffix) for i in range(len(s))])


def _after(s: str, prefix: str) -> np.ndarray:
    """Characters right after `prefix` (the text before them ends with it, within this window)."""
    return np.array([s[:i].endswith(prefix) for i in range(len(s))])


RULES: dict[str, Callable[[str], np.ndarray]] = {
    "a digit (0-9)": lambda s: np.array([c.isdigit() for c in s]),
    'the character right after a dot, with no space between ("3.7", "os.path")': lambda s: np.array(
        [i > 0 and s[i - 1] == "." and c not in " \n" for i, c in enumerate(s)]
    ),
    'the first character inside parentheses, right after "("': lambda s: _after(s, "("),
    "the first character of a quoted name, after a space and an opening quote (' \"')": lambda s: _after(s, ' "'),
    "the space after a closing quote ('\" ')": lambda s: _ends(s, '" '),
    'the "g" of "-ing"': lambda s: _ends(s, "ing"),
    'the first character of the word after "the "': lambda s: _after(s, "the "),
    "the space after a full stop": lambda s: _ends(s, ". "),
    "a line break after a full stop": lambda s: _ends(s, ".\n"),
    "the first character after a comma and a space": lambda s: _after(s, ", "),
    "the first character after a colon": lambda s: _after(s, ":"),
    "a third space or more in a row (indentation)": lambda s: _ends(s, "   "),
    'a double underscore, as in "__init__"': lambda s: _ends(s, "__"),
    'a run of "=" (a heading\'s underline)': lambda s: _ends(s, "==="),
    'a run of "-" (a table\'s rule)': lambda s: _ends(s, "---"),
}


def marks(rule: Callable[[str], np.ndarray], pieces: list[str]) -> np.ndarray:
    """The rule over each window, joined: [total characters] bool."""
    return np.concatenate([rule(piece) for piece in pieces])


def auc(scores: np.ndarray, marked: np.ndarray) -> float:
    """ROC AUC of `scores` for telling `marked` from the rest: the chance that a marked item scores above an
    unmarked one, ties counting one half (the Mann-Whitney U statistic over the two counts' product)."""
    n1 = int(marked.sum())
    n0 = len(marked) - n1
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    starts = np.r_[0, np.flatnonzero(np.diff(ordered)) + 1]  # runs of equal scores share their mean rank
    ends = np.r_[starts[1:], len(scores)]
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return float((ranks[marked].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


# ------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def held_out():
    """The SAE's activations over the held-out tenth, in windows of the model's context, and the windows' text."""
    ckpt = load_checkpoint(trained_models()[MODEL])
    text = python_docs()
    text = text[len(text) - int(len(text) * Text.held_out_fraction) :]
    sae = load_sae(FOLDER)
    n = ckpt.cfg.n_ctx
    ids = np.asarray(ckpt.tokenizer.encode(text).ids)
    acts, pieces = [], []
    for start in range(0, HELD_OUT_WINDOWS * n, n):
        _logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ids[start : start + n], names=[HOOK], logits=False)
        acts.append(sae.encode(cache[HOOK]))
        pieces.append(text[start : start + n])
    return np.concatenate(acts), pieces


def _labels() -> list[dict]:
    return json.loads((FOLDER / "labels.json").read_text(encoding="utf-8"))


def test_the_shipped_folder_is_a_small_float32_saelens_folder_for_its_model():
    sae = load_sae(FOLDER)
    assert (sae.cfg.model_name, sae.cfg.hook_name, sae.cfg.architecture) == (MODEL, HOOK, "topk")
    assert all(a.dtype == np.float32 for a in sae.arrays().values())
    ckpt = load_checkpoint(trained_models()[MODEL])
    assert sae.cfg.d_in == ckpt.cfg.d_model
    assert sum(f.stat().st_size for f in FOLDER.iterdir()) < MAX_BYTES


def test_at_least_eight_features_are_labelled_each_by_a_rule_here():
    labels = _labels()
    assert len(labels) >= MIN_LABELS
    assert len({f["index"] for f in labels}) == len(labels)
    unknown = [f["label"] for f in labels if f["label"] not in RULES]
    assert not unknown, f"labels with no rule in this test: {unknown}"


@pytest.mark.parametrize("label", list(RULES))
def test_each_label_separates_its_rules_characters_on_held_out_text(label, held_out):
    acts, pieces = held_out
    labelled = {f["label"]: f["index"] for f in _labels()}
    if label not in labelled:
        pytest.skip("the shipped SAE has no feature with this label")
    marked = marks(RULES[label], pieces)
    assert 20 <= marked.sum() < len(marked) - 20  # enough of both to mean something
    score = auc(acts[:, labelled[label]], marked)
    print(f"feature {labelled[label]} {label!r}: AUC {score:.3f} over {int(marked.sum())} of {len(marked)} characters")
    assert score >= AUC_BAR


def test_auc_is_the_share_of_marked_unmarked_pairs_ordered_right():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, 60).astype(float)  # many ties
    marked = rng.random(60) < 0.3
    pairs = [(a > b) + 0.5 * (a == b) for a in scores[marked] for b in scores[~marked]]
    assert auc(scores, marked) == pytest.approx(np.mean(pairs))
    assert auc(np.arange(10.0), np.arange(10) >= 5) == 1.0
