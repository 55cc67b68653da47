"""Compare two rates files by what selection does with them: the fp16 skinny picks and the skinny
model's predicted times on uniform OPT-sized weights (density 0.1-0.5, N = 8-64), for both.

    python lab/fit/compare_rates.py sparsegen/select/rates/h200.json OTHER.json

A calibration from scratch reproduces a shipped file when its predictions differ by less than the
fit's own error (the files' `provenance.tiles.error`). Single rates may differ more: the base and
per-column cycles of a tile family trade off against each other on the fitted rows.

Public API only: `sparsegen.analyze`, `sparsegen.MatrixStats` (to_dict / from_dict),
`sparsegen.select(...)` with a `sparsegen.select.DeviceModel` built from each file
(docs/devices.md); the predicted times are the ones `Selection.reason` states.
"""
from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402
from sparsegen.select import DeviceModel  # noqa: E402
from sparsegen.select.ratesfile import load as load_rates  # noqa: E402

SHAPES = ((7168, 7168), (28672, 7168), (7168, 28672), (9216, 9216), (12288, 12288), (21504, 7168))
DENSITIES = (0.5, 0.3, 0.2, 0.1)
NS = (8, 16, 32, 64)
PREDICTED = re.compile(r"([A-Za-z][\w\- ]*?) (\d+(?:\.\d+)?) ms")


def uniform_stats(m: int, k: int, density: float, seed: int = 1) -> sparsegen.MatrixStats:
    """MatrixStats of an m x k matrix with a uniformly random pattern of `density`, without building
    it (OPT shapes hold hundreds of millions of entries): a small one analysed, then its shape, counts,
    tiles (every 128 x 64 tile near the same density: one histogram bin) and binomial row lengths
    set to the large one's."""
    small = sp.random(256, 256, density, format="csr", dtype=np.float32, random_state=seed)
    d = sparsegen.analyze(small).to_dict()
    tiles = -(-m // 128) * -(-k // 64)
    hist = [0] * 10
    hist[min(int(density * 10), 9)] = tiles
    d["tiles"] = {"tile_rows": 128, "tile_cols": 64, "tiles": tiles, "nonempty": tiles,
                  "max_nnz": int(density * 8192 * 1.1), "mean_nnz": density * 8192,
                  "dense_share": float(density > 0.5), "density_hist": hist,
                  "density_means": [density if c else 0.0 for c in hist]}
    mean, std = density * k, (k * density * (1 - density)) ** 0.5
    d["row_lengths"] = {"min": int(max(0, mean - 5 * std)), "max": int(mean + 5 * std), "mean": mean,
                        "std": std, "cov": std / mean, "empty": 0}
    d.update(shape=[m, k], nnz=int(density * m * k), density=density)
    return sparsegen.MatrixStats.from_dict(json.loads(json.dumps(d)))


def device_with(path: str) -> DeviceModel:
    rates = load_rates(path)
    return DeviceModel.from_properties(dict(DeviceModel.default().properties(), **rates.device), rates)


def predicted(reason: str) -> dict:
    """{candidate: ms} from a skinny selection's reason ("... fastest: bitmap 0.135 ms, ...; ...")."""
    head = reason.split(";", 1)[0].split(":", 1)[-1]
    return {name.strip(): float(ms) for name, ms in PREDICTED.findall(head)}


def main(a_path: str, b_path: str) -> None:
    da, db = device_with(a_path), device_with(b_path)
    moved, total, ratios = [], 0, []
    for (m, k) in SHAPES:
        for density in DENSITIES:
            stats = uniform_stats(m, k, density)
            for n in NS:
                sa, sb = (sparsegen.select(stats, "spmm", n=n, dtype="float16", device=d) for d in (da, db))
                total += 1
                if sa.spec.name != sb.spec.name:
                    moved.append(f"{m}x{k} density {density} N={n}: {sa.spec.name} -> {sb.spec.name}")
                pa, pb = predicted(sa.reason), predicted(sb.reason)
                ratios += [pb[c] / pa[c] for c in pa if c in pb and pa[c] > 0]
    r = np.abs(np.log(ratios)) if ratios else np.zeros(1)
    print(f"{a_path} vs {b_path}")
    print(f"predicted times ({len(ratios)}): |log ratio| median {np.median(r):.1%}, 90 % {np.quantile(r, 0.9):.1%}, "
          f"max {r.max():.1%}")
    print(f"picks moved: {len(moved)} of {total}")
    for line in moved:
        print("  " + line)
    for path in (a_path, b_path):
        print(f"{path}: tiles {json.load(open(path))['provenance']['tiles'].get('error')}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
