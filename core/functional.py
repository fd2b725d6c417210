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
    x: np.ndarray,
    w: np.ndarray | None = None,
    b: np.ndarray | None = None,
    eps: float = 1e-5,
    out: np.ndarray | None = None,
) -> np.ndarray:  # [..., d] -> [..., d]
    """Normalise each vector to mean 0 and variance 1, then apply gain `w` and bias `b`; written into
    `out` if given.

    With `w` and `b` omitted this is the spec's scale-free layer norm (gain 1, bias 0),
    which TransformerLens calls "LNPre".
    """
    mu = x.mean(axis=-1, keepdims=True)
    centred = np.subtract(x, mu, out=out)
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    out = np.divide(centred, np.sqrt(var + eps), out=centred)
    if w is not None:
        out *= w
    if b is not None:
        out += b
    return out


def rms_norm(
    x: np.ndarray, w: np.ndarray | None = None, eps: float = 1e-6, out: np.ndarray | None = None
) -> np.ndarray:  # [..., d] -> [..., d]
    """Divide each vector by its root mean square, then apply gain `w` (Zhang & Sennrich, 2019);
    written into `out` if given.

    Unlike layer_norm it neither centres the vector nor adds a bias: Llama, Mistral and Qwen
    normalise this way. With `w` omitted this is TransformerLens' "RMSPre".
    """
    ms = np.mean(x * x, axis=-1, keepdims=True)
    out = np.divide(x, np.sqrt(ms + eps), out=out)
    if w is not None:
        out *= w
    return out


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# Each activation writes into `out` when given (a slice of an array the model allocated for all rows).


def gelu_new(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GELU in GPT-2's tanh form: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    inner = np.multiply(x, x, out=out)
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


def gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Exact GELU, x Φ(x) = 0.5 x (1 + erf(x / √2)), as BERT uses it."""
    return np.multiply(0.5 * x, 1.0 + erf(x * (1.0 / math.sqrt(2.0))), out=out)


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.maximum(x, 0, out=out)


def silu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x σ(x) = x / (1 + e^(-x)), the "swish" that Llama's gated MLP (SwiGLU) applies to its gate.

    For x below about -88 (float32) e^(-x) overflows to inf and the quotient is its limit, -0.
    """
    out = np.negative(x, out=out)
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


# ---------------------------------------------------------------------------- backward passes
# Each takes the gradient of the loss with respect to the forward function's output (dy, the
# same shape as the output) and returns the gradient with respect to its input(s): the chain rule
# one function at a time. They use what the forward pass computed (its output, or its input) so
# nothing is recomputed twice; core/backprop.py strings them together for a whole model.


def row_sum(x: np.ndarray) -> np.ndarray:
    """Σ over the last axis, keeping it as size 1.  # [..., n] -> [..., 1]

    A matrix-vector product with a vector of ones: BLAS adds many short rows (64 numbers of a
    training batch's residual stream, 32 keys of an attention row) several times faster than
    x.sum(axis=-1), whose cost at these sizes is NumPy's overhead per row.
    """
    rows = x.reshape(-1, x.shape[-1]) @ np.ones(x.shape[-1], dtype=x.dtype)
    return rows.reshape(*x.shape[:-1], 1)


def softmax_backward(dy: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """dL/dz from dL/dy, where y = softmax(z) over the last axis; written into `out` if given
    (`out=dy` is allowed).  # [..., n], [..., n] -> [..., n]

    ∂y_i/∂z_j = y_i (δ_ij − y_j), so dz_j = y_j (dy_j − Σ_i dy_i y_i). A position softmax gave
    weight 0 (a masked key) gets gradient 0: the mask passes nothing back.
    """
    expected = row_sum(dy * y)  # Σ_i dy_i y_i: dy averaged under y, [..., 1]
    dz = np.subtract(dy, expected, out=out)
    dz *= y
    return dz


def layer_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray | None = None, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:  # [..., d] -> dx [..., d], dw [d], db [d]
    """Gradients of layer_norm(x, w, b) with respect to x, w and b (dw, db None for LNPre).

    With x̂ = (x − μ)/σ and σ = √(var + eps), the normalisation's Jacobian gives
    dx = (g − mean(g) − x̂ · mean(g · x̂)) / σ, where g = dy · w is the gradient reaching x̂.
    Both means are over the last axis: moving one input moves the mean and σ every output uses.
    """
    inv_d = x.dtype.type(1.0 / x.shape[-1])
    xhat = x - row_sum(x) * inv_d
    rstd = 1.0 / np.sqrt(row_sum(xhat * xhat) * inv_d + eps)  # 1/σ, [..., 1]
    xhat *= rstd
    lead = tuple(range(dy.ndim - 1))  # a gain and a bias are shared by every position (and batch row)
    dw = (dy * xhat).sum(axis=lead) if w is not None else None
    db = dy.sum(axis=lead) if w is not None else None
    g = dy * w if w is not None else dy
    dx = g - row_sum(g) * inv_d
    xhat *= row_sum(g * xhat) * inv_d
    dx -= xhat
    dx *= rstd
    return dx, dw, db


def rms_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray | None = None, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray | None]:  # [..., d] -> dx [..., d], dw [d]
    """Gradients of rms_norm(x, w) with respect to x and w (dw None for RMSPre).

    With r = 1/√(mean(x²) + eps) and x̂ = x r, moving x_j moves every output through r:
    dx = r (g − x̂ · mean(g · x̂)), where g = dy · w is the gradient reaching x̂. dw = Σ dy · x̂ over
    every leading axis (positions, batch rows, and heads for a per-head query or key norm share it).
    """
    inv_d = x.dtype.type(1.0 / x.shape[-1])
    r = 1.0 / np.sqrt(row_sum(x * x) * inv_d + eps)  # [..., 1]
    xhat = x * r
    dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0) if w is not None else None
    g = dy * w if w is not None else dy.copy()
    xhat *= row_sum(g * xhat) * inv_d
    g -= xhat
    g *= r
    return g, dw


def gelu_new_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """dL/dx for y = gelu_new(x) = 0.5 x (1 + tanh u), u = √(2/π)(x + 0.044715 x³).

    dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 − tanh² u) du/dx, with du/dx = √(2/π)(1 + 3 · 0.044715 x²),
    which factors as 0.5 (1 + tanh u)(1 + x (1 − tanh u) du/dx). Given the forward's output y, the
    tanh needs no recomputing (the costliest step): 1 + tanh u = 2y/x (and 1 where x = 0).
    In place, a few arrays in all: at a training batch's MLP width every temporary is megabytes.
    """
    if y is None:
        one_plus_t = x * x
        one_plus_t *= 0.044715 * _SQRT_2_OVER_PI
        one_plus_t += _SQRT_2_OVER_PI
        one_plus_t *= x  # u
        np.tanh(one_plus_t, out=one_plus_t)
        one_plus_t += 1.0
    else:
        with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 where x = 0, set just below
            one_plus_t = np.divide(y, x)  # 0.5 (1 + tanh u)
        one_plus_t[x == 0] = 0.5  # its limit at x = 0
        one_plus_t *= 2.0
    du = x * x
    du *= 3 * 0.044715 * _SQRT_2_OVER_PI
    du += _SQRT_2_OVER_PI  # du/dx
    grad = 2.0 - one_plus_t  # 1 − tanh u
    grad *= x
    grad *= du
    grad += 1.0
    grad *= one_plus_t
    grad *= 0.5
    grad *= dy
    return grad


def erf_backward(x: np.ndarray) -> np.ndarray:
    """The derivative of `erf` as implemented: in float64, where `erf` is the C library's, the true
    2/√π · exp(−x²); in other dtypes the derivative of the Abramowitz & Stegun polynomial itself, so
    finite differences of the forward pass and the backward pass agree to rounding (it differs from
    the true derivative by about 1e-6).
    erf(x) = sign(x) (1 − P(t) e^{−a²}), a = |x|, t = 1/(1 + p a), so
    erf'(x) = (2a P(t) − P'(t) dt/da) e^{−a²}, with dt/da = −p t² (even in x: the signs cancel).
    """
    if x.dtype == np.float64:
        return (2.0 / math.sqrt(math.pi)) * np.exp(-x * x)
    p = 0.3275911
    c = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)  # P(t) = Σ c_i t^(i+1)
    a = np.abs(x)
    t = 1.0 / (1.0 + p * a)
    poly = t * (c[0] + t * (c[1] + t * (c[2] + t * (c[3] + t * c[4]))))
    dpoly = c[0] + t * (2 * c[1] + t * (3 * c[2] + t * (4 * c[3] + t * 5 * c[4])))  # P'(t)
    return (2.0 * a * poly + dpoly * p * t * t) * np.exp(-a * a)


def gelu_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """dL/dx for y = gelu(x) = 0.5 x (1 + erf(x/√2)): dy/dx = 0.5 (1 + erf(x/√2)) + 0.5 x erf'(x/√2)/√2.
    float64 computes it from x (y, the forward's output, is not needed there); other dtypes read Φ from y."""
    r = 1.0 / math.sqrt(2.0)
    if x.dtype == np.float64:
        return dy * (0.5 * (1.0 + erf(x * r)) + 0.5 * r * x * erf_backward(x * r))
    # Other dtypes (checkpoints run in float32): Φ(x) = 0.5 (1 + erf(x/√2)) is the forward's own, y / x (0.5 at
    # x = 0), and x Φ'(x) is the true x e^(−x²/2) / √(2π), as PyTorch's GELU backward takes it: the derivative
    # of erf's polynomial (erf_backward) differs from it by about 1e-6, and costs some thirty passes over the
    # [batch, pos, d_mlp] array where this takes ten (a GPT-NeoX MLP's backward measured 4x faster).
    if y is None:
        y = gelu(x)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 where x = 0, set just below
        phi = np.divide(y, x)
    phi[x == 0] = 0.5
    density = x * x
    density *= -0.5
    np.exp(density, out=density)
    density *= x
    density *= 1.0 / math.sqrt(2.0 * math.pi)  # x Φ'(x)
    phi += density
    phi *= dy
    return phi


def relu_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """dL/dx for y = max(x, 0): the gradient passes where x > 0 (at exactly 0 it is taken as 0, as PyTorch does).
    (y is not needed: taken for the same signature as gelu_new_backward.)"""
    return dy * (x > 0)


def silu_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """dL/dx for y = silu(x) = x σ(x): dy/dx = σ(x) (1 + x (1 − σ(x))). σ is recomputed from x (y / x would
    lose it where x is 0 or where σ underflows); in place, a few arrays in all."""
    sig = np.negative(x)
    with np.errstate(over="ignore"):  # e^(-x) overflows to inf for very negative x: σ is then 0, rightly
        np.exp(sig, out=sig)
    sig += 1.0
    np.reciprocal(sig, out=sig)  # σ(x)
    grad = 1.0 - sig
    grad *= x
    grad += 1.0
    grad *= sig
    grad *= dy
    return grad


ACTIVATION_BACKWARDS = {
    "gelu_new": gelu_new_backward,
    "gelu": gelu_backward,
    "relu": relu_backward,
    "silu": silu_backward,
}


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean next-token loss −log p(target), and the probabilities it came from.

    logits: [..., d_vocab]; targets: [...] integer ids. Returns (loss, probs [..., d_vocab]).
    With z shifted by its maximum (so exp never overflows) and S = Σ exp(z), −log p(t) = log S − z_t.
    """
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    total = row_sum(probs)  # [..., 1]
    picked = np.take_along_axis(shifted, targets[..., None], axis=-1)  # [..., 1]
    loss = float(np.mean(np.log(total) - picked))
    probs /= total
    return loss, probs


def cross_entropy_backward(probs: np.ndarray, targets: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """dL/dlogits of the mean cross-entropy: (softmax − one-hot) / number of predictions.  # [..., d_vocab]
    Written into `out` if given (out=probs: the probabilities are not needed after)."""
    dlogits = np.divide(probs, probs.dtype.type(targets.size), out=out)
    picked = np.take_along_axis(dlogits, targets[..., None], axis=-1)
    np.put_along_axis(dlogits, targets[..., None], picked - probs.dtype.type(1.0 / targets.size), axis=-1)
    return dlogits
