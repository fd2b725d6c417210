"""Reading safetensors files ourselves: memory-mapped, read-only, float32 where stored so.

A .safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range (data_offsets, counted from the end of the header), then the raw
bytes. Mapping the file and viewing each tensor's bytes as an array (np.frombuffer on an mmap)
reads nothing until a page is touched, and every process that maps the same file shares the same
pages of the page cache: several workers hold one copy of a float32 model. float16 and bfloat16
tensors are upcast to float32 (exactly: every half-precision value is a float32 value), which is a
private copy; other dtypes (integers, 8-bit floats, quantised weights) cannot be run.

A sharded checkpoint lists which file holds each tensor in model.safetensors.index.json.
"""

from __future__ import annotations

import json
import math
import mmap
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..i18n import _

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
INDEX_FILE = "model.safetensors.index.json"  # a sharded checkpoint's map: tensor name -> shard file
MAX_HEADER_BYTES = 100 * 2**20  # a header is JSON describing the tensors: a few MB for the largest models

# safetensors' dtype names -> how each is read. Stored as is (memory-mapped): F32, F64.
_MAPPED = {"F32": np.float32, "F64": np.float64}
_UPCAST = ("F16", "BF16")  # read and converted to float32 (a copy)


class CheckpointError(InputError):
    """Why a folder cannot be run, in words a user can act on."""


class SafetensorsFile:
    """One .safetensors file, mapped read-only. `array(name)` is a view of the file's bytes."""

    def __init__(self, path: Path):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = path.stat().st_size
                n = int.from_bytes(f.read(8), "little")
                if size < 8 or not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
                    raise ValueError(
                        _("its header length ({n} bytes) does not fit a file of {size} bytes").format(n=n, size=size)
                    )
                header = json.loads(f.read(n))
                if not isinstance(header, dict):
                    raise ValueError(_("its header is not a JSON object"))
                # The map outlives the file handle; arrays viewing it keep it alive (their .base).
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + n else b""
        except (OSError, ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
            raise CheckpointError(
                f"{path.name} is not a readable safetensors file ({e}): download it again, it may be truncated"
            ) from None
        self._start, self._size = 8 + n, size
        self.entries: dict[str, dict] = {k: v for k, v in header.items() if k != "__metadata__"}

    def dtype(self, name: str) -> str:
        return self.entries[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])

    def array(self, name: str) -> np.ndarray:
        """The tensor as float32 (or float64): a read-only view of the file where it is stored so,
        else a read-only upcast copy. CheckpointError for a dtype that cannot run."""
        info = self.entries[name]
        dtype, shape = info["dtype"], tuple(info["shape"])
        begin, end = info["data_offsets"]
        count = math.prod(shape)
        if dtype not in _MAPPED and dtype not in _UPCAST:
            raise CheckpointError(
                f"tensor {name!r} in {self.path.name} is stored as {dtype}: only float32, float16 "
                f"and bfloat16 weights can run here (not integer, 8-bit or quantised ones)"
            )
        width = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2}[dtype]
        if end - begin != count * width or self._start + end > self._size:
            raise CheckpointError(
                f"tensor {name!r} in {self.path.name} does not fit its byte range: the file is damaged or truncated"
            )
        offset = self._start + begin
        if count == 0:
            array = np.zeros(shape, dtype=np.float32)
        elif dtype in _MAPPED:
            array = np.frombuffer(self._map, dtype=_MAPPED[dtype], count=count, offset=offset).reshape(shape)
            if not array.flags.aligned:  # never written so by safetensors; BLAS needs aligned rows
                array = array.copy()
        elif dtype == "F16":
            array = np.frombuffer(self._map, dtype=np.float16, count=count, offset=offset).astype(np.float32)
        else:  # bfloat16 is the top half of a float32: shift its 16 bits up, exactly
            raw = np.frombuffer(self._map, dtype=np.uint16, count=count, offset=offset)
            array = np.left_shift(raw.astype(np.uint32), 16).view(np.float32)
        array = array.reshape(shape)
        array.flags.writeable = False  # shared by every request: nothing may change it in place
        return array


def weight_files(folder: Path) -> dict[str, Path]:
    """The weight file(s) of a checkpoint folder: {tensor name: file} from a sharded checkpoint's
    index, or {} meaning "every tensor of model.safetensors". CheckpointError if a shard is missing."""
    index = folder / INDEX_FILE
    if (folder / WEIGHTS_FILE).is_file() or not index.is_file():
        return {}
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(_("its weight_map is empty"))
        files = {name: folder / Path(file).name for name, file in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{INDEX_FILE} does not list the shards: {e}") from None
    missing = sorted({p.name for p in files.values() if not p.is_file()})
    if missing:
        raise CheckpointError(
            f"missing shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of "
            f"{len(set(files.values()))} listed in {INDEX_FILE}: download every shard"
        )
    return files


class Tensors:
    """Every tensor of a checkpoint by name, with the family's optional key prefix removed.

    "transformer.h.0..." (GPT2LMHeadModel) and "h.0..." (GPT2Model) name the same tensor; a name
    not found under the prefix is looked up bare (lm_head.weight sits beside the prefixed model).
    Tensors that are never asked for (causal-mask buffers, rotary inv_freq, a pooler) are never read.
    """

    def __init__(self, folder: Path, prefixes: tuple[str, ...]):
        shards = weight_files(folder)
        self._files: dict[Path, SafetensorsFile] = {}
        if shards:
            self._where = shards
        else:
            single = self._open(folder / WEIGHTS_FILE)
            self._where = {name: single.path for name in single.entries}
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in self._where)), "")

    def _open(self, path: Path) -> SafetensorsFile:
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        return self._files[path]

    def _key(self, name: str) -> str | None:
        for key in (self.prefix + name, name):
            if key in self._where:
                return key
        return None

    def has(self, name: str) -> bool:
        return self._key(name) is not None

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self._key(name)
        if key is None:
            raise CheckpointError(
                f"the weights have no tensor {self.prefix + name!r}: is this really the model config.json describes?"
            )
        file = self._open(self._where[key])
        if key not in file.entries:
            raise CheckpointError(f"{INDEX_FILE} places {key!r} in {file.path.name}, which does not hold it")
        if file.shape(key) != shape:
            raise CheckpointError(
                f"tensor {key!r} has shape {list(file.shape(key))} but config.json implies {list(shape)}"
            )
        return file.array(key)

    def linear(self, name: str, d_in: int, d_out: int) -> np.ndarray:
        """An nn.Linear weight, stored [out, in], as core's [in, out]: its transpose, a view (no copy)."""
        return self.get(name, (d_out, d_in)).T

    def norm(self, name: str, width: int, bias: bool = True) -> dict:
        """A LayerNorm's {"w", "b"} (or an RMSNorm's {"w"}, bias=False): `name`.weight and `name`.bias."""
        found = {"w": self.get(f"{name}.weight", (width,))}
        if bias:
            found["b"] = self.get(f"{name}.bias", (width,))
        return found

    def unembed(self, name: str, d_model: int, d_vocab: int) -> dict:
        """An untied unembedding {"W_U": [d_model, d_vocab]} from its nn.Linear `name` (when the config
        ties it, a stored copy is just W_E again and is not read)."""
        if not self.has(name):
            raise CheckpointError(f"config.json says tie_word_embeddings is false but there is no {name}")
        return {"W_U": self.linear(name, d_model, d_vocab)}
