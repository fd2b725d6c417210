"""Training recipes: what a model learns from, its shape, and the defaults that make it learn.

Each recipe is a seeded data generator with a model and the settings that work for it:

  induction   random characters in which a segment of varying length (k in [4, seq_len // 2]) appears
              twice, with random stretches of varying length before, between and after the copies.
              Only looking back for what followed the current token last time predicts the second
              copy: a 2-layer attention-only model learns that (a previous-token head in layer 0, an
              induction head in layer 1; Olsson et al., 2022); its 1-layer control cannot. Fixed
              placements teach shortcuts instead: with the repeat at a fixed offset even one layer
              reaches the minimum loss by attending at that offset, and with the copies always
              ending the sequence a 2-layer model learned to find the first copy by position.
  nasi-lemak  the spec's "A full forward pass" model, starting from the spec's own random weights
              (P('l' | "nasi ") = 0.151), trained on the spec's Malay phrases until 'l' is likely.
  text        a character-level GPT on a text: Python's own documentation by default
              (pydoc_data.topics, in every CPython, no download), or a text of your own.

Settings are one flat, frozen dataclass (TrainSettings) whose names are the API's; `settings(recipe, **changes)` fills
in the recipe's defaults and refuses a bad combination with an InputError that says what to change; `make_recipe`
builds the recipe: its tokenizer vocabulary, model config, initial weights, training and held-out batches, probe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, get_type_hints

import numpy as np

from .config import TransformerConfig
from .errors import InputError
from .i18n import N_, _
from .model import Params, init_params, iter_arrays
from .sae_train import JUMPRELU_FIELDS, JUMPRELU_SETTINGS, MAX_D_SAE, MAX_L1, MAX_SAE_K, SAE_KINDS

UNK = "[UNK]"  # id 0 of the character vocabularies that have one: any character they do not know

# Limits on what one run may ask for (the API states them; a run beyond them is refused).
MAX_STEPS = 100_000
MAX_BATCH = 512
MAX_SEQ_LEN = 256
MAX_D_MODEL = 512
MAX_LAYERS = 8
MAX_HEADS = 16
TEXT_MAX_CHARS = 1_000_000  # a text of your own: about a megabyte (the default corpus is ~465,000)
TEXT_MAX_VOCAB = 256  # distinct characters a text may hold (each becomes a row of the token table)
DTYPES = ("float32", "float64")
SAE_FIELDS = ("model", "hook", "architecture", "d_sae", "k", "l1_coefficient", *JUMPRELU_FIELDS)  # core/sae_run.py
DIGEST = "model_sha256"  # sae on a model run: its weights' digest, from them (never a request's); a card omits null

# induction: 31 characters and [UNK] (id 0) make the recipe's 32-token vocabulary. Lower-case letters, space and the
# commonest punctuation, so a learner's sentence ("Ali makan nasi lemak.", lower-cased) runs on the trained model.
INDUCTION_ALPHABET = " abcdefghijklmnopqrstuvwxyz.,!?"
MIN_REPEAT = 4  # the shortest repeated segment

# nasi-lemak: the spec's vocabulary (the sorted characters of "nasi lemak") and its phrases made of
# them. The spec's "nasi makan Ali" (its example that attention ignores word order) is left out: it
# is the one phrase where "nasi " is not followed by "lemak".
NASI_LEMAK_TEXT = "nasi lemak"
NASI_LEMAK_PHRASES = ("ali makan nasi lemak", "makan nasi lemak", "nasi lemak")
NASI_LEMAK_PROMPT, NASI_LEMAK_TARGET = "nasi ", "l"


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str | None = None,
    label: str | None = None,
    hint: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[str, ...] = (),
    api: bool = True,
    cli: bool = True,
) -> Any:
    """A TrainSettings field with what the faces need to offer it, so that each setting is declared once,
    here: `help`, its description (the API's, `python -m core.train --help`'s); `label` (and `hint`), the
    training page's control, if it has one; `ge`/`gt`/`le`, the bounds a request may ask within (the
    API's, the form's; `check` refuses what cannot run); `api=False`: not the API's (the command line's
    only); `cli=False`: not an option of the command line. app/api/requests.py (TrainRequest),
    app/pages/train.py (the form) and `core.train.main` (its options) derive from them."""
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le)) if v is not None}
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "label": label,
            "hint": hint,
            "bounds": bounds,
            "choices": choices,
            "api": api,
            "cli": cli,
        },
    )


@dataclass(frozen=True)
class TrainSettings:
    """Everything that decides a run: same settings, same numbers, bit for bit with the same NumPy, BLAS
    kernel and one BLAS thread; on another CPU, the same within bounds (core/train.py says which).

    Every field but the recipe is a `setting`: the API, the training page and the command line offer
    them in this order."""

    recipe: str
    steps: int = setting(help="optimiser steps", label=N_("Steps"), ge=1, le=MAX_STEPS)
    # initial weights, data order, held-out data and probe all derive from the seed
    seed: int = setting(0, help="weights, data order and probe derive from it", label=N_("Seed"), ge=0, le=2**32 - 1)
    n_layers: int = setting(2, label=N_("Layers"), ge=1, le=MAX_LAYERS)
    n_heads: int = setting(4, help="must divide d_model", label=N_("Heads"), ge=1, le=MAX_HEADS)
    d_model: int = setting(64, label=N_("Width d_model"), ge=1, le=MAX_D_MODEL)
    d_mlp: int | None = setting(None, help="default 4 × d_model", ge=1, le=4 * MAX_D_MODEL)
    attn_only: bool = setting(
        False,
        help="blocks without an MLP (the induction recipe's default)",
        label=N_("Attention only"),
        hint=N_("(no MLP: the classic setting for induction heads)"),
    )
    lr: float = setting(3e-3, help="peak learning rate (AdamW)", label=N_("Learning rate"), gt=0, le=1)
    min_lr: float | None = setting(None, help="the cosine decay's floor", api=False)  # None: lr / 10
    batch_size: int = setting(32, help="sequences per step", label=N_("Batch"), ge=1, le=MAX_BATCH)
    # tokens per sequence: the model's context, n_ctx
    seq_len: int = setting(
        32, help="tokens per sequence (the context)", label=N_("Context (tokens)"), ge=2, le=MAX_SEQ_LEN
    )
    warmup: int = setting(0, help="steps of linear warm-up", ge=0, le=MAX_STEPS)
    weight_decay: float = setting(0.01, ge=0, le=1)  # AdamW's decoupled decay, on matrices only
    # clip the gradient's global norm to this
    grad_clip: float = setting(1.0, help="0: no clipping", ge=0, le=1000)
    eval_interval: int = setting(50, help="steps between records", ge=1, le=MAX_STEPS)
    # None: every 5 records
    snapshot_interval: int | None = setting(None, help="steps between attention-pattern snapshots", api=False)
    # the text recipe's corpus; None: Python's documentation (the command line reads it from --text-file)
    text: str | None = setting(None, help="the text recipe's corpus; null: Python's documentation", cli=False)
    dtype: str = setting("float32", choices=DTYPES, api=False)
    # the text recipe: the share of training sequences in which a passage comes again further on, as a text
    # quoting itself (what teaches an induction head on natural text: core/trained/python-docs-induction)
    repeats: float = setting(
        0.0,
        help="text recipe: the share of training sequences that repeat a passage of "
        "themselves further on (0: the text as it is)",
        ge=0,
        le=1,
        api=False,
    )
    # the sae recipe (core/sae_run.py): a sparse autoencoder on one hook of a model trained here; null elsewhere
    model: str | None = setting(None, help="sae: the model it reads: a shipped one, or a model run's id", cli=False)
    hook: str | None = setting(None, help="sae: the hook it reads, e.g. blocks.0.hook_resid_post", cli=False)
    architecture: str | None = setting(None, help="sae: standard (L1), topk or jumprelu", choices=SAE_KINDS, cli=False)
    d_sae: int | None = setting(None, help="sae: its features", label=N_("Features"), ge=1, le=MAX_D_SAE, cli=False)
    k: int | None = setting(None, help="sae, topk: features a token", label=N_("k"), ge=1, le=MAX_SAE_K, cli=False)
    l1_coefficient: float | None = setting(None, help="sae: L1 weight", label=N_("L1"), ge=0, le=MAX_L1, cli=False)
    model_sha256: str | None = setting(None, help="sae: its model run's weights' SHA-256", api=False, cli=False)
    l0_coefficient: float | None = setting(None, cli=False, **JUMPRELU_SETTINGS["l0_coefficient"])
    jumprelu_init_threshold: float | None = setting(None, cli=False, **JUMPRELU_SETTINGS["jumprelu_init_threshold"])
    jumprelu_bandwidth: float | None = setting(None, cli=False, **JUMPRELU_SETTINGS["jumprelu_bandwidth"])

    def replace(self, **changes) -> TrainSettings:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.text is not None:  # a whole corpus is not a setting to print: its size and hash stand for it
            d["text"] = f"<{len(self.text):,} characters, sha256 {text_hash(self.text)[:16]}>"
        if not d["repeats"]:  # the text as it is: a card says so as it did before the setting existed
            del d["repeats"]
        d = {k: v for k, v in d.items() if k not in JUMPRELU_FIELDS or v is not None}  # unset: as before jumprelu
        return {k: v for k, v in d.items() if (k not in SAE_FIELDS or self.recipe == "sae") and (v or k != DIGEST)}

    @property
    def final_lr(self) -> float:
        return self.lr / 10 if self.min_lr is None else self.min_lr

    @property
    def snapshot_every(self) -> int:
        return self.snapshot_interval or 5 * self.eval_interval


def setting_fields(*, api: bool | None = None, cli: bool | None = None) -> list[dataclasses.Field]:
    """TrainSettings' settings (every field but the recipe), in order; only the API's (or the command
    line's) with api=True (cli=True)."""
    return [
        f
        for f in dataclasses.fields(TrainSettings)
        if f.metadata and (api is None or f.metadata["api"] == api) and (cli is None or f.metadata["cli"] == cli)
    ]


def setting_type(f: dataclasses.Field) -> type:
    """A setting's type, without its None: int for `int | None`."""
    hint = get_type_hints(TrainSettings)[f.name]
    return next((t for t in getattr(hint, "__args__", (hint,)) if t is not type(None)), hint)


DEFAULTS: dict[str, dict] = {  # each recipe's working defaults (changes on top of TrainSettings' own)
    # A setting in which PyTorch training was measured to form an induction head, so the two trainers are compared on
    # it (bench/training.py): 2-layer 4-head d_model 64 attention-only, batch 32, AdamW at a constant 3e-3.
    "induction": dict(
        steps=1000,
        batch_size=32,
        seq_len=32,
        n_layers=2,
        n_heads=4,
        d_model=64,
        attn_only=True,
        lr=3e-3,
        min_lr=3e-3,
        warmup=0,
        eval_interval=50,
    ),
    # The spec's forward-pass model: its shape is fixed (see NasiLemak.FIXED).
    "nasi-lemak": dict(
        steps=300,
        batch_size=16,
        seq_len=16,
        n_layers=1,
        n_heads=2,
        d_model=16,
        d_mlp=64,
        lr=1e-2,
        warmup=10,
        eval_interval=20,
    ),
    "text": dict(
        steps=3000,
        batch_size=32,
        seq_len=128,
        n_layers=2,
        n_heads=4,
        d_model=96,
        lr=3e-3,
        warmup=100,
        eval_interval=100,
    ),
}


def model_settings(recipe: str, **changes) -> TrainSettings:
    """A model recipe's defaults with `changes` applied (None values are ignored), checked by its rules. The
    names are checked first by core.run_settings.settings, every recipe's entry: call that."""
    given = {k: v for k, v in changes.items() if v is not None}
    values = DEFAULTS[recipe] | given
    steps = values["steps"]
    if isinstance(steps, int) and steps >= 1:  # defaults that count steps shrink with a shorter run
        if "warmup" not in given:
            values["warmup"] = min(values.get("warmup", 0), steps // 10)
        if "eval_interval" not in given:
            values["eval_interval"] = min(values["eval_interval"], steps)
    s = TrainSettings(recipe=recipe, **values)
    make_recipe(s)  # builds and so checks everything, the recipe's own rules included
    return s


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------- checks


def _integer(name: str, value, low: int, high: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise InputError(
            _("{name}={value!r} must be an integer from {low:,} to {high:,}{hint}").format(
                name=name, value=value, low=low, high=high, hint=hint
            )
        )


def _number(name: str, value, low: float, high: float, hint: str = "") -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InputError(
            _("{name}={value!r} must be a number from {low:g} to {high:g}{hint}").format(
                name=name, value=value, low=low, high=high, hint=hint
            )
        )


def check(s: TrainSettings) -> None:
    """The checks every recipe shares; each recipe adds its own in its constructor."""
    _integer("steps", s.steps, 1, MAX_STEPS, _(": a run takes at least one step"))
    _integer("seed", s.seed, 0, 2**32 - 1)
    _integer("batch_size", s.batch_size, 1, MAX_BATCH)
    _integer("seq_len", s.seq_len, 2, MAX_SEQ_LEN)
    _integer("n_layers", s.n_layers, 1, MAX_LAYERS)
    _integer("n_heads", s.n_heads, 1, MAX_HEADS)
    _integer("d_model", s.d_model, 1, MAX_D_MODEL)
    if s.d_model % s.n_heads:
        nearest = s.n_heads * max(1, round(s.d_model / s.n_heads))
        raise InputError(
            _(
                "d_model={d_model} is not divisible by n_heads={n_heads}: choose a width "
                "that is a multiple of the number of heads (e.g. d_model={nearest})"
            ).format(d_model=s.d_model, n_heads=s.n_heads, nearest=nearest)
        )
    if s.d_mlp is not None:
        _integer("d_mlp", s.d_mlp, 1, 4 * MAX_D_MODEL)
    if not isinstance(s.attn_only, bool):
        raise InputError(_("attn_only must be true or false, got {attn_only!r}").format(attn_only=s.attn_only))
    _number("lr", s.lr, 1e-6, 1.0, _(" (a learning rate; 1e-3 to 1e-2 suit these small models)"))
    _number("min_lr", s.final_lr, 0.0, s.lr, _(" (the floor of the decay: at most lr={lr:g})").format(lr=s.lr))
    _integer("warmup", s.warmup, 0, s.steps - 1, _(" (warm-up steps, fewer than steps={steps})").format(steps=s.steps))
    _number("weight_decay", s.weight_decay, 0.0, 1.0)
    _number("grad_clip", s.grad_clip, 0.0, 1e6, _(" (0 turns clipping off)"))
    _integer(
        "eval_interval",
        s.eval_interval,
        1,
        s.steps,
        _(" (steps between records, at most steps={steps})").format(steps=s.steps),
    )
    if s.snapshot_interval is not None:
        _integer("snapshot_interval", s.snapshot_interval, 1, MAX_STEPS)
    if s.dtype not in DTYPES:
        raise InputError(_("dtype={dtype!r} is not one of {choices}").format(dtype=s.dtype, choices=", ".join(DTYPES)))
    if s.text is not None and s.recipe not in ("text", "sae"):
        raise InputError(
            _("a text is what the text recipe trains on; the {recipe} recipe makes its own data").format(
                recipe=s.recipe
            )
        )
    _number("repeats", s.repeats, 0.0, 1.0, " (a share of the training sequences)")
    if s.recipe != "sae" and (sae := [name for name in (*SAE_FIELDS, DIGEST) if getattr(s, name) is not None]):
        raise InputError(_("{name} is a setting of the sae recipe only (a sparse autoencoder)").format(name=sae[0]))
    if s.repeats and s.recipe != "text":
        raise InputError(
            _("repeats mixes repeated passages into the text recipe's data; the {recipe} recipe makes its own").format(
                recipe=s.recipe
            )
        )


# ---------------------------------------------------------------------------- recipes


def training_init(cfg: TransformerConfig, seed: int, dtype=np.float32) -> Params:
    """Initial weights for training, PyTorch's defaults: token and position tables N(0, 1) (nn.Embedding),
    matrices U(−1/√fan_in, 1/√fan_in) (nn.Linear), layer norms gain 1 and bias 0.

    Measured on the induction recipe: with tables this large beside the attention's outputs, the
    2-layer model leaves the ln 32 plateau after about 500 steps; with core.model.init_params' N(0, 1/d)
    tables (and a tied unembedding) it found shortcuts and no induction head in 2,000 steps.
    """
    params = init_params(cfg, seed, dtype=np.float64)  # the structure (and zero biases, unit gains)
    rng = np.random.default_rng(seed)
    for name, a in iter_arrays(params):
        if name in ("embed.W_E", "pos_embed.W_pos"):
            a[...] = rng.standard_normal(a.shape)
        elif a.ndim == 2:  # [fan_in, fan_out]
            a[...] = rng.uniform(-1.0, 1.0, a.shape) / np.sqrt(a.shape[0])
    return _cast(params, dtype)


def _streams(seed: int) -> dict[str, np.random.Generator]:
    """Independent random streams from one seed: drawing more of one never shifts another."""
    names = ("data", "held_out", "probe")
    return dict(zip(names, (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(names)))))


class Recipe:
    """What every recipe provides; subclasses fill in the data."""

    name: str
    vocab: tuple[str, ...]  # token id -> the character (or [UNK]) it stands for
    lowercase: bool = False  # the tokenizer lower-cases text before looking characters up
    target_name: str | None = None  # what `target` measures, in words
    n_held_out_batches = 4

    def __init__(self, s: TrainSettings):
        check(s)
        self.settings = s
        self.dtype = np.dtype(s.dtype)
        streams = _streams(s.seed)
        self.data_rng = streams["data"]  # the only stream training advances: its state is in a snapshot
        self._held_out_rng, self._probe_rng = streams["held_out"], streams["probe"]

    @cached_property
    def cfg(self) -> TransformerConfig:
        """GPT-2's layout (pre-norm, learned positions, GELU), with an untied unembedding and no biases
        on the linear maps (nanoGPT's bias=False; GPT-2's format has no unembedding bias to hold one)."""
        s = self.settings
        return TransformerConfig(
            d_model=s.d_model,
            n_layers=s.n_layers,
            n_heads=s.n_heads,
            d_vocab=len(self.vocab),
            n_ctx=s.seq_len,
            d_mlp=s.d_mlp,  # type: ignore[arg-type]  # None: the config's own default, resolved when it is made
            attn_only=s.attn_only,
            tied_embeddings=False,
            bias=False,
        )

    def init_params(self) -> Params:
        return training_init(self.cfg, self.settings.seed, self.dtype)

    def batch(self, rng: np.random.Generator) -> np.ndarray:
        """One batch of sequences, seq_len + 1 tokens each: inputs are [:, :-1], targets [:, 1:].
        # -> [batch, seq_len + 1]"""
        raise NotImplementedError

    @cached_property
    def held_out(self) -> np.ndarray:
        """Fixed held-out sequences, the same at every evaluation.  # [n_held_out_batches * batch, seq_len + 1]"""
        return np.concatenate([self.batch(self._held_out_rng) for _ in range(self.n_held_out_batches)])

    n_probes = 8

    @cached_property
    def probe(self) -> np.ndarray:
        """Fixed sequences on which head scores and attention patterns are measured: random characters
        ending in a random segment repeated (the second copy can only be predicted by induction).
        The segment's length runs from half the probe (the first probe: two equal halves, the
        clearest picture) down to MIN_REPEAT, so a head that merely attends at a fixed distance back
        (which a 1-layer model learns) cannot score as an induction head.  # [n_probes, pos]"""
        n = min(self.settings.seq_len, 64)
        rows = []
        for k in np.linspace(n // 2, min(MIN_REPEAT, n // 2), self.n_probes).round().astype(int):
            ids = self._probe_rng.integers(self.first_character_id, len(self.vocab), size=n - k)
            rows.append(np.concatenate([ids, ids[n - 2 * k :]]))
        return np.stack(rows)

    @property
    def first_character_id(self) -> int:
        return 1 if self.vocab[0] == UNK else 0

    def target(self, logits_of) -> float | None:
        """The recipe's target probability, if it has one; logits_of(tokens [pos]) -> logits [pos, d_vocab]."""
        return None

    def sample_prompt(self) -> np.ndarray:
        """Token ids a sample continues."""
        return self.probe[0, : self.probe.shape[1] // 2 + 4]

    sample_greedy = True  # pick the likeliest token (False: sample from the probabilities)

    def encode(self, text: str) -> np.ndarray:
        text = text.lower() if self.lowercase else text
        stoi = {c: i for i, c in enumerate(self.vocab)}
        unk = stoi.get(UNK)
        unknown = sorted({c for c in text if c not in stoi})
        if unknown and unk is None:
            raise InputError(
                _("characters {unknown!r} are not in the vocabulary {vocab!r}").format(
                    unknown="".join(unknown), vocab="".join(self.vocab)
                )
            )
        return np.array([stoi.get(c, unk) for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


class Induction(Recipe):
    name = "induction"
    vocab = (UNK, *INDUCTION_ALPHABET)
    lowercase = True
    target_name = "P(copy): the probability given to the right token on the probe's repeated half"

    def __init__(self, s: TrainSettings):
        super().__init__(s)
        if s.seq_len < 2 * MIN_REPEAT:
            raise InputError(
                _(
                    "seq_len={seq_len} cannot hold a segment of {n} tokens twice: use seq_len of at least {least}"
                ).format(seq_len=s.seq_len, n=MIN_REPEAT, least=2 * MIN_REPEAT)
            )

    def batch(self, rng: np.random.Generator) -> np.ndarray:
        """Random tokens in which a segment of length k appears twice, with random tokens before, between
        and after the copies; k and the three gaps vary from row to row."""
        B, n = self.settings.batch_size, self.settings.seq_len + 1
        k = rng.integers(MIN_REPEAT, self.settings.seq_len // 2 + 1, size=(B, 1))  # [batch, 1]
        free = n - 2 * k  # random tokens outside the two copies
        before = rng.integers(0, free + 1)  # [batch, 1]
        between = rng.integers(0, free - before + 1)
        first, second = before, before + k + between  # where each copy starts
        tokens = rng.integers(0, len(self.vocab), size=(B, n))
        pos = np.arange(n)[None, :]
        in_copy = (pos >= second) & (pos < second + k)
        source = np.where(in_copy, pos - (second - first), pos)  # the second copy reads the first
        return np.take_along_axis(tokens, source, axis=1)

    def target(self, logits_of) -> float:
        """Mean probability of the right token over the first probe's second half, after its first token."""
        seq = self.probe[0]
        half = len(seq) // 2
        logits = logits_of(seq)[half:-1]  # the predictions of tokens half + 1 .. end: the copy's
        z = np.exp(logits - logits.max(-1, keepdims=True))
        return float(np.mean((z / z.sum(-1, keepdims=True))[np.arange(len(logits)), seq[half + 1 :]]))

    def control(self) -> TrainSettings:
        """The 1-layer control: the same run with one layer, which cannot form an induction head."""
        return self.settings.replace(n_layers=1)


class NasiLemak(Recipe):
    name = "nasi-lemak"
    vocab = tuple(sorted(set(NASI_LEMAK_TEXT)))  # " aeiklmns", the spec's nine characters
    target_name = f"P({NASI_LEMAK_TARGET!r} | {NASI_LEMAK_PROMPT!r})"
    FIXED = dict(n_layers=1, n_heads=2, d_model=16, d_mlp=64, attn_only=False)  # the spec's shape

    def __init__(self, s: TrainSettings):
        super().__init__(s)
        changed = {k: getattr(s, k) for k, v in self.FIXED.items() if getattr(s, k) != v}
        if changed:
            raise InputError(
                _("nasi-lemak trains the spec's own model, whose shape is fixed ({shape}): leave out {changed}").format(
                    shape=", ".join(f"{k}={v}" for k, v in self.FIXED.items()), changed=", ".join(changed)
                )
            )
        if s.seq_len < len(NASI_LEMAK_PROMPT) + 1:
            raise InputError(
                _(
                    "seq_len={seq_len} cannot hold {prompt!r} and the letter after it: use seq_len of at least {least}"
                ).format(seq_len=s.seq_len, prompt=NASI_LEMAK_PROMPT, least=len(NASI_LEMAK_PROMPT) + 1)
            )

    @cached_property
    def cfg(self) -> TransformerConfig:
        """The spec's snippet as a config: scale-free layer norms, no biases, ReLU, tied unembedding."""
        return TransformerConfig(
            d_model=16,
            n_layers=1,
            n_heads=2,
            d_vocab=len(self.vocab),
            n_ctx=self.settings.seq_len,
            d_mlp=64,
            act_fn="relu",
            normalization_type="LNPre",
            bias=False,
        )

    def init_params(self) -> Params:
        """The spec's random weights, drawn in the spec's order from its seed (42), so the untrained
        model gives the spec's printed probabilities; position rows past the spec's five come last."""
        rng = np.random.default_rng(42)

        def P(*shape: int) -> np.ndarray:  # the spec's P
            return rng.standard_normal(shape) * 0.1

        V, T, d, d_ff = len(self.vocab), len(NASI_LEMAK_PROMPT), 16, 64
        tok_emb, pos_emb = P(V, d), P(T, d)
        W_qkv, W_o, W_1, W_2 = P(d, 3 * d), P(d, d), P(d, d_ff), P(d_ff, d)
        pos_emb = np.concatenate([pos_emb, P(self.settings.seq_len - T, d)])
        params = {
            "embed": {"W_E": tok_emb},
            "pos_embed": {"W_pos": pos_emb},
            "blocks": [
                {"ln1": {}, "attn": {"W_QKV": W_qkv, "W_O": W_o}, "ln2": {}, "mlp": {"W_in": W_1, "W_out": W_2}}
            ],
            "ln_final": {},
        }
        return _cast(params, self.dtype)

    def batch(self, rng: np.random.Generator) -> np.ndarray:
        """Phrases in random order, joined by spaces; every sequence starts at a phrase."""
        n = self.settings.seq_len + 1
        rows = []
        for _row in range(self.settings.batch_size):
            text = ""
            while len(text) < n:
                text += NASI_LEMAK_PHRASES[rng.integers(len(NASI_LEMAK_PHRASES))] + " "
            rows.append(self.encode(text[:n]))
        return np.stack(rows)

    @cached_property
    def probe(self) -> np.ndarray:
        text = " ".join([NASI_LEMAK_PHRASES[0]] * 3)[: self.settings.seq_len]
        return self.encode(text)[None, :]

    def target(self, logits_of) -> float:
        logits = logits_of(self.encode(NASI_LEMAK_PROMPT))[-1]
        z = np.exp(logits - logits.max())
        return float(z[self.vocab.index(NASI_LEMAK_TARGET)] / z.sum())

    def sample_prompt(self) -> np.ndarray:
        return self.encode(NASI_LEMAK_PROMPT)


def python_docs() -> str:
    """Python's documentation as the standard library ships it (pydoc's topics), topic by topic."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


class Text(Recipe):
    name = "text"
    sample_greedy = False
    held_out_fraction = 0.1  # the text's last tenth is never trained on

    def __init__(self, s: TrainSettings):
        super().__init__(s)
        text = python_docs() if s.text is None else s.text
        if not isinstance(text, str):
            raise InputError(_("text must be a string"))
        if len(text) > TEXT_MAX_CHARS:
            raise InputError(
                _("the text has {n:,} characters; at most {most:,} are accepted: shorten it").format(
                    n=len(text), most=TEXT_MAX_CHARS
                )
            )
        chars = sorted(set(text))
        if len(chars) > TEXT_MAX_VOCAB:
            raise InputError(
                _(
                    "the text has {n:,} distinct characters; a character model here holds at most "
                    "{most}: use a text in fewer scripts or symbols"
                ).format(n=len(chars), most=TEXT_MAX_VOCAB)
            )
        need = math.ceil((s.seq_len + 1) / self.held_out_fraction)
        if len(text) < need:
            raise InputError(
                _(
                    "the text has {n:,} characters; with seq_len={seq_len} it needs at least {need:,} (a "
                    "tenth is held out and must hold one sequence): lengthen it or lower seq_len"
                ).format(n=len(text), seq_len=s.seq_len, need=need)
            )
        self.text = text
        self.vocab = (UNK, *chars)
        ids = self.encode(text)
        split = len(ids) - int(len(ids) * self.held_out_fraction)
        self.train_ids, self.held_out_ids = ids[:split], ids[split:]

    def _windows(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = self.settings.seq_len + 1
        starts = rng.integers(0, len(ids) - n + 1, size=(self.settings.batch_size, 1))
        return ids[starts + np.arange(n)]

    def batch(self, rng: np.random.Generator) -> np.ndarray:
        """Random windows of the text (its first nine tenths); with `repeats`, that share of them has a passage
        (k in [MIN_REPEAT, seq_len // 2] characters) copied over a later stretch of the same window."""
        rows = self._windows(self.train_ids, rng)
        if not self.settings.repeats:
            return rows  # and the data stream is drawn exactly as without the setting
        B, n = rows.shape
        k = rng.integers(MIN_REPEAT, n // 2 + 1, size=(B, 1))
        second = rng.integers(k, n - k + 1)  # where the copy starts
        first = rng.integers(0, second - k + 1)  # where the passage it copies starts, before it
        chosen = rng.random((B, 1)) < self.settings.repeats
        pos = np.arange(n)[None, :]
        in_copy = chosen & (pos >= second) & (pos < second + k)
        return np.take_along_axis(rows, np.where(in_copy, pos - (second - first), pos), axis=1)

    @cached_property
    def held_out(self) -> np.ndarray:
        return np.concatenate(
            [self._windows(self.held_out_ids, self._held_out_rng) for _ in range(self.n_held_out_batches)]
        )

    def sample_prompt(self) -> np.ndarray:
        return self.held_out_ids[:16]


RECIPES: dict[str, type[Recipe]] = {"induction": Induction, "nasi-lemak": NasiLemak, "text": Text}


def probe_tokens(s: TrainSettings) -> list[str]:
    """The first probe sequence's tokens (the one whose attention patterns a run records), as characters."""
    recipe = make_recipe(s)
    return [recipe.vocab[int(i)] for i in recipe.probe[0]]


def make_recipe(s: TrainSettings) -> Recipe:
    if s.recipe not in RECIPES:
        raise InputError(
            _("recipe {recipe!r} is not one of {choices}").format(recipe=s.recipe, choices=", ".join(RECIPES))
        )
    return RECIPES[s.recipe](s)


def _cast(params, dtype):
    if isinstance(params, list):
        return [_cast(p, dtype) for p in params]
    if isinstance(params, np.ndarray):
        return params.astype(dtype)
    return {k: _cast(v, dtype) for k, v in params.items()}
