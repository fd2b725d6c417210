"""`make bench`: every benchmark in turn, each printing its tables; the whole output is also
written to bench/out/latest.md, from which docs/benchmarks.md's tables are copied.

    bench/.env/bin/python -m bench.run [core_vs_torch training training_live backward api_load browser long_inputs memory families classroom
                                        generate patching sae_features sae_train scale cell
                                        attribution steering]
"""

from __future__ import annotations

import contextlib
import io
import sys
import time

from bench import (
    api_load,
    attribution,
    backward,
    browser,
    cell,
    class_follow,
    classroom,
    core_vs_torch,
    families,
    generate,
    long_inputs,
    memory,
    patching,
    sae_features,
    sae_train,
    scale,
    steering,
    training,
    training_live,
)
from bench.common import OUT

BENCHMARKS = {
    "core_vs_torch": core_vs_torch,
    "training": training,
    "training_live": training_live,
    "backward": backward,  # every family's backward pass against torch autograd (float32, same threads)
    "api_load": api_load,
    "browser": browser,
    "long_inputs": long_inputs,
    "memory": memory,
    "families": families,
    "classroom": classroom,
    "generate": generate,
    "patching": patching,
    "sae_features": sae_features,
    "sae_train": sae_train,  # SAE training steps/s against SAELens's trainer (SAEENV's venv)
    "scale": scale,
    "cell": cell,
    "attribution": attribution,  # integrated gradients against Captum on transformers
    "steering": steering,  # steered greedy generation against torch forward hooks (TORCHENV's venv)
    "class": class_follow,  # a live class: sixty followers through Caddy over two replicas, one killed
}


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    failed = []
    with (OUT / "latest.md").open("w") as log, contextlib.redirect_stdout(_Tee(sys.stdout, log)):
        for name in names:
            t0 = time.perf_counter()
            code = BENCHMARKS[name].main([])
            print(f"({name}: {time.perf_counter() - t0:.0f} s)\n")
            if code:
                failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
