"""Launch chosen SDDMM kernels a few times, for `ncu` (a profiling harness).

    ncu --section SpeedOfLight -k regex:sddmm python lab/profile/profile_sddmm.py 8192,0.8,128
    ... python lab/profile/profile_sddmm.py PATTERN,K[,OPTION=VALUE...] ...

PATTERN is M,SPARSITY (the bench's `random_square(M, SPARSITY, seed=1)`, written `M:SPARSITY`) or
a path under the DLMC data folder (`--data`, default `$SPARSEGEN_DATA` or ../shared/data) such as
rn50/magnitude_pruning/0.8/bottleneck_2_block_group4_1_1; OPTION=VALUE pairs are compile options.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from profile_spmm import data_dir, load_dlmc  # noqa: E402
from profile_tiled import option  # noqa: E402

import sparsegen  # noqa: E402
from sparsegen.bench.dlmc import random_square  # noqa: E402


def pattern(text: str, data: str):
    if ":" in text:
        m, s = text.split(":")
        return random_square(int(m), float(s), seed=1)
    return load_dlmc(text, data)


def main(argv):
    data = data_dir()
    if argv[:1] == ["--data"]:
        data, argv = argv[1], argv[2:]
    import torch

    for arg in argv:
        name, k, *rest = arg.split(",")
        a = pattern(name, data)
        kern = sparsegen.compile(a, op="sddmm", k=int(k), options=dict(option(o) for o in rest))
        print(name, kern.spec.name, flush=True)
        x = torch.randn((a.shape[0], int(k)), device="cuda")
        y = torch.randn((a.shape[1], int(k)), device="cuda")
        for _ in range(3):
            kern(x, y)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
