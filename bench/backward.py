"""Backward on every family: core/backprop.py against torch autograd, float32, the same threads.

For each family core runs (GPT-2, GPT-Neo with local layers, GPT-NeoX parallel, Llama with grouped-query
attention, Llama with one key/value head and biases, Mistral's window, Qwen2's sliding window, Qwen3's query/key
norms, BERT with segment ids), the test fixture's config.json (tests/fixtures/...) is widened to a model
worth timing (d_model 256, 8 heads of 32, 4 layers, MLP 4 x d_model or SwiGLU 688, vocabulary 8,192, the
family's own switches kept), drawn by transformers, saved once as a float32 checkpoint under bench/out/ and
read by core.checkpoints (memory-mapped), so both sides run the same numbers (the losses are compared).

One measurement, at 128 and 512 tokens (batch 1): the mean next-token cross-entropy and its gradients with
respect to every parameter, core's backprop.loss_and_grads against transformers' forward and
loss.backward(); each side's forward alone too, and so the backward as the difference. Median of --repeat
runs, the sides alternating, after one warm-up each; NumPy's BLAS (threadpoolctl) and torch
(torch.set_num_threads) at the same thread count. The machine's load is printed before and after: on a
shared machine the figures move with it, the ratio less.

    bench/.env/bin/python -m bench.backward [--tokens 128 512] [--repeat 5] [--threads 1] [--family llama-gqa ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import OUT, ROOT, blas_info, header, load_average, median, run_main, table, verdict
from core import backprop
from core.checkpoints import load_checkpoint

RATIO_BUDGET = 1.2  # core time / torch time, backward (issue 33)
FIXTURES = ROOT / "tests" / "fixtures"
WIDTH, HEADS, LAYERS, VOCAB, CTX = 256, 8, 4, 8192, 1024
FAMILIES = {
    "gpt2": "gpt2-tiny",
    "gpt-neo-local": "families/gpt-neo-local",
    "gpt-neox-parallel": "families/gpt-neox-parallel",
    "llama-gqa": "families/llama-gqa",
    "llama-mqa-bias": "families/llama-mqa-bias",
    "mistral-window": "families/mistral-window",
    "qwen2-sliding": "families/qwen2-sliding",
    "qwen3-qk-norm": "families/qwen3-qk-norm",
    "bert": "bert-tiny",
}


def widened(config: dict) -> dict:
    """The fixture's config.json at a size worth timing, every family switch as it was."""
    c = dict(config)
    kind = c["model_type"]
    if kind == "gpt2":
        return c | dict(n_embd=WIDTH, n_head=HEADS, n_layer=LAYERS, n_positions=CTX, n_inner=None, vocab_size=VOCAB)
    if kind == "gpt_neo":
        return c | dict(
            hidden_size=WIDTH,
            num_heads=HEADS,
            num_layers=LAYERS,
            attention_types=[[["global", "local"], LAYERS // 2]],
            attention_layers=["global", "local"] * (LAYERS // 2),
            window_size=256,
            max_position_embeddings=CTX,
            vocab_size=VOCAB,
        )
    c |= dict(hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS, vocab_size=VOCAB)
    c["max_position_embeddings"] = CTX
    if kind == "bert":
        return c | dict(intermediate_size=4 * WIDTH)
    if kind == "gpt_neox":
        return c | dict(intermediate_size=4 * WIDTH)
    kv = c.get("num_key_value_heads", c["num_attention_heads"])
    c |= dict(intermediate_size=688, head_dim=WIDTH // HEADS, num_key_value_heads=1 if kv == 1 else HEADS // 2)
    if c.get("sliding_window"):
        c["sliding_window"] = 256
    if "layer_types" in c:
        c["layer_types"] = (c["layer_types"] * LAYERS)[:LAYERS]
    return c


def checkpoint(name: str):
    """bench/out/backward-<name>: the widened model, written once by transformers, loaded by core."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    folder = OUT / f"backward-{name}"
    source = FIXTURES / FAMILIES[name]
    config = widened(json.loads((source / "config.json").read_text()))
    if not (folder / "config.json").exists() or json.loads((folder / "widened.json").read_text()) != config:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(**config)
        loader = AutoModel if config["model_type"] == "bert" else AutoModelForCausalLM
        model = loader.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        with torch.no_grad():  # norm gains are 1 at init: perturb every array so that each matters
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        model.save_pretrained(folder)
        shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")  # core reads a folder with one
        (folder / "widened.json").write_text(json.dumps(config))
    loader = AutoModel if config["model_type"] == "bert" else AutoModelForCausalLM
    model = loader.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    ckpt = load_checkpoint(folder)
    return model.train(), ckpt.params, ckpt.cfg


def measure(name: str, tokens: list[int], repeat: int) -> list[list]:
    model, params, cfg = checkpoint(name)
    model.config.use_cache = False
    rng = np.random.default_rng(0)
    rows = []
    for n in tokens:
        rows.append(_row(name, model, params, cfg, rng.integers(0, cfg.d_vocab, (1, n + 1)), repeat))
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
    return rows


def _row(name: str, model, params, cfg, ids: np.ndarray, repeat: int) -> list:
    import torch

    bert = cfg.block_type == "post_norm"
    x, y = ids[:, :-1], ids[:, 1:]
    tx, ty = torch.from_numpy(x), torch.from_numpy(y).reshape(-1)

    def torch_loss():
        if bert:
            hidden = model(input_ids=tx).last_hidden_state
            logits = hidden @ model.get_input_embeddings().weight.T
        else:
            logits = model(input_ids=tx).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ty)

    def torch_forward():
        with torch.no_grad():
            return torch_loss().item()

    def torch_both():
        model.zero_grad(set_to_none=True)
        loss = torch_loss()
        loss.backward()
        return loss.item()

    def core_forward():
        return backprop.loss(params, cfg, x, y)

    def core_both():
        return backprop.loss_and_grads(params, cfg, x, y)[0]

    gap = abs(core_both() - torch_both())
    sides = {
        "core_forward": core_forward,
        "core_both": core_both,
        "torch_forward": torch_forward,
        "torch_both": torch_both,
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeat):
        for key, fn in sides.items():  # alternating, so that a change of load falls on both sides alike
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    t = {k: median(v) for k, v in times.items()}
    core_bwd, torch_bwd = t["core_both"] - t["core_forward"], t["torch_both"] - t["torch_forward"]
    ratio = core_bwd / torch_bwd
    return [
        name,
        x.shape[1],
        f"{1e3 * t['core_both']:.1f}",
        f"{1e3 * t['torch_both']:.1f}",
        f"{t['core_both'] / t['torch_both']:.2f}",
        f"{1e3 * core_bwd:.1f}",
        f"{1e3 * torch_bwd:.1f}",
        f"{ratio:.2f}",
        verdict(ratio <= RATIO_BUDGET),
        f"{gap:.1e}",
    ]


def main(argv: list[str]) -> int:
    import torch

    p = argparse.ArgumentParser(prog="bench.backward", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (the same for both)")
    p.add_argument("--family", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    args = p.parse_args(argv)
    header("Backward on every family: core/backprop.py vs torch autograd (float32)")
    threadpool_limits(args.threads, user_api="blas")
    torch.set_num_threads(args.threads)
    print(
        f"threads: NumPy BLAS {blas_info()['blas_threads']}, torch {torch.get_num_threads()} (torch {torch.__version__}); "
        f"widened to d_model {WIDTH}, {HEADS} heads, {LAYERS} layers, vocabulary {VOCAB}; batch 1; median of "
        f"{args.repeat}\n",
        flush=True,
    )
    rows = []
    for name in args.family:
        rows += measure(name, args.tokens, args.repeat)
    print()
    print(
        table(
            f"Loss and every gradient, float32, {args.threads} thread(s): core vs torch (ms); backward = both − forward",
            [
                "family",
                "tokens",
                "core fwd+bwd",
                "torch fwd+bwd",
                "ratio",
                "core bwd",
                "torch bwd",
                f"bwd ratio (≤ {RATIO_BUDGET})",
                "budget",
                "loss gap (abs)",
            ],
            rows,
        )
    )
    print(f"load average at the end: {load_average()}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
