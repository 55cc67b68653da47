"""Refit the skinny cost model's tile rates (a rates file's `tiles`) to measured times.

    python benchmarks/fit_skinny_rates.py RESULTS [RESULTS ...] [--only-defaults]

RESULTS: an `llm` benchmark document (llm.json: each case's forced-family times and specs) or a
`tiled_probe.py` table (tiled_probe.txt: every variant row with its spec). Every row gives a W shape,
density, N, the spec that ran and its measured time; the model predicts that same spec's time
(`skinny_cost.tiled_seconds` with the spec's tile height, split-K and reduction forced) for a
uniform pattern of that density. The three rates, the fixed time (us), the wide-block factor and
the 16-column factor per family minimise the squared error of log time
(Nelder-Mead from the current rates), and the script prints the fit's median and worst error per
family before and after. `--only-defaults` keeps the probe's default rows and the rows whose spec
the chooser would build now (the fit should serve the specs that are selected). `--only-n16` fits
the 16-column factor alone, every other rate kept.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from scipy.optimize import minimize  # noqa: E402

from sparsegen.families.base import Request  # noqa: E402
from sparsegen.select import skinny_cost  # noqa: E402
from sparsegen.select.device import default as default_device  # noqa: E402
from sparsegen.select.ratesfile import TileRates  # noqa: E402
from tests.tiled_helpers import uniform_stats  # noqa: E402

DEVICE = [default_device()]  # the device the predictions are made for (main() may change its wave rates)
SPEC = re.compile(r"\.m(\d+)k(\d+)n(\d+)\.t(\d+)x64\.bn\d+\.(?:sk(\d+)([acr]?)|stream\d+)")
GRANULE = re.compile(r"\.g(\d+)(\.|$)")
REDUCTION = {"": "none", "a": "atomic", "c": "cluster", "r": "two_step"}


def spec_options(spec: str) -> dict:
    m = SPEC.search(spec)
    if m is None:
        raise ValueError(f"not a tile spec name: {spec}")
    tile_m = int(m.group(4))
    if m.group(5) is None:  # stream-K: the resident blocks share the tile products
        out = {"tile_m": tile_m, "reduction": "stream"}
    else:
        split, red = int(m.group(5)), REDUCTION[m.group(6)]
        out = {"tile_m": tile_m, "split_k": split} | ({"reduction": red} if split > 1 else {})
    blocks = re.search(r"\.mb(\d+)\.", spec)
    if blocks and spec.startswith("tiled_bitmap_spmm"):  # the residency, fixed (the chooser may add a block)
        out["blocks"] = int(blocks.group(1))
    if spec.startswith("tiled_bitmap_spmm"):  # the bitmap encoding, fixed (the chooser would pick one)
        g = GRANULE.search(spec)
        out["granule"] = int(g.group(1)) if g else 1
    return out


def rates_key(fam: str, spec: str) -> str:
    """The tile rates' key a measured spec calibrates."""
    g = GRANULE.search(spec)
    return fam + (".g2" if fam == "tiled_bitmap_spmm" and g and g.group(1) == "2" else "")


def rows_from_llm(path: str) -> list:
    out = []
    for c in json.load(open(path))["cases"]:
        if c.get("source") != "opt" or c.get("status") != "ok":
            continue
        m, k = c["shape"]
        for fam, spec in c.get("family_spec", {}).items():
            ms = c["ms"].get(fam)
            if ms:
                out.append((rates_key(fam, spec), m, k, c["nnz"] / (m * k), c["n"], spec, ms * 1e-3))
    return out


def rows_from_probe(path: str, only_defaults: bool) -> list:
    out = []
    fams = {"csl": "tiled_csl_spmm", "bitmap": "tiled_bitmap_spmm"}
    for line in open(path):
        p = line.split()
        if len(p) < 6 or not re.match(r"\d+x\d+$", p[0]) or p[3].split(".")[0] not in fams or p[4] == "ERROR":
            continue
        if line.rstrip().endswith("MISMATCH") or p[3].endswith(".base"):  # .base: the A/B's old templates
            continue
        m, k = (int(v) for v in p[0].split("x"))
        fam = fams[p[3].split(".")[0]]
        spec = p[-1]
        if only_defaults and not matches_chooser(fam, m, k, float(p[1]), int(p[2]), spec):
            continue
        out.append((rates_key(fam, spec), m, k, 1.0 - float(p[1]), int(p[2]), spec, float(p[4]) * 1e-6))
    return out


def matches_chooser(fam: str, m: int, k: int, density: float, n: int, spec: str) -> bool:
    stats, _ = case(m, k, density, n, spec)
    chosen, _ = skinny_cost.build(stats, Request("spmm", n=n, dtype="float16", device=DEVICE[0]), fam.split(".")[0])
    return spec_options(chosen.name) == spec_options(spec)


@functools.cache
def case(m: int, k: int, density: float, n: int, spec: str):
    """(stats, request) of a row: built once, then reused by every evaluation of the fit."""
    request = Request("spmm", n=n, dtype="float16", options=tuple(sorted(spec_options(spec).items())),
                      device=DEVICE[0])
    return uniform_stats(m, k, density), request


def predict(row, rates) -> float:
    fam, m, k, density, n, spec, _ = row
    stats, request = case(m, k, density, n, spec)
    return skinny_cost.tiled_seconds(stats, request, fam.split(".")[0],
                                     TileRates(*rates[:3], rates[3] * 1e-6, *rates[4:6]))


def errors(rows, rates) -> np.ndarray:
    return np.array([predict(r, rates) / r[-1] - 1 for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--only-defaults", action="store_true")
    ap.add_argument("--only-n16", action="store_true", help="fit the 16-column factor alone")
    ap.add_argument("--occupancy-h", type=float, default=None, help="try another tiles.occupancy_h")
    ap.add_argument("--wide-two-step-scale", type=float, default=None, help="try another tiles.wide_two_step_scale")
    args = ap.parse_args()
    import dataclasses

    device = default_device()
    tiles = device.rates.tiles
    tiles = dataclasses.replace(tiles, occupancy_h=tiles.occupancy_h if args.occupancy_h is None else args.occupancy_h,
                                wide_two_step_scale=(tiles.wide_two_step_scale if args.wide_two_step_scale is None
                                                     else args.wide_two_step_scale))
    DEVICE[0] = device.with_rates(device.rates.replace(tiles=tiles))
    total = 0.0
    rows = []
    for path in args.results:
        rows += rows_from_llm(path) if path.endswith(".json") else rows_from_probe(path, args.only_defaults)
    for fam in ("tiled_csl_spmm", "tiled_bitmap_spmm", "tiled_bitmap_spmm.g2"):
        old = DEVICE[0].rates.tiles.of(fam)
        mine = [r for r in rows if r[0] == fam]
        if not mine:
            continue
        x0 = np.array([old.base, old.per_column, old.per_nonzero, max(old.fixed_s, 1e-6) * 1e6, old.wide, old.n16])
        free = [5] if args.only_n16 else list(range(6))

        def full(v):
            x = x0.copy()
            x[free] = v
            return x

        def loss(v):
            x = full(v)
            if (x < 0).any():
                return 1e9
            pred = np.array([predict(r, x) for r in mine])
            return float(np.sum(np.log(pred / np.array([r[-1] for r in mine])) ** 2))

        fit = minimize(loss, x0[free], method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-6, "maxiter": 1500})
        fit.x = full(fit.x)
        total += fit.fun
        before, after = np.abs(errors(mine, x0)), np.abs(errors(mine, fit.x))
        print(f"{fam}: {len(mine)} rows; old {tuple(round(v, 3) for v in x0)} median {np.median(before):.1%} "
              f"max {before.max():.1%}; fitted {tuple(round(float(v), 3) for v in fit.x)} median "
              f"{np.median(after):.1%} max {after.max():.1%}")
        worst = np.argsort(-after)[:5]
        for i in worst:
            r = mine[i]
            print(f"   worst: {r[1]}x{r[2]} d={r[3]:.2f} N={r[4]} {r[5].split('.', 1)[1][:60]} "
                  f"measured {r[-1] * 1e6:.1f} us, error {errors([r], fit.x)[0]:+.0%}")
    print(f"total squared log error {total:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
