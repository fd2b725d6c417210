"""Sparse autoencoders (SAEs) over one hook's activations, in SAELens's folder format.

A folder holds `cfg.json` and `sae_weights.safetensors`, as SAELens's `SAE.save_model` writes them and
`SAE.load_from_disk` reads them, so an SAE trained elsewhere runs here and one made here opens there:

    W_enc [d_in, d_sae]   b_enc [d_sae]   W_dec [d_sae, d_in]   b_dec [d_in]   (jumprelu: threshold [d_sae])

Encoding ("Towards Monosemanticity"'s dictionary, SAELens's three inference architectures):

    sae_in     = x - b_dec                     (when apply_b_dec_to_input; else x)
    hidden_pre = sae_in @ W_enc + b_enc        [pos, d_sae]
    standard:  acts = relu(hidden_pre)
    topk:      acts = relu of the k largest entries of hidden_pre in each row, 0 elsewhere
    jumprelu:  acts = relu(hidden_pre) where hidden_pre > threshold, 0 elsewhere
    decode:    x_hat = acts @ W_dec + b_dec    [pos, d_in]

A topk SAE may be stored with `rescale_acts_by_decoder_norm` (its decoder rows taken as if normalised):
hidden_pre is then multiplied by each row's norm ‖W_dec[i]‖ before the top k are chosen, and the
activations divided by it again before decoding, as SAELens does. Activation normalisation other than
"none" is refused with the reason: its statistics are not in the folder. An SAE on `hook_z`
(`reshape_activations: "hook_z"`) reads the heads' outputs flattened, [pos, n_heads * d_head].

Computed in the SAE's own dtype (its cfg.json's `dtype`, float32 by default), as SAELens computes it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checkpoints.tensors import SafetensorsFile
from .errors import InputError
from .i18n import _
from .threads import SERIAL, Team

CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "topk", "jumprelu")
DTYPES: dict[str, type[np.floating]] = {"float32": np.float32, "float64": np.float64}
# top_activations encodes a block of rows at a time, never [pos, d_sae] at once: as many rows as make this many
# activations (64 MiB of float32; 1,024 rows of 16,384 features), at least ENCODE_ROWS_MIN. A team shares a block's
# product by columns of W_enc, not by rows: the product loses rate on fewer rows. [rows, 768] @ [768, 16384] over
# 1,024 rows, one BLAS thread, CPU time, median of 5 under load 6.6: whole 194 ms, by 512 rows 215, by 256 299;
# by 4,096 columns 202, by 2,048 204 (/tmp/gemm.py, recorded in the commit that set these).
ENCODE_ELEMENTS = 1 << 24
ENCODE_ROWS_MIN = 64
ENCODE_COLUMNS_MIN = 1024  # the smallest column piece a team member multiplies
TOP_BLOCK = 128  # top_activations' first filter: the largest activation of each run of this many features


@dataclass(frozen=True)
class SAEConfig:
    """What cfg.json says, in SAELens's names; `hook_name` and `model_name` come from its `metadata`."""

    architecture: str
    d_in: int
    d_sae: int
    hook_name: str
    model_name: str
    k: int | None = None  # topk only: active features per token
    apply_b_dec_to_input: bool = True
    rescale_acts_by_decoder_norm: bool = False  # topk only
    reshape_activations: str = "none"  # or "hook_z": the heads' outputs, flattened
    dtype: str = "float32"
    metadata: Mapping = field(default_factory=dict)  # the rest of cfg.json's metadata, kept as it was

    @classmethod
    def from_dict(cls, raw: Mapping) -> SAEConfig:
        """Read (and check) a cfg.json, refusing what this project cannot run, with the reason."""
        architecture = raw.get("architecture", "standard")
        if architecture not in ARCHITECTURES:
            raise InputError(
                _("this SAE's architecture is {architecture!r}; the explorer runs {choices}").format(
                    architecture=architecture, choices=", ".join(ARCHITECTURES)
                )
            )
        norm = raw.get("normalize_activations", "none")
        if norm != "none":
            raise InputError(
                _(
                    "this SAE normalises its input ({norm!r}) with statistics its folder does not hold; "
                    "the explorer runs SAEs with normalize_activations 'none'"
                ).format(norm=norm)
            )
        dtype = raw.get("dtype", "float32")
        if dtype not in DTYPES:
            raise InputError(
                _("this SAE's dtype is {dtype!r}; the explorer reads {choices}").format(
                    dtype=dtype, choices=", ".join(DTYPES)
                )
            )
        reshape = raw.get("reshape_activations", "none")
        if reshape not in ("none", "hook_z"):
            raise InputError(
                _("this SAE reshapes its input as {how!r}, which the explorer does not").format(how=reshape)
            )
        metadata = dict(raw.get("metadata") or {})
        hook_name = metadata.get("hook_name") or raw.get("hook_name")
        model_name = metadata.get("model_name") or raw.get("model_name")
        if not hook_name or not model_name:
            raise InputError(_("this SAE's cfg.json names no metadata.hook_name and metadata.model_name"))
        k = raw.get("k")
        if architecture == "topk" and not (isinstance(k, int) and 1 <= k <= int(raw["d_sae"])):
            raise InputError(_("a topk SAE needs k between 1 and d_sae in its cfg.json"))
        return cls(
            architecture=architecture,
            d_in=int(raw["d_in"]),
            d_sae=int(raw["d_sae"]),
            hook_name=str(hook_name),
            model_name=str(model_name),
            k=int(k) if architecture == "topk" and k is not None else None,
            apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
            rescale_acts_by_decoder_norm=bool(raw.get("rescale_acts_by_decoder_norm", False))
            and architecture == "topk",
            reshape_activations=reshape,
            dtype=dtype,
            metadata={k_: v for k_, v in metadata.items() if k_ not in ("hook_name", "model_name")},
        )

    def to_dict(self) -> dict:
        """cfg.json as SAELens writes it for this architecture (what `SAE.load_from_disk` reads)."""
        out: dict = {
            "architecture": self.architecture,
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": self.dtype,
            "device": "cpu",
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": "none",
            "reshape_activations": self.reshape_activations,
            "metadata": {**self.metadata, "hook_name": self.hook_name, "model_name": self.model_name},
        }
        if self.architecture == "topk":
            out["k"] = self.k
            out["rescale_acts_by_decoder_norm"] = self.rescale_acts_by_decoder_norm
        return out


@dataclass
class SAE:
    """One sparse autoencoder: its config and its arrays (SAELens's parameter names)."""

    cfg: SAEConfig
    W_enc: np.ndarray  # [d_in, d_sae]
    b_enc: np.ndarray  # [d_sae]
    W_dec: np.ndarray  # [d_sae, d_in]
    b_dec: np.ndarray  # [d_in]
    threshold: np.ndarray | None = None  # [d_sae], jumprelu only

    def __post_init__(self) -> None:
        d_in, d_sae = self.cfg.d_in, self.cfg.d_sae
        shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
        if self.cfg.architecture == "jumprelu":
            shapes["threshold"] = (d_sae,)
        for name, shape in shapes.items():
            array = getattr(self, name)
            if array is None or tuple(array.shape) != shape:
                raise InputError(
                    _("the SAE's {name} has shape {got}, its cfg.json says {want}").format(
                        name=name, got=None if array is None else tuple(array.shape), want=shape
                    )
                )

    @property
    def dtype(self) -> type[np.floating]:
        return DTYPES[self.cfg.dtype]

    def _decoder_norms(self) -> np.ndarray:  # [d_sae]
        return np.linalg.norm(self.W_dec, axis=1)

    def flatten(self, x: np.ndarray) -> np.ndarray:
        """The hook's activations as the SAE reads them: [pos, d_in] (hook_z's heads side by side)."""
        x = np.asarray(x, dtype=self.dtype)
        if self.cfg.reshape_activations == "hook_z":
            x = x.reshape(*x.shape[:-2], -1)  # [pos, head_index, d_head] -> [pos, head_index * d_head]
        if x.shape[-1] != self.cfg.d_in:
            raise InputError(
                _("this SAE reads vectors of {d_in} numbers, the activations have {got}").format(
                    d_in=self.cfg.d_in, got=x.shape[-1]
                )
            )
        return x

    def hidden_pre(self, x: np.ndarray) -> np.ndarray:
        """[..., d_in] -> [..., d_sae]: the encoder's pre-activations (before the sparsity rule)."""
        return self._pre(self.flatten(x))

    def _pre(self, sae_in: np.ndarray, norms: np.ndarray | None = None) -> np.ndarray:
        """hidden_pre of vectors already flattened (`norms`: _decoder_norms(), when the caller has them). The bias
        and the rescale are added in place: the same sums as `sae_in @ W_enc + b_enc`, without a second array of
        [pos, d_sae] (64 MiB at 1,024 tokens and 16k features) written and read again."""
        if self.cfg.apply_b_dec_to_input:
            sae_in = sae_in - self.b_dec
        pre = sae_in @ self.W_enc  # [pos, d_sae]
        pre += self.b_enc
        if self.cfg.rescale_acts_by_decoder_norm:
            pre *= self._decoder_norms() if norms is None else norms
        return pre

    def _pre_shared(self, sae_in: np.ndarray, norms: np.ndarray | None, team: Team) -> np.ndarray:
        """_pre of [rows, d_in] with the team sharing W_enc's columns, each piece its own product (its rows' sums
        are the whole product's: the same d_in terms)."""
        if team.width == 1:
            return self._pre(sae_in, norms)
        if self.cfg.apply_b_dec_to_input:
            sae_in = sae_in - self.b_dec
        pre = np.empty((len(sae_in), self.cfg.d_sae), np.result_type(sae_in, self.W_enc))  # [rows, d_sae]

        def columns(c: slice) -> None:
            np.matmul(sae_in, self.W_enc[:, c], out=pre[:, c])
            pre[:, c] += self.b_enc[c]
            if self.cfg.rescale_acts_by_decoder_norm:
                pre[:, c] *= (self._decoder_norms() if norms is None else norms)[c]

        team.each(columns, team.ranges(self.cfg.d_sae, smallest=ENCODE_COLUMNS_MIN))
        return pre

    def activate(self, pre: np.ndarray) -> np.ndarray:
        """The sparsity rule of this architecture applied to pre-activations [..., d_sae]."""
        acts = np.maximum(pre, 0)
        if self.cfg.architecture == "jumprelu":
            acts = np.where(pre > self.threshold, acts, 0).astype(pre.dtype)
        elif self.cfg.architecture == "topk":
            k = self.cfg.k
            assert k is not None  # from_dict requires it for topk
            if k < pre.shape[-1]:
                # every entry below the k-th largest of its row is dropped (its column index is irrelevant)
                kept = np.argpartition(pre, -k, axis=-1)[..., -k:]
                mask = np.zeros(pre.shape, dtype=bool)
                np.put_along_axis(mask, kept, True, axis=-1)
                acts = np.where(mask, acts, 0).astype(pre.dtype)
        return acts

    def encode(self, x: np.ndarray) -> np.ndarray:
        """[..., d_in] -> [..., d_sae]: each feature's activation (SAELens's `SAE.encode`)."""
        return self.activate(self.hidden_pre(x))

    def top_activations(
        self, x: np.ndarray, k: int, *, team: Team = SERIAL, dense: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k largest activations, largest first (ties: the lower index first), zeros left out:
        (indices [pos, k], -1 where a row has fewer than k non-zero; values [pos, k], 0 there).

        The same numbers as `encode` followed by a sort of each row, computed a block of rows at a time (see
        ENCODE_ELEMENTS; the team's threads share a block's product by columns, then its rows), so that [pos, d_sae]
        is never held at once unless `dense` [pos, d_sae] is given to receive every activation. A row's top k are
        found without sorting or partitioning its d_sae entries (_row_top)."""
        x = self.flatten(x)
        lead = x.shape[:-1]
        x = x.reshape(-1, self.cfg.d_in)
        n, d_sae = len(x), self.cfg.d_sae
        k = max(1, min(k, d_sae))
        idx = np.full((n, k), -1, dtype=np.int64)
        val = np.zeros((n, k), dtype=self.dtype)
        out = dense.reshape(n, d_sae) if dense is not None else None
        norms = self._decoder_norms() if self.cfg.rescale_acts_by_decoder_norm else None
        # The k largest positive pre-activations are the k largest activations when the rule only drops entries
        # below them: relu (standard) drops the negative ones, top-k of at least k keeps the largest. Then the
        # rule is not applied at all: one pass over [rows, d_sae] fewer. (jumprelu's thresholds are per feature.)
        rule_keeps_top = self.cfg.architecture == "standard" or (
            self.cfg.architecture == "topk" and k <= (self.cfg.k or 0)
        )
        step = max(ENCODE_ROWS_MIN, ENCODE_ELEMENTS // d_sae)
        for start in range(0, n, step):
            block = slice(start, min(start + step, n))
            pre = self._pre_shared(x[block], norms, team)  # [rows, d_sae]

            def top(rows: slice, pre: np.ndarray = pre, at: int = start) -> None:
                r = slice(at + rows.start, at + rows.stop)
                if out is None and rule_keeps_top:
                    idx[r], val[r] = _row_top(pre[rows], k)
                    return
                acts = self.activate(pre[rows])
                if out is not None:
                    out[r] = acts
                idx[r], val[r] = _row_top(acts, k)

            team.rows(top, len(pre))
        return idx.reshape(*lead, k), val.reshape(*lead, k)

    def decode(self, acts: np.ndarray) -> np.ndarray:
        """[..., d_sae] -> [..., d_in]: the reconstruction (SAELens's `SAE.decode`, before any reshape)."""
        acts = np.asarray(acts, dtype=self.dtype)
        if self.cfg.rescale_acts_by_decoder_norm:
            acts = acts / self._decoder_norms()
        return acts @ self.W_dec + self.b_dec

    def feature_direction(self, index: int) -> np.ndarray:
        """[d_in]: what feature `index` adds to the stream per unit of activation (its decoder row)."""
        if not 0 <= index < self.cfg.d_sae:
            raise InputError(
                _("feature {index} is not in this SAE: it has features 0 to {last}").format(
                    index=index, last=self.cfg.d_sae - 1
                )
            )
        row = self.W_dec[index]
        return row / self._decoder_norms()[index] if self.cfg.rescale_acts_by_decoder_norm else row

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"W_enc": self.W_enc, "b_enc": self.b_enc, "W_dec": self.W_dec, "b_dec": self.b_dec}
        if self.threshold is not None:
            out["threshold"] = self.threshold
        return out


def _row_top(acts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[rows, d_sae] -> each row's k largest positive entries, largest first, ties by lower index (see
    SAE.top_activations): ([rows, k] indices, -1 for none; [rows, k] values).

    The k-th largest of a row's block maxima (TOP_BLOCK entries a block) is its floor: every entry of the top k
    is at least that. When the blocks divide the row and there are more than k, only the k blocks of the largest
    maxima can hold such entries (an entry elsewhere is at most the floor), so only those k * TOP_BLOCK entries
    are compared with it (1,280 of 16,384 for k 10); a row where another block's maximum ties the floor is
    compared whole, so that a tie goes to the lower index as a full sort would have it."""
    rows, d = acts.shape
    n_blocks = -(-d // TOP_BLOCK)
    tiny = np.nextafter(acts.dtype.type(0), acts.dtype.type(1))
    if d % TOP_BLOCK or n_blocks <= k:
        if n_blocks > k:
            block_max = np.maximum.reduceat(acts, np.arange(0, d, TOP_BLOCK), axis=1)  # [rows, n_blocks]
            floor = np.partition(block_max, n_blocks - k, axis=1)[:, n_blocks - k]  # ≤ the row's k-th largest
        else:
            floor = np.zeros(rows, acts.dtype)
        return _top_above(acts, np.arange(d), np.maximum(floor, tiny), k)
    blocks = acts.reshape(rows, n_blocks, TOP_BLOCK)
    block_max = blocks.max(axis=2)  # [rows, n_blocks]
    chosen = np.argpartition(block_max, n_blocks - k, axis=1)[:, n_blocks - k :]  # [rows, k], the largest maxima
    floor = np.take_along_axis(block_max, chosen, axis=1).min(axis=1)  # the k-th largest maximum
    floor = np.maximum(floor, tiny)  # and above zero
    cand = np.take_along_axis(blocks, chosen[:, :, None], axis=1).reshape(rows, -1)  # [rows, k * TOP_BLOCK]
    cols = (chosen[:, :, None] * TOP_BLOCK + np.arange(TOP_BLOCK)).reshape(rows, -1)
    idx, val = _top_above(cand, cols, floor, k)
    tied = np.flatnonzero((block_max >= floor[:, None]).sum(axis=1) > k)  # another block's maximum is the floor
    if len(tied):
        idx[tied], val[tied] = _top_above(acts[tied], np.arange(d), floor[tied], k)
    return idx, val


def _top_above(vals: np.ndarray, cols: np.ndarray, floor: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest of each row's entries at or above its floor, ties by lower column: vals [rows, m], their
    columns cols ([rows, m], or [m] for every row) -> ([rows, k] columns, -1 for none; [rows, k] values)."""
    rows, m = vals.shape
    # flatnonzero, then row and column: np.nonzero of the 2-D mask measured 68 ms against 2.8 ms ([512, 16384])
    flat = np.flatnonzero(vals >= floor[:, None])
    r, j = np.divmod(flat, m)
    c = cols[j] if cols.ndim == 1 else cols.reshape(-1)[flat]
    v = vals.reshape(-1)[flat]
    order = np.lexsort((c, -v, r))  # by row, then largest first, then lower index
    r, c, v = r[order], c[order], v[order]
    rank = np.arange(len(r)) - np.searchsorted(r, r)  # place within its row
    keep = rank < k
    idx = np.full((rows, k), -1, dtype=np.int64)
    val = np.zeros((rows, k), dtype=vals.dtype)
    idx[r[keep], rank[keep]] = c[keep]
    val[r[keep], rank[keep]] = v[keep]
    return idx, val


def load_sae(folder: str | os.PathLike) -> SAE:
    """An SAE from a SAELens folder (cfg.json, sae_weights.safetensors); InputError says what is wrong."""
    folder = Path(folder)
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(_("{folder} has no cfg.json: not an SAE folder").format(folder=folder.name)) from None
    except json.JSONDecodeError as e:
        raise InputError(_("{folder}/cfg.json is not JSON: {error}").format(folder=folder.name, error=e)) from None
    cfg = SAEConfig.from_dict(raw)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise InputError(_("{folder} has no sae_weights.safetensors").format(folder=folder.name))
    f = SafetensorsFile(weights)
    dtype = DTYPES[cfg.dtype]

    def read(name: str) -> np.ndarray | None:
        try:
            return np.array(f.array(name), dtype=dtype)  # a copy in the SAE's dtype, not the memory map
        except KeyError:
            return None

    arrays = {name: read(name) for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
    log_threshold = read("log_threshold") if cfg.architecture == "jumprelu" and arrays["threshold"] is None else None
    if log_threshold is not None:
        arrays["threshold"] = np.exp(log_threshold)  # a JumpReLU training checkpoint's parameter
    return SAE(cfg=cfg, **arrays)  # type: ignore[arg-type]  # SAE's own checks name an array that is missing


def save_sae(sae: SAE, folder: str | os.PathLike) -> Path:
    """Write `sae` as a SAELens folder, whole or not at all (written beside it, then renamed into place)."""
    from safetensors.numpy import save_file  # only when writing: reading needs no package

    folder = Path(folder)
    if folder.exists():
        raise InputError(_("{folder} exists already").format(folder=folder))
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    arrays = {name: np.ascontiguousarray(a, dtype=sae.dtype) for name, a in sae.arrays().items()}
    save_file(arrays, str(tmp / WEIGHTS_FILE))
    (tmp / CONFIG_FILE).write_text(json.dumps(sae.cfg.to_dict(), indent=2) + "\n", encoding="utf-8")
    tmp.rename(folder)
    return folder
