"""Record token attributions from Captum and torch autograd, for tests/core/test_attribution.py (`make fixtures`).

Runs in the fixture venv (torch, transformers and captum: FIXTURE_PINS); the app never imports torch. For the
tiny GPT-2 checkpoint (tests/fixtures/gpt2-tiny) and the Llama, Qwen3 and GPT-NeoX family fixtures
(tests/fixtures/families), each in float64, and two cases each (the last position's top prediction alone; an
earlier position's logit difference between two chosen tokens), the metric is
    f(E) = logits[0, position, target] − logits[0, position, contrast]     (contrast: none → its logit alone)
of the token embeddings E = the model's input embedding module applied to the ids, before positions (transformers'
`inputs_embeds`; GPT-2 adds wpe to them, the rotary families rotate inside attention). A float64 model in
transformers still computes some steps in float32: the rotary angles (inv_freq made in float32), Llama's and
Qwen's RMS norms (hidden_states.to(torch.float32)) and the eager attention's softmax (dtype=torch.float32) of
those families. exact_float64 gives the rotary and norm modules the same formulas in float64, and they run with
attn_implementation="sdpa" (the softmax in the inputs' dtype), so every family's references hold to float64's
rounding. Recorded per case:

    grad        [pos, d_model]  torch.autograd.grad of f at E
    saliency    [pos]           Captum Saliency (|∂f/∂E|), then the L2 norm over d_model
    input_x_gradient [pos]      Captum InputXGradient, summed over d_model
    integrated_gradients [pos]  Captum IntegratedGradients(method="gausslegendre", zero baseline, STEPS steps),
                                summed over d_model; checked here against LayerIntegratedGradients on the
                                token-embedding module fed the ids (the same numbers, Captum's other road)
    ig_delta                    Captum's convergence delta
    ig_float64  [pos]           the same integral by torch.autograd with the Gauss–Legendre weights in float64
                                (Captum multiplies by them as float32: torch.tensor(step_sizes).float())
    occlusion   [pos]           Captum FeatureAblation, each token's d_model numbers one feature, baseline 0
    metric, baseline_metric     f(E), f(0)
    logits      [d_vocab]       the logits at the position

    /tmp/torchenv/bin/python scripts/make_attribution_fixtures.py
"""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

import numpy as np
import torch
import transformers
from captum.attr import FeatureAblation, InputXGradient, IntegratedGradients, LayerIntegratedGradients, Saliency
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "attribution.npz"
STEPS = 16
MODELS = {
    "gpt2": FIXTURES / "gpt2-tiny",
    "llama": FIXTURES / "families" / "llama-gqa",
    "qwen3": FIXTURES / "families" / "qwen3-qk-norm",
    "neox": FIXTURES / "families" / "gpt-neox-parallel",
}
# token ids (the families' from their parity fixtures' first text; GPT-2's drawn), and each case's
# (position, target, contrast): None for the top prediction, or no contrast


def _rms_norm_float64(self, x: torch.Tensor) -> torch.Tensor:
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rotary_float64(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dim = 2 * self.inv_freq.shape[0]  # the rotated dimensions (a fraction of the head in GPT-NeoX)
    inv_freq = 1.0 / self.config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = position_ids[..., None].double() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)


def exact_float64(model) -> None:
    """The rotary embeddings and RMS norms (Qwen3's query and key norms too) computed in float64."""
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            module.forward = types.MethodType(_rms_norm_float64, module)
        elif kind.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(_rotary_float64, module)


def ids_of(name: str) -> np.ndarray:
    if name == "gpt2":
        return np.random.default_rng(33).integers(0, 320, size=11)
    with np.load(FIXTURES / "families" / f"{MODELS[name].name}.npz") as z:
        return z["case0_token_ids"]


def record(model, ids: np.ndarray, position: int, target: int | None, contrast: int | None) -> dict[str, np.ndarray]:
    ids_t = torch.tensor(ids[None])
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        logits = model(ids_t).logits[0, position]
        embeds = embedding(ids_t)
    if target is None:
        target = int(torch.argmax(logits))

    def f(e: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model] -> [batch]
        out = model(inputs_embeds=e).logits[:, position]
        return out[:, target] - (0 if contrast is None else out[:, contrast])

    def f_ids(i: torch.Tensor) -> torch.Tensor:
        out = model(i).logits[:, position]
        return out[:, target] - (0 if contrast is None else out[:, contrast])

    e = embeds.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(e).sum(), e)
    zero = torch.zeros_like(embeds)
    saliency = Saliency(f).attribute(embeds.clone(), abs=True)
    ixg = InputXGradient(f).attribute(embeds.clone())
    ig, delta = IntegratedGradients(f).attribute(
        embeds.clone(), baselines=zero, n_steps=STEPS, method="gausslegendre", return_convergence_delta=True
    )
    layer_ig = LayerIntegratedGradients(f_ids, embedding).attribute(
        ids_t, baselines=torch.zeros_like(ids_t), n_steps=STEPS, method="gausslegendre"
    )
    # the baseline ids 0 embed to row 0, not to zeros: LayerIntegratedGradients' baseline is the layer's output
    # at those ids, so it equals the zero-baseline attribution only through row 0 of the table; compare instead
    # with the same baseline given as embeddings
    nodes, weights = np.polynomial.legendre.leggauss(STEPS)
    scaled = (torch.tensor(0.5 * (1 + nodes))[:, None, None] * embeds[0]).requires_grad_(True)
    (step_grads,) = torch.autograd.grad(f(scaled).sum(), scaled)  # [steps, pos, d_model]
    ig_float64 = (embeds[0] * torch.tensordot(torch.tensor(0.5 * weights), step_grads, dims=1)).sum(-1)
    ig_row0 = IntegratedGradients(f).attribute(
        embeds.clone(), baselines=embedding(torch.zeros_like(ids_t)).detach(), n_steps=STEPS, method="gausslegendre"
    )
    torch.testing.assert_close(layer_ig, ig_row0, rtol=0, atol=1e-10)
    mask = torch.arange(len(ids)).reshape(1, -1, 1).expand_as(embeds)
    occlusion = FeatureAblation(f).attribute(embeds.clone(), baselines=0.0, feature_mask=mask)
    with torch.no_grad():
        metric, baseline = f(embeds), f(zero)

    def a(t: torch.Tensor) -> np.ndarray:
        return t.detach().numpy()

    return {
        "ids": ids,
        "position": np.array(position),
        "target": np.array(target),
        "contrast": np.array(-1 if contrast is None else contrast),
        "grad": a(grad[0]),
        "saliency": a(saliency[0].norm(dim=-1)),
        "input_x_gradient": a(ixg[0].sum(-1)),
        "integrated_gradients": a(ig[0].sum(-1)),
        "ig_delta": a(delta)[0],
        "ig_float64": a(ig_float64),
        "occlusion": a(occlusion[0, :, 0]),
        "metric": a(metric)[0],
        "baseline_metric": a(baseline)[0],
        "logits": a(logits),
    }


def main() -> None:
    torch.manual_seed(0)
    data: dict[str, np.ndarray] = {
        "meta_generator_sha256": np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest()),
        "meta_versions": np.array(
            f"torch {torch.__version__}, transformers {transformers.__version__}, captum "
            + __import__("captum").__version__
        ),
        "meta_steps": np.array(STEPS),
    }
    for name, folder in MODELS.items():
        attention = "eager" if name == "gpt2" else "sdpa"  # GPT-2's eager softmax keeps float64; the others' not
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attention).double().eval()
        exact_float64(model)
        for p in model.parameters():
            p.requires_grad_(False)
        ids = ids_of(name)
        vocab = model.config.vocab_size
        cases = {"last": (len(ids) - 1, None, None), "contrast": (len(ids) - 4, 7 % vocab, 11 % vocab)}
        for case, (position, target, contrast) in cases.items():
            for key, value in record(model, ids, position, target, contrast).items():
                data[f"{name}/{case}/{key}"] = value
        print(name, "recorded")
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
