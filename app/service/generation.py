"""Writing with a model (/generate and POST /api/v1/generate): a text continued token by token through
the KV cache (core/generate.py), each token drawn with the chosen temperature, top-k and top-p
(core/sampling.py), and every step told the way the faces show it: its distribution before and after
each setting (the top TOP_N, the cut-off marked), where every head looked, the cache's bytes and the
attention-sink heads.

`start` checks everything and prices the whole generation before computing anything (the prompt read
once, then one single-token pass per new token over all the keys so far), loads the weights, and
returns a `GenerationRun`: iterating it computes one step at a time, so a page can stream the steps
and stop when the reader presses Stop. `generate` runs one to the end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.models.catalog import Model
from app.service import capabilities
from app.service.results import ModelResult
from app.service.spec import Prepared, RunSpec, Setup
from app.service.steering import SteeringViews
from app.service.views import ModelViews
from core import InputError, Sampling, TransformerConfig
from core.generate import SINK_THRESHOLD, GenerationStep, check_generation, generate, generate_steered
from core.i18n import _
from core.params import forward_work
from core.steering import Steer

TOP_N = 20  # the candidates a step lists (and the drawn token, wherever it ranks)
FINISH_REASONS = ("length", "stop")


@dataclass(frozen=True)
class GenerateSettings:
    """How much to write and how each token is chosen (core.Sampling's fields, the sampler's seed and a stop)."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0
    stop: str | None = None  # a string that ends the generation once the new text contains it
    repetition_penalty: float = 1.0

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, self.top_p, self.repetition_penalty)


@dataclass(frozen=True)
class Candidate:
    """One of a step's most likely tokens, with its probability after each stage."""

    token: str
    id: int
    rank: int  # 0 = most likely (in the ranking the cuts use)
    prob_before: float  # the model's own probability
    prob_after: float  # in the distribution the token was drawn from (0: cut away)
    probs: list[float]  # after each of the step's stages
    kept: bool
    cut_by: str | None  # the stage that cut it away


@dataclass(frozen=True)
class SinkHead:
    layer: int
    head: int
    weight: float  # its weight on the first token


@dataclass(frozen=True)
class GeneratedStep:
    index: int
    token: str
    id: int
    prob: float  # the model's own probability of the token
    prob_after: float  # its probability in the distribution it was drawn from
    u: float | None  # the uniform number the draw used (None: greedy)
    stages: list[str]
    top: list[Candidate]
    kept_count: int  # tokens that could be drawn
    kept_mass: float  # the model's probability of those tokens
    attention: np.ndarray  # [n_layers, n_heads, n_keys]
    sink_heads: list[SinkHead]
    cache_bytes: int
    stop: bool  # this token ended the generation (end-of-text, or the stop string is complete)


@dataclass(frozen=True)
class GeneratedText:
    text: str  # decoded as the tokenizer decodes (real spaces and bytes)
    ids: list[int]
    tokens: list[str]  # each as the pages show a token (whitespace made visible)


@dataclass(frozen=True)
class Generation(ModelResult):
    settings: GenerateSettings
    generated: GeneratedText
    steps: list[GeneratedStep]
    finish_reason: str  # "length" | "stop"
    stop_ids: list[int]
    sink_threshold: float = SINK_THRESHOLD

    @property
    def seed(self) -> int:
        """The sampler's seed (a generation takes no weights' seed: a toy's weights are its default's)."""
        return self.settings.seed

    @property
    def kv_heads(self) -> list[int]:
        return kv_heads(self.config)


def kv_heads(cfg: TransformerConfig) -> list[int]:
    """The key/value head each query head reads (itself, unless grouped-query attention shares them)."""
    return [h // cfg.group_size for h in range(cfg.n_heads)]


@functools.lru_cache(maxsize=8)
def _hf_tokenizer(path: Path, mtime: float):
    from tokenizers import Tokenizer  # the checkpoint's own tokenizer.json, which decodes bytes and spaces

    return Tokenizer.from_file(str(path))


def text_decoder(model: Model) -> Callable[[list[int]], str]:
    """ids -> the text they stand for: a checkpoint's tokenizer.json decodes (bytes joined into characters,
    spaces restored); a built-in toy's tokens are characters."""
    if model.loader is not None:
        path = model.loader.spec.path / "tokenizer.json"
        tok = _hf_tokenizer(path, path.stat().st_mtime)
        return lambda ids: tok.decode(ids, skip_special_tokens=False)
    return lambda ids: "".join(model.reader.token_str(i) for i in ids)


def end_of_text(model: Model) -> list[int]:
    """The model's end-of-text ids (config.json's eos_token_id), where it has one."""
    if model.loader is None:
        return []
    eos = model.loader.spec.raw_config.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    return [int(i) for i in ids if isinstance(i, int) and 0 <= i < model.cfg.d_vocab]


class GenerationRun:
    """One generation, checked, priced and loaded: iterate for its steps (each computed when asked for);
    `finish_reason` and `result()` once it is over."""

    def __init__(
        self,
        prepared: Prepared,
        settings: GenerateSettings,
        sampling: Sampling,
        stop_ids: list[int],
        decode: Callable[[list[int]], str],
        steers: list[Steer] | None = None,
        frozen_attention: bool = False,
    ):
        self.prepared, self.settings, self.sampling = prepared, settings, sampling
        self.stop_ids, self.decode = stop_ids, decode
        self.steers, self.frozen_attention = steers, frozen_attention
        self.steps: list[GeneratedStep] = []
        self.finish_reason: str | None = None

    def __iter__(self) -> Iterator[GeneratedStep]:
        p, s = self.prepared, self.settings
        core_steps = (
            generate_steered(
                p.params,
                p.cfg,
                p.ids,
                s.max_new_tokens,
                self.steers,
                self.sampling,
                frozen_attention=self.frozen_attention,
                seed=s.seed,
                stop_ids=self.stop_ids,
            )
            if self.steers
            else generate(p.params, p.cfg, p.ids, s.max_new_tokens, self.sampling, seed=s.seed, stop_ids=self.stop_ids)
        )
        self.finish_reason = "length"
        for raw in core_steps:
            ids = [*(step.id for step in self.steps), raw.token]
            stop_string = bool(s.stop and s.stop in self.decode(ids))
            step = self._told(raw, stop=raw.stopped or stop_string)
            self.steps.append(step)
            yield step
            if step.stop:
                self.finish_reason = "stop"
                return

    def _told(self, raw: GenerationStep, stop: bool) -> GeneratedStep:
        """A core step as the faces show it: tokens as strings, the top TOP_N, the sink heads."""
        p, w = self.prepared, raw.warped
        candidates = [
            Candidate(p.token_str(r.id), r.id, r.rank, r.probs[0], r.probs[-1], list(r.probs), r.kept, r.cut_by)
            for r in w.table(TOP_N, also=[raw.token])
        ]
        kept = w.kept
        attention = raw.attention
        if attention is None:  # the service always asks core to record it (generate's attention=True)
            raise RuntimeError("a generation step without its attention rows")
        sinks = [SinkHead(layer, head, float(attention[layer, head, 0])) for layer, head in raw.sink_heads()]
        return GeneratedStep(
            raw.index,
            p.token_str(raw.token),
            raw.token,
            raw.prob,
            raw.drawn_prob,
            raw.u,
            list(w.stages),
            candidates,
            int(kept.size),
            float(w.probs[0][kept].sum()),
            attention,
            sinks,
            raw.cache_bytes,
            stop,
        )

    def result(self) -> Generation:
        ids = [step.id for step in self.steps]
        text = GeneratedText(self.decode(ids), ids, [step.token for step in self.steps])
        return Generation(
            self.prepared, self.settings, text, list(self.steps), self.finish_reason or "length", self.stop_ids
        )


class GenerationViews:
    """Generation for one request, on its ModelViews' preparation and limits."""

    def __init__(self, views: ModelViews):
        self.views = views
        self.settings = views.settings

    def attention_values(self, cfg: TransformerConfig, n: int, max_new_tokens: int) -> int:
        """The attention weights a generation returns: every step's row (n + i keys) in every layer and head."""
        m = max_new_tokens
        return cfg.n_layers * cfg.n_heads * (m * n + m * (m - 1) // 2)

    @staticmethod
    def work(cfg: TransformerConfig, n: int, max_new_tokens: int) -> int:
        """Multiply-adds of reading the prompt (all but its last token) and of one single-token pass per new
        token over every key so far, logits included, plus the sampler's few passes over the vocabulary."""
        prompt = forward_work(cfg, n - 1, logits=False) if n > 1 else 0
        steps = sum(forward_work(cfg, 1, n_past=n - 1 + i) for i in range(max_new_tokens))
        return prompt + steps + 8 * cfg.d_vocab * max_new_tokens

    def start(self, spec: RunSpec, settings: GenerateSettings) -> GenerationRun:
        """Check and price the whole generation, then load the weights; nothing is generated yet."""
        st, sampling = self.check(spec, settings)
        cfg, n, m = st.cfg, st.n, settings.max_new_tokens
        steers = SteeringViews(self.views).steers(st, spec.steering) if spec.steering else None
        work = self.steered_work(cfg, n, m, steers) if steers else self.work(cfg, n, m)
        p = self.views.load(st, work, cfg.d_vocab, _("max_new_tokens, the text's length, d_model, n_layers or n_heads"))
        frozen = bool(spec.steering and spec.steering.frozen_attention)
        return GenerationRun(p, settings, sampling, end_of_text(st.model), text_decoder(st.model), steers, frozen)

    @staticmethod
    def steered_work(cfg: TransformerConfig, n: int, max_new_tokens: int, steers: list[Steer]) -> int:
        """A steered generation caches K and V (core.generate.generate_steered): the first step reads the
        prompt, each later one a token after every earlier one's keys, in two passes (at most: the unsteered as
        far as the first steered layer, through every layer with frozen attention; the steered from there),
        one token's logits each, plus the SAEs' encodings of the tokens read and the sampler."""
        steps = sum(
            2 * forward_work(cfg, 1 if i else n, n_past=n - 1 + i if i else 0, logits=False)
            + cfg.d_model * cfg.d_vocab
            + SteeringViews.encode_work(steers, 1 if i else n)
            for i in range(max_new_tokens)
        )
        return steps + 8 * cfg.d_vocab * max_new_tokens

    def check(self, spec: RunSpec, settings: GenerateSettings) -> tuple[Setup, Sampling]:
        """Everything `start` refuses, without loading any weight (a page checks its URL with it): InputError
        saying what to change."""
        s = self.settings
        st = self.views.setup(spec)
        model, cfg, n = st.model, st.cfg, st.n
        capabilities.require(capabilities.generation(model, cfg))
        if spec.steering is not None:
            SteeringViews(self.views).steers(st, spec.steering)  # each steer fits the model and the text
        m = settings.max_new_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InputError(_("max_new_tokens must be a whole number of tokens, at least 1, got {m!r}").format(m=m))
        if m > s.generate_max_new_tokens:
            raise InputError(
                _(
                    "max_new_tokens={m} is more than this server's limit of {limit} tokens per "
                    "generation: ask for fewer"
                ).format(m=m, limit=s.generate_max_new_tokens)
            )
        check_generation(cfg, n, m)  # the causal mask, and the model's context
        sampling = settings.sampling()  # temperature, top-k, top-p: InputError saying what to change
        if settings.top_k is not None and settings.top_k > cfg.d_vocab:
            raise InputError(
                _(
                    "top_k={top_k} is more than {model!r}'s vocabulary of {d_vocab} tokens: choose at "
                    "most that (or null for no top-k)"
                ).format(top_k=settings.top_k, model=model.name, d_vocab=cfg.d_vocab)
            )
        values = self.attention_values(cfg, n, m)
        if values > s.generate_max_values:
            raise InputError(
                _(
                    "this generation would return {values:,} attention weights ({n_layers} layers × "
                    "{n_heads} heads × every key of every step), more than this server's limit of "
                    "{limit:,}: reduce max_new_tokens or shorten the text"
                ).format(values=values, n_layers=cfg.n_layers, n_heads=cfg.n_heads, limit=s.generate_max_values)
            )
        return st, sampling

    def room(self, spec: RunSpec) -> int:
        """How many tokens the model's context has left after the text (a page's default and its bound)."""
        st = self.views.setup(spec)
        return st.cfg.n_ctx - st.n

    def generate(self, spec: RunSpec, settings: GenerateSettings) -> Generation:
        run = self.start(spec, settings)
        for _step in run:
            pass
        return run.result()
