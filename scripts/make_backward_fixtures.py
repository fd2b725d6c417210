"""Record torch autograd's gradients on every family's checkpoint, for tests/core/test_backward_families.py.

For each checkpoint core loads (tests/fixtures/families/*, gpt2-tiny, bert-tiny), transformers on PyTorch runs a
fixed batch (2 sequences of 10 random token ids, BERT with random segment ids) and autograd gives the gradient of
a fixed scalar loss, the mean next-token cross-entropy against fixed random targets, with respect to every
parameter and to the token embeddings W_E[tokens] (passed as inputs_embeds, before positions are added). For
BERT, whose masked-LM head core does not load, the logits are what core gives it: the last hidden state times
the word embeddings transposed. A few AdamW steps on llama-gqa are recorded too (tests/core/test_backward_families.py
holds core/optim.py's AdamW, fed core's gradients, to the parameters torch's AdamW reaches).

float64 throughout, exactly: transformers computes rotary angles, RMS norms and the attention softmax in float32
even in a float64 model, so those three are replaced here by the same formulas in the input's dtype (nothing
else is touched). Run in the torch environment (`make fixtures`):

    /tmp/torchenv/bin/python scripts/make_backward_fixtures.py

Size: a parameter's gradient G is stored whole when it is a vector, and as two sketches otherwise: G2 @ R and
Sᵀ @ G2 for G2 = G reshaped to [rows, rest] and R, S standard normal with PROBES columns drawn from a seed that
is the CRC-32 of the tensor's name (numpy's PCG64, which the test draws again). Any error in any element moves
a sketch (with probability 1), and the whole file stays ~200 KB where the gradients themselves would be ~3 MB.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import zlib
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file
from transformers import AutoModel, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "backward.npz"
FOLDERS = {
    "gpt2-tiny": "gpt2-tiny",
    "bert-tiny": "bert-tiny",
    **{
        name: f"families/{name}"
        for name in (
            "gpt-neo-local",
            "gpt-neox-parallel",
            "gpt-neox-sequential",
            "llama-gqa",
            "llama-mqa-bias",
            "mistral-window",
            "qwen2-sliding",
            "qwen3-qk-norm",
        )
    },
}
BATCH, POS = 2, 10
PROBES = 2
ADAMW = dict(steps=3, lr=1e-2, weight_decay=0.1)  # decay on matrices only, as core/optim.py
ADAMW_MODEL = "llama-gqa"


def probes(name: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """R [cols, PROBES] and S [rows, PROBES] for the tensor `name` (the test draws the same)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.standard_normal((cols, PROBES)), rng.standard_normal((rows, PROBES))


def sketch(name: str, g: np.ndarray) -> dict[str, np.ndarray]:
    if g.ndim == 1:
        return {"full": g}
    g2 = g.reshape(g.shape[0], -1)
    r, s = probes(name, *g2.shape)
    return {"right": g2 @ r, "left": s.T @ g2}


# ---------------------------------------------------------------------------- float64, exactly


def exact_float64(model: torch.nn.Module) -> None:
    """The three places transformers rounds to float32 inside a float64 model, computed in the input's dtype."""
    for module in model.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "attention_scaling"):
            rope = getattr(model.config, "rope_parameters", None) or {}
            base = float(rope.get("rope_theta", getattr(model.config, "rope_theta", 10000.0)))
            dim = 2 * module.inv_freq.numel()
            inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)

            def rotary(x, position_ids, inv_freq=inv_freq, scaling=module.attention_scaling):
                freqs = position_ids[..., None].to(torch.float64) * inv_freq
                emb = torch.cat((freqs, freqs), dim=-1)
                return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

            module.forward = rotary
        elif type(module).__name__.endswith("RMSNorm"):

            def rms(x, module=module):
                variance = x.pow(2).mean(-1, keepdim=True)
                return module.weight * (x * torch.rsqrt(variance + module.variance_epsilon))

            module.forward = rms


_softmax = torch.nn.functional.softmax


def _softmax_in_input_dtype(x, dim=None, _stacklevel=3, dtype=None):
    if dtype == torch.float32 and x.dtype == torch.float64:
        dtype = None  # eager attention asks for float32 weights; a float64 model keeps float64
    return _softmax(x, dim=dim, dtype=dtype)


torch.nn.functional.softmax = _softmax_in_input_dtype


def _gpt_neo_attention_in_input_dtype() -> None:
    """GPT-Neo's attention casts queries and keys to float32 ("to avoid overflow"): the same code without the casts."""
    from transformers.models.gpt_neo import modeling_gpt_neo as gpt_neo

    source = textwrap.dedent(inspect.getsource(gpt_neo.GPTNeoSelfAttention._attn))
    casts = ("query = query.to(torch.float32)", "key = key.to(torch.float32)")
    assert all(c in source for c in casts), "transformers changed GPT-Neo's attention: revisit this patch"
    for cast in casts:
        source = source.replace(cast, "pass")
    namespace: dict = {}
    exec(source, gpt_neo.__dict__, namespace)
    gpt_neo.GPTNeoSelfAttention._attn = namespace["_attn"]


_gpt_neo_attention_in_input_dtype()


def file_names(model: torch.nn.Module, folder: Path) -> dict[str, str]:
    """transformers' parameter name -> the checkpoint file's name of the same tensor (the name core's loader
    reads): the same name, or with the model's prefix added or removed, or else (a tensor transformers renames
    on load, GPT-NeoX's embed_out as lm_head) the one file tensor holding exactly its numbers."""
    stored = load_file(folder / "model.safetensors")
    found = {}
    for name, p in model.named_parameters():
        candidates = [name, name.split(".", 1)[-1]] + [
            f"{prefix}.{name}" for prefix in ("transformer", "bert", "model")
        ]
        match = [c for c in candidates if c in stored and stored[c].shape == tuple(p.shape)]
        if not match:
            value = p.detach().numpy()
            match = [
                k for k, v in stored.items() if v.shape == value.shape and np.array_equal(v.astype(value.dtype), value)
            ]
        assert len(match) >= 1, name
        found[name] = match[0]
    return found


# ---------------------------------------------------------------------------- one model


def load(name: str) -> torch.nn.Module:
    folder = FIXTURES / FOLDERS[name]
    kind = json.loads((folder / "config.json").read_text())["model_type"]
    loader = AutoModel if kind == "bert" else AutoModelForCausalLM
    model = loader.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64).eval()
    exact_float64(model)
    # BERT's word embeddings have padding_idx (its [PAD] id 0): torch then leaves that row's gradient out of the
    # lookup, to freeze it in training. The gradient of the function itself has it, as core gives it.
    model.get_input_embeddings().padding_idx = None
    return model


def batch(name: str, vocab: int, bert: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    data = {
        "tokens": rng.integers(0, vocab, (BATCH, POS)),
        "targets": rng.integers(0, vocab, (BATCH, POS)),
    }
    if bert:
        data["token_types"] = rng.integers(0, 2, (BATCH, POS))
    return data


def loss_of(model: torch.nn.Module, data: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean cross-entropy, and the token embeddings it was computed from (their .grad after backward)."""
    tokens = torch.tensor(data["tokens"])
    embeds = model.get_input_embeddings()(tokens)
    embeds.retain_grad()
    if "token_types" in data:
        hidden = model(inputs_embeds=embeds, token_type_ids=torch.tensor(data["token_types"])).last_hidden_state
        logits = hidden @ model.get_input_embeddings().weight.T
    else:
        logits = model(inputs_embeds=embeds, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.tensor(data["targets"]).reshape(-1)
    )
    return loss, embeds


def gradients(name: str) -> dict[str, np.ndarray]:
    model = load(name)
    bert = model.config.model_type == "bert"
    data = batch(name, model.config.vocab_size, bert)
    loss, embeds = loss_of(model, data)
    loss.backward()
    out = {f"{name}/{k}": v for k, v in data.items()}
    out[f"{name}/loss"] = np.array(loss.item())
    out[f"{name}/embed"] = embeds.grad.numpy()
    stored = file_names(model, FIXTURES / FOLDERS[name])
    for pname, p in model.named_parameters():
        if p.grad is None:  # e.g. BERT's pooler, which core does not load
            continue
        pname = stored[pname]  # recorded under the checkpoint file's name of the tensor
        for part, value in sketch(pname, p.grad.numpy()).items():
            out[f"{name}/grad/{pname}/{part}"] = value
    return out


def adamw_steps(name: str) -> dict[str, np.ndarray]:
    """torch.optim.AdamW for ADAMW["steps"] steps on the batch's loss; the parameters after them, sketched."""
    model = load(name)
    data = batch(name, model.config.vocab_size, False)
    named = list(model.named_parameters())
    groups = [
        {"params": [p for _, p in named if p.ndim >= 2], "weight_decay": ADAMW["weight_decay"]},
        {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"])
    losses = []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        loss, _ = loss_of(model, data)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    out = {f"adamw/{name}/losses": np.array(losses)}
    stored = file_names(load(name), FIXTURES / FOLDERS[name])
    for pname, p in named:
        pname = stored[pname]
        for part, value in sketch(pname, p.detach().numpy()).items():
            out[f"adamw/{name}/param/{pname}/{part}"] = value
    return out


def main() -> None:
    torch.manual_seed(0)
    out: dict[str, np.ndarray] = {
        "meta/transformers_version": np.array(transformers.__version__),
        "meta/torch_version": np.array(torch.__version__),
        "meta/probes": np.array(PROBES),
        "meta/adamw": np.array(json.dumps(ADAMW | {"model": ADAMW_MODEL})),
    }
    for name in FOLDERS:
        out |= gradients(name)
    out |= adamw_steps(ADAMW_MODEL)
    np.savez_compressed(OUT, **out)
    print(f"{OUT.relative_to(ROOT)}: {OUT.stat().st_size / 1024:.0f} KB, {len(out)} arrays")


if __name__ == "__main__":
    main()
