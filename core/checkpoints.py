"""Trained models from a Hugging Face-format folder: config.json, model.safetensors, tokenizer.json.

Two families map onto core's one model: GPT-2 decoders (pre-norm, causal, tied unembedding) and
BERT encoders (post-norm, bidirectional, segment embeddings). Nothing here needs torch:
`safetensors` reads the weights straight into NumPy and `tokenizers` reads tokenizer.json. Both
are imported inside the functions that use them, so `import core` stays pure NumPy.

    spec = read_spec("path/to/gpt2")        # config.json only: cheap, for listing a model
    ckpt = load_checkpoint("path/to/gpt2")  # weights and tokenizer
    logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ckpt.tokenizer.encode("Hello").ids)

Every way a folder can fail to load (a missing file, an unsupported architecture, a tensor of the
wrong shape) raises CheckpointError, whose message says what is wrong and what to do about it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from .config import TransformerConfig
from .model import Params, iter_arrays
from .tokenizers import Encoding

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
TRAINED_DIR = Path(__file__).resolve().parent / "trained"  # models trained by core.train that ship with core
FAMILIES = ("gpt2", "bert")  # config.json's model_type values this loader understands

# Hugging Face's names of activation functions -> core's (gelu_pytorch_tanh is GPT-2's tanh GELU).
_ACT_FNS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


class CheckpointError(ValueError):
    """Why a folder cannot be run, in words a user can act on."""


@dataclass(frozen=True)
class CheckpointSpec:
    """What config.json says: enough to list a model without reading its weights."""

    path: Path
    family: Literal["gpt2", "bert"]
    cfg: TransformerConfig
    raw_config: dict

    @property
    def is_encoder(self) -> bool:  # encoders see both ways and predict no next token
        return self.family == "bert"

    @property
    def description(self) -> str:
        c = self.cfg
        kind = "BERT-family encoder" if self.is_encoder else "GPT-2-family decoder"
        return (f"{kind}: {c.n_layers} layers, {c.n_heads} heads, d_model {c.d_model}, "
                f"vocabulary {c.d_vocab}, context {c.n_ctx}")


@dataclass(frozen=True)
class Checkpoint:
    spec: CheckpointSpec
    params: Params
    tokenizer: "HFTokenizer"

    @property
    def cfg(self) -> TransformerConfig:
        return self.spec.cfg

    @property
    def nbytes(self) -> int:
        return params_nbytes(self.params)


# ---------------------------------------------------------------------------- config.json

def read_spec(folder: str | Path) -> CheckpointSpec:
    """Check the folder holds the three files and read config.json into a TransformerConfig."""
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder")
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) if not (path / f).is_file()]
    if missing:
        hint = ""
        if WEIGHTS_FILE in missing and (path / "pytorch_model.bin").is_file():
            hint = " (pytorch_model.bin is not read: it needs torch; save the model with safe_serialization=True)"
        elif WEIGHTS_FILE in missing and (path / "model.safetensors.index.json").is_file():
            hint = " (sharded checkpoints are not supported)"
        raise CheckpointError(f"missing {', '.join(missing)}: a checkpoint folder needs "
                              f"{CONFIG_FILE}, {WEIGHTS_FILE} and {TOKENIZER_FILE}{hint}")
    try:
        raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{CONFIG_FILE} is not readable JSON: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{CONFIG_FILE} should hold a JSON object")
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(f"model_type {family!r} is not supported: this explorer runs "
                              f"{' and '.join(FAMILIES)} checkpoints")
    try:
        cfg = _gpt2_config(raw) if family == "gpt2" else _bert_config(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{CONFIG_FILE} does not describe a runnable {family} model: {e}") from None
    return CheckpointSpec(path, family, cfg, raw)


def _act_fn(name: object) -> str:
    if name not in _ACT_FNS:
        raise ValueError(f"activation {name!r} is not one of {', '.join(_ACT_FNS)}")
    return _ACT_FNS[name]


def _gpt2_config(c: dict) -> TransformerConfig:
    if c.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError("scale_attn_by_inverse_layer_idx (Mistral-style scaling) is not supported")
    return TransformerConfig(
        d_model=c["n_embd"], n_layers=c["n_layer"], n_heads=c["n_head"], d_vocab=c["vocab_size"],
        n_ctx=c.get("n_positions", c.get("n_ctx", 1024)), d_mlp=c.get("n_inner"),  # None: 4 * d_model
        act_fn=_act_fn(c.get("activation_function", "gelu_new")),
        use_attn_scale=c.get("scale_attn_weights", True), eps=c.get("layer_norm_epsilon", 1e-5),
        tied_embeddings=c.get("tie_word_embeddings", True),
        normalization_type="LN", positional_embedding_type="learned", attention_dir="causal",
        block_type="pre_norm", bias=True,
        # Not GPT-2's: core/export.py writes it for attention-only models, whose MLPs are exactly zero.
        attn_only=c.get("attn_only", False) is True,
    )


def _bert_config(c: dict) -> TransformerConfig:
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {c['position_embedding_type']!r} is not supported (only absolute)")
    if c.get("is_decoder"):
        raise ValueError("BERT used as a decoder (is_decoder) is not supported")
    return TransformerConfig(
        d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
        d_vocab=c["vocab_size"], n_ctx=c.get("max_position_embeddings", 512), d_mlp=c["intermediate_size"],
        act_fn=_act_fn(c.get("hidden_act", "gelu")), eps=c.get("layer_norm_eps", 1e-12),
        n_token_types=c.get("type_vocab_size", 2),
        # BERT's masked-LM head (a dense layer, a norm, then W_E transposed) is not loaded: the
        # explorer shows an encoder's activations, not its predictions. Tied means "no W_U array".
        tied_embeddings=True,
        normalization_type="LN", positional_embedding_type="learned", attention_dir="bidirectional",
        block_type="post_norm", bias=True,
    )


# ---------------------------------------------------------------------------- weights

class _Tensors:
    """Named tensors of one safetensors file, with the family's optional key prefix removed.

    safetensors memory-maps the file and copies each tensor out once, when asked for it, so
    buffers we never ask for (attn.bias masks, position_ids, a pooler) are never read.
    """

    def __init__(self, handle, prefixes: tuple[str, ...]):
        self._handle = handle
        self._keys = set(handle.keys())
        # "transformer.h.0..." (GPT2LMHeadModel) and "h.0..." (GPT2Model) name the same tensor;
        # a name not found under the prefix is looked up bare (lm_head.weight sits beside it).
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in self._keys)), "")

    def has(self, name: str) -> bool:
        return self.prefix + name in self._keys or name in self._keys

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self.prefix + name if self.prefix + name in self._keys else name
        if key not in self._keys:
            raise CheckpointError(f"{WEIGHTS_FILE} has no tensor {key!r}: is this really the model "
                                  f"config.json describes?")
        try:
            array = self._handle.get_tensor(key)
        except Exception as e:  # e.g. bfloat16, which NumPy has no type for
            raise CheckpointError(f"cannot read tensor {key!r}: {e}") from None
        if tuple(array.shape) != shape:
            raise CheckpointError(f"tensor {key!r} has shape {list(array.shape)} but config.json implies {list(shape)}")
        if array.dtype == np.float16:  # half precision would make the softmax and norms inexact
            array = array.astype(np.float32)
        if array.dtype not in (np.float32, np.float64):
            raise CheckpointError(f"tensor {key!r} has dtype {array.dtype}; float32 or float16 are supported")
        array.flags.writeable = False  # shared by every request: nothing may change it in place
        return array


def load_params(spec: CheckpointSpec) -> Params:
    """Read model.safetensors into core's parameter dict (see core.model.init_params for its keys)."""
    from safetensors import safe_open  # lazily: `import core` needs NumPy only

    try:
        with safe_open(str(spec.path / WEIGHTS_FILE), framework="numpy") as handle:
            if spec.family == "gpt2":
                return _gpt2_params(_Tensors(handle, ("transformer.",)), spec.cfg)
            return _bert_params(_Tensors(handle, ("bert.",)), spec.cfg)
    except CheckpointError:
        raise
    except Exception as e:  # a truncated or corrupt file: safetensors raises its own errors
        raise CheckpointError(f"{WEIGHTS_FILE} cannot be read: {e}") from None


def _gpt2_params(t: _Tensors, cfg: TransformerConfig) -> Params:
    """GPT-2's Conv1D weights are stored [in, out], which is already core's layout: no copies."""
    d, dm, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    hd = cfg.n_heads * cfg.d_head

    def ln(name: str) -> dict:
        return {"w": t.get(f"{name}.weight", (d,)), "b": t.get(f"{name}.bias", (d,))}

    params: Params = {"embed": {"W_E": t.get("wte.weight", (V, d))},
                      "pos_embed": {"W_pos": t.get("wpe.weight", (cfg.n_ctx, d))}}
    blocks = []
    for layer in range(cfg.n_layers):
        h = f"h.{layer}."
        # h.{l}.attn.bias / attn.masked_bias, in older checkpoints, are the causal mask as a
        # constant buffer; core builds the mask itself, so they are not read.
        block = {
            "ln1": ln(h + "ln_1"),
            "attn": {"W_QKV": t.get(h + "attn.c_attn.weight", (d, 3 * hd)),  # columns [Q | K | V]
                     "b_QKV": t.get(h + "attn.c_attn.bias", (3 * hd,)),
                     "W_O": t.get(h + "attn.c_proj.weight", (hd, d)),
                     "b_O": t.get(h + "attn.c_proj.bias", (d,))},
        }
        if cfg.attn_only:
            # The stored MLP must add nothing, or transformers would compute another model than core.
            if np.any(t.get(h + "mlp.c_proj.weight", (dm, d))) or np.any(t.get(h + "mlp.c_proj.bias", (d,))):
                raise CheckpointError(f"config.json says attn_only, but layer {layer}'s MLP output weights are not "
                                      f"all zero: remove attn_only or zero mlp.c_proj")
        else:
            block |= {"ln2": ln(h + "ln_2"),
                      "mlp": {"W_in": t.get(h + "mlp.c_fc.weight", (d, dm)), "b_in": t.get(h + "mlp.c_fc.bias", (dm,)),
                              "W_out": t.get(h + "mlp.c_proj.weight", (dm, d)),
                              "b_out": t.get(h + "mlp.c_proj.bias", (d,))}}
        blocks.append(block)
    params["blocks"] = blocks
    params["ln_final"] = ln("ln_f")
    if not cfg.tied_embeddings:
        # lm_head is an nn.Linear, stored [out, in]: its transpose is a view, not a copy.
        # (When tied, a stored lm_head.weight is just W_E again and is not read.)
        if not t.has("lm_head.weight"):
            raise CheckpointError("config.json says tie_word_embeddings is false but there is no lm_head.weight")
        params["unembed"] = {"W_U": t.get("lm_head.weight", (V, d)).T}  # [d_model, d_vocab]
    return params


def _bert_params(t: _Tensors, cfg: TransformerConfig) -> Params:
    """BERT's nn.Linear weights are stored [out, in]: core uses their transposes, and fuses query,
    key and value into one W_QKV [d_model, 3 * n_heads * d_head]; both are built once, here."""
    d, dm, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    hd = cfg.n_heads * cfg.d_head

    def ln(name: str) -> dict:
        return {"w": t.get(f"{name}.weight", (d,)), "b": t.get(f"{name}.bias", (d,))}

    def linear(name: str, d_in: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
        # Transposed once here, into row-major [in, out]: the [out, in] array read from the file is
        # then dropped, so memory stays one copy, and x @ W runs ~1.4x faster than on a view.
        w = np.ascontiguousarray(t.get(f"{name}.weight", (d_out, d_in)).T)  # [in, out]
        w.flags.writeable = False
        return w, t.get(f"{name}.bias", (d_out,))

    e = "embeddings."
    params: Params = {"embed": {"W_E": t.get(e + "word_embeddings.weight", (V, d))},
                      "pos_embed": {"W_pos": t.get(e + "position_embeddings.weight", (cfg.n_ctx, d))},
                      "token_type_embed": {"W_token_type": t.get(e + "token_type_embeddings.weight",
                                                                 (cfg.n_token_types, d))},
                      "ln_embed": ln(e + "LayerNorm")}
    blocks = []
    for layer in range(cfg.n_layers):
        b = f"encoder.layer.{layer}."
        qkv = [linear(b + f"attention.self.{m}", d, hd) for m in ("query", "key", "value")]
        W_QKV = np.concatenate([w for w, _ in qkv], axis=1)  # [d_model, 3 * n_heads * d_head]
        b_QKV = np.concatenate([bias for _, bias in qkv])
        W_QKV.flags.writeable = b_QKV.flags.writeable = False
        W_O, b_O = linear(b + "attention.output.dense", hd, d)
        W_in, b_in = linear(b + "intermediate.dense", d, dm)
        W_out, b_out = linear(b + "output.dense", dm, d)
        # Post-norm: ln1 normalises x + attn(x) ("attention.output.LayerNorm"), ln2 normalises
        # x + mlp(x) ("output.LayerNorm"), matching core.model.transformer_block.
        blocks.append({"ln1": ln(b + "attention.output.LayerNorm"),
                       "attn": {"W_QKV": W_QKV, "b_QKV": b_QKV, "W_O": W_O, "b_O": b_O},
                       "ln2": ln(b + "output.LayerNorm"),
                       "mlp": {"W_in": W_in, "b_in": b_in, "W_out": W_out, "b_out": b_out}})
    params["blocks"] = blocks
    return params


def params_nbytes(params: Params) -> int:
    """Bytes held by the parameter arrays (a view, such as a transposed matrix, counts its base once)."""
    seen: dict[int, int] = {}
    for _, array in iter_arrays(params):
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        seen[id(base)] = base.nbytes
    return sum(seen.values())


# ---------------------------------------------------------------------------- tokenizer

def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes every byte as a printable character: bytes that already are
    printable (in ASCII or Latin-1) stand for themselves, the other 68 (controls, space, soft
    hyphen...) are moved, in byte order, to the characters from U+0100 on; so a space is "Ġ"
    (U+0120) and a newline "Ċ" (U+010A). Returns that character -> byte table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    moved = (b for b in range(256) if b not in table.values())
    table |= {chr(256 + i): b for i, b in enumerate(moved)}
    return table


# How whitespace inside a byte-level token is shown, so that a token's leading space stays visible
# on an axis label: "Ġthe" is shown "␣the" and "Ċ" is shown "↵".
_VISIBLE_WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


class HFTokenizer:
    """A tokenizer.json, as core's Tokenizer protocol: encode(text) -> Encoding, token_str(id).

    Tokens are shown as the tokenizer splits them. WordPiece pieces keep their "##" (that is how
    BERT marks a piece that continues a word). Byte-level BPE pieces (GPT-2) are turned back into
    the text they stand for, with whitespace made visible (␣ for a space, ↵ for a newline); a
    piece holding part of a multi-byte character shows those bytes as \\xNN escapes.
    Special tokens ([CLS], [SEP], <|endoftext|>) are shown as they are.
    """

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer, decoders  # lazily: `import core` needs NumPy only

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:
            raise CheckpointError(f"{TOKENIZER_FILE} cannot be read: {e}") from None
        # Sentence-transformers folders pad every text to a fixed length and silently truncate:
        # the explorer wants exactly the text's tokens, and a clear error when it is too long.
        self._tok.no_padding()
        self._tok.no_truncation()
        self.byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        self._alphabet = _byte_level_alphabet() if self.byte_level else {}
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> Encoding:
        if not text:
            raise ValueError("the text is empty: type at least one word")
        try:
            enc = self._tok.encode(text)
        except Exception as e:  # a vocabulary with no [UNK] (a character model's) meets a character it lacks
            unknown = sorted({c for c in text if self._tok.token_to_id(c) is None})
            raise ValueError(f"characters {''.join(unknown)!r} are not in this model's vocabulary"
                             if unknown else f"the tokenizer cannot encode this text: {e}") from None
        if not enc.ids:
            raise ValueError(f"the tokenizer found no tokens in {text!r}")
        return Encoding(list(enc.ids), [self._readable(t) for t in enc.tokens])

    def token_str(self, token_id: int) -> str:
        token = self._tok.id_to_token(int(token_id))
        if token is None:
            raise ValueError(f"token id {token_id} is not in the vocabulary of {self.vocab_size} tokens")
        return self._readable(token)

    def _readable(self, token: str) -> str:
        if not self.byte_level or token in self._special or any(c not in self._alphabet for c in token):
            return token
        text = bytes(self._alphabet[c] for c in token).decode("utf-8", errors="backslashreplace")
        return "".join(_VISIBLE_WHITESPACE.get(c, c) for c in text)


# ---------------------------------------------------------------------------- all together

def load_checkpoint(folder: str | Path, spec: CheckpointSpec | None = None) -> Checkpoint:
    """Config, weights and tokenizer of a folder; raises CheckpointError saying why not."""
    spec = spec or read_spec(folder)
    tokenizer = HFTokenizer(spec.path / TOKENIZER_FILE)
    if tokenizer.vocab_size > spec.cfg.d_vocab:
        raise CheckpointError(f"{TOKENIZER_FILE} has {tokenizer.vocab_size} tokens but the model's "
                              f"embedding has only {spec.cfg.d_vocab} rows: they do not belong together")
    return Checkpoint(spec, load_params(spec), tokenizer)


def trained_models() -> dict[str, Path]:
    """The checkpoint folders in core/trained/ by name (`make trained-models` writes them)."""
    if not TRAINED_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(TRAINED_DIR.iterdir()) if (p / CONFIG_FILE).is_file()}


def checkpoint_problem(folder: str | Path) -> str | None:
    """None if the folder looks runnable (from config.json), else the reason it is not; never raises."""
    try:
        read_spec(folder)
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # anything unforeseen still becomes a reason, not a crash
        return f"cannot be read: {type(e).__name__}: {e}"
    return None
