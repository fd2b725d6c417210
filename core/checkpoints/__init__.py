"""Trained models from a Hugging Face-format folder: config.json, the weights, tokenizer.json.

Every supported family maps onto core's one model through config switches (core.config):
  gpt2                           GPT-2: the reference decoder
  bert                           BERT encoders (all-MiniLM-L6-v2): post-norm, bidirectional
  llama, mistral, qwen2, qwen3   RMS norm, SwiGLU, rotary, grouped-query attention (SmolLM2, TinyLlama, Qwen)
  gpt_neox                       Pythia: parallel attention and MLP, partial rotary
  gpt_neo                        TinyStories: unscaled scores, local attention layers
one module per family here says how its config.json and tensor names map onto core's. Nothing
needs torch: safetensors files are read by core.checkpoints.tensors (memory-mapped: float32
weights are the file's own pages, shared by every process that loads them) and tokenizer.json
by the `tokenizers` package, imported only when a tokenizer is built, so `import core` stays NumPy.

    spec = read_spec("path/to/model")        # config.json only: cheap, for listing a model
    ckpt = load_checkpoint("path/to/model")  # weights and tokenizer
    logits, cache = run_with_cache(ckpt.params, ckpt.cfg, ckpt.tokenizer.encode("Hello").ids)

Every way a folder can fail to load (a missing file or shard, an unsupported architecture or
config field, a tensor of the wrong shape or dtype) raises CheckpointError, whose message says what
is wrong and what to do about it.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from ..config import TransformerConfig
from ..errors import InputError
from ..model import Params, iter_arrays
from . import bert, gpt2, gpt_neo, gpt_neox, llama
from .tensors import (
    CONFIG_FILE,
    INDEX_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    SafetensorsFile,
    Tensors,
    weight_files,
)
from .tokenizer import HFTokenizer

# config.json's model_type -> the module that maps that family onto core.
FAMILIES: dict[str, ModuleType] = {t: m for m in (gpt2, bert, llama, gpt_neox, gpt_neo) for t in m.MODEL_TYPES}

# Families people ask for that do not run yet, and why (anything else gets the generic refusal).
NOT_YET = {
    "gemma": "its RMS norm scales by (1 + w) and it multiplies embeddings by √d_model",
    "gemma2": "it soft-caps attention scores and logits and alternates sliding-window layers",
    "gemma3": "it soft-caps and mixes local and global rotary bases",
    "phi": "its partial rotary and parallel block need a dense layer norm layout not mapped yet",
    "phi3": "its fused qkv_proj and gate_up_proj and long-context rope scaling are not mapped yet",
    "olmo2": "it normalises after each sub-layer and across all heads' queries and keys",
    "mixtral": "it is a mixture of experts",
}

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "TOKENIZER_FILE",
    "WEIGHTS_FILE",
    "FAMILIES",
    "Checkpoint",
    "CheckpointError",
    "CheckpointSpec",
    "HFTokenizer",
    "SafetensorsFile",
    "Tensors",
    "checkpoint_problem",
    "load_checkpoint",
    "is_mapped",
    "load_params",
    "mapped_nbytes",
    "params_nbytes",
    "read_spec",
    "TRAINED_DIR",
    "trained_models",
]


@dataclass(frozen=True)
class CheckpointSpec:
    """What config.json says: enough to list a model without reading its weights."""

    path: Path
    family: str  # config.json's model_type, a key of FAMILIES
    cfg: TransformerConfig
    raw_config: dict

    @property
    def is_encoder(self) -> bool:  # encoders see both ways and predict no next token
        return self.family == "bert"

    @property
    def sharded(self) -> bool:
        return not (self.path / WEIGHTS_FILE).is_file()

    @property
    def description(self) -> str:
        c = self.cfg
        heads = f"{c.n_heads} heads"
        if c.n_key_value_heads != c.n_heads:
            heads += f" sharing {c.n_key_value_heads} key/value heads"
        return (
            f"{FAMILIES[self.family].LABEL}: {c.n_layers} layers, {heads}, d_model {c.d_model}, "
            f"vocabulary {c.d_vocab}, context {c.n_ctx}"
        )


@dataclass(frozen=True)
class Checkpoint:
    spec: CheckpointSpec
    params: Params
    tokenizer: HFTokenizer

    @property
    def cfg(self) -> TransformerConfig:
        return self.spec.cfg

    @property
    def nbytes(self) -> int:
        return params_nbytes(self.params)


# ---------------------------------------------------------------------------- config.json


def read_spec(folder: str | Path) -> CheckpointSpec:
    """Check the folder holds its files and read config.json into a TransformerConfig."""
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder")
    has_weights = (path / WEIGHTS_FILE).is_file() or (path / INDEX_FILE).is_file()
    missing = [
        f
        for f, ok in (
            (CONFIG_FILE, (path / CONFIG_FILE).is_file()),
            (WEIGHTS_FILE, has_weights),
            (TOKENIZER_FILE, (path / TOKENIZER_FILE).is_file()),
        )
        if not ok
    ]
    if missing:
        hint = ""
        if WEIGHTS_FILE in missing and any(path.glob("pytorch_model*.bin")):
            hint = " (pytorch_model.bin is not read: it needs torch; save the model with safe_serialization=True)"
        raise CheckpointError(
            f"missing {', '.join(missing)}: a checkpoint folder needs {CONFIG_FILE}, "
            f"{WEIGHTS_FILE} (or {INDEX_FILE} and its shards) and {TOKENIZER_FILE}{hint}"
        )
    try:
        raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{CONFIG_FILE} is not readable JSON: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{CONFIG_FILE} should hold a JSON object")
    family = raw.get("model_type")
    if family not in FAMILIES:
        why = f" ({NOT_YET[family]})" if family in NOT_YET else ""
        raise CheckpointError(
            f"model_type {family!r} is not supported{why}: this explorer runs {', '.join(FAMILIES)} checkpoints"
        )
    try:
        cfg = FAMILIES[family].config(raw)
    except KeyError as e:
        raise CheckpointError(f"{CONFIG_FILE} does not describe a runnable {family!r} model: it has no {e}") from None
    except (InputError, TypeError, ValueError) as e:
        raise CheckpointError(f"{CONFIG_FILE} does not describe a runnable {family!r} model: {e}") from None
    weight_files(path)  # a sharded checkpoint's shards must all be there
    return CheckpointSpec(path, family, cfg, raw)


# ---------------------------------------------------------------------------- weights


def load_params(spec: CheckpointSpec) -> Params:
    """Read the weights into core's parameter dict (see core.model.init_params for its keys).

    float32 tensors are read-only views of the memory-mapped files (no copy); float16 and
    bfloat16 ones are upcast to float32 copies."""
    family = FAMILIES[spec.family]
    try:
        return family.params(Tensors(spec.path, family.PREFIXES), spec.cfg)
    except CheckpointError:
        raise
    except (OSError, ValueError) as e:  # e.g. a file changed under us
        raise CheckpointError(f"the weights cannot be read: {e}") from None


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory a view sees (a transposed matrix's untransposed original)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def is_mapped(array: np.ndarray) -> bool:
    """True for a view of a memory-mapped file (np.frombuffer on an mmap: base is a memoryview of it)."""
    owner = _root(array).base
    return isinstance(owner.obj if isinstance(owner, memoryview) else owner, mmap.mmap)


def params_nbytes(params: Params) -> int:
    """Bytes held by the parameter arrays (a view, such as a transposed matrix, counts its base once)."""
    return sum({id(root): root.nbytes for root in (_root(a) for _, a in iter_arrays(params))}.values())


def mapped_nbytes(params: Params) -> int:
    """Of params_nbytes, the bytes that are views of memory-mapped weight files: pages of the page
    cache, shared by every process that maps the same file, rather than this process's own memory."""
    roots = (_root(a) for _, a in iter_arrays(params))
    return sum({id(root): root.nbytes for root in roots if is_mapped(root)}.values())


# ---------------------------------------------------------------------------- all together


def load_checkpoint(folder: str | Path, spec: CheckpointSpec | None = None) -> Checkpoint:
    """Config, weights and tokenizer of a folder; raises CheckpointError saying why not."""
    spec = spec or read_spec(folder)
    tokenizer = HFTokenizer(spec.path / TOKENIZER_FILE)
    if tokenizer.vocab_size > spec.cfg.d_vocab:
        raise CheckpointError(
            f"{TOKENIZER_FILE} has {tokenizer.vocab_size} tokens but the model's "
            f"embedding has only {spec.cfg.d_vocab} rows: they do not belong together"
        )
    return Checkpoint(spec, load_params(spec), tokenizer)


# Models trained by core.train that ship with core (`make trained-models` writes them).
TRAINED_DIR = Path(__file__).resolve().parent.parent / "trained"


def trained_models() -> dict[str, Path]:
    """The checkpoint folders in core/trained/ by name."""
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
