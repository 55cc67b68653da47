"""The `dlmc` benchmark suite: DLMC matrices and square random matrices, SpMM and SDDMM.

Cases (../shared/BENCHMARKS.md, suite `dlmc`):

- every matrix listed in DATA/dlmc/index.tsv (pruned ResNet-50 and Transformer weights; values
  drawn N(0,1) from a seed derived from the matrix id), plus square random matrices of
  2048, 4096 and 8192 at 70, 80, 90 and 95 % sparsity (uniform pattern, every row the same length);
- SpMM (fp32, fp16) at n in {32, 128, 256, 1024} against cuSPARSE (torch CSR int32) and cuBLAS
  (dense torch.matmul, TF32 off), CuPy's csr @ array as an extra column;
- SDDMM (fp32, fp16) at k in {32, 128, 256} against torch.sparse.sampled_addmm and, where CuPy has
  it, cupyx.cusparse.sddmm (the faster passing one is the baseline claimed against);
- `--quick`: every 10th DLMC matrix sorted by path, random 4096 at 80 and 90 %, n = k = 128.

With `--families` each case also forces every kernel family that serves its op (or those named)
through `options={"family": ...}` and times each that accepts the request; the report then says,
per case, which family was fastest and how the selected kernel compares with it, and per op and
dtype the share of cases where the selected kernel is within 5 % of the fastest family.

Every case is checked against a float64 scipy reference on the same (dtype-rounded) inputs. The
measurements are bench/dlmc_gpu.py's (on the shared bench/executor.py), the report
bench/dlmc_report.py's. Torch, CuPy and sparsegen's GPU runtime are imported only when a
`GpuExecutor` is made.
"""
from __future__ import annotations

import csv
import math
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparsegen.bench import prefetch
from sparsegen.bench.dlmc_gpu import REFERENCE_LIMIT, TOLERANCE, GpuExecutor, as_stored
from sparsegen.bench.dlmc_report import fastest_family
from sparsegen.bench.dlmc_report import exit_status, summary_lines, write_json, write_reports  # noqa: F401  (the suite's interface)
from sparsegen.bench.records import join_notes, matrix_info, message, ratio, seed_for
from sparsegen.errors import SparsegenError

NAME = "dlmc"

OPS = ("spmm", "sddmm")
DTYPES = ("float32", "float16")
N_VALUES = (32, 128, 256, 1024)
K_VALUES = (32, 128, 256)
RANDOM_SIZES = (2048, 4096, 8192)
RANDOM_SPARSITIES = (0.7, 0.8, 0.9, 0.95)

QUICK_EVERY = 10
QUICK_N = (128,)
QUICK_K = (128,)
QUICK_RANDOM = ((4096, 0.8), (4096, 0.9))

# The families `--families` forces, by op (every family but the sparse DNN layer's, which runs
# inside its network driver); test_bench checks that the two lists cover sparsegen's families.
OP_FAMILIES = {
    "spmm": ("csr_rowsplit", "sputnik_spmm", "ell_coo_spmm", "panel_spmm", "dense_tile_spmm",
             "tiled_csl_spmm", "tiled_bitmap_spmm", "tiled_lanes_spmm", "dense_gemm"),
    "sddmm": ("sputnik_sddmm", "dense_tile_sddmm"),
}


# --------------------------------------------------------------------------- matrices and cases

@dataclass(frozen=True)
class MatrixSource:
    """One matrix of the suite, not yet loaded."""
    id: str
    source: str                      # "dlmc" or "random"
    rows: int
    cols: int
    sparsity: float                  # nominal (DLMC directory name, or the random target)
    nnz: int | None = None           # expected, when known in advance
    path: str | None = None          # DLMC file
    model: str | None = None
    method: str | None = None

    @property
    def seed(self) -> int:
        return seed_for(self.id, "values")

    def load(self) -> sp.csr_matrix:
        """The matrix as a canonical float32 CSR with seeded N(0,1) values."""
        if self.source == "random":
            return random_square(self.rows, self.sparsity, self.seed)
        from sparsegen.io import load

        A = sp.csr_matrix(load(self.path, values="random", seed=self.seed))
        if A.dtype != np.float32:
            A = A.astype(np.float32)
        A.sum_duplicates()
        if A.shape != (self.rows, self.cols) or (self.nnz is not None and A.nnz != self.nnz):
            raise SparsegenError(
                f"{self.path}: index.tsv says {self.rows}x{self.cols} with {self.nnz} nonzeros, "
                f"the file holds {A.shape[0]}x{A.shape[1]} with {A.nnz}")
        return A


@dataclass(frozen=True)
class Case:
    matrix: MatrixSource
    op: str
    dtype: str
    n: int | None = None             # SpMM: columns of X
    k: int | None = None             # SDDMM: inner dimension
    families: tuple = field(default=(), compare=False)  # --families: forced and timed besides

    @property
    def id(self) -> str:
        return self.matrix.id

    @property
    def width(self) -> int:
        return self.n if self.op == "spmm" else self.k

    @property
    def key(self) -> tuple:
        return case_key(self)

    @property
    def request(self) -> dict:
        """The compile request of the case (what `dlmc_gpu` asks sparsegen.compile for)."""
        width = {"n": self.n} if self.op == "spmm" else {"k": self.k}
        return {"op": self.op, "dtype": self.dtype, **width}


def random_square(m: int, sparsity: float, seed: int, *, chunk_elems: int = 1 << 22) -> sp.csr_matrix:
    """m x m float32 CSR, every row exactly round(m * (1 - sparsity)) distinct uniform columns.

    Per chunk of rows: float64 random keys, the row's L-th smallest key by np.partition, and the
    columns whose key is at most that; np.nonzero of the mask yields them sorted within each row.
    Memory stays at a few tens of MB (chunk_elems keys); 8192 x 8192 at 70 % takes about 1 s.
    """
    rng = np.random.default_rng(seed)
    L = int(min(max(round(m * (1.0 - sparsity)), 0), m))
    indptr = np.arange(m + 1, dtype=np.int64) * L
    indices = np.empty(m * L, dtype=np.int32)
    rows_per_chunk = max(1, chunk_elems // max(m, 1))
    for r0 in range(0, m, rows_per_chunk):
        r1 = min(m, r0 + rows_per_chunk)
        if L == 0:
            continue
        if L == m:
            indices[r0 * L:r1 * L] = np.tile(np.arange(m, dtype=np.int32), r1 - r0)
            continue
        keys = rng.random((r1 - r0, m))
        thr = np.partition(keys, L - 1, axis=1)[:, L - 1:L]
        mask = keys <= thr
        counts = mask.sum(axis=1)
        bad = np.flatnonzero(counts != L)            # a tie at the threshold (practically never)
        for b in bad:
            mask[b] = False
            mask[b, np.argsort(keys[b], kind="stable")[:L]] = True
        _, cols = np.nonzero(mask)
        indices[r0 * L:r1 * L] = cols
    data = rng.standard_normal(m * L, dtype=np.float32)
    A = sp.csr_matrix((data, indices, indptr), shape=(m, m))
    A.has_sorted_indices = True
    return A


def read_index(path) -> list[dict]:
    """Rows of DATA/dlmc/index.tsv as dicts (tab separated, header line)."""
    path = Path(path)
    if not path.is_file():
        raise SparsegenError(f"DLMC index not found: {path} (is --data the shared data folder?)")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    need = {"path", "model", "method", "sparsity", "rows", "cols", "nnz"}
    if rows and not need <= set(rows[0]):
        raise SparsegenError(f"{path}: expected columns {sorted(need)}, found {sorted(rows[0])}")
    return rows


def dlmc_matrices(data_dir, *, quick: bool = False) -> list[MatrixSource]:
    root = Path(data_dir) / "dlmc"
    rows = sorted(read_index(root / "index.tsv"), key=lambda r: r["path"])
    if quick:
        rows = rows[::QUICK_EVERY]
    out = []
    for r in rows:
        rel = r["path"]
        mid = rel
        for suffix in (".gz", ".smtx"):
            if mid.endswith(suffix):
                mid = mid[: -len(suffix)]
        out.append(MatrixSource(
            id=mid, source="dlmc", rows=int(r["rows"]), cols=int(r["cols"]),
            sparsity=float(r["sparsity"]), nnz=int(r["nnz"]), path=str(root / rel),
            model=r.get("model"), method=r.get("method")))
    return out


def random_matrices(*, quick: bool = False) -> list[MatrixSource]:
    pairs = QUICK_RANDOM if quick else [(m, s) for m in RANDOM_SIZES for s in RANDOM_SPARSITIES]
    out = []
    for m, s in pairs:
        L = int(round(m * (1.0 - s)))
        out.append(MatrixSource(id=f"random/{m}/{s:g}", source="random", rows=m, cols=m,
                                sparsity=s, nnz=m * L))
    return out


def parse_families(text):
    """--families: "all" (every family of each op) -> "all"; "a,b" -> ("a", "b"), each a family
    OP_FAMILIES names."""
    if text is None:
        return None
    names = tuple(dict.fromkeys(t.strip() for t in str(text).split(",") if t.strip()))
    if names == ("all",):
        return "all"
    known = [f for fams in OP_FAMILIES.values() for f in fams]
    bad = [f for f in names if f not in known]
    if bad or not names:
        raise SparsegenError(f"--families: unknown famil{'ies' if len(bad) > 1 else 'y'} "
                             f"{', '.join(bad) or repr(text)}; known: all, {', '.join(known)}")
    return names


def families_for(op: str, chosen) -> tuple:
    """The families a case of `op` forces: none without --families, else those of the op chosen."""
    if not chosen:
        return ()
    return tuple(f for f in OP_FAMILIES.get(op, ()) if chosen == "all" or f in chosen)


def cases_for(matrix: MatrixSource, ops, dtypes, ns, ks, families=None) -> list[Case]:
    """Cases of one matrix, grouped by dtype (so one dtype's GPU copies are live at a time)."""
    cases = []
    for dtype in dtypes:
        for op in ops:
            fams = families_for(op, families)
            if op == "spmm":
                cases += [Case(matrix, op, dtype, n=int(n), families=fams) for n in ns]
            elif op == "sddmm":
                cases += [Case(matrix, op, dtype, k=int(k), families=fams) for k in ks]
            else:
                raise SparsegenError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    return cases


def plan(cfg) -> list[tuple[MatrixSource, list[Case]]]:
    """(matrix, its cases) for the configuration: DLMC matrices first, then random ones.

    `cfg.limit`, when set, keeps at most that many matrices of each source (DLMC, random).
    """
    quick = bool(cfg.quick)
    ns = cfg.ns or (QUICK_N if quick else N_VALUES)
    ks = cfg.ks or (QUICK_K if quick else K_VALUES)
    ops = cfg.ops or OPS
    dtypes = cfg.dtypes or DTYPES
    dl = dlmc_matrices(cfg.data_dir, quick=quick)
    rnd = random_matrices(quick=quick)
    if cfg.limit is not None:
        dl, rnd = dl[: cfg.limit], rnd[: cfg.limit]
    families = getattr(cfg, "families", None)
    return [(m, cases_for(m, ops, dtypes, ns, ks, families)) for m in dl + rnd]


# --------------------------------------------------------------------------- compiling ahead

def precompile(job: prefetch.Job) -> dict:
    """Worker side: load the matrix (seeded: the same values) and compile each case's kernels
    (`prefetch.compile_ahead`: the selection, its contenders, the forced families) into
    job.cache_dir. Returns {case key: {"seconds", "errors", "specs"}}; loading is charged to the
    first case."""
    results, stored = {}, {}
    with prefetch.cache_dir(job.cache_dir):
        t0 = time.perf_counter()
        A = job.cases[0].matrix.load()
        for case in job.cases:
            if case.dtype not in stored:
                stored[case.dtype] = as_stored(A, case.dtype)
            results[case.key] = prefetch.compile_ahead(stored[case.dtype], case.request, case.families, job)
            results[case.key]["seconds"] = round(time.perf_counter() - t0, 2)
            prefetch.mark_done(job.cache_dir, case.key, results[case.key])  # measurable from now on
            t0 = time.perf_counter()
    return results


def case_dir(root, case: Case) -> Path:
    """The cache folder of a case's matrix (all its cases share it, hence its analysis and encodings)."""
    return Path(root) / f"{zlib.crc32(case.id.encode()):08x}"


def _nnz(matrix) -> float:
    return matrix.nnz if matrix.nnz is not None else matrix.rows * matrix.cols * (1.0 - matrix.sparsity)


def job_memory(case: Case) -> float:
    """Peak host bytes of one matrix's job: its CSR, a dtype-rounded copy, analysis and encodings."""
    return 60.0 * _nnz(case.matrix) + 5e8


def job_disk(case: Case) -> float:
    """Cache bytes one matrix's job leaves: an encoding per family (<= ~12 B per nonzero) and cubins."""
    return 12.0 * _nnz(case.matrix) * max(1, len(case.families)) + 5e7


class Prefetcher(prefetch.Prefetcher):
    """Compiles the coming matrices ahead: one job per matrix, every case of it."""
    folder_of = staticmethod(case_dir)
    memory_of = staticmethod(job_memory)
    disk_of = staticmethod(job_disk)
    default_job = staticmethod(precompile)


# --------------------------------------------------------------------------- results

def speedups(ms: dict) -> dict:
    return {"vs_cusparse": ratio(ms.get("cusparse"), ms.get("sparsegen")),
            "vs_cublas": ratio(ms.get("cublas"), ms.get("sparsegen"))}


def base_record(case: Case, info: dict) -> dict:
    return {
        "id": case.id, "source": case.matrix.source, "op": case.op, "dtype": case.dtype,
        "n": case.n, "k": case.k, "shape": info.get("shape"), "nnz": info.get("nnz"),
        "sparsity": info.get("sparsity"), "nominal_sparsity": case.matrix.sparsity,
        "row_cov": info.get("row_cov"), "spec": None, "reason": None, "family": None,
        "ms": {}, "ms_min": {}, "error": None, "pass": False, "status": "failed",
        "checked_columns": None, "speedup": {"vs_cusparse": None, "vs_cublas": None},
        "baseline_error": {}, "note": None,
    }


def finalize(rec: dict) -> dict:
    """Set pass/status/speedup from what the measurement recorded.

    status "unsupported" (sparsegen declined) and "failed" (an exception) are kept; otherwise the
    case passes when its error is finite and within the dtype's tolerance, and so is every forced
    family's (--families). Where families were timed, the fastest (`fastest_family`) and the selected
    kernel's time over its time (`selected_vs_fastest`) are set.
    """
    for key in ("ms", "ms_min"):
        rec[key] = dict(rec.get(key) or {})
        for name in ("sparsegen", "cusparse", "cublas"):
            rec[key].setdefault(name, None)
    rec["speedup"] = speedups(rec["ms"])
    err = rec.get("error")
    if err is not None and not math.isfinite(err):
        rec["error"] = None
        rec["note"] = join_notes(rec.get("note"), "non-finite result")
        err = None
    if rec.get("status") in ("unsupported", "failed") and rec.get("_final_status"):
        rec["pass"] = False
    elif err is None:
        rec["pass"] = False
        rec["status"] = "failed"
        if rec.get("note") is None:
            rec["note"] = "no result"
    else:
        tol = TOLERANCE.get(rec["dtype"], 1e-5)
        wrong = [f"error {err:.3g} > tolerance {tol:g}"] if not err <= tol else []
        wrong += [f"{f} error {e:.3g} > tolerance {tol:g}" for f, e in (rec.get("family_error") or {}).items()
                  if e is not None and not e <= tol]  # NaN fails too
        rec["pass"] = not wrong
        rec["status"] = "ok" if rec["pass"] else "failed"
        for w in wrong:
            rec["note"] = join_notes(rec.get("note"), w)
    rec.pop("_final_status", None)
    if rec.get("family_ms"):
        best, best_ms = fastest_family(rec, TOLERANCE.get(rec["dtype"], 1e-5))
        rec["fastest_family"] = best
        rec["selected_vs_fastest"] = ratio(rec["ms"].get("sparsegen"), best_ms)
    return rec


# --------------------------------------------------------------------------- the run loop

def case_key(c) -> tuple:
    """Identity of a case, for a Case or a JSON record: (id, op, dtype, n, k)."""
    if isinstance(c, Case):
        return (c.id, c.op, c.dtype, c.n, c.k)
    return (c["id"], c["op"], c["dtype"], c.get("n"), c.get("k"))


def run(cfg, *, env: dict, executor=None, emit=print, checkpoint=None, clock=time.monotonic,
        previous: dict | None = None, prefetch_factory=None, scratch=None) -> dict:
    """Run the suite; returns the JSON document (also passed to `checkpoint` after each matrix).

    `executor` measures one case (default: `GpuExecutor`, which needs torch with CUDA);
    `emit` receives one progress line per case. `previous`: a document of an earlier run of the
    same plan (--resume): its cases are kept and only the missing ones run, so a suite longer
    than one sitting can be finished in several (`--max-minutes M --resume`). The coming matrices'
    kernels compile in `cfg.workers` processes while the GPU measures (`Prefetcher`; none with 0 or
    a given executor); `prefetch_factory(cases, root, arch)` makes another (tests).
    """
    work = plan(cfg)
    total = sum(len(c) for _, c in work)
    order = {case_key(c): i for i, c in enumerate(c for _, cs in work for c in cs)}
    doc = {
        "suite": NAME, "gpu": env.get("gpu"), "driver": env.get("driver"), "cuda": env.get("cuda"),
        "revision": env.get("revision"), "date": env.get("date"), "command": env.get("command"),
        "truncated": False, "cases_planned": total,
        "settings": {
            "quick": bool(cfg.quick), "ops": list(cfg.ops or OPS),
            "dtypes": list(cfg.dtypes or DTYPES),
            "n": list(cfg.ns or (QUICK_N if cfg.quick else N_VALUES)),
            "k": list(cfg.ks or (QUICK_K if cfg.quick else K_VALUES)),
            "limit": cfg.limit, "max_minutes": cfg.max_minutes,
            "families": (list(getattr(cfg, "families", None)) if getattr(cfg, "families", None) not in (None, "all")
                         else getattr(cfg, "families", None)),
            "tolerance": dict(TOLERANCE), "reference_limit": REFERENCE_LIMIT,
            "timing": {"min_runs": 20, "min_ms": 100, "warmup_runs": 3, "warmup_ms": 25},
        },
        "environment": {k: v for k, v in env.items()
                        if k not in ("gpu", "driver", "cuda", "revision", "date", "command")},
        "cases": [],
    }
    cases = doc["cases"]
    done = set()
    if previous:
        kept = [c for c in previous.get("cases", []) if case_key(c) in order and c.get("status") != "failed"]
        cases.extend(kept)
        done = {case_key(c) for c in kept}
        doc["runs"] = list(previous.get("runs") or [previous.get("command")]) + [doc["command"]]
    start = clock()
    deadline = start + 60.0 * cfg.max_minutes if cfg.max_minutes else None
    own = executor is None
    if not own:
        doc["baselines"] = getattr(executor, "baselines", {})
    elif previous:
        doc["baselines"] = previous.get("baselines", {})
    index = len(done)
    root = Path(scratch) if scratch is not None else prefetch.scratch_root(NAME)
    pending = [c for _, cs in work for c in cs if case_key(c) not in done]
    workers = getattr(cfg, "workers", None)
    workers = prefetch.default_workers() if workers is None else workers
    doc["settings"]["workers"] = workers if own or prefetch_factory else 0
    pf = None

    def compile_ahead():
        if prefetch_factory is not None:
            return prefetch_factory(pending, root, getattr(executor, "arch", None))
        if own and workers > 0 and pending:
            prefetch.clear_stale(root, [case_dir(root, c) for c in pending])
            return Prefetcher(pending, root, getattr(executor, "arch", None), workers,
                              device=getattr(executor, "device_model", None))
        return None

    def stop_now():
        return deadline is not None and clock() >= deadline

    try:
        for matrix, mcases in work:
            mcases = [c for c in mcases if case_key(c) not in done]
            if not mcases:
                continue
            if stop_now():
                break
            try:
                A = matrix.load()
            except Exception as exc:  # a matrix that cannot be read fails its cases, visibly
                info = {"shape": [matrix.rows, matrix.cols], "nnz": matrix.nnz,
                        "sparsity": matrix.sparsity, "row_cov": None}
                for case in mcases:
                    index += 1
                    rec = base_record(case, info)
                    rec["note"] = f"load failed: {message(exc)}"
                    rec["_final_status"] = True
                    cases.append(finalize(rec))
                    emit(progress_line(index, total, rec))
                continue
            info = matrix_info(A)
            if executor is None:  # made on first use: a finished --resume touches no GPU
                executor = GpuExecutor()
                doc["baselines"] = getattr(executor, "baselines", {})
            if pf is None:
                pf = compile_ahead()
            ctx = executor.matrix(A)
            try:
                for case in mcases:
                    if stop_now():
                        break
                    index += 1
                    rec = base_record(case, info)
                    folder = case_dir(root, case) if pf is not None else None
                    try:
                        ahead = pf.take(case) if pf is not None else None
                        if ahead is not None:
                            rec["prefetch_s"] = ahead.get("seconds")
                        with prefetch.cache_dir(folder):
                            rec.update(ctx.run(case))
                    except Exception as exc:
                        rec["status"] = "failed"
                        rec["_final_status"] = True
                        rec["note"] = join_notes(rec.get("note"), message(exc))
                    finally:
                        if pf is not None:
                            pf.release(case)
                    finalize(rec)
                    cases.append(rec)
                    emit(progress_line(index, total, rec))
                    if rec["status"] == "failed":
                        lost = executor.context_lost()
                        if lost:
                            doc["aborted"] = f"GPU context unusable after {rec['id']}: {lost}"
                            break
            finally:
                ctx.close()
                del A
            if doc.get("aborted") or stop_now():
                break
            if checkpoint is not None:
                _settle(doc, order, total, clock() - start)
                checkpoint(doc)
    except KeyboardInterrupt:
        doc["interrupted"] = True
    finally:
        if pf is not None:
            pf.close()
            doc["prefetch"] = pf.summary()
        if own and executor is not None:
            executor.close()
    _settle(doc, order, total, clock() - start)
    return doc


def _settle(doc, order, total, elapsed):
    """Cases in plan order; truncated when some planned case has no record."""
    doc["cases"].sort(key=lambda c: order.get(case_key(c), len(order)))
    doc["truncated"] = len({case_key(c) for c in doc["cases"]}) < total
    doc["elapsed_s"] = round(elapsed, 1)


def progress_line(index: int, total: int, rec: dict) -> str:
    def ms(name):
        v = (rec.get("ms") or {}).get(name)
        return "-" if v is None else f"{v:.4f}"

    def x(name):
        v = (rec.get("speedup") or {}).get(name)
        return "-" if v is None else f"{v:.2f}x"

    width = f"n={rec['n']}" if rec["op"] == "spmm" else f"k={rec['k']}"
    status = {"ok": "PASS", "failed": "FAIL", "unsupported": "UNSUPPORTED"}.get(rec["status"],
                                                                                 rec["status"])
    err = rec.get("error")
    parts = [f"[{index}/{total}]", rec["id"], rec["op"], rec["dtype"], width,
             rec.get("spec") or "-",
             f"sparsegen {ms('sparsegen')} ms",
             f"cusparse {ms('cusparse')} ms ({x('vs_cusparse')})"]
    if rec["op"] == "spmm":
        parts.append(f"cublas {ms('cublas')} ms ({x('vs_cublas')})")
    if rec.get("fastest_family"):
        parts.append(f"fastest {rec['fastest_family']} (selected {rec['selected_vs_fastest']:.2f}x its time)"
                     if rec.get("selected_vs_fastest") else f"fastest {rec['fastest_family']}")
    parts.append("err -" if err is None else f"err {err:.2e}")
    parts.append(status)
    if rec.get("note") and rec["status"] != "ok":
        parts.append(f"({rec['note'][:160]})")
    return "  ".join(parts)


