"""Launch chosen tiled kernels a few times on random OPT-like W, for `ncu` (a profiling harness).

    ncu --section SpeedOfLight --section WarpStateStats -k regex:tiled python lab/profile/profile_tiled.py
    ... python lab/profile/profile_tiled.py 7168,7168,0.9,16,tiled_csl_spmm [M,K,SPARSITY,N,FAMILY[,OPTION=VALUE...] ...]

OPTION=VALUE pairs are passed as compile options (integers and True/False parsed), e.g. wgmma=True.
"""
from __future__ import annotations

import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402
from sparsegen.bench.weights import random_weight  # noqa: E402

CASES = [(7168, 7168, 0.7, 16, "tiled_bitmap_spmm"), (7168, 7168, 0.9, 8, "tiled_csl_spmm"),
         (7168, 7168, 0.9, 64, "tiled_bitmap_spmm")]


def option(text: str) -> tuple:
    """'wgmma=True' -> ('wgmma', True); integers parsed, anything else kept as text."""
    name, _, value = text.partition("=")
    parsed = {"True": True, "False": False}.get(value, value)
    if isinstance(parsed, str) and parsed.lstrip("-").isdigit():
        parsed = int(parsed)
    return name, parsed


def launch_three_times(kern, shape, n: int, dtype: str) -> None:
    """Print the kernel's spec and run it three times on random X (what ncu's -c/--launch-skip count)."""
    import torch

    print(kern.spec.name, flush=True)
    x = torch.randn((shape[1], n), dtype=getattr(torch, dtype), device="cuda")
    y = torch.empty((shape[0], n), dtype=getattr(torch, dtype), device="cuda")
    for _ in range(3):
        kern(x, out=y)
    torch.cuda.synchronize()


def main():
    cases = [(int(m), int(k), float(s), int(n), fam, dict(option(o) for o in rest))
             for m, k, s, n, fam, *rest in (a.split(",") for a in sys.argv[1:])]
    for m, k, s, n, fam, opts in cases or [(*c, {}) for c in CASES]:
        w = random_weight(m, k, s, seed=1)
        kern = sparsegen.compile(w, op="spmm", n=n, dtype="float16", options={"family": fam, **opts})
        launch_three_times(kern, (m, k), n, "float16")


if __name__ == "__main__":
    main()
