"""core/backprop.py's gradients on every family's checkpoint against torch autograd's (scripts/make_backward_fixtures.py).

Each checkpoint core loads (GPT-2, BERT, GPT-Neo, GPT-NeoX parallel and sequential, Llama GQA and MQA with
biases, Mistral and Qwen2 windows, Qwen3 query/key norms) is run by core on the batch the fixture records; the
mean next-token cross-entropy, its gradient with respect to the token embeddings W_E[tokens] and with respect
to every parameter are compared with transformers' float64 autograd. Parameters are matched to transformers'
names by the family's own loader (core/checkpoints), fed each tensor's element indices in place of its numbers:
it says where every element of every core array comes from (a transpose, GPT-NeoX's per-head QKV layout), and
core's gradients are put back into transformers' layout through it, no mapping written twice.

The error of one parameter's gradient is ‖core − torch‖ / ‖torch‖ over the fixture's record of it (the vector
itself, or a matrix's two random sketches G @ R and Sᵀ @ G, see the script): at most 1e-8 with core in float64
and 1e-4 with core in float32 (the checkpoint's own dtype), both against torch's float64. A few AdamW steps
(core/optim.py fed core's gradients) reach the parameters torch.optim.AdamW reaches.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest

from core import backprop
from core.checkpoints import FAMILIES, load_checkpoint
from core.checkpoints.tensors import Tensors
from core.functional import cross_entropy, cross_entropy_backward
from core.model import iter_arrays
from core.optim import AdamW, ParamVector

from .test_parity import as_float64

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDERS = {"gpt2-tiny": "gpt2-tiny", "bert-tiny": "bert-tiny"}  # the others: families/<name>
TOLERANCE = {np.float64: 1e-8, np.float32: 1e-4}


@pytest.fixture(scope="module")
def recorded() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "backward.npz") as z:
        return {k: z[k] for k in z.files}


def names(recorded) -> list[str]:
    return sorted(k.split("/")[0] for k in recorded if k.endswith("/loss") and not k.startswith("adamw/"))


NAMES = [
    "bert-tiny",
    "gpt-neo-local",
    "gpt-neox-parallel",
    "gpt-neox-sequential",
    "gpt2-tiny",
    "llama-gqa",
    "llama-mqa-bias",
    "mistral-window",
    "qwen2-sliding",
    "qwen3-qk-norm",
]


class IndexTensors(Tensors):
    """A checkpoint whose every tensor reads as the indices of its elements in one flat vector of all of them."""

    def __init__(self, folder: Path, prefixes: tuple[str, ...]):
        super().__init__(folder, prefixes)
        self.ranges: dict[str, tuple[int, tuple[int, ...]]] = {}  # the file's tensor name -> (start, shape)
        self.total = 0

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self._key(name)
        assert key is not None, name
        if key not in self.ranges:
            self.ranges[key] = (self.total, shape)
            self.total += math.prod(shape)
        start, _ = self.ranges[key]
        return np.arange(start, start + math.prod(shape)).reshape(shape)


class Layout:
    """Where each element of core's parameter arrays sits in transformers' tensors, by the family's loader."""

    def __init__(self, folder: Path):
        ckpt = load_checkpoint(folder)
        family = FAMILIES[ckpt.spec.family]
        self.prefixes = family.PREFIXES
        self.tensors = IndexTensors(folder, family.PREFIXES)
        self.index = family.params(self.tensors, ckpt.cfg)  # core's tree, of indices
        self.params, self.cfg = ckpt.params, ckpt.cfg

    def to_torch(self, tree) -> dict[str, np.ndarray]:
        """A tree shaped like core's params (gradients, say) as transformers' tensors, by the file's names."""
        flat = np.full(self.tensors.total, np.nan)
        values = dict(iter_arrays(tree))
        assert set(values) == {name for name, _ in iter_arrays(self.index)}, "one array per parameter"
        for name, idx in iter_arrays(self.index):
            flat[idx.ravel()] = values[name].ravel()
        return {
            key: flat[start : start + math.prod(shape)].reshape(shape)
            for key, (start, shape) in self.tensors.ranges.items()
        }


_layouts: dict[str, Layout] = {}


def layout(name: str) -> Layout:
    if name not in _layouts:
        _layouts[name] = Layout(FIXTURES / FOLDERS.get(name, f"families/{name}"))
    return _layouts[name]


def sketch(name: str, g: np.ndarray, probes: int) -> np.ndarray:
    """As the script records it: the vector itself, or G2 @ R and Sᵀ @ G2 side by side (one flat array)."""
    if g.ndim == 1:
        return g
    g2 = g.reshape(g.shape[0], -1)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    r, s = rng.standard_normal((g2.shape[1], probes)), rng.standard_normal((g2.shape[0], probes))
    return np.concatenate([(g2 @ r).ravel(), (s.T @ g2).ravel()])


def recorded_sketch(recorded, prefix: str, torch_name: str) -> np.ndarray:
    key = f"{prefix}/{torch_name}/"
    if key + "full" in recorded:
        return recorded[key + "full"]
    return np.concatenate([recorded[key + "right"].ravel(), recorded[key + "left"].ravel()])


def relative(ours: np.ndarray, theirs: np.ndarray, floor: float = 0.0) -> float:
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), floor, 1e-300))


def test_the_fixture_holds_every_family(recorded):
    assert names(recorded) == NAMES


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_equals_torch_autograd(recorded, name, dtype):
    lay = layout(name)
    params = as_float64(lay.params) if dtype is np.float64 else lay.params  # float32: the checkpoint as loaded
    r = {k[len(name) + 1 :]: v for k, v in recorded.items() if k.startswith(name + "/")}
    tokens, targets = r["tokens"], r["targets"]
    logits, _ = backprop.forward(params, lay.cfg, tokens, token_types=r.get("token_types"))
    loss, probs = cross_entropy(logits, targets)
    _, g = backprop.gradients(
        params, lay.cfg, tokens, cross_entropy_backward(probs, targets), token_types=r.get("token_types"), hooks=False
    )
    tol = TOLERANCE[dtype]
    assert g.params is not None and g.embed.dtype == dtype
    assert abs(loss - float(r["loss"])) <= tol * abs(float(r["loss"]))
    assert relative(g.embed, r["embed"]) <= tol, "d loss / d W_E[tokens]"
    ours = lay.to_torch(g.params)
    probes = int(recorded["meta/probes"])
    torch_names = {k[len(name) + 6 : k.rindex("/")] for k in recorded if k.startswith(name + "/grad/")}
    assert torch_names == set(ours), "one gradient per tensor, both ways"
    theirs = {t: recorded_sketch(recorded, f"{name}/grad", t) for t in torch_names}
    # A gradient that is exactly 0 in exact arithmetic (BERT's key bias: adding it to every key moves every score
    # of a query alike, which the softmax ignores) is rounding on both sides: its scale is floored at a
    # thousandth of the largest tensor's.
    floor = 1e-3 * max(np.linalg.norm(v) for v in theirs.values())
    errors = {t: relative(sketch(t, ours[t], probes), theirs[t], floor) for t in torch_names}
    worst = max(errors, key=errors.__getitem__)
    print(
        f"{name} {np.dtype(dtype).name}: loss {loss:.10f}, embed {relative(g.embed, r['embed']):.1e}, worst {worst} {errors[worst]:.1e}"
    )
    assert errors[worst] <= tol, f"{worst}: {errors[worst]:.2e}"


def test_adamw_steps_on_a_llama_equal_torch(recorded):
    settings = json.loads(str(recorded["meta/adamw"]))
    name = settings["model"]
    lay = layout(name)
    r = {k[len(name) + 1 :]: v for k, v in recorded.items() if k.startswith(name + "/")}
    vector = ParamVector(as_float64(lay.params))
    opt = AdamW(vector, weight_decay=settings["weight_decay"])
    losses = []
    for _ in range(settings["steps"]):
        loss, grads = backprop.loss_and_grads(vector.params, lay.cfg, r["tokens"], r["targets"])
        losses.append(loss)
        opt.step(vector.flatten(grads), settings["lr"])
    np.testing.assert_allclose(losses, recorded[f"adamw/{name}/losses"], rtol=1e-10)
    assert losses[-1] < losses[0]  # the steps learn
    ours = lay.to_torch(vector.params)
    probes = int(recorded["meta/probes"])
    prefix = f"adamw/{name}/param/"
    torch_names = {k[len(prefix) : k.rindex("/")] for k in recorded if k.startswith(prefix)}
    for t in torch_names:
        err = relative(sketch(t, ours[t], probes), recorded_sketch(recorded, f"adamw/{name}/param", t))
        assert err <= 1e-8, f"{t}: {err:.2e}"
