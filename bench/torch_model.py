"""The decoder core/backprop.py trains, written in PyTorch with autograd: the independent peer.

Used by scripts/make_training_fixtures.py (the losses and weights tests/core/test_training_parity.py
holds core's trainer to) and by bench/training.py (steps per second, side by side). It takes core's
own nested parameter dict (TransformerLens names, W_QKV fused [d_model, 3 · n_heads · d_head]) as
torch leaf tensors, so both sides start from the same numbers; the forward pass is written with
PyTorch's own building blocks (F.layer_norm, F.scaled_dot_product_attention, F.gelu, F.cross_entropy)
and differentiated by autograd, not by anything from core.

Needs torch, so it is imported only from the fixture and benchmark environments.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

ACTS = {"gelu_new": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "relu": F.relu}


def to_torch(params, dtype=None):
    """core's nested dict of arrays -> the same structure of leaf tensors that require grad."""
    if isinstance(params, list):
        return [to_torch(p, dtype) for p in params]
    if isinstance(params, np.ndarray):
        t = torch.tensor(params, dtype=dtype)
        return t.requires_grad_(True)
    return {k: to_torch(v, dtype) for k, v in params.items()}


def leaves(params) -> list[torch.Tensor]:
    """The tensors in core's iteration order (core.model.iter_arrays)."""
    if isinstance(params, list):
        return [t for p in params for t in leaves(p)]
    if isinstance(params, torch.Tensor):
        return [params]
    return [t for v in params.values() for t in leaves(v)]


def _ln(x, ln, eps):
    return F.layer_norm(x, x.shape[-1:], ln.get("w"), ln.get("b"), eps)


def _rotary(x, base=10000.0):  # x [batch, heads, pos, d_head]; pairs (2i, 2i+1), as core.positions
    n_pos, d_head = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def _sinusoidal(n_pos, d, dtype):
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float64)[None, :]
    ang = pos / (10000 ** (i / d))
    pe = torch.zeros(n_pos, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(ang), torch.cos(ang)
    return pe.to(dtype)


def logits(p, cfg, tokens: torch.Tensor) -> torch.Tensor:
    """tokens [batch, pos] -> logits [batch, pos, d_vocab], for a pre-norm decoder described by cfg."""
    B, T = tokens.shape
    H, dh = cfg.n_heads, cfg.d_head
    W_E = p["embed"]["W_E"]
    x = W_E[tokens]
    if cfg.positional_embedding_type == "learned":
        x = x + p["pos_embed"]["W_pos"][:T]
    elif cfg.positional_embedding_type == "sinusoidal":
        x = x + _sinusoidal(T, cfg.d_model, x.dtype)
    divisor = (math.sqrt(dh) if cfg.use_attn_scale else 1.0) * cfg.attn_temperature
    for block in p["blocks"]:
        a = block["attn"]
        qkv = _ln(x, block["ln1"], cfg.eps) @ a["W_QKV"]
        if "b_QKV" in a:
            qkv = qkv + a["b_QKV"]
        q, k, v = (m.view(B, T, H, dh).transpose(1, 2) for m in qkv.split(H * dh, dim=-1))
        if cfg.positional_embedding_type == "rotary":
            q, k = _rotary(q), _rotary(k)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal, scale=1.0 / divisor)
        out = z.transpose(1, 2).reshape(B, T, H * dh) @ a["W_O"]
        x = x + (out + a["b_O"] if "b_O" in a else out)
        if not cfg.attn_only:
            m = block["mlp"]
            h = _ln(x, block["ln2"], cfg.eps) @ m["W_in"]
            h = ACTS[cfg.act_fn](h + m["b_in"] if "b_in" in m else h) @ m["W_out"]
            x = x + (h + m["b_out"] if "b_out" in m else h)
    x = _ln(x, p["ln_final"], cfg.eps)
    if "unembed" in p:
        out = x @ p["unembed"]["W_U"]
        return out + p["unembed"]["b_U"] if "b_U" in p["unembed"] else out
    return x @ W_E.T


def loss(p, cfg, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = logits(p, cfg, tokens)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))


def make_optimizer(p, *, lr: float, betas, eps: float, weight_decay: float, **kwargs) -> torch.optim.AdamW:
    """AdamW with core's grouping: decay on 2-D arrays only (core.optim.ParamVector.decay_mask)."""
    ts = leaves(p)
    groups = [
        {"params": [t for t in ts if t.ndim >= 2], "weight_decay": weight_decay},
        {"params": [t for t in ts if t.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps, **kwargs)


def train_step(p, cfg, opt, tokens, targets, lr: float, max_norm: float, phases: dict | None = None) -> float:
    """One step: loss, backward, clip by global norm, AdamW at this learning rate. Returns the loss.
    phases: if given, each phase's seconds are added to it ("forward", "backward", "optimizer")."""
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        if phases is not None:
            now = time.perf_counter()
            phases[name] = phases.get(name, 0.0) + now - clock
            clock = now

    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    value = loss(p, cfg, tokens, targets)
    lap("forward")
    value.backward()
    lap("backward")
    if 0 < max_norm < math.inf:
        torch.nn.utils.clip_grad_norm_(leaves(p), max_norm)
    opt.step()
    lap("optimizer")
    return float(value.detach())
