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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .config import TransformerConfig
from .errors import InputError
from .i18n import _
from .model import KVCache, Params, check_tokens, forward
from .sampling import Sampling, Warped, sample, sampler

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
