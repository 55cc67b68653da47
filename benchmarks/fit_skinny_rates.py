"""Refit the skinny cost model's tile rates (a rates file's `tiles`) to measured times.

    python benchmarks/fit_skinny_rates.py RESULTS [RESULTS ...] [--only-defaults] [--only-n16]

RESULTS: an `llm` benchmark document (llm.json: each case's forced-family times and specs) or a
`tiled_probe.py` table (tiled_probe.txt: every variant row with its spec). Every row gives a W shape,
density, N, the spec that ran and its measured time; the model predicts that same spec (built with
the spec's tile height, split-K and reduction forced) for a uniform pattern of that density. The fit
itself is the product's (`sparsegen.select.fit.fit_tile_rates`, what `sparsegen calibrate` runs):
the rates of each family minimising the squared error of log time, from the default rates; the
script prints the median and worst error per family before and after. `--only-defaults` keeps the
probe's default rows and the rows whose spec the chooser would build now (the fit should serve the
specs that are selected). `--only-n16` fits the 16-column factor alone, every other rate kept.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sparsegen.families.base import Request  # noqa: E402
from sparsegen.select import fit, skinny_cost  # noqa: E402
from sparsegen.select.device import default as default_device  # noqa: E402
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
    """(stats, request) of a row: built once."""
    request = Request("spmm", n=n, dtype="float16", options=tuple(sorted(spec_options(spec).items())),
                      device=DEVICE[0])
    return uniform_stats(m, k, density), request


def fit_row(row) -> fit.Row:
    """The product fit's row: the spec the chooser builds with the measured spec's options forced."""
    fam, m, k, density, n, spec, seconds = row
    stats, request = case(m, k, density, n, spec)
    built, _ = skinny_cost.build(stats, request, fam.split(".")[0])
    return fit.Row(stats, request, built, seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--only-defaults", action="store_true")
    ap.add_argument("--only-n16", action="store_true", help="fit the 16-column factor alone")
    ap.add_argument("--occupancy-h", type=float, default=None, help="try another tiles.occupancy_h")
    ap.add_argument("--wide-two-step-scale", type=float, default=None, help="try another tiles.wide_two_step_scale")
    args = ap.parse_args()
    device = default_device()
    tiles = device.rates.tiles
    tiles = dataclasses.replace(tiles, occupancy_h=tiles.occupancy_h if args.occupancy_h is None else args.occupancy_h,
                                wide_two_step_scale=(tiles.wide_two_step_scale if args.wide_two_step_scale is None
                                                     else args.wide_two_step_scale))
    DEVICE[0] = device.with_rates(device.rates.replace(tiles=tiles))
    rows = []
    for path in args.results:
        rows += rows_from_llm(path) if path.endswith(".json") else rows_from_probe(path, args.only_defaults)
    total = 0.0
    for fam in ("tiled_csl_spmm", "tiled_bitmap_spmm", "tiled_bitmap_spmm.g2"):
        mine = [fit_row(r) for r in rows if r[0] == fam]
        if not mine:
            continue
        old = DEVICE[0].rates.tiles.of(fam)
        before = fit.quality(mine, old)
        after = fit.fit_tile_rates(mine, old, ("n16",) if args.only_n16 else fit.TILE_FIELDS)
        total += float(np.sum(np.log(fit.predict(mine, after.rates) / np.array([r.seconds for r in mine])) ** 2))
        print(f"{fam}: {len(mine)} rows; old {old} median {before.median_error:.1%} max {before.max_error:.1%}; "
              f"fitted {after.rates} median {after.median_error:.1%} max {after.max_error:.1%}")
        errors = fit.predict(mine, after.rates) / np.array([r.seconds for r in mine]) - 1
        for i in np.argsort(-np.abs(errors))[:5]:
            r, spec = mine[i], [row for row in rows if row[0] == fam][i]
            print(f"   worst: {spec[1]}x{spec[2]} d={spec[3]:.2f} N={spec[4]} {spec[5].split('.', 1)[1][:60]} "
                  f"measured {r.seconds * 1e6:.1f} us, error {errors[i]:+.0%}")
    print(f"total squared log error {total:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
