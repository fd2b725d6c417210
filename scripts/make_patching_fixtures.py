"""Build the activation-patching fixtures: patched logits that Hugging Face `transformers` computes with torch
forward hooks, for tests/core/test_patching.py to hold core/patching.py against.

Two checkpoints the other fixture scripts made (run them first: `make fixtures` does, in order):
tests/fixtures/gpt2-tiny (GPT-2: learned positions, layer norm, a tied unembedding) and
tests/fixtures/families/llama-gqa (Llama: rotary positions, RMS norm, a gated MLP, 4 query heads sharing 2
key/value heads). For each, a clean and a corrupted sequence of token ids of the same length (the corrupted
one differs at a few positions) and, for a list of patches, the logits at the last position of the
corrupted run with that one activation taken from the clean run (denoising), or the reverse (noising):

    resid_pre      a block's input at one position (a forward pre-hook on the block replaces it)
    attn_head      one head's output z, before the output projection, at every position or one
                   (a forward pre-hook on c_proj / o_proj replaces that head's slice of its input)
    mlp_out        an MLP's output at one position (a forward hook on the MLP replaces it)

Needs its own environment with torch (the app and its tests never import torch):

    /tmp/torchenv/bin/python scripts/make_patching_fixtures.py

It writes tests/fixtures/patching.npz: per checkpoint `<name>/clean`, `<name>/corrupted` (token ids),
`<name>/patches` [n, 5] (target index into TARGETS, layer, head or -1, position or -1 for all, 1 for
noising), `<name>/logits64` [n, d_vocab] computed in float64 (the weights upcast exactly) and
`<name>/logits32` in float32, plus the clean and corrupted runs' own last logits; and how it was made
(torch and transformers versions, this script's SHA-256). Running it twice writes the same numbers.
For each checkpoint also attribution patching's estimate by torch autograd (`atp_estimates`), in float64: for
every target, direction and metric, `<name>/atp/<target>/<direction>/<metric>` [rows, columns], with the answer
and wrong tokens it measures in `<name>/atp_answer_wrong`. The
float64 run is float64 throughout (`exactly_float64`: transformers' Llama keeps three steps in float32).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the Hub: everything here is local

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "patching.npz"
CHECKPOINTS = {"gpt2-tiny": FIXTURES / "gpt2-tiny", "llama-gqa": FIXTURES / "families" / "llama-gqa"}
TARGETS = ("resid_pre", "attn_head", "mlp_out")
N_TOKENS = 12
CHANGED = (2, 5, 6)  # positions where the corrupted sequence differs


def parts(model):
    """The blocks, and for each its output projection (whose input is every head's z side by side) and MLP."""
    base = model.base_model
    if hasattr(base, "h"):  # GPT-2
        return list(base.h), [b.attn.c_proj for b in base.h], [b.mlp for b in base.h]
    return list(base.layers), [b.self_attn.o_proj for b in base.layers], [b.mlp for b in base.layers]


@contextlib.contextmanager
def exactly_float64(model) -> Iterator[None]:
    """A float64 model computed in float64 throughout. transformers' Llama keeps three steps in float32 whatever
    the model's dtype (its rotary angles, its RMS norm and its eager attention's softmax all cast to float),
    which would leave the float64 reference about 1e-6 from exact; within this block the same formulas run in
    float64. GPT-2 needs none of it."""
    llama = transformers.models.llama.modeling_llama
    cfg = model.config
    rotary = getattr(model.base_model, "rotary_emb", None)
    if rotary is None:
        yield
        return
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv_freq = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def angles(x, position_ids):  # p · base^(-2i/d)
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rms_norm(norm):
        return lambda h: norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k, v = llama.repeat_kv(key, module.num_key_value_groups), llama.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.softmax(weights, dim=-1)
        return torch.matmul(weights, v).transpose(1, 2).contiguous(), weights

    rotary.forward = angles
    for module in model.modules():
        if isinstance(module, llama.LlamaRMSNorm):
            module.forward = rms_norm(module)
    kept, llama.eager_attention_forward = llama.eager_attention_forward, attention
    try:
        yield
    finally:
        llama.eager_attention_forward = kept


def sequences(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(25)
    clean = rng.integers(3, vocab, size=N_TOKENS)
    corrupted = clean.copy()
    for p in CHANGED:
        corrupted[p] = (clean[p] + 1 + rng.integers(0, vocab - 4)) % (vocab - 3) + 3
    return torch.tensor(clean[None]), torch.tensor(corrupted[None])


def patches(n_layers: int, n_heads: int) -> list[tuple[int, int, int, int, int]]:
    """(target, layer, head, pos, noise): every layer's stream and MLP at a changed position and the last, every
    head at every position and at a changed one, and a few the other way round."""
    out = []
    for layer in range(n_layers):
        for pos in (CHANGED[0], N_TOKENS - 1):
            out += [(0, layer, -1, pos, 0), (2, layer, -1, pos, 0)]
        for head in range(n_heads):
            out += [(1, layer, head, -1, 0), (1, layer, head, CHANGED[1], 0)]
        out += [(0, layer, -1, CHANGED[2], 1), (1, layer, 0, -1, 1)]
    return out


@torch.no_grad()
def record(model, clean: torch.Tensor, corrupted: torch.Tensor, todo) -> dict[str, np.ndarray]:
    blocks, projections, mlps = parts(model)
    n_heads = model.config.num_attention_heads
    d_head = getattr(model.config, "head_dim", None) or model.config.hidden_size // n_heads

    def first(x):
        return x if isinstance(x, torch.Tensor) else x[0]

    def activations(ids):
        """Every block's input, every output projection's input, every MLP's output, of one run."""
        seen = {"resid_pre": [], "z": [], "mlp_out": []}
        hooks = [b.register_forward_pre_hook(
            lambda m, a, kw: seen["resid_pre"].append(first(kw.get("hidden_states", a and a[0])).clone()),
            with_kwargs=True) for b in blocks]
        hooks += [p.register_forward_pre_hook(lambda m, a: seen["z"].append(a[0].clone())) for p in projections]
        hooks += [m.register_forward_hook(lambda m, a, out: seen["mlp_out"].append(first(out).clone())) for m in mlps]
        try:
            logits = model(ids, use_cache=False).logits[0, -1]
        finally:
            for h in hooks:
                h.remove()
        return seen, logits

    runs = {0: activations(clean), 1: activations(corrupted)}
    out = {"clean_logits": runs[0][1].numpy(), "corrupted_logits": runs[1][1].numpy()}
    rows = []
    for target, layer, head, pos, noise in todo:
        source = runs[0 if not noise else 1][0]  # denoise: from the clean run into the corrupted one
        base_ids = corrupted if not noise else clean
        at = slice(None) if pos < 0 else slice(pos, pos + 1)
        if target == 0:
            def hook(m, a, kw, value=source["resid_pre"][layer], at=at):
                x = first(kw.get("hidden_states", a and a[0])).clone()
                x[:, at] = value[:, at]
                if "hidden_states" in kw:
                    return a, kw | {"hidden_states": x}
                return (x, *a[1:]), kw
            handle = blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)
        elif target == 1:
            def hook(m, a, value=source["z"][layer], at=at, head=head):
                z = a[0].clone()
                cols = slice(head * d_head, (head + 1) * d_head)
                z[:, at, cols] = value[:, at, cols]
                return (z, *a[1:])
            handle = projections[layer].register_forward_pre_hook(hook)
        else:
            def hook(m, a, out, value=source["mlp_out"][layer], at=at):
                x = first(out).clone()
                x[:, at] = value[:, at]
                return x if isinstance(out, torch.Tensor) else (x, *out[1:])
            handle = mlps[layer].register_forward_hook(hook)
        try:
            rows.append(model(base_ids, use_cache=False).logits[0, -1].numpy())
        finally:
            handle.remove()
    out["logits"] = np.stack(rows)
    return out


# ------------------------------------------------------------------ attribution patching, by torch autograd

ATP_TARGETS = ("resid_pre", "resid_mid", "resid_post", "attn_head", "attn_head_pos", "pattern", "mlp_out")


def atp_tokens(logits_clean: torch.Tensor, logits_corrupted: torch.Tensor) -> tuple[int, int]:
    """The answer (the clean run's top next token) and the wrong token (the corrupted run's, or the clean run's
    second when they agree)."""
    answer = int(logits_clean.argmax())
    wrong = int(logits_corrupted.argmax())
    return answer, wrong if wrong != answer else int(logits_clean.topk(2).indices[1])


def hooked_activations(model, ids: torch.Tensor, grad: bool):
    """A run's activations at core's hook points (their tensors in the graph, gradients kept when `grad`), and its
    last logits: resid_pre (a block's input), resid_mid (the second norm's input: GPT-2's ln_2, Llama's
    post_attention_layernorm), resid_post (a block's output), mlp_out, z (the output projection's input, by
    head) and pattern (the eager attention's weights)."""
    blocks, projections, mlps = parts(model)
    seen: dict[str, list] = {k: [] for k in ("resid_pre", "resid_mid", "resid_post", "mlp_out", "z")}

    def keep(kind):
        def store(t):
            if grad:
                t.retain_grad()
            seen[kind].append(t)
        return store

    def first(x):
        return x if isinstance(x, torch.Tensor) else x[0]

    hooks = []
    for b, projection, mlp in zip(blocks, projections, mlps):
        norm2 = b.ln_2 if hasattr(b, "ln_2") else b.post_attention_layernorm
        hooks.append(b.register_forward_pre_hook(
            lambda m, a, kw: keep("resid_pre")(first(kw.get("hidden_states", a and a[0]))), with_kwargs=True))
        hooks.append(norm2.register_forward_pre_hook(lambda m, a: keep("resid_mid")(a[0])))
        hooks.append(b.register_forward_hook(lambda m, a, out: keep("resid_post")(first(out))))
        hooks.append(mlp.register_forward_hook(lambda m, a, out: keep("mlp_out")(first(out))))
        hooks.append(projection.register_forward_pre_hook(lambda m, a: keep("z")(a[0])))
    try:
        out = model(ids, use_cache=False, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    seen["pattern"] = list(out.attentions)
    if grad:
        for t in seen["pattern"]:
            t.retain_grad()
    return seen, out.logits[0, -1]


def atp_estimates(model, clean: torch.Tensor, corrupted: torch.Tensor) -> dict[str, np.ndarray]:
    """Attribution patching by torch autograd: for each direction and metric, each target's grid of
    metric(base) + Σ (a_source − a_base) · ∂metric/∂a |base over what a cell covers (core/attribution_patching.py's
    cells; the base run is the one the exact sweep patches into: corrupted when denoising, clean when noising)."""
    n_heads = model.config.num_attention_heads
    with torch.no_grad():
        runs = {"clean": hooked_activations(model, clean, False)}
        runs["corrupted"] = hooked_activations(model, corrupted, False)
    answer, wrong = atp_tokens(runs["clean"][1], runs["corrupted"][1])
    out = {"atp_answer_wrong": np.array([answer, wrong])}
    roles = {"denoise": ("corrupted", "clean"), "noise": ("clean", "corrupted")}  # (patched into, patched from)
    for direction, (base_name, source_name) in roles.items():
        for metric in ("logit_diff", "prob"):
            model.zero_grad(set_to_none=True)
            acts, last = hooked_activations(model, {"clean": clean, "corrupted": corrupted}[base_name], True)
            value = last[answer] - last[wrong] if metric == "logit_diff" else torch.softmax(last, -1)[answer]
            value.backward()
            source = runs[source_name][0]

            def effect(kind, layer, acts=acts, source=source):
                a, g = acts[kind][layer], acts[kind][layer].grad
                return ((source[kind][layer] - a.detach()) * g)[0]  # batch axis dropped

            layers = range(len(acts["resid_pre"]))
            grids = {}
            for target in ("resid_pre", "resid_mid", "resid_post", "mlp_out"):
                grids[target] = torch.stack([effect(target, la).sum(-1) for la in layers])
            z = [effect("z", la).reshape(clean.shape[1], n_heads, -1) for la in layers]  # [pos, heads, d_head]
            grids["attn_head"] = torch.stack([e.sum((0, 2)) for e in z])
            grids["attn_head_pos"] = torch.cat([e.sum(-1).T for e in z])
            grids["pattern"] = torch.stack([effect("pattern", la).sum((1, 2)) for la in layers])
            for target in ATP_TARGETS:
                out[f"atp/{target}/{direction}/{metric}"] = (value.detach() + grids[target]).numpy()
    return out


def main() -> None:
    generator = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    data: dict[str, np.ndarray] = {"meta_torch_version": np.array(torch.__version__),
                                   "meta_transformers_version": np.array(transformers.__version__),
                                   "meta_generator_sha256": np.array(generator), "targets": np.array(TARGETS)}
    for name, folder in CHECKPOINTS.items():
        model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
        model64 = copy.deepcopy(model32).double()  # the float32 weights upcast exactly: only the arithmetic differs
        clean, corrupted = sequences(model32.config.vocab_size)
        todo = patches(model32.config.num_hidden_layers, model32.config.num_attention_heads)
        data[f"{name}/clean"], data[f"{name}/corrupted"] = clean[0].numpy(), corrupted[0].numpy()
        data[f"{name}/patches"] = np.array(todo, dtype=np.int64)
        with exactly_float64(model64):
            references = {"64": record(model64, clean, corrupted, todo)}
        references["32"] = record(model32, clean, corrupted, todo)
        for suffix, recorded in references.items():
            for key, value in recorded.items():
                data[f"{name}/{key}{suffix}"] = value
        with exactly_float64(model64), torch.enable_grad():  # attribution patching, float64
            for key, value in atp_estimates(model64, clean, corrupted).items():
                data[f"{name}/{key}"] = value
        print(f"{name}: {len(todo)} patches")
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
