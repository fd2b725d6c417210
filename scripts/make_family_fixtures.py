"""Build the model-family parity fixtures: tiny random Llama, Qwen2, Qwen3, Mistral, GPT-NeoX and
GPT-Neo checkpoints, each with the activations Hugging Face `transformers` computes for them.

The references come from transformers on PyTorch, an implementation independent of core/, so
tests/core/test_family_parity.py checks core against numbers it did not compute itself. Like
scripts/make_parity_fixtures.py this needs its own environment with torch (`make fixtures` makes
it); the app and its tests never import torch:

    /tmp/torchenv/bin/python scripts/make_family_fixtures.py

It writes, under tests/fixtures/families/, one folder per configuration (config.json as
save_pretrained writes it, model.safetensors or shards, tokenizer.json) and beside it <name>.npz:

    llama-gqa           4 query heads sharing 2 key/value heads, tied, rope base 500, a SentencePiece
                        tokenizer with byte fallback that puts <s> first (as TinyLlama's does)
    llama-mqa-bias      one key/value head for 4 query heads, head_dim 12 != d_model / n_heads,
                        attention and MLP biases, an untied lm_head
    qwen2-sliding       6 heads in groups of 3, q/k/v biases without an o bias, tied, byte-level BPE;
                        use_sliding_window with a 4-token window on layers >= 1
    qwen3-qk-norm       per-head q_norm/k_norm, head_dim 16 with d_model 32, untied
    qwen3-qk-norm-bf16  the same model rounded to bfloat16, saved in bfloat16 as several shards with
                        model.safetensors.index.json (its references are the rounded model's, in float32)
    mistral-window      every layer a 3-token sliding window, 1 key/value head, untied
    gpt-neox-parallel   parallel attention and MLP, a quarter of each head rotated, untied embed_out,
                        a vocabulary padded beyond the tokenizer's (as Pythia's 50304 > 50277)
    gpt-neox-sequential use_parallel_residual false, half of each head rotated, no attention biases, tied
    gpt-neo-local       global then local (3-token window) layers, unscaled scores, tied

Each .npz holds, per text (case0_, case1_, ...): text, token_ids as transformers' tokenizer gives
them, tokens, resid_pre [n_layers, pos, d_model] (each block's input), resid_post (the last
block's output), normalized (after the final norm), attentions [n_layers, n_heads, pos, pos],
logits [pos, d_vocab]; and transformers_version, torch_version. Activations are taken with forward
hooks on the modules themselves, so they do not depend on how a version reports hidden_states.

It also writes presets.json: for each named model of core.config.PRESETS, the Hub's config.json
values (typed in here from the model cards' configs) and the parameter count transformers gives
that config (instantiated on the meta device: no weights), for tests/core/test_params.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the Hub: everything here is built locally

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    GPTNeoConfig,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "families"

CORPUS = [
    "Ali makan nasi lemak.",
    "The cat sat on the mat, and the dog sat on the log.",
    "Attention is all you need; attention heads attend to tokens.",
    "Transformers transform tokens into embeddings, layer after layer.",
    "Nasi lemak is rice cooked in coconut milk.",
    "A model predicts the next token.\nThen the next one.",
]
# Long enough for the sliding windows to matter; a newline, a multi-byte character, unseen words.
TEXTS = ["The cat sat on the mat, and the dog sat on the log.", "Ali makan\nnasi lemak — café"]


# ---------------------------------------------------------------------------- tokenizers


def byte_level_bpe() -> Tokenizer:
    """GPT-2/Qwen/Pythia style: bytes as printable characters, "Ġ" for a space."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=330,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def sentencepiece_bpe() -> Tokenizer:
    """Llama 2/TinyLlama style, as their tokenizer.json has it: "▁" for a space, a BPE over
    characters whose unknown characters fall back to <0xNN> byte tokens, <s> put first."""
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for token in learned["vocab"]:
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


# ---------------------------------------------------------------------------- models


@torch.no_grad()
def redraw(model: torch.nn.Module, seed: int) -> None:
    """Weights of a size that makes patterns peaked and every array matter: N(0, 0.3²) matrices,
    N(1, 0.2²) norm gains, N(0, 0.1²) biases, N(0, 1) embeddings."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # a tied matrix is listed (and drawn) once
        noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
        leaf = name.rsplit(".", 2)[-2]
        if p.ndim == 2 and ("embed" in name or leaf in ("wte", "wpe")):
            p.copy_(noise)
        elif p.ndim == 2:
            p.copy_(0.3 * noise)
        elif "norm" in leaf or leaf.startswith("ln"):
            p.copy_(1.0 + 0.2 * noise) if name.endswith("weight") else p.copy_(0.1 * noise)
        else:
            p.copy_(0.1 * noise)


def build(config, seed: int) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    redraw(model, seed)
    return model


def blocks_and_norm(model) -> tuple[list[torch.nn.Module], torch.nn.Module]:
    base = model.base_model
    for layers, norm in (("layers", "norm"), ("layers", "final_layer_norm"), ("h", "ln_f")):
        if hasattr(base, layers) and hasattr(base, norm):
            return list(getattr(base, layers)), getattr(base, norm)
    raise AttributeError(f"cannot find the blocks of {type(base).__name__}")


@torch.no_grad()
def record(model, tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> dict[str, np.ndarray]:
    blocks, final_norm = blocks_and_norm(model)
    seen: dict[str, list] = {"resid_pre": [], "resid_post": [], "normalized": []}

    def first_tensor(x):
        return x if isinstance(x, torch.Tensor) else x[0]

    hooks = [
        b.register_forward_pre_hook(
            lambda m, args, kwargs: seen["resid_pre"].append(
                first_tensor(kwargs.get("hidden_states", args and args[0]))
            ),
            with_kwargs=True,
        )
        for b in blocks
    ]
    hooks.append(blocks[-1].register_forward_hook(lambda m, a, out: seen["resid_post"].append(first_tensor(out))))
    hooks.append(final_norm.register_forward_hook(lambda m, a, out: seen["normalized"].append(out)))
    out: dict[str, np.ndarray] = {
        "transformers_version": np.array(transformers.__version__),
        "torch_version": np.array(torch.__version__),
    }
    try:
        for i, text in enumerate(texts):
            for v in seen.values():
                v.clear()
            ids = tokenizer(text)["input_ids"]
            res = model(torch.tensor([ids]), output_attentions=True, use_cache=False)
            c = f"case{i}_"
            out[c + "text"] = np.array(text)
            out[c + "token_ids"] = np.array(ids, dtype=np.int64)
            out[c + "tokens"] = np.array(tokenizer.convert_ids_to_tokens(ids))
            out[c + "resid_pre"] = torch.stack([h[0] for h in seen["resid_pre"]]).numpy()
            out[c + "resid_post"] = seen["resid_post"][0][0].numpy()
            out[c + "normalized"] = seen["normalized"][0][0].numpy()
            out[c + "attentions"] = torch.stack([a[0] for a in res.attentions]).numpy()
            out[c + "logits"] = res.logits[0].numpy()
            assert out[c + "resid_pre"].shape[0] == len(blocks) and len(res.attentions) == len(blocks)
    finally:
        for h in hooks:
            h.remove()
    return out


def save(name: str, model, tokenizer: Tokenizer, texts: list[str], **save_kwargs) -> None:
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, **save_kwargs)
    tokenizer.save(str(folder / "tokenizer.json"))
    for extra in ("generation_config.json",):
        (folder / extra).unlink(missing_ok=True)  # not part of what the explorer reads
    reference = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    np.savez_compressed(OUT / f"{name}.npz", **record(model, reference, texts))


def family_fixtures() -> None:
    sp, bl = sentencepiece_bpe(), byte_level_bpe()
    sp_vocab, bl_vocab = sp.get_vocab_size(), bl.get_vocab_size()
    small = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64)

    save(
        "llama-gqa",
        build(
            LlamaConfig(
                **small,
                vocab_size=sp_vocab,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                rope_theta=500.0,
                rms_norm_eps=1e-5,
            ),
            11,
        ),
        sp,
        TEXTS,
    )
    save(
        "llama-mqa-bias",
        build(
            LlamaConfig(
                **small,
                vocab_size=sp_vocab,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=12,
                attention_bias=True,
                mlp_bias=True,
                tie_word_embeddings=False,
            ),
            12,
        ),
        sp,
        TEXTS,
    )
    save(
        "qwen2-sliding",
        build(
            Qwen2Config(
                **(small | {"hidden_size": 48}),
                vocab_size=bl_vocab,
                num_attention_heads=6,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                use_sliding_window=True,
                sliding_window=4,
                max_window_layers=1,
                rope_theta=1e6,
            ),
            13,
        ),
        bl,
        TEXTS,
    )
    qwen3 = build(
        Qwen3Config(
            **small,
            vocab_size=bl_vocab,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
            rope_theta=1e6,
        ),
        14,
    )
    save("qwen3-qk-norm", qwen3, bl, TEXTS)
    # The same weights in bfloat16, sharded. Its references are those of the rounded weights run in
    # float32; only the weights are rounded (model.to(bfloat16) would round the rotary inv_freq
    # buffer too, which no checkpoint stores).
    rounded = {k: v.to(torch.bfloat16) for k, v in qwen3.state_dict().items()}
    folder = OUT / "qwen3-qk-norm-bf16"
    shutil.rmtree(folder, ignore_errors=True)
    qwen3.save_pretrained(folder, state_dict=dict(rounded), max_shard_size="20KB")  # it empties the dict
    bl.save(str(folder / "tokenizer.json"))
    (folder / "generation_config.json").unlink(missing_ok=True)
    assert (folder / "model.safetensors.index.json").is_file(), "expected a sharded checkpoint"
    qwen3.load_state_dict({k: v.to(torch.float32) for k, v in rounded.items()})
    reference = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    np.savez_compressed(OUT / "qwen3-qk-norm-bf16.npz", **record(qwen3, reference, TEXTS))
    save(
        "mistral-window",
        build(
            MistralConfig(
                **small,
                vocab_size=sp_vocab,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=8,
                sliding_window=3,
                tie_word_embeddings=False,
            ),
            15,
        ),
        sp,
        TEXTS,
    )
    padded = -(-bl_vocab // 64) * 64  # Pythia pads its embedding beyond the tokenizer's vocabulary
    save(
        "gpt-neox-parallel",
        build(
            GPTNeoXConfig(
                **small,
                vocab_size=padded,
                num_attention_heads=2,
                rotary_pct=0.25,
                use_parallel_residual=True,
                tie_word_embeddings=False,
                hidden_act="gelu",
            ),
            16,
        ),
        bl,
        TEXTS,
    )
    save(
        "gpt-neox-sequential",
        build(
            GPTNeoXConfig(
                **small,
                vocab_size=bl_vocab,
                num_attention_heads=4,
                rotary_pct=0.5,
                use_parallel_residual=False,
                attention_bias=False,
                tie_word_embeddings=True,
                hidden_act="gelu_new",
            ),
            17,
        ),
        bl,
        TEXTS,
    )
    save(
        "gpt-neo-local",
        build(
            GPTNeoConfig(
                vocab_size=bl_vocab,
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                max_position_embeddings=64,
                attention_types=[[["global", "local"], 1]],
                window_size=3,
                intermediate_size=None,
                bos_token_id=0,
                eos_token_id=0,
            ),
            18,
        ),
        bl,
        TEXTS,
    )


# ---------------------------------------------------------------------------- presets

# The named models' config.json values on the Hub (model_type and the fields that set their
# sizes); transformers fills in the rest with its defaults.
HUB_CONFIGS = {
    "smollm2-135m": LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000,
        tie_word_embeddings=True,
        head_dim=64,
    ),
    "tinyllama-1.1b": LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=32768,
        max_window_layers=24,
    ),
    "qwen3-0.6b": Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000,
        tie_word_embeddings=True,
        use_sliding_window=False,
        max_window_layers=28,
    ),
    "pythia-70m": GPTNeoXConfig(
        vocab_size=50304,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=8,
        max_position_embeddings=2048,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
    ),
    "tinystories-33m": GPTNeoConfig(
        vocab_size=50257,
        hidden_size=768,
        num_layers=4,
        num_heads=16,
        max_position_embeddings=2048,
        attention_types=[[["global", "local"], 2]],
        window_size=256,
        intermediate_size=None,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
    ),
}


def preset_counts() -> None:
    out = {"transformers_version": transformers.__version__, "torch_version": torch.__version__, "presets": {}}
    for name, config in HUB_CONFIGS.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        n = sum(p.numel() for p in model.parameters())  # a tied matrix is one parameter, listed once
        out["presets"][name] = {"config": config.to_dict(), "num_parameters": n}
        print(f"{name:16s} {n:>14,d} parameters")
    (OUT / "presets.json").write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")


def main() -> None:
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    family_fixtures()
    preset_counts()
    total = 0
    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            total += path.stat().st_size
            print(f"{path.stat().st_size:>9,d}  {path.relative_to(ROOT)}")
    print(f"{total:>9,d}  in all")


if __name__ == "__main__":
    main()
