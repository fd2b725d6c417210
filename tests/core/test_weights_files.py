"""core.checkpoints.tensors: safetensors read by hand, memory-mapped, sharded, upcast exactly, refused clearly.

Files here are written byte by byte (8-byte header length, JSON header, data), so the reader is
checked against the format itself, not against another reader.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from core import iter_arrays, run_with_cache
from core.checkpoints import (
    CheckpointError,
    SafetensorsFile,
    checkpoint_problem,
    is_mapped,
    load_checkpoint,
    mapped_nbytes,
    params_nbytes,
    read_spec,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAMILIES = FIXTURES / "families"


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]], pad: int = 0) -> None:
    """{name: (dtype, shape, raw bytes)} as a .safetensors file."""
    header, offset, data = {}, 0, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8 + pad)  # the format pads the header to a multiple of 8 bytes
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_float32_tensors_are_read_only_views_of_the_file(tmp_path):
    values = np.arange(12, dtype="<f4").reshape(3, 4)
    write_safetensors(tmp_path / "w.safetensors", {"w": ("F32", (3, 4), values.tobytes())})
    array = SafetensorsFile(tmp_path / "w.safetensors").array("w")
    np.testing.assert_array_equal(array, values)
    assert is_mapped(array) and not array.flags.writeable and not array.flags.owndata
    with pytest.raises(ValueError, match="read-only"):
        array[0, 0] = 1.0  # shared by every request (and every worker): nothing may write to it


def test_bfloat16_is_upcast_exactly(tmp_path):
    """bfloat16 is the top 16 bits of a float32: 0x3F80 is 1.0, 0xC020 is -2.5, 0x0001 the
    smallest subnormal, 0x7F80 infinity."""
    bits = np.array([0x3F80, 0xC020, 0x0001, 0x7F80, 0x4049], dtype="<u2")
    write_safetensors(tmp_path / "w.safetensors", {"w": ("BF16", (5,), bits.tobytes())})
    array = SafetensorsFile(tmp_path / "w.safetensors").array("w")
    expected = np.array([struct.unpack("<f", struct.pack("<I", int(b) << 16))[0] for b in bits], dtype=np.float32)
    assert array.dtype == np.float32 and not array.flags.writeable and not is_mapped(array)  # a copy
    np.testing.assert_array_equal(array, expected)
    assert array[0] == 1.0 and array[1] == -2.5 and np.isinf(array[3]) and array[4] == np.float32(3.140625)


def test_float16_is_upcast_exactly(tmp_path):
    values = np.array([1.0, -0.333, 65504.0, 6e-8], dtype="<f2")
    write_safetensors(tmp_path / "w.safetensors", {"w": ("F16", (4,), values.tobytes())})
    array = SafetensorsFile(tmp_path / "w.safetensors").array("w")
    np.testing.assert_array_equal(array, values.astype(np.float32))


@pytest.mark.parametrize("dtype", ["I8", "U8", "F8_E4M3", "I64", "BOOL"])
def test_weights_of_other_dtypes_are_refused_by_name(tmp_path, dtype):
    write_safetensors(tmp_path / "w.safetensors", {"w": (dtype, (4,), bytes(4 * (8 if dtype == "I64" else 1)))})
    with pytest.raises(CheckpointError, match=f"stored as {dtype}.*float32, float16 and bfloat16"):
        SafetensorsFile(tmp_path / "w.safetensors").array("w")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda raw: raw[:4], "not a readable safetensors file"),
        (lambda raw: struct.pack("<Q", 10**12) + raw[8:], "header length"),
        (lambda raw: raw[:8] + b"[" + raw[9:], "not a readable safetensors file"),
        (lambda raw: raw[:-8], "does not fit its byte range"),
    ],
)
def test_damaged_files_say_so(tmp_path, damage, message):
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": ("F32", (4,), np.ones(4, "<f4").tobytes())})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=message):
        SafetensorsFile(path).array("w")


@pytest.mark.parametrize(
    "folder", ["gpt2-tiny", "bert-tiny", "families/llama-gqa", "families/gpt-neox-parallel", "families/gpt-neo-local"]
)
def test_float32_checkpoints_are_mapped_without_a_single_copy(folder):
    """Every parameter of a float32 checkpoint is a view of its file (transposes and the per-head
    reshapes included), so a second worker loading it adds no copy of the weights."""
    params = load_checkpoint(FIXTURES / folder).params
    assert mapped_nbytes(params) == params_nbytes(params) > 0
    for name, array in iter_arrays(params):
        assert is_mapped(array) and not array.flags.writeable, name


def test_bfloat16_shards_are_private_float32_copies():
    params = load_checkpoint(FAMILIES / "qwen3-qk-norm-bf16").params
    assert mapped_nbytes(params) == 0 and {a.dtype for _, a in iter_arrays(params)} == {np.dtype(np.float32)}


def copy_folder(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FAMILIES / name, tmp_path / name))


def test_a_missing_shard_is_named(tmp_path):
    folder = copy_folder("qwen3-qk-norm-bf16", tmp_path)
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    reason = checkpoint_problem(folder)
    assert reason is not None and shard.name in reason and "shard" in reason


def test_an_index_that_points_to_the_wrong_shard_is_caught(tmp_path):
    folder = copy_folder("qwen3-qk-norm-bf16", tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"] = {name: first for name in index["weight_map"]}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="places .* in .*which does not hold it"):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope scaling 'llama3'"),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope scaling 'linear'"),
        ({"num_key_value_heads": 3}, "n_heads=4 is not divisible by n_key_value_heads=3"),
        ({"hidden_act": "swiglu_fancy"}, "activation 'swiglu_fancy'"),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
        ({"hidden_size": None}, "'hidden_size'"),
    ],
)
def test_config_fields_that_cannot_run_are_named(tmp_path, changes, message):
    folder = copy_folder("llama-gqa", tmp_path)
    raw = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(raw))
    reason = checkpoint_problem(folder)
    assert reason is not None and message in reason and "'llama'" in reason


def test_a_transformers_4_config_reads_like_a_5_one(tmp_path):
    """4.x wrote rope_theta and rope_scaling (GPT-NeoX: rotary_emb_base and rotary_pct) where 5.x
    writes rope_parameters; both spellings give the same model."""
    for name, old in (
        ("llama-gqa", {"rope_theta": 500.0, "rope_scaling": None}),
        ("gpt-neox-parallel", {"rotary_emb_base": 10000, "rotary_pct": 0.25}),
    ):
        folder = copy_folder(name, tmp_path)
        raw = json.loads((folder / "config.json").read_text())
        del raw["rope_parameters"]
        (folder / "config.json").write_text(json.dumps(raw | old))
        assert read_spec(folder).cfg == read_spec(FAMILIES / name).cfg


def test_family_configs_map_to_the_switches():
    cfg = read_spec(FAMILIES / "gpt-neox-parallel").cfg
    assert (cfg.parallel_attn_mlp, cfg.rotary_dim, cfg.d_head, cfg.rotary_adjacent_pairs) == (True, 4, 16, False)
    assert cfg.d_vocab % 64 == 0 and not cfg.tied_embeddings
    cfg = read_spec(FAMILIES / "gpt-neo-local").cfg
    assert (cfg.attn_types, cfg.window_size, cfg.use_attn_scale) == (("global", "local"), 3, False)
    cfg = read_spec(FAMILIES / "qwen2-sliding").cfg
    assert (cfg.qkv_bias, cfg.attn_out_bias, cfg.n_key_value_heads, cfg.attn_types) == (
        True,
        False,
        2,
        ("global", "local"),
    )
    cfg = read_spec(FAMILIES / "qwen3-qk-norm").cfg
    assert cfg.use_qk_norm and cfg.d_head == 16 and cfg.d_head * cfg.n_heads != cfg.d_model
    spec = read_spec(FAMILIES / "llama-gqa")
    assert "4 heads sharing 2 key/value heads" in spec.description and spec.description.startswith("Llama")


def test_sentencepiece_tokens_are_shown_readably():
    """ "▁" marks a space and <0xNN> pieces are raw bytes (TinyLlama's tokenizer does both)."""
    tok = load_checkpoint(FAMILIES / "llama-gqa").tokenizer
    enc = tok.encode("the cat\nsat — é")
    assert enc.tokens[0] == "<s>"  # the BOS token the tokenizer's template adds, as transformers does
    assert "↵" in enc.tokens and "\\xe2" in enc.tokens  # a newline byte; the first byte of "—"
    assert any(t.startswith("␣") for t in enc.tokens) and not any("▁" in t for t in enc.tokens)
    raw = json.loads((FAMILIES / "llama-gqa" / "tokenizer.json").read_text())["model"]["vocab"]
    assert tok.token_str(raw["<0x0A>"]) == "↵" and tok.token_str(raw["▁"]) == "␣"


def test_a_bf16_sharded_model_runs_in_float32():
    ckpt = load_checkpoint(FAMILIES / "qwen3-qk-norm-bf16")
    logits, cache = run_with_cache(ckpt.params, ckpt.cfg, [1, 2, 3])
    assert logits.dtype == np.float32 and cache["blocks.0.attn.hook_pattern"].dtype == np.float32


def test_a_float32_copy_of_a_bf16_model_is_mapped_and_equal(tmp_path):
    from core.checkpoints.convert import convert_to_float32

    dst = convert_to_float32(FAMILIES / "qwen3-qk-norm-bf16", tmp_path / "f32")
    assert not (dst / "model.safetensors.partial").exists()
    copy, original = load_checkpoint(dst), load_checkpoint(FAMILIES / "qwen3-qk-norm-bf16")
    assert mapped_nbytes(copy.params) == params_nbytes(copy.params) == params_nbytes(original.params)
    for (name, a), (_, b) in zip(iter_arrays(copy.params), iter_arrays(original.params), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    with pytest.raises(CheckpointError, match="not empty"):
        convert_to_float32(FAMILIES / "qwen3-qk-norm-bf16", dst)
