"""Time forced families on DLMC matrices against cuSPARSE and cuBLAS (a probe, not a suite).

    python lab/probes/family_probe.py --data .devdata --dtype float16 --n 32,128,256 \
        --families default,tiled_csl_spmm,tiled_bitmap_spmm --every 4

For every `--every`-th DLMC matrix of index.tsv and every n: the default selection and each named
family forced through options={"family": ...}, each checked against float64 scipy (relative
Frobenius error) and timed with sparsegen.bench.timing.time_cuda; cuSPARSE (torch CSR int32) and
cuBLAS (dense torch.matmul, TF32 off) timed the same way on the same buffers. Prints one row per
(matrix, n) and geomeans per family at the end; writes $OUT/family_probe.txt when OUT is set.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402
from sparsegen.bench.dlmc import dlmc_matrices  # noqa: E402
from sparsegen.bench.timing import time_cuda  # noqa: E402

TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("SPARSEGEN_DATA", "../shared/data"))
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--n", default="32,128,256")
    ap.add_argument("--families", default="default,tiled_csl_spmm,tiled_bitmap_spmm")
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--max-minutes", type=float, default=5.0)
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    ndt = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}[args.dtype]
    ns = [int(v) for v in args.n.split(",")]
    fams = args.families.split(",")
    lines = []
    t0 = time.time()

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    import concurrent.futures as cf

    sources = dlmc_matrices(args.data)[::args.every]
    mats = {}
    for src in sources:
        A = src.load()
        A.data = A.data.astype(ndt).astype(np.float32)
        mats[src.id] = A
    jobs = [(sid, n, fam) for sid in mats for n in ns for fam in fams]

    def build(job):
        sid, n, fam = job
        try:
            return job, sparsegen.compile(mats[sid], op="spmm", n=n, dtype=args.dtype,
                                          options=None if fam == "default" else {"family": fam})
        except Exception as exc:  # noqa: BLE001 - a declined family is a cell
            return job, exc

    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 8) as pool:
        kernels = dict(pool.map(build, jobs))
    print(f"# {len(jobs)} kernels compiled in {time.time() - t0:.0f} s", flush=True)
    ratios: dict = {}
    emit(f"# family_probe dtype={args.dtype} n={ns} families={fams}; us = time_cuda medians; "
         f"x = cuSPARSE time / time")
    emit(f"{'matrix':<58} {'n':>4} {'cusp':>7} {'cublas':>7} " + " ".join(f"{f[:14]:>22}" for f in fams))
    for src in sources:
        if time.time() - t0 > args.max_minutes * 60:
            emit("# stopped at --max-minutes")
            break
        A = mats[src.id]
        A64 = A.astype(np.float64)
        crow = torch.from_numpy(A.indptr.astype(np.int32)).cuda()
        col = torch.from_numpy(A.indices.astype(np.int32)).cuda()
        vals = torch.from_numpy(A.data).to(tdt).cuda()
        Asp = torch.sparse_csr_tensor(crow, col, vals, size=A.shape)
        dense = Asp.to_dense()
        for n in ns:
            rng = np.random.default_rng(n)
            X = rng.standard_normal((A.shape[1], n)).astype(ndt)
            ref = A64 @ X.astype(np.float64)
            refn = np.linalg.norm(ref)
            x = torch.from_numpy(X.astype(np.float32)).to(tdt).cuda()
            cusp = time_cuda(lambda: torch.mm(Asp, x), min_ms=30)["median_ms"]
            cub = time_cuda(lambda: torch.matmul(dense, x), min_ms=30)["median_ms"]
            cells = []
            for fam in fams:
                try:
                    k = kernels[(src.id, n, fam)]
                    if isinstance(k, Exception):
                        raise k
                    y = torch.empty((A.shape[0], n), dtype=tdt, device="cuda")
                    k(x, out=y)
                    torch.cuda.synchronize()
                    err = float(np.linalg.norm(y.double().cpu().numpy() - ref) / refn)
                    ms = time_cuda(lambda: k(x, out=y), min_ms=30)["median_ms"]
                    ok = err <= TOL[args.dtype]
                    cells.append(f"{ms * 1e3:7.1f} {cusp / ms:5.2f}x{'' if ok else '!'} {k.spec.family[:6]:>6}")
                    if ok:
                        ratios.setdefault(fam, {}).setdefault(n, []).append((cusp / ms, cub / ms))
                except Exception as exc:  # a declined or failing family is a cell, not a stop
                    cells.append(f"{type(exc).__name__[:20]:>22}")
            emit(f"{src.id[:58]:<58} {n:>4} {cusp * 1e3:7.1f} {cub * 1e3:7.1f} " + " ".join(f"{c:>22}" for c in cells))
    emit()
    emit("# geomean speedup vs cuSPARSE (vs cuBLAS) per family and n, over the cases it ran correctly")
    for fam, by_n in ratios.items():
        parts = []
        for n, v in sorted(by_n.items()):
            a = np.array(v)
            parts.append(f"n={n}: {math.exp(np.log(a[:, 0]).mean()):.2f}x ({math.exp(np.log(a[:, 1]).mean()):.2f}x) [{len(a)}]")
        emit(f"{fam:<22} " + "  ".join(parts))
    emit(f"# total {time.time() - t0:.0f} s")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"family_probe_{args.dtype}.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
