"""Time `dense_tile_sddmm` on one pattern as k and the options vary (a probe: where the time goes).

    python lab/probes/dense_tile_scaling.py --shape 2048x512 --density 0.5 --k 8,32,64,128,256 \
        --variants "default;k_groups=2;stages=4"

Per k and variant: the forced kernel's median time (sparsegen.bench.timing.time_cuda) and its error
against a float64 reference. The intercept over k is what a tile costs besides its slices (launch,
masks, the scattered stores); the slope what a slice costs.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from sddmm_sweep import parse_variant  # noqa: E402  (this folder is on sys.path when run as a script)

import sparsegen  # noqa: E402
from sparsegen.bench.timing import time_cuda  # noqa: E402


def options(text: str) -> dict:
    """A variant as sddmm_sweep reads one ('default', or 'name=value,...'), forced to dense_tile_sddmm."""
    return {"family": "dense_tile_sddmm", **parse_variant(text)[1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2048x512")
    ap.add_argument("--density", type=float, default=0.5)
    ap.add_argument("--k", default="8,32,64,128,256")
    ap.add_argument("--variants", default="default")
    args = ap.parse_args()

    import torch

    m, n = map(int, args.shape.split("x"))
    p = sp.random(m, n, density=args.density, format="csr", dtype=np.float32, random_state=0)
    p.sort_indices()
    rows = np.repeat(np.arange(m), np.diff(p.indptr))
    for k in map(int, args.k.split(",")):
        a = torch.randn((m, k), device="cuda")
        b = torch.randn((n, k), device="cuda")
        ref = (a.double().cpu().numpy()[rows] * b.double().cpu().numpy()[p.indices]).sum(1)
        for v in args.variants.split(";"):
            kern = sparsegen.compile(p, op="sddmm", k=k, backend="gpu", options=options(v))
            got = torch.as_tensor(kern(a, b)).double().cpu().numpy()
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            ms = time_cuda(lambda: kern(a, b))["median_ms"]
            print(f"{args.shape} d={args.density} k={k:4d} {v:28s} {ms * 1e3:8.1f} us  err {err:.1e}  {kern.spec.name}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
