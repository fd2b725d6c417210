"""Record steering on the GPT-2 fixture with torch hooks, for tests/core/test_steering.py (`make fixtures`).

Runs in the fixture venv (torch and transformers, FIXTURE_PINS); the app never imports torch. For the tiny
GPT-2 checkpoint in tests/fixtures/gpt2-tiny, in float64, it records the last position's logits with:
- a vector added to a block's input (hook_resid_pre) at some positions, attention recomputed;
- the same with every attention pattern from that block on held at the unsteered run's (frozen);
- a vector added to a block's output (hook_resid_post), frozen from the next block on;
- an SAE feature clamped at a block's input: x + (c - a_i(x)) W_dec[i], the SAE (a standard one, random
  weights, written with core's save_sae into tests/fixtures/steering-sae/) encoded in torch;
- the vector clamped at a block's input: x + (c - x.v / v.v) v (its component along v set to c units of v);
- greedy generation, steered at every step (no KV cache here: each step is the whole text so far, which
  core.generate.generate_steered's cache must equal): the tokens and every step's logits, unsteered, and steered with
  attention recomputed and frozen (frozen: before each steered step an unsteered pass over the same tokens
  records the patterns the steered pass then uses).
Hooks: a forward pre-hook on the block (its input is hook_resid_pre), a forward hook on the block (its
output is hook_resid_post), and transformers' eager attention function wrapped to keep or replace weights.

    python scripts/make_steering_fixtures.py
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from core.sae import SAE, SAEConfig, save_sae  # noqa: E402  (pure NumPy)

FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "steering.npz"
SAE_DIR = FIXTURES / "steering-sae"
N_TOKENS = 10
N_NEW = 8  # tokens generated greedily (prompt + N_NEW within the fixture's 32 positions)
gpt2 = transformers.models.gpt2.modeling_gpt2


class Attention:
    """transformers' GPT-2 eager attention, wrapped: records each layer's weights, or replaces them with
    recorded ones from layer `frozen_from` on (the output then is those weights times this run's values)."""

    def __init__(self):
        self.recorded: dict[int, torch.Tensor] = {}
        self.frozen_from: int | None = None
        self.original = gpt2.eager_attention_forward

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        out, weights = self.original(module, query, key, value, attention_mask, **kwargs)
        layer = module.layer_idx
        if self.frozen_from is None:
            self.recorded[layer] = weights.detach().clone()
            return out, weights
        if layer >= self.frozen_from:
            weights = self.recorded[layer]
            out = torch.matmul(weights, value).transpose(1, 2).contiguous()
        return out, weights


@torch.no_grad()
def main() -> None:
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / "gpt2-tiny", attn_implementation="eager").double().eval()
    d = model.config.n_embd
    rng = np.random.default_rng(34)
    ids = torch.tensor(rng.integers(0, model.config.vocab_size, size=N_TOKENS)[None])
    vector = rng.standard_normal(d)
    # an SAE on blocks.1.hook_resid_pre: standard, random, with b_dec applied to its input
    cfg = SAEConfig("standard", d, 4 * d, "blocks.1.hook_resid_pre", "gpt2-tiny", dtype="float64")
    sae = SAE(
        cfg,
        W_enc=rng.standard_normal((d, 4 * d)) * 0.3,
        b_enc=rng.standard_normal(4 * d) * 0.1 + 0.2,
        W_dec=rng.standard_normal((4 * d, d)) * 0.3,
        b_dec=rng.standard_normal(d) * 0.1,
    )
    if SAE_DIR.exists():
        shutil.rmtree(SAE_DIR)
    save_sae(sae, SAE_DIR)
    W_enc, b_enc, W_dec, b_dec = (torch.tensor(a) for a in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    attention = Attention()
    gpt2.eager_attention_forward = attention
    blocks = model.transformer.h
    data: dict[str, np.ndarray] = {"ids": ids[0].numpy(), "vector": vector}
    data["unsteered"] = model(ids).logits[0, -1].numpy()  # and every layer's weights recorded

    def add_before(layer, coefficient, rows):
        def hook(module, args, kwargs):
            x = args[0].clone()
            x[0, rows] += coefficient * torch.tensor(vector)
            return (x, *args[1:]), kwargs

        return blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)

    def add_after(layer, coefficient, rows):
        def hook(module, args, out):
            x = (out[0] if isinstance(out, tuple) else out).clone()
            x[0, rows] += coefficient * torch.tensor(vector)
            return (x, *out[1:]) if isinstance(out, tuple) else x

        return blocks[layer].register_forward_hook(hook)

    def clamp_before(layer, coefficient, feature):
        def hook(module, args, kwargs):
            x = args[0].clone()
            acts = torch.relu((x[0] - b_dec) @ W_enc + b_enc)[:, feature]  # [pos]
            x[0] += (coefficient - acts)[:, None] * W_dec[feature]
            return (x, *args[1:]), kwargs

        return blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)

    def clamp_vector_before(layer, coefficient):
        def hook(module, args, kwargs):
            x = args[0].clone()
            v = torch.tensor(vector)
            now = x[0] @ v / (v @ v)  # [pos]
            x[0] += (coefficient - now)[:, None] * v
            return (x, *args[1:]), kwargs

        return blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)

    cases = {
        "pre1_add": (lambda: add_before(1, 4.0, [3, 7, 9]), 1),
        "post0_add": (lambda: add_after(0, -3.0, list(range(N_TOKENS))), 1),
        "pre0_add": (lambda: add_before(0, 2.5, [9]), 0),
        "pre1_clamp": (lambda: clamp_before(1, 5.0, 7), 1),
        "pre1_vclamp": (lambda: clamp_vector_before(1, -2.0), 1),
    }
    for name, (install, frozen_from) in cases.items():
        for frozen in (False, True):
            attention.frozen_from = frozen_from if frozen else None
            handle = install()
            data[f"{name}/{'frozen' if frozen else 'recomputed'}"] = model(ids).logits[0, -1].numpy()
            handle.remove()
            if not frozen:  # the recomputed run recorded its own weights: put back the unsteered run's
                attention.frozen_from = None
                model(ids)

    # greedy generation, N_NEW tokens, each step the whole text so far
    def continuation(install=None, frozen_from=None):
        text, logits = ids.clone(), []
        for _ in range(N_NEW):
            attention.frozen_from = None
            if frozen_from is not None:
                model(text)  # the unsteered patterns over the same tokens
                attention.frozen_from = frozen_from
            handle = install() if install else None
            step = model(text).logits[0, -1]
            if handle:
                handle.remove()
            attention.frozen_from = None
            logits.append(step.numpy())
            text = torch.cat([text, step.argmax().reshape(1, 1)], dim=1)
        return text[0, N_TOKENS:].numpy(), np.stack(logits)

    data["gen/unsteered/tokens"], data["gen/unsteered/logits"] = continuation()
    generations = {
        "gen_pre1_add": (lambda: add_before(1, 4.0, slice(None)), 1),
        "gen_pre1_clamp": (lambda: clamp_before(1, 5.0, 7), 1),
    }
    for name, (install, frozen_from) in generations.items():
        for frozen in (False, True):
            key = f"{name}/{'frozen' if frozen else 'recomputed'}"
            data[f"{key}/tokens"], data[f"{key}/logits"] = continuation(install, frozen_from if frozen else None)
    gpt2.eager_attention_forward = attention.original
    data["meta_generator_sha256"] = np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())
    data["meta_torch_version"] = np.array(torch.__version__)
    data["meta_transformers_version"] = np.array(transformers.__version__)
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT.relative_to(ROOT)} and {SAE_DIR.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
