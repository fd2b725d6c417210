"""POST /api/v1/analysis/features at 1,024 tokens with a 16k-feature SAE on a d-768 stream (issue 34: < 200 ms
on the server). Rows, at each thread count asked for (--threads): core's part with the BLAS given that many, and
the server as it runs by default, its workers at one BLAS thread (EXPLORER_BLAS_THREADS, app/settings.py) and a
request that computes alone lent that many (EXPLORER_LEND_THREADS; 0, the default, lends the CPUs: 2 here):
- core's part at exactly those sizes: the product x @ W_enc alone ([1024, 768] @ [768, 16384]), the dense encode as
  SAE.encode computes it, and SAE.top_activations, which the endpoint calls (encode included);
- the whole endpoint answered in-process (TestClient: no network, the server's own work) on a GPT-2-shaped model
  of one layer, d_model 768 and a context of 1,024 (random weights, written for the bench into a temporary
  EXPLORER_MODELS_DIR), with a 16,384-feature SAE on its blocks.0.hook_resid_pre (the pass stops before the
  block: the SAE's own work) and one on its blocks.0.hook_resid_post (a GPT-2-small-wide block first), and POST
  /api/v1/run of the same text beside them;
- each endpoint row's floor: its multiply-adds (the model's pass up to the SAE's hook, core.params.forward_work,
  and the encoder's n × d_in × d_sae) at the rate this machine ran the product alone, at those threads: no
  float32 code on this CPU answers faster than that.

    .venv/bin/python -m bench.sae_features [--repeat 5] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from core.sae import SAE, SAEConfig, save_sae

BUDGET_S = 0.200
D_SAE = 16_384
TOKENS = 1024


def random_sae(d_in: int, architecture: str, model: str = "bench", hook: str = "blocks.0.hook_resid_post") -> SAE:
    rng = np.random.default_rng(0)
    cfg = SAEConfig.from_dict(
        {
            "architecture": architecture,
            "d_in": d_in,
            "d_sae": D_SAE,
            "k": 64,
            "metadata": {"hook_name": hook, "model_name": model},
        }
    )
    scale = 1 / np.sqrt(d_in)
    return SAE(
        cfg,
        W_enc=rng.normal(0, scale, (d_in, D_SAE)).astype(np.float32),
        b_enc=np.full(D_SAE, -0.5, np.float32),  # most features off, as a trained SAE's are
        W_dec=rng.normal(0, scale, (D_SAE, d_in)).astype(np.float32),
        b_dec=np.zeros(d_in, np.float32),
    )


def timed(fn, repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def core_rows(repeat: int, threads: int) -> tuple[list[tuple[str, float]], float]:
    """The rows, and the product's rate (multiply-adds a second) at these threads."""
    from core.threads import team_for

    x = np.random.default_rng(1).normal(size=(TOKENS, 768)).astype(np.float32)
    rows = []
    rate = 0.0
    for arch in ("standard", "topk"):
        sae = random_sae(768, arch)

        def top(sae=sae) -> None:
            with team_for(len(x)) as team:  # as the endpoint: a team as wide as the BLAS's threads
                sae.top_activations(x, 10, team=team)

        with threadpool_limits(threads, user_api="blas"):
            product = timed(lambda sae=sae: x @ sae.W_enc, repeat)
            rate = max(rate, x.shape[0] * x.shape[1] * D_SAE / product)
            rows.append((f"core: {arch}: the product x @ W_enc alone, [1024, 768] @ [768, 16384]", product))
            rows.append(
                (f"core: {arch}: SAE.encode, [1024, 16384] dense", timed(lambda sae=sae: sae.encode(x), repeat))
            )
            rows.append((f"core: {arch}: SAE.top_activations, top 10 per token (encode included)", timed(top, repeat)))
    return rows, rate


VOCAB = tuple(chr(c) for c in range(32, 127)) + ("\n",)  # characters as tokens


def wide_cfg():
    from core import TransformerConfig

    return TransformerConfig(d_model=768, n_layers=1, n_heads=12, d_vocab=len(VOCAB), n_ctx=TOKENS)


def wide_model(root: Path) -> str:
    """A GPT-2-shaped folder of one layer, d_model 768, context 1,024, random float32 weights, characters as tokens."""
    from types import SimpleNamespace

    from core.export import save_gpt2_folder
    from core.model import init_params

    cfg = wide_cfg()
    settings = SimpleNamespace(recipe="bench", to_dict=dict)
    save_gpt2_folder(
        root / "bench-d768",
        init_params(cfg, 0, np.float32),
        cfg,
        SimpleNamespace(vocab=VOCAB, lowercase=False, text=None),
        settings,
    )
    return "bench-d768"


# The two SAEs the endpoint is timed with: on the stream as it enters the first block (the pass stops before it:
# the SAE's own work) and as it leaves it (after a block of GPT-2 small's width).
HOOKS = {"resid_pre": "blocks.0.hook_resid_pre", "resid_post": "blocks.0.hook_resid_post"}


def endpoint_rows(repeat: int, threads: int, rate: float) -> list[tuple[str, float]]:
    """The endpoint with each SAE of HOOKS, each beside its floor (its multiply-adds at `rate`), and /run."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from core.hooks import layers_needed
    from core.params import forward_work

    rows = []
    with tempfile.TemporaryDirectory() as root:
        models, saes, runs = (Path(root) / d for d in ("models", "saes", "runs"))
        name = wide_model(models)
        for sae_name, hook in HOOKS.items():
            save_sae(random_sae(768, "standard", name, hook), saes / sae_name)
        text = ("The for statement is used to iterate over the elements of a sequence. " * 20)[:TOKENS]
        # the server as it runs by default: workers of one BLAS thread, a request computing alone lent `threads`
        settings = Settings(
            models_dir=models, saes_dir=saes, runs_dir=runs, blas_threads=1, lend_threads=threads, access_log=False
        )
        with TestClient(create_app(settings)) as c:
            for sae_name, hook in HOOKS.items():
                body = {"model": name, "text": text, "sae": sae_name, "top_k": 10}
                r = c.post("/api/v1/analysis/features", json=body)
                assert r.status_code == 200, r.text[:300]
                n = len(r.json()["tokens"])
                seconds = timed(lambda body=body: c.post("/api/v1/analysis/features", json=body), repeat)
                work = forward_work(wide_cfg(), n, stop_at_layer=layers_needed([hook], wide_cfg())) + n * 768 * D_SAE
                what = f"{name} (d_model 768, 1 layer), {n} tokens, 16,384 features on {hook}, top 10"
                rows.append((f"endpoint: {what}", seconds))
                rows.append((f"floor: its {work / 1e9:.1f} G multiply-adds at the product's rate above", work / rate))
            run = {"model": name, "text": text}
            rows.append(
                (
                    "for comparison: POST /api/v1/run of the same text (the model's forward pass with its logits)",
                    timed(lambda: c.post("/api/v1/run", json=run), repeat),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args(argv)
    for threads in a.threads:
        load = os.getloadavg()[0]
        rows, rate = core_rows(a.repeat, threads)
        rows += endpoint_rows(a.repeat, threads, rate)
        print(f"\nBLAS threads {threads}, median of {a.repeat}, load {load:.1f} before, {os.getloadavg()[0]:.1f} after")
        for what, s in rows:
            print(f"| {what} | {s * 1000:.1f} ms |")
    print(f"budget for the endpoint: {BUDGET_S * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
