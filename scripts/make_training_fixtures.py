"""Record what PyTorch does, for core's trainer and its trained checkpoints to be held to.

Like scripts/make_parity_fixtures.py this runs in an environment with torch (`make fixtures` makes
one); the tests that read its output need no torch. It writes, under tests/fixtures/:

    training_parity.npz   for each case (a small decoder, float64 or float32): the initial weights,
                          50 batches, and what torch.autograd + torch.optim.AdamW made of them, with
                          gradient clipping by global norm and the warm-up + cosine schedule:
                          the loss at every step, the first step's gradients, the final weights.
                          The model is written with PyTorch's own layers (bench/torch_model.py); only
                          the numbers (weights, batches, hyper-parameters) are shared with core.
    trained_logits.npz    every shipped model in core/trained/ opened by transformers as it is
                          (GPT2LMHeadModel.from_pretrained, AutoTokenizer.from_pretrained): token ids
                          and logits of a few texts.

    /tmp/torchenv/bin/python scripts/make_training_fixtures.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core (pure NumPy: the initial weights and batches) and bench.torch_model

from bench import torch_model as tm  # noqa: E402
from core import TransformerConfig, init_params  # noqa: E402
from core.model import iter_arrays  # noqa: E402
from core.optim import learning_rate  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
TRAINED = ROOT / "core" / "trained"
STEPS = 50

# name -> (config, dtype, batch, seq_len, optimiser settings). Between them every switch training supports.
OPT = dict(lr=3e-3, min_lr=3e-4, warmup=5, weight_decay=0.1, grad_clip=0.5, betas=(0.9, 0.999), eps=1e-8)
CASES = {
    "attn_only_f64": (
        dict(d_model=16, n_layers=2, n_heads=4, d_vocab=16, n_ctx=12, attn_only=True),
        "float64",
        8,
        12,
        OPT | dict(grad_clip=1.0),
    ),
    "mlp_untied_f64": (
        dict(
            d_model=12, n_layers=2, n_heads=3, d_vocab=11, n_ctx=10, d_mlp=20, act_fn="gelu_new", tied_embeddings=False
        ),
        "float64",
        6,
        10,
        OPT,
    ),
    "rotary_lnpre_relu_f64": (
        dict(
            d_model=16,
            n_layers=2,
            n_heads=2,
            d_vocab=9,
            n_ctx=8,
            d_mlp=24,
            act_fn="relu",
            normalization_type="LNPre",
            positional_embedding_type="rotary",
            bias=False,
            attn_temperature=1.5,
        ),
        "float64",
        6,
        8,
        OPT | dict(grad_clip=0.0),
    ),
    "sinusoidal_bidirectional_f64": (
        dict(
            d_model=16,
            n_layers=1,
            n_heads=4,
            d_vocab=7,
            n_ctx=8,
            d_mlp=32,
            positional_embedding_type="sinusoidal",
            attention_dir="bidirectional",
            use_attn_scale=False,
        ),
        "float64",
        5,
        8,
        OPT | dict(warmup=0),
    ),
    # float32 cases have no biases: the key bias's gradient is exactly 0 in exact arithmetic (adding one
    # number to every score of a row leaves the softmax unchanged), so in float32 it is rounding noise,
    # which AdamW divides by its own tiny RMS into steps of up to lr, differently in each implementation.
    # (In float64 the noise, ~1e-17, is far below AdamW's eps, so the float64 cases keep their biases.)
    "mlp_untied_f32": (
        dict(
            d_model=12,
            n_layers=2,
            n_heads=3,
            d_vocab=11,
            n_ctx=10,
            d_mlp=20,
            act_fn="gelu_new",
            tied_embeddings=False,
            bias=False,
        ),
        "float32",
        6,
        10,
        OPT | dict(grad_clip=1.0),
    ),
    "gelu_erf_f32": (
        dict(d_model=16, n_layers=2, n_heads=2, d_vocab=9, n_ctx=8, d_mlp=32, act_fn="gelu", bias=False),
        "float32",
        6,
        8,
        OPT | dict(grad_clip=1.0),
    ),
}


def get(tree, name):
    for key in name.split("."):
        tree = tree[int(key)] if key.isdigit() else tree[key]
    return tree


def training_case(name: str, seed: int) -> dict[str, np.ndarray]:
    cfg_kwargs, dtype, batch, seq_len, opt = CASES[name]
    cfg = TransformerConfig(**cfg_kwargs)
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed, dtype=np.float64)
    for _, a in iter_arrays(params):  # gains and biases off their initial 1 and 0, so every term matters
        a += rng.normal(0.0, 0.05, a.shape)
    params = {k: v for k, v in params.items()}
    batches = rng.integers(0, cfg.d_vocab, size=(STEPS, batch, seq_len + 1))
    np_params = [(n, a.astype(dtype)) for n, a in iter_arrays(params)]

    torch_dtype = torch.float64 if dtype == "float64" else torch.float32
    p = tm.to_torch(params, torch_dtype)  # the same numbers, rounded to float32 the same way NumPy rounds
    optimizer = tm.make_optimizer(p, lr=opt["lr"], betas=opt["betas"], eps=opt["eps"], weight_decay=opt["weight_decay"])
    losses, grad_norms = [], []
    out: dict[str, np.ndarray] = {}
    for step in range(STEPS):
        tokens = torch.tensor(batches[step])
        lr = learning_rate(step, lr=opt["lr"], steps=STEPS, warmup=opt["warmup"], min_lr=opt["min_lr"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss = tm.loss(p, cfg, tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        leaves = tm.leaves(p)
        norms = torch.stack([torch.linalg.vector_norm(t.grad) for t in leaves])
        grad_norms.append(float(torch.linalg.vector_norm(norms)))
        if step == 0:
            for (n, _), t in zip(np_params, leaves):
                out[f"{name}/grad0/{n}"] = t.grad.detach().numpy().copy()
        if opt["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(leaves, opt["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    for (n, a), t in zip(np_params, tm.leaves(p)):
        out[f"{name}/initial/{n}"] = a
        out[f"{name}/final/{n}"] = t.detach().numpy().copy()
    meta = {
        "cfg": cfg_kwargs,
        "dtype": dtype,
        "steps": STEPS,
        "opt": opt,
        "clipped_steps": int(sum(g > opt["grad_clip"] for g in grad_norms)) if opt["grad_clip"] > 0 else 0,
    }
    out[f"{name}/meta"] = np.array(json.dumps(meta))
    out[f"{name}/batches"] = batches.astype(np.uint8)  # token ids < 256: a quarter of int64's bytes
    out[f"{name}/losses"] = np.array(losses)
    out[f"{name}/grad_norms"] = np.array(grad_norms)
    print(f"{name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, clipped at {meta['clipped_steps']} of {STEPS} steps")
    return out


# Texts each shipped model is run on (characters of its vocabulary, or ones its [UNK] absorbs).
TRAINED_TEXTS = {
    "induction": ["Ali makan nasi lemak. Ali makan nasi lemak.", "the cat sat on the mat. the cat sat on the mat."],
    "nasi-lemak": ["nasi ", "makan nasi lemak"],  # within its context of 16
    "python-docs": [
        "The for statement is used to iterate over the elements of a sequence.",
        "def f(x):\n    return x + 1  # café",
    ],
    "python-docs-induction": [
        "The for statement is used to iterate over the elements of a sequence. "
        "The for statement is used to iterate over the elements of a sequence.",
        "Ali makan nasi lemak di kedai. Ali makan nasi lemak di kedai.",
    ],
}


@torch.no_grad()
def trained_logits() -> dict[str, np.ndarray]:
    from transformers import AutoTokenizer, GPT2LMHeadModel

    out: dict[str, np.ndarray] = {}
    for folder in sorted(p for p in TRAINED.iterdir() if (p / "config.json").is_file()):
        model = GPT2LMHeadModel.from_pretrained(str(folder), attn_implementation="eager").eval()
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        for i, text in enumerate(TRAINED_TEXTS[folder.name]):
            ids = tokenizer(text)["input_ids"][: model.config.n_positions]
            key = f"{folder.name}/case{i}"
            out[key + "_text"] = np.array(text)
            out[key + "_ids"] = np.array(ids, dtype=np.int64)
            out[key + "_logits"] = model(torch.tensor([ids])).logits[0].numpy()
        print(f"{folder.name}: {len(TRAINED_TEXTS[folder.name])} texts")
    return out


def main() -> None:
    torch.manual_seed(0)
    refs: dict[str, np.ndarray] = {}
    for seed, name in enumerate(CASES):
        refs |= training_case(name, seed)
    np.savez_compressed(FIXTURES / "training_parity.npz", **refs)
    np.savez_compressed(FIXTURES / "trained_logits.npz", **trained_logits())
    for path in (FIXTURES / "training_parity.npz", FIXTURES / "trained_logits.npz"):
        print(f"{path.stat().st_size:>9,d}  {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
