"""Time forced SDDMM kernels on DLMC matrices against cuSPARSE (a probe, not a suite).

    python lab/sweeps/sddmm_sweep.py --data .devdata --k 32,128,256 --every 4 \
        --variants "default;tile=16;unroll=2;block=128"

For every `--every`-th DLMC matrix of index.tsv (plus `--random SIZE:SPARSITY,...` squares) and
every k: each variant (request options as `name=value,name=value`, family sputnik_sddmm unless
the variant names another; `default` is sputnik_sddmm's own choice, `family=auto` the rule
table's) compiled, checked against a float64 reference on a sample of the nonzeros, and timed with
sparsegen.bench.timing.time_cuda; torch.sparse.sampled_addmm (cuSPARSE) timed the same way.
Prints one row per (matrix, k) and per-variant geomeans against cuSPARSE; `--out FILE` keeps the
rows as JSON after every matrix.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from spmm_sweep import add_matrix_arguments, print_geomeans, save_rows, sweep_matrices  # noqa: E402

CHECK = 20000  # nonzeros of each case checked against the float64 reference


def parse_variant(text: str) -> tuple[str, dict]:
    options = {}
    for item in filter(None, text.split(",")):
        if item == "default":
            continue
        key, value = item.split("=")
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    return text, options


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("SPARSEGEN_DATA", "../shared/data"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", default="32,128,256")
    ap.add_argument("--variants", default="default")
    add_matrix_arguments(ap, every=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    import sparsegen
    from sparsegen.bench.timing import time_cuda

    variants = [parse_variant(v) for v in args.variants.split(";")]
    tdt = {"float32": torch.float32, "float16": torch.float16}[args.dtype]
    mats = sweep_matrices(args)
    rows, ratios = [], {name: [] for name, _ in variants}
    dev = "cuda"
    for mid, load in mats:
        p = load()
        m, n = p.shape
        crow = torch.from_numpy(p.indptr.astype(np.int32)).to(dev)
        col = torch.from_numpy(p.indices.astype(np.int32)).to(dev)
        pattern = torch.sparse_csr_tensor(crow, col, torch.ones(p.nnz, dtype=tdt, device=dev), size=p.shape)
        rows_of = torch.repeat_interleave(torch.arange(m, device=dev), torch.diff(crow.long()))
        sample = torch.from_numpy(np.random.default_rng(0).choice(p.nnz, size=min(CHECK, p.nnz),
                                                                 replace=False)).to(dev)
        for k in map(int, args.k.split(",")):
            a = torch.randn((m, k), dtype=tdt, device=dev)
            b = torch.randn((n, k), dtype=tdt, device=dev)
            r, c = rows_of[sample], col[sample].long()
            ref = (a[r].double() * b[c].double()).sum(1)

            def err(values):
                got = values.reshape(-1)[sample].double()
                return float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))

            rec = {"id": mid, "k": k, "shape": [m, n], "nnz": int(p.nnz), "ms": {}, "spec": {}, "error": {}}
            bt = b.t()
            rec["ms"]["cusparse"] = time_cuda(
                lambda: torch.sparse.sampled_addmm(pattern, a, bt, beta=0.0, alpha=1.0))["median_ms"]
            for name, options in variants:
                try:
                    forced = {"family": "sputnik_sddmm", **options}
                    if forced["family"] == "auto":  # the rule table's own choice
                        del forced["family"]
                    kern = sparsegen.compile(p, op="sddmm", k=k, dtype=args.dtype, backend="gpu",
                                             options=forced or None)
                except sparsegen.SparsegenError as exc:
                    rec["spec"][name] = f"declined: {exc}"[:200]
                    continue
                rec["error"][name] = err(kern(a, b))
                rec["ms"][name] = time_cuda(lambda: kern(a, b))["median_ms"]
                rec["spec"][name] = kern.spec.name
                ratios[name].append(rec["ms"]["cusparse"] / rec["ms"][name])
            rows.append(rec)
            cells = "  ".join(f"{v}={rec['ms'][v] * 1e3:.1f}" for v in rec["ms"])
            bad = [v for v, e in rec["error"].items() if not e <= 1e-4]
            print(f"{mid[-48:]:48s} k={k:4d} {cells}{'  WRONG: ' + ','.join(bad) if bad else ''}", flush=True)
        save_rows(rows, args.out)
    print_geomeans(ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
