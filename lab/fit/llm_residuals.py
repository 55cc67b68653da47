"""How far the cost model's predicted times are from what an llm suite run measured, per family,
by K (long: K >= 4 M) and by N (<= 16 or more); and cuBLAS's times fitted two ways, fixed + bytes
and fixed + bytes + a K loop, to see which terms the measured times need.

    python lab/fit/llm_residuals.py benchmarks/results/h200/llm/llm.json

Reads the suite's JSON only: each case's measured medians (`ms`) and the default selection's
reason, which states every family's predicted time (the tuned picks' reason quotes the model's
line after "the model chose").
"""
from __future__ import annotations

import collections
import json
import os
import sys

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_rates import predicted  # noqa: E402

COLUMNS = {"bitmap": "tiled_bitmap_spmm", "tiled lanes": "tiled_lanes_spmm", "Tiled-CSL": "tiled_csl_spmm",
           "dense cuBLAS via torch": "cublas"}


def residuals(cases) -> dict:
    """{(timed name, "long K" | "short K", "N <= 16" | "N > 16"): [predicted / measured, ...]}."""
    out = collections.defaultdict(list)
    for c in cases:
        reason = (c.get("reason") or "").split("the model chose", 1)[-1]
        m, k = c["shape"]
        for label, ms in predicted(reason).items():
            name = COLUMNS.get(label)
            measured = (c.get("ms") or {}).get(name)
            if name and measured:
                out[(name, "long K" if k >= 4 * m else "short K", "N <= 16" if c["n"] <= 16 else "N > 16")].append(
                    ms / measured)
    return out


def cublas_fits(cases) -> list:
    """[(terms, fitted values, median error, 90 % error)] of cuBLAS's median times by (M, K, N)."""
    by = collections.defaultdict(list)
    for c in cases:
        if (c.get("ms") or {}).get("cublas"):
            by[(c["shape"][0], c["shape"][1], c["n"])].append(c["ms"]["cublas"] * 1e-3)
    mkn = np.array(list(by), dtype=np.float64)
    seconds = np.array([np.median(v) for v in by.values()])
    moved = 2.0 * (mkn[:, 0] * mkn[:, 1] + mkn[:, 1] * mkn[:, 2] + mkn[:, 0] * mkn[:, 2])
    out = []
    for terms, cols, scale in (("fixed + bytes", [np.ones_like(seconds), moved], [1e-6, 1 / 4e12]),
                               ("fixed + bytes + K loop", [np.ones_like(seconds), moved, mkn[:, 1]],
                                [1e-6, 1 / 4e12, 1e-10])):
        a = np.column_stack(cols) * np.array(scale)

        def res(x, a=a):
            return np.log(a @ x) - np.log(seconds)

        x = least_squares(res, np.ones(a.shape[1]), bounds=(0, np.inf)).x
        err = np.expm1(np.abs(res(x)))
        values = x * np.array(scale)
        shown = [f"fixed {values[0] * 1e6:.2f} us", f"bytes at {1 / values[1] / 1e12:.2f} TB/s"] + \
            ([f"K loop {values[2] * 1e9:.3f} ns per element of K"] if len(values) > 2 else [])
        out.append((terms, ", ".join(shown), float(np.median(err)), float(np.quantile(err, 0.9))))
    return out


def main(path: str) -> None:
    doc = json.load(open(path))
    cases = [c for c in doc["cases"] if c.get("status") == "ok"]
    print(f"{path}: {len(cases)} passing cases, revision {doc.get('revision', '?')[:12]}")
    print("\n| timed | K | N | cases | predicted / measured: median | 10 % | 90 % |\n|---|---|---|---|---|---|---|")
    for key, v in sorted(residuals(cases).items()):
        v = np.array(v)
        print(f"| {' | '.join(key)} | {len(v)} | {np.median(v):.3f} | {np.quantile(v, 0.1):.3f} | "
              f"{np.quantile(v, 0.9):.3f} |")
    print("\n| cuBLAS model | fitted | median error | 90 % error |\n|---|---|---|---|")
    for terms, values, med, p90 in cublas_fits(cases):
        print(f"| {terms} | {values} | {med:.1%} | {p90:.1%} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
