"""SAELens's side of bench/sae_train.py, in a venv of its own (the Makefile's SAEENV: SAELens needs TransformerLens
< 4, whose transformers pin is not bench/.env's). Never imported by the app or by bench/.env's Python.

It reads the activations, the initial weights and the batch order the NumPy side uses (an .npz), builds SAELens's
TopKTrainingSAE (or JumpReLUTrainingSAE, as the .npz's architecture says) with those weights and SAELens's SAETrainer on a data provider giving the same batches, then
answers on stdin/stdout: a line "N" runs N steps of the trainer's own loop (fit()'s body: maybe_reset_sparsity,
step, _checkpoint_if_needed, n_training_steps += 1) and prints {"seconds", "mse"} as one JSON line.

    $(SAEENV)/bin/python bench/sae_lens_side.py DATA.npz --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    z = np.load(args.data)
    x = torch.from_numpy(z["activations"])
    order = torch.from_numpy(z["order"])  # [steps, batch] row indices: the NumPy side's batches
    k, lr, window = int(z["k"]), float(z["lr"]), int(z["dead_window"])
    d_in, d_sae = int(z["W_enc"].shape[0]), int(z["W_enc"].shape[1])
    metadata = SAEMetadata(hook_name="blocks.0.hook_resid_post", model_name="induction")
    names = ["W_enc", "b_enc", "W_dec", "b_dec"]
    sae: TopKTrainingSAE | JumpReLUTrainingSAE
    if str(z["architecture"]) == "jumprelu":
        sae = JumpReLUTrainingSAE(
            JumpReLUTrainingSAEConfig(
                d_in=d_in,
                d_sae=d_sae,
                dtype="float32",
                l0_coefficient=float(z["l0_coefficient"]),
                jumprelu_init_threshold=float(z["jumprelu_init_threshold"]),
                jumprelu_bandwidth=float(z["jumprelu_bandwidth"]),
                metadata=metadata,
            )
        )
        names.append("threshold")
    else:
        cfg = TopKTrainingSAEConfig(
            d_in=d_in,
            d_sae=d_sae,
            k=k,
            dtype="float32",
            rescale_acts_by_decoder_norm=False,  # core/sae_train.py's objective (it trains without the rescaling)
            metadata=metadata,
        )
        sae = TopKTrainingSAE(cfg)
    with torch.no_grad():
        for name in names:
            getattr(sae, name).copy_(torch.from_numpy(z[name]))

    def batches():
        i = 0
        while True:
            yield x[order[i % len(order)]]
            i += 1

    trainer = SAETrainer(
        SAETrainerConfig(
            total_training_samples=10**12,
            train_batch_size_samples=order.shape[1],
            lr=lr,
            lr_end=lr,  # a constant rate (SAETrainer needs it set; LanguageModelSAERunnerConfig sets it so)
            dead_feature_window=window,
        ),
        sae,
        batches(),
    )
    sae.to("cpu")
    print(json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        n = int(line)
        t0 = time.perf_counter()
        for _ in range(n):  # SAETrainer.fit()'s loop body, without wandb and the progress bar
            trainer.maybe_reset_sparsity()
            out = trainer.step(next(trainer.data_provider))
            trainer._checkpoint_if_needed()
            trainer.n_training_steps += 1
        seconds = time.perf_counter() - t0
        mse = float(out.losses["mse_loss"].detach())
        print(json.dumps({"seconds": seconds, "mse": mse}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
