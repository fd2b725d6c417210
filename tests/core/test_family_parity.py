"""core against Hugging Face `transformers` on every supported decoder family, within 1e-4.

The folders and references in tests/fixtures/families/ were written by scripts/make_family_fixtures.py
(transformers on PyTorch, in a separate environment; this test needs no torch): tiny random Llama
(grouped- and multi-query, with and without biases, tied and untied), Qwen2 (q/k/v biases, a
sliding-window layer), Qwen3 (q/k norms; also as bfloat16 shards), Mistral (sliding window),
GPT-NeoX (parallel and sequential, partial rotary) and GPT-Neo (local layers, unscaled scores).
Each is loaded by core.checkpoints and run by core.model: the token ids, every block's input,
the last block's output, the final norm's output, every query head's pattern and the logits
must match.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core import run_with_cache
from core.checkpoints import load_checkpoint, read_spec

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
ATOL = 1e-4
FOLDERS = sorted(p.name for p in FAMILIES.iterdir() if p.is_dir())


def cases(reference) -> list[str]:
    n = sum(1 for k in reference.files if k.endswith("_token_ids"))
    return [f"case{i}_" for i in range(n)]


def test_every_family_has_a_fixture():
    assert {read_spec(FAMILIES / f).family for f in FOLDERS} == {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gpt_neox",
        "gpt_neo",
    }


@pytest.fixture(scope="module", params=FOLDERS)
def loaded(request):
    return load_checkpoint(FAMILIES / request.param), np.load(FAMILIES / f"{request.param}.npz")


def test_tokenizer_gives_transformers_ids(loaded):
    ckpt, ref = loaded
    for c in cases(ref):
        assert ckpt.tokenizer.encode(str(ref[c + "text"])).ids == ref[c + "token_ids"].tolist()


def test_every_layer_every_head_and_the_logits_match_transformers(loaded):
    ckpt, ref = loaded
    n = ckpt.cfg.n_layers
    for c in cases(ref):
        logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ref[c + "token_ids"])
        resid_pre, patterns = ref[c + "resid_pre"], ref[c + "attentions"]  # [n, pos, d], [n, n_heads, pos, pos]
        assert patterns.shape[1] == ckpt.cfg.n_heads  # one pattern per query head
        for layer in range(n):
            np.testing.assert_allclose(
                cache[f"blocks.{layer}.hook_resid_pre"], resid_pre[layer], atol=ATOL, err_msg=f"{c}block {layer} input"
            )
            np.testing.assert_allclose(
                cache[f"blocks.{layer}.attn.hook_pattern"],
                patterns[layer],
                atol=ATOL,
                err_msg=f"{c}block {layer} attention pattern",
            )
        np.testing.assert_allclose(
            cache[f"blocks.{n - 1}.hook_resid_post"],
            ref[c + "resid_post"],
            atol=ATOL,
            err_msg=f"{c}last block's output",
        )
        np.testing.assert_allclose(
            cache["ln_final.hook_normalized"], ref[c + "normalized"], atol=ATOL, err_msg=f"{c}final norm"
        )
        np.testing.assert_allclose(logits, ref[c + "logits"], atol=ATOL, err_msg=f"{c}logits")
        assert logits.dtype == np.float32


def test_the_references_record_their_versions(loaded):
    _, ref = loaded
    assert str(ref["transformers_version"]) and str(ref["torch_version"])


@pytest.mark.parametrize(
    "folder, window_layers", [("gpt-neo-local", [1]), ("mistral-window", [0, 1]), ("qwen2-sliding", [1])]
)
def test_local_layers_really_are_local(folder, window_layers):
    """The texts are longer than the windows: a local layer's pattern is zero beyond its window
    (so the parity above really checks the windows), and a global layer's is not."""
    ckpt, ref = load_checkpoint(FAMILIES / folder), np.load(FAMILIES / f"{folder}.npz")
    window = ckpt.cfg.window_size
    patterns = ref["case0_attentions"]  # [n_layers, n_heads, pos, pos]
    far = np.tril(np.ones(patterns.shape[-2:], dtype=bool), k=-window)  # keys `window` or more back
    assert far.any()
    for layer in range(ckpt.cfg.n_layers):
        mass = patterns[layer][:, far].sum()
        assert (mass == 0) == (layer in window_layers), (layer, mass)
        assert (ckpt.cfg.window(layer) is not None) == (layer in window_layers)


def test_bfloat16_shards_match_their_float32_rounding():
    """The bf16 copy holds the float32 model's weights rounded to bfloat16; read back, each is
    exactly a float32 value, and within bf16's rounding (2^-8 relative) of the original."""
    exact, rounded = load_checkpoint(FAMILIES / "qwen3-qk-norm"), load_checkpoint(FAMILIES / "qwen3-qk-norm-bf16")
    assert rounded.spec.sharded and not exact.spec.sharded
    from core import iter_arrays

    a, b = dict(iter_arrays(exact.params)), dict(iter_arrays(rounded.params))
    assert a.keys() == b.keys()
    for name in a:
        assert b[name].dtype == np.float32 and not b[name].flags.writeable
        np.testing.assert_array_equal(b[name].view(np.uint32) & 0xFFFF, 0, err_msg=name)  # a bf16 value, exactly
        np.testing.assert_allclose(b[name], a[name], rtol=2**-8, atol=0, err_msg=name)
