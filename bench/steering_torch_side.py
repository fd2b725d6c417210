"""torch's side of bench/steering.py, in the fixture venv (the Makefile's TORCHENV: torch and transformers,
FIXTURE_PINS). Never imported by the app or by bench/.env's Python.

It writes the benchmark's checkpoint if it is not there (random GPT-2-small-shaped weights, float32, a Hugging
Face folder core reads too), loads it, and answers on stdin/stdout: a line "MODE" (unsteered, recomputed or
frozen) runs one greedy generation of the prompt and the steer the .npz holds and prints {"seconds", "stamps",
"tokens"} as one JSON line. Each generation is a loop of forward calls with transformers' KV cache
(DynamicCache), one token a call after the prompt:

    unsteered   the model alone (SDPA attention)
    recomputed  a forward pre-hook on block `layer` adds coefficient × vector to its input (hook_resid_pre) at
                every row it is fed: every position, each new token's too (SDPA attention)
    frozen      per step, an unsteered pass of the base model (no LM head) over the new tokens with a cache of its
                own, eager attention recording each layer's weights; then the hooked pass with its own cache,
                whose attention from `layer` on is the recorded weights times its own values (the fixture
                script's way, scripts/make_steering_fixtures.py)

    $(TORCHENV)/bin/python bench/steering_torch_side.py CHECKPOINT DATA.npz --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

gpt2 = transformers.models.gpt2.modeling_gpt2


def write_checkpoint(folder: Path, cfg: dict) -> None:
    """Random GPT-2-shaped weights (biases and gains perturbed, so every array matters) as a float32 folder."""
    if (folder / "model.safetensors").is_file():
        return
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    hf = GPT2Config(
        vocab_size=cfg["d_vocab"],
        n_positions=cfg["n_ctx"],
        n_embd=cfg["d_model"],
        n_layer=cfg["n_layers"],
        n_head=cfg["n_heads"],
        n_inner=cfg["d_mlp"],
        activation_function="gelu_new",
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(hf)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    # core's loader wants a tokenizer.json beside the weights; the benchmark feeds ids directly
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))


class Attention:
    """transformers' GPT-2 eager attention, wrapped: records each layer's weights (`record`), or from layer
    `frozen_from` on answers with the recorded weights times this pass's values (the scores are not computed)."""

    def __init__(self, frozen_from: int):
        self.original = gpt2.eager_attention_forward
        self.frozen_from, self.record = frozen_from, True
        self.weights: dict[int, torch.Tensor] = {}

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        layer = module.layer_idx
        if self.record:
            out, weights = self.original(module, query, key, value, attention_mask, **kwargs)
            self.weights[layer] = weights
            return out, weights
        if layer < self.frozen_from:
            return self.original(module, query, key, value, attention_mask, **kwargs)
        weights = self.weights[layer]
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class Push:
    """The steer: a forward pre-hook adding coefficient × vector to every row of a block's input, while `on`."""

    def __init__(self, push: torch.Tensor):
        self.push, self.on = push, True

    def __call__(self, module, args):
        return (args[0] + self.push, *args[1:]) if self.on else None


@torch.inference_mode()
def generate(model, attention: Attention, push: Push, layer: int, mode: str, prompt, n_new: int) -> tuple[list, list]:
    model.set_attn_implementation("eager" if mode == "frozen" else "sdpa")
    handle = None if mode == "unsteered" else model.transformer.h[layer].register_forward_pre_hook(push)
    steered, base = DynamicCache(config=model.config), DynamicCache(config=model.config)
    new, stamps, tokens = prompt, [], []
    try:
        for _ in range(n_new):
            if mode == "frozen":  # the unsteered pass over the same tokens, its weights recorded
                push.on, attention.record = False, True
                model.transformer(input_ids=new, cache=base, use_cache=True)
                push.on, attention.record = True, False
            logits = model(input_ids=new, cache=steered, use_cache=True, logits_to_keep=1).logits
            token = int(logits[0, -1].argmax())
            stamps.append(time.perf_counter())
            tokens.append(token)
            new = torch.tensor([[token]])
    finally:
        if handle is not None:
            handle.remove()
        attention.record = True
    return stamps, tokens


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    z = np.load(args.data)
    folder = Path(args.checkpoint)
    write_checkpoint(folder, json.loads(str(z["cfg"])))
    model = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    layer, coefficient = int(z["layer"]), float(z["coefficient"])
    attention, push = Attention(layer), Push(coefficient * torch.from_numpy(z["vector"]).float())
    gpt2.eager_attention_forward = attention
    prompt = torch.from_numpy(z["prompt"].astype(np.int64))[None]
    n_new = int(z["n_new"])
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}), flush=True)
    for line in sys.stdin:
        mode = line.strip()
        t0 = time.perf_counter()
        stamps, tokens = generate(model, attention, push, layer, mode, prompt, n_new)
        seconds = time.perf_counter() - t0
        print(json.dumps({"seconds": seconds, "stamps": [s - t0 for s in stamps], "tokens": tokens}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
