"""Write a float32 copy of a checkpoint folder, so that its weights can be memory-mapped.

Most Hub models are stored in bfloat16 or float16 (SmolLM2, Qwen, Pythia, TinyLlama). Loading
one upcasts every tensor to float32 in the process's own memory, so each worker pays the whole
model again. Converted once on disk, the float32 file is mapped instead: every worker shares the
same pages. The copy holds every tensor of the original (shards joined into one
model.safetensors), upcast exactly, with config.json and tokenizer.json beside it.

    python -m core.checkpoints.convert models/smollm2-135m models/smollm2-135m-f32
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

from .tensors import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError, SafetensorsFile, weight_files


def convert_to_float32(src: str | Path, dst: str | Path) -> Path:
    """Write dst/model.safetensors (every tensor as float32) and copy config.json and tokenizer.json.

    Tensors are written one at a time, so the conversion needs memory for the largest tensor only."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise CheckpointError(f"{dst} is not empty: choose a new folder for the float32 copy")
    shards = weight_files(src)
    files = sorted(set(shards.values())) if shards else [src / WEIGHTS_FILE]
    opened = [SafetensorsFile(p) for p in files]
    names = [(f, name) for f in opened for name in f.entries]
    header, offset = {}, 0
    for f, name in names:
        size = 4 * _count(f.shape(name))
        header[name] = {"dtype": "F32", "shape": list(f.shape(name)), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data then starts 8-byte aligned, as safetensors writes it
    dst.mkdir(parents=True, exist_ok=True)
    tmp = dst / (WEIGHTS_FILE + ".partial")
    with open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for f, name in names:
            out.write(f.array(name).astype("<f4").tobytes())
    tmp.rename(dst / WEIGHTS_FILE)  # never a half-written model.safetensors
    for extra in (CONFIG_FILE, TOKENIZER_FILE):
        shutil.copyfile(src / extra, dst / extra)
    return dst


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(convert_to_float32(sys.argv[1], sys.argv[2]))
