"""Token attribution: integrated gradients, 32 steps, on GPT-2-small-shaped weights at 64 tokens, core against Captum
on Hugging Face transformers, on the same weights and the same number of threads, in one run.

Core (core/attribution.py) runs the 32 Gauss–Legendre steps as rows of batches through core/backprop.py's forward
and backward passes (metric_gradients: the metric's direction through the last position only, no parameter
gradients), plus one forward of the text and the zero baseline for the completeness check. Captum 0.9.0's
IntegratedGradients(method="gausslegendre", internal_batch_size=None: every step in one batch) differentiates the
same metric, logit(target) − logit(contrast) at the last position, as a function of `inputs_embeds` (the token
embeddings before positions, what core attributes), with return_convergence_delta=True (the same two extra
forwards). The two sides are timed alternately (a call of each, then again), after one warm-up call of each, so
that the shared machine's changing load falls on both. Its forward asks transformers for the last position's logits only (logits_to_keep=1), the fastest way
to call the model; both sides float32. The scores are compared before anything is timed.

    bench/.env/bin/python -m bench.attribution [--tokens 64] [--steps 32] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import blas_info, header, load_average, median, run_main, table, timed, verdict
from bench.core_vs_torch import CFG, CHECKPOINT, load_core_params, write_checkpoint

RATIO_BUDGET = 1.0  # core / Captum, integrated gradients at 32 steps and 64 tokens (issue 33's speed row)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts, each for both sides")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import captum
    import torch
    from captum.attr import IntegratedGradients
    from transformers import AutoModelForCausalLM

    from core import attribution

    header("Token attribution: integrated gradients, core vs Captum on transformers")
    write_checkpoint()
    params = load_core_params()
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT, attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    rng = np.random.default_rng(33)
    ids = rng.integers(0, CFG.d_vocab, size=args.tokens)
    ids_t = torch.from_numpy(ids[None])
    with torch.no_grad():
        top2 = torch.topk(model(ids_t).logits[0, -1], 2).indices.tolist()
    target, contrast = int(top2[0]), int(top2[1])
    embeds = model.get_input_embeddings()(ids_t).detach()  # [1, pos, d_model]

    def f(e):  # [batch, pos, d_model] -> [batch]: logit(target) − logit(contrast) at the last position
        last = model(inputs_embeds=e, logits_to_keep=1).logits[:, -1]
        return last[:, target] - last[:, contrast]

    ig = IntegratedGradients(f)

    def captum_ig():
        return ig.attribute(
            embeds,
            baselines=torch.zeros_like(embeds),
            n_steps=args.steps,
            method="gausslegendre",
            return_convergence_delta=True,
        )

    read = attribution.readout(params, CFG, target, contrast)

    def core_ig():
        return attribution.token_attribution(params, CFG, ids, -1, read, "integrated_gradients", args.steps)

    theirs, delta = captum_ig()
    ours = core_ig()
    np.testing.assert_allclose(ours.scores, theirs[0].sum(-1).numpy(), rtol=2e-3, atol=2e-3 * np.abs(ours.scores).max())
    print(
        f"same scores: max |core − Captum| = {np.abs(ours.scores - theirs[0].sum(-1).numpy()).max():.2e} "
        f"(largest score {np.abs(ours.scores).max():.3f}); convergence delta core {ours.convergence_delta:.2e}, "
        f"Captum {float(delta[0]):.2e}\n"
        f"GPT-2-small-shaped weights (random), float32, {args.tokens} tokens, {args.steps} steps; torch "
        f"{torch.__version__}, captum {captum.__version__}; core's batches of "
        f"{max(1, attribution.BATCH_VALUES // attribution.values_per_row(CFG, args.tokens))} rows\n",
        flush=True,
    )
    rows, worst = [], 0.0
    for threads in args.threads:
        threadpool_limits(threads, user_api="blas")
        torch.set_num_threads(threads)
        assert blas_info()["blas_threads"] == threads
        # alternating, one call of each at a time, so that a change in the machine's load falls on both sides
        pairs = [
            (timed(captum_ig, repeat=1, warmup=0)[0], timed(core_ig, repeat=1, warmup=0)[0]) for _ in range(args.repeat)
        ]
        t_captum, t_core = median([c for c, _ in pairs]), median([o for _, o in pairs])
        ratio = median([o / c for c, o in pairs])
        worst = max(worst, ratio)
        rows.append([threads, f"{t_core * 1e3:.0f}", f"{t_captum * 1e3:.0f}", f"{ratio:.2f}", load_average()])
    print(
        table(
            f"Integrated gradients, {args.steps} steps, {args.tokens} tokens: median of {args.repeat}, ms",
            ["threads", "core", "Captum", "core / Captum (median of the pairs' ratios)", "load after"],
            rows,
        )
    )
    print(f"budget core / Captum <= {RATIO_BUDGET}: {worst:.2f} -> {verdict(worst <= RATIO_BUDGET)}")
    print(f"\nload average at the end: {load_average()}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
