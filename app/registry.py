"""The models this server can run, by name: built-in toys now, Hugging Face checkpoints later.

A `Model` knows its default config, its tokeniser, which toggles it accepts, and how to get
weights for a config. The service layer (app/service.py) checks a request against the limits
*before* asking for weights, because drawing or loading them is the expensive part.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from core import PRESETS, TransformerConfig, init_params, lessons
from core.model import Params
from core.tokenizers import AsciiTokenizer, CharTokenizer, Encoding, Tokenizer

from .settings import get_settings

# The run request's toggles, by kind: attention toggles change how a model computes, size
# toggles (and seed) change which weights it has.
ATTENTION_TOGGLES = ("causal", "scale", "temperature", "positional_embedding_type")
SIZE_TOGGLES = ("n_heads", "n_layers", "d_model", "seed")

# How many drawn toy models stay in memory; each is at most settings.max_params floats.
PARAMS_CACHE_SIZE = 4


@dataclass(frozen=True)
class Model:
    name: str
    kind: Literal["toy", "pretrained"]
    description: str
    cfg: TransformerConfig  # the defaults; toggles make a copy
    tokenizer: Tokenizer | None
    # (cfg with the requested sizes, seed, the encoded text) -> weights
    load_params: Callable[[TransformerConfig, int, Encoding], Params] | None
    toggles: tuple[str, ...] = ATTENTION_TOGGLES + SIZE_TOGGLES
    default_seed: int = 0
    default_text: str = ""
    is_encoder: bool = False  # bidirectional, no next-token prediction
    draws_weights: bool = True  # weights are drawn at random per request (counts towards the work)
    error: str | None = None  # why this model cannot run (a broken checkpoint folder)
    # (default cfg, requested sizes, number of tokens) -> the cfg to run
    make_cfg: Callable[[TransformerConfig, dict[str, int], int], TransformerConfig] | None = None

    def configure(self, sizes: dict[str, int], n_tokens: int) -> TransformerConfig:
        """This model's config with the requested sizes (n_heads, n_layers, d_model) applied."""
        if self.make_cfg is not None:
            return self.make_cfg(self.cfg, sizes, n_tokens)
        return self.cfg.replace(**sizes) if sizes else self.cfg


class ParamsCache:
    """A small thread-safe LRU of drawn weights, keyed by (config, seed).

    A lock per key means concurrent first requests for the same model draw it once.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: OrderedDict[tuple, Params] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple, threading.Lock] = {}

    def get(self, key: tuple, make: Callable[[], Params]) -> Params:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._items:
                    return self._items[key]
            value = make()
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.maxsize:
                    self._items.popitem(last=False)
                self._key_locks.pop(key, None)
            return value

    def __len__(self) -> int:
        return len(self._items)


_toy_cache = ParamsCache(PARAMS_CACHE_SIZE)


def _weights_key(cfg: TransformerConfig) -> TransformerConfig:
    """The config that decides the weights: attention toggles and the position scheme do not.

    Drawing always as if positions were learned keeps the random stream identical, so flipping
    the position scheme or the mask changes how the same weights are used, not the weights.
    """
    return cfg.replace(positional_embedding_type="learned", attention_dir="causal",
                       use_attn_scale=True, attn_temperature=1.0)


def _toy_params(cfg: TransformerConfig, seed: int, encoding: Encoding) -> Params:
    key_cfg = _weights_key(cfg)
    return _toy_cache.get((key_cfg, seed), lambda: init_params(key_cfg, seed))


# ------------------------------------------------------------------ spec-forward

class SpecCharTokenizer:
    """The spec's forward-pass vocabulary (" aeiklmns"), adapted to the Tokenizer protocol."""

    def __init__(self, corpus: str):
        self.chars = CharTokenizer.from_text(corpus)

    def encode(self, text: str) -> Encoding:
        return Encoding(self.chars.encode(text), list(text))  # names unknown characters

    def token_str(self, token_id: int) -> str:
        return self.chars.vocab[token_id]


_SPEC = lessons.forward()  # the spec's model with its defaults (tiny: 9 × 16 embeddings)


def _spec_forward_cfg(cfg: TransformerConfig, sizes: dict[str, int], n_tokens: int) -> TransformerConfig:
    # The spec draws a position table of exactly as many rows as the prompt has characters,
    # and keeps d_mlp at 64 whatever the width.
    return cfg.replace(**sizes, n_ctx=n_tokens, d_mlp=cfg.d_mlp)


def _spec_forward_params(cfg: TransformerConfig, seed: int, encoding: Encoding) -> Params:
    """The weights the spec's snippet draws for this prompt length, width and seed."""
    prompt = "".join(encoding.tokens)
    return lessons.forward(prompt=prompt, seed=seed, d_model=cfg.d_model, n_heads=cfg.n_heads,
                           d_mlp=cfg.d_mlp).params


def _built_in() -> dict[str, Model]:
    spec_text = "nasi lemak"  # the spec's corpus: its sorted characters are the vocabulary
    toy_tokenizer = AsciiTokenizer()
    toy_cfg = PRESETS["toy"].replace(d_vocab=len(toy_tokenizer.vocab), n_ctx=1024)
    return {
        "spec-forward": Model(
            name="spec-forward", kind="toy",
            description=("The spec's \"A full forward pass\" model: characters of \"nasi lemak\", one block, "
                         "two heads, d_model 16, ReLU, no biases, scale-free layer norm, random weights "
                         "drawn the spec's way. \"nasi \" gives the spec's next-character probabilities."),
            cfg=_SPEC.cfg, tokenizer=SpecCharTokenizer(spec_text), load_params=_spec_forward_params,
            toggles=ATTENTION_TOGGLES + ("n_heads", "d_model", "seed"),
            default_seed=42, default_text=_SPEC.prompt, make_cfg=_spec_forward_cfg,
        ),
        "toy": Model(
            name="toy", kind="toy",
            description=("A character-level GPT-style decoder with random weights: printable ASCII plus "
                         "[UNK] for any other character, 2 layers of 4 heads, d_model 64, learned positions, "
                         "GELU, pre-norm. Every toggle applies."),
            cfg=toy_cfg, tokenizer=toy_tokenizer, load_params=_toy_params,
            default_seed=0, default_text="Ali makan nasi lemak",
        ),
    }


_MODELS = _built_in()


def models() -> dict[str, Model]:
    """Every model this server knows, runnable or not, by name: the built-ins, then the
    pretrained ones (app/pretrained.py: bundled MiniLM and EXPLORER_MODELS_DIR's folders)."""
    from . import pretrained  # imported here: it builds on Model, defined above

    return _MODELS | pretrained.catalog(get_settings(), frozenset(_MODELS)).models()


def get(name: str) -> Model:
    known = models()
    try:
        return known[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(known)} "
                         f"(GET /api/v1/models lists them)") from None
