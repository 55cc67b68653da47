"""Compare two rates files by what selection does with them: the fp16 skinny picks and the skinny
model's predicted times on uniform OPT-sized weights (density 0.1-0.5, N = 8-64), for both.

    python lab/compare_rates.py sparsegen/select/rates/h200.json OTHER.json

A calibration from scratch reproduces a shipped file when its predictions differ by less than the
fit's own error (the files' `provenance.tiles.error`). Single rates may differ more: the base and
per-column cycles of a tile family trade off against each other on the fitted rows.
"""
from __future__ import annotations

import sys

import numpy as np

from sparsegen.families.base import Request
from sparsegen.select import device as device_model
from sparsegen.select import ratesfile, select_request, skinny_cost

SHAPES = ((7168, 7168), (28672, 7168), (7168, 28672), (9216, 9216), (12288, 12288), (21504, 7168))
DENSITIES = (0.5, 0.3, 0.2, 0.1)
NS = (8, 16, 32, 64)


def device_with(rates):
    props = dict(device_model.default().properties(), **rates.device)
    return device_model.DeviceModel.from_properties(props, rates)


def main(a_path: str, b_path: str) -> None:
    from tests.tiled_helpers import uniform_stats  # the analysed stats of a uniform pattern, without building it

    a, b = ratesfile.load(a_path), ratesfile.load(b_path)
    da, db = device_with(a), device_with(b)
    moved, total, ratios = [], 0, []
    for (m, k) in SHAPES:
        for density in DENSITIES:
            stats = uniform_stats(m, k, density)
            for n in NS:
                ra, rb = (Request("spmm", n=n, dtype="float16", device=d) for d in (da, db))
                pa, pb = select_request(stats, ra).spec.name, select_request(stats, rb).spec.name
                total += 1
                if pa != pb:
                    moved.append(f"{m}x{k} density {density} N={n}: {pa} -> {pb}")
                ca, cb = skinny_cost.compare(stats, ra), skinny_cost.compare(stats, rb)
                ratios += [cb.get(p.family).seconds / p.seconds for p in ca.predictions if cb.get(p.family)]
    r = np.abs(np.log(ratios))
    print(f"{a_path} vs {b_path}")
    print(f"predicted times ({len(r)}): |log ratio| median {np.median(r):.1%}, 90 % {np.quantile(r, 0.9):.1%}, "
          f"max {r.max():.1%}")
    print(f"picks moved: {len(moved)} of {total}")
    for line in moved:
        print("  " + line)
    for name, rates in ((a_path, a), (b_path, b)):
        print(f"{name}: tiles {rates.provenance['tiles']['error']}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
