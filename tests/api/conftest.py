import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def messages(response) -> str:
    """All `detail[].msg` of an error response, joined, for substring checks."""
    return " | ".join(d["msg"] for d in response.json()["detail"])


def half_precision_copy(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint folder whose float tensors are stored as float16 (as Pythia's are on the
    Hub): loading it upcasts them into the worker's own memory instead of mapping the file."""
    dst.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, dst / name)
    tensors = load_file(str(src / "model.safetensors"))
    save_file(
        {k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in tensors.items()},
        str(dst / "model.safetensors"),
    )
    return dst
