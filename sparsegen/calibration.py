"""`sparsegen calibrate`: measure this GPU, fit its cost models, write its rates file into the cache.

    python -m sparsegen calibrate [--quick] [--out PATH]
    sparsegen.calibrate(quick=False) -> Path of the rates file

What it measures (one progress line per stage): the device's copy bandwidth; a launch of the
smallest generated kernel; cuBLAS fp16 on skinny products (and wide ones) through the dense
fallback's library; Tiled-CSL, bitmap and bitmap register pairs on synthetic weights across
densities and N; in the full run also the time floors, the fp32 lines (SGEMM, 3xTF32 and 3xFP16
tensor cores, the CSR kernels) and the fp16 CSR kernels' rates. Every kernel is built by the public
`sparsegen.compile` (options forcing the family) and timed as the benchmarks time
(`bench/timing.py`). Then it fits (`select/fit.py`) and writes the rates file where
`DeviceModel.current()` finds it (`select/device.calibrated_path`: the cache, keyed by device name,
CUDA driver and sparsegen version).

Budget: 2 minutes, `--quick` 20 s (fewer shapes, and the tile rates fitted as one factor on the
cycles of the nearest shipped file). What the budget leaves unmeasured keeps the nearest shipped
file's rates scaled to this GPU (docs/decisions/003-unknown-device.md), and the file's provenance
says so. Needs PyTorch with CUDA (buffers and timing) and nvcc.

The GPU side is `GpuProbe` (and `measure`, the loop over it); planning and fitting are plain
functions of what was measured, so the CPU tests run them with a probe that answers from known rates.
"""
from __future__ import annotations

import dataclasses
import datetime
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._version import __version__
from .errors import SparsegenError
from .select import device as device_model
from .select import fit, ratesfile, skinny_cost
from .select.ratesfile import CsrFp16, CublasFp16, Line, Memory, Rates

BITMAP, CSL, LANES, DENSE = "tiled_bitmap_spmm", "tiled_csl_spmm", "tiled_lanes_spmm", "dense_gemm"
TILE_KEYS = (CSL, BITMAP, BITMAP + ".g2", LANES)
MIN_PAIRS = 6  # cases with both a tile kernel and cuBLAS measured, below which a key keeps its error


@dataclass(frozen=True)
class Settings:
    budget_s: float
    copy_bytes: int
    tiles: tuple  # ((m, k), densities, ns), ...
    dense: tuple  # (m, k) of more cuBLAS skinny products, at N = 16 and 64 (a second size of W)
    wide: tuple  # (m, k, n) cuBLAS products bound by tensor-core math
    extras: bool  # floors, fp32 lines, fp16 CSR rates
    free: object  # the tile rates fitted: fit.TILE_FIELDS, or "scale"
    min_runs: int
    min_ms: float
    # Measuring stops this long before budget_s: the case under way, the fit and Python's start-up run
    # past the deadline (on the H200, deadlines at 20 s and 120 s gave 23.9 s and 125.1 s of wall time).
    reserve_s: float = 0.0


QUICK = Settings(20.0, 256 << 20, (((7168, 7168), (0.3, 0.1), (16, 64)),), ((4096, 4096),), (), False, "scale",
                 5, 10.0, reserve_s=6.0)
# The long-K shape (K = 4M) separates cuBLAS's K loop from its bytes and shows the tile kernels'
# deep split-K (docs/decisions/013-long-k.md).
FULL = Settings(120.0, 1 << 30, (((7168, 7168), (0.5, 0.3, 0.1), (8, 16, 32, 64)),
                                 ((21504, 7168), (0.3, 0.1), (16, 64)),
                                 ((7168, 28672), (0.5, 0.2), (8, 16, 64))),
                ((4096, 4096),), ((8192, 8192, 256),), True, fit.TILE_FIELDS, 10, 25.0, reserve_s=12.0)


@dataclass(frozen=True)
class Case:
    """One product to build and time: a synthetic m x k weight of `density`, N columns, dtype, and
    the compile options that force the family (and variant)."""

    stage: str  # "launch", "cublas", "tiles", "atomic", "floor", "fp32", "csr"
    m: int
    k: int
    density: float
    n: int
    dtype: str = "float16"
    options: tuple = ()

    @property
    def family(self) -> str:
        return dict(self.options)["family"]

    @property
    def key(self) -> str:
        """The tile rates' key (bitmap's register pairs: ".g2"), else the family."""
        return self.family + (".g2" if dict(self.options).get("granule") == 2 else "")

    @property
    def text(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.options if k != "family")
        return f"{self.key if self.stage == 'tiles' else self.family}{f'[{extra}]' if extra and self.stage != 'tiles' else ''} " \
               f"{self.m}x{self.k} d={self.density:g} N={self.n} {self.dtype}"


@dataclass(frozen=True)
class Timed:
    case: Case
    stats: object  # the weight's MatrixStats
    request: object  # the Request it was compiled for
    spec: object  # the spec that ran
    seconds: float  # median of the timed launches


# ---- the plan -------------------------------------------------------------------------------------

def forced(family: str, **options) -> tuple:
    return tuple(sorted({"family": family, **options}.items()))


def tile_cases(settings: Settings) -> list:
    variants = (forced(CSL), forced(BITMAP, granule=1), forced(BITMAP, granule=2), forced(LANES))
    return [Case("tiles", m, k, d, n, "float16", opts)
            for (m, k), densities, ns in settings.tiles for d in densities for n in ns for opts in variants]


def cublas_cases(settings: Settings) -> list:
    """cuBLAS fp16 at every tile shape and N (the dense side of each sparse / dense ratio), at a second
    size of W (so that its fixed time and its bytes part), and the wide products; on the weights of
    the lowest density (cuBLAS reads every element alike)."""
    out = [Case("cublas", m, k, densities[-1], n, "float16", forced(DENSE))
           for (m, k), densities, ns in settings.tiles for n in ns]
    out += [Case("cublas", m, k, 0.1, n, "float16", forced(DENSE)) for m, k in settings.dense for n in (16, 64)]
    return out + [Case("cublas", m, k, 0.1, n, "float16", forced(DENSE)) for m, k, n in settings.wide]


# The split-K reduction's atomics: one nearly empty W (its main loop a few cycles a tile) split
# 4, 14 and 28 ways, so that the partial sums' bytes are what the times differ by.
ATOMIC_SPLITS = (4, 14, 28)
ATOMIC_WEIGHT = (28672, 7168, 1e-4, 32)  # m, k, density, N
MIN_ATOMIC_SHARE = 0.05  # of the longest time, what the fitted partial sums must take to be a rate


def atomic_cases() -> list:
    m, k, density, n = ATOMIC_WEIGHT
    return [Case("atomic", m, k, density, n, "float16", forced(LANES, split_k=s, reduction="atomic", tile_m=128))
            for s in ATOMIC_SPLITS]


def extra_cases() -> list:
    floors = [Case("floor", 1024, 1024, 0.1, 8, "float16", forced(CSL)),
              Case("floor", 1024, 1024, 0.05, 8, "float16", forced("csr_rowsplit")),
              Case("floor", 512, 512, 0.1, 8, "float16", forced(DENSE))]
    # SGEMM and 3xTF32 at every size; 3xFP16 where dense_tile_spmm takes it (>= 1 GFLOP at n >= 256)
    fp32 = [Case("fp32", m, k, 0.3, n, "float32", opts) for m, k, n in ((2048, 2048, 128), (4096, 4096, 128),
                                                                       (4096, 4096, 512))
            for opts in (forced(DENSE), forced("dense_tile_spmm", mma="tf32x3"))]
    fp32 += [Case("fp32", m, k, 0.3, n, "float32", forced("dense_tile_spmm", mma="f16x3"))
             for m, k, n in ((2048, 2048, 512), (4096, 4096, 256), (4096, 4096, 512))]
    fp32 += [Case("fp32", 4096, 4096, d, n, "float32", forced("csr_rowsplit")) for d in (0.02, 0.05) for n in (32, 128)]
    csr = [Case("csr", 8192, 8192, 0.1, 32, "float16", forced("csr_rowsplit")),
           Case("csr", 4096, 4096, 0.2, 128, "float16", forced("sputnik_spmm"))]
    return atomic_cases() + floors + fp32 + csr


def plan(settings: Settings) -> list:
    """Every case, most needed first (a run out of budget drops the tail)."""
    launch = [Case("launch", 64, 64, 1 / 64, 1, "float32", forced("csr_rowsplit"))]
    tiles = tile_cases(settings)
    first = [c for c in tiles if (c.m, c.k) == settings.tiles[0][0]]
    rest = [c for c in tiles if (c.m, c.k) != settings.tiles[0][0]]
    extras = extra_cases() if settings.extras else []
    return launch + cublas_cases(settings) + first + extras + rest


# ---- measuring (the GPU) ----------------------------------------------------------------------------

def measure(probe, cases, device, settings: Settings, emit=print, deadline: float | None = None) -> list:
    """Build and time every case with `probe` on `device` (the model it is compiled for), in order,
    until `deadline` (time.monotonic()); one progress line per stage. The probe has been asked to
    prepare `cases`; it is closed here."""
    out, failed, stage, started = [], [], None, time.monotonic()
    try:
        for i, case in enumerate(cases):
            if deadline is not None and time.monotonic() >= deadline:
                emit(f"  budget spent: the last {len(cases) - i} of {len(cases)} cases not measured")
                break
            if case.stage != stage:
                stage = case.stage
                run = next((j for j in range(i, len(cases)) if cases[j].stage != stage), len(cases)) - i
                emit(f"{stage:<8} {run} cases ({time.monotonic() - started:.1f} s)")
            try:
                out.append(probe.run(case, device, settings))
            except Exception as exc:  # one case that cannot be built or run does not stop the others
                failed.append(case)
                emit(f"  {case.text}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
    finally:
        probe.close()
    if not out and failed:
        raise SparsegenError(f"calibrate: none of the {len(failed)} cases ran (the first: {failed[0].text})")
    return out


class GpuProbe:
    """Builds the cases through `sparsegen.compile` and times them with CUDA events (PyTorch
    operands, as the benchmarks do). Compiling runs ahead in `workers` processes, one job per
    weight and variant (all its N), in plan order: each encodes the weight (backend "emulate", this
    GPU's arch and model) and runs nvcc into the cache, so the timed `compile(backend="gpu")` finds
    plans, encodings and cubins warm. Encoding is CPU work of seconds per weight and variant, so a
    single planning thread leaves the measuring one waiting and the budget drops the tail
    (docs/decisions/010-h200-lanes-rates.md)."""

    def __init__(self, workers: int | None = None):
        import os

        from . import nvcc, runtime

        try:
            import torch
        except ImportError as exc:
            raise SparsegenError(f"sparsegen calibrate needs PyTorch with CUDA (import torch failed: {exc})") from exc
        if not torch.cuda.is_available():
            raise SparsegenError("sparsegen calibrate needs PyTorch with CUDA and a visible GPU: "
                                 "torch.cuda.is_available() is False")
        if nvcc.nvcc_path() is None:
            raise SparsegenError("sparsegen calibrate needs nvcc (on PATH, or SPARSEGEN_NVCC)")
        self.torch = torch
        self.dev = torch.device("cuda", runtime.device_ordinal())  # SPARSEGEN_DEVICE, as the runtime
        torch.cuda.set_device(self.dev)  # the timing's events on the kernels' device
        torch.zeros(1, device=self.dev)  # the primary context first, which sparsegen's runtime shares
        self.runtime = runtime
        self.arch = runtime.current_arch()
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.weights: dict = {}
        self.ready: dict = {}  # case -> the future of the job that compiles it
        self.pool = None
        self.marks = None  # where the jobs mark each case done (a temporary folder)

    def properties(self) -> dict:
        return self.runtime.device_properties()

    def copy_seconds(self, nbytes: int, settings: Settings) -> float:
        """One device-to-device copy of `nbytes` (read + write: 2 x nbytes move)."""
        src = self.torch.ones(nbytes // 2, dtype=self.torch.float16, device=self.dev)
        dst = self.torch.empty_like(src)
        seconds = self.time(lambda: dst.copy_(src), settings)
        del src, dst
        self.torch.cuda.empty_cache()
        return seconds

    def time(self, fn, settings: Settings) -> float:
        from .bench.timing import time_cuda

        # cold L2, as the llm suite times: the rates describe a W read once, from DRAM
        return time_cuda(fn, min_runs=settings.min_runs, min_ms=settings.min_ms, warmup_ms=5.0,
                         flush_l2=True)["median_ms"] * 1e-3

    def weight(self, case: Case):
        key = (case.m, case.k, case.density, case.dtype)
        if key not in self.weights:
            self.weights[key] = case_weight(case)
        return self.weights[key]

    def compile(self, case: Case, device, backend: str):
        return compile_case(self.weight(case), case, self.arch, device, backend)

    def prepare(self, cases, device):
        """Submit the compile-ahead jobs: the cases grouped by weight and variant, in plan order. The
        dense cases have nothing to encode or build; they compile where they are measured."""
        import multiprocessing
        import tempfile
        from concurrent.futures import ProcessPoolExecutor

        from .cache import default_dir

        groups: dict = {}
        for case in (c for c in cases if c.family != DENSE):
            groups.setdefault((case.m, case.k, case.density, case.dtype, case.options), []).append(case)
        self.pool = ProcessPoolExecutor(max(1, min(self.workers, len(groups))),
                                        mp_context=multiprocessing.get_context("spawn"))
        self.marks = tempfile.mkdtemp(prefix="sparsegen-calibrate-")
        for group in groups.values():
            future = self.pool.submit(compile_ahead, tuple(group), self.arch, device, str(default_dir()), self.marks)
            self.ready.update((case, future) for case in group)

    def run(self, case: Case, device, settings: Settings) -> Timed:
        from .bench.prefetch import marked

        pending = self.ready.get(case)
        # until the job marks this case (or ends: done, or its worker dead, when the compile below
        # does the work and meets any error itself)
        while pending is not None and not pending.done() and marked(self.marks, case) is None:
            time.sleep(0.01)
        kernel = self.compile(case, device, "gpu")
        tdt = getattr(self.torch, case.dtype)
        x = self.torch.randn(case.k, case.n, device=self.dev).to(tdt)
        y = self.torch.empty(case.m, case.n, dtype=tdt, device=self.dev)
        seconds = self.time(lambda: kernel(x, out=y), settings)
        return Timed(case, kernel.stats, kernel.request, kernel.spec, seconds)

    def close(self):
        import shutil

        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.marks is not None:
            shutil.rmtree(self.marks, ignore_errors=True)
        self.weights.clear()


def case_weight(case: Case):
    """The case's synthetic weight, seeded by its shape (every process makes the same one)."""
    from .bench.weights import as_dtype, random_weight

    w = random_weight(case.m, case.k, 1.0 - case.density, seed=case.m + 7 * case.k)
    return w if case.dtype == "float32" else as_dtype(w, case.dtype)


def compile_case(w, case: Case, arch: str, device, backend: str):
    """`sparsegen.compile` of the case's weight `w` as the case asks, for `arch` and `device`."""
    import sparsegen

    return sparsegen.compile(w, n=case.n, dtype=case.dtype, options=dict(case.options), arch=arch,
                             backend=backend, device=device)


def compile_ahead(cases: tuple, arch: str, device, cache: str, marks: str | None = None) -> None:
    """Worker side of GpuProbe: compile `cases` (one weight, one variant, every N) with backend
    "emulate" for `arch` and `device`, cubins too, into the cache folder `cache`, marking each case
    in `marks` as it is done, so that it is measured while the next compiles. A case that fails is
    left to the measuring process, which meets the error again and reports it."""
    from .bench.prefetch import cache_dir, mark_done

    w = case_weight(cases[0])
    with cache_dir(cache):
        for case in cases:
            try:
                compile_case(w, case, arch, device, "emulate").cubin  # noqa: B018 - nvcc, into the cubin cache
            except Exception:  # noqa: BLE001, S110 - reported by the measuring process
                pass
            if marks is not None:
                mark_done(marks, case, {})


# ---- fitting (the CPU) ------------------------------------------------------------------------------

def moved_bytes(m: int, k: int, n: int) -> float:
    """What cuBLAS fp16 moves for a skinny product: W, X and Y once (`skinny_cost.dense_seconds`)."""
    return 2.0 * (m * k + k * n + m * n)


def fit_rates(timed: list, copy_s: float, copy_bytes: int, base: Rates, props: dict, settings: Settings) -> Rates:
    """The rates file's values from what was measured; what was not keeps `base` (already scaled to
    this GPU). `provenance` says, per group, which. The tile rates are fitted with the groups
    measured before them, the errors with everything."""
    by = {}
    for t in timed:
        by.setdefault(t.case.stage, []).append(t)
    notes, v = {}, base.values
    values = dataclasses.replace(v, memory=_fit_memory(by, copy_s, copy_bytes, v, notes), launch=_fit_launch(by, v, notes),
                                 cublas_fp16=_fit_cublas(by, v, notes), csr_fp16=_fit_csr(by, v, notes),
                                 fp32=_fit_fp32(by, v, notes))
    values = dataclasses.replace(values, tiles=_fit_tiles(by, _draft(base, values), props, settings.free, notes))
    if by.get("atomic"):  # the atomics read off the main loop just fitted; the tiles again with them
        values = dataclasses.replace(values, memory=_fit_atomic(by, _draft(base, values), props, notes))
        values = dataclasses.replace(values, tiles=_fit_tiles(by, _draft(base, values), props, settings.free, notes))
    values = dataclasses.replace(values, errors=_fit_errors(by, _draft(base, values), props, notes))
    return Rates(values, _device_section(props), _measured(props, settings), _provenance(notes, base, timed),
                 "calibrated")


def _draft(base: Rates, values) -> Rates:
    return Rates(values, base.device, base.measured, base.provenance, "calibrating")


def _with_device(t: Timed, rates: Rates, props: dict):
    """The row's request, predicting on this GPU with `rates`."""
    device = device_model.DeviceModel.from_properties(props, rates)
    return dataclasses.replace(t.request, device=device)


def _fit_memory(by, copy_s, copy_bytes, v, notes) -> Memory:
    copy = 2.0 * copy_bytes / copy_s
    skinny = [t for t in by.get("cublas", []) if t.case.n <= 64]
    achieved = (float(np.median([moved_bytes(t.case.m, t.case.k, t.case.n) / t.seconds for t in skinny]))
                if skinny else v.memory.achieved_bytes_per_s)
    notes["memory"] = (f"copy of {copy_bytes >> 20} MiB: {copy / 1e12:.3f} TB/s; achieved: "
                       + (f"median of cuBLAS fp16 over {len(skinny)} products with N <= 64: {achieved / 1e12:.3f} TB/s"
                          if skinny else "kept") + "; atomic_bytes_per_s kept")
    return Memory(copy, achieved, v.memory.atomic_bytes_per_s)


def _fit_launch(by, v, notes):
    launch = by.get("launch", [])
    floors = {t.case.family: t.seconds for t in by.get("floor", [])}
    launch_s = launch[0].seconds if launch else v.launch.launch_s
    notes["launch"] = (f"launch_s: {launch[0].case.text} ran {launch_s * 1e6:.2f} us" if launch else "launch_s kept") + \
        (f"; floors: {', '.join(f'{f} {s * 1e6:.1f} us' for f, s in floors.items())}" if floors else "; floors kept") + \
        "; cluster_s kept"
    return dataclasses.replace(v.launch, launch_s=launch_s, tiled_floor_s=floors.get(CSL, v.launch.tiled_floor_s),
                               csr_floor_s=floors.get("csr_rowsplit", v.launch.csr_floor_s))


def _fit_cublas(by, v, notes) -> CublasFp16:
    rows = by.get("cublas", [])
    skinny = [t for t in rows if t.case.n <= 64]
    wide = [t for t in rows if t.case.n > 64]
    c = v.cublas_fp16
    fixed, rate, k_s, err = c.fixed_s, c.bytes_per_s, c.k_s, None
    moved = [moved_bytes(t.case.m, t.case.k, t.case.n) for t in skinny]
    ks = [t.case.k for t in skinny]
    seconds = [t.seconds for t in skinny]
    long_k = len(skinny) >= 4 and max(ks) >= 2 * min(ks)  # K varies at like bytes: its own term
    if long_k:
        (fixed, inverse_rate, k_s), err = fit.fit_terms([1.0, moved, ks], seconds, positive=(1,))
        rate = 1.0 / inverse_rate
    elif len(skinny) >= 3:
        fixed, rate, err = fit.fit_line(moved, [s - k * (k_s or 0.0) for s, k in zip(seconds, ks)])
    flops = max((2.0 * t.case.m * t.case.k * t.case.n / t.seconds for t in wide), default=c.flops)
    floor = next((t.seconds for t in by.get("floor", []) if t.case.family == DENSE), c.floor_s)
    terms = "fixed + bytes + K loop" if long_k else "fixed + bytes"
    notes["cublas_fp16"] = (f"{terms} fitted to {len(skinny)} products (K {min(ks)}-{max(ks)}), median error "
                            f"{err:.1%}" if err is not None else "fixed_s, bytes_per_s kept") + \
        ("" if long_k else "; k_s kept") + \
        (f"; flops from {len(wide)} wide products" if wide else "; flops kept") + \
        ("; floor_s measured" if floor != c.floor_s else "; floor_s kept")
    return CublasFp16(fixed, rate, flops, floor, k_s)


def _fit_csr(by, v, notes) -> CsrFp16:
    rows = {t.case.family: t for t in by.get("csr", [])}
    c = v.csr_fp16
    nz = rows.get("csr_rowsplit")
    gather = rows.get("sputnik_spmm")
    nonzeros = nz.stats.nnz / nz.seconds if nz else c.nonzeros_per_s
    gathers = 2.0 * gather.stats.nnz * gather.case.n / gather.seconds if gather else c.gather_bytes_per_s
    notes["csr_fp16"] = ", ".join(f"{name}: {t.case.text} in {t.seconds * 1e6:.1f} us"
                                  for name, t in rows.items()) or "not measured in this run"
    return CsrFp16(nonzeros, gathers)


def _fit_fp32(by, v, notes):
    rows = by.get("fp32", [])
    f = v.fp32
    lines, said = {}, []
    groups = {"sgemm": [t for t in rows if t.case.family == DENSE],
              "tf32x3": [t for t in rows if dict(t.case.options).get("mma") == "tf32x3"],
              "f16x3": [t for t in rows if dict(t.case.options).get("mma") == "f16x3"],
              "csr": [t for t in rows if t.case.family == "csr_rowsplit"]}
    for name, group in groups.items():
        if len(group) < 3:
            lines[name] = getattr(f, name)
            continue
        work = [2.0 * (t.stats.nnz if name == "csr" else t.case.m * t.case.k) * t.case.n for t in group]
        fixed, rate, err = fit.fit_line(work, [t.seconds for t in group])
        lines[name] = Line(fixed, rate)
        said.append(f"{name} fitted to {len(group)} products (median error {err:.1%})")
    notes["fp32"] = "; ".join(said + ["margins and epilogue kept"]) if said else "not measured in this run"
    return dataclasses.replace(f, **lines)


def _fit_tiles(by, rates: Rates, props: dict, free, notes):
    tiles, said = rates.tiles, []
    for key in TILE_KEYS:
        mine = [fit.Row(t.stats, _with_device(t, rates, props), t.spec, t.seconds)
                for t in by.get("tiles", []) if t.case.key == key]
        if not mine:
            continue
        how = free if free == "scale" or len(mine) >= 2 * len(free) else "scale"
        # a family the base rates lack starts from bitmap register pairs' (its bytes per register)
        start = tiles.of(key) or tiles.of(BITMAP + ".g2")
        result = fit.fit_tile_rates(mine, start, how)
        tiles = dataclasses.replace(tiles, **{key.replace(".", "_"): result.rates})
        said.append(f"{key}: {'one factor on the cycles' if how == 'scale' else 'every rate'} fitted, {result.text}")
    notes["tiles"] = "; ".join(said) or "not measured in this run"
    return tiles


def _fit_atomic(by, rates: Rates, props: dict, notes) -> Memory:
    """memory.atomic_bytes_per_s from the atomic stage: each time less what the model gives its
    main loop and the output's clearing, a line in the partial sums' bytes (4 x split x M x N)."""
    from .families import _tiled

    memory = rates.memory
    if rates.tiles.of(LANES) is None:  # no main-loop rates to read the atomics off
        notes["memory"] += " (no tiled lanes rates for the atomic stage)"
        return memory
    partial, rest = [], []
    for t in by["atomic"]:
        request = _with_device(t, rates, props)
        main = skinny_cost.spec_seconds(t.stats, request, t.spec) - _tiled.spec_reduction_seconds(t.spec, rates)
        partial.append(4.0 * t.spec.split_k * t.case.m * t.case.n)
        rest.append(t.seconds - main - 8.0 * t.case.m * t.case.n / memory.copy_bytes_per_s)
    splits = sorted({t.spec.split_k for t in by["atomic"]})
    slope, intercept = np.polyfit(partial, rest, 1) if len(splits) >= 2 else (0.0, 0.0)
    base_note = notes["memory"].replace("; atomic_bytes_per_s kept", "")
    longest = max(t.seconds for t in by["atomic"])
    if slope * max(partial) < MIN_ATOMIC_SHARE * longest:  # the partial sums' time, if any, is lost in noise
        notes["memory"] = base_note + f"; atomic_bytes_per_s kept (split-K {splits}: no time grew with the partial sums)"
        return memory
    rate = 1.0 / slope
    fitted = np.array(partial) * slope + intercept
    err = float(np.max(np.abs(fitted - np.array(rest)) / np.array([t.seconds for t in by["atomic"]])))
    notes["memory"] = base_note + (f"; atomic: split-K {'/'.join(map(str, splits))} of {by['atomic'][0].case.text}: "
                                   f"{rate / 1e12:.2f} TB/s of partial sums, {intercept * 1e6:+.1f} us beside the "
                                   f"model, at most {err:.1%} of a time off the line")
    return dataclasses.replace(memory, atomic_bytes_per_s=float(rate))


def _fit_errors(by, rates: Rates, props: dict, notes):
    """Each tile key's sparse / dense ratio error over the cases with cuBLAS measured alike."""
    dense = {(t.case.m, t.case.k, t.case.n): t.seconds for t in by.get("cublas", [])}
    errors, said = rates.errors, []
    for key in TILE_KEYS:
        pairs = []
        for t in by.get("tiles", []):
            if t.case.key != key or (t.case.m, t.case.k, t.case.n) not in dense:
                continue
            request = _with_device(t, rates, props)
            predicted = skinny_cost.spec_seconds(t.stats, request, t.spec)
            predicted_dense = skinny_cost.dense_seconds(t.case.m, t.case.k, t.case.n, rates)
            pairs.append((predicted, predicted_dense, t.seconds, dense[(t.case.m, t.case.k, t.case.n)]))
        if len(pairs) >= MIN_PAIRS:
            errors = dataclasses.replace(errors, **{key.replace(".", "_"): fit.ratio_error(pairs)})
            said.append(f"{key}: {fit.ERROR_QUANTILE:.0%} quantile of the sparse / dense ratio's error over "
                        f"{len(pairs)} cases, {errors.of(key):.1%}")
        else:
            said.append(f"{key}: kept ({len(pairs)} cases with cuBLAS alike, fewer than {MIN_PAIRS})")
    notes["errors"] = "; ".join(said) + "; csr kept"
    return errors


def _device_section(props: dict) -> dict:
    return {k: (list(props[k]) if k == "compute_capability" else props[k]) for k in ratesfile.DEVICE_KEYS}


def _revision() -> str | None:
    """The checkout's HEAD as the benchmarks record it (SPARSEGEN_REVISION where .git did not travel)."""
    from .bench import git_revision

    sha = git_revision()
    return sha[:7] if sha else None


def _measured(props: dict, settings: Settings) -> dict:
    return {"date": datetime.date.today().isoformat(), "revision": _revision(), "sparsegen": __version__,
            "driver": props.get("driver"),
            "how": f"sparsegen calibrate{' --quick' if settings is QUICK else ''} on this device"}


def _provenance(notes: dict, base: Rates, timed: list) -> dict:
    inputs = f"{len(timed)} products timed by sparsegen calibrate (CUDA events, medians)"
    out = {}
    for group in (f.name for f in dataclasses.fields(ratesfile.Values)):
        note = notes.get(group, "not measured in this run")
        out[group] = {"source": f"sparsegen calibrate; what it did not measure is kept from {base.label}",
                      "inputs": inputs, "error": note}
    return out


# ---- the command --------------------------------------------------------------------------------------

def calibrate(quick: bool = False, out=None, emit=print, probe=None) -> Path:
    """Measure the GPU in use, fit its rates and write them (default: where `DeviceModel.current()`
    reads them); returns the file. `probe` replaces the GPU (tests)."""
    settings = QUICK if quick else FULL
    start = time.monotonic()
    probe = probe or GpuProbe()
    props = device_model.properties_from(probe.properties())
    base = starting_rates(props)
    device = device_model.DeviceModel.from_properties(props, base)
    emit(f"device   {props['name']} (sm_{props['compute_capability'][0]}{props['compute_capability'][1]}, "
         f"{props['sm_count']} SMs); starting from {base.source}")
    cases = plan(settings)
    probe.prepare(cases, device)  # the cases compile while the copy is timed
    try:
        copy_s = probe.copy_seconds(settings.copy_bytes, settings)
    except BaseException:
        probe.close()
        raise
    emit(f"copy     {2 * settings.copy_bytes / copy_s / 1e12:.3f} TB/s ({time.monotonic() - start:.1f} s)")
    timed = measure(probe, cases, device, settings, emit, deadline=start + settings.budget_s - settings.reserve_s)
    rates = fit_rates(timed, copy_s, settings.copy_bytes, base, props, settings)
    path = Path(out) if out is not None else device_model.calibrated_path(props)
    ratesfile.write(rates, path)
    device_model.current.cache_clear()
    c = rates.cublas_fp16
    emit(f"fit      cuBLAS fp16 {c.fixed_s * 1e6:.2f} us + bytes at {c.bytes_per_s / 1e12:.2f} TB/s, "
         f"{c.flops / 1e12:.0f} TFLOP/s; copy {rates.memory.copy_bytes_per_s / 1e12:.2f} TB/s")
    for group in ("tiles", "errors"):
        emit(f"fit      {group}: {rates.provenance[group]['error']}")
    emit(f"wrote    {path} ({time.monotonic() - start:.1f} s)")
    return path


def starting_rates(props: dict) -> Rates:
    """What a calibration starts from and keeps where it does not measure: the shipped file measured
    on a GPU of this name, else the nearest one scaled to this GPU."""
    files = device_model.shipped() or [ratesfile.default()]
    same = [r for r in files if r.device["name"] == props["name"]]
    return same[0] if same else device_model.scaled(device_model.nearest(files, props), props)
