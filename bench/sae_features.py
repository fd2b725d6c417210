"""POST /api/v1/analysis/features at 1,024 tokens with a 16k-feature SAE on a d-768 stream (issue 34: < 200 ms
on the server). No GPT-2-small-shaped model is in the catalogue, so two rows: core's part at exactly those sizes
(the SAE's encode of [1024, 768] and each token's top features, app/service/features.py `top_features`), and the
whole endpoint on the catalogue's widest runnable decoder, with a 16,384-feature SAE on its last residual stream,
as many tokens as it takes (up to 1,024), answered in-process (TestClient: no network, the server's own work).

    .venv/bin/python -m bench.sae_features [--repeat 5] [--threads 1]
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


def core_rows(repeat: int) -> list[tuple[str, float]]:
    from app.service.features import top_features

    x = np.random.default_rng(1).normal(size=(TOKENS, 768)).astype(np.float32)
    rows = []
    for arch in ("standard", "topk"):
        sae = random_sae(768, arch)
        encode = timed(lambda sae=sae: sae.encode(x), repeat)
        acts = sae.encode(x)
        top = timed(lambda acts=acts: top_features(acts, 10), repeat)
        rows.append((f"core: {arch} encode [1024, 768] → [1024, 16384]", encode))
        rows.append((f"core: {arch} top 10 per token", top))
    return rows


def endpoint_row(repeat: int) -> tuple[str, float]:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.models.catalog import build_catalog
    from app.settings import Settings

    catalog = build_catalog(Settings())
    name, model = max(
        ((n, m) for n, m in catalog.items() if m.runnable and not m.is_encoder and not m.draws_weights),
        key=lambda nm: nm[1].cfg.d_model,
    )
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with tempfile.TemporaryDirectory() as root:
        save_sae(random_sae(model.cfg.d_model, "standard", name, hook), Path(root) / "bench")
        n = min(TOKENS, model.cfg.n_ctx)
        text = ((model.default_text + " ") * n)[:4096]
        while len(model.tokenizer.encode(text).ids) > n:  # as many tokens as the model takes, up to 1,024
            text = text[: int(len(text) * 0.95)]
        body = {"model": name, "text": text, "sae": "bench", "top_k": 10}
        with TestClient(create_app(Settings(saes_dir=root))) as c:
            r = c.post("/api/v1/analysis/features", json=body)
            assert r.status_code == 200, r.text[:300]
            n_tokens = len(r.json()["tokens"])
            seconds = timed(lambda: c.post("/api/v1/analysis/features", json=body), repeat)
    return (f"endpoint: {name} (d_model {model.cfg.d_model}), {n_tokens} tokens, 16,384 features", seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    with threadpool_limits(a.threads, user_api="blas"):
        rows = core_rows(a.repeat) + [endpoint_row(a.repeat)]
    print(f"threads {a.threads}, median of {a.repeat}, load {os.getloadavg()[0]:.1f}")
    for what, s in rows:
        print(f"| {what} | {s * 1000:.1f} ms |")
    total = rows[0][1] + rows[1][1]
    print(f"core's part at 1,024 × 768 × 16,384 (standard): {total * 1000:.1f} ms (budget {BUDGET_S * 1000:.0f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
