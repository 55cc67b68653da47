"""Forced families on OPT-like skinny products against cuBLAS fp16 (a probe, not the `llm` suite).

    python lab/probes/llm_family_probe.py --shapes 7168x7168,28672x7168 --sparsity 0.8,0.9 \
        --n 8,16,32 --families default,sputnik_spmm,csr_rowsplit,tiled_csl_spmm,tiled_bitmap_spmm

W: uniform random pattern (sparsegen.bench.llm.random_weight, fp16 values), X: K x N fp16. Each family
is forced through options={"family": ...} (`default` = the selection), checked against the fp32
product of the fp16 operands (relative Frobenius error) and timed with time_cuda like the suite.
A family that declines or fails prints its reason and the probe goes on. Writes $OUT/llm_family_probe.txt.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402
from sparsegen.bench.llm import parse_shapes  # noqa: E402
from sparsegen.bench.weights import as_dtype, random_weight  # noqa: E402
from sparsegen.bench.report import geomean  # noqa: E402
from sparsegen.bench.timing import time_cuda  # noqa: E402
from _emit import emitter  # noqa: E402  (lab/probes/_emit.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="7168x7168,28672x7168")
    ap.add_argument("--sparsity", default="0.8,0.9")
    ap.add_argument("--n", default="8,16,32")
    ap.add_argument("--families", default="default,sputnik_spmm,csr_rowsplit,tiled_csl_spmm,tiled_bitmap_spmm")
    ap.add_argument("--options", default="", help="extra options for every forced family, k=v,k=v")
    args = ap.parse_args()
    import torch

    extra = dict(kv.split("=") for kv in args.options.split(",") if kv)
    extra = {k: int(v) if v.isdigit() else v for k, v in extra.items()}
    emit = emitter("llm_family_probe.txt")

    ratios = {}
    for (m, k) in parse_shapes(args.shapes):
        for s in (float(v) for v in args.sparsity.split(",")):
            t0 = time.time()
            W = as_dtype(random_weight(m, k, s, seed=0), "float16")
            Wd = torch.from_numpy(W.toarray()).cuda().half()
            for n in (int(v) for v in args.n.split(",")):
                X = torch.randn((k, n), dtype=torch.float16, device="cuda")
                ref = Wd.float() @ X.float()
                cub = time_cuda(lambda: torch.matmul(Wd, X))["median_ms"]
                emit(f"{m}x{k} s={s} N={n} cuBLAS {cub * 1e3:.1f} us")
                for fam in args.families.split(","):
                    opts = {} if fam == "default" else {"family": fam, **extra}
                    try:
                        kern = sparsegen.compile(W, n=n, dtype="float16", backend="gpu", options=opts)
                        Y = torch.empty((m, n), dtype=torch.float16, device="cuda")
                        kern(X, out=Y)
                        err = ((Y.float() - ref).norm() / ref.norm()).item()
                        ms = time_cuda(lambda: kern(X, out=Y))["median_ms"]
                    except Exception as e:  # a declined or failed family is a row, not the end
                        emit(f"    {fam:20s} -- {type(e).__name__}: {str(e).splitlines()[0][:150]}")
                        continue
                    ratios.setdefault(fam, []).append(cub / ms)
                    emit(f"    {fam:20s} {ms * 1e3:8.1f} us {cub / ms:5.2f}x err {err:.1e} {kern.spec.name}")
            emit(f"# {m}x{k} s={s}: {time.time() - t0:.0f} s")
    for fam, r in ratios.items():
        emit(f"# geomean vs cuBLAS {fam}: {geomean(r):.2f}x over {len(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
