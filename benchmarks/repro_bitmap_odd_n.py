"""Reproduce the tiled_bitmap_spmm odd-N bug seen at aab391c (why tiled_bitmap_spmm.gate declined odd N until 2026-11-27).

    python benchmarks/repro_bitmap_odd_n.py            # table of variants
    compute-sanitizer --tool racecheck python benchmarks/repro_bitmap_odd_n.py one

Seen on the H100 (2026-11-24): with N = 1 or 3, split-K 2+ or several k-tiles, and a 3-slot ring,
the rows of warp 3 (rows 48-63 of each 64-row tile) of every row tile but the first are wrong
(relative error 0.1-0.9); 2- and 4-slot rings, even N, and a single row tile are right. racecheck
reports cp.async write-write hazards (threads 0 and 8). Odd N is the one path that writes the X
tile with plain shared stores instead of cp.async (templates/_tiled_common.cuh.j2, load_x_tile).

2026-11-27 (d0a36fa's kernels): every row right in every configuration here and racecheck clean
(probes/repro_bitmap_odd_n*.txt), so tiled_bitmap_spmm takes odd N again; kept as a regression probe.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparsegen  # noqa: E402
from tests.helpers import random_csr, reference, rel_error  # noqa: E402
from tests.tiled_helpers import host_x, rounded_half  # noqa: E402



def check(a, n, **options):
    kernel = sparsegen.compile(a, n=n, dtype="float16", backend="gpu",
                               options={"family": "tiled_bitmap_spmm", **options})
    x = host_x(np.random.default_rng(0), a.shape[1], n, "float16")
    ref = reference(rounded_half(a, "float16"), x.astype(np.float32), None, False)
    y = kernel(x)
    bad = np.unique(np.argwhere(~np.isclose(y, ref, rtol=0.05, atol=0.05))[:, 0] % 64)
    print(f"{kernel.spec.name:72} err {rel_error(y, ref):.2e}  wrong rows mod 64: {bad.tolist()[:16]}", flush=True)


def main():
    a = random_csr(600, 800, 0.3, seed=8)
    if sys.argv[1:] == ["one"]:
        check(a, 1, split_k=3, reduction="atomic", stages=3)
        return
    for options in (dict(split_k=1), dict(split_k=3, reduction="atomic"), dict(split_k=3, reduction="cluster"),
                    dict(split_k=3, reduction="atomic", stages=2), dict(split_k=3, reduction="atomic", stages=4)):
        for n in (1, 2, 3):
            check(a, n, **{"stages": 3, **options})


if __name__ == "__main__":
    main()
