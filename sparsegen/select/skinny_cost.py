"""The fp16/bf16 SpMM cost model: the predicted time of every candidate for one matrix and request,
on the request's device, with that device's rates (docs/decisions/001-rates-files.md).

The candidates, where their gates let them serve the request:

- the tile families: per analysed 128 x 64 tile an SM spends the larger of the tile's bytes over
  its share of the achieved bandwidth and `base + per_column x bn + per_nonzero x nnz` cycles
  (`TileRates`), summed over the tile-density histogram (so clustered and uniform matrices of one
  density differ), times the column tiles (each re-reads W); spread over the SMs the spec's split-K
  keeps busy (wide blocks: the busiest SM's waves at the spec's residency, `_tiled.wave_factor`);
  plus a launch and the split-K reduction (`_tiled.spec_reduction_seconds`). The spec is the one
  `build` makes: the family's `choose`, handed this model's time of its main loop.
- dense cuBLAS (`dense_gemm`): a fixed time plus W, X and Y moved once, or tensor-core math,
  whichever is slower (and never under cuBLAS's floor); plus the epilogue pass for bias/ReLU.
- the CSR kernels (float16 only: `ell_coo_spmm`, `panel_spmm`, `sputnik_spmm`, `csr_rowsplit`): bound
  by their nonzero rate, their gathers of X, or their bytes. Where they win, the skinny rules
  decline and the CSR rules choose among themselves as for float32.

`compare` predicts them all once per request; a sparse candidate wins over dense only when predicted
faster by more than its measured error (`Comparison.winner`, docs/decisions/002-dense-margin.md).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..families import _tiled as T
from ..families import dense_gemm
from ..families import tiled_bitmap_spmm as bitmap
from ..families import tiled_csl_spmm as csl
from ..families import tiled_lanes_spmm as lanes
from ..families.base import Request, spmm_gate
from .ratesfile import Errors, TileRates

TILE_FAMILIES = (csl.FAMILY, bitmap.FAMILY, lanes.FAMILY)
TILE_MODULES = {csl.FAMILY: csl, bitmap.FAMILY: bitmap, lanes.FAMILY: lanes}
DENSE = dense_gemm.FAMILY
CSR = "csr"  # the CSR kernels together: the rules after the skinny ones choose among them
LABELS = {csl.FAMILY: "Tiled-CSL", bitmap.FAMILY: "bitmap", lanes.FAMILY: "tiled lanes", CSR: "CSR kernels"}


def calibrated(family: str, rates) -> bool:
    """Whether the rates file holds `family`'s tile rates: a tile family the cost model can weigh
    (a family newer than the file is taken only when asked for)."""
    return rates.tiles.of(family) is not None


def main_loop_key(family: str, granule: int, rates) -> str:
    """The tile rates a family's main loop is predicted with: its own, or, for tiled lanes under a
    rates file without them, bitmap register pairs' (the encoding whose bytes per register it shares)."""
    if family == lanes.FAMILY and not calibrated(family, rates):
        return bitmap.FAMILY + ".g2"
    return family + (".g2" if family == bitmap.FAMILY and granule == 2 else "")
CSR_INDEX16_MAX_COLS = 32767  # sputnik_spmm's 16-bit column indices in fp16


# ---- the tile families ------------------------------------------------------------------------

def rates_key(spec) -> str:
    """The tile rates of a spec: its family's, or bitmap's register-pair encoding's (".g2")."""
    return spec.family + (".g2" if spec.family == bitmap.FAMILY and spec.granule == 2 else "")


def build(stats, request: Request, family: str) -> tuple:
    """(spec, why) a tile family builds for this request, its split-K weighed with this model's time
    of its main loop; bitmap, unless options granule= fixes the encoding, in both encodings, keeping
    the one predicted faster."""
    if family == bitmap.FAMILY and request.option("granule") is None:
        return _bitmap_encoding(stats, request)
    granule = int(request.option("granule", 1)) if family == bitmap.FAMILY else 1
    return TILE_MODULES[family].choose(stats, request, kernel_seconds(stats, request, family, granule))


def _bitmap_encoding(stats, request: Request) -> tuple:
    built = [build(stats, bitmap.with_granule(request, g), bitmap.FAMILY) for g in (1, 2)]
    t1, t2 = (spec_seconds(stats, request, spec) for spec, _ in built)
    pairs = t2 < t1
    spec, why = built[1] if pairs else built[0]
    won, lost = (t2, t1) if pairs else (t1, t2)
    names = ("register pairs", "single elements") if pairs else ("single elements", "register pairs")
    return spec, f"{names[0]} predicted faster ({won * 1e6:.1f} vs {lost * 1e6:.1f} us with {names[1]}); {why}"


def tiled_seconds(stats, request: Request, family: str, tile_rates: TileRates | None = None) -> float:
    """Predicted time of the spec `build` makes for `family` (at `tile_rates`, default the device's)."""
    spec, _ = build(stats, request, family)
    return spec_seconds(stats, request, spec, tile_rates)


def spec_seconds(stats, request: Request, spec, tile_rates: TileRates | None = None) -> float:
    """Predicted time of a tile spec on this matrix (see the module docstring)."""
    device = request.device
    rates, sms = device.rates, device.sm_count
    cycles = kernel_cycles(stats, spec.family, spec.granule, spec.bn, spec.n_tiles, device, tile_rates)
    grid = spec.grid if spec.reduction == "stream" else spec.m_tiles * spec.n_tiles * spec.split_k
    h = rates.tiles.occupancy_h
    if spec.bn > T.NARROW_BN:  # wide blocks: the busiest SM's waves at its residency (T.wave_factor)
        waves = T.wave_factor(grid, sms, spec.min_blocks, h) * (rates.tiles.tall_64_wide if spec.tile_m == 64 else 1.0)
    else:  # narrow blocks: as fitted, except a grid short of one wave (T.partial_wave_factor)
        waves = T.partial_wave_factor(grid, sms, spec.min_blocks, h)
    tile_rates = tile_rates or rates.tiles.of(main_loop_key(spec.family, spec.granule, rates))
    return max(rates.launch.tiled_floor_s, rates.launch.launch_s + tile_rates.fixed_s
               + cycles / (sms * rates.tiles.clock_hz) * waves + T.spec_reduction_seconds(spec, rates))


def kernel_cycles(stats, family: str, granule: int, bn: int, n_tiles: int, device,
                  tile_rates: TileRates | None = None) -> float:
    """Per-SM cycles of a tile family's main loop over all of W's tiles (the larger of bytes and
    issue per tile, summed over the tile-density histogram), every SM of `device` busy."""
    rates, tiles = device.rates, stats.tiles
    tile_rates = tile_rates or rates.tiles.of(main_loop_key(family, granule, rates))
    bytes_fn = {csl.FAMILY: lambda: csl.csl_bytes, bitmap.FAMILY: lambda: bitmap.bitmap_bytes(tiles.tile_rows, granule),
                lanes.FAMILY: lambda: lanes.lanes_bytes(tiles.tile_rows, tiles.tile_cols)}[family]()
    dens, counts, empty = T.tile_densities(stats)
    nnz = dens * (tiles.tile_rows * tiles.tile_cols)
    bytes_per_cycle = rates.memory.achieved_bytes_per_s / (device.sm_count * rates.tiles.clock_hz)
    per_tile = np.maximum(bytes_fn(nnz) / bytes_per_cycle,
                          tile_rates.base + tile_rates.per_column * bn + tile_rates.per_nonzero * nnz)
    return n_tiles * column_factor(tile_rates, bn) * (float((per_tile * counts).sum())
                                                      + empty * rates.tiles.empty_tile_cycles)


def column_factor(rates: TileRates, bn: int) -> float:
    """The fitted departure of a block width's cycles from the rates' straight line in bn."""
    if bn > T.NARROW_BN:
        return rates.wide
    return rates.n16 if bn == 16 else 1.0


def kernel_seconds(stats, request: Request, family: str, granule: int = 1) -> float:
    """`kernel_cycles` as wall time for the request's column blocks: what `T.choose_split` spreads
    over its grid."""
    device, bn = request.device, T.request_bn(request)
    cycles = kernel_cycles(stats, family, granule, bn, -(-request.n // bn), device)
    return cycles / (device.sm_count * device.rates.tiles.clock_hz)


# ---- dense cuBLAS and the CSR kernels ----------------------------------------------------------

def dense_seconds(m: int, k: int, n: int, rates, epilogue: bool = False) -> float:
    """cuBLAS on the densified W: its fixed time plus bytes plus its K loop, or tensor-core math, at
    least its floor, plus the epilogue pass over Y."""
    c = rates.cublas_fp16
    moved = 2.0 * (m * k + k * n + m * n)
    seconds = max(c.floor_s, c.fixed_s + moved / c.bytes_per_s + k * (c.k_s or 0.0), 2.0 * m * k * n / c.flops)
    if epilogue:  # read and write Y, read bias
        seconds += rates.launch.launch_s + (4.0 * m * n + 4.0 * m) / rates.memory.achieved_bytes_per_s
    return seconds


def csr_seconds(stats, n: int, rates) -> float:
    """The fp16 CSR kernels: nonzero rate, gathers of X, or bytes, whichever binds."""
    (m, k), nnz = stats.shape, stats.nnz
    index = 2 if k <= CSR_INDEX16_MAX_COLS else 4
    moved = nnz * (2.0 + index) + 4.0 * (m + 1) + 2.0 * (k * n + m * n)
    c = rates.csr_fp16
    return max(rates.launch.csr_floor_s, rates.launch.launch_s + max(moved / rates.memory.achieved_bytes_per_s,
                                                                     nnz / c.nonzeros_per_s,
                                                                     2.0 * nnz * n / c.gather_bytes_per_s))


# ---- the comparison ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    family: str  # a family name, or CSR for the CSR kernels together
    label: str
    seconds: float
    key: str = ""  # the rates' key of its error (`Errors`): rates_key(spec), DENSE or CSR
    spec: object = None  # a tile family's spec, as `build` made it
    why: str = ""  # ... and what `build` said of it

    @property
    def text(self) -> str:
        return f"{self.label} {self.seconds * 1e3:.3g} ms"


@dataclass(frozen=True)
class Comparison:
    """Every candidate's predicted time, fastest first, the matrix's density spread, and the errors
    and name of the rates they were predicted with."""

    predictions: tuple
    spread: str
    errors: Errors
    rates: str  # the rates file's label

    def get(self, family: str) -> Prediction | None:
        return next((p for p in self.predictions if p.family == family), None)

    def best_sparse(self) -> Prediction | None:
        return next((p for p in self.predictions if p.family != DENSE), None)

    def margin(self, p: Prediction) -> float:
        """How much faster than dense `p` must be predicted: its measured error."""
        return self.errors.of(p.key)

    def winner(self) -> Prediction | None:
        """The fastest candidate, except that dense keeps picks whose predicted margin over it is
        inside the sparse candidate's measured error."""
        dense, sparse = self.get(DENSE), self.best_sparse()
        if dense is not None and (sparse is None or sparse.seconds * (1 + self.margin(sparse)) >= dense.seconds):
            return dense
        return sparse

    def contenders(self) -> tuple:
        """The tile and dense predictions the model cannot tell from the fastest one: each within the
        sum of its own and the fastest's measured errors (dense carries none of its own: a sparse
        key's error is the error of its ratio to dense). Empty when the fastest stands alone. On the
        GPU these are timed and the fastest measured is kept (docs/decisions/004-measured-contenders.md)."""
        pool = [p for p in self.predictions if p.family != CSR]
        if len(pool) < 2:
            return ()

        def error(p: Prediction) -> float:
            return 0.0 if p.family == DENSE else self.errors.of(p.key)

        best = pool[0]
        close = tuple(p for p in pool if p.seconds <= best.seconds * (1.0 + error(p) + error(best)))
        return close if len(close) > 1 else ()

    def summary(self) -> str:
        return ", ".join(p.text for p in self.predictions)

    def margin_text(self) -> str:
        """The sparse candidate's predicted speed-up over dense against its error, and the rates."""
        dense, sparse = self.get(DENSE), self.best_sparse()
        if dense is None or sparse is None:
            return f"rates {self.rates}"
        past = "past" if self.winner() is sparse else "inside"
        return (f"{sparse.label} predicted {dense.seconds / sparse.seconds:.2f}x dense, {past} its "
                f"{self.margin(sparse):.0%} error (rates {self.rates})")


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
    request = _unforced(request)
    rates = request.device.rates
    predictions = []
    for family in (f for f in TILE_FAMILIES if calibrated(f, rates)):
        if TILE_MODULES[family].gate(stats, request) is None:
            spec, why = build(stats, request, family)
            predictions.append(Prediction(family, LABELS[family], spec_seconds(stats, request, spec),
                                          rates_key(spec), spec, why))
    library = dense_gemm.find_library(request.dtype)
    if library is not None and dense_gemm.gate(stats, request) is None:
        m, k = stats.shape
        predictions.append(Prediction(DENSE, f"dense cuBLAS via {library}",
                                      dense_seconds(m, k, request.n, rates, request.bias or request.relu), DENSE))
    if request.dtype == "float16" and request.option("out") in (None, "float16") and spmm_gate(stats, request) is None:
        predictions.append(Prediction(CSR, LABELS[CSR], csr_seconds(stats, request.n, rates), CSR))
    return Comparison(tuple(sorted(predictions, key=lambda p: p.seconds)), spread_text(stats), rates.errors,
                      rates.label)
