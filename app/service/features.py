"""Sparse-autoencoder features (/features, GET /api/v1/saes..., POST /api/v1/analysis/features): what a direction
in a hook's activations means, read through an SAE of EXPLORER_SAES_DIR (app/models/saes.py).

A text's features are one run of the SAE's model keeping only the SAE's hook, encoded by core.sae. A feature's
dashboard reads a scan of the model's own text (the text it was trained on where the recipe says so: Python's
documentation for the `text` recipe; else its default text), at most settings.sae_scan_max_tokens tokens, made
once per SAE and kept: in memory, and as an .npz in the runs folder's `.sae-scans` (written beside, then renamed).
"""

from __future__ import annotations

import builtins
import hashlib
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from app.models import pretrained
from app.models.catalog import Model
from app.models.saes import LabelledFeature, SAEEntry
from app.service.results import ModelResult
from app.service.spec import RunSpec
from app.service.views import ModelViews
from app.settings import runs_folder
from core import InputError, hook_names, hook_shape, run_with_cache
from core.hooks import hook_dims, layers_needed
from core.i18n import _
from core.model import unembedding
from core.params import forward_work
from core.recipes import DIGEST, python_docs
from core.sae import SAE
from core.sae_run import weights_digest
from core.threads import team_for

TOP_EXAMPLES = 10  # contexts a dashboard shows per feature
WINDOW = 8  # tokens either side of an example's largest activation
HISTOGRAM_BINS = 20  # of a feature's non-zero activations, from 0 to its largest
LOGIT_EFFECT_TOKENS = 10  # most positive and most negative tokens of W_dec[i] · W_U
ENCODE_BLOCK = 512  # tokens encoded at once in the scan: [512, d_sae] at a time, not [tokens, d_sae]
SCAN_FORMAT = 1  # bump when the .npz's arrays change


# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class SAEInfo:
    name: str
    model: str | None
    hook: str | None
    architecture: str | None
    d_in: int | None
    d_sae: int | None
    labelled_features: list[LabelledFeature]
    problem: str | None


class FeatureActivation(TypedDict):  # a dict: the API sends these as they are (app/api/sae_models.py)
    index: int
    activation: float


@dataclass(frozen=True)
class FeaturesView(ModelResult):
    sae: str
    hook: str
    d_sae: int
    features: list[list[FeatureActivation]]  # [pos] -> non-zero, largest first
    labels: dict[int, str]
    # [pos, d_sae], every feature's, when asked for (the page's heatmap reads its most active features'); the API's
    # answer needs only `features`, and is computed without ever holding [pos, d_sae]
    activations: np.ndarray | None


@dataclass(frozen=True)
class Example:
    tokens: list[str]
    activations: list[float]
    max_position: int  # where in `tokens` the feature is largest


@dataclass(frozen=True)
class LogitToken:
    token: str
    id: int
    value: float


@dataclass(frozen=True)
class Histogram:
    edges: list[float]  # HISTOGRAM_BINS + 1, from 0 to the largest activation
    counts: list[int]


@dataclass(frozen=True)
class LogitEffect:
    positive: list[LogitToken]
    negative: list[LogitToken]


@dataclass(frozen=True)
class FeatureDashboard:
    sae: str
    model: str
    hook: str
    index: int
    d_sae: int
    label: str | None
    density: float  # fraction of the scanned tokens where the feature is non-zero
    max_activation: float
    tokens_scanned: int
    top_examples: list[Example]
    histogram: Histogram
    logit_effect: LogitEffect


@dataclass
class Scan:
    """What a dashboard reads, for every feature at once: [d_sae] counts and maxima, [d_sae, TOP_EXAMPLES]
    positions (−1: none) and values of the largest activations, [d_sae, HISTOGRAM_BINS] counts."""

    ids: np.ndarray  # [tokens] the scanned token ids, in chunks of `chunk`
    chunk: int
    count: np.ndarray
    max: np.ndarray
    top_pos: np.ndarray
    top_val: np.ndarray
    hist: np.ndarray


_SCANS: dict[str, Scan] = {}  # by cache key, per process
_SCAN_LOCK = threading.Lock()


def corpus(model: Model) -> str:
    """The text a model's SAE is scanned over: what the model was trained on where that is a text."""
    recipe = pretrained.trained_recipe(model.loader.spec) if model.loader is not None else None
    if recipe == "text":
        return python_docs()
    return model.default_text or "the "


def top_features(idx: np.ndarray, val: np.ndarray) -> list[list[FeatureActivation]]:
    """core's SAE.top_activations ([pos, k] indices, −1 for none; values) as each token's list, largest first."""
    return [
        [{"index": i, "activation": v} for i, v in zip(ri, rv) if i >= 0] for ri, rv in zip(idx.tolist(), val.tolist())
    ]


# ------------------------------------------------------------------ the views


class FeatureViews:
    """The SAE views of one request, on its ModelViews' catalogue, settings and limits."""

    def __init__(self, views: ModelViews):
        self.views = views
        self.settings = views.settings
        self.saes = views.catalog.saes

    def problem(self, entry: SAEEntry, model: Model | None = None) -> str | None:
        """Why this SAE cannot be used on its model (or this configuration of it), or None."""
        if entry.static_problem or entry.cfg is None:
            return entry.static_problem
        try:
            model = model or self.views.model(entry.known_cfg.model_name)
        except InputError as e:
            return _("it reads model {model!r}, which this server cannot run: {error}").format(
                model=entry.known_cfg.model_name, error=e
            )
        return self._hook_problem(entry, model.cfg, model.name) or self._weights_problem(entry, model)

    @staticmethod
    def _weights_problem(entry: SAEEntry, model: Model) -> str | None:
        """An SAE trained here on a model run names that run's weights by their digest (core/sae_run.py): a run
        trained further since has other weights under the same name, whose stream the SAE was not fitted to."""
        digest = (entry.known_cfg.metadata.get("settings") or {}).get(DIGEST)
        if not digest or model.loader is None or weights_digest(model.loader.spec.path) == digest:
            return None
        return _(
            "it was trained on model {model!r}'s weights before that run trained further: train an SAE on its "
            "weights now"
        ).format(model=model.name)

    @staticmethod
    def _hook_problem(entry: SAEEntry, cfg, model_name: str) -> str | None:
        hook = entry.known_cfg.hook_name
        if hook not in hook_names(cfg):
            return _("it reads hook {hook!r}, which model {model!r} does not have").format(hook=hook, model=model_name)
        if not hook_shape(hook, cfg).startswith("[pos,"):
            return _("it reads hook {hook!r}, whose activations are not one vector per token").format(hook=hook)
        dims = hook_dims(hook, cfg, 1)[1:]
        width = math.prod(dims) if entry.known_cfg.reshape_activations == "hook_z" else dims[-1]
        if width != entry.known_cfg.d_in:
            return _("its d_in is {d_in}, but {model!r}'s {hook} has {width} numbers per token").format(
                d_in=entry.known_cfg.d_in, model=model_name, hook=hook, width=width
            )
        return None

    def list(self) -> list[SAEInfo]:
        return [
            SAEInfo(e.name, e.model, e.hook, e.architecture, e.d_in, e.d_sae, e.labelled_features, self.problem(e))
            for e in self.saes.values()
        ]

    def _usable(self, name: str) -> SAEEntry:
        entry = self.saes.get_entry(name)
        if (problem := self.problem(entry)) is not None:
            raise InputError(_("SAE {name!r} cannot be used: {problem}").format(name=name, problem=problem))
        return entry

    def files(self, name: str) -> builtins.list[Path]:
        """The files of an SAE's folder a download holds: cfg.json, the weights, labels.json if there is one."""
        entry = self.saes.get_entry(name)
        files = [entry.folder / f for f in ("cfg.json", "sae_weights.safetensors", "labels.json")]
        if not all(f.is_file() for f in files[:2]):
            raise InputError(
                _("SAE {name!r} cannot be downloaded: {problem}").format(name=name, problem=entry.static_problem)
            )
        return [f for f in files if f.is_file()]

    # ---------------------------------------------------------------- a text's features

    def features(self, spec: RunSpec, sae_name: str, top_k: int, *, dense: bool = False) -> FeaturesView:
        """One run keeping the SAE's hook, encoded: each token's non-zero features, largest first (and with `dense`,
        every feature's activation at every token). The pass stops at the SAE's layer; the encode runs a block of
        rows at a time, on a team of threads when the request computes alone (settings.lend_threads, core.threads)."""
        entry = self._usable(sae_name)
        cfg_sae = entry.known_cfg
        if spec.model != cfg_sae.model_name:
            raise InputError(
                _("SAE {sae!r} reads model {its!r} ({hook}), not {model!r}: choose model {its!r}").format(
                    sae=sae_name, its=cfg_sae.model_name, hook=cfg_sae.hook_name, model=spec.model
                )
            )
        st = self.views.setup(spec)
        if (problem := self._hook_problem(entry, st.cfg, st.model.name)) is not None:
            raise InputError(_("SAE {sae!r} does not fit this run: {problem}").format(sae=sae_name, problem=problem))
        n, hook = st.n, cfg_sae.hook_name
        blocks = layers_needed([hook], st.cfg)  # the pass stops at the SAE's layer: nothing after it is read
        p = self.views.load(
            st,
            forward_work(st.cfg, n, stop_at_layer=blocks) + n * cfg_sae.d_in * cfg_sae.d_sae,
            n * cfg_sae.d_sae,
            _("the text's length"),
        )
        sae = entry.load()
        _logits, cache = run_with_cache(p.params, p.cfg, p.ids, names=[hook], logits=False, stop_at_layer=blocks)
        x = cache[hook]
        acts = np.empty((len(x), cfg_sae.d_sae), sae.dtype) if dense else None  # [pos, d_sae]
        with team_for(len(x)) as team:
            idx, val = sae.top_activations(x, top_k, team=team, dense=acts)
        labels = {f.index: f.label for f in entry.labelled_features}
        return FeaturesView(p, sae_name, hook, cfg_sae.d_sae, top_features(idx, val), labels, acts)

    # ---------------------------------------------------------------- a feature's dashboard

    def dashboard(self, sae_name: str, index: int) -> FeatureDashboard:
        entry = self._usable(sae_name)
        cfg_sae = entry.known_cfg
        if not 0 <= index < cfg_sae.d_sae:
            raise InputError(
                _("feature {index} is not in SAE {sae!r}: it has features 0 to {last}").format(
                    index=index, sae=sae_name, last=cfg_sae.d_sae - 1
                )
            )
        model = self.views.model(cfg_sae.model_name)
        sae = entry.load()
        params = model.weights(model.cfg, model.default_seed, model.reader.encode(model.default_text or "a"))
        scan = self.scan(entry, model, sae, params)
        examples = self._examples(scan, index, model, sae, params, cfg_sae.hook_name)
        n_tokens = len(scan.ids)
        top = float(scan.max[index])
        edges = np.linspace(0.0, top, HISTOGRAM_BINS + 1) if top > 0 else np.zeros(HISTOGRAM_BINS + 1)
        return FeatureDashboard(
            sae=sae_name,
            model=model.name,
            hook=cfg_sae.hook_name,
            index=index,
            d_sae=cfg_sae.d_sae,
            label=entry.label(index),
            density=float(scan.count[index]) / n_tokens if n_tokens else 0.0,
            max_activation=top,
            tokens_scanned=n_tokens,
            top_examples=examples,
            histogram=Histogram([float(e) for e in edges], [int(c) for c in scan.hist[index]]),
            logit_effect=self._logit_effect(sae, index, params, model),
        )

    @staticmethod
    def _logit_effect(sae: SAE, index: int, params, model: Model) -> LogitEffect:
        """W_dec[i] · W_U: the logits one unit of the feature adds, read straight through the unembedding (the
        later layers and the final norm aside). Empty when the SAE's vectors are not the stream's width."""
        W_U, _b = unembedding(params)
        direction = sae.feature_direction(index)
        if direction.shape[0] != W_U.shape[0]:
            return LogitEffect([], [])
        effect = direction.astype(np.float64) @ np.asarray(W_U, dtype=np.float64)  # [d_vocab]
        order = np.argsort(-effect, kind="stable")
        k = min(LOGIT_EFFECT_TOKENS, effect.size)
        tok = model.reader.token_str
        as_tokens = lambda ids: [LogitToken(tok(int(i)), int(i), float(effect[i])) for i in ids]  # noqa: E731
        return LogitEffect(as_tokens(order[:k]), as_tokens(order[::-1][:k]))

    def _examples(self, scan: Scan, index: int, model: Model, sae: SAE, params, hook: str) -> builtins.list[Example]:
        """The contexts of the feature's largest activations, each its chunk re-run and encoded around the
        largest token (the scan keeps positions, not every token's activations)."""
        out = []
        tok = model.reader.token_str
        for pos, value in zip(scan.top_pos[index], scan.top_val[index]):
            if pos < 0 or value <= 0:
                break
            start = (pos // scan.chunk) * scan.chunk
            ids = scan.ids[start : min(start + scan.chunk, len(scan.ids))]
            at = int(pos - start)
            lo, hi = max(0, at - WINDOW), min(len(ids), at + WINDOW + 1)
            cfg = model.configure({}, len(ids))
            _logits, cache = run_with_cache(  # causal: [:hi] is enough
                params, cfg, ids[:hi], names=[hook], logits=False, stop_at_layer=layers_needed([hook], cfg)
            )
            acts = sae.encode(cache[hook][lo:hi])[:, index]
            out.append(Example([tok(int(i)) for i in ids[lo:hi]], [float(a) for a in acts], at - lo))
        return out

    def _scan_key(self, entry: SAEEntry, model: Model) -> str:
        weights = entry.folder / "sae_weights.safetensors"
        stat = weights.stat()
        cfg_bytes = (entry.folder / "cfg.json").read_bytes()
        parts = [
            str(SCAN_FORMAT),
            entry.name,
            model.name,
            model.description,
            str(self.settings.sae_scan_max_tokens),
            f"{stat.st_size}:{stat.st_mtime_ns}",
            hashlib.sha256(cfg_bytes).hexdigest(),
        ]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]

    def _scan_file(self, key: str) -> Path:
        return runs_folder(self.settings) / ".sae-scans" / f"{key}.npz"

    def scan(self, entry: SAEEntry, model: Model, sae: SAE, params) -> Scan:
        """The SAE over its model's text, every feature at once, made once per SAE (this process's memory, then
        the runs folder's .sae-scans, then computed)."""
        key = self._scan_key(entry, model)
        with _SCAN_LOCK:
            if key in _SCANS:
                return _SCANS[key]
            path = self._scan_file(key)
            try:
                with np.load(path) as f:
                    scan = Scan(**{name: f[name] for name in f.files if name != "chunk"}, chunk=int(f["chunk"]))
            except (OSError, KeyError, ValueError):
                scan = self._compute_scan(entry, model, sae, params)
                self._save(path, scan)
            _SCANS[key] = scan
            return scan

    @staticmethod
    def _save(path: Path, scan: Scan) -> None:
        """Written beside, then renamed: a reader finds the whole file or none. No writable folder: memory only."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".scan-", suffix=".npz", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{k: v for k, v in vars(scan).items()})
            os.replace(tmp, path)
        except OSError:
            pass

    def _compute_scan(self, entry: SAEEntry, model: Model, sae: SAE, params) -> Scan:
        cap = self.settings.sae_scan_max_tokens
        text = corpus(model)
        ids = np.asarray(model.reader.encode(text[: 8 * cap]).ids[:cap], dtype=np.int64)
        chunk = max(1, min(model.cfg.n_ctx, self.settings.max_tokens))
        hook, d_sae = entry.known_cfg.hook_name, entry.known_cfg.d_sae
        stream = []
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            cfg = model.configure({}, len(part))
            _logits, cache = run_with_cache(
                params, cfg, part, names=[hook], logits=False, stop_at_layer=layers_needed([hook], cfg)
            )
            stream.append(sae.flatten(cache[hook]))
        x = np.concatenate(stream) if stream else np.zeros((0, entry.known_cfg.d_in), sae.dtype)  # [tokens, d_in]
        count = np.zeros(d_sae, np.int64)
        best = np.zeros(d_sae, np.float64)
        top_val = np.zeros((d_sae, TOP_EXAMPLES), np.float64)
        top_pos = np.full((d_sae, TOP_EXAMPLES), -1, np.int64)
        for start in range(0, len(x), ENCODE_BLOCK):  # pass 1: counts, maxima, the largest activations
            acts = sae.encode(x[start : start + ENCODE_BLOCK]).T.astype(np.float64)  # [d_sae, block]
            count += (acts > 0).sum(axis=1)
            best = np.maximum(best, acts.max(axis=1, initial=0.0))
            vals = np.concatenate([top_val, acts], axis=1)
            poss = np.concatenate([top_pos, np.broadcast_to(np.arange(start, start + acts.shape[1]), acts.shape)], 1)
            order = np.lexsort((poss, -vals), axis=1)[:, :TOP_EXAMPLES]  # largest first, then the earlier token
            top_val, top_pos = np.take_along_axis(vals, order, 1), np.take_along_axis(poss, order, 1)
        top_pos[top_val <= 0] = -1
        hist = np.zeros((d_sae, HISTOGRAM_BINS), np.int64)
        for start in range(0, len(x), ENCODE_BLOCK):  # pass 2: each feature's histogram, 0 to its largest
            acts = sae.encode(x[start : start + ENCODE_BLOCK]).T.astype(np.float64)
            feature, _pos = np.nonzero(acts > 0)
            scaled = acts[acts > 0] / best[feature] * HISTOGRAM_BINS
            bins = np.minimum(scaled.astype(np.int64), HISTOGRAM_BINS - 1)
            hist += np.bincount(feature * HISTOGRAM_BINS + bins, minlength=d_sae * HISTOGRAM_BINS).reshape(hist.shape)
        return Scan(ids, chunk, count, best, top_pos, top_val, hist)
