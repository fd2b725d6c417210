"""Pure elementwise and row-wise functions: softmax, layer norm, activations, linear.

Every function is stateless and works on arrays with any leading axes, so each can be
called and checked on its own in a notebook. Dtypes are preserved: a float32 input
gives a float32 output (Python float constants do not promote under NumPy 2).
"""

from __future__ import annotations

import math

import numpy as np


def softmax(z: np.ndarray, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable softmax along `axis`; written into `out` if given (`out=z` is allowed).

    Subtracting the row maximum changes nothing mathematically (the constant cancels in
    the division) but stops `np.exp` overflowing. Rows that are entirely -inf (nothing
    visible) would give 0/0; they cannot arise from a causal mask, which always leaves
    the diagonal visible.
    """
    # One array for the whole computation (exp and the division work in place): attention
    # patterns are [heads, pos, pos], so every extra temporary is a full pass over memory.
    e = np.subtract(z, z.max(axis=axis, keepdims=True), out=out)
    if e.dtype.kind != "f":  # integer logits: exp needs a float array to write into
        e = e.astype(np.float64)
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def layer_norm(
    x: np.ndarray, w: np.ndarray | None = None, b: np.ndarray | None = None, eps: float = 1e-5
) -> np.ndarray:  # [..., d] -> [..., d]
    """Normalise each vector to mean 0 and variance 1, then apply gain `w` and bias `b`.

    With `w` and `b` omitted this is the spec's scale-free layer norm (gain 1, bias 0),
    which TransformerLens calls "LNPre".
    """
    mu = x.mean(axis=-1, keepdims=True)
    centred = x - mu
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    out = centred / np.sqrt(var + eps)
    if w is not None:
        out *= w
    if b is not None:
        out += b
    return out


def rms_norm(x: np.ndarray, w: np.ndarray | None = None, eps: float = 1e-6) -> np.ndarray:  # [..., d] -> [..., d]
    """Divide each vector by its root mean square, then apply gain `w` (Zhang & Sennrich, 2019).

    Unlike layer_norm it neither centres the vector nor adds a bias: Llama, Mistral and Qwen
    normalise this way. With `w` omitted this is TransformerLens' "RMSPre".
    """
    ms = np.mean(x * x, axis=-1, keepdims=True)
    out = x / np.sqrt(ms + eps)
    if w is not None:
        out *= w
    return out


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_new(x: np.ndarray) -> np.ndarray:
    """GELU in GPT-2's tanh form: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    inner = x * x
    inner *= 0.044715 * x
    inner += x
    inner *= _SQRT_2_OVER_PI
    np.tanh(inner, out=inner)
    inner += 1.0
    inner *= 0.5 * x
    return inner


_LIBM_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, vectorised (NumPy has none and core/ must not need SciPy).

    float64: the C library's erf (Python's math.erf) element by element, to the last bit or so.
    float64 is where exactness is asked for (parity with transformers in float64 to 1e-10), and
    the polynomial below would be off by up to 1.5e-7 there.
    Other dtypes (checkpoints run in float32): Abramowitz & Stegun 7.1.26, whole arrays at once,
    with absolute error below 1.5e-7, about float32's resolution near 1 and far inside the 1e-4
    parity tolerance against PyTorch's erf GELU.
    """
    if x.dtype == np.float64:
        return np.asarray(_LIBM_ERF(x), dtype=np.float64)
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x Φ(x) = 0.5 x (1 + erf(x / √2)), as BERT uses it."""
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def silu(x: np.ndarray) -> np.ndarray:
    """x σ(x) = x / (1 + e^(-x)), the "swish" that Llama's gated MLP (SwiGLU) applies to its gate.

    For x below about -88 (float32) e^(-x) overflows to inf and the quotient is its limit, -0.
    """
    out = np.negative(x)
    with np.errstate(over="ignore"):  # the overflow to inf is the right answer, not an error
        np.exp(out, out=out)
    out += 1.0
    return np.divide(x, out, out=out)


ACTIVATIONS = {"gelu_new": gelu_new, "gelu": gelu, "relu": relu, "silu": silu}


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w + b.  # [..., d_in], [d_in, d_out], [d_out] -> [..., d_out]"""
    out = x @ w
    if b is not None:
        out += b
    return out
