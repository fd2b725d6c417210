"""Position schemes: none, sinusoidal, learned (a table in the params), rotary (RoPE).

Sinusoidal and learned encodings are added to the token embeddings; rotary rotates the
queries and keys of every head instead, so position enters only through Q·K.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError
from .i18n import _

POSITION_SCHEMES = ("none", "sinusoidal", "learned", "rotary")
ROPE_BASE = 10000.0  # the RoFormer paper's base, as for sinusoidal encodings


def sinusoidal(n_pos: int, d: int) -> np.ndarray:  # -> [n_pos, d]
    """Vaswani et al.'s encoding: sin on even dimensions, cos on odd ones.

    The dot product of two rows depends only on the gap between their positions,
    because sin a sin b + cos a cos b = cos(a - b).
    """
    if d % 2:
        raise InputError(_("sinusoidal encodings need an even width, got d={d}").format(d=d))
    pos = np.arange(n_pos)[:, None]  # [n_pos, 1]
    i = np.arange(0, d, 2)[None, :]  # [1, d/2], the even dimensions
    angle = pos / (10000 ** (i / d))  # [n_pos, d/2]
    pe = np.zeros((n_pos, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def rotary_angles(positions: np.ndarray, d_head: int, base: float = ROPE_BASE) -> np.ndarray:
    """θ_{p,i} = p · base^(-2i/d_head) for each position p and pair i.  # -> [pos, d_head/2]"""
    if d_head % 2:
        raise InputError(
            _("rotary embeddings rotate pairs of dimensions: d_head={d_head} must be even").format(d_head=d_head)
        )
    inv_freq = base ** (-np.arange(0, d_head, 2) / d_head)  # [d_head/2]
    return np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]


def apply_rotary(x: np.ndarray, positions: np.ndarray | None = None, base: float = ROPE_BASE) -> np.ndarray:
    """Rotate each pair of dimensions (2i, 2i+1) of x by its position's angle (RoFormer).

    x: [..., pos, d_head]. A rotation preserves norms, and the dot product of a rotated
    query at position m with a rotated key at position n depends only on m - n.
    """
    n_pos, d_head = x.shape[-2], x.shape[-1]
    positions = np.arange(n_pos) if positions is None else positions
    angles = rotary_angles(positions, d_head, base)  # [pos, d_head/2]
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def rotary(
    x: np.ndarray,
    positions: np.ndarray,
    *,
    rotary_dim: int | None = None,
    base: float = ROPE_BASE,
    adjacent_pairs: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rotary embeddings as every family applies them: a base, a partial dimension and a pair layout.

    x: [..., pos, d_head]. Only the first `rotary_dim` dimensions are rotated (GPT-NeoX rotates a
    quarter of each head, GPT-J a part); the rest pass through unchanged. Pair i turns by the angle
    p · base^(-2i/rotary_dim). adjacent_pairs=True pairs dimensions (2i, 2i+1), as RoFormer and
    apply_rotary do; False pairs dimension i with i + rotary_dim/2, the "rotate half" layout of
    GPT-NeoX and Llama. Both are the same rotation up to a fixed permutation of W_Q's and W_K's
    columns, so a checkpoint must be run in the layout it was trained in. Written into `out` if given.
    """
    d_head = x.shape[-1]
    rotary_dim = d_head if rotary_dim is None else rotary_dim
    if rotary_dim % 2 or not 0 < rotary_dim <= d_head:
        raise InputError(
            _("rotary_dim={rotary_dim} must be even and between 2 and d_head={d_head}").format(
                rotary_dim=rotary_dim, d_head=d_head
            )
        )
    angles = rotary_angles(positions, rotary_dim, base)  # [pos, rotary_dim/2]
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    out = np.empty_like(x) if out is None else out
    out[..., rotary_dim:] = x[..., rotary_dim:]  # the dimensions rotary leaves alone (none when full)
    if adjacent_pairs:  # pair i is (2i, 2i + 1)
        first, second = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:  # pair i is (i, i + rotary_dim/2)
        first, second = slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    a, b = x[..., first], x[..., second]
    # (a, b) -> (a cos - b sin, a sin + b cos), written straight into `out`
    np.multiply(a, cos, out=out[..., first])
    out[..., first] -= b * sin
    np.multiply(a, sin, out=out[..., second])
    out[..., second] += b * cos
    return out


def apply_rotary_backward(dy: np.ndarray, positions: np.ndarray | None = None, base: float = ROPE_BASE) -> np.ndarray:
    """dL/dx from dL/dy, where y = apply_rotary(x): rotate each pair back by its angle.

    A rotation R is orthogonal, so the gradient goes through its transpose, the rotation by −θ:
    dx_even = dy_even cos θ + dy_odd sin θ, dx_odd = −dy_even sin θ + dy_odd cos θ.
    (Sinusoidal and learned encodings are added to the embeddings, so the gradient of their sum
    reaches the token embedding unchanged; only a learned table also receives it, see core/backprop.py.)
    """
    positions = np.arange(dy.shape[-2]) if positions is None else np.asarray(positions)
    return apply_rotary(dy, -positions, base)  # θ is linear in the position: −p turns by −θ
