"""Record SAELens's own encode and decode of small SAEs, for tests/core/test_sae.py (`make fixtures`).

Runs in a venv with SAELens (pinned in the Makefile's SAE_PINS; it needs TransformerLens < 4), never in
the app's. For each case it builds an SAE with SAELens, sets random parameters, saves it with SAELens's
own `save_model` into tests/fixtures/saes/<case>/ and records `encode` and `decode` of random inputs;
then it writes the same arrays with core's `save_sae`, opens that folder with SAELens's
`SAE.load_from_disk` and records its `encode` too (a folder made here must open there unchanged).

    python scripts/make_sae_fixtures.py
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from sae_lens import SAE
from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from core.sae import load_sae, save_sae  # noqa: E402  (pure NumPy: the repository's own reader and writer)

OUT = REPO / "tests" / "fixtures" / "saes"
D_IN, D_SAE, TOKENS = 16, 48, 24
HOOK, MODEL = "blocks.0.hook_resid_post", "induction"

CASES = {
    "standard": (StandardSAE, StandardSAEConfig, {}),
    "standard-no-b-dec-in": (StandardSAE, StandardSAEConfig, {"apply_b_dec_to_input": False}),
    "topk": (TopKSAE, TopKSAEConfig, {"k": 5}),
    "topk-rescaled": (TopKSAE, TopKSAEConfig, {"k": 5, "rescale_acts_by_decoder_norm": True}),
    "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
}


def main() -> None:
    torch.manual_seed(0)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    record: dict[str, np.ndarray] = {}
    for case, (cls, cfg_cls, extra) in CASES.items():
        cfg = cfg_cls(
            d_in=D_IN,
            d_sae=D_SAE,
            dtype="float32",
            metadata=SAEMetadata(hook_name=HOOK, model_name=MODEL),
            **extra,
        )
        sae = cls(cfg)
        with torch.no_grad():
            for name, p in sae.named_parameters():
                scale = 0.3 if name.startswith("W_") else 0.1
                p.copy_(torch.randn_like(p) * scale)
                if name == "threshold":
                    p.abs_()
        sae.save_model(OUT / case)
        x = torch.randn(TOKENS, D_IN)
        with torch.no_grad():
            acts = sae.encode(x)
            recon = sae.decode(acts)
        record[f"{case}/x"] = x.numpy()
        record[f"{case}/acts"] = acts.numpy()
        record[f"{case}/recon"] = recon.numpy()
        with tempfile.TemporaryDirectory() as tmp:
            written = save_sae(load_sae(OUT / case), Path(tmp) / case)
            reopened = SAE.load_from_disk(written)
            with torch.no_grad():
                record[f"{case}/core_written_acts"] = reopened.encode(x).numpy()
        print(f"{case}: L0 {float((acts > 0).float().sum(-1).mean()):.2f}")
    record["meta_generator_sha256"] = np.array(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())
    for package in ("sae-lens", "transformer-lens", "torch"):
        record[f"meta_{package.replace('-', '_')}_version"] = np.array(version(package))
    np.savez_compressed(OUT.parent / "saes.npz", **record)
    print(f"wrote {OUT} and {OUT.parent / 'saes.npz'}")


if __name__ == "__main__":
    main()
