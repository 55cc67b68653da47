"""The fp16/bf16 SpMM cost model: predicted time of every candidate for one matrix and request, and
the verdict the rules of `tiled_bitmap_spmm`, `tiled_csl_spmm` and `dense_gemm` take from it (each
accepts only where its kernel is predicted fastest).

The candidates, where their gates let them serve the request:

- the tile families: per analysed 128 x 64 tile an SM spends the larger of the tile's bytes over
  its share of the achieved bandwidth and `base + per_column x bn + per_nonzero x nnz` cycles
  (`TileRates`), summed over the tile-density histogram (so clustered and uniform matrices of one
  density differ), times the column tiles (each re-reads W); spread over the SMs the spec's split-K
  keeps busy (wide blocks: the busiest SM's waves at the spec's residency, `_tiled.wave_factor`);
  plus a launch and the split-K reduction (`_tiled.spec_reduction_seconds`). The spec is the one
  the family's `choose` would build.
- dense cuBLAS (`dense_gemm`): W, X and Y moved once at the achieved bandwidth, or tensor-core
  math past N ~ 128, whichever is slower (and never under cuBLAS's floor); plus the epilogue pass
  for bias/ReLU.
- the CSR kernels (float16 only: `ell_coo_spmm`, `panel_spmm`, `sputnik_spmm`, `csr_rowsplit`): bound
  by their nonzero rate, their gathers of X, or their bytes (rates of csr_rowsplit and sputnik_spmm).
  Where they win, the three rules decline and the CSR rules choose among themselves as for float32.

Dense wins near-ties: a sparse kernel is chosen over dense only when predicted SPARSE_MARGIN faster.
Every constant is an H100 (sm_90) figure with its source; other architectures change only the SM
count. Recalibrate with `benchmarks/fit_skinny_rates.py` on a `tiled_probe.py --sweep granule` run
when the kernels change (tests/test_select_skinny.py checks the model against those rows).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import _tiled as T
from .base import Request, sm_count, spmm_gate

# ---- H100 constants ---------------------------------------------------------------------------
LAUNCH_S = T.LAUNCH_S  # one kernel launch on a busy stream (3 us)
# BENCHMARKS.md: cuBLAS fp16 on the llm shapes with N <= 64 moves a median 2.50 TB/s (copy bandwidth
# 2.96 TB/s); llm_probe.txt: 2.45-2.56 TB/s on 7168x7168 and 2.72 on 28672x7168, and Tiled-CSL
# streams its words at 2.46 TB/s (7168x7168, 50 %, N = 16). One figure for every kernel that streams W.
ACHIEVED_BYTES_PER_S = 2.50e12
# cuBLAS fp16 on the skinny products: a fixed 3.69 us plus its bytes at 2.724 TB/s, fitted (log least
# squares) to the 96 cuBLAS rows of probes/tiled_probe_granule_{unrolled,more}.txt (six OPT shapes,
# N 8-64): median error 3.9 %, at most 9.1 %. Bytes over ACHIEVED_BYTES_PER_S alone overestimated the
# large shapes by ~10 % (9216^2 to 28672 x 7168 move 2.73-2.86 TB/s), which let the tile kernels win
# N = 64 products they lose by 7-10 %.
DENSE_FIXED_S = 3.69e-6
DENSE_BYTES_PER_S = 2.724e12
# BENCHMARKS.md baseline table: cuBLAS fp16 8192 x 8192, n = 256 in 0.078 ms = 441 TFLOP/s, where its
# bytes alone would take 0.054 ms: wide products are bound by tensor-core math, not bytes.
DENSE_FLOPS = 450e12
# Floors, the shortest times measured on the H100 for fp16 on DLMC layers (512-2048 rows, 0.26-2.4 M
# elements, n = 32-1024; benchmarks/results/h100-80gb-hbm3/family_probe_float16.txt): cuBLAS never
# ran under 8.0 us, the tile kernels never under 8.4 us, the CSR kernels never under 8.9 us. Below
# them the per-byte and per-nonzero terms say nothing, and without the floors the model picked CSR
# kernels that ran 19-32 us where cuBLAS took 8-10 us.
DENSE_FLOOR_S = 8.0e-6
TILED_FLOOR_S = 8.4e-6
CSR_FLOOR_S = 8.9e-6
# spmm_sweep_f32.txt, csr_rowsplit on random/8192/0.9 at n = 32: 6.71 M nonzeros in 0.0789 ms. Narrow
# products are bound by per-nonzero work (index load, broadcast), the same in fp16.
CSR_NONZEROS_PER_S = 85e9
# spmm_sweep_f32.txt, sputnik_spmm on random/4096/0.8 and random/8192/0.9 at n >= 128: nnz x n
# elements of X gathered at 14.7-20.7 TB/s (L1/L2 hits), bytes per second taken alike for fp16.
CSR_GATHER_BYTES_PER_S = 16e12
CSR_INDEX16_MAX_COLS = 32767  # sputnik_spmm's 16-bit column indices in fp16
# An empty tile: its offsets and one loop trip (an estimate: the probe's uniform matrices have none).
EMPTY_TILE_CYCLES = 50.0
# A sparse pick that loses to dense costs more than a missed win (the llm suite asks for >= 0.95x cuBLAS
# at 50 % sparsity): a sparse kernel must be predicted this much faster than dense, so that a wrong pick
# still lands near 1x dense. 7 %: the rates' median error when it was set, on llm-calibration/ (6.4 % CSL, 4.1 % bitmap);
# read off the two 64-case runs of the current kernels, 7 % instead of the former 15 % raises the
# geomean 1-3 % at every sparsity and picks no sparse kernel measured below 1.0x cuBLAS.
SPARSE_MARGIN = 0.07


@dataclass(frozen=True)
class TileRates:
    """Per-SM cycles an analysed 128 x 64 tile costs a tile kernel when not bound by its bytes."""

    base: float  # per tile, whatever it holds: pipeline steps, zero-fill (CSL) or bitmap decode, loop
    per_column: float  # per column of the block (bn): the X tile's copy, ldmatrix and mma
    per_nonzero: float  # Tiled-CSL's scatter, bitmap's value reads
    fixed_s: float = 0.0  # per launch beyond LAUNCH_S: the pipeline filling, the last wave's tail
    wide: float = 1.0  # x the cycles of wide blocks (bn > 32): N = 64 off the line through N 8-32 (fitted)
    n16: float = 1.0  # x the cycles of 16-column blocks: N = 16 under the line through N = 8, 32 (fitted)


# Fitted by benchmarks/fit_skinny_rates.py (least squares on log time, Nelder-Mead) to H100 times of
# the tile kernels as cc17255 builds them (the ring's copies set up once per block): the 181 OPT
# cases' forced-family rows of that commit's llm run (probes/llm_cc17255_fit_rows.json,
# before this fit: Tiled-CSL and bitmap as each family chose, 12 shapes, 50-90 %, N 8-64) and the 108
# rows of probes/tiled_probe_issue_ab.txt (each encoding forced, 3 shapes, 70-90 %), with
# _tiled.OCCUPANCY_H and WIDE_TWO_STEP_SCALE kept. Median error Tiled-CSL 3.2 % (at most 16.0 %),
# bitmap 2.5 % (15.1 %), register pairs 3.4 % (19.4 %). (The rates before, fitted to 4df9c76's kernels
# on the probe sweeps: 2.4/1.9/2.5 % there.) Against that run, the refit moved 27 of 192 picks,
# mostly Tiled-CSL -> register pairs at 90 %, N = 8-32 (the old rates over-predicted pairs by ~7 %
# there); the 27 re-measured ran 1.04x faster in geomean. Known misses: at 80 %, N = 8 single
# elements are now taken on nine shapes where pairs were; 3 ran 2-17 % faster, 6 ran 2-8 % slower
# (the two encodings are within the model's error there; the split-K grids' partial last waves,
# which stream-K Tiled-CSL avoids, decide several of them).
# Keyed by `rates_key`: a family, and "tiled_bitmap_spmm.g2" for bitmap's register-pair encoding.
#
# n16 alone was fitted later (`fit_skinny_rates.py llm.json --only-n16`, every other rate kept) to the
# 192 OPT cases' forced-family rows of stop 36's llm run at a1b6a6d: the line through N = 8 and 32
# over-predicted 16-column blocks by 7-9 % in geomean (bitmap 1.075, register pairs 1.093, Tiled-CSL
# 1.067), the bitmap rows most at 90 % (1.135), where Tiled-CSL was picked on five shapes (stream-K on
# the four largest) that register pairs ran 4-15 % faster; re-measured with n16, those five ran
# 1.04-1.15x faster and no other pick moved. A full six-rate refit to the same rows halved the log
# error too but moved five picks at 70-80 % to slower kernels: not taken.
RATES = {
    "tiled_csl_spmm": TileRates(base=224.373, per_column=8.143, per_nonzero=0.223, fixed_s=3.036e-6, wide=0.806,
                                n16=0.928),
    "tiled_bitmap_spmm": TileRates(base=427.891, per_column=9.724, per_nonzero=0.047, fixed_s=4.419e-6, wide=0.930,
                                   n16=0.916),
    "tiled_bitmap_spmm.g2": TileRates(base=254.026, per_column=8.835, per_nonzero=0.089, fixed_s=4.546e-6,
                                      wide=0.936, n16=0.891),
}
TILE_FAMILIES = ("tiled_csl_spmm", "tiled_bitmap_spmm")
DENSE = "dense_gemm"
CSR = "csr"  # the CSR kernels together: the rules after the skinny ones choose among them
LABELS = {"tiled_csl_spmm": "Tiled-CSL", "tiled_bitmap_spmm": "bitmap", CSR: "CSR kernels"}


# ---- predictions ------------------------------------------------------------------------------

def tiled_family(family: str):
    """The module of a tile family of TILE_FAMILIES (imported here: those modules import this one)."""
    from . import tiled_bitmap_spmm, tiled_csl_spmm

    return {"tiled_csl_spmm": tiled_csl_spmm, "tiled_bitmap_spmm": tiled_bitmap_spmm}[family]


def rates_key(spec) -> str:
    """The RATES entry of a tile spec: its family, or bitmap's register-pair variant."""
    return spec.family + (".g2" if getattr(spec, "granule", 1) == 2 else "")


def tiled_seconds(stats, request: Request, family: str, rates: TileRates | None = None) -> float:
    """Predicted time of the spec `family` (tiled_csl_spmm or tiled_bitmap_spmm) would build, at
    `rates` (default: RATES[rates_key(spec)]; benchmarks/fit_skinny_rates.py tries others)."""
    spec, _ = tiled_family(family).choose(stats, request)
    return spec_seconds(stats, request, spec, rates)


def spec_seconds(stats, request: Request, spec, rates: TileRates | None = None) -> float:
    """Predicted time of a tile spec on this matrix (see the module docstring)."""
    sms = sm_count(request.arch)
    cycles = kernel_cycles(stats, spec.family, getattr(spec, "granule", 1), spec.bn, spec.n_tiles, sms, rates)
    grid = spec.grid if spec.reduction == "stream" else spec.m_tiles * spec.n_tiles * spec.split_k
    if spec.bn > T.NARROW_BN:  # wide blocks: the busiest SM's waves at its residency (T.wave_factor)
        waves = T.wave_factor(grid, sms, spec.min_blocks) * (T.TALL_64_WIDE if spec.tile_m == 64 else 1.0)
    else:  # narrow blocks: as fitted, except a grid short of one wave (T.partial_wave_factor)
        waves = T.partial_wave_factor(grid, sms, spec.min_blocks)
    rates = rates or RATES[rates_key(spec)]
    return max(TILED_FLOOR_S, LAUNCH_S + rates.fixed_s + cycles / (sms * T.CLOCK_HZ) * waves + T.spec_reduction_seconds(spec))


def kernel_cycles(stats, family: str, granule: int, bn: int, n_tiles: int, sms: int,
                  rates: TileRates | None = None) -> float:
    """Per-SM cycles of a tile family's main loop over all of W's tiles (the larger of bytes and
    issue per tile, summed over the tile-density histogram), every SM busy."""
    from . import tiled_bitmap_spmm, tiled_csl_spmm

    rates, tiles = rates or RATES[family + (".g2" if granule == 2 else "")], stats.tiles
    if family == tiled_csl_spmm.FAMILY:
        bytes_fn = tiled_csl_spmm.csl_bytes
    else:
        bytes_fn = tiled_bitmap_spmm.bitmap_bytes(tiles.tile_rows, granule)
    dens, counts, empty = T.tile_densities(stats)
    nnz = dens * (tiles.tile_rows * tiles.tile_cols)
    bytes_per_cycle = ACHIEVED_BYTES_PER_S / (sms * T.CLOCK_HZ)
    per_tile = np.maximum(bytes_fn(nnz) / bytes_per_cycle,
                          rates.base + rates.per_column * bn + rates.per_nonzero * nnz)
    return n_tiles * column_factor(rates, bn) * (float((per_tile * counts).sum()) + empty * EMPTY_TILE_CYCLES)


def column_factor(rates: TileRates, bn: int) -> float:
    """The fitted departure of a block width's cycles from the rates' straight line in bn."""
    if bn > T.NARROW_BN:
        return rates.wide
    return rates.n16 if bn == 16 else 1.0


def kernel_seconds(stats, request: Request, family: str, granule: int = 1) -> float:
    """`kernel_cycles` as wall time for the request's column blocks: what `T.choose_split` spreads
    over its grid."""
    sms, bn = sm_count(request.arch), T.request_bn(request)
    return kernel_cycles(stats, family, granule, bn, -(-request.n // bn), sms) / (sms * T.CLOCK_HZ)


def dense_seconds(m: int, k: int, n: int, epilogue: bool = False) -> float:
    """cuBLAS on the densified W: its fixed time plus bytes, or tensor-core math, at least
    DENSE_FLOOR_S, plus the epilogue pass over Y."""
    moved = 2.0 * (m * k + k * n + m * n)
    seconds = max(DENSE_FLOOR_S, DENSE_FIXED_S + moved / DENSE_BYTES_PER_S, 2.0 * m * k * n / DENSE_FLOPS)
    if epilogue:
        seconds += LAUNCH_S + (4.0 * m * n + 4.0 * m) / ACHIEVED_BYTES_PER_S  # read and write Y, read bias
    return seconds


def csr_seconds(stats, n: int) -> float:
    """The fp16 CSR kernels: nonzero rate, gathers of X, or bytes, whichever binds."""
    (m, k), nnz = stats.shape, stats.nnz
    index = 2 if k <= CSR_INDEX16_MAX_COLS else 4
    moved = nnz * (2.0 + index) + 4.0 * (m + 1) + 2.0 * (k * n + m * n)
    return max(CSR_FLOOR_S, LAUNCH_S + max(moved / ACHIEVED_BYTES_PER_S, nnz / CSR_NONZEROS_PER_S,
                                           2.0 * nnz * n / CSR_GATHER_BYTES_PER_S))


# ---- comparison and verdicts ------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    family: str  # a family name, or CSR for the CSR kernels together
    label: str
    seconds: float

    @property
    def text(self) -> str:
        return f"{self.label} {self.seconds * 1e3:.3g} ms"


@dataclass(frozen=True)
class Comparison:
    """Every candidate's predicted time, fastest first, and the matrix's density spread."""

    predictions: tuple
    spread: str

    def get(self, family: str) -> Prediction | None:
        return next((p for p in self.predictions if p.family == family), None)

    def winner(self) -> Prediction | None:
        """The fastest candidate, except that dense keeps near-ties (SPARSE_MARGIN)."""
        dense = self.get(DENSE)
        sparse = next((p for p in self.predictions if p.family != DENSE), None)
        if dense is not None and (sparse is None or sparse.seconds * (1 + SPARSE_MARGIN) >= dense.seconds):
            return dense
        return sparse

    def summary(self) -> str:
        return ", ".join(p.text for p in self.predictions)


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str


def spread_text(stats) -> str:
    """Density and the spread of tile densities (from the analyzer's 128 x 64 tile histogram)."""
    dens, counts, empty = T.tile_densities(stats)
    nonempty = counts > 0
    if not nonempty.any():
        return f"density {stats.density:.2f}, all {empty} tiles empty"
    return (f"density {stats.density:.2f} (tile densities {dens[nonempty].min():.2f}-{dens[nonempty].max():.2f}, "
            f"{empty} of {stats.tiles.tiles} tiles empty)")


def _unforced(request: Request) -> Request:
    return dataclasses.replace(request, options=tuple((k, v) for k, v in request.options if k != "family"))


def compare(stats, request: Request) -> Comparison:
    """Predict every candidate that can serve this fp16/bf16 spmm request (see the module docstring)."""
    from . import dense_gemm

    request = _unforced(request)
    predictions = [Prediction(f, LABELS[f], tiled_seconds(stats, request, f)) for f in TILE_FAMILIES
                   if tiled_family(f).gate(stats, request) is None]
    library = dense_gemm.find_library(request.dtype)
    if library is not None and dense_gemm.gate(stats, request) is None:
        m, k = stats.shape
        predictions.append(Prediction(DENSE, f"dense cuBLAS via {library}",
                                      dense_seconds(m, k, request.n, request.bias or request.relu)))
    if request.dtype == "float16" and request.option("out") in (None, "float16") and spmm_gate(stats, request) is None:
        predictions.append(Prediction(CSR, LABELS[CSR], csr_seconds(stats, request.n)))
    return Comparison(tuple(sorted(predictions, key=lambda p: p.seconds)), spread_text(stats))


def judge(stats, request: Request, family: str) -> Verdict:
    """Accept `family` only where it is the comparison's winner; the reason states the predictions."""
    comparison = compare(stats, request)
    win = comparison.winner()
    if win is None:
        return Verdict(False, "no candidate serves this request")
    table = comparison.summary()
    if win.family != family:
        return Verdict(False, f"{win.label} predicted faster: {table}")
    if family == DENSE:
        sparse = [p for p in comparison.predictions if p.family != DENSE]
        head = (f"no sparse kernel predicted {SPARSE_MARGIN:.0%} faster than dense: {table}" if sparse
                else f"dense is the only candidate: {table}")
    else:
        head = f"{win.label} predicted fastest: {table}"
    return Verdict(True, f"{head}; {comparison.spread}")
