"""Writing with a model: per-token latency of generation through the KV cache, core against transformers'
`generate` on the same weights, and how soon the first streamed token reaches the /generate page.

1. Per-token latency. bench/families.py's SmolLM2-135M-shaped Llama (random weights, float32, written
   once by transformers and read by core.checkpoints, memory-mapped), greedy, after a prompt of 128 and
   512 tokens: the time between consecutive new tokens (one single-token pass over every cached key,
   the unembedding, choosing the token), median over --new tokens of --repeat runs, sides alternating,
   the same thread count. transformers' side is LlamaForCausalLM.generate(do_sample=False) with its own
   KV cache (DynamicCache) and its default attention (SDPA), timed by a streamer's put() per token; its
   end-of-text is switched off so both write every token. core's side is core.generate.generate, as
   the app runs it (every step's attention row in every layer and head recorded, its top-20 table
   made) and tokens only (attention=False). Both sides' tokens are compared.
2. The first streamed token. A real server (scripts/liveserver.py, the app's settings, one BLAS thread)
   and the /generate page in headless Chromium for each shipped decoder (toy, induction, nasi-lemak,
   python-docs), its default text and settings: the page's own performance marks, from its request
   (generate:request) to the first token on screen (generate:first-token), and from navigation start;
   and the same request over HTTP (time to the first `step` event). Median of --loads after a warm-up.

    bench/.env/bin/python -m bench.generate [--tokens 128 512] [--new 32] [--repeat 6] [--loads 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from bench.common import OUT, blas_info, header, live_server, median, run_main, table, verdict
from core import Sampling, generate

RATIO_BUDGET = 1.0  # core's per-token latency / transformers'
FIRST_TOKEN_BUDGET_MS = 300.0  # the page's request -> its first token on screen, shipped models
SHIPPED = ("toy", "induction", "nasi-lemak", "python-docs")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# ---------------------------------------------------------------------------- 1. per-token latency


def stamp() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def intervals(stamps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(wall, CPU) seconds between consecutive stamps."""
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(stamps, stamps[1:])]


def core_intervals(params, cfg, prompt: np.ndarray, n_new: int, attention: bool) -> tuple[list, list[int]]:
    """(wall, CPU) seconds between consecutive new tokens (the first, which also reads the prompt, left out), and
    the tokens. With attention, each step is told as the app tells it (its top-20 table too)."""
    stamps, tokens = [], []
    for step in generate(params, cfg, prompt, n_new, Sampling(temperature=0), attention=attention):
        if attention:
            step.warped.table(20, also=[step.token])
            step.sink_heads()
        tokens.append(step.token)
        stamps.append(stamp())
    return intervals(stamps), tokens


def torch_intervals(model, prompt: np.ndarray, n_new: int) -> tuple[list, list[int]]:
    import torch
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.stamps, self.tokens, self.calls = [], [], 0

        def put(self, value):
            self.calls += 1
            if self.calls > 1:  # the first put() is the prompt
                self.stamps.append(stamp())
                self.tokens += value.reshape(-1).tolist()

        def end(self):
            pass

    s = Stamps()
    with torch.inference_mode():
        model.generate(
            torch.from_numpy(prompt[None]),
            do_sample=False,
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            streamer=s,
            pad_token_id=0,
        )
    return intervals(s.stamps), s.tokens


def latency(args) -> tuple[list, dict]:
    import torch
    from transformers import LlamaForCausalLM

    from bench.families import CFG, CHECKPOINT, load_core, write_checkpoint

    write_checkpoint()
    threads = args.threads or blas_info()["blas_threads"]
    threadpool_limits(threads, user_api="blas")
    torch.set_num_threads(threads)
    params = load_core()
    model = LlamaForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # write every token, as core does without stop ids
    print(
        f"threads: NumPy BLAS {blas_info()['blas_threads']}, torch {torch.get_num_threads()} "
        f"(torch {torch.__version__}, attention {model.config._attn_implementation})\n"
    )
    ids = np.random.default_rng(2).integers(0, CFG.d_vocab, size=max(args.tokens))
    rows, out = [], {}
    for n in args.tokens:
        prompt = ids[:n]
        core_intervals(params, CFG, prompt, 3, True), torch_intervals(model, prompt, 3)  # warm-up
        sides = {
            "app": lambda p=prompt: core_intervals(params, CFG, p, args.new, attention=True),
            "bare": lambda p=prompt: core_intervals(params, CFG, p, args.new, attention=False),
            "torch": lambda p=prompt: torch_intervals(model, p, args.new),
        }
        times: dict[str, list] = {k: [] for k in sides}
        agree = []
        for r in range(args.repeat):  # alternate, in a rotating order, so drifting machine load hits all alike
            tokens = {}
            for name in list(sides)[r % 3 :] + list(sides)[: r % 3]:
                t, tokens[name] = sides[name]()
                times[name] += t
            agree.append(next((i for i, (a, b) in enumerate(zip(tokens["app"], tokens["torch"])) if a != b), args.new))
        app, bare, peer = times["app"], times["bare"], times["torch"]
        a, b, p = (median([w for w, _ in x]) for x in (app, bare, peer))
        a_cpu, p_cpu = median([c for _, c in app]), median([c for _, c in peer])
        out[n] = {
            "core_app_ms": a * 1e3,
            "core_tokens_only_ms": b * 1e3,
            "torch_ms": p * 1e3,
            "ratio": a / p,
            "ratio_tokens_only": b / p,
            "cpu_ratio": a_cpu / p_cpu,
            "same_tokens_first": min(agree),
        }
        rows.append(
            [
                n,
                f"{a * 1e3:.1f}",
                f"{b * 1e3:.1f}",
                f"{p * 1e3:.1f}",
                f"{a / p:.2f}",
                f"{b / p:.2f}",
                f"{a_cpu / p_cpu:.2f}",
                f"{min(agree)} of {args.new}",
            ]
        )
        print(f"  {n} tokens: core {a * 1e3:.1f} ms/token ({b * 1e3:.1f} tokens only), torch {p * 1e3:.1f}", flush=True)
    return rows, out


# ---------------------------------------------------------------------------- 2. the first streamed token


def first_tokens(args) -> tuple[list, dict]:
    import httpx
    from playwright.sync_api import sync_playwright

    rows, out = [], {}
    with (
        live_server(env={"EXPLORER_ACCESS_LOG": "false"}) as server,
        sync_playwright() as pw,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for model in SHIPPED:
            url = f"{server.url}/generate?model={model}"

            def load(url: str = url) -> tuple[float, float]:
                page.goto(url)
                page.wait_for_function("() => performance.getEntriesByName('generate:first-token').length > 0")
                return page.evaluate("""() => {
                  const m = name => performance.getEntriesByName(name)[0].startTime;
                  return [m('generate:first-token') - m('generate:request'), m('generate:first-token')]; }""")

            def over_http(model: str = model) -> float:
                body = page.evaluate("() => JSON.parse(document.querySelector('#generate-results').dataset.request)")
                t0 = time.perf_counter()
                with http.stream("POST", "/api/v1/generate", json=body, headers={"Accept": "text/event-stream"}) as r:
                    for line in r.iter_lines():
                        if line == "event: step":
                            return (time.perf_counter() - t0) * 1e3
                raise RuntimeError(f"{model}: no step event")

            load()  # warm-up: loads the weights
            loads = [load() for _ in range(args.loads)]
            http_ms = [over_http() for _ in range(args.loads)]
            request_ms, nav_ms, h = median([a for a, _ in loads]), median([b for _, b in loads]), median(http_ms)
            out[model] = {
                "request_to_first_token_ms": request_ms,
                "navigation_to_first_token_ms": nav_ms,
                "http_first_step_ms": h,
            }
            rows.append([model, f"{request_ms:.0f}", f"{nav_ms:.0f}", f"{h:.0f}"])
            print(
                f"  {model}: request -> first token {request_ms:.0f} ms on the page, {h:.0f} ms over HTTP", flush=True
            )
        browser.close()
    return rows, out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512], help="prompt lengths")
    ap.add_argument("--new", type=int, default=32, help="new tokens per run")
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--loads", type=int, default=5, help="page loads per shipped model")
    ap.add_argument("--threads", type=int, default=0, help="threads for both sides (0: NumPy's BLAS default)")
    ap.add_argument("--skip-latency", action="store_true", help="only the first streamed token (no torch needed)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    header("Writing with a model: generation through the KV cache")
    report: dict = {}
    if not args.skip_latency:
        import transformers

        transformers.logging.disable_progress_bar()
        transformers.logging.set_verbosity_error()
        rows, report["latency"] = latency(args)
        print()
        print(
            table(
                f"Per-token latency of greedy generation, SmolLM2-135M-shaped Llama (ms between new tokens; "
                f"median of {args.new - 1} × {args.repeat}, after a warm-up)",
                [
                    "prompt tokens",
                    "core (as the app: attention + top-20)",
                    "core (tokens only)",
                    "transformers generate",
                    "core / transformers",
                    "(tokens only)",
                    "(CPU time)",
                    "same greedy tokens",
                ],
                rows,
            )
        )
        worst = max(r["ratio"] for r in report["latency"].values())
        print(
            f"budget core/transformers per token <= {RATIO_BUDGET}: worst {worst:.2f} -> "
            f"{verdict(worst <= RATIO_BUDGET)}\n"
        )
    if Path(CHROMIUM).exists():
        rows, report["first_token"] = first_tokens(args)
        print()
        print(
            table(
                f"The first streamed token of the /generate page, shipped models, default text and settings "
                f"(ms; median of {args.loads} after a warm-up)",
                [
                    "model",
                    "page: request -> first token",
                    "page: navigation -> first token",
                    "HTTP: request -> first step event",
                ],
                rows,
            )
        )
        worst = max(r["request_to_first_token_ms"] for r in report["first_token"].values())
        print(
            f"budget first token on the page <= {FIRST_TOKEN_BUDGET_MS:.0f} ms: worst {worst:.0f} ms -> "
            f"{verdict(worst <= FIRST_TOKEN_BUDGET_MS)}\n"
        )
    else:
        print(f"{CHROMIUM} is missing: the page's first token was not measured\n")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "generate.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)
