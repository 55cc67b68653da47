"""Error of `dense_tile_sddmm` against a float64 reference as k grows (a probe).

    python lab/probes/dense_tile_accuracy.py [--k 32,128,256,512,1024,2048,5000]

For each k and operand distribution (standard normal; uniform on [0, 1), where every product has the
same sign and truncation in the tensor cores' accumulation cannot cancel): the forced kernel on a
512 x 512 pattern at 50 % density, and the norm-wise relative error of its output
(what the tests hold a float32 result to: <= 1e-5) and the largest error of one entry relative to the
sum of its products' magnitudes.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402


def errors(kernel, pattern, a, b) -> tuple[float, float]:
    rows = np.repeat(np.arange(pattern.shape[0]), np.diff(pattern.indptr))
    a64, b64 = a.astype(np.float64)[rows], b.astype(np.float64)[pattern.indices]
    ref = (a64 * b64).sum(1)
    scale = np.abs(a64 * b64).sum(1)
    got = kernel(a, b).astype(np.float64)
    return (float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
            float(np.max(np.abs(got - ref) / np.maximum(scale, 1e-300))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="32,128,256,512,1024,2048,5000")
    ap.add_argument("--backend", default="gpu", help="gpu, or emulate (the NumPy emulator: checks the probe)")
    args = ap.parse_args()
    pattern = sp.random(512, 512, density=0.5, format="csr", dtype=np.float32, random_state=0)
    pattern.sort_indices()
    rng = np.random.default_rng(0)
    print(f"{'k':>5} {'operands':>8} {'norm-wise':>10} {'max entry':>10}  spec")
    for k in map(int, args.k.split(",")):
        for dist in ("normal", "uniform"):
            draw = rng.standard_normal if dist == "normal" else rng.random
            a, b = (draw((n, k)).astype(np.float32) for n in pattern.shape)
            kernel = sparsegen.compile(pattern, op="sddmm", k=k, backend=args.backend,
                                       options={"family": "dense_tile_sddmm"})
            norm, worst = errors(kernel, pattern, a, b)
            print(f"{k:5d} {dist:>8} {norm:10.2e} {worst:10.2e}  {kernel.spec.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
