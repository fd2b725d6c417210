"""Choosing the next token from a logits vector, one visible step at a time.

Each setting is a pure function of the logits [d_vocab] that returns new logits, with -inf for the
tokens it cuts away, applied in transformers' order (its logits processors, then its warpers):

    apply_repetition_penalty   a token already in the text: its logit ÷ penalty if positive, × if negative
    apply_temperature          logits ÷ T: T < 1 sharpens the distribution, T > 1 flattens it
    apply_top_k                keep the k most likely tokens
    apply_top_p                keep the smallest set of most likely tokens whose probability reaches p

Temperature 0 means greedy: the most likely token, nothing drawn (top-k and top-p then change nothing,
as transformers ignores its warpers without do_sample).

"Most likely" is one ranking everywhere (`ranked`): by logit, ties broken by the lower token id. So
top-k keeps exactly k tokens even when several tie at the k-th place (transformers keeps every token
tied with the k-th), and top-p's set is well defined when probabilities tie.

The draw is one stated rule (`draw`), so the same seed and settings give the same text wherever the
logits are the same: one uniform number u in [0, 1) from NumPy's Generator(PCG64(seed)) per sampled
token; the kept tokens laid end to end in ranked order, each as wide as its probability; the token
under u × (their total) is drawn. Greedy steps take no number from the generator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .functional import softmax
from .i18n import _

# ------------------------------------------------------------------ the settings


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. The defaults change nothing: T = 1, no top-k, top-p 1, no penalty."""

    temperature: float = 1.0  # 0: greedy (the most likely token)
    top_k: int | None = None  # None: every token stays
    top_p: float = 1.0  # 1: every token stays
    repetition_penalty: float = 1.0  # 1: none; > 1 discourages tokens already in the text

    def __post_init__(self) -> None:
        t, k, p, r = self.temperature, self.top_k, self.top_p, self.repetition_penalty
        if not _is_number(t) or not (math.isfinite(t) and t >= 0):
            raise InputError(_("temperature must be 0 (greedy) or a positive number, got {t!r}").format(t=t))
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
            raise InputError(
                _("top_k must be a whole number of tokens, at least 1 (or null for no top-k), got {k!r}").format(k=k)
            )
        if not _is_number(p) or not (0 < p <= 1):
            raise InputError(
                _("top_p must lie in (0, 1]: the share of probability to keep (1 keeps every token), got {p!r}").format(
                    p=p
                )
            )
        if not _is_number(r) or not (math.isfinite(r) and r > 0):
            raise InputError(_("repetition_penalty must be a positive number (1: none), got {r!r}").format(r=r))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def stages(self) -> tuple[str, ...]:
        """The distributions a step shows, in order: the model's, then each setting that is on (a setting at
        its neutral value is left out, as transformers leaves out its processor)."""
        out = ["model"]
        if self.repetition_penalty != 1:
            out.append("repetition_penalty")
        if self.greedy:
            return (*out, "greedy")
        if self.temperature != 1:
            out.append("temperature")
        if self.top_k is not None:
            out.append("top_k")
        if self.top_p < 1:
            out.append("top_p")
        return tuple(out)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def sampler(seed: int) -> np.random.Generator:
    """The random stream of one generation: NumPy's PCG64 seeded with `seed` (the same on every machine)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(_("seed must be a non-negative whole number, got {seed!r}").format(seed=seed))
    return np.random.Generator(np.random.PCG64(int(seed)))


# ------------------------------------------------------------------ the ranking


def ranked(logits: np.ndarray, n: int | None = None) -> np.ndarray:
    """Token ids from the most to the least likely (by logit; ties: the lower id first); the first n only.
    # [d_vocab] -> [n]"""
    x = np.asarray(logits)
    if n is None or n >= x.size:
        return np.argsort(-x, kind="stable")
    if n <= 0:
        return np.zeros(0, dtype=np.intp)
    threshold = np.partition(x, x.size - n)[x.size - n]  # the n-th largest logit
    above = np.flatnonzero(x > threshold)  # in id order
    tied = np.flatnonzero(x == threshold)[: n - above.size]  # the lowest ids of those tied at the n-th place
    ids = np.concatenate([above, tied])
    return ids[np.argsort(-x[ids], kind="stable")]


def rank_of(logits: np.ndarray, token: int) -> int:
    """Where `token` stands in `ranked(logits)`: how many tokens rank above it (0: the most likely)."""
    x = np.asarray(logits)
    return int((x > x[token]).sum() + (x[:token] == x[token]).sum())


# ------------------------------------------------------------------ each setting


def apply_repetition_penalty(logits: np.ndarray, previous: Iterable[int], penalty: float) -> np.ndarray:
    """Every token already in the text made less likely: a positive logit divided by the penalty, a
    negative one multiplied by it (CTRL, Keskar et al. 2019; transformers' RepetitionPenaltyLogitsProcessor).
    # [d_vocab] -> [d_vocab]"""
    out = np.array(logits, dtype=np.float64)
    seen = np.unique(np.fromiter(previous, dtype=np.int64))
    if seen.size and penalty != 1:
        x = out[seen]
        out[seen] = np.where(x < 0, x * penalty, x / penalty)
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Logits ÷ T (T > 0), after subtracting their largest value: the shift leaves the softmax as it was
    and keeps a tiny T from overflowing. # [d_vocab] -> [d_vocab]"""
    x = np.asarray(logits, dtype=np.float64)
    return (x - x.max()) / temperature


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Only the k most likely tokens (ranked), the rest -inf. # [d_vocab] -> [d_vocab]"""
    x = np.asarray(logits, dtype=np.float64)
    if k >= x.size:
        return x.copy()
    out = np.full_like(x, -np.inf)
    keep = ranked(x, k)
    out[keep] = x[keep]
    return out


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus sampling (Holtzman et al. 2019): the smallest set of most likely tokens whose probability
    reaches p, the rest -inf. A token stays when the tokens ranked above it hold less than p.
    # [d_vocab] -> [d_vocab]"""
    x = np.asarray(logits, dtype=np.float64)
    if p >= 1:
        return x.copy()
    finite = int(np.isfinite(x).sum())
    order = ranked(x, finite)  # the tokens still in play, most likely first
    mass = np.cumsum(softmax(x)[order])
    n = min(int(np.searchsorted(mass, p, side="left")) + 1, finite)  # the first rank whose total reaches p
    out = np.full_like(x, -np.inf)
    out[order[:n]] = x[order[:n]]
    return out


def apply_greedy(logits: np.ndarray) -> np.ndarray:
    """Only the most likely token (the lowest id among ties): 0 there, -inf elsewhere. # [d_vocab] -> [d_vocab]"""
    x = np.asarray(logits, dtype=np.float64)
    out = np.full_like(x, -np.inf)
    out[int(np.argmax(x))] = 0.0
    return out


# ------------------------------------------------------------------ all of them, and the draw


@dataclass(frozen=True)
class Warped:
    """One step's distributions: the model's, then after each setting in turn (`stages` names them).

    logits[i] and probs[i] are [d_vocab] after stage i; a token a setting cut away is -inf there and
    has probability 0 from then on. probs[-1] is what the token is drawn from."""

    stages: tuple[str, ...]
    logits: tuple[np.ndarray, ...]
    probs: tuple[np.ndarray, ...]

    @property
    def final(self) -> np.ndarray:  # [d_vocab]
        return self.probs[-1]

    @property
    def kept(self) -> np.ndarray:
        """The ids that can be drawn, most likely first. # [n_kept]"""
        last = self.logits[-1]
        return ranked(last, int(np.isfinite(last).sum()))

    def cut_by(self, token: int) -> str | None:
        """The setting that cut this token away (a stage's name), or None if it can be drawn."""
        for stage, logits in zip(self.stages, self.logits):
            if not np.isfinite(logits[token]):
                return stage
        return None

    def table(self, n: int, also: Iterable[int] = ()) -> list[TableRow]:
        """The n most likely tokens (in the ranking before any token is cut: the kept ones come first,
        so the cut-off is a line in the table), and the ids in `also` (the drawn token) wherever they rank."""
        before_cut = self.logits[self.cut_from() - 1]
        top = [int(i) for i in ranked(before_cut, n)]
        extra = [int(i) for i in dict.fromkeys(also) if int(i) not in top]
        ranks = [*range(len(top)), *(rank_of(before_cut, t) for t in extra)]
        return [
            TableRow(t, r, tuple(float(p[t]) for p in self.probs), self.cut_by(t)) for r, t in zip(ranks, top + extra)
        ]

    def cut_from(self) -> int:
        """The index of the first stage that can cut tokens away (top-k, top-p, greedy), or len(stages)."""
        for i, stage in enumerate(self.stages):
            if stage in ("top_k", "top_p", "greedy"):
                return i
        return len(self.stages)


@dataclass(frozen=True)
class TableRow:
    id: int
    rank: int  # 0 = most likely, by the ranking the cuts use
    probs: tuple[float, ...]  # after each stage (Warped.stages)
    cut_by: str | None  # the stage that cut it away; None: it can be drawn

    @property
    def kept(self) -> bool:
        return self.cut_by is None


def warp(logits: np.ndarray, sampling: Sampling, previous: Iterable[int] = ()) -> Warped:
    """Every stage of `sampling` applied to the logits [d_vocab] in turn (the order of Sampling.stages)."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise InputError(_("expected one logits vector [d_vocab], got shape {shape}").format(shape=x.shape))
    steps = [x]
    for stage in sampling.stages()[1:]:
        last = steps[-1]
        if stage == "repetition_penalty":
            steps.append(apply_repetition_penalty(last, previous, sampling.repetition_penalty))
        elif stage == "greedy":
            steps.append(apply_greedy(last))
        elif stage == "temperature":
            steps.append(apply_temperature(last, sampling.temperature))
        elif stage == "top_k" and sampling.top_k is not None:  # a stage only when it is set (stages)
            steps.append(apply_top_k(last, sampling.top_k))
        elif stage == "top_p":
            steps.append(apply_top_p(last, sampling.top_p))
    return Warped(sampling.stages(), tuple(steps), tuple(softmax(s) for s in steps))


def draw(probs: np.ndarray, u: float) -> int:
    """The token at u in [0, 1): the kept tokens (probability > 0) laid end to end in ranked order, each
    as wide as its probability, and u scaled to their total. # [d_vocab], u -> token id"""
    if not 0 <= u < 1:
        raise InputError(_("u must lie in [0, 1), got {u!r}").format(u=u))
    p = np.asarray(probs, dtype=np.float64)
    kept = ranked(p, int((p > 0).sum()))
    edges = np.cumsum(p[kept])  # where each kept token's interval ends
    i = int(np.searchsorted(edges, u * edges[-1], side="right"))
    return int(kept[min(i, kept.size - 1)])  # u × total rounds below the total; min() guards the last bit


def sample(
    logits: np.ndarray, sampling: Sampling, rng: np.random.Generator | None, previous: Iterable[int] = ()
) -> tuple[int, Warped, float | None]:
    """The next token: every stage, then greedy (no number drawn) or one draw. Returns the token, the
    distributions and u (None when greedy)."""
    warped = warp(logits, sampling, previous)
    if sampling.greedy:
        return int(np.argmax(warped.final)), warped, None
    if rng is None:
        raise InputError(_("sampling needs a random generator: sampler(seed)"))
    u = float(rng.random())
    return draw(warped.final, u), warped, u
