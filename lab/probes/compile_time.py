"""Cold and warm `sparsegen.compile()` times for a 4096x4096 matrix at 10 % density.

    python lab/probes/compile_time.py [--backend gpu|emulate] [--repeats 20]

Cold: a fresh cache directory (analysis, encoding, nvcc). Warm: the same call again, which must
hash the matrix, load the plan and cubin from the cache, and run neither analysis nor nvcc.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import scipy.sparse as sp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="emulate")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    os.environ["SPARSEGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="sparsegen-compile-time-")
    import sparsegen

    a = sp.random(4096, 4096, density=0.1, format="csr", random_state=np.random.default_rng(0), dtype=np.float32)
    t = time.perf_counter()
    cold = sparsegen.compile(a, n=128, backend=args.backend)
    _ = cold.cubin
    cold_ms = 1e3 * (time.perf_counter() - t)
    calls = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        warm = sparsegen.compile(a, n=128, backend=args.backend)
        _ = warm.cubin
        calls.append(1e3 * (time.perf_counter() - t))
        if warm.timings.nvcc or not warm.timings.cached.get("plan"):
            raise SystemExit(f"a warm compile ran nvcc ({warm.timings.nvcc:.3f} s) or missed the plan cache")
    print(f"matrix 4096x4096, nnz {a.nnz}, backend {args.backend}, spec {warm.spec.name}")
    print(f"cold compile {cold_ms:.1f} ms (nvcc {1e3 * cold.timings.nvcc:.1f} ms)")
    print(f"warm compile median {statistics.median(calls):.2f} ms, min {min(calls):.2f} ms, max {max(calls):.2f} ms "
          f"over {len(calls)} calls; plan cached {warm.timings.cached.get('plan')}, "
          f"cubin cached {warm.timings.cached.get('cubin')}, nvcc never ran")


if __name__ == "__main__":
    main()
