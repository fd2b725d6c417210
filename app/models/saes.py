"""The sparse autoencoders this server can use, by name: the SAEs shipped with the app (core/trained/saes/, made by
`make trained-models`) and EXPLORER_SAES_DIR's subfolders, in SAELens's format (a folder of EXPLORER_SAES_DIR
named as a shipped one takes its place), then the SAEs trained here.

Each subfolder holding a `cfg.json` and `sae_weights.safetensors` (SAELens's `SAE.save_model`) is an SAE named
after the folder; an optional `labels.json` names some of its features, `[{"index": 3, "label": "..."}]`.
The folders are read once, at start-up, like the model catalogue (cfg.json and labels.json only); the
weights load on first use (core.sae.load_sae) and are kept. A folder that cannot be read is still listed,
with the reason (`problem`), so a teacher sees why it is missing; it never fails the listing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.training.base import StoreUnavailable, TrainingStore, is_sae_run_id
from core import InputError
from core.checkpoints import TRAINED_DIR
from core.i18n import _
from core.sae import CONFIG_FILE, SAE, WEIGHTS_FILE, SAEConfig, load_sae

LABELS_FILE = "labels.json"
SHIPPED_SAES_DIR = TRAINED_DIR / "saes"  # the SAEs that ship with the app (in the wheel and the image)


@dataclass(frozen=True)
class LabelledFeature:
    index: int
    label: str


@dataclass
class SAEEntry:
    """One SAE folder: what its cfg.json says (None where it could not be read) and, once loaded, its arrays."""

    name: str
    folder: Path
    cfg: SAEConfig | None
    labelled_features: list[LabelledFeature] = field(default_factory=list)
    static_problem: str | None = None  # why the folder cannot be used, known when it was read
    _sae: SAE | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def known_cfg(self) -> SAEConfig:
        """The cfg of an SAE that can be used (a folder whose cfg.json could not be read has none, and the
        service refuses it before it asks)."""
        if self.cfg is None:
            raise RuntimeError(f"SAE {self.name!r} has no cfg: {self.static_problem}")
        return self.cfg

    @property
    def model(self) -> str | None:
        return self.cfg.model_name if self.cfg else None

    @property
    def hook(self) -> str | None:
        return self.cfg.hook_name if self.cfg else None

    @property
    def architecture(self) -> str | None:
        return self.cfg.architecture if self.cfg else None

    @property
    def d_in(self) -> int | None:
        return self.cfg.d_in if self.cfg else None

    @property
    def d_sae(self) -> int | None:
        return self.cfg.d_sae if self.cfg else None

    def label(self, index: int) -> str | None:
        return next((f.label for f in self.labelled_features if f.index == index), None)

    def load(self) -> SAE:
        """The SAE's arrays, read once (InputError when the weights do not fit the cfg.json)."""
        with self._lock:
            if self._sae is None:
                self._sae = load_sae(self.folder)
            return self._sae


def _labels(folder: Path, d_sae: int) -> list[LabelledFeature]:
    """labels.json, checked: a list of {index, label}, each index a feature of the SAE (InputError otherwise)."""
    path = folder / LABELS_FILE
    if not path.is_file():
        return []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(_("{folder}/labels.json is not JSON: {error}").format(folder=folder.name, error=e)) from None
    out = []
    for item in raw if isinstance(raw, list) else [None]:
        index = item.get("index") if isinstance(item, dict) else None
        label = item.get("label") if isinstance(item, dict) else None
        if not (isinstance(index, int) and 0 <= index < d_sae and isinstance(label, str) and label.strip()):
            raise InputError(
                _(
                    '{folder}/labels.json must be a list of {{"index": 0 … {last}, "label": "a text"}}; it has {item!r}'
                ).format(folder=folder.name, last=d_sae - 1, item=item)
            )
        out.append(LabelledFeature(index, label.strip()))
    return sorted(out, key=lambda f: f.index)


def read_entry(folder: Path, name: str | None = None) -> SAEEntry:
    """One folder as an entry (named after it, or `name`); what is wrong with it in `static_problem`, never an
    exception."""
    entry = _read_entry(folder)
    if name is not None:
        entry.name = name
    return entry


def _read_entry(folder: Path) -> SAEEntry:
    cfg = None
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise InputError(_("{folder}/cfg.json is not a JSON object").format(folder=folder.name))
        cfg = SAEConfig.from_dict(raw)
        if not (folder / WEIGHTS_FILE).is_file():
            raise InputError(_("{folder} has no sae_weights.safetensors").format(folder=folder.name))
        return SAEEntry(folder.name, folder, cfg, _labels(folder, cfg.d_sae))
    except FileNotFoundError:
        problem = _("{folder} has no cfg.json: not an SAE folder").format(folder=folder.name)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        problem = _("{folder}/cfg.json is not JSON: {error}").format(folder=folder.name, error=e)
    except (KeyError, TypeError, ValueError) as e:  # a field missing or of the wrong type
        problem = _("{folder}/cfg.json lacks or misstates {field}").format(folder=folder.name, field=e)
    except InputError as e:
        problem = str(e)
    return SAEEntry(folder.name, folder, cfg, static_problem=problem)


def _folders(root: Path | None) -> list[Path]:
    if root is None or not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


class SAECatalog(Mapping[str, SAEEntry]):
    """Every SAE folder found at start-up (the shipped ones, then EXPLORER_SAES_DIR's), usable or not, by name
    (sorted); then the SAEs trained here (the sae recipe's runs with weights, named by their run ids), which
    appear as they finish without a restart."""

    def __init__(self, folder: Path | None, runs: TrainingStore | None = None, shipped: Path | None = None):
        self.folder = folder
        self.runs = runs  # the training store whose sae runs are SAEs too (set by the model catalogue)
        found = {p.name: p for root in (shipped, folder) for p in _folders(root)}  # folder's replace shipped's
        self._entries = {name: read_entry(found[name]) for name in sorted(found)}
        self._trained: dict[tuple[str, str], SAEEntry] = {}  # (run id, its export folder) -> the entry
        self._trained_lock = threading.Lock()

    def _run_entry(self, id: str) -> SAEEntry | None:
        """An sae run's latest export as an entry (the same entry while its folder stays the same)."""
        runs = self.runs
        try:
            folder = runs.model_folder(id) if runs is not None and is_sae_run_id(id) and runs.exists(id) else None
        except StoreUnavailable:  # Redis out of reach: the SAEs trained there are not listed meanwhile
            return None
        if folder is None:
            return None
        with self._trained_lock:
            key = (id, folder.name)
            if key not in self._trained:
                self._trained = {k: v for k, v in self._trained.items() if k[0] != id}  # an older export
                self._trained[key] = read_entry(folder, name=id)
            return self._trained[key]

    def _run_ids(self) -> list[str]:
        runs = self.runs
        if runs is None:
            return []
        try:
            return sorted(id for id in runs.ids() if is_sae_run_id(id) and runs.model_folder(id) is not None)
        except StoreUnavailable:  # Redis out of reach: the folders' SAEs are still listed
            return []

    def __getitem__(self, name: str) -> SAEEntry:
        if name in self._entries:
            return self._entries[name]
        entry = self._run_entry(name)
        if entry is None:
            raise KeyError(name)
        return entry

    def __iter__(self) -> Iterator[str]:
        yield from self._entries
        yield from (id for id in self._run_ids() if id not in self._entries)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def get_entry(self, name: str) -> SAEEntry:
        """The SAE called `name`, or an InputError listing the names there are."""
        try:
            return self[name]
        except KeyError:
            choices = ", ".join(self) or _("none: this server's EXPLORER_SAES_DIR holds no SAE")
            raise InputError(
                _("unknown SAE {name!r}: choose one of {choices} (GET /api/v1/saes lists them)").format(
                    name=name, choices=choices
                )
            ) from None


def open_saes(folder: Path | None, runs: TrainingStore | None = None) -> SAECatalog:
    """The shipped SAEs and those of EXPLORER_SAES_DIR (unset, or a folder that is not there: the shipped ones),
    with the SAEs trained in `runs`."""
    return SAECatalog(folder if folder is not None and folder.is_dir() else None, runs, shipped=SHIPPED_SAES_DIR)


__all__ = ["LABELS_FILE", "SHIPPED_SAES_DIR", "LabelledFeature", "SAECatalog", "SAEEntry", "open_saes", "read_entry"]
