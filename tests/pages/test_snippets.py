"""The lesson pages' NumPy snippets are honest: run, they reproduce the page's numbers.

With the spec's defaults each snippet, run in a fresh interpreter, prints exactly what the spec
prints. For other settings each snippet is executed in a fresh namespace and its arrays are
compared with what the service layer (the page's and the API's source of numbers) computes.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest

from app.pages import snippets
from app.service import calculators
from core import count_params, lessons

# The spec's printed output, section by section (spec/transformers-in-depth.txt).
SPEC_OUTPUT = {
    "attention": """\
Q, K, V shapes: (4, 4) (4, 4) (4, 4)
attention weights (rows = query token):
  Ali    [0.89 0.02 0.08 0.01]  sum = 1.0
  makan  [0.51 0.15 0.21 0.13]  sum = 1.0
  nasi   [0.09 0.17 0.59 0.15]  sum = 1.0
  lemak  [0.96 0.03 0.01 0.  ]  sum = 1.0
output shape: (4, 4)
scores for lemak: [ 4.15  0.69 -0.52 -2.84]
""",
    "scaling": """\
d=4    std of q.k =   2.0   avg top weight: unscaled 0.43, scaled 0.24
d=64   std of q.k =   8.0   avg top weight: unscaled 0.84, scaled 0.24
d=512  std of q.k =  22.5   avg top weight: unscaled 0.95, scaled 0.25
""",
    "causal": """\
[[0 1 1 1]
 [0 0 1 1]
 [0 0 0 1]
 [0 0 0 0]]
[[1.   0.   0.   0.  ]
 [0.78 0.22 0.   0.  ]
 [0.11 0.2  0.69 0.  ]
 [0.96 0.03 0.01 0.  ]]
""",
    "multihead": """\
per-head Q: (2, 4, 4)  weights: (2, 4, 4)  out: (4, 8)
head 0 weights for last token: [0.27 0.18 0.26 0.28]
head 1 weights for last token: [0.21 0.23 0.36 0.2 ]
""",
    "positions": """\
[[ 0.    1.    0.    1.    0.    1.  ]
 [ 0.84  0.54  0.31  0.95  0.1   1.  ]
 [ 0.91 -0.42  0.59  0.81  0.2   0.98]]
pos 10 vs pos 10  dot = 8.00
pos 10 vs pos 11  dot = 7.49
pos 10 vs pos 12  dot = 6.37
pos 10 vs pos 15  dot = 6.14
pos 10 vs pos 30  dot = 5.78
pos 30 vs pos 35  dot = 6.14   (same gap of 5)
""",
    "params": """\
toy          embeddings       8,256  per block     49,984  total      108,352
GPT-2 small  embeddings  39,383,808  per block  7,087,872  total  124,439,808
""",
    "forward": """\
embed      (5, 16)
qkv        (5, 48)
scores     (2, 5, 5)
after attn (5, 16)
after mlp  (5, 16)
logits     (5, 9)
next-char probs after 'nasi ': {' ': 0.211, 'a': 0.115, 'e': 0.112, 'i': 0.123, 'k': 0.062, 'l': 0.151, \
'm': 0.076, 'n': 0.09, 's': 0.06}
""",
}

TEXT = lessons.DEFAULT_TEXT
SPEC_SNIPPETS = {
    "attention": lambda: snippets.attention(TEXT, 0, 8, 4, False, True),
    "scaling": lambda: snippets.scaling((4, 64, 512), 1000, 16, 42),
    "causal": lambda: snippets.causal(TEXT, 0, 8, 4),
    "multihead": lambda: snippets.multihead(TEXT, 1, 8, 2, False, True),
    "positions": lambda: snippets.positions(50, 16, lessons.SPEC_POSITION_PAIRS),
    "params": lambda: snippets.params(dict(lessons.SPEC_PARAM_MODELS)),
    "forward": lambda: snippets.forward("nasi lemak", "nasi ", 42, 16, 2, 64),
}


@pytest.mark.parametrize("lesson", sorted(SPEC_SNIPPETS))
def test_default_snippet_prints_the_spec_output_in_a_fresh_interpreter(lesson):
    code = SPEC_SNIPPETS[lesson]()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == SPEC_OUTPUT[lesson]


def run(code: str) -> tuple[dict, str]:
    """Execute a snippet in a fresh namespace; its variables and what it printed."""
    namespace: dict = {"__name__": "__snippet__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<snippet>", "exec"), namespace)  # noqa: S102 -- the code under test
    return namespace, out.getvalue()


def close(a, b) -> bool:
    return np.allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize(
    "text, seed, d_model, d_k, causal, scale",
    [
        (TEXT, 0, 8, 4, False, True),
        (TEXT, 0, 8, 4, True, True),
        ("the cat sat on the mat", 7, 12, 6, False, False),
        ("one two three", 123, 5, 3, True, False),
        ("solo", 3, 4, 2, True, True),
    ],
)
def test_attention_snippet_matches_the_service(text, seed, d_model, d_k, causal, scale, svc):
    r = svc.lessons.attention(text, seed, d_model, d_k, causal, scale)
    ns, printed = run(snippets.attention(text, seed, d_model, d_k, causal, scale))
    assert ns["tokens"] == r.lesson.tokens
    assert close(ns["Q"], r.lesson.Q) and close(ns["K"], r.lesson.K) and close(ns["V"], r.lesson.V)
    assert close(ns["w"], r.lesson.result.weights)
    assert close(ns["out"], r.lesson.result.output)
    # the last printed line: the last token's scores, as the page's scaled_scores row
    last = np.round(r.scaled_scores[-1], 2)
    assert printed.strip().splitlines()[-1] == f"scores for {r.lesson.tokens[-1]}: {last}"


@pytest.mark.parametrize(
    "text, seed, d_model, d_k, scale", [(TEXT, 0, 8, 4, True), ("a b c d e f", 9, 16, 8, True), ("x y", 2, 3, 5, False)]
)
def test_causal_snippet_matches_the_service(text, seed, d_model, d_k, scale, svc):
    r = svc.lessons.attention(text, seed, d_model, d_k, causal=True, scale=scale)
    ns, _ = run(snippets.causal(text, seed, d_model, d_k, scale))
    assert (ns["mask"] == r.lesson.mask).all() and r.lesson.mask.any()
    assert close(ns["weights"], r.lesson.result.weights)
    assert close(ns["scores"], r.lesson.result.scores)  # -inf where masked, in both


@pytest.mark.parametrize(
    "text, seed, d_model, n_heads, causal, scale",
    [
        (TEXT, 1, 8, 2, False, True),
        (TEXT, 1, 8, 4, True, True),
        ("a b c d e", 5, 12, 3, False, False),
        ("a b c", 0, 6, 1, True, False),
    ],
)
def test_multihead_snippet_matches_the_service(text, seed, d_model, n_heads, causal, scale, svc):
    m = svc.lessons.multihead(text, seed, d_model, n_heads, causal, scale)
    ns, printed = run(snippets.multihead(text, seed, d_model, n_heads, causal, scale))
    assert close(ns["weights"], m.result.weights)
    assert close(ns["out"], m.output)
    assert printed.count("weights for last token") == n_heads


@pytest.mark.parametrize(
    "n_pos, d, pairs",
    [
        (50, 16, lessons.SPEC_POSITION_PAIRS),
        (20, 8, ((0, 3), (1, 4), (2, 2))),
        (100, 32, ((10, 20), (10, 40), (50, 60))),
    ],
)
def test_positions_snippet_matches_the_service(n_pos, d, pairs, svc):
    p = svc.lessons.positions(n_pos, d, pairs)
    ns, printed = run(snippets.positions(n_pos, d, pairs))
    assert close(ns["pe"], p.encoding)
    dot_lines = printed.strip().splitlines()[-len(pairs) :]
    for line, (i, j, dot) in zip(dot_lines, p.lesson.dots):
        assert line.startswith(f"pos {i} vs pos {j:<3} dot = {dot:.2f}")


def test_scaling_snippet_matches_the_service(svc):
    dims, n_queries, n_keys, seed = (2, 32, 300), 200, 8, 5
    rows = svc.lessons.scaling(dims, n_queries, n_keys, seed)
    _, printed = run(snippets.scaling(dims, n_queries, n_keys, seed))
    expected = "".join(
        f"d={r.d:<4} std of q.k = {r.std:5.1f}   avg top weight: unscaled "
        f"{r.top_weight_unscaled:.2f}, scaled {r.top_weight_scaled:.2f}\n"
        for r in rows
    )
    assert printed == expected


@pytest.mark.parametrize(
    "sizes",
    [
        {"d_vocab": 50257, "n_ctx": 1024, "d_model": 768, "n_layers": 12},
        {"d_vocab": 1000, "n_ctx": 128, "d_model": 96, "n_layers": 3, "d_mlp": 200},
        {"d_vocab": 50257, "n_ctx": 1024, "d_model": 1600, "n_layers": 48},
    ],
)
def test_params_snippet_matches_the_service(sizes):
    count = count_params(calculators.calc_config(None, **sizes))
    cfg = (sizes["d_vocab"], sizes["n_ctx"], sizes["d_model"], sizes["n_layers"]) + (
        (sizes["d_mlp"],) if "d_mlp" in sizes else ()
    )
    ns, printed = run(snippets.params({"mine": cfg}))
    assert ns["gpt_params"](*cfg) == (count.embeddings, count.per_block, count.total)
    assert f"total {count.total:>12,}" in printed


@pytest.mark.parametrize(
    "text, prompt, seed, d_model, n_heads, d_mlp",
    [
        ("nasi lemak", "nasi ", 42, 16, 2, 64),
        ("hello world", "low", 3, 8, 4, 16),
        ("abc", "cab", 0, 6, 3, 10),
    ],
)
def test_forward_snippet_matches_the_service(text, prompt, seed, d_model, n_heads, d_mlp, svc):
    f = svc.lessons.forward(text, prompt, seed, d_model, n_heads, d_mlp)
    ns, printed = run(snippets.forward(text, prompt, seed, d_model, n_heads, d_mlp))
    assert ns["vocab"] == f.vocab
    assert close(ns["logits"], f.logits)
    assert close(ns["p"], list(f.next_token_probs.values()))
    assert [line.split()[-1] for line in printed.splitlines()[:2]] == [
        str(f.lesson.steps[0][1][-1]) + ")",
        str(f.lesson.steps[1][1][-1]) + ")",
    ]


# words (no spaces: the lessons split on them) that would break out of a naively built literal
HOSTILE = ['"]);print("pwned");(["', "it's", "back\\slash", '"""', "naïve", "مرحبا", "<b>x</b>"]


def test_user_text_enters_a_snippet_only_as_string_literals():
    text = " ".join(HOSTILE)
    ns, printed = run(snippets.attention(text, 0, 8, 4, True, True))
    assert ns["tokens"] == HOSTILE
    assert "pwned" not in printed.splitlines()  # printed only inside the token's label, never run
    ns, _ = run(snippets.multihead(text, 1, 8, 2, False, True))
    assert ns["tokens"] == HOSTILE
    ns, _ = run(snippets.causal(text, 0, 8, 4))
    assert ns["tokens"] == HOSTILE
    corpus = 'say "hi" it\'s \\ ok'
    ns, printed = run(snippets.forward(corpus, "\"'\\", 1, 8, 2, 16))
    assert ns["text"] == corpus
    assert "next-char probs after '\"'\\':" in printed
