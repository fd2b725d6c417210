"""Reading config.json's fields: the names each family uses, its defaults, and readable refusals.

Hugging Face configs name the same thing differently per family (hidden_size, n_embd; rope_theta,
rotary_emb_base, rope_parameters.rope_theta) and have changed over transformers' versions; each
reader here accepts every spelling a saved config.json may hold, and takes transformers' own class
default when a field is absent.
"""

from __future__ import annotations

from ..config import ActFn
from ..errors import InputError
from ..i18n import _

# Hugging Face's names of activation functions -> core's (gelu_pytorch_tanh is GPT-2's tanh GELU).
ACT_FNS: dict[str, ActFn] = {
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def need(raw: dict, *names: str):
    """The first of `names` that config.json holds; InputError naming them if none."""
    for name in names:
        if raw.get(name) is not None:
            return raw[name]
    raise InputError(_("it has no {choices}").format(choices=" or ".join(repr(n) for n in names)))


def act_fn(name: object) -> ActFn:
    if name not in ACT_FNS:
        raise InputError(_("activation {name!r} is not one of {choices}").format(name=name, choices=", ".join(ACT_FNS)))
    return ACT_FNS[name]


def rope(raw: dict, default_theta: float = 10000.0, default_partial: float = 1.0) -> tuple[float, float]:
    """(base, fraction of each head rotated) from any of config.json's spellings.

    transformers 5 writes rope_parameters {"rope_type", "rope_theta", "partial_rotary_factor"};
    4.x wrote rope_theta and rope_scaling (null unless scaled), and GPT-NeoX rotary_emb_base and
    rotary_pct. Only plain rotary ("default") runs: the scaled variants (linear, dynamic, yarn,
    llama3, longrope) change the angles with the context length and are refused by name.
    """
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise InputError(_("rope_parameters should be an object, got {params!r}").format(params=params))
    if any(isinstance(v, dict) for v in params.values()):
        raise InputError(_("per-layer rope_parameters are not supported"))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise InputError(
            _(
                "rope scaling {kind!r} is not supported: only plain rotary embeddings run "
                "here (a config with rope_scaling null or rope_type 'default')"
            ).format(kind=kind)
        )
    theta = params.get("rope_theta", raw.get("rope_theta", raw.get("rotary_emb_base", default_theta)))
    partial = params.get(
        "partial_rotary_factor", raw.get("partial_rotary_factor", raw.get("rotary_pct", default_partial))
    )
    if not isinstance(theta, (int, float)) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise InputError(
            _("rotary base {theta!r} or partial factor {partial!r} is not a usable number").format(
                theta=theta, partial=partial
            )
        )
    return float(theta), float(partial)


def rotary_dim(d_head: int, partial: float) -> int:
    """The rotated dimensions of a head, as transformers computes them: int(d_head × factor)."""
    return int(d_head * partial)
