"""Launch chosen CSR SpMM kernels a few times on the bench's random squares, for `ncu` (a profiling harness).

    ncu --section SpeedOfLight -k regex:sputnik python lab/profile/profile_spmm.py 8192,0.9,128
    ... python lab/profile/profile_spmm.py M,SPARSITY,N[,DTYPE][,OPTION=VALUE...] ...
    ... python lab/profile/profile_spmm.py rn50/magnitude_pruning/0.9/bottleneck_2_block_group4_1_1,N[,...] ...

The matrix is `sparsegen.bench.dlmc.random_square(M, SPARSITY, seed=1)`, or a DLMC matrix named by
its path under the data folder ($SPARSEGEN_DATA, default ../shared/data); DTYPE is float32
(default) or float16; OPTION=VALUE pairs are compile options (integers and True/False parsed),
e.g. family=sputnik_spmm.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from profile_tiled import launch_three_times, option  # noqa: E402

import sparsegen  # noqa: E402
from sparsegen.bench.dlmc import random_square  # noqa: E402


def data_dir() -> str:
    """$SPARSEGEN_DATA, else ../shared/data beside the checkout."""
    return os.environ.get("SPARSEGEN_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))


def load_dlmc(name: str, data: str):
    """A DLMC matrix by its path under the data folder, without the .smtx.gz."""
    return sparsegen.io.load(os.path.join(data, "dlmc", name + ".smtx.gz"))


def main():
    data = data_dir()
    for arg in sys.argv[1:]:
        fields = arg.split(",")
        if "/" in fields[0]:
            a = load_dlmc(fields[0], data)
            n, *rest = fields[1:]
        else:
            m, s, n, *rest = fields
            a = random_square(int(m), float(s), seed=1)
        dtype = rest.pop(0) if rest and "=" not in rest[0] else "float32"
        opts = dict(option(o) for o in rest)
        kern = sparsegen.compile(a, op="spmm", n=int(n), dtype=dtype, options=opts)
        launch_three_times(kern, a.shape, int(n), dtype)


if __name__ == "__main__":
    main()
