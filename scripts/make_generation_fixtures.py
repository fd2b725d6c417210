"""Build the generation fixtures: transformers' logits warpers on given logits, and its greedy generation
on the tiny GPT-2 and every decoder family's checkpoint, for tests/core/test_sampling.py and
tests/core/test_generate.py.

The references come from transformers on PyTorch, independent of core/sampling.py and core/generate.py.
Like the other fixture scripts it needs its own environment with torch (`make fixtures` makes it); the
app and its tests never import torch:

    /tmp/torchenv/bin/python scripts/make_generation_fixtures.py

It writes tests/fixtures/generation.npz:

    warp{i}_logits, _previous    float64 logits [d_vocab] and the ids already in the text
    warp{i}_settings             [temperature, top_k (0: none), top_p, repetition_penalty]
    warp{i}_probs                [stage, d_vocab]: softmax after each of transformers' processors in the
                                 order it builds them (row 0: the logits as given); -inf logits give 0
    warp{i}_order                the processors' class names, in that order, as generate() builds them
    greedy{i}_folder, _text      a checkpoint under tests/fixtures/ and the prompt
    greedy{i}_prompt_ids         the prompt's ids (transformers' tokenizer)
    greedy{i}_ids                generate(do_sample=False, max_new_tokens=...)'s new ids, in float32
    greedy{i}_logits             [new, d_vocab]: the logits each new id was chosen from
    greedy{i}_eos                the end-of-text id generate() stopped at (-1: none)
    meta_*                       torch and transformers versions, this script's SHA-256

Every folder is read as it is (the parity fixtures' scripts write them).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the Hub: everything here is local

import numpy as np
import torch
import transformers
from transformers import (AutoModelForCausalLM, GenerationConfig, LogitsProcessorList, PreTrainedTokenizerFast,
                          RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "generation.npz"

# (temperature, top_k or None, top_p, repetition_penalty): each setting alone, then together, at the edges
WARP_SETTINGS = [
    (1.0, None, 1.0, 1.0), (0.7, None, 1.0, 1.0), (1.8, None, 1.0, 1.0), (1.0, 10, 1.0, 1.0), (1.0, 1, 1.0, 1.0),
    (1.0, None, 0.9, 1.0), (1.0, None, 0.3, 1.0), (1.0, None, 0.01, 1.0), (0.6, 20, 0.9, 1.0),
    (1.4, 8, 0.5, 1.0), (0.9, 40, 0.95, 1.3), (1.0, None, 1.0, 1.5), (0.25, 5, 0.8, 1.2),
]
VOCAB = 64
# (checkpoint folder, prompt, new tokens): GPT-2, Llama (grouped-query, SentencePiece with <s>), and the
# other decoder families of tests/fixtures/families/
GREEDY = [
    ("gpt2-tiny", "The cat sat", 16), ("gpt2-tiny", "nasi lemak", 20),
    ("families/llama-gqa", "The cat sat on the", 24), ("families/llama-gqa", "Ali makan", 24),
    ("families/llama-mqa-bias", "The dog", 16), ("families/qwen2-sliding", "The cat sat on the mat", 16),
    ("families/qwen3-qk-norm", "Attention is", 16), ("families/mistral-window", "Nasi lemak is", 16),
    ("families/gpt-neox-parallel", "A model predicts", 16), ("families/gpt-neo-local", "The cat", 16),
]


def softmax(x: torch.Tensor) -> np.ndarray:
    return torch.softmax(x, dim=-1).numpy()


def processors(temperature: float, top_k: int | None, top_p: float, penalty: float) -> LogitsProcessorList:
    """The processors generate() builds for these settings, as it builds them (its own order)."""
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k or 0, top_p=top_p,
                              repetition_penalty=penalty)
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / "gpt2-tiny")  # any model: the list is the config's
    built = model._get_logits_processor(generation_config=config, input_ids_seq_length=1, encoder_input_ids=None,
                                        prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList())
    wanted = (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    return LogitsProcessorList([p for p in built if isinstance(p, wanted)])


def warp_cases() -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, np.ndarray] = {}
    for i, (t, k, p, r) in enumerate(WARP_SETTINGS):
        logits = 2.5 * torch.randn(VOCAB, generator=g, dtype=torch.float64)
        previous = torch.randint(0, VOCAB, (6,), generator=g)
        chain = processors(t, k, p, r)
        scores, rows = logits[None].clone(), [softmax(logits)]
        for proc in chain:
            scores = proc(previous[None], scores)
            rows.append(softmax(scores[0]))
        c = f"warp{i}_"
        out[c + "logits"] = logits.numpy()
        out[c + "previous"] = previous.numpy().astype(np.int64)
        out[c + "settings"] = np.array([t, k or 0, p, r], dtype=np.float64)
        out[c + "probs"] = np.stack(rows)
        out[c + "order"] = np.array([type(proc).__name__ for proc in chain])
    return out


@torch.no_grad()
def greedy_cases() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for i, (folder, text, n_new) in enumerate(GREEDY):
        path = FIXTURES / folder
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
        ids = tokenizer(text)["input_ids"]
        res = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n_new, return_dict_in_generate=True,
                             output_logits=True, pad_token_id=model.generation_config.eos_token_id or 0)
        new = res.sequences[0, len(ids):].numpy()
        eos = model.generation_config.eos_token_id
        c = f"greedy{i}_"
        out[c + "folder"] = np.array(folder)
        out[c + "text"] = np.array(text)
        out[c + "prompt_ids"] = np.array(ids, dtype=np.int64)
        out[c + "ids"] = new.astype(np.int64)
        out[c + "logits"] = torch.cat(res.logits).numpy()
        out[c + "eos"] = np.array(-1 if eos is None else int(eos if isinstance(eos, int) else eos[0]), dtype=np.int64)
        top2 = np.sort(out[c + "logits"], axis=-1)[:, -2:]
        print(f"{folder:28s} {text!r:26s} {len(new):2d} new tokens, smallest top-1 margin "
              f"{float((top2[:, 1] - top2[:, 0]).min()):.2e}")
    return out


def main() -> None:
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    meta = {"meta_torch_version": np.array(torch.__version__),
            "meta_transformers_version": np.array(transformers.__version__),
            "meta_script_sha256": np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())}
    np.savez_compressed(OUT, **warp_cases(), **greedy_cases(), **meta)
    print(f"{OUT.stat().st_size:,d} bytes  {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
