"""Activation patching: a full residual-stream sweep (every layer x every position, denoising) on GPT-2-small-shaped
weights at 32 tokens, core against Hugging Face transformers with torch forward hooks on the same weights, in one
run; core's sweep one patched run per cell (as before batching) and batched, and attribution patching's estimate of
the same grid beside one forward-and-backward pass; then the induction model's sweeps as the server answers them.

Core's sweep (core/patching.py) runs each patched pass from the patched layer on, for the positions from the
patched one on, the earlier positions' keys and values from the corrupted run; batched (the default), the cells
of one layer run side by side in one pass's rows (core/hooks.py Batch, up to BATCH_ROWS rows). Attribution
patching (core/attribution_patching.py) is one forward and backward pass of both texts as a batch of 2
(core/backprop.py gradients, no parameter gradients); its peer is one forward-and-backward pass of one sequence
with every parameter's gradient (gradients(), as training takes them). The torch peer patches the way
hooks do (TransformerLens' get_act_patch_resid_pre): a forward pre-hook on the block replaces one position of
its input, and the whole model runs once per cell; a second torch row batches each layer's positions into one
forward of n sequences. Both sides: float32, the same thread count, the same token ids; their grids are
compared before anything is timed.

    bench/.env/bin/python -m bench.patching [--tokens 32] [--repeat 3] [--threads 1] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import ROOT, blas_info, header, load_average, median, run_main, table, timed, verdict
from bench.core_vs_torch import CFG, CHECKPOINT, load_core_params, write_checkpoint

RATIO_BUDGET = 1.0  # core's sweep / torch's sweep, one patched forward per cell
BATCHED_BUDGET = 0.5  # core's batched sweep / core's sweep one patched run per cell (issue 33)
ATTRIBUTION_BUDGET = 3.0  # attribution patching / one forward-and-backward pass (issue 33)
SERVER_BUDGET_S = 0.200  # the induction model's full sweep, answered by the server


def token_ids(n: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """A clean sequence, the same with a few positions changed, and the answer and wrong tokens."""
    rng = np.random.default_rng(25)
    clean = rng.integers(0, CFG.d_vocab, size=n)
    corrupted = clean.copy()
    for p in range(1, n, max(1, n // 4)):
        corrupted[p] = (clean[p] + 1 + rng.integers(0, CFG.d_vocab - 1)) % CFG.d_vocab
    answer, wrong = rng.integers(0, CFG.d_vocab, size=2)
    return clean, corrupted, int(answer), int(wrong) if wrong != answer else int(answer + 1) % CFG.d_vocab


class TorchSweep:
    """The same sweep in transformers, with a forward pre-hook on each block (its input: hook_resid_pre)."""

    def __init__(self, model, clean: np.ndarray, corrupted: np.ndarray, answer: int, wrong: int):
        import torch

        self.torch, self.model = torch, model
        self.blocks = model.transformer.h
        self.clean, self.corrupted = torch.from_numpy(clean[None]), torch.from_numpy(corrupted[None])
        self.answer, self.wrong = answer, wrong

    def _metric(self, logits):  # [batch, pos, d_vocab] -> [batch]
        last = logits[:, -1]
        return (last[:, self.answer] - last[:, self.wrong]).numpy()

    def _clean_inputs(self) -> list:
        seen = []
        hooks = [
            b.register_forward_pre_hook(
                lambda m, a, kw: seen.append((kw.get("hidden_states", a[0] if a else None)).clone()), with_kwargs=True
            )
            for b in self.blocks
        ]
        try:
            self.model(input_ids=self.clean, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        return seen

    @staticmethod
    def _replace(value, rows, pos):
        """A pre-hook that puts value[:, pos] into its block's input (row by row for a batch)."""

        def hook(m, a, kw):
            x = (kw["hidden_states"] if "hidden_states" in kw else a[0]).clone()
            x[rows, pos] = value[0, pos]
            if "hidden_states" in kw:
                return a, kw | {"hidden_states": x}
            return (x, *a[1:]), kw

        return hook

    def per_cell(self) -> np.ndarray:
        """One forward of the corrupted text per (layer, position): [n_layers, pos]."""
        n = self.clean.shape[1]
        out = np.empty((len(self.blocks), n))
        with self.torch.inference_mode():
            source = self._clean_inputs()
            for layer, block in enumerate(self.blocks):
                for pos in range(n):
                    handle = block.register_forward_pre_hook(self._replace(source[layer], 0, pos), with_kwargs=True)
                    try:
                        out[layer, pos] = self._metric(self.model(input_ids=self.corrupted, use_cache=False).logits)[0]
                    finally:
                        handle.remove()
        return out

    def batched(self) -> np.ndarray:
        """One forward per layer: n copies of the corrupted text, copy p patched at position p."""
        n = self.clean.shape[1]
        out = np.empty((len(self.blocks), n))
        rows = self.torch.arange(n)
        batch = self.corrupted.repeat(n, 1)
        with self.torch.inference_mode():
            source = self._clean_inputs()
            for layer, block in enumerate(self.blocks):
                handle = block.register_forward_pre_hook(self._replace(source[layer], rows, rows), with_kwargs=True)
                try:
                    out[layer] = self._metric(self.model(input_ids=batch, use_cache=False).logits)
                finally:
                    handle.remove()
        return out


def sweep_rows(args) -> tuple[list, dict]:
    import torch
    import transformers
    from transformers import GPT2LMHeadModel

    from core.attribution_patching import attribution_sweep, spearman
    from core.backprop import gradients
    from core.patching import BATCH_ROWS, sweep

    transformers.logging.disable_progress_bar()
    write_checkpoint()
    params = load_core_params()
    model = GPT2LMHeadModel.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    n = args.tokens
    clean, corrupted, answer, wrong = token_ids(n)
    peer = TorchSweep(model, clean, corrupted, answer, wrong)

    def core_sweep():
        return sweep(params, CFG, clean, corrupted, answer, wrong, "resid_pre").raw

    def core_unbatched():
        return sweep(params, CFG, clean, corrupted, answer, wrong, "resid_pre", batched=False).raw

    def core_attribution():
        return attribution_sweep(params, CFG, clean, corrupted, answer, wrong, "resid_pre")

    dlogits = np.zeros((1, n, CFG.d_vocab), np.float32)
    dlogits[0, -1, answer], dlogits[0, -1, wrong] = 1.0, -1.0

    def forward_backward():  # one sequence, every parameter's gradient
        return gradients(params, CFG, corrupted[None], dlogits, hooks=False)

    grids = {"core": core_sweep(), "torch": peer.per_cell(), "torch batched": peer.batched()}
    worst = max(float(np.abs(grids["core"] - g).max()) for g in grids.values())
    unbatched = float(np.abs(grids["core"] - core_unbatched()).max())
    estimate = core_attribution()
    exact = (grids["core"] - estimate.corrupted_metric) / (estimate.clean_metric - estimate.corrupted_metric)
    print(
        f"grids: {CFG.n_layers} layers x {n} positions; max |core - torch| over both torch grids: {worst:.2e} "
        f"(logit differences of size {float(np.abs(grids['core']).max()):.1f}); max |batched - one run per cell| "
        f"{unbatched:.2e}; attribution patching's estimate against the exact grid: Spearman "
        f"{spearman(exact, estimate.normalised):.3f}\n",
        flush=True,
    )
    if not (worst < 1e-2 and unbatched < 1e-3):
        raise SystemExit("core and torch disagree: the timings below would compare different work")

    sides = {
        "core, one patched run per cell (before batching)": core_unbatched,
        f"core, batched (up to {BATCH_ROWS} rows a pass)": core_sweep,
        "core attribution patching (estimate, 1 fwd+bwd of 2 texts)": core_attribution,
        "core one forward+backward (1 sequence, parameter gradients)": forward_backward,
        "torch, one forward per cell": peer.per_cell,
        "torch, one batched forward per layer": peer.batched,
    }
    times = {name: [] for name in sides}
    for _ in range(args.repeat):  # the sides alternate, so drifting load weighs on each alike
        for name, fn in sides.items():
            times[name].extend(timed(fn, repeat=1, warmup=0))
    cells = CFG.n_layers * n
    base = median(times["torch, one forward per cell"])
    rows = [
        [name, f"{median(t):.2f}", f"{median(t) / cells * 1e3:.1f}", f"{median(t) / base:.2f}"]
        for name, t in times.items()
    ]
    t = {name: median(v) for name, v in times.items()}
    names = list(sides)
    ratio = t[names[1]] / base
    return rows, {
        "ratio": ratio,
        "batched": t[names[1]] / t[names[0]],
        "attribution": t[names[2]] / t[names[3]],
        "load": load_average(),
    }


def server_rows(args) -> tuple[list, dict]:
    """The induction model's sweeps through POST /api/v1/analysis/patching on a live server (the app's venv)."""
    import httpx

    sys.path.insert(0, str(ROOT / "scripts"))
    import liveserver

    from app.service.circuits import INDUCTION_PREFILL

    body = {
        "model": "induction",
        "clean": INDUCTION_PREFILL.clean,
        "corrupted": INDUCTION_PREFILL.corrupted,
        "answer": INDUCTION_PREFILL.answer,
        "wrong": INDUCTION_PREFILL.wrong,
    }
    python = ROOT / ".venv" / "bin" / "python"
    rows, worst = [], 0.0
    env = {"EXPLORER_ACCESS_LOG": "false", "EXPLORER_TRAIN_WORKERS": "0"}
    with (
        liveserver.live_server(env=env, python=python if python.exists() else None) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        for target in ("resid_pre", "attn_head", "attn_head_pos", "pattern"):
            request = body | {"target": target, "direction": "noise"}
            first = client.post("/api/v1/analysis/patching", json=request)
            first.raise_for_status()
            times = timed(
                lambda request=request: client.post("/api/v1/analysis/patching", json=request),
                repeat=args.requests,
                warmup=2,
            )
            p90 = sorted(times)[int(0.9 * (len(times) - 1))]
            worst = max(worst, median(times))
            rows.append([target, first.json()["passes"], f"{median(times) * 1e3:.0f}", f"{p90 * 1e3:.0f}"])
    return rows, {"server_worst_s": worst}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads for both sides (the server's default is 1)")
    ap.add_argument("--requests", type=int, default=20, help="timed requests per sweep on the server")
    ap.add_argument("--no-server", action="store_true", help="only the core and torch sweeps")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    header("Activation patching: a residual-stream sweep, core vs transformers with torch hooks")
    threadpool_limits(args.threads, user_api="blas")
    torch.set_num_threads(args.threads)
    print(
        f"threads: NumPy BLAS {blas_info()['blas_threads']}, torch {torch.get_num_threads()} (torch "
        f"{torch.__version__}); GPT-2-small-shaped weights (random), float32, {args.tokens} tokens\n",
        flush=True,
    )
    rows, figures = sweep_rows(args)
    print(
        table(
            f"Residual-stream sweep (resid_pre: {CFG.n_layers} layers x {args.tokens} positions, denoising), "
            f"median of {args.repeat}, seconds",
            ["sweep", "s", "ms per cell", "/ torch per cell"],
            rows,
        )
    )
    print(
        f"budget core / torch (one forward per cell) <= {RATIO_BUDGET}: {figures['ratio']:.2f} -> "
        f"{verdict(figures['ratio'] <= RATIO_BUDGET)}"
    )
    print(
        f"budget core batched / core one patched run per cell <= {BATCHED_BUDGET}: {figures['batched']:.2f} -> "
        f"{verdict(figures['batched'] <= BATCHED_BUDGET)}"
    )
    print(
        f"budget attribution patching / one forward+backward <= {ATTRIBUTION_BUDGET}: {figures['attribution']:.2f} -> "
        f"{verdict(figures['attribution'] <= ATTRIBUTION_BUDGET)} (load average after the sweeps: {figures['load']})"
    )
    if args.no_server:
        print(f"\nload average at the end: {load_average()}\n")
        return 0
    served, served_figures = server_rows(args)
    print(
        table(
            f"The induction model's sweeps on the server (47 tokens, noising; POST /api/v1/analysis/patching, "
            f"median and p90 of {args.requests} requests)",
            ["target", "patched runs", "median ms", "p90 ms"],
            served,
        )
    )
    print(
        f"budget the induction model's slowest full sweep on the server < {SERVER_BUDGET_S * 1e3:.0f} ms: "
        f"{served_figures['server_worst_s'] * 1e3:.0f} ms -> {verdict(served_figures['server_worst_s'] < SERVER_BUDGET_S)}"
    )
    print(f"\nload average at the end: {load_average()}\n")
    return 0


if __name__ == "__main__":
    run_main(main)
