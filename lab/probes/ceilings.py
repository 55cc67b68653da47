"""The best geomean over cuSPARSE that a CUDA-core kernel could reach on the dlmc suite (a bound, not a measurement).

    python lab/probes/ceilings.py [benchmarks/results/h100-80gb-hbm3/dlmc.json] [--floor-us 3.97]

For every float32 DLMC case in the results file: a kernel that keeps one operand in registers and
streams the other through L1 or shared memory moves 4 bytes per multiply-add (SDDMM: the row of B
per sampled entry; SpMM: the row of X per nonzero), and the SM's L1/shared-memory datapath moves
at most 128 bytes per cycle. So no such kernel takes less than

    floor + nnz * (k or n) * 4 B / (SMs * 128 B * clock)

where floor is the launch time of an empty kernel measured the way the bench times
(launch_overhead.txt: 3.97 us on the lent H100) and clock the H100's 1.755 GHz boost. The table
gives, per op and n/k, the geomean of cuSPARSE's measured time over that bound (the best ratio
such a kernel could claim), the geomean sparsegen measured, and how far its time minus the floor
is above the bound minus the floor. Tensor-core kernels (dense_tile_sddmm, the dense fallback)
are not bound by it: they compute dense tiles.
"""
from __future__ import annotations

import argparse
import json
import math
import os

SMS, BYTES_PER_CYCLE, CLOCK_HZ = 132, 128, 1.755e9
BYTES_PER_FMA = 4


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def bound_s(case: dict, floor_s: float) -> float:
    width = case["k"] or case["n"]
    return floor_s + case["nnz"] * width * BYTES_PER_FMA / (SMS * BYTES_PER_CYCLE * CLOCK_HZ)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=os.path.join(here, "..", "..", "benchmarks", "results", "h100-80gb-hbm3", "dlmc.json"))
    ap.add_argument("--floor-us", type=float, default=3.97)
    args = ap.parse_args()
    floor = args.floor_us * 1e-6
    cases = [c for c in json.load(open(args.results))["cases"]
             if c["source"] == "dlmc" and c["dtype"] == "float32" and c["pass"]]
    print(f"L1 datapath {SMS * BYTES_PER_CYCLE * CLOCK_HZ / 1e12:.1f} TB/s, {BYTES_PER_FMA} B per multiply-add, "
          f"launch floor {args.floor_us} us")
    print("| op | n/k | cases | bound: cuSPARSE / best time | measured vs cuSPARSE "
          "| (time - floor) / (bound - floor) |")
    print("|---|---|---|---|---|---|")
    for op in ("spmm", "sddmm"):
        mine = [c for c in cases if c["op"] == op]
        widths = sorted({c["k"] or c["n"] for c in mine})
        for width in widths + [None]:
            sel = [c for c in mine if width is None or (c["k"] or c["n"]) == width]
            best = geomean(c["ms"]["cusparse"] / 1e3 / bound_s(c, floor) for c in sel)
            now = geomean(c["speedup"]["vs_cusparse"] for c in sel)
            gap = geomean((c["ms"]["sparsegen"] / 1e3 - floor) / (bound_s(c, floor) - floor) for c in sel)
            print(f"| {op} | {width or 'all'} | {len(sel)} | {best:.2f}x | {now:.2f}x | {gap:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
