"""A trained model as a Hugging Face GPT-2 folder: config.json, model.safetensors, tokenizer.json.

The format core/checkpoints/ loads and `transformers` opens as it is
(GPT2LMHeadModel.from_pretrained(folder); AutoTokenizer too, through tokenizer_config.json).
GPT-2 has fewer switches than core's model, so a few settings are written as GPT-2 spells them:

  LNPre (no gain, no bias)    gain 1 and bias 0: the same numbers
  bias=False                  biases of exactly 0
  attn_only (no MLP)          GPT-2 has no such switch, and transformers cannot run an MLP of width 0,
                              so each block gets an MLP of width 1 whose weights and biases are exactly
                              0 (it adds exactly 0), and config.json says "attn_only": true, which
                              core's loader reads so the explorer shows no MLP at all.

The tokenizer is character-level: a WordLevel vocabulary of single characters (plus [UNK] for any
other character, when the recipe has one) behind a pre-tokenizer that splits every character, and a
decoder that joins them back without spaces. Weights are written as float32, as GPT-2's are.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .config import TransformerConfig
from .errors import InputError
from .i18n import _
from .model import Params, unembedding

ACTIVATION_NAMES = {"gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu"}  # core -> transformers
UNK = "[UNK]"


def check_exportable(cfg: TransformerConfig) -> None:
    """Raise an InputError naming the setting GPT-2's format cannot express."""
    problems = []
    if cfg.positional_embedding_type != "learned":
        problems.append(_("{kind} positions (GPT-2 has a learned table)").format(kind=cfg.positional_embedding_type))
    if cfg.block_type != "pre_norm" or cfg.n_token_types:
        problems.append(_("an encoder's layout (GPT-2 is a pre-norm decoder)"))
    if not cfg.causal:
        problems.append(_("bidirectional attention (GPT-2 is causal)"))
    if not cfg.use_attn_scale or cfg.attn_temperature != 1.0:
        problems.append(_("unscaled attention or a temperature (GPT-2 divides by √d_head only)"))
    if cfg.n_heads * cfg.d_head != cfg.d_model:
        problems.append("d_head × n_heads ≠ d_model")
    if problems:
        raise InputError(_("GPT-2's format cannot hold {problems}").format(problems="; ".join(problems)))


def gpt2_config(cfg: TransformerConfig, metadata: dict | None = None) -> dict:
    """config.json for GPT2LMHeadModel."""
    check_exportable(cfg)
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.d_vocab,
        "n_positions": cfg.n_ctx,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": 1 if cfg.attn_only else cfg.d_mlp,
        "activation_function": ACTIVATION_NAMES[cfg.act_fn],
        "layer_norm_epsilon": cfg.eps,
        "tie_word_embeddings": cfg.tied_embeddings,
        "scale_attn_weights": True,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }
    if cfg.attn_only:
        config["attn_only"] = True  # read by core.checkpoints: the zero MLP is not shown or run
    if metadata:
        config["transformer_explorer"] = metadata
    return config


def gpt2_tensors(params: Params, cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """core's parameters under GPT2LMHeadModel's names, float32. GPT-2's Conv1D weights are stored
    [in, out], core's layout, so W_QKV, W_O, W_in and W_out are written as they are."""
    check_exportable(cfg)
    d = cfg.d_model
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    ones, zeros = (lambda *shape: np.ones(shape, np.float32)), (lambda *shape: np.zeros(shape, np.float32))

    def ln(norm: dict, name: str) -> dict:  # LNPre: gain 1, bias 0
        return {
            f"{name}.weight": f32(norm["w"]) if "w" in norm else ones(d),
            f"{name}.bias": f32(norm["b"]) if "b" in norm else zeros(d),
        }

    def bias(block_part: dict, key: str, n: int) -> np.ndarray:
        return f32(block_part[key]) if key in block_part else zeros(n)

    t = {
        "transformer.wte.weight": f32(params["embed"]["W_E"]),
        "transformer.wpe.weight": f32(params["pos_embed"]["W_pos"]),
    }
    for layer, block in enumerate(params["blocks"]):
        h, attn = f"transformer.h.{layer}.", block["attn"]
        t |= ln(block["ln1"], h + "ln_1")
        t |= {
            h + "attn.c_attn.weight": f32(attn["W_QKV"]),
            h + "attn.c_attn.bias": bias(attn, "b_QKV", 3 * d),
            h + "attn.c_proj.weight": f32(attn["W_O"]),
            h + "attn.c_proj.bias": bias(attn, "b_O", d),
        }
        if cfg.attn_only:  # an MLP of width 1 that adds exactly 0
            t |= {
                h + "ln_2.weight": ones(d),
                h + "ln_2.bias": zeros(d),
                h + "mlp.c_fc.weight": zeros(d, 1),
                h + "mlp.c_fc.bias": zeros(1),
                h + "mlp.c_proj.weight": zeros(1, d),
                h + "mlp.c_proj.bias": zeros(d),
            }
        else:
            mlp = block["mlp"]
            t |= ln(block["ln2"], h + "ln_2")
            t |= {
                h + "mlp.c_fc.weight": f32(mlp["W_in"]),
                h + "mlp.c_fc.bias": bias(mlp, "b_in", cfg.d_mlp),
                h + "mlp.c_proj.weight": f32(mlp["W_out"]),
                h + "mlp.c_proj.bias": bias(mlp, "b_out", d),
            }
    t |= ln(params["ln_final"], "transformer.ln_f")
    if not cfg.tied_embeddings:
        W_U, b_U = unembedding(params)
        if b_U is not None and np.any(b_U):
            raise InputError(_("GPT-2's output layer has no bias: train with bias=False or tied embeddings"))
        t["lm_head.weight"] = f32(W_U.T)  # nn.Linear stores [out, in]
    return t


def char_tokenizer(vocab: tuple[str, ...], lowercase: bool = False):
    """A tokenizers.Tokenizer with one token per character: id i is vocab[i] ([UNK], if present, for the rest)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    unk = UNK if UNK in vocab else None
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(vocab)}, unk_token=unk))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character, newlines too
    tok.decoder = decoders.Fuse()  # join characters back with nothing between them
    if unk:
        tok.add_special_tokens([unk])  # already id 0; marked special so it is shown as it is
    return tok


def save_gpt2_folder(
    folder: str | Path, params: Params, cfg: TransformerConfig, recipe, settings, blas: dict | None = None
) -> Path:
    """Write the folder (replacing one already there, never leaving half of one). config.json's
    `transformer_explorer` section (the card) records the recipe, its settings, NumPy's and Python's
    versions and, when given, the BLAS the training ran on (core.train.blas_in_use)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    metadata = {
        "recipe": settings.recipe,
        "settings": settings.to_dict(),
        "vocab": "".join(c for c in recipe.vocab if c != UNK),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    if getattr(recipe, "text", None) is not None:
        from .recipes import text_hash

        metadata["corpus_sha256"] = text_hash(recipe.text)
    if blas:
        metadata["blas"] = blas
    config = gpt2_config(cfg, metadata)
    tokenizer = char_tokenizer(recipe.vocab, recipe.lowercase)
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.n_ctx,
        "clean_up_tokenization_spaces": False,
    }
    if UNK in recipe.vocab:
        tok_config["unk_token"] = UNK

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save_file(gpt2_tensors(params, cfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
        for path in (tmp, *tmp.iterdir()):  # readable by all, as a checkout's files (mkdtemp makes 0700)
            path.chmod(0o755 if path.is_dir() else 0o644)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
