"""One cell of one head's attention, opened: the vectors behind a score and a weight.

A score is one query's dot product with one key; divided by √d_head (or the model's own divisor), masked and
softmaxed along its row, it weighs the values, whose weighted sum is the head's output for that query
(hook_z). `HeadVectors` holds one head's q, k, v and z ([pos, d_head] each, as the run computed them);
`attention_cell` reads one cell out of them and the head's stages (core/cache.py AttentionStages), so
that each printed number of the four heatmaps is seen as its parts:

    score = Σ q ⊙ k        scaled = score / divisor        weight = softmax(masked row)[key]
    output = Σ_key row_weights[key] · v[key]                 (= hook_z[query, head])

Pure functions on one run's arrays: nothing here runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import TransformerConfig
from .errors import InputError
from .i18n import _


def cell_hooks(cfg: TransformerConfig, layer: int) -> list[str]:
    """The hooks `ActivationCache.head_vectors` needs beyond `stage_hooks`: the values and the output,
    and for rotary the queries and keys before rotation."""
    b = f"blocks.{layer}.attn."
    names = [b + "hook_v", b + "hook_z"]
    if cfg.positional_embedding_type == "rotary":
        names += [b + "hook_q", b + "hook_k"]
    return names


@dataclass(frozen=True)
class HeadVectors:
    """One query head's vectors in one run, each [pos, d_head]. Under grouped-query attention k and v are
    those of the key/value head the query head shares (kv_head)."""

    layer: int
    head: int
    kv_head: int  # = head // (n_heads // n_key_value_heads)
    q: np.ndarray  # the queries the scores use: after rotation for rotary (hook_rot_q)
    k: np.ndarray  # likewise the keys (hook_rot_k)
    v: np.ndarray  # hook_v
    z: np.ndarray  # hook_z: each query's weighted sum of the values
    q_unrotated: np.ndarray | None = None  # rotary only: hook_q, before the rotation by position
    k_unrotated: np.ndarray | None = None  # rotary only: hook_k

    @property
    def nbytes(self) -> int:
        arrays = (self.q, self.k, self.v, self.z, self.q_unrotated, self.k_unrotated)
        return sum(a.nbytes for a in arrays if a is not None)


@dataclass(frozen=True)
class AttentionCell:
    """The cell (query, key) of one head, with every number that makes it."""

    layer: int
    head: int
    kv_head: int
    query: int  # query_pos: the row
    key: int  # key_pos: the column
    q: np.ndarray  # [d_head]
    k: np.ndarray  # [d_head]
    products: np.ndarray  # [d_head], q ⊙ k: their sum is the score
    # the numbers are the arrays' own scalars (float32 for a float32 run), so they print as the run's
    score: float  # stage 1, the raw score q · k
    divisor: float  # √d_head (times the temperature), or 1 for a model that does not scale
    scaled: float  # stage 2, score / divisor
    masked: bool  # stage 3's verdict: True where the mask hides the key (the score becomes −∞)
    weight: float  # stage 4: this cell's softmax weight
    row_weights: np.ndarray  # [key_pos], the query's whole row of weights (sums to 1)
    v: np.ndarray  # [key_pos, d_head], the value vector of every key of the row
    output: np.ndarray  # [d_head], the head's output for the query (hook_z): Σ row_weights[key] · v[key]
    q_unrotated: np.ndarray | None = None  # rotary: the vectors before rotation
    k_unrotated: np.ndarray | None = None

    def as_json(self) -> dict:
        """The download's fields, the arrays and numbers in the run's own dtype (app/http/jsonio.py writes each
        at its full precision, as /api/v1/run does); a masked score is None, null in JSON (which has no −∞)."""
        return {
            "layer": self.layer,
            "head": self.head,
            "query": self.query,
            "key": self.key,
            "q": self.q,
            "k": self.k,
            "products": self.products,
            "score": self.score,
            "scaled": self.scaled,
            "masked": None if self.masked else self.scaled,
            "weight": self.weight,
            "row_weights": self.row_weights,
            "v": self.v,
            "output": self.output,
        }


def attention_cell(vectors: HeadVectors, stages, divisor: float, query: int, key: int) -> AttentionCell:
    """Cell (query, key) of the head whose `vectors` and `stages` (AttentionStages: raw, scaled, mask, weights)
    these are, its scores divided by `divisor` (core.attention.attention_scale: √d_head, or the model's own).

    score, scaled, the mask and the weights are the stages' own numbers (the heatmaps'); q, k, v and
    the output are the run's activations, so Σ products = score and Σ row_weights · v = output hold to
    rounding (tests/pages/test_cell.py checks both against /api/v1/run's hooks)."""
    n = vectors.q.shape[0]
    for pos, outside in (
        (query, _("query position {pos!r} is outside the text's {n} tokens (use 0..{last})")),
        (key, _("key position {pos!r} is outside the text's {n} tokens (use 0..{last})")),
    ):
        if not isinstance(pos, (int, np.integer)) or not 0 <= pos < n:
            raise InputError(outside.format(pos=pos, n=n, last=n - 1))
    q, k = vectors.q[query], vectors.k[key]  # [d_head] each
    return AttentionCell(
        layer=vectors.layer,
        head=vectors.head,
        kv_head=vectors.kv_head,
        query=int(query),
        key=int(key),
        q=q,
        k=k,
        products=q * k,
        score=stages.raw[query, key],
        divisor=divisor,
        scaled=stages.scaled[query, key],
        masked=bool(stages.mask[query, key]),
        weight=stages.weights[query, key],
        row_weights=stages.weights[query],
        v=vectors.v,
        output=vectors.z[query],
        q_unrotated=None if vectors.q_unrotated is None else vectors.q_unrotated[query],
        k_unrotated=None if vectors.k_unrotated is None else vectors.k_unrotated[key],
    )
