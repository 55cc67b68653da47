"""Launch chosen CSR SpMM kernels a few times on the bench's random squares, for `ncu` (a profiling harness).

    ncu --section SpeedOfLight -k regex:sputnik python benchmarks/profile_spmm.py 8192,0.9,128
    ... python benchmarks/profile_spmm.py M,SPARSITY,N[,DTYPE][,OPTION=VALUE...] ...

The matrix is `sparsegen.bench.dlmc.random_square(M, SPARSITY, seed=1)`; DTYPE is float32 (default)
or float16; OPTION=VALUE pairs are compile options (integers and True/False parsed), e.g.
family=sputnik_spmm.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from profile_tiled import launch_three_times, option  # noqa: E402

import sparsegen  # noqa: E402
from sparsegen.bench.dlmc import random_square  # noqa: E402


def main():
    for arg in sys.argv[1:]:
        m, s, n, *rest = arg.split(",")
        dtype = rest.pop(0) if rest and "=" not in rest[0] else "float32"
        opts = dict(option(o) for o in rest)
        a = random_square(int(m), float(s), seed=1)
        kern = sparsegen.compile(a, op="spmm", n=int(n), dtype=dtype, options=opts)
        launch_three_times(kern, a.shape, int(n), dtype)


if __name__ == "__main__":
    main()
