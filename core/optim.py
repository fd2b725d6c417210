"""Optimisation: AdamW with decoupled weight decay, clipping by global norm, warm-up then cosine decay.

Every parameter array of a model lives in one flat vector (`ParamVector`): the model's nested dict
holds views into it, so the model code reads params["blocks"][0]["attn"]["W_QKV"] as usual while
the optimiser updates all of them with a handful of whole-vector operations (what PyTorch's
"foreach" AdamW does with its lists of tensors). The same layout makes a snapshot one array.

The update follows torch.optim.AdamW step for step, so a test can hold the two equal:

    p ← p · (1 − lr · λ)                          decoupled weight decay (Loshchilov & Hutter, 2019)
    m ← β₁ m + (1 − β₁) g,  v ← β₂ v + (1 − β₂) g²
    p ← p − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

Weight decay applies to matrices only (embeddings, W_QKV, W_O, W_in, W_out, W_U), never to gains
and biases, as in nanoGPT: shrinking a layer norm's gain towards 0 has no regularising meaning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import Params, iter_arrays


class ParamVector:
    """One flat array holding every parameter, and the model's nested dict of views into it."""

    def __init__(self, params: Params, dtype=None):
        named = list(iter_arrays(params))
        dtype = np.dtype(dtype or named[0][1].dtype)
        self.names = [name for name, _ in named]
        self.paths = [tuple(int(k) if k.isdigit() else k for k in name.split(".")) for name in self.names]
        self.shapes = [a.shape for _, a in named]
        self.offsets = np.cumsum([0] + [a.size for _, a in named])
        self.flat = np.concatenate([a.ravel() for _, a in named]).astype(dtype)  # [n_params]
        self.params = self.unflatten(self.flat, params)
        # 1 where weight decay applies (2-D arrays: matrices and tables), 0 for gains and biases.
        self.decay_mask = np.concatenate([np.full(a.size, a.ndim >= 2, dtype=dtype) for _, a in named])

    @property
    def size(self) -> int:
        return int(self.flat.size)

    def unflatten(self, flat: np.ndarray, like: Params) -> Params:
        """A nested dict shaped like `like` whose arrays are views into `flat` (no copies)."""
        views = iter(flat[a:b].reshape(shape) for a, b, shape in zip(self.offsets[:-1], self.offsets[1:], self.shapes))

        def build(node):
            if isinstance(node, list):
                return [build(x) for x in node]
            if isinstance(node, np.ndarray):
                return next(views)
            return {key: build(value) for key, value in node.items()}

        return build(like)

    def flatten(self, grads: Params) -> np.ndarray:
        """A dict shaped like the params (gradients, say) as one flat vector, in the params' order."""
        arrays = []
        for path in self.paths:
            node: Any = grads  # a dict, down the path, then its array
            for key in path:
                node = node[key]
            arrays.append(node.ravel())
        return np.concatenate(arrays).astype(self.flat.dtype, copy=False)


def clip_grad_norm(grad: np.ndarray, max_norm: float) -> float:
    """Scale grad in place so that its L2 norm is at most max_norm; return the norm before clipping.

    As torch.nn.utils.clip_grad_norm_: the factor is max_norm / (norm + 1e-6), capped at 1, and it
    is applied even when it is 1 (so both give the same numbers bit for bit in spirit and in order).
    max_norm <= 0 or inf turns clipping off (the norm is still returned, for the records).
    """
    norm = float(np.sqrt(np.dot(grad, grad)))
    if 0 < max_norm < math.inf:
        grad *= grad.dtype.type(min(1.0, max_norm / (norm + 1e-6)))
    return norm


def learning_rate(step: int, *, lr: float, steps: int, warmup: int = 0, min_lr: float = 0.0) -> float:
    """Linear warm-up from lr/warmup to lr over `warmup` steps, then cosine decay to min_lr at the last step.

    step counts from 0. With warmup=0 and min_lr=lr the rate is constant.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, steps - 1 - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@dataclass
class AdamWState:
    m: np.ndarray  # [n_params], first moment (running mean of gradients)
    v: np.ndarray  # [n_params], second moment (running mean of squared gradients)
    t: int = 0  # steps taken: the bias corrections depend on it


class AdamW:
    """torch.optim.AdamW's update on a ParamVector (defaults as PyTorch's, weight decay 0.01)."""

    def __init__(
        self,
        vector: ParamVector,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        self.vector = vector
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.state = AdamWState(np.zeros_like(vector.flat), np.zeros_like(vector.flat))

    def step(self, grad: np.ndarray, lr: float) -> None:
        """One update of vector.flat (in place, so every view in the params dict sees it) from grad."""
        p, s, dtype = self.vector.flat, self.state, self.vector.flat.dtype.type
        s.t += 1
        if self.weight_decay:
            p *= 1.0 - dtype(lr * self.weight_decay) * self.vector.decay_mask
        s.m *= dtype(self.beta1)
        s.m += dtype(1.0 - self.beta1) * grad
        s.v *= dtype(self.beta2)
        s.v += dtype(1.0 - self.beta2) * grad * grad
        step_size = lr / (1.0 - self.beta1**s.t)
        denom = np.sqrt(s.v)
        denom /= dtype(math.sqrt(1.0 - self.beta2**s.t))
        denom += dtype(self.eps)
        p -= dtype(step_size) * s.m / denom
