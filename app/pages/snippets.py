"""The NumPy snippet behind each lesson page: the spec's own code, with the current view's values in it.

Each function takes the same parameters as the service function that computes the page
(app/service/), and returns a self-contained script (NumPy only) that prints what the page
shows. With the spec's defaults the script is the spec's snippet and prints the spec's output;
tests/pages/test_snippets.py runs the scripts and compares their arrays with the service's, so a
snippet can never drift from the numbers on the page.

User text enters a script only as a Python string literal (`_py`), never as code. The
templates are `string.Template`s ($name), because the code itself is full of braces.
"""

from __future__ import annotations

import json
from string import Template

from app.pages import web

# ------------------------------------------------------------------ helpers


def _py(text: str) -> str:
    """A Python string literal for any text. JSON's escapes (\\" \\\\ \\n \\uXXXX) are all valid Python,
    and double quotes match the spec's style."""
    return json.dumps(text, ensure_ascii=False)


def _py_list(items: list[str]) -> str:
    return "[" + ", ".join(_py(t) for t in items) + "]"


def _fill(template: str, **values: object) -> str:
    return Template(template).substitute({k: str(v) for k, v in values.items()})


# ------------------------------------------------------------------ queries, keys, values

_SOFTMAX_STABLE = """def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)  # for numerical stability
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)"""

_SOFTMAX = """def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)"""

_ATTENTION = """import numpy as np

np.random.seed($seed)
tokens = $tokens
d_model, d_k = $d_model, $d_k
X = np.random.randn($T, d_model)            # one row per token (embeddings)
W_q = np.random.randn(d_model, d_k) / np.sqrt(d_model)   # small, as at initialisation
W_k = np.random.randn(d_model, d_k) / np.sqrt(d_model)
W_v = np.random.randn(d_model, d_k) / np.sqrt(d_model)

$softmax

def attention(Q, K, V):
$scores_lines
    weights = softmax(scores)
    return weights @ V, weights

Q, K, V = X @ W_q, X @ W_k, X @ W_v
out, w = attention(Q, K, V)
print("Q, K, V shapes:", Q.shape, K.shape, V.shape)
print("attention weights (rows = query token):")
for t, row in zip(tokens, w):
    print(f"  {t:<6}", np.round(row, 2), " sum =", round(row.sum(), 2))
print("output shape:", out.shape)
print($last_label, np.round(Q[$last] @ K.T$divide, 2))
"""


def attention(text: str, seed: int, d_model: int, d_k: int, causal: bool, scale: bool) -> str:
    """The spec's "Scaled dot-product attention" snippet (with a causal mask when asked)."""
    tokens = text.split()  # the lesson's word split (core.tokenizers.word_tokens)
    lines = [
        "    scores = Q @ K.T / np.sqrt(K.shape[-1])"
        if scale
        else "    scores = Q @ K.T                       # unscaled: not divided by √d_k"
    ]
    if causal:
        lines += [
            "    T = len(Q)",
            "    mask = np.triu(np.ones((T, T), dtype=bool), k=1)   # True above the diagonal",
            "    scores = np.where(mask, -np.inf, scores)           # the future is forbidden",
        ]
    return _fill(
        _ATTENTION,
        seed=seed,
        tokens=_py_list(tokens),
        d_model=d_model,
        d_k=d_k,
        T=len(tokens),
        softmax=_SOFTMAX_STABLE,
        scores_lines="\n".join(lines),
        last_label=_py(f"scores for {tokens[-1]}:"),
        last=len(tokens) - 1,
        divide=" / np.sqrt(d_k)" if scale else "",
    )


# ------------------------------------------------------------------ why divide by √d_k

_SCALING = """import numpy as np

rng = np.random.default_rng($seed)

$softmax

for d in $dims:
    q = rng.standard_normal(($n_queries, d))          # $n_queries_words random queries
    k = rng.standard_normal(($n_queries, $n_keys, d))      # $n_keys random keys for each
    raw = np.einsum("nd,nkd->nk", q, k)         # $n_queries x $n_keys dot products
    top_raw = softmax(raw).max(axis=1).mean()
    top_scaled = softmax(raw / np.sqrt(d)).max(axis=1).mean()
    print(f"d={d:<4} std of q.k = {raw.std():5.1f}   "
          f"avg top weight: unscaled {top_raw:.2f}, scaled {top_scaled:.2f}")
"""


def scaling(dims: tuple[int, ...], n_queries: int, n_keys: int, seed: int) -> str:
    """The spec's "Why divide by √d_k?" snippet."""
    return _fill(
        _SCALING,
        seed=seed,
        softmax=_SOFTMAX,
        dims=list(dims),
        n_queries=n_queries,
        n_queries_words=f"{n_queries:,}",
        n_keys=n_keys,
    )


# ------------------------------------------------------------------ causal masks

_CAUSAL = """import numpy as np

np.random.seed($seed)
tokens = $tokens  # only their number matters: the embeddings are random
T, d_model, d_k = $T, $d_model, $d_k
X = np.random.randn(T, d_model)
W_q, W_k = (np.random.randn(d_model, d_k) / np.sqrt(d_model) for _ in range(2))

scores = (X @ W_q) @ (X @ W_k).T$divide
mask = np.triu(np.ones((T, T), dtype=bool), k=1)   # True above the diagonal
scores = np.where(mask, -np.inf, scores)           # the future is forbidden

e = np.exp(scores - scores.max(axis=-1, keepdims=True))
weights = e / e.sum(axis=-1, keepdims=True)
print(mask.astype(int))
print(np.round(weights, 2))
"""


def causal(text: str, seed: int, d_model: int, d_k: int, scale: bool = True) -> str:
    """The spec's "Causal masks" snippet."""
    tokens = text.split()
    return _fill(
        _CAUSAL,
        seed=seed,
        tokens=_py_list(tokens),
        T=len(tokens),
        d_model=d_model,
        d_k=d_k,
        divide=" / np.sqrt(d_k)" if scale else "   # unscaled: not divided by √d_k",
    )


# ------------------------------------------------------------------ multiple heads

_MULTIHEAD = """import numpy as np

np.random.seed($seed)
tokens = $tokens  # only their number matters: the embeddings are random
T, d_model, n_heads = $T, $d_model, $n_heads
d_head = d_model // n_heads
X = np.random.randn(T, d_model)
W_qkv = np.random.randn(d_model, 3 * d_model) / np.sqrt(d_model)  # all heads at once
W_o = np.random.randn(d_model, d_model) / np.sqrt(d_model)

$softmax

Q, K, V = np.split(X @ W_qkv, 3, axis=-1)               # each $qkv_shape
split = lambda M: M.reshape(T, n_heads, d_head).transpose(1, 0, 2)
Q, K, V = split(Q), split(K), split(V)                  # each $head_shape
$weights_lines
heads = weights @ V                                     # $head_shape
concat = heads.transpose(1, 0, 2).reshape(T, d_model)   # $qkv_shape
out = concat @ W_o

print("per-head Q:", Q.shape, " weights:", weights.shape, " out:", out.shape)
$head_prints
"""


def multihead(text: str, seed: int, d_model: int, n_heads: int, causal: bool, scale: bool) -> str:
    """The spec's "Multi-head attention" snippet (with a causal mask when asked)."""
    tokens = text.split()
    T, d_head = len(tokens), d_model // n_heads
    weights_shape = web.shape((n_heads, T, T))
    divide = " / np.sqrt(d_head)" if scale else ""
    if causal:
        lines = [
            f"scores = Q @ K.transpose(0, 2, 1){divide}" + ("" if scale else "   # unscaled"),
            "scores[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf   # the future is forbidden",
            f"weights = softmax(scores)                               # {weights_shape}",
        ]
    elif scale:
        lines = [f"weights = softmax(Q @ K.transpose(0, 2, 1) / np.sqrt(d_head))   # {weights_shape}"]
    else:
        lines = [f"weights = softmax(Q @ K.transpose(0, 2, 1))   # {weights_shape}, unscaled"]
    prints = [f'print("head {h} weights for last token:", np.round(weights[{h}, -1], 2))' for h in range(n_heads)]
    return _fill(
        _MULTIHEAD,
        seed=seed,
        tokens=_py_list(tokens),
        T=T,
        d_model=d_model,
        n_heads=n_heads,
        softmax=_SOFTMAX,
        qkv_shape=web.shape((T, d_model)),
        head_shape=web.shape((n_heads, T, d_head)),
        weights_lines="\n".join(lines),
        head_prints="\n".join(prints),
    )


# ------------------------------------------------------------------ positions

_POSITIONS = """import numpy as np

def sinusoidal(n_pos, d):
    pos = np.arange(n_pos)[:, None]                 # (n_pos, 1)
    i = np.arange(0, d, 2)[None, :]                 # even dimensions
    angle = pos / (10000 ** (i / d))
    pe = np.zeros((n_pos, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe

pe = sinusoidal($n_pos, $d)
print(np.round(pe[:3, :6], 2))
$dot_prints
"""


def _dot_prints(pairs: tuple[tuple[int, int], ...]) -> list[str]:
    """The spec prints pairs sharing a first position as a loop over gaps, and a lone pair on its own
    line, noting when its gap was already shown ("(same gap of 5)")."""
    groups: dict[int, list[int]] = {}
    for i, j in pairs:
        groups.setdefault(i, []).append(j - i)
    lines, seen = [], set()
    for i, gaps in groups.items():
        if len(gaps) == 1:
            j = i + gaps[0]
            note = f"   (same gap of {gaps[0]})" if gaps[0] in seen else ""
            lines.append(f'print(f"pos {i} vs pos {j:<3} dot = {{pe[{i}] @ pe[{j}]:.2f}}{note}")')
        else:
            lines += [
                f"for gap in {gaps}:",
                f'    print(f"pos {i} vs pos {{{i} + gap:<3}} dot = {{pe[{i}] @ pe[{i} + gap]:.2f}}")',
            ]
        seen.update(gaps)
    return lines


def positions(n_pos: int, d: int, pairs: tuple[tuple[int, int], ...]) -> str:
    """The spec's "Where am I?" snippet, printing the dot products of the given position pairs."""
    return _fill(_POSITIONS, n_pos=n_pos, d=d, dot_prints="\n".join(_dot_prints(pairs)))


# ------------------------------------------------------------------ counting parameters

_PARAMS = """def gpt_params(vocab, n_ctx, d, n_layers, d_ff=None):
    d_ff = d_ff or 4 * d
    embed = vocab * d + n_ctx * d                 # token + learned position tables
    attn = d * 3 * d + 3 * d + d * d + d          # W_qkv, biases, W_o, bias
    mlp = d * d_ff + d_ff + d_ff * d + d          # two linear layers with biases
    norms = 2 * 2 * d                             # two layer norms (scale + shift)
    block = attn + mlp + norms
    total = embed + n_layers * block + 2 * d      # + final layer norm
    return embed, block, total                    # output layer shares the token table

for name, cfg in $models.items():
    embed, block, total = gpt_params(*cfg)
    print(f"{name:<12} embeddings {embed:>11,}  per block {block:>10,}  total {total:>12,}")
"""


def params(models: dict[str, tuple[int, ...]]) -> str:
    """The spec's "Counting parameters" snippet. `models`: name -> (vocab, n_ctx, d, n_layers[, d_ff])."""
    body = ", ".join(f"{_py(name)}: {web.shape(cfg)}" for name, cfg in models.items())
    return _fill(_PARAMS, models="{" + body + "}")


# ------------------------------------------------------------------ a full forward pass

_FORWARD = """import numpy as np

rng = np.random.default_rng($seed)
text = $text
vocab = sorted(set(text))                       # $vocab_note
stoi = {c: i for i, c in enumerate(vocab)}
V, T, d, H, d_ff = len(vocab), $T, $d, $H, $d_ff
P = lambda *shape: rng.standard_normal(shape) * 0.1   # small random weights

tok_emb, pos_emb = P(V, d), P(T, d)
W_qkv, W_o, W_1, W_2 = P(d, 3 * d), P(d, d), P(d, d_ff), P(d_ff, d)

def layer_norm(x, eps=1e-5):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)        # scale/shift omitted (1 and 0)

def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

ids = np.array([stoi[c] for c in $prompt])      # $T input tokens
x = tok_emb[ids] + pos_emb[:T];                 print("embed     ", x.shape)
h = layer_norm(x) @ W_qkv;                      print("qkv       ", h.shape)
q, k, v = (m.reshape(T, H, d // H).transpose(1, 0, 2) for m in np.split(h, 3, -1))
s = q @ k.transpose(0, 2, 1) / np.sqrt(d // H); print("scores    ", s.shape)
s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
a = (softmax(s) @ v).transpose(1, 0, 2).reshape(T, d)
x = x + a @ W_o;                                print("after attn", x.shape)
x = x + np.maximum(0, layer_norm(x) @ W_1) @ W_2; print("after mlp ", x.shape)
logits = layer_norm(x) @ tok_emb.T;             print("logits    ", logits.shape)
p = softmax(logits[-1])
print($probs_label, {c: round(float(pi), 3) for c, pi in zip(vocab, p)})
"""


def forward(text: str, prompt: str, seed: int, d_model: int, n_heads: int, d_mlp: int) -> str:
    """The spec's "A full forward pass" snippet."""
    n_vocab = len(set(text))
    note = f"{n_vocab} character{'s' if n_vocab != 1 else ''}" + (" incl. space" if " " in text else "")
    return _fill(
        _FORWARD,
        seed=seed,
        text=_py(text),
        vocab_note=note,
        T=len(prompt),
        d=d_model,
        H=n_heads,
        d_ff=d_mlp,
        prompt=_py(prompt),
        probs_label=_py(f"next-char probs after '{prompt}':"),
    )


__all__ = ["attention", "scaling", "causal", "multihead", "positions", "params", "forward"]
