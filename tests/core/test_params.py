"""Parameter counts against the arrays a model actually holds, GPT-2's published sizes, and KV-cache bytes."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import PRESETS, TransformerConfig, count_params, init_params, iter_arrays, kv_cache_bytes
from core.checkpoints import FAMILIES
from core.params import forward_work, largest_array

bounded = settings(max_examples=40, deadline=None)


@st.composite
def configs(draw):
    """Small configs covering every switch that changes which arrays exist."""
    positions = draw(st.sampled_from(["none", "sinusoidal", "learned", "rotary"]))
    n_heads = draw(st.integers(1, 4))
    n_kv = draw(st.sampled_from([k for k in range(1, n_heads + 1) if n_heads % k == 0]))
    d_head = draw(st.integers(1, 6))
    if positions == "rotary":
        d_head = 2 * ((d_head + 1) // 2)  # rotary rotates pairs of dimensions
    d_model = draw(st.integers(1, 12))
    if positions == "sinusoidal":
        d_model = 2 * ((d_model + 1) // 2)
    block_type = draw(st.sampled_from(["pre_norm", "post_norm"]))
    maybe = st.one_of(st.none(), st.booleans())  # a bias switch: None follows `bias`
    return TransformerConfig(
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_head,  # d_head given, so d_model need not divide
        n_layers=draw(st.integers(1, 3)),
        d_vocab=draw(st.integers(1, 20)),
        n_ctx=draw(st.integers(1, 16)),
        d_mlp=draw(st.integers(1, 24)),
        positional_embedding_type=positions,
        normalization_type=draw(st.sampled_from(["LN", "LNPre", "RMS", "RMSPre"])),
        attention_dir=draw(st.sampled_from(["causal", "bidirectional"])),
        block_type=block_type,
        bias=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        n_token_types=draw(st.integers(0, 2)),
        n_key_value_heads=n_kv,
        gated_mlp=draw(st.booleans()),
        use_qk_norm=draw(st.booleans()),
        parallel_attn_mlp=block_type == "pre_norm" and draw(st.booleans()),
        qkv_bias=draw(maybe),
        attn_out_bias=draw(maybe),
        mlp_bias=draw(maybe),
        unembed_bias=draw(maybe),
    )


@bounded
@given(configs())
def test_breakdown_equals_the_arrays_init_params_allocates(cfg):
    held = {name: a.shape for name, a in iter_arrays(init_params(cfg))}
    count = count_params(cfg)
    # every counted entry, expanded over the layers, is exactly one held array of that shape
    counted = {}
    for e in count.entries:
        if e.counted:
            for layer in range(cfg.n_layers) if e.per_layer else [None]:
                counted[e.name.format(l=layer)] = e.shape
    assert counted == held
    assert count.total == sum(math.prod(s) for s in held.values())
    assert count.per_block == sum(math.prod(s) for n, s in held.items() if n.startswith("blocks.0."))
    assert count.embeddings == sum(
        math.prod(s) for n, s in held.items() if n.split(".")[0] in ("embed", "pos_embed", "token_type_embed")
    )


@bounded
@given(configs())
def test_uncounted_entries_say_why(cfg):
    for e in count_params(cfg).entries:
        if not e.counted:
            assert e.note  # tied, constant mask, or a scheme without parameters
    tied = [e for e in count_params(cfg).entries if e.name == "unembed.W_U"]
    assert len(tied) == 1 and tied[0].counted == (not cfg.tied_embeddings)


@pytest.mark.parametrize(
    "preset, published",
    [
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_gpt2_totals_equal_the_published_counts(preset, published):
    assert count_params(PRESETS[preset]).total == published


def test_gpt2_small_block_follows_the_12_d_squared_rule():
    """Per block: 4d² for attention (Q, K, V, O) + 8d² for the MLP (d -> 4d -> d); biases and norms are small."""
    cfg = PRESETS["gpt2-small"]
    per_block = count_params(cfg).per_block
    assert abs(per_block - 12 * cfg.d_model**2) / per_block < 0.002
    assert per_block != 12 * cfg.d_model**2  # the small terms are really counted


def expected_kv_bytes(n_layers, batch, seq_len, n_heads, d_head, dtype):
    bytes_per = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}[dtype]
    per_token_per_layer = 2 * n_heads * d_head * bytes_per  # one key and one value vector per head
    return n_layers * batch * seq_len * per_token_per_layer


@bounded
@given(
    st.integers(1, 48),
    st.integers(1, 32),
    st.integers(1, 8),
    st.integers(1, 4096),
    st.integers(1, 16),
    st.sampled_from(["float32", "float16", "bfloat16", "int8"]),
)
def test_kv_cache_bytes_equal_the_formula(n_layers, n_heads, d_head, seq_len, batch, dtype):
    cfg = TransformerConfig(n_layers=n_layers, n_heads=n_heads, d_head=d_head, d_model=n_heads * d_head)
    size = kv_cache_bytes(cfg, seq_len, batch, dtype)
    assert size.bytes == expected_kv_bytes(n_layers, batch, seq_len, n_heads, d_head, dtype)
    assert (size.n_layers, size.seq_len, size.batch, size.n_kv_heads, size.d_head) == (
        n_layers,
        seq_len,
        batch,
        n_heads,
        d_head,
    )


def test_kv_cache_of_gpt2_small_at_full_context():
    # 2 × 12 layers × 1024 tokens × 768 × 2 bytes = 36 MiB in float16
    assert kv_cache_bytes(PRESETS["gpt2-small"], 1024, 1, "float16").bytes == 36 * 2**20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seq_len": 8, "dtype": "float64"}, "dtype"),
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": 8, "batch": -1}, "batch"),
    ],
)
def test_kv_cache_rejects_bad_input_with_a_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kv_cache_bytes(PRESETS["toy"], **kwargs)


def test_init_params_allocates_the_requested_dtype():
    arrays = dict(iter_arrays(init_params(PRESETS["toy"], dtype=np.float32)))
    assert arrays and all(a.dtype == np.float32 for a in arrays.values())


# ---------------------------------------------------------------------------- other families' presets

FAMILY_PRESETS = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "families" / "presets.json").read_text()
)["presets"]  # recorded by scripts/make_family_fixtures.py


@pytest.mark.parametrize("name", sorted(FAMILY_PRESETS))
def test_family_presets_count_what_transformers_counts(name):
    """Each named model's parameters as transformers counts them for its Hub config.json."""
    assert count_params(PRESETS[name]).total == FAMILY_PRESETS[name]["num_parameters"]


@pytest.mark.parametrize("name", sorted(FAMILY_PRESETS))
def test_family_presets_are_what_the_loader_reads_from_their_config(name):
    """The preset is exactly the config core.checkpoints derives from the model's own config.json."""
    raw = FAMILY_PRESETS[name]["config"]
    assert FAMILIES[raw["model_type"]].config(raw) == PRESETS[name]


def test_grouped_query_attention_shrinks_the_kv_cache_by_the_group_size():
    """SmolLM2-135M: 3 key/value heads for 9 query heads, so a third of the cache MHA would need."""
    cfg = PRESETS["smollm2-135m"]
    gqa = kv_cache_bytes(cfg, 2048, 1, "bfloat16")
    mha = kv_cache_bytes(cfg.replace(n_key_value_heads=cfg.n_heads), 2048, 1, "bfloat16")
    assert gqa.bytes * 3 == mha.bytes and gqa.n_kv_heads == 3
    assert gqa.bytes == 2 * 30 * 2048 * 3 * 64 * 2  # K and V, layers, tokens, KV heads, d_head, bytes


def test_forward_work_counts_every_weight_once_per_token_and_each_visible_key():
    cfg = PRESETS["tinystories-33m"]  # global and local layers, window 256
    n = 300
    per_block = sum(
        a.size
        for name, a in iter_arrays(init_params(cfg.replace(d_vocab=8, n_ctx=8), dtype=np.float32))
        if name.startswith("blocks.0.")
    )
    keys = [n, 256, n, 256]  # what each layer's queries may see at most
    attention = sum(2 * n * k * cfg.n_heads * cfg.d_head for k in keys)
    assert forward_work(cfg, n) == n * cfg.n_layers * per_block + attention + n * cfg.d_model * cfg.d_vocab
    assert forward_work(cfg, n, logits=False) == forward_work(cfg, n) - n * cfg.d_model * cfg.d_vocab
    one_more = forward_work(cfg, 1, n_past=n, logits=False)  # a KV-cache step: one query, n + 1 keys
    assert one_more == cfg.n_layers * per_block + sum(
        2 * min(n + 1, k) * cfg.n_heads * cfg.d_head for k in (n + 1, 256, n + 1, 256)
    )


def test_largest_array_knows_the_kv_heads():
    cfg = PRESETS["qwen2.5-0.5b"]
    assert largest_array(cfg, 16) == cfg.d_vocab * cfg.d_model  # the token table
    assert largest_array(cfg, 4096) == cfg.n_heads * 4096 * 4096  # one layer's scores
    assert largest_array(cfg.replace(d_vocab=8), 1) == cfg.d_model * cfg.d_mlp
