"""Probe: does processing an SpMM in column panels (all SMs on one slice of X at a time) pay?

    python lab/probes/panel_probe.py [--squares 8192:0.9,...] [--ns 128,1024] [--panels 2,4,8,16]

For each random square and n, times the default kernel on the whole matrix, then the matrix cut
into P column slices, each compiled on its own and launched one after the other (one timed
region, P outputs, no accumulation): the most a panel-major schedule could gain from a P-times
smaller X working set, before paying for its partial sums. cuBLAS fp32 (TF32 off) for scale.
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--squares", default="8192:0.8,8192:0.9,4096:0.9,8192:0.95")
    ap.add_argument("--ns", default="128,256,1024")
    ap.add_argument("--panels", default="2,4,8,16")
    ap.add_argument("--variant", default="", help="options for every kernel, e.g. family=sputnik_spmm")
    args = ap.parse_args()

    import torch

    import sparsegen
    from sparsegen.bench.dlmc import random_square
    from sparsegen.bench.timing import time_cuda

    torch.backends.cuda.matmul.allow_tf32 = False
    options = dict(o.split("=") for o in args.variant.split(",") if o)
    options = {k: (v if k == "family" else int(v)) for k, v in options.items()}
    for item in args.squares.split(","):
        size, sparsity = int(item.split(":")[0]), float(item.split(":")[1])
        a = random_square(size, sparsity, seed=size)
        a.data = np.random.default_rng(0).standard_normal(a.nnz).astype(np.float32)
        dense = torch.from_numpy(a.toarray()).cuda()
        for n in map(int, args.ns.split(",")):
            x = torch.randn((size, n), device="cuda")
            ref = dense.double() @ x.double()
            whole = sparsegen.compile(a, n=n, dtype="float32", backend="gpu", options=options)
            y = torch.empty((size, n), device="cuda")
            t_whole = time_cuda(lambda: whole(x, out=y))["median_ms"]
            t_blas = time_cuda(lambda: torch.matmul(dense, x))["median_ms"]
            line = f"{size}^2 {sparsity:.2f} n={n:5d} cublas={t_blas:.4f} whole={t_whole:.4f} [{whole.spec.name}]"
            for p in map(int, args.panels.split(",")):
                w = size // p
                parts = [sparsegen.compile(a[:, i * w:(i + 1) * w].tocsr(), n=n, dtype="float32",
                                           backend="gpu", options=options) for i in range(p)]
                xs = [x[i * w:(i + 1) * w] for i in range(p)]
                ys = [torch.empty((size, n), device="cuda") for _ in range(p)]

                def run():
                    for k, xi, yi in zip(parts, xs, ys):
                        k(xi, out=yi)
                run()
                err = float(((sum(ys).double() - ref).norm() / ref.norm()).item())
                t = time_cuda(run)["median_ms"]
                line += f"  P{p}={t:.4f} ({t_whole / t:.2f}x, err {err:.1e})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
