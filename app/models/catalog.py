"""The models this server can run, by name: the built-in toys and the pretrained checkpoints.

A `Model` knows its default config, its tokeniser, which toggles it accepts, and how to get
weights for a config. The catalogue is built once, when the app starts (app/main.py's lifespan),
kept on `app.state` and handed to the service (app/deps.py): listing reads config.json files
only, and nothing heavy happens at import. The service checks a request against the limits
*before* asking for weights, because drawing or loading them is the expensive part.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from app.models import knobs, pretrained
from app.models.saes import SAECatalog, open_saes
from app.settings import Settings
from app.training import open_store
from app.training.base import TrainingStore, is_sae_run_id
from core import PRESETS, InputError, TransformerConfig, init_params, lessons, run_with_cache
from core.cache import pattern_hooks
from core.checkpoints import FAMILIES, CheckpointError, CheckpointSpec, read_spec
from core.i18n import N_, _
from core.model import Params
from core.tokenizers import AsciiTokenizer, CharTokenizer, Encoding, Tokenizer

# The run's toggles (app/models/knobs.py): a toy takes every one. Trained weights are what they are:
# only the knobs that change how they attend apply (not their shape, seed or position scheme), and an
# encoder has no causal toggle (it was trained to see both ways).
ALL_TOGGLES = knobs.names()
DECODER_TOGGLES = knobs.names(k for k in knobs.KNOBS if k.trained_weights)
ENCODER_TOGGLES = tuple(t for t in DECODER_TOGGLES if t != "causal")

# How many drawn toy models stay in memory; each is at most settings.max_params floats.
PARAMS_CACHE_SIZE = 4


@dataclass(frozen=True)
class Model:
    name: str
    kind: Literal["toy", "pretrained", "trained"]  # trained: by core.train (shipped with the app, or a run)
    description: str
    cfg: TransformerConfig  # the defaults; toggles make a copy
    tokenizer: Tokenizer | None
    # (cfg with the requested sizes, seed, the encoded text) -> weights
    load_params: Callable[[TransformerConfig, int, Encoding], Params] | None
    toggles: tuple[str, ...] = ALL_TOGGLES
    default_seed: int = 0
    default_text: str = ""
    is_encoder: bool = False  # bidirectional, no next-token prediction
    draws_weights: bool = True  # weights are drawn at random per request (counts towards the work)
    # (default cfg, requested sizes, number of tokens) -> the cfg to run
    make_cfg: Callable[[TransformerConfig, dict[str, int], int], TransformerConfig] | None = None
    loader: pretrained.CheckpointLoader | None = None  # a checkpoint's, whose error can appear after a load
    static_error: str | None = None  # why a folder cannot run, known when it was found
    default_head: tuple[int, int] = (0, 0)  # the (layer, head) the explorer opens on
    # the description in the reader's language (`description` is the API's, in English); None: _(description)
    describe: Callable[[], str] | None = None

    @property
    def config(self) -> TransformerConfig:  # the API's name for it
        return self.cfg

    def described(self) -> str:
        """What the pages say about the model, in the reader's language."""
        if self.describe is not None:
            return self.describe()
        return _(self.description) if self.description else self.description

    @property
    def runnable(self) -> bool:
        return self.error is None

    @property
    def error(self) -> str | None:
        """Why this model cannot run, or None (a checkpoint may only find out when it first loads)."""
        return self.static_error or (self.loader.error if self.loader is not None else None)

    @property
    def reader(self) -> Tokenizer:
        """The tokenizer of a model that runs (a checkpoint that cannot has none: the service refuses it first)."""
        if self.tokenizer is None:
            raise RuntimeError(f"model {self.name!r} has no tokenizer: {self.error}")
        return self.tokenizer

    @property
    def weights(self) -> Callable[[TransformerConfig, int, Encoding], Params]:
        """The loader of the weights of a model that runs (the same: a model that cannot run has none)."""
        if self.load_params is None:
            raise RuntimeError(f"model {self.name!r} has no weights: {self.error}")
        return self.load_params

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


# ------------------------------------------------------------------ the built-in models


def weights_key(cfg: TransformerConfig) -> TransformerConfig:
    """The config that decides a toy's weights: attention toggles and the position scheme do not.

    Drawing always as if positions were learned keeps the random stream identical, so flipping
    the position scheme or the mask changes how the same weights are used, not the weights.
    """
    return cfg.replace(
        positional_embedding_type="learned", attention_dir="causal", use_attn_scale=True, attn_temperature=1.0
    )


class SpecCharTokenizer:
    """The spec's forward-pass vocabulary (" aeiklmns"), adapted to the Tokenizer protocol."""

    def __init__(self, corpus: str):
        self.chars = CharTokenizer.from_text(corpus)

    def encode(self, text: str) -> Encoding:
        return Encoding(self.chars.encode(text), list(text))  # names unknown characters

    def token_str(self, token_id: int) -> str:
        return self.chars.vocab[token_id]


def _spec_forward_cfg(cfg: TransformerConfig, sizes: dict[str, int], n_tokens: int) -> TransformerConfig:
    # The spec draws a position table of exactly as many rows as the prompt has characters,
    # and keeps d_mlp at 64 whatever the width.
    return cfg.replace(**sizes, n_ctx=n_tokens, d_mlp=cfg.d_mlp)


def _spec_forward_params(cfg: TransformerConfig, seed: int, encoding: Encoding) -> Params:
    """The weights the spec's snippet draws for this prompt length, width and seed."""
    prompt = "".join(encoding.tokens)
    return lessons.forward(prompt=prompt, seed=seed, d_model=cfg.d_model, n_heads=cfg.n_heads, d_mlp=cfg.d_mlp).params


def built_in_models(toy_cache: ParamsCache) -> dict[str, Model]:
    spec = lessons.forward()  # the spec's model with its defaults (tiny: 9 × 16 embeddings)
    toy_tokenizer = AsciiTokenizer()
    toy_cfg = PRESETS["toy"].replace(d_vocab=len(toy_tokenizer.vocab), n_ctx=1024)

    def toy_params(cfg: TransformerConfig, seed: int, encoding: Encoding) -> Params:
        key_cfg = weights_key(cfg)
        return toy_cache.get((key_cfg, seed), lambda: init_params(key_cfg, seed))

    return {
        "spec-forward": Model(
            name="spec-forward",
            kind="toy",
            description=N_(
                'The spec\'s "A full forward pass" model: characters of "nasi lemak", one block, '
                "two heads, d_model 16, ReLU, no biases, scale-free layer norm, random weights "
                "drawn the spec's way. \"nasi \" gives the spec's next-character probabilities."
            ),
            cfg=spec.cfg,
            tokenizer=SpecCharTokenizer("".join(spec.vocab)),
            load_params=_spec_forward_params,
            toggles=tuple(t for t in ALL_TOGGLES if t != "n_layers"),  # the spec's model is one block
            default_seed=42,
            default_text=spec.prompt,
            make_cfg=_spec_forward_cfg,
        ),
        "toy": Model(
            name="toy",
            kind="toy",
            description=N_(
                "A character-level GPT-style decoder with random weights: printable ASCII plus "
                "[UNK] for any other character, 2 layers of 4 heads, d_model 64, learned positions, "
                "GELU, pre-norm. Every toggle applies."
            ),
            cfg=toy_cfg,
            tokenizer=toy_tokenizer,
            load_params=toy_params,
            default_seed=0,
            default_text="Ali makan nasi lemak",
        ),
    }


# ------------------------------------------------------------------ pretrained checkpoints as models


def spec_said(spec: CheckpointSpec) -> str:
    """CheckpointSpec.description (the API's, in English) in the reader's language."""
    c = spec.cfg
    heads = (
        _("{n} heads").format(n=c.n_heads)
        if c.n_key_value_heads == c.n_heads
        else _("{n} heads sharing {kv} key/value heads").format(n=c.n_heads, kv=c.n_key_value_heads)
    )
    return _("{family}: {n_layers} layers, {heads}, d_model {d_model}, vocabulary {d_vocab}, context {n_ctx}").format(
        family=_(FAMILIES[spec.family].LABEL),
        n_layers=c.n_layers,
        heads=heads,
        d_model=c.d_model,
        d_vocab=c.d_vocab,
        n_ctx=c.n_ctx,
    )


def _checkpoint_model(name: str, entry: pretrained.CheckpointLoader | pretrained.Broken) -> Model:
    if isinstance(entry, pretrained.Broken):
        return Model(
            name=name,
            kind="pretrained",
            description=N_("cannot run: see error"),
            cfg=entry.cfg,
            tokenizer=None,
            load_params=None,
            toggles=(),
            draws_weights=False,
            static_error=entry.error,
        )
    spec = entry.spec
    recipe = pretrained.trained_recipe(spec)
    if recipe is not None:  # trained by core.train: it says which recipe, so which text suits it
        known = pretrained.TRAINED_ABOUT.get(recipe)
        about_said = (lambda: _(known)) if known else (lambda: _("trained here ({recipe})").format(recipe=recipe))
        about = known or f"trained here ({recipe})"
        return Model(
            name=name,
            kind="trained",
            description=f"{spec.description}; {about}; {entry.origin}",
            cfg=spec.cfg,
            describe=lambda: "; ".join([spec_said(spec), about_said(), entry.origin_said()]),
            tokenizer=pretrained.LazyTokenizer(entry),
            load_params=lambda cfg, seed, encoding: entry.params(),
            toggles=DECODER_TOGGLES,
            default_text=pretrained.TRAINED_DEFAULT_TEXT.get(recipe, "the "),
            is_encoder=False,
            draws_weights=False,
            loader=entry,
            default_head=_clearest_head(entry, recipe),
        )
    return Model(
        name=name,
        kind="pretrained",
        description=f"{spec.description}; {entry.origin}",
        cfg=spec.cfg,
        describe=lambda: "; ".join(part for part in (spec_said(spec), entry.origin_said()) if part),
        tokenizer=pretrained.LazyTokenizer(entry),
        load_params=lambda cfg, seed, encoding: entry.params(),
        toggles=_checkpoint_toggles(spec.cfg, spec.is_encoder),
        default_text=pretrained.DEFAULT_TEXT[spec.family],
        is_encoder=spec.is_encoder,
        draws_weights=False,
        loader=entry,
    )


# The detector whose best head a trained model opens on: what its recipe was made to teach.
OPENING_DETECTOR = {"induction": "induction"}  # any other recipe: "previous_token"


def _clearest_head(entry: pretrained.CheckpointLoader, recipe: str) -> tuple[int, int]:
    """The head the explorer opens a trained model on: on its default text, the head that scores
    highest on what the recipe teaches (the induction model's induction head; elsewhere the clearest
    previous-token head), so a newcomer's first view shows a head that means something (these models
    are tiny: one forward pass of a few dozen tokens at start-up)."""
    try:
        ids = entry.tokenizer().encode(pretrained.TRAINED_DEFAULT_TEXT.get(recipe, "the ")).ids
        _, cache = run_with_cache(
            entry.params(), entry.spec.cfg, ids, names=pattern_hooks(entry.spec.cfg), logits=False
        )
    except InputError:  # it cannot run: the listing says why when it is asked for
        return (0, 0)
    detector = OPENING_DETECTOR.get(recipe, "previous_token")
    scores = np.nan_to_num(cache.head_detector_scores()[detector], nan=-1.0)  # [n_layers, n_heads]
    layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return int(layer), int(head)


def _checkpoint_toggles(cfg: TransformerConfig, is_encoder: bool) -> tuple[str, ...]:
    """An encoder has no causal toggle (it was trained to see both ways), nor has a decoder with
    local attention layers (Mistral's, Qwen2's sliding window, GPT-Neo's local layers): a window of
    the last tokens is only defined under the causal mask."""
    if is_encoder or "local" in (cfg.attn_types or ()):
        return ENCODER_TOGGLES
    return DECODER_TOGGLES


class Catalog(Mapping[str, Model]):
    """Every model this server knows, runnable or not, by name: the built-ins, the pretrained ones
    (the bundled MiniLM and EXPLORER_MODELS_DIR's folders), then the runs trained here that have
    weights (app/training/), which appear as they finish without a restart."""

    def __init__(
        self,
        models: dict[str, Model],
        checkpoints: pretrained.Checkpoints | None = None,
        toy_cache: ParamsCache | None = None,
        training_runs: TrainingStore | None = None,
        saes: SAECatalog | None = None,
    ):
        self._models = models
        self.checkpoints = checkpoints  # the pretrained loaders and their memory budget
        self.toy_cache = toy_cache  # the toys' drawn weights
        self.training_runs = training_runs  # a finished training run is a model named by its id
        self.saes = saes if saes is not None else SAECatalog(None)  # EXPLORER_SAES_DIR's SAEs (app/models/saes.py)
        if self.saes.runs is None:
            self.saes.runs = training_runs  # an sae recipe's run is an SAE there, not a model here
        self._trained: dict[tuple[str, str], Model] = {}  # (run id, its model folder) -> the model
        self._trained_lock = threading.Lock()

    def _run_model(self, id: str) -> Model | None:
        """A run's latest weights as a model (the same Model while its folder stays the same)."""
        runs = self.training_runs
        if is_sae_run_id(id):  # its weights are an SAE (self.saes lists it)
            return None
        folder = runs.model_folder(id) if runs is not None and runs.exists(id) else None
        if folder is None:
            return None
        key = (id, folder.name)
        with self._trained_lock:
            if key not in self._trained:
                budget = self.checkpoints.budget if self.checkpoints else pretrained.MemoryBudget(2**31)
                entry: pretrained.CheckpointLoader | pretrained.Broken
                try:
                    entry = pretrained.CheckpointLoader(
                        id, read_spec(folder), budget, N_("trained here: run {id} (/train?run={id})"), id=id
                    )
                except CheckpointError as e:
                    entry = pretrained.Broken(id, str(e))
                self._trained = {k: v for k, v in self._trained.items() if k[0] != id}  # an older export
                self._trained[key] = _checkpoint_model(id, entry)
            return self._trained[key]

    def __getitem__(self, name: str) -> Model:
        if name in self._models:
            return self._models[name]
        model = self._run_model(name) if self.training_runs is not None else None
        if model is None:
            raise KeyError(name)
        return model

    def __iter__(self) -> Iterator[str]:
        yield from self._models
        if self.training_runs is not None:
            runs = self.training_runs
            yield from (id for id in runs.ids() if not is_sae_run_id(id) and runs.model_folder(id) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def get_model(self, name: str) -> Model:
        """The model called `name`, or an InputError that lists the names there are."""
        try:
            return self[name]
        except KeyError:
            if self.training_runs is not None and self.training_runs.exists(name):
                message = _(
                    "unknown model {name!r} (that run has no weights yet: its model appears once it has "
                    "trained): choose one of {choices} or a trained run (GET /api/v1/models lists them)"
                )
            else:
                message = _(
                    "unknown model {name!r}: choose one of {choices} or a trained run (GET /api/v1/models lists them)"
                )
            raise InputError(message.format(name=name, choices=", ".join(self._models))) from None


def build_catalog(settings: Settings) -> Catalog:
    """The built-ins and the checkpoints these settings point at, found once (config.json only)."""
    toy_cache = ParamsCache(PARAMS_CACHE_SIZE)
    models = built_in_models(toy_cache)
    checkpoints = pretrained.Checkpoints(
        settings.models_dir, settings.pretrained_memory_mb * 2**20, taken=frozenset(models)
    )
    models |= {name: _checkpoint_model(name, entry) for name, entry in checkpoints.entries.items()}
    runs = open_store(settings)  # the runs folder, or Redis with EXPLORER_REDIS_URL (app/training/__init__.py)
    return Catalog(models, checkpoints, toy_cache, runs, open_saes(settings.saes_dir, runs))
