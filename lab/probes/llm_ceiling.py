"""Bound on the `llm` suite's speedups over cuBLAS: what a sparse kernel as efficient as cuBLAS would reach.

    python lab/probes/llm_ceiling.py [benchmarks/results/h100-80gb-hbm3/llm/llm.json]

Per OPT case, a kernel that moves the fewer bytes of the two encodings (bitmap: 1/8 byte per element
+ 2 per nonzero; Tiled-CSL: 4 per nonzero) plus X and Y at cuBLAS's own fitted rate (3.69 us + bytes
at 2.724 TB/s: the default rates' cublas_fp16.fixed_s / bytes_per_s), and does the dense-equivalent tensor
math (2 M K N, as both tile families do) at cuBLAS fp16's best measured rate (450 TFLOP/s:
cublas_fp16.flops), whichever is slower. The measured cuBLAS time over that bound is the
ceiling; the table sets each sparsity's ceiling (geomean over the OPT shapes) beside the selected
kernel's measured speedup. No GPU: it reads the suite's JSON.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from sparsegen.bench.report import geomean  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# cuBLAS fp16's fitted rates, from the shipped H100 rates file (the default device's)
with open(os.path.join(ROOT, "sparsegen", "select", "rates", "h100-80gb-hbm3.json")) as _f:
    _CUBLAS = json.load(_f)["rates"]["cublas_fp16"]
DENSE_FIXED_S, DENSE_BYTES_PER_S, DENSE_FLOPS = _CUBLAS["fixed_s"], _CUBLAS["bytes_per_s"], _CUBLAS["flops"]

DEFAULT = os.path.join(ROOT, "benchmarks", "results", "h100-80gb-hbm3", "llm", "llm.json")


def bound_seconds(m: int, k: int, n: int, nnz: int) -> float:
    """The faster-than-possible time of one skinny product (see the module docstring)."""
    density = nnz / (m * k)
    w_bytes = m * k * min(1 / 8 + 2 * density, 4 * density)
    memory = DENSE_FIXED_S + (w_bytes + 2 * (k * n + m * n)) / DENSE_BYTES_PER_S
    math_ = DENSE_FIXED_S + 2 * m * k * n / DENSE_FLOPS
    return max(memory, math_)


def main(path: str) -> int:
    doc = json.load(open(path))
    ceiling, measured = defaultdict(list), defaultdict(list)
    for c in doc["cases"]:
        if c["source"] != "opt" or not c.get("pass"):
            continue
        m, k = c["shape"]
        key = (c["nominal_sparsity"], c["n"])
        ceiling[key].append(c["ms"]["cublas"] * 1e-3 / bound_seconds(m, k, c["n"], c["nnz"]))
        measured[key].append(c["speedup"]["vs_cublas"])
    ns = sorted({n for _, n in ceiling})
    print(f"# {os.path.relpath(path)} (revision {doc.get('revision', '?')[:7]}): ceiling / measured speedup over cuBLAS fp16, geomean over the OPT shapes")
    print("| sparsity | " + " | ".join(f"N={n}" for n in ns) + " | N geomean | measured / ceiling |")
    print("|---" * (len(ns) + 3) + "|")
    for s in sorted({s for s, _ in ceiling}):
        cells, all_c, all_m = [], [], []
        for n in ns:
            cells.append(f"{geomean(ceiling[(s, n)]):.2f} / {geomean(measured[(s, n)]):.2f}")
            all_c += ceiling[(s, n)]
            all_m += measured[(s, n)]
        print(f"| {s:.1f} | " + " | ".join(cells)
              + f" | {geomean(all_c):.2f} / {geomean(all_m):.2f} | {geomean(all_m) / geomean(all_c):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT))
