"""Training a sparse autoencoder on one hook's activations, with SAELens's objectives, in NumPy.

The losses are SAELens's (`TrainingSAE.training_forward_pass`), so an SAE trained here means what one
trained there means ("Towards Monosemanticity"; Gao et al. 2024 for top-k and its auxiliary loss):

    mse      = Σ_d (x̂ − x)² averaged over the batch                       (both architectures)
    standard:  + l1_coefficient · mean_b Σ_i acts[b, i] · ‖W_dec[i]‖          (the L1 penalty, decoder-norm weighted)
    topk:      + aux_coefficient · scale · mean_b Σ_d (ê − (x − x̂))²        (AuxK: the top k_aux dead features
               reconstruct what the live ones missed; k_aux = d_in / 2, scale = min(dead / k_aux, 1),
               ê = acts_aux @ W_dec, no bias; the residual is held fixed)
    jumprelu:  + l0_coefficient · mean_b Σ_i H(pre[b, i] − θ_i)             (the L0 penalty, SAELens's "step" mode;
               acts = pre · H(pre − θ), H the step; Rajamanoharan et al. 2024, "Jumping Ahead")

JumpReLU's step has no gradient; SAELens (JumpReLUTrainingSAE, DeepMind's setting `jumprelu_ste_to_input`
false) gives the threshold θ a straight-through pseudo-gradient through a rectangle kernel of width
`jumprelu_bandwidth` ε, K(u) = 1 when |u| < ½: from acts, ∂/∂θ_i = −Σ_b (θ_i / ε) K((pre − θ_i) / ε) ∂L/∂acts;
from the L0 term, −Σ_b (1 / ε) K((pre − θ_i) / ε) ∂L/∂H. The pre-activations get acts' gradient where
pre > θ, and nothing from the L0 term. θ is the parameter itself (SAELens 6.54 trains `threshold`, not
log_threshold), starts at `jumprelu_init_threshold` for every feature and is projected onto θ ≥ 0 before
every step; the decoder's rows are left free (no norm in the objective, no renormalising).

A feature is dead when it has not fired in the last `dead_window` steps. The gradients are written out
below (checked against finite differences in tests/core/test_sae_train.py) and the update is core's
AdamW with no weight decay (SAELens's Adam: betas 0.9, 0.999). Initialisation as SAELens: decoder rows in
random directions of norm `decoder_init_norm`, the encoder their transpose, biases zero.

Shapes: x [batch, d_in]; W_enc [d_in, d_sae]; W_dec [d_sae, d_in]; pre and acts [batch, d_sae].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .errors import InputError
from .i18n import N_, _
from .optim import AdamW, ParamVector
from .sae import SAE, SAEConfig

SAE_KINDS = ("standard", "topk", "jumprelu")  # every one of core/sae.py ARCHITECTURES
# what a training run may ask for (core/recipes.py TrainSettings states them; core/sae_run.py checks them)
MAX_D_SAE = 4096
MAX_SAE_K = 256
MAX_L1 = 100.0


def _jumprelu(default: float, *, help: str, label: str, le: float, gt: float | None = None) -> Any:
    bounds = {"gt": gt} if gt is not None else {"ge": 0}
    setting = {"help": f"{help}; null: {default:g} (SAELens's default)", "label": label, "le": le, **bounds}
    return field(default=default, metadata={"architecture": "jumprelu", "setting": setting})


@dataclass(frozen=True)
class SAETraining:
    """How to train: the objective's coefficients and the optimiser's settings (SAELens's defaults)."""

    steps: int = 2000
    batch_size: int = 1024
    lr: float = 3e-4
    seed: int = 0
    l1_coefficient: float = 1.0  # standard only
    aux_coefficient: float = 1.0  # topk only: the AuxK loss's weight
    # jumprelu's, SAELens's names and defaults (JumpReLUTrainingSAEConfig's); each field's "setting" is what
    # core/recipes.py TrainSettings declares for it (the API's description, the page's label, a request's bounds)
    l0_coefficient: float = _jumprelu(1.0, help="sae, jumprelu: the L0 penalty's weight", label=N_("L0 weight"), le=100)
    jumprelu_init_threshold: float = _jumprelu(
        0.01, help="sae, jumprelu: every feature's threshold at the start", label=N_("Initial threshold"), le=10
    )
    jumprelu_bandwidth: float = _jumprelu(
        0.05, help="sae, jumprelu: the threshold's pseudo-gradient kernel width ε", label=N_("Bandwidth"), gt=0, le=10
    )
    dead_window: int = 200  # steps without firing after which a feature counts as dead
    decoder_init_norm: float = 0.1


# jumprelu's settings: SAETraining's fields marked so, and what TrainSettings declares for each
JUMPRELU_SETTINGS = {f.name: f.metadata["setting"] for f in fields(SAETraining) if f.metadata.get("architecture")}
JUMPRELU_FIELDS = tuple(JUMPRELU_SETTINGS)


@dataclass
class SAEStepRecord:
    """What one step measured, on its batch (the metrics a training run streams)."""

    step: int
    loss: float
    mse: float  # mean over the batch of Σ_d (x̂ − x)²
    explained_variance: float  # 1 − Σ (x − x̂)² / Σ (x − mean x)², over the batch
    l0: float  # features active per token, averaged over the batch
    dead_fraction: float  # features that have not fired in the last dead_window steps


@dataclass
class TrainingState:
    steps_since_fired: np.ndarray  # [d_sae], int
    records: list[SAEStepRecord] = field(default_factory=list)


def check_trainable(cfg: SAEConfig) -> None:
    """Every architecture SAEConfig reads trains here; not with the topk rescaling or hook_z's reshaping."""
    if cfg.reshape_activations != "none" or cfg.rescale_acts_by_decoder_norm:
        raise InputError(_("SAEs are trained here on a hook's vectors as they are, with no rescaling"))


def init_sae(cfg: SAEConfig, training: SAETraining) -> SAE:
    """A new SAE as SAELens starts one (float32 or float64, as cfg says); a jumprelu SAE's thresholds all
    jumprelu_init_threshold."""
    check_trainable(cfg)
    rng = np.random.default_rng(training.seed)
    dtype = np.dtype(cfg.dtype)
    W_dec = rng.standard_normal((cfg.d_sae, cfg.d_in))
    W_dec *= training.decoder_init_norm / np.linalg.norm(W_dec, axis=1, keepdims=True)
    W_dec = W_dec.astype(dtype)
    return SAE(
        cfg=cfg,
        W_enc=np.ascontiguousarray(W_dec.T),
        b_enc=np.zeros(cfg.d_sae, dtype=dtype),
        W_dec=W_dec,
        b_dec=np.zeros(cfg.d_in, dtype=dtype),
        threshold=np.full(cfg.d_sae, training.jumprelu_init_threshold, dtype=dtype)
        if cfg.architecture == "jumprelu"
        else None,
    )


def _aux_acts(pre: np.ndarray, dead: np.ndarray, k_aux: int) -> np.ndarray:
    """[batch, d_sae]: each row's k_aux largest pre-activations among dead features, zero elsewhere
    (not rectified, as SAELens's calculate_topk_aux_acts)."""
    dead_idx = np.flatnonzero(dead)
    among = pre[:, dead_idx]  # [batch, n_dead]
    top = np.argpartition(among, -k_aux, axis=1)[:, -k_aux:]  # [batch, k_aux] into dead_idx
    out = np.zeros_like(pre)
    np.put_along_axis(out, dead_idx[top], np.take_along_axis(among, top, axis=1), axis=1)
    return out


def _gate(sae: SAE, pre: np.ndarray) -> np.ndarray:
    """[batch, d_sae] bool: the features the architecture lets through (relu's, and top-k's k largest of a row).
    The k largest are those at or above the row's k-th largest value (np.partition: half argpartition's time
    here); as torch.topk, exactly k unless values tie there, which continuous pre-activations do not."""
    if sae.cfg.architecture == "jumprelu":
        assert sae.threshold is not None  # SAE's own checks require it for jumprelu
        return pre > sae.threshold  # θ ≥ 0 (projected before every step): relu's gate too
    active = pre > 0
    k = sae.cfg.k
    if sae.cfg.architecture == "topk" and k is not None and k < pre.shape[1]:
        kth = np.partition(pre, pre.shape[1] - k, axis=1)[:, pre.shape[1] - k]  # [batch]: the k-th largest
        active &= pre >= kth[:, None]
    return active


def loss_and_grads(
    sae: SAE, x: np.ndarray, training: SAETraining, dead: np.ndarray | None = None
) -> tuple[dict[str, float], dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The objective on one batch and its gradient for every array of `sae`.

    Returns (losses, grads by array name, acts [batch, d_sae], x̂ [batch, d_in]). `dead` [d_sae] marks
    the dead features for the top-k auxiliary loss (None: none dead). Computed in the SAE's dtype with as few
    [batch, d_sae] passes as the formulas allow (bench/sae_train.py measures it against SAELens's trainer)."""
    cfg = sae.cfg
    B = x.shape[0]
    sae_in = x - sae.b_dec if cfg.apply_b_dec_to_input else x
    pre = sae_in @ sae.W_enc
    pre += sae.b_enc  # [batch, d_sae]
    active = _gate(sae, pre)
    acts = pre * active  # relu, and top-k's rule: the gate's entries of pre, zero elsewhere
    x_hat = acts @ sae.W_dec
    x_hat += sae.b_dec  # [batch, d_in]
    err = x_hat - x
    losses = {"mse": float(np.vdot(err, err) / B)}

    d_xhat = err * err.dtype.type(2.0 / B)  # [batch, d_in]
    d_W_dec = acts.T @ d_xhat  # [d_sae, d_in]
    d_pre = d_xhat @ sae.W_dec.T  # [batch, d_sae]: d_acts, gated below
    d_pre_aux = None  # what the top-k auxiliary loss sends to the pre-activations
    grads: dict[str, np.ndarray] = {}
    if cfg.architecture == "jumprelu":
        assert sae.threshold is not None
        theta, eps, c = sae.threshold, training.jumprelu_bandwidth, training.l0_coefficient
        losses["l0"] = float(c * np.count_nonzero(active) / B)
        near = np.abs((pre - theta) / eps) < 0.5  # the rectangle kernel K((pre − θ) / ε), as SAELens's strict bounds
        # acts' pseudo-gradient (θ / ε) K d_acts and the L0 term's (1 / ε) K c / B, both negated for θ
        d_theta = (d_pre * near).sum(axis=0) * theta + np.count_nonzero(near, axis=0).astype(theta.dtype) * (c / B)
        grads["threshold"] = d_theta * theta.dtype.type(-1 / eps)
    elif cfg.architecture == "standard":
        norms = np.linalg.norm(sae.W_dec, axis=1)  # [d_sae]
        c = training.l1_coefficient
        fired = acts.sum(axis=0)  # [d_sae]
        losses["l1"] = float(c * (fired @ norms) / B)
        d_pre += norms * d_pre.dtype.type(c / B)
        # d‖W_dec[i]‖ = W_dec[i] / ‖W_dec[i]‖, times Σ_b acts[b, i]
        d_W_dec += (c / B) * (fired / np.where(norms > 0, norms, 1))[:, None] * sae.W_dec
    elif dead is not None and dead.any():
        k_aux = x.shape[1] // 2
        n_dead = int(dead.sum())
        scale = min(n_dead / k_aux, 1.0)
        k_aux = min(k_aux, n_dead)
        aux = _aux_acts(pre, dead, k_aux)  # [batch, d_sae]
        residual = x - x_hat  # held fixed (detached in SAELens)
        e = aux @ sae.W_dec - residual
        w = training.aux_coefficient * scale
        losses["aux"] = float(w * (e * e).sum() / B)
        d_e = (2.0 * w / B) * e
        d_W_dec += aux.T @ d_e
        d_pre_aux = (d_e @ sae.W_dec.T) * (aux != 0)  # flows into the chosen pre-activations only
    d_pre *= active  # relu's and top-k's gate: only active features pass
    if d_pre_aux is not None:
        d_pre += d_pre_aux
    d_b_enc = d_pre.sum(axis=0)
    grads |= {
        "W_enc": sae_in.T @ d_pre,
        "b_enc": d_b_enc,
        "W_dec": d_W_dec,
        # sae_in = x − b_dec: b_dec's share through the encoder is −Σ_b d_pre @ W_encᵀ = −W_enc @ Σ_b d_pre
        "b_dec": d_xhat.sum(axis=0) - (sae.W_enc @ d_b_enc) * cfg.apply_b_dec_to_input,
    }
    grads = {name: grads[name] for name in sae.arrays()}  # the SAE's order (ParamVector's)
    losses["loss"] = sum(losses.values())
    return losses, grads, acts, x_hat


class SAETrainer:
    """One SAE's training, a step at a time: the arrays, AdamW's state, the batch order and which features
    fired lately. `train_sae` runs one to its last step; a training run (core/sae_run.py) snapshots it
    (`state`) and continues it bit for bit (`restore`)."""

    def __init__(self, activations: np.ndarray, cfg: SAEConfig, training: SAETraining, sae: SAE | None = None):
        check_trainable(cfg)
        if activations.ndim != 2 or activations.shape[1] != cfg.d_in:
            raise InputError(
                _("an SAE of d_in={d_in} trains on vectors of {d_in} numbers, not {shape}").format(
                    d_in=cfg.d_in, shape=tuple(activations.shape)
                )
            )
        self.training = training
        self.sae = sae or init_sae(cfg, training)
        dtype = np.dtype(cfg.dtype)
        self.data = np.asarray(activations, dtype=dtype)
        self.vector = ParamVector(self.sae.arrays(), dtype=dtype)
        for name, array in self.vector.params.items():  # views into the flat vector from now on
            setattr(self.sae, name, array)
        self.opt = AdamW(self.vector, betas=(0.9, 0.999), weight_decay=0.0)
        self.rng = np.random.default_rng(training.seed + 1)
        self.since = np.zeros(cfg.d_sae, dtype=np.int64)
        self.step = 0

    def train_step(self) -> SAEStepRecord:
        training, data = self.training, self.data
        batch = data[self.rng.integers(0, len(data), size=min(training.batch_size, len(data)))]
        dead = self.since >= training.dead_window
        if self.sae.threshold is not None:  # jumprelu: θ ≥ 0, projected as SAELens does before each step
            np.maximum(self.sae.threshold, 0, out=self.sae.threshold)
        losses, grads, acts, x_hat = loss_and_grads(self.sae, batch, training, dead)
        self.opt.step(self.vector.flatten(grads), training.lr)
        active = acts > 0
        fired = active.any(axis=0)
        self.since = np.where(fired, 0, self.since + 1)
        centred = batch - batch.mean(axis=0)
        total = float((centred * centred).sum())
        self.step += 1
        return SAEStepRecord(
            step=self.step,
            loss=losses["loss"],
            mse=losses["mse"],
            explained_variance=1.0 - losses["mse"] * len(batch) / total if total > 0 else float("nan"),
            l0=np.count_nonzero(active) / len(batch),
            dead_fraction=float((self.since >= training.dead_window).mean()),
        )

    def state(self) -> dict:
        """What continues this training exactly: arrays (flat), AdamW's moments and steps, the batch
        order's generator state (JSON-able) and each feature's steps since it fired."""
        s = self.opt.state
        return {
            "step": self.step,
            "params": self.vector.flat.copy(),
            "m": s.m.copy(),
            "v": s.v.copy(),
            "t": s.t,
            "rng": self.rng.bit_generator.state,
            "since": self.since.copy(),
        }

    def restore(self, state: dict) -> None:
        self.vector.flat[...] = state["params"]
        self.opt.state.m[...] = state["m"]
        self.opt.state.v[...] = state["v"]
        self.opt.state.t = int(state["t"])
        self.rng.bit_generator.state = state["rng"]
        self.since = np.asarray(state["since"], dtype=np.int64).copy()
        self.step = int(state["step"])


def train_sae(
    activations: np.ndarray,
    cfg: SAEConfig,
    training: SAETraining,
    *,
    sae: SAE | None = None,
    on_step: Callable[[SAEStepRecord, SAE], bool | None] | None = None,
) -> tuple[SAE, list[SAEStepRecord]]:
    """Train on rows of `activations` [n, d_in], drawn in random batches (the seed fixes the order).

    `on_step(record, sae)` is called after every step; returning True stops early (a cancel). Passing
    `sae` continues from it (its optimiser state starts fresh)."""
    trainer = SAETrainer(activations, cfg, training, sae)
    records = []
    for _step in range(training.steps):
        record = trainer.train_step()
        records.append(record)
        if on_step is not None and on_step(record, trainer.sae):
            break
    return trainer.sae, records
