"""Sweep SpMM kernel variants (families and their options) on DLMC and random matrices.

    python lab/sweeps/spmm_sweep.py --data DIR [--dtype float32] [--ns 32,128,256,1024]
        [--variants 'csr_rowsplit;sputnik_spmm;sputnik_spmm,ksplit=1'] [--every 4] [--out F.json] [--jobs 14]

Prints one line per (matrix, n): milliseconds of each variant and of cuSPARSE / cuBLAS (torch,
same process, same buffers, CUDA-event timing of ../shared/BENCHMARKS.md), and writes every
number to --out. The selection rules' thresholds come from runs of this script.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np


def add_matrix_arguments(ap, every: int) -> None:
    """--every/--offset (DLMC matrices) and --random (squares): the sweeps' matrix choice."""
    ap.add_argument("--every", type=int, default=every, help="every k-th DLMC matrix (0: none)")
    ap.add_argument("--offset", type=int, default=0, help="start at this DLMC matrix (with --every)")
    ap.add_argument("--random", default="", help="e.g. 4096:0.8,8192:0.9")
    ap.add_argument("--indices", default="", help="these DLMC matrices (positions in the list, e.g. 1,11,14) "
                                                  "instead of --every/--offset")


def sweep_matrices(args) -> list:
    """(id, loader) of the matrices `add_matrix_arguments` selected: DLMC, then random squares."""
    from sparsegen.bench.dlmc import dlmc_matrices, random_square

    listed = dlmc_matrices(args.data) if args.every or args.indices else []
    if args.indices:
        chosen = [listed[int(i)] for i in args.indices.split(",")]
    else:
        chosen = listed[args.offset::args.every] if args.every else []
    mats = [(m.id, m.load) for m in chosen]
    for item in filter(None, args.random.split(",")):
        size, sparsity = item.split(":")
        mats.append((f"random/{size}/{sparsity}",
                     lambda s=int(size), p=float(sparsity): random_square(s, p, seed=s)))
    return mats


def save_rows(rows: list, path: str) -> None:
    """Every row measured so far, as JSON (called after each matrix: a run cut short keeps them)."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def print_geomeans(ratios: dict) -> None:
    for name, r in ratios.items():
        if r:
            print(f"geomean vs cuSPARSE {name}: {math.exp(np.mean(np.log(r))):.2f}x over {len(r)}")


def parse_variant(text: str) -> tuple[str, dict]:
    """'family,key=value,...' forces that family with those options (integer values as int, others as
    text: 'dense_tile_spmm,mma=f16x3'); 'auto,...' leaves the choice to selection."""
    family, *opts = text.split(",")
    options = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (o.split("=") for o in opts)}
    return text, options if family == "auto" else {"family": family, **options}


def skewed(m: int, k: int, density: float, cov: float, seed: int):
    """m x k CSR whose row lengths are lognormal with the given CoV and mean k x density
    (clipped to [0, k]), columns uniform: where the ELL+COO hybrid is meant to win."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(cov * cov))
    lengths = rng.lognormal(math.log(k * density) - sigma * sigma / 2, sigma, m)
    lengths = np.clip(np.rint(lengths), 0, k).astype(np.int64)
    keys = rng.random((m, k))
    order = np.argsort(keys, axis=1)
    mask = np.zeros((m, k), bool)
    take = np.arange(k)[None, :] < lengths[:, None]
    np.put_along_axis(mask, order, take, axis=1)
    return sp.csr_matrix(mask.astype(np.float32))


def all_matrices(args) -> list:
    """`sweep_matrices` and the `--skewed` squares."""
    mats = sweep_matrices(args)
    for item in filter(None, args.skewed.split(",")):
        if ":" in item:  # M:K:DENSITY:COV
            m, k, density, cov = item.split(":")
            mats.append((f"skewed/{m}x{k}/d{density}/cov{cov}",
                         lambda m=int(m), k=int(k), d=float(density), c=float(cov): skewed(m, k, d, c, seed=7)))
        else:
            mats.append((f"skewed/4096/cov{item}", lambda c=float(item): skewed(4096, 4096, 0.1, c, seed=7)))
    return mats


def _precompile_one(task) -> str:
    """A worker: select and compile one (matrix, n, variant) on the CPU, so that its cubin lands in the
    cache before the timing loop asks for it (nvcc runs once per spec, in parallel)."""
    import sparsegen

    args, index, n, options, arch = task
    mid, load = all_matrices(args)[index]
    try:
        kernel = sparsegen.compile(load(), n=n, dtype=args.dtype, backend="emulate", arch=arch, options=options)
        kernel.cubin  # noqa: B018 - compiles into the cache
        return ""
    except sparsegen.SparsegenError as exc:
        return f"{mid} n={n} {options}: {exc}"[:160]


def precompile(args, n_mats: int, variants, jobs: int) -> None:
    """Every cubin the sweep will load, compiled by `jobs` processes first (`--jobs`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    arch = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    tasks = [(args, i, n, options, arch) for i in range(n_mats) for n in map(int, args.ns.split(","))
             for _, options in variants]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:  # no CUDA in a fork
        declined = [d for d in pool.map(_precompile_one, tasks) if d]
    print(f"# precompiled {len(tasks)} kernels with {jobs} processes ({len(declined)} declined)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ns", default="32,128,256,1024")
    ap.add_argument("--variants", default="csr_rowsplit;sputnik_spmm")
    add_matrix_arguments(ap, every=1)
    ap.add_argument("--skewed", default="", help="row-length CoVs of 4096x4096 ~10 %% matrices, e.g. 0.5,1,2, "
                                                 "or M:K:DENSITY:COV items")
    ap.add_argument("--out", default="")
    ap.add_argument("--jobs", type=int, default=0, help="compile every kernel first in this many processes")
    args = ap.parse_args()

    import torch

    import sparsegen
    from sparsegen.bench.records import relative_error
    from sparsegen.bench.timing import time_cuda

    torch.backends.cuda.matmul.allow_tf32 = False
    variants = [parse_variant(v) for v in args.variants.split(";")]
    npd = np.dtype(args.dtype)
    mats = all_matrices(args)
    if args.jobs > 1:
        precompile(args, len(mats), variants, args.jobs)
    rows, ratios = [], {name: [] for name, _ in variants}
    for mid, load in mats:
        a = load()
        a.data = np.random.default_rng(0).standard_normal(a.nnz).astype(npd)
        dev = "cuda"
        sparse = torch.sparse_csr_tensor(torch.from_numpy(a.indptr.astype(np.int32)).to(dev),
                                         torch.from_numpy(a.indices.astype(np.int32)).to(dev),
                                         torch.from_numpy(a.data).to(dev), size=a.shape)
        dense = sparse.to_dense()
        for n in map(int, args.ns.split(",")):
            x = torch.randn((a.shape[1], n), dtype=dense.dtype, device=dev)
            ref = torch.matmul(dense.double(), x.double()).cpu().numpy()
            lengths = np.diff(a.indptr)
            cov = float(lengths.std() / lengths.mean()) if lengths.mean() else 0.0
            rec = {"id": mid, "n": n, "shape": list(a.shape), "nnz": int(a.nnz), "row_cov": cov, "ms": {}, "spec": {}}
            rec["ms"]["cusparse"] = time_cuda(lambda: torch.mm(sparse, x))["median_ms"]
            rec["ms"]["cublas"] = time_cuda(lambda: torch.matmul(dense, x))["median_ms"]
            for name, options in variants:
                try:
                    k = sparsegen.compile(a, n=n, dtype=args.dtype, backend="gpu", options=options)
                except sparsegen.SparsegenError as exc:
                    rec["spec"][name] = f"declined: {exc}"[:200]
                    continue
                y = torch.empty((a.shape[0], n), dtype=dense.dtype, device=dev)
                k(x, out=y)
                err = relative_error(y.double().cpu().numpy(), ref)
                rec["ms"][name] = time_cuda(lambda: k(x, out=y))["median_ms"]
                rec["spec"][name] = k.spec.name
                rec.setdefault("error", {})[name] = err
                ratios[name].append(rec["ms"]["cusparse"] / rec["ms"][name])
            rows.append(rec)
            cells = "  ".join(f"{v}={rec['ms'][v]:.4f}" for v in rec["ms"])
            bad = [v for v, e in rec.get("error", {}).items() if not e <= 1e-4]
            print(f"{mid[:60]:60s} cov={cov:4.2f} n={n:5d} {cells}{'  WRONG: ' + ','.join(bad) if bad else ''}", flush=True)
        save_rows(rows, args.out)
    print_geomeans(ratios)


if __name__ == "__main__":
    sys.exit(main())
