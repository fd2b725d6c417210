"""Core vs PyTorch: one forward pass of GPT-2-small-shaped weights, our NumPy core against
Hugging Face transformers' GPT2LMHeadModel on the same weights and the same number of threads,
under each OpenBLAS kernel in turn (bench.common.KERNELS: the CPU's own, and Haswell's).

The weights are random, written once as a local Hugging Face checkpoint (safetensors) by
transformers and read into core by core.checkpoints, so both sides run exactly the same numbers
(the logits are compared to prove it). Also measured in the same run: the machine's float32 GEMM
rate (a large np.matmul on the same threads), and the fraction of it each forward pass reaches, with
the forward's FLOPs counted analytically (bench.common.forward_flops: attention's causal half). Then,
stage by stage (layer norm, the QKV projection, attention, W_O, the MLP's two products and its GELU,
the unembedding), each side's time for one layer's stage on the same input, and its fraction of the
GEMM rate: where each side's time goes.

    bench/.env/bin/python -m bench.core_vs_torch [--tokens 128 512 1024] [--repeat 5] [--kernels native Haswell]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import (
    KERNELS,
    OUT,
    Gemm,
    blas_info,
    forward_flops,
    header,
    load_average,
    median,
    run_main,
    table,
    timed,
    under_kernels,
    verdict,
    visible_pairs,
    wall_and_cpu,
    without_option,
)
from core import PRESETS, TransformerConfig, run_with_cache

# 12 layers, 12 heads, d_model 768, d_vocab 50257, n_ctx 1024; GPT-2's lm_head has no bias, as the
# checkpoint reader says (core/checkpoints/gpt2.py)
CFG = dataclasses.replace(PRESETS["gpt2-small"], unembed_bias=False)
CHECKPOINT = OUT / "gpt2-small-random"
RATIO_BUDGET = 1.0  # core time / torch time, logits only
CAPTURE_BUDGET = 1.1  # core time / torch time capturing every activation, at 512 tokens and more
GEMM_FRACTION_BUDGET = 0.70  # of the measured float32 GEMM rate, at 1024 tokens


def stage_flops(cfg: TransformerConfig, n: int) -> dict[str, int]:
    """Floating-point operations (2 per multiply-add) of one layer's matrix-product stages, and of the
    unembedding; attention over the causal half only (bench.common.forward_flops says why)."""
    d, dm, hd = cfg.d_model, cfg.d_mlp, cfg.n_heads * cfg.d_head
    return {
        "qkv": 2 * n * d * 3 * hd,
        "attention": 2 * visible_pairs(n) * hd * 2,
        "W_O": 2 * n * hd * d,
        "mlp_in": 2 * n * d * dm,
        "mlp_out": 2 * n * dm * d,
        "unembed": 2 * n * d * cfg.d_vocab,
    }


def write_checkpoint() -> None:
    """A random GPT-2-small as a Hugging Face folder: config.json, model.safetensors, tokenizer.json."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import GPT2Config, GPT2LMHeadModel

    if (CHECKPOINT / "model.safetensors").is_file():
        return
    torch.manual_seed(0)
    hf_cfg = GPT2Config(
        n_embd=CFG.d_model, n_layer=CFG.n_layers, n_head=CFG.n_heads, vocab_size=CFG.d_vocab, n_positions=CFG.n_ctx
    )
    model = GPT2LMHeadModel(hf_cfg)
    with torch.no_grad():  # HF's init leaves biases 0 and gains 1: perturb them so every array matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(CHECKPOINT, safe_serialization=True)
    # core's loader wants a tokenizer.json beside the weights; the benchmark feeds ids directly.
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(CHECKPOINT / "tokenizer.json"))


def load_core_params():
    from core.checkpoints import load_params, read_spec

    spec = read_spec(CHECKPOINT)
    assert spec.cfg == CFG, f"checkpoint config {spec.cfg} differs from {CFG}"
    return load_params(spec)


STAGES = [  # (name, what it is, times per forward pass)
    ("layer norm", "ln_1 (ln_2 and ln_f alike)", 2 * CFG.n_layers + 1),
    ("qkv", "x @ W_QKV + b, every head", CFG.n_layers),
    ("attention", "QKᵀ, scale, mask, softmax, · V (causal)", CFG.n_layers),
    ("W_O", "z @ W_O + b", CFG.n_layers),
    ("mlp_in", "x @ W_in + b", CFG.n_layers),
    ("gelu", "GELU (tanh form)", CFG.n_layers),
    ("mlp_out", "x @ W_out + b", CFG.n_layers),
    ("unembed", "x @ W_Eᵀ", 1),
]


# ---------------------------------------------------------------------------- stage by stage


def stage_times(params, model, n: int, repeat: int) -> dict[str, tuple[float, float]]:
    """{stage: (core seconds, torch seconds)} for layer 0's stages on one input of n tokens, the fastest of
    the rounds (set against the fastest GEMM), the sides alternating. Core runs its own functions with the team a forward pass of n tokens gets
    (core/threads.py); torch runs the model's own modules."""
    import torch
    import torch.nn.functional as F

    from core.attention import scaled_dot_product_attention, split_heads
    from core.functional import gelu_new
    from core.model import linear, norm
    from core.threads import team_for

    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, CFG.d_model), dtype=np.float32)
    b0, blk = params["blocks"][0], model.transformer.h[0]
    W_E = params["embed"]["W_E"]
    H, dh = CFG.n_heads, CFG.d_head
    qkv = x @ b0["attn"]["W_QKV"]
    h_mlp = x @ b0["mlp"]["W_in"]
    xt, qkvt, ht = (torch.from_numpy(a)[None] for a in (x, qkv, h_mlp))
    qt, kt, vt = (m.view(1, n, H, dh).transpose(1, 2) for m in qkvt.split(H * dh, dim=-1))
    z = np.empty((n, H * dh), np.float32)
    zt = torch.from_numpy(z)[None]

    def core_stages(team) -> dict:
        q, k, v = (split_heads(m, H) for m in np.split(qkv, 3, axis=-1))
        out = {
            name: np.empty((n, w), np.float32)
            for name, w in (("qkv", 3 * H * dh), ("d", CFG.d_model), ("mlp", CFG.d_mlp), ("vocab", CFG.d_vocab))
        }
        zh = z.reshape(n, H, dh).swapaxes(0, 1)

        def unembed(c):
            np.matmul(x, W_E.T[:, c], out=out["vocab"][:, c])

        return {
            "layer norm": lambda: norm(x, b0["ln1"], CFG, team),
            "qkv": lambda: linear(x, b0["attn"]["W_QKV"], b0["attn"]["b_QKV"], out["qkv"], team),
            "attention": lambda: scaled_dot_product_attention(q, k, v, causal=True, keep=False, out=zh, team=team),
            "W_O": lambda: linear(z, b0["attn"]["W_O"], b0["attn"]["b_O"], out["d"], team),
            "mlp_in": lambda: linear(x, b0["mlp"]["W_in"], b0["mlp"]["b_in"], out["mlp"], team),
            "gelu": lambda: team.rows(lambda s: gelu_new(h_mlp[s], out=out["mlp"][s]), n),
            "mlp_out": lambda: linear(h_mlp, b0["mlp"]["W_out"], b0["mlp"]["b_out"], out["d"], team),
            "unembed": lambda: team.each(unembed, team.ranges(CFG.d_vocab, smallest=1024)),
        }

    torch_stages = {
        "layer norm": lambda: blk.ln_1(xt),
        "qkv": lambda: blk.attn.c_attn(xt),
        "attention": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True),
        "W_O": lambda: blk.attn.c_proj(zt),
        "mlp_in": lambda: blk.mlp.c_fc(xt),
        "gelu": lambda: blk.mlp.act(ht),
        "mlp_out": lambda: blk.mlp.c_proj(ht),
        "unembed": lambda: model.lm_head(xt),
    }
    times = {}
    with torch.inference_mode():
        for name, _, _ in STAGES:
            c, t = [], []
            for _ in range(repeat + 1):  # the first round is a warm-up
                with team_for(n) as team:
                    fn = core_stages(team)[name]
                    c.append(timed(fn, repeat=1, warmup=0)[0])
                t.append(timed(torch_stages[name], repeat=1, warmup=0)[0])
            times[name] = (min(c[1:]), min(t[1:]))
    return times


def stage_table(n: int, times: dict, rate: float, core_total: float, torch_total: float) -> str:
    flops = stage_flops(CFG, n)
    rows, core_sum, torch_sum = [], 0.0, 0.0
    for name, what, count in STAGES:
        c, t = times[name]
        core_sum, torch_sum = core_sum + c * count, torch_sum + t * count
        f = flops.get(name)
        rows.append(
            [
                name,
                what,
                count,
                f"{c * count * 1e3:.1f}",
                f"{t * count * 1e3:.1f}",
                f"{c / t:.2f}",
                f"{f / c / rate:.0%}" if f else "-",
                f"{f / t / rate:.0%}" if f else "-",
            ]
        )
    rows.append(
        [
            "the rest",
            "embedding, residual adds, Python, allocation",
            "",
            f"{(core_total - core_sum) * 1e3:.1f}",
            f"{(torch_total - torch_sum) * 1e3:.1f}",
            "",
            "",
            "",
        ]
    )
    rows.append(
        [
            "forward pass",
            "the fastest of the rounds above, logits only",
            "",
            f"{core_total * 1e3:.1f}",
            f"{torch_total * 1e3:.1f}",
            f"{core_total / torch_total:.2f}",
            "",
            "",
        ]
    )
    return table(
        f"Where the time goes at {n} tokens: one layer's stage (layer 0, the same input both sides) x its "
        f"count per pass, ms (fastest of the rounds); share of the {rate / 1e9:.0f} GFLOP/s GEMM rate",
        ["stage", "what", "per pass", "core ms", "torch ms", "core / torch", "core % of GEMM", "torch % of GEMM"],
        rows,
    )


# ---------------------------------------------------------------------------- one kernel


def measure(args) -> dict:
    """Everything, under the kernel this process's OpenBLAS runs; prints its tables, returns its figures."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub
    import torch
    import transformers
    from transformers import GPT2LMHeadModel

    transformers.logging.disable_progress_bar()
    header("Core vs PyTorch: GPT-2-small forward pass, float32")
    threads = args.threads or blas_info()["blas_threads"]
    threadpool_limits(threads, user_api="blas")
    torch.set_num_threads(threads)  # the same thread count on both sides
    write_checkpoint()
    params = load_core_params()
    model = GPT2LMHeadModel.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    print(
        f"threads: NumPy BLAS {blas_info()['blas_threads']}, torch {torch.get_num_threads()} (torch {torch.__version__}, "
        f"attention {model.config._attn_implementation})\n"
    )

    rng = np.random.default_rng(1)
    ids = rng.integers(0, CFG.d_vocab, size=max(args.tokens))

    def core_forward(n: int, names=()):
        # names=(): keep no activations, as the torch peer keeps none (a full cache is a separate row)
        return run_with_cache(params, CFG, ids[:n], names=names)[0]

    def torch_forward(n: int, **kw):
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids[None, :n]), use_cache=False, **kw).logits

    # Same weights, same numbers: the two logits agree to float32 rounding.
    n0 = min(args.tokens)
    diff = float(np.abs(core_forward(n0) - torch_forward(n0).numpy()[0]).max())
    print(f"max |logits core - logits torch| at {n0} tokens: {diff:.2e}\n")
    if not diff < 1e-2:
        raise SystemExit("the two models disagree: the comparison below would be meaningless")

    gemm = Gemm()

    rows, cache_rows, results, stage_tables = [], [], {}, []
    for n in args.tokens:
        # Alternate the sides (and the GEMM reference) so drifting machine load hits all alike.
        core_t, torch_t, rates = [], [], []
        core_forward(n), torch_forward(n)  # warm-up
        for _ in range(args.repeat):
            rates.append(gemm.measure())
            core_t.append(wall_and_cpu(lambda n=n: core_forward(n)))
            torch_t.append(wall_and_cpu(lambda n=n: torch_forward(n)))
        c, t = median([w for w, _ in core_t]), median([w for w, _ in torch_t])
        c_cpu, t_cpu = median([u for _, u in core_t]), median([u for _, u in torch_t])
        # The GEMM share, best against best: on a shared machine a single product swings with the load at
        # that instant, so each side's fastest pass is set against the fastest product of the same rounds.
        rate, c_best, t_best = max(rates), min(w for w, _ in core_t), min(w for w, _ in torch_t)
        flops = forward_flops(CFG, n)
        rows.append(
            [
                n,
                f"{c * 1e3:.0f}",
                f"{t * 1e3:.0f}",
                f"{c / t:.2f}",
                f"{c_cpu / t_cpu:.2f}",
                f"{flops / 1e9:.1f}",
                f"{rate / 1e9:.1f}",
                f"{flops / c_best / rate:.0%}",
                f"{flops / t_best / rate:.0%}",
            ]
        )
        print(
            f"  {n} tokens: core {c * 1e3:.0f} ms, torch {t * 1e3:.0f} ms (CPU {c_cpu:.2f} s vs {t_cpu:.2f} s)",
            flush=True,
        )

        # Capturing every activation (the explorer's use) vs torch returning attentions and hidden states,
        # alternating too.
        core_all, torch_all = [], []
        core_forward(n, names=None)
        for _ in range(max(2, args.repeat // 2 + 1)):
            core_all.append(timed(lambda n=n: core_forward(n, names=None), repeat=1, warmup=0)[0])
            torch_all.append(
                timed(
                    lambda n=n: torch_forward(n, output_attentions=True, output_hidden_states=True), repeat=1, warmup=0
                )[0]
            )
        ca, ta = median(core_all), median(torch_all)
        cache_rows.append([n, f"{ca * 1e3:.0f}", f"{ta * 1e3:.0f}", f"{ca / ta:.2f}"])
        results[n] = {
            "core_s": c,
            "torch_s": t,
            "ratio": c / t,
            "cpu_ratio": c_cpu / t_cpu,
            "gflop": flops / 1e9,
            "gemm_gflops": rate / 1e9,
            "core_gemm_fraction": flops / c_best / rate,
            "torch_gemm_fraction": flops / t_best / rate,
            "capture_core_s": ca,
            "capture_torch_s": ta,
            "capture_ratio": ca / ta,
        }
        if n in args.stage_tokens:
            times = stage_times(params, model, n, args.repeat)
            results[n]["stages"] = {name: {"core_s": cs, "torch_s": ts} for name, (cs, ts) in times.items()}
            stage_tables.append(stage_table(n, times, rate, c_best, t_best))

    print()
    print(
        table(
            f"Forward pass, logits only (median of {args.repeat}, after a warm-up; GFLOP counts the causal "
            f"half of attention; % of GEMM: each side's fastest pass against the fastest GEMM of the rounds)",
            [
                "tokens",
                "core ms",
                "torch ms",
                "core / torch",
                "(CPU time)",
                "GFLOP",
                "GEMM GFLOP/s (best)",
                "core % of GEMM",
                "torch % of GEMM",
            ],
            rows,
        )
    )
    print(
        table(
            "Forward pass capturing every activation (core: full cache; torch: output_attentions "
            "+ output_hidden_states)",
            ["tokens", "core ms", "torch ms", "core / torch"],
            cache_rows,
        )
    )
    for text in stage_tables:
        print(text)
    print(budgets(results, blas_info()["kernel"]))
    print(f"load average at the end: {load_average()}\n")
    return {"kernel": blas_info()["kernel"], "threads": threads, "by_tokens": results}


def budgets(results: dict, kernel: str) -> str:
    """The issue's budgets, read off one kernel's figures."""
    n_max = max(results)
    worst = max(r["ratio"] for r in results.values())
    long = [n for n in results if n >= 512]
    capture = max(results[n]["capture_ratio"] for n in long) if long else None
    frac = results[n_max]["core_gemm_fraction"]
    return "\n".join(
        [
            f"[{kernel}] budget logits-only core/torch <= {RATIO_BUDGET}: worst {worst:.2f} -> "
            f"{verdict(worst <= RATIO_BUDGET)}",
            f"[{kernel}] budget every activation core/torch <= {CAPTURE_BUDGET} at 512+ tokens: "
            + (f"worst {capture:.2f} -> {verdict(capture <= CAPTURE_BUDGET)}" if long else "not measured"),
            f"[{kernel}] budget core >= {GEMM_FRACTION_BUDGET:.0%} of GEMM rate at {n_max} tokens: {frac:.0%} -> "
            f"{verdict(frac >= GEMM_FRACTION_BUDGET)}",
            "",
        ]
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads for both sides (0: NumPy's BLAS default)")
    ap.add_argument(
        "--stage-tokens",
        type=int,
        nargs="*",
        default=None,
        help="token counts to profile stage by stage (default: the largest of --tokens)",
    )
    ap.add_argument(
        "--kernels",
        nargs="+",
        default=list(KERNELS),
        help="OpenBLAS kernels, each in a process of its own ('native': the CPU's own)",
    )
    ap.add_argument("--child-json", help=argparse.SUPPRESS)  # one kernel's run, started by under_kernels
    args = ap.parse_args(argv)
    if args.stage_tokens is None:
        args.stage_tokens = [max(args.tokens)]
    if args.child_json:
        with open(args.child_json, "w") as f:
            json.dump(measure(args), f)
        return 0
    runs = under_kernels("core_vs_torch", without_option(argv, "--kernels"), args.kernels)
    if not runs:
        return 1
    rows = []
    for kernel, run in runs.items():
        for n, r in sorted(run["by_tokens"].items(), key=lambda kv: int(kv[0])):
            rows.append(
                [
                    f"{kernel} ({run['kernel']})",
                    n,
                    f"{r['core_s'] * 1e3:.0f}",
                    f"{r['torch_s'] * 1e3:.0f}",
                    f"{r['ratio']:.2f}",
                    f"{r['capture_ratio']:.2f}",
                    f"{r['core_gemm_fraction']:.0%}",
                    f"{r['torch_gemm_fraction']:.0%}",
                ]
            )
    print(
        table(
            "Both kernels side by side (logits only; every activation: core / torch)",
            [
                "kernel",
                "tokens",
                "core ms",
                "torch ms",
                "core / torch",
                "every activation",
                "core % of GEMM",
                "torch % of GEMM",
            ],
            rows,
        )
    )
    for run in runs.values():
        print(budgets({int(n): r for n, r in run["by_tokens"].items()}, run["kernel"]))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "core_vs_torch.json").write_text(json.dumps({"by_kernel": runs}, indent=1))
    return 0 if len(runs) == len(args.kernels) else 1


if __name__ == "__main__":
    run_main(main)
