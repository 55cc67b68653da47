"""The `llm` suite's GPU side: one W's device copies and its cases, measured by the shared executor
(bench/executor.py): the selected kernel, each tensor-core family forced, cuBLAS and cuSPARSE.

Correctness: CHECK_ROWS seeded output rows (all N columns) of every sparsegen kernel against
float64 scipy. Bytes moved: the kernel's plan (its encoding) + X + Y; cuBLAS dense W + X + Y;
cuSPARSE int32 CSR + X + Y.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsegen.bench import executor, prefetch
from sparsegen.bench.llm_report import BITMAP, CHECK_ROWS, CSL, LANES
from sparsegen.bench.records import relative_error, seed_for
from sparsegen.bench.weights import as_dtype

FAMILIES = (CSL, BITMAP, LANES)
CUSPARSE_CAP_MS = 250.0  # a cuSPARSE launch slower than this is timed once, not 20 times


def check_rows(case, m: int) -> np.ndarray:
    """A seeded sorted sample of CHECK_ROWS output rows (all rows when there are fewer)."""
    if m <= CHECK_ROWS:
        return np.arange(m, dtype=np.int64)
    rng = np.random.default_rng(seed_for(case.id, case.dtype, case.n, "rows"))
    return np.sort(rng.choice(m, size=CHECK_ROWS, replace=False)).astype(np.int64)


def operand(case, k: int) -> np.ndarray:
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




class GpuExecutor(executor.GpuExecutor):
    """The shared executor, measuring one W at a time (`weight(A)`), L2 flushed before every timed
    launch: a model's forward pass reads each W once, from DRAM."""
    cold_l2 = True

    def __init__(self, *, cusparse: bool = True, timer=None):
        super().__init__(cusparse=cusparse, timer=timer)
        self.baselines.update({
            "cublas": "torch.matmul(dense W, X) (cuBLAS, tensor cores for float16/bfloat16)",
            "cusparse": ("torch.mm(torch.sparse_csr_tensor(int32 crow, int32 col, values), X)"
                         if cusparse else "skipped (--no-cusparse)"),
            "families": {f: f"sparsegen.compile(W, options={{'family': '{f}'}})" for f in FAMILIES},
        })

    def weight(self, A):
        return _GpuWeight(self, A)


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
        tdt = getattr(torch, dtype)  # torch names the dtypes as sparsegen.dtypes does
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

    def run(self, case, cache=None) -> dict:
        ex, torch = self.ex, self.ex.torch
        t = self.tensors(case.dtype)
        A = t["A"]
        M, K = A.shape
        n = case.n
        X = operand(case, K)
        rows = check_rows(case, M)
        ref = reference_rows(A, X, rows)
        x = torch.from_numpy(X).to(ex.device).to(t["dtype"]).contiguous()
        rows_t = torch.from_numpy(rows).to(ex.device)

        def check(y):
            return relative_error(y.index_select(0, rows_t).double().cpu().numpy(), ref)

        rec = {"ms": {}, "ms_min": {}, "baseline_error": {}, "family_error": {}, "family_spec": {},
               "bytes": {}, "timing": {}, "compile_s": {}, "plan_cached": {},
               "checked_rows": int(len(rows)), "checked_columns": int(n)}
        io_bytes = operand_bytes(M, K, n)
        request = {"op": "spmm", "n": n, "dtype": case.dtype}
        with prefetch.cache_dir(cache):
            kern = ex.compile(rec, "sparsegen", A, **request)
            if kern is not None:
                rec["spec"], rec["family"] = kern.spec.name, kern.spec.family
                rec["reason"] = getattr(kern.selection, "reason", None)
                rec["bytes"]["sparsegen"] = kern.plan.nbytes + io_bytes
                rec["error"] = ex.measure_spmm(rec, "sparsegen", kern, x, check, M)

            def count_bytes(name, k):
                rec["bytes"][name] = k.plan.nbytes + io_bytes

            ex.time_families(rec, A, request, FAMILIES, kern,
                             lambda name, k: ex.measure_spmm(rec, name, k, x, check, M), on_kernel=count_bytes)
            del kern
        dense, A_sp = t["dense"], t["sparse"]
        rec["bytes"]["cublas"] = dense_bytes(M, K, n)
        ex.baseline(rec, "cublas", lambda: torch.matmul(dense, x), check)
        if ex.cusparse:
            rec["bytes"]["cusparse"] = csr_bytes(M, K, n, A.nnz)
            ex.baseline(rec, "cusparse", lambda: torch.mm(A_sp, x), check, cap_ms=CUSPARSE_CAP_MS)
        return rec

    def close(self):
        self._t = {}
        self.A = None
        self.ex.torch.cuda.empty_cache()
