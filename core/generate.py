"""Writing with a model: generation token by token through the KV cache, every step recorded.

The prompt is read once (one forward pass over all but its last token, keeping every layer's K and
V); then each step is one `forward` of a single token with `past_kv` (core/model.py, the same block
as a full run): its logits give the next token (core/sampling.py), and its query's attention row in
every layer and head says where the model looked when that token was chosen. Each step records:

    token          the id chosen, and u, the uniform number its draw used (None: greedy)
    warped         the distribution it came from: the model's, then after each setting
    attention      [n_layers, n_heads, n_keys]: the choosing query's weights over every key so far
                   (the prompt and the tokens generated before it); a query head under grouped-query
                   attention reads the key/value head head // (n_heads / n_key_value_heads)
    cache_bytes    the KV cache when it was chosen: the keys and values of every token before it
    sink_heads     heads whose weight on the first token is above SINK_THRESHOLD: attention sinks,
                   parking what they do not need elsewhere (Xiao et al. 2023, "Efficient Streaming
                   Language Models with Attention Sinks")

Generation stops after max_new_tokens, or at a token of `stop_ids` (a model's end-of-text), which
is kept as the last step. A caller that stops iterating stops the generation (a stop string, Stop).

`generate_steered` writes the same way with steers (core/steering.py) applied at every step; see there what
its positions, its frozen attention and its seed mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .config import TransformerConfig
from .errors import InputError
from .i18n import _
from .model import KVCache, Params, check_tokens, forward
from .sampling import Sampling, Warped, sample, sampler
from .steering import Steer, SteeredDecoder, check_steer

SINK_THRESHOLD = 0.5  # a head is an attention sink for a token when over half its weight is on the first token


@dataclass(frozen=True)
class GenerationStep:
    index: int  # 0 for the first new token
    token: int
    u: float | None  # the uniform number drawn for it (None: greedy)
    warped: Warped  # the model's distribution and each setting's
    attention: np.ndarray | None  # [n_layers, n_heads, n_keys], n_keys = prompt + index (None: not recorded)
    cache_bytes: int
    stopped: bool  # it is a stop token: the last step

    @property
    def prob(self) -> float:
        """The model's own probability of the token (before any setting)."""
        return float(self.warped.probs[0][self.token])

    @property
    def drawn_prob(self) -> float:
        """Its probability in the distribution it was drawn from (after every setting)."""
        return float(self.warped.final[self.token])

    def sink_heads(self, threshold: float = SINK_THRESHOLD) -> list[tuple[int, int]]:
        """(layer, head) of every head whose weight on the first token is above `threshold`."""
        if self.attention is None:
            return []
        return [(int(layer), int(head)) for layer, head in zip(*np.nonzero(self.attention[:, :, 0] > threshold))]


def check_generation(cfg: TransformerConfig, n_prompt: int, max_new_tokens: int) -> None:
    """Refuse what this model cannot generate: a bidirectional model, or more tokens than its context."""
    if not cfg.causal:
        raise InputError(
            _(
                "generation needs causal attention: a bidirectional model lets every new "
                "token change the earlier positions, so nothing can be cached, and it was "
                "not trained to predict the next token. Turn causal back on, or choose a "
                "decoder"
            )
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise InputError(
            _("max_new_tokens must be a non-negative whole number, got {max_new_tokens!r}").format(
                max_new_tokens=max_new_tokens
            )
        )
    if n_prompt + max_new_tokens > cfg.n_ctx:
        message = (
            _(
                "{n} tokens of text + max_new_tokens={max_new_tokens} exceed the model's context of "
                "n_ctx={n_ctx} tokens: reduce max_new_tokens to at most {most} or shorten the text"
            )
            if n_prompt > 1
            else _(
                "{n} tokens of text + max_new_tokens={max_new_tokens} exceed the model's context of "
                "n_ctx={n_ctx} tokens: reduce max_new_tokens to at most {most}"
            )
        )
        raise InputError(
            message.format(
                n=n_prompt, max_new_tokens=max_new_tokens, n_ctx=cfg.n_ctx, most=max(cfg.n_ctx - n_prompt, 0)
            )
        )


def read_prompt(params: Params, cfg: TransformerConfig, prompt: np.ndarray) -> KVCache:
    """Every layer's K and V of all the prompt's tokens but the last (which the first step feeds)."""
    if prompt.size == 1:
        return KVCache.empty(cfg, params["embed"]["W_E"].dtype)
    _, _, kv = forward(params, cfg, prompt[:-1], names=(), logits=False)
    return kv


def generate(
    params: Params,
    cfg: TransformerConfig,
    prompt,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    *,
    seed: int = 0,
    stop_ids: Iterable[int] = (),
    attention: bool = True,
) -> Iterator[GenerationStep]:
    """Continue the token ids `prompt` [pos] by up to max_new_tokens tokens, one GenerationStep each.

    sampling: temperature (0: greedy), top-k, top-p, repetition penalty; seed: the sampler's
    (core.sampling.sampler). attention=False skips recording the attention rows (their hooks)."""
    prompt = check_tokens(prompt, cfg)
    check_generation(cfg, prompt.size, max_new_tokens)
    rng = None if sampling.greedy else sampler(seed)
    stops = {int(t) for t in stop_ids}
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)] if attention else []
    if max_new_tokens == 0:
        return
    kv = read_prompt(params, cfg, prompt)
    context = [int(t) for t in prompt]  # what the repetition penalty looks at: the text so far
    for index in range(max_new_tokens):
        logits, acts, kv = forward(params, cfg, np.array(context[-1:]), names=names, past_kv=kv)
        rows = np.stack([acts[n][:, -1, :] for n in names]) if attention else None  # [n_layers, n_heads, n_keys]
        token, warped, u = sample(logits[-1], sampling, rng, context)
        step = GenerationStep(index, token, u, warped, rows, kv.nbytes, token in stops)
        yield step
        if step.stopped:
            return
        context.append(token)


def generate_steered(
    params: Params,
    cfg: TransformerConfig,
    prompt,
    max_new_tokens: int,
    steers: Sequence[Steer],
    sampling: Sampling = Sampling(),
    *,
    frozen_attention: bool = False,
    seed: int = 0,
    stop_ids: Iterable[int] = (),
) -> Iterator[GenerationStep]:
    """`generate` with `steers` applied at every step, one GenerationStep each (attention rows recorded).

    Each step is the steered model's reading of one more token with a KV cache (core.steering.SteeredDecoder):
    the first reads the whole prompt, each later one the token the one before chose, and the numbers are those
    of a steered run (core.steering.steered_run) of the whole text so far. With frozen attention the unsteered
    model's keys and values of the same tokens are cached too, for its patterns; a step's cache_bytes are the
    model's KV cache of the text so far, as `generate`'s (frozen attention holds the unsteered run's as well).

    Positions: a steer's `positions` are the prompt's (negative ones count from the prompt's end) and stay on
    those tokens as the text grows; positions=None steers every position, each new token's too.

    Frozen attention: at step i the text is the prompt and the i tokens the steered model wrote; every
    attention pattern, from the first layer that reads a steered stream on, is the *unsteered* model's pattern
    over that same text (an unsteered pass over those tokens), and the steer reaches the next token only
    through the values and the residual path. It is not the unsteered continuation's patterns, which are over
    other tokens once the two continuations part. A step's recorded attention row is the pattern that was used
    (the unsteered one where frozen).

    Seed: the same sampler as `generate` (one uniform number u per token from Generator(PCG64(seed))), so an
    unsteered and a steered generation with one seed draw their i-th tokens with the same u, and differ only
    by the distributions; greedy (temperature 0) takes the most likely token in both."""
    prompt = check_tokens(prompt, cfg)
    check_generation(cfg, prompt.size, max_new_tokens)
    n_prompt = prompt.size
    if not steers:
        raise InputError(_("steering needs at least one steer"))
    steers = [check_steer(s, cfg, n_prompt) for s in steers]  # a position must lie within the prompt
    # the prompt's positions, made non-negative so they stay on the same tokens as the text grows
    fixed = [
        s if s.positions is None else replace(s, positions=tuple(sorted({p % n_prompt for p in s.positions})))
        for s in steers
    ]
    decoder = SteeredDecoder(params, cfg, fixed, frozen_attention)
    rng = None if sampling.greedy else sampler(seed)
    stops = {int(t) for t in stop_ids}
    context = [int(t) for t in prompt]
    kv_row = 2 * cfg.n_layers * cfg.n_key_value_heads * cfg.d_head * params["embed"]["W_E"].dtype.itemsize
    new = prompt
    for index in range(max_new_tokens):
        logits, rows = decoder.feed(new)  # rows [n_layers, n_heads, n_keys]
        token, warped, u = sample(logits, sampling, rng, context)
        step = GenerationStep(index, token, u, warped, rows, kv_row * len(context), token in stops)
        yield step
        if step.stopped:
            return
        context.append(token)
        new = np.array([token])


def generate_ids(
    params: Params,
    cfg: TransformerConfig,
    prompt,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    *,
    seed: int = 0,
    stop_ids: Iterable[int] = (),
) -> np.ndarray:
    """Only the new token ids [n_new] (no attention recorded): a notebook's one-liner."""
    steps = generate(params, cfg, prompt, max_new_tokens, sampling, seed=seed, stop_ids=stop_ids, attention=False)
    return np.array([s.token for s in steps], dtype=np.int64)
