"""Core vs PyTorch: one forward pass of GPT-2-small-shaped weights, our NumPy core against
Hugging Face transformers' GPT2LMHeadModel on the same weights and the same number of threads.

The weights are random, written once as a local Hugging Face checkpoint (safetensors) by
transformers and read into core by core.checkpoints, so both sides run exactly the same numbers
(the logits are compared to prove it). Also measured in the same run: the machine's float32 GEMM
rate (a large np.matmul), and the fraction of it each forward pass reaches, with the forward's
FLOPs counted analytically (forward_flops).

    bench/.env/bin/python -m bench.core_vs_torch [--tokens 128 512 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np

from threadpoolctl import threadpool_limits

from bench.common import OUT, blas_info, header, median, run_main, table, timed, verdict, wall_and_cpu
from core import PRESETS, TransformerConfig, run_with_cache

# 12 layers, 12 heads, d_model 768, d_vocab 50257, n_ctx 1024; GPT-2's lm_head has no bias, as the
# checkpoint reader says (core/checkpoints/gpt2.py)
CFG = dataclasses.replace(PRESETS["gpt2-small"], unembed_bias=False)
CHECKPOINT = OUT / "gpt2-small-random"
RATIO_BUDGET = 1.0  # core time / torch time
GEMM_FRACTION_BUDGET = 0.70  # of the measured float32 GEMM rate, at 1024 tokens


def forward_flops(cfg: TransformerConfig, n: int) -> int:
    """Floating-point operations of the forward pass's matrix products (2 per multiply-add).

    Elementwise work (norms, GELU, softmax) is a few per cent of this at GPT-2 sizes and not
    counted. Attention is counted as the full n x n square, which is what core computes (the
    causal mask is applied after QKᵀ): PyTorch's SDPA kernel may skip masked blocks, which would
    only make its fraction look higher than the work it did.
    """
    d, dm, hd = cfg.d_model, cfg.d_mlp, cfg.n_heads * cfg.d_head
    per_layer = (2 * n * d * 3 * hd      # x @ W_QKV
                 + 2 * n * n * hd * 2    # Q Kᵀ and pattern @ V, all heads
                 + 2 * n * hd * d        # z @ W_O
                 + 2 * n * d * dm * 2)   # W_in and W_out
    return cfg.n_layers * per_layer + 2 * n * d * cfg.d_vocab  # + unembedding


def write_checkpoint() -> None:
    """A random GPT-2-small as a Hugging Face folder: config.json, model.safetensors, tokenizer.json."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import GPT2Config, GPT2LMHeadModel

    if (CHECKPOINT / "model.safetensors").is_file():
        return
    torch.manual_seed(0)
    hf_cfg = GPT2Config(n_embd=CFG.d_model, n_layer=CFG.n_layers, n_head=CFG.n_heads,
                        vocab_size=CFG.d_vocab, n_positions=CFG.n_ctx)
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


class Gemm:
    """The machine's float32 matrix-multiply rate through NumPy's BLAS: one n x n product.

    Measured between the forward passes, not once up front, so that the load other programs
    put on this shared machine weighs on the reference rate as it weighs on the forwards.
    """

    def __init__(self, n: int = 2048):
        rng = np.random.default_rng(0)
        self.n = n
        self.a, self.b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        self.out = np.empty((n, n), dtype=np.float32)
        self.rates: list[float] = []

    def measure(self) -> float:
        seconds = timed(lambda: np.matmul(self.a, self.b, out=self.out), repeat=1, warmup=0)[0]
        self.rates.append(2 * self.n**3 / seconds)
        return self.rates[-1]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads for both sides (0: NumPy's BLAS default)")
    args = ap.parse_args(argv)

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
    print(f"threads: NumPy BLAS {blas_info()['blas_threads']}, torch {torch.get_num_threads()} (torch {torch.__version__}, "
          f"attention {model.config._attn_implementation})\n")

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
        print("the two models disagree: the comparison below would be meaningless")
        return 1

    gemm = Gemm()
    for _ in range(3):  # warm-up
        gemm.measure()
    gemm.rates.clear()

    rows, cache_rows, results = [], [], {}
    for n in args.tokens:
        # Alternate the sides (and the GEMM reference) so drifting machine load hits all alike.
        core_t, torch_t, rates = [], [], []
        core_forward(n), torch_forward(n)  # warm-up
        for _ in range(args.repeat):
            rates.append(gemm.measure())
            core_t.append(wall_and_cpu(lambda n=n: core_forward(n)))
            torch_t.append(wall_and_cpu(lambda n=n: torch_forward(n)))
        c, t, rate = median([w for w, _ in core_t]), median([w for w, _ in torch_t]), median(rates)
        c_cpu, t_cpu = median([u for _, u in core_t]), median([u for _, u in torch_t])
        flops = forward_flops(CFG, n)
        rows.append([n, f"{c * 1e3:.0f}", f"{t * 1e3:.0f}", f"{c / t:.2f}", f"{c_cpu / t_cpu:.2f}",
                     f"{flops / 1e9:.1f}", f"{rate / 1e9:.1f}", f"{flops / c / rate:.0%}", f"{flops / t / rate:.0%}"])
        results[n] = {"core_s": c, "torch_s": t, "ratio": c / t, "cpu_ratio": c_cpu / t_cpu, "gflop": flops / 1e9,
                      "gemm_gflops": rate / 1e9, "core_gemm_fraction": flops / c / rate,
                      "torch_gemm_fraction": flops / t / rate}
        print(f"  {n} tokens: core {c * 1e3:.0f} ms, torch {t * 1e3:.0f} ms (CPU {c_cpu:.2f} s vs {t_cpu:.2f} s)",
              flush=True)

        # Capturing every activation (the explorer's use) vs torch returning attentions and hidden states.
        core_all = timed(lambda n=n: core_forward(n, names=None), repeat=max(2, args.repeat // 2))
        torch_all = timed(lambda n=n: torch_forward(n, output_attentions=True, output_hidden_states=True),
                          repeat=max(2, args.repeat // 2))
        cache_rows.append([n, f"{median(core_all) * 1e3:.0f}", f"{median(torch_all) * 1e3:.0f}",
                           f"{median(core_all) / median(torch_all):.2f}"])

    print()
    print(table(f"Forward pass, logits only (median of {args.repeat}, after a warm-up)",
                ["tokens", "core ms", "torch ms", "core / torch", "(CPU time)", "GFLOP", "GEMM GFLOP/s",
                 "core % of GEMM", "torch % of GEMM"],
                rows))
    print(table("Forward pass capturing every activation (core: full cache; torch: output_attentions "
                "+ output_hidden_states)", ["tokens", "core ms", "torch ms", "core / torch"], cache_rows))
    worst = max(r["ratio"] for r in results.values())
    n_max = max(args.tokens)
    frac = results[n_max]["core_gemm_fraction"]
    print(f"budget core/torch <= {RATIO_BUDGET}: worst {worst:.2f} -> {verdict(worst <= RATIO_BUDGET)}")
    print(f"budget core >= {GEMM_FRACTION_BUDGET:.0%} of GEMM rate at {n_max} tokens: {frac:.0%} -> "
          f"{verdict(frac >= GEMM_FRACTION_BUDGET)}\n")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "core_vs_torch.json").write_text(json.dumps({"by_tokens": results}, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)
