"""Sputnik's own fp32 SpMM and SDDMM beside sparsegen's kernels and cuSPARSE (a peer check).

    python lab/peers/peer_sputnik.py --data .devdata --every 4 --offset 0 --n 128,256 --k 128 \
        [--ops spmm,sddmm] [--lib .devpeer/libsputnik_peer.so] [--out FILE.json] [--jobs 8]
    python lab/peers/peer_sputnik.py --smoke [--n 128,256 --k 128]     (Sputnik alone, tiny matrix)
    python lab/peers/peer_sputnik.py --data .devdata --every 4 --dry-run (no GPU: operands only)

Checks the peer figure of ../shared/BENCHMARKS.md ("Sputnik, a quarter of DLMC, n = 128 and 256:
SpMM 3.0x cuSPARSE, SDDMM (k = 128) 5.5x cuSPARSE") in one process, on one GPU, under one timer.
For every --every-th DLMC matrix of index.tsv (from --offset; values seeded as in the dlmc suite)
and every n (SpMM, fp32) and k (SDDMM, fp32), with the dlmc suite's seeded operands:

- sparsegen: sparsegen.compile(A, op="spmm", n=n, dtype="float32") called as kern(x, out=y);
  sparsegen.compile(A, op="sddmm", k=k, dtype="float32") called as kern(a, b);
- cuSPARSE, as sparsegen/bench/dlmc.py calls it: torch.mm of an int32 torch.sparse_csr_tensor;
  SDDMM torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0) and, where CuPy has it,
  cupyx.cusparse.sddmm (the faster passing one is the baseline, per timing method);
- Sputnik: sputnik::CudaSpmm and sputnik::CudaSddmm (fp32) from --lib, a shared library built
  from google-research/sputnik's sources by lab/peers/build_sputnik.sh (Sputnik's code is not part
  of this repository), called through ctypes on the torch tensors' device pointers, on torch's
  current stream. As in Sputnik's own fp32 DLMC benchmarks: rows swizzled by decreasing length (an
  int32 argsort, stable) and no row padding (its SpMM rounds each row's offset down to the vector
  width and masks the extra values itself; its SDDMM needs none). Its vector loads need
  16-byte-aligned buffers (checked), and column index x n (SpMM) or x k (SDDMM) x 4 bytes must fit
  an int; a case that cannot run says why.

Every result is checked against float64 scipy (relative Frobenius error, tolerance 1e-5) and each
path is timed by two methods, on the same function:

- time_cuda (sparsegen.bench.timing, ../shared/BENCHMARKS.md): a GPU spin before each CUDA event
  pair, so the interval holds GPU time only; median and minimum;
- plain_events: PLAIN_REPS times record a start event, call, record an end event, synchronize;
  median and minimum. On an idle GPU the interval then includes the host's launch overhead
  (Python, ctypes, cuSPARSE set-up): the hypothesis that the peer figure was measured this way.

Prints one line per case, then geomean tables per op and n/k and method (speedup = cuSPARSE time
/ time; "sparsegen/Sputnik" = Sputnik time / sparsegen time), over the cases where all three paths
passed; --out writes every number as JSON (after every matrix).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from sparsegen.bench.report import geomean  # noqa: E402
from sparsegen.bench.dlmc import TOLERANCE, dlmc_matrices  # noqa: E402
from sparsegen.bench.dlmc_gpu import sddmm_reference  # noqa: E402
from sparsegen.bench.records import relative_error, seed_for  # noqa: E402

DEFAULT_LIB = ".devpeer/libsputnik_peer.so"
TOL = TOLERANCE["float32"]
METHODS = ("time_cuda", "plain_events")
PLAIN_REPS = 50
PLAIN_WARMUP = 3
CUSPARSE_PATHS = ("cusparse", "cusparse_torch", "cusparse_cupy")  # SpMM has the first only
INT_MAX = 2**31 - 1
ALIGN = 16  # bytes: Sputnik's float4 loads and stores


# --------------------------------------------------------------------------- records

@dataclass
class Timing:
    median_ms: float
    min_ms: float
    runs: int
    host_ms: float | None = None    # time_cuda: median host-side submit time of one call
    sleep_us: float | None = None   # time_cuda: the spin before each event pair


@dataclass
class PathResult:
    name: str
    detail: str | None = None       # sparsegen's spec, or the call a baseline makes
    error: float | None = None      # relative Frobenius error against float64 scipy
    ok: bool = False
    times: dict = field(default_factory=dict)   # method -> Timing
    note: str | None = None         # why it did not run, or failed

    def ms(self, method: str) -> float | None:
        t = self.times.get(method)
        return t.median_ms if self.ok and t is not None else None


@dataclass
class CaseResult:
    id: str
    op: str
    width: int                      # SpMM: n; SDDMM: k
    shape: list
    nnz: int
    paths: dict = field(default_factory=dict)   # name -> PathResult

    @property
    def label(self) -> str:
        return f"{'n' if self.op == 'spmm' else 'k'}={self.width}"

    def baseline(self, method: str) -> tuple[str | None, float | None]:
        """The cuSPARSE path claimed against under `method`: the fastest that passed."""
        best = (None, None)
        for name in CUSPARSE_PATHS:
            r = self.paths.get(name)
            ms = r.ms(method) if r is not None else None
            if ms is not None and (best[1] is None or ms < best[1]):
                best = (name, ms)
        return best

    def ms(self, path: str, method: str) -> float | None:
        if path == "cusparse":
            return self.baseline(method)[1]
        r = self.paths.get(path)
        return r.ms(method) if r is not None else None

    def ratios(self, method: str) -> dict:
        """Sputnik and sparsegen speedups over cuSPARSE, and sparsegen's over Sputnik."""
        cs, sg, sp = (self.ms(p, method) for p in ("cusparse", "sparsegen", "sputnik"))
        return {"sputnik_vs_cusparse": _ratio(cs, sp), "sparsegen_vs_cusparse": _ratio(cs, sg),
                "sparsegen_vs_sputnik": _ratio(sp, sg)}


@dataclass
class GeomeanRow:
    op: str
    width: str                      # "n=128", "k=128" or "all"
    method: str
    cases: int                      # cases where all three passed (the columns share them)
    sputnik_vs_cusparse: float | None
    sparsegen_vs_cusparse: float | None
    sparsegen_vs_sputnik: float | None


def _ratio(num, den):
    return num / den if num and den and num > 0 and den > 0 else None


def geomean_rows(cases: list[CaseResult]) -> list[GeomeanRow]:
    """Per op and n/k (then per op over all widths) and per method."""
    rows = []
    groups: dict = {}
    for c in cases:
        groups.setdefault((c.op, c.label), []).append(c)
        groups.setdefault((c.op, "all"), []).append(c)
    ordered = sorted(groups, key=lambda g: (g[0] != "spmm", g[1] == "all", int(g[1][2:]) if g[1] != "all" else 0))
    for op, label in ordered:
        for method in METHODS:
            rs = [c.ratios(method) for c in groups[(op, label)]]
            rs = [r for r in rs if all(v is not None for v in r.values())]
            rows.append(GeomeanRow(op, label, method, len(rs),
                                   *(geomean(r[key] for r in rs) for key in
                                     ("sputnik_vs_cusparse", "sparsegen_vs_cusparse",
                                      "sparsegen_vs_sputnik"))))
    return rows


def print_geomeans(rows: list[GeomeanRow]) -> None:
    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    print("\n# geomeans over cases where sparsegen, cuSPARSE and Sputnik all passed "
          "(speedup = cuSPARSE time / time; sparsegen/Sputnik = Sputnik time / sparsegen time)")
    print(f"{'op':6} {'width':6} {'method':13} {'cases':>5} {'Sputnik/cuSPARSE':>17} "
          f"{'sparsegen/cuSPARSE':>19} {'sparsegen/Sputnik':>18}")
    for r in rows:
        print(f"{r.op:6} {r.width:6} {r.method:13} {r.cases:5d} {x(r.sputnik_vs_cusparse):>17} "
              f"{x(r.sparsegen_vs_cusparse):>19} {x(r.sparsegen_vs_sputnik):>18}")


def case_line(index: int, total: int, c: CaseResult) -> str:
    def us(path):
        cells = []
        for m in METHODS:
            v = c.ms(path, m)
            cells.append("-" if v is None else f"{v * 1e3:.1f}")
        return "|".join(cells)

    def x(key):
        cells = []
        for m in METHODS:
            v = c.ratios(m)[key]
            cells.append("-" if v is None else f"{v:.2f}x")
        return "|".join(cells)

    def err(name):
        r = c.paths.get(name)
        return "-" if r is None or r.error is None else f"{r.error:.1e}"

    base = "/".join(sorted({n for n in (c.baseline(m)[0] for m in METHODS) if n})) or "-"
    errs = " ".join(f"{n}={err(n)}" for n in c.paths)
    notes = "; ".join(f"{n}: {r.note}" for n, r in c.paths.items() if r.note)
    return (f"[{index}/{total}] {c.id} {c.op} {c.label}  us (time_cuda|plain): "
            f"sparsegen {us('sparsegen')}  cusparse {us('cusparse')} ({base})  sputnik {us('sputnik')}"
            f"  vs cuSPARSE: sparsegen {x('sparsegen_vs_cusparse')} sputnik {x('sputnik_vs_cusparse')}"
            f"  sparsegen/Sputnik {x('sparsegen_vs_sputnik')}  err {errs}"
            + (f"  ({notes[:300]})" if notes else ""))


# --------------------------------------------------------------------------- host side

def parse_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def choose_matrices(data: str, every: int, offset: int, limit: int | None) -> list:
    chosen = dlmc_matrices(data)[offset::every]
    return chosen[:limit] if limit else chosen


def row_swizzle(indptr: np.ndarray) -> np.ndarray:
    """Sputnik's SORTED row swizzle: row indices by decreasing length (ties in row order), int32."""
    return np.argsort(-np.diff(np.asarray(indptr, dtype=np.int64)), kind="stable").astype(np.int32)


@dataclass
class Operands:
    """The dense operands of one case (float32, as the dlmc suite seeds them) and the reference."""
    dense: list                     # SpMM: [X (K x n)]; SDDMM: [A (M x k), B (N x k)]
    ref: np.ndarray                 # float64: Y (M x n) or the nnz values in CSR order


def spmm_operands(mid: str, A, n: int) -> Operands:
    rng = np.random.default_rng(seed_for(mid, "X", n))
    X = rng.standard_normal((A.shape[1], n)).astype(np.float32)
    ref = np.asarray(A.astype(np.float64) @ X.astype(np.float64))
    return Operands([X], ref)


def sddmm_operands(mid: str, A, k: int) -> Operands:
    rng = np.random.default_rng(seed_for(mid, "AB", k))
    Ah = rng.standard_normal((A.shape[0], k)).astype(np.float32)
    Bh = rng.standard_normal((A.shape[1], k)).astype(np.float32)
    rows_of = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    return Operands([Ah, Bh], sddmm_reference(Ah, Bh, rows_of, A.indices))


def operands_for(mid: str, A, op: str, width: int) -> Operands:
    return spmm_operands(mid, A, width) if op == "spmm" else sddmm_operands(mid, A, width)


def sputnik_index_limit(A, op: str, width: int) -> str | None:
    """Sputnik scales column indices to byte offsets in an int: why it cannot run, or None."""
    top = (A.shape[1] - 1) * width * 4
    if top > INT_MAX:
        return f"column index x {'n' if op == 'spmm' else 'k'} x 4 bytes = {top} exceeds int32"
    return None


def random_pattern(m: int, k: int, seed: int = 7):
    """A small CSR with uneven rows (empty ones, full ones, unaligned row offsets): the smoke test."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, k + 1, m)
    lengths[::7] = 0
    lengths[3] = k
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    indices = np.concatenate([np.sort(rng.choice(k, size=L, replace=False)) for L in lengths]).astype(np.int32)
    data = rng.standard_normal(len(indices)).astype(np.float32)
    return sp.csr_matrix((data, indices, indptr), shape=(m, k))


# --------------------------------------------------------------------------- Sputnik (ctypes)

class SputnikLib:
    """The shim's C entry points (lab/peers/sputnik_shim.cu) around sputnik::CudaSpmm/CudaSddmm."""

    def __init__(self, path: str):
        self.path = str(Path(path).resolve())
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"{path}: not built (run lab/peers/build_sputnik.sh)")
        lib = ctypes.CDLL(self.path)
        i, p = ctypes.c_int, ctypes.c_void_p
        lib.sputnik_spmm_f32.argtypes = [i, i, i, i] + [p] * 7
        lib.sputnik_sddmm_f32.argtypes = [i, i, i, i] + [p] * 7
        for f in (lib.sputnik_spmm_f32, lib.sputnik_sddmm_f32, lib.sputnik_set_device,
                  lib.sputnik_device_synchronize, lib.sputnik_runtime_version):
            f.restype = i
        lib.sputnik_set_device.argtypes = [i]
        lib.sputnik_error_string.argtypes = [i]
        lib.sputnik_error_string.restype = ctypes.c_char_p
        self.lib = lib

    def info(self) -> dict:
        return {"lib": self.path, "sha256": hashlib.sha256(Path(self.path).read_bytes()).hexdigest(),
                "cudart_static": self.lib.sputnik_runtime_version(),
                "functions": ["sputnik::CudaSpmm (float)", "sputnik::CudaSddmm (float)"],
                "swizzle": "rows by decreasing length (stable argsort)", "row_padding": 0}

    def check(self, rc: int) -> None:
        if rc:
            raise RuntimeError(f"Sputnik: {self.lib.sputnik_error_string(rc).decode()} ({rc})")

    def set_device(self, device: int) -> None:
        self.check(self.lib.sputnik_set_device(device))

    def spmm_launcher(self, M, K, n, nnz, swizzle, vals, crow, col, x, y, stream: int):
        f, args = self.lib.sputnik_spmm_f32, (M, K, n, nnz, *_ptrs(swizzle, vals, crow, col, x, y), stream)

        def launch():
            self.check(f(*args))
            return y
        return launch

    def sddmm_launcher(self, M, k, N, nnz, swizzle, crow, col, a, b, out, stream: int):
        f, args = self.lib.sputnik_sddmm_f32, (M, k, N, nnz, *_ptrs(swizzle, crow, col, a, b, out), stream)

        def launch():
            self.check(f(*args))
            return out
        return launch


def _ptrs(*tensors) -> list[int]:
    """Device pointers of contiguous tensors, each 16-byte aligned (Sputnik's vector accesses)."""
    out = []
    for t in tensors:
        if not t.is_contiguous() or t.data_ptr() % ALIGN:
            raise ValueError(f"Sputnik needs contiguous {ALIGN}-byte-aligned buffers "
                             f"(got {t.shape} at {t.data_ptr():#x})")
        out.append(t.data_ptr())
    return out


# --------------------------------------------------------------------------- timing

def plain_events(fn, reps: int = PLAIN_REPS, warmup: int = PLAIN_WARMUP) -> Timing:
    """The naive method: start event, call, end event, synchronize; `reps` times; median."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return Timing(statistics.median(times), min(times), reps)


def spin_events(fn) -> Timing:
    from sparsegen.bench.timing import time_cuda

    t = time_cuda(fn)
    return Timing(t["median_ms"], t["min_ms"], t["runs"], t.get("host_ms"), t.get("sleep_us"))


def measure(name: str, fn, check, detail: str | None = None) -> PathResult:
    """One call checked against the reference, then both timing methods (failures become notes)."""
    import torch

    r = PathResult(name, detail)
    try:
        res = fn()
        torch.cuda.synchronize()
        r.error = check(res)
        r.ok = r.error is not None and math.isfinite(r.error) and r.error <= TOL
        if not r.ok:
            r.note = f"error {r.error} > tolerance {TOL:g}"
        del res
        r.times = {"time_cuda": spin_events(fn), "plain_events": plain_events(fn)}
    except Exception as exc:  # noqa: BLE001 - a path that fails is recorded, the run goes on
        r.ok = False
        r.note = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
    return r


# --------------------------------------------------------------------------- the GPU side

class GpuRun:
    """Torch, CuPy and sparsegen set up as the dlmc suite's GpuExecutor does, plus the Sputnik library."""

    def __init__(self, lib: SputnikLib):
        from sparsegen.bench.dlmc import GpuExecutor

        self.ex = GpuExecutor()
        self.torch = self.ex.torch
        self.lib = lib
        lib.set_device(self.torch.cuda.current_device())

    def matrix(self, A):
        """dlmc's GPU copies of A (int32 CSR tensors, the torch CSR), plus Sputnik's row swizzle."""
        gm = self.ex.matrix(A)
        t = gm.tensors("float32")
        t["swizzle"] = self.torch.from_numpy(row_swizzle(A.indptr)).to(self.ex.device)
        return gm, t

    def compile(self, A, **kw) -> tuple:
        """(kernel, None) or (None, why not)."""
        import sparsegen

        try:
            kern = sparsegen.compile(A, dtype="float32", **kw)
        except sparsegen.SparsegenError as exc:
            return None, f"{type(exc).__name__}: {str(exc)[:200]}"
        if getattr(kern, "backend", "gpu") != "gpu":
            return None, f"compiled for backend {kern.backend!r}, not the GPU (is PyCUDA installed?)"
        return kern, None

    def spmm(self, mid: str, A, t: dict, n: int, ops: Operands) -> CaseResult:
        torch, dev = self.torch, self.ex.device
        M, K = A.shape
        x = torch.from_numpy(ops.dense[0]).to(dev).contiguous()
        case = CaseResult(mid, "spmm", n, [M, K], int(A.nnz))

        def check(y):
            return relative_error(y.double().cpu().numpy(), ops.ref)

        def fresh():
            return torch.full((M, n), float("nan"), dtype=torch.float32, device=dev)

        kern, why = self.compile(t["A"], op="spmm", n=n)
        if kern is None:
            case.paths["sparsegen"] = PathResult("sparsegen", note=why)
        else:
            y = fresh()
            case.paths["sparsegen"] = measure("sparsegen", lambda: _out(kern(x, out=y), y), check,
                                              kern.spec.name)
        A_sp = t["sparse"]
        case.paths["cusparse"] = measure("cusparse", lambda: torch.mm(A_sp, x), check,
                                         "torch.mm(torch.sparse_csr_tensor(int32 crow, int32 col, vals), X)")
        why = sputnik_index_limit(A, "spmm", n)
        if why:
            case.paths["sputnik"] = PathResult("sputnik", note=why)
        else:
            ys = fresh()
            stream = torch.cuda.current_stream().cuda_stream
            try:
                launch = self.lib.spmm_launcher(M, K, n, int(A.nnz), t["swizzle"], t["vals"], t["crow"],
                                                t["col"], x, ys, stream)
                case.paths["sputnik"] = measure("sputnik", launch, check, "sputnik::CudaSpmm (fp32)")
            except ValueError as exc:
                case.paths["sputnik"] = PathResult("sputnik", note=str(exc))
        return case

    def sddmm(self, mid: str, A, t: dict, k: int, ops: Operands) -> CaseResult:
        torch, dev = self.torch, self.ex.device
        M, N = A.shape
        a = torch.from_numpy(ops.dense[0]).to(dev).contiguous()
        b = torch.from_numpy(ops.dense[1]).to(dev).contiguous()
        case = CaseResult(mid, "sddmm", k, [M, N], int(A.nnz))

        def check(v):
            return relative_error(v.reshape(-1).double().cpu().numpy(), ops.ref)

        kern, why = self.compile(t["A"], op="sddmm", k=k)
        if kern is None:
            case.paths["sparsegen"] = PathResult("sparsegen", note=why)
        else:
            case.paths["sparsegen"] = measure("sparsegen", lambda: kern(a, b), check, kern.spec.name)
        self._cusparse_sddmm(case, t, a, b, check)
        why = sputnik_index_limit(A, "sddmm", k)
        if why:
            case.paths["sputnik"] = PathResult("sputnik", note=why)
        else:
            out = torch.full((int(A.nnz),), float("nan"), dtype=torch.float32, device=dev)
            stream = torch.cuda.current_stream().cuda_stream
            try:
                launch = self.lib.sddmm_launcher(M, k, N, int(A.nnz), t["swizzle"], t["crow"], t["col"],
                                                 a, b, out, stream)
                case.paths["sputnik"] = measure("sputnik", launch, check, "sputnik::CudaSddmm (fp32)")
            except ValueError as exc:
                case.paths["sputnik"] = PathResult("sputnik", note=str(exc))
        return case

    def _cusparse_sddmm(self, case: CaseResult, t: dict, a, b, check) -> None:
        """torch.sparse.sampled_addmm (int64 indices if int32 fails) and cupyx.cusparse.sddmm, as dlmc.py."""
        torch = self.torch
        pattern, bt = t["sparse"], b.t()
        r = measure("cusparse_torch", lambda: torch.sparse.sampled_addmm(pattern, a, bt, beta=0.0, alpha=1.0),
                    lambda v: check(v.values()), "torch.sparse.sampled_addmm(int32 CSR, A, B.t(), beta=0)")
        if not r.times:  # some torch builds take only int64 CSR indices here
            p64 = torch.sparse_csr_tensor(t["crow"].long(), t["col"].long(), t["vals"], size=t["A"].shape)
            r = measure("cusparse_torch", lambda: torch.sparse.sampled_addmm(p64, a, bt, beta=0.0, alpha=1.0),
                        lambda v: check(v.values()), "torch.sparse.sampled_addmm(int64 CSR, A, B.t(), beta=0)")
        case.paths["cusparse_torch"] = r
        cupy_sddmm = self.ex.cupy_sddmm
        if cupy_sddmm is None:
            return
        cp = self.ex.cupy
        import cupyx.scipy.sparse as csp

        try:
            stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
            with stream:
                ca, cbt = cp.asarray(a), cp.asarray(b).T
                cc = csp.csr_matrix((cp.asarray(t["vals"]).copy(), cp.asarray(t["col"]),
                                     cp.asarray(t["crow"])), shape=t["A"].shape)
        except Exception as exc:  # noqa: BLE001
            case.paths["cusparse_cupy"] = PathResult("cusparse_cupy", note=f"{type(exc).__name__}: {exc}"[:300])
            return

        def fn():
            with stream:
                res = cupy_sddmm(ca, cbt, cc, alpha=1.0, beta=0.0)
            return cc if res is None else res

        case.paths["cusparse_cupy"] = measure(
            "cusparse_cupy", fn, lambda res: check(torch.as_tensor(res.data, device=self.ex.device)),
            "cupyx.cusparse.sddmm(A, B.T, CSR, beta=0)")


def _out(result, y):
    """sparsegen's kern(x, out=y) may return y or None; the result is y either way."""
    return y if result is None else result


# --------------------------------------------------------------------------- runs

def gpu_arch():
    """sm_XY of the visible GPU (torch's view), or None without one."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def precompile(chosen: list, ops: list, ns: list, ks: list, jobs: int) -> None:
    """Every sparsegen cubin the run will load, compiled by `jobs` processes first (on the CPU)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    arch = os.environ.get("SPARSEGEN_ARCH") or gpu_arch()
    tasks = [(m.path, m.id, m.rows, m.cols, m.sparsity, m.nnz, op, w, arch)
             for m in chosen for op in ops for w in (ns if op == "spmm" else ks)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:  # no CUDA in a fork
        declined = [d for d in pool.map(_precompile_one, tasks) if d]
    print(f"# precompiled {len(tasks)} kernels with {jobs} processes in {time.perf_counter() - t0:.0f} s"
          f" ({len(declined)} declined)", flush=True)
    for d in declined:
        print(f"#   {d}")


def _precompile_one(task) -> str:
    import sparsegen
    from sparsegen.bench.dlmc import MatrixSource

    path, mid, rows, cols, sparsity, nnz, op, width, arch = task
    A = MatrixSource(id=mid, source="dlmc", rows=rows, cols=cols, sparsity=sparsity, nnz=nnz, path=path).load()
    kw = {"n": width} if op == "spmm" else {"k": width}
    try:
        sparsegen.compile(A, op=op, dtype="float32", backend="emulate", arch=arch, **kw).cubin  # noqa: B018
        return ""
    except sparsegen.SparsegenError as exc:
        return f"{mid} {op} {width}: {exc}"[:200]


def environment(lib: SputnikLib | None, gpu: bool) -> dict:
    from sparsegen.bench import git_revision, gpu_environment

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "revision": None}
    try:
        env["revision"] = git_revision()
    except Exception:  # noqa: BLE001 - a copy of the tree without .git
        pass
    if gpu:
        env.update(gpu_environment())
    if lib is not None:
        env["sputnik"] = lib.info()
    return env


def write_json(path: str, env: dict, settings: dict, cases: list, done: bool) -> None:
    if not path:
        return
    doc = {"env": env, "settings": settings, "complete": done, "cases": [asdict(c) for c in cases],
           "geomeans": [asdict(r) for r in geomean_rows(cases)]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def run_gpu(args, chosen: list, ops: list, ns: list, ks: list) -> int:
    lib = SputnikLib(args.lib)
    gpu = GpuRun(lib)
    env = environment(lib, gpu=True)
    settings = {"every": args.every, "offset": args.offset, "limit": args.limit, "ops": ops, "n": ns, "k": ks,
                "matrices": [m.id for m in chosen], "tolerance": TOL, "plain_reps": PLAIN_REPS,
                "plain_warmup": PLAIN_WARMUP, "baselines": gpu.ex.baselines}
    print(f"# {env.get('gpu')} torch {env.get('torch')} CUDA {env.get('cuda')}; Sputnik {lib.path} "
          f"(static cudart {env['sputnik']['cudart_static']}); {len(chosen)} matrices", flush=True)
    if args.jobs > 1:
        precompile(chosen, ops, ns, ks, args.jobs)
    total = len(chosen) * sum(len(ns) if op == "spmm" else len(ks) for op in ops)
    cases: list[CaseResult] = []
    t0 = time.perf_counter()
    aborted = None
    for m in chosen:
        A = m.load()
        gm, t = gpu.matrix(A)
        try:
            for op in ops:
                for w in (ns if op == "spmm" else ks):
                    operands = operands_for(m.id, A, op, w)
                    c = (gpu.spmm if op == "spmm" else gpu.sddmm)(m.id, A, t, w, operands)
                    cases.append(c)
                    print(case_line(len(cases), total, c), flush=True)
                    if not all(r.ok for r in c.paths.values()):
                        aborted = gpu.ex.context_lost()
                        if aborted:
                            break
                if aborted:
                    break
        finally:
            gm.close()
        write_json(args.out, env, settings, cases, done=False)
        if aborted:
            print(f"# GPU context unusable after {m.id}: {aborted}; stopping", flush=True)
            break
    env["elapsed_s"] = round(time.perf_counter() - t0, 1)
    rows = geomean_rows(cases)
    print_geomeans(rows)
    write_json(args.out, env, settings, cases, done=aborted is None)
    failed = [(c.id, c.op, c.width, n) for c in cases for n, r in c.paths.items() if not r.ok]
    print(f"# {len(cases)} cases in {env['elapsed_s']} s; {len(failed)} path results not passing"
          + (f" (first: {failed[0]})" if failed else ""))
    return 0 if aborted is None else 1


def run_smoke(args, ns: list, ks: list) -> int:
    """Sputnik alone on a tiny uneven matrix (70 x 100): a wrong signature or layout fails here."""
    lib = SputnikLib(args.lib)
    gpu = GpuRun(lib)
    A = random_pattern(70, 100)
    _, t = gpu.matrix(A)
    torch, dev = gpu.torch, gpu.ex.device
    stream = torch.cuda.current_stream().cuda_stream
    bad = 0
    for n in ns:
        ops = spmm_operands("smoke", A, n)
        x = torch.from_numpy(ops.dense[0]).to(dev)
        y = torch.full((A.shape[0], n), float("nan"), device=dev)
        lib.spmm_launcher(*A.shape, n, int(A.nnz), t["swizzle"], t["vals"], t["crow"], t["col"], x, y, stream)()
        torch.cuda.synchronize()
        err = relative_error(y.double().cpu().numpy(), ops.ref)
        bad += not err <= TOL
        print(f"# smoke: Sputnik SpMM 70x100 nnz={A.nnz} n={n}: error {err:.2e} {'PASS' if err <= TOL else 'FAIL'}")
    for k in ks:
        ops = sddmm_operands("smoke", A, k)
        a, b = (torch.from_numpy(d).to(dev) for d in ops.dense)
        out = torch.full((int(A.nnz),), float("nan"), device=dev)
        lib.sddmm_launcher(A.shape[0], k, A.shape[1], int(A.nnz), t["swizzle"], t["crow"], t["col"], a, b, out,
                           stream)()
        torch.cuda.synchronize()
        err = relative_error(out.double().cpu().numpy(), ops.ref)
        bad += not err <= TOL
        print(f"# smoke: Sputnik SDDMM 70x100 nnz={A.nnz} k={k}: error {err:.2e} {'PASS' if err <= TOL else 'FAIL'}")
    return 1 if bad else 0


def run_dry(args, chosen: list, ops: list, ns: list, ks: list) -> int:
    """No GPU: load each matrix, make every case's operands, swizzle and reference; check the library loads."""
    lib = None
    try:
        lib = SputnikLib(args.lib)
        print(f"# Sputnik library {lib.path} loads (static cudart {lib.lib.sputnik_runtime_version()})")
    except (OSError, AttributeError) as exc:
        print(f"# Sputnik library: {exc}")
    total = 0
    for m in chosen:
        A = m.load()
        swz = row_swizzle(A.indptr)
        lengths = np.diff(A.indptr)
        assert sorted(swz.tolist()) == list(range(A.shape[0])) and np.all(np.diff(lengths[swz]) <= 0)
        for op in ops:
            for w in (ns if op == "spmm" else ks):
                t0 = time.perf_counter()
                o = operands_for(m.id, A, op, w)
                total += 1
                why = sputnik_index_limit(A, op, w)
                print(f"[{total}] {m.id} {op} {'n' if op == 'spmm' else 'k'}={w} shape={A.shape} nnz={A.nnz} "
                      f"rows {lengths.min()}-{lengths.max()} swizzle[:3]={swz[:3].tolist()} "
                      f"ref |{np.linalg.norm(o.ref):.4g}| in {time.perf_counter() - t0:.2f} s"
                      + (f"  Sputnik cannot: {why}" if why else ""))
    print_geomeans(geomean_rows([]))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("SPARSEGEN_DATA", "../shared/data"),
                    help="folder holding dlmc/index.tsv")
    ap.add_argument("--every", type=int, default=4, help="every E-th DLMC matrix in index.tsv order (4: a quarter)")
    ap.add_argument("--offset", type=int, default=0, help="start at this matrix (with --every)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many matrices")
    ap.add_argument("--ops", default="spmm,sddmm")
    ap.add_argument("--n", default="128,256", help="SpMM widths")
    ap.add_argument("--k", default="128", help="SDDMM inner dimensions")
    ap.add_argument("--lib", default=DEFAULT_LIB, help="the Sputnik shim library (lab/peers/build_sputnik.sh)")
    ap.add_argument("--out", default="", help="write every case and the geomeans here as JSON")
    ap.add_argument("--jobs", type=int, default=0, help="compile sparsegen's kernels first in J processes")
    ap.add_argument("--smoke", action="store_true", help="only Sputnik on a tiny matrix, checked; exit 1 if wrong")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: operands, swizzles and references only")
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    if not set(ops) <= {"spmm", "sddmm"} or args.every < 1:
        ap.error("--ops takes spmm,sddmm; --every is a positive integer")
    ns, ks = parse_ints(args.n), parse_ints(args.k)
    if args.smoke:
        return run_smoke(args, ns if "spmm" in ops else [], ks if "sddmm" in ops else [])
    chosen = choose_matrices(args.data, args.every, args.offset, args.limit)
    if args.dry_run:
        return run_dry(args, chosen, ops, ns, ks)
    return run_gpu(args, chosen, ops, ns, ks)


if __name__ == "__main__":
    sys.exit(main())
