"""The `dlmc` suite's GPU side: one matrix's device copies and its SpMM and SDDMM cases, measured
by the shared executor (bench/executor.py) against cuSPARSE, cuBLAS and CuPy.

SpMM: X (K x n) N(0, 1), seeded; checked on all columns, or on a seeded sample of
SPMM_CHECK_COLUMNS where the float64 reference would pass REFERENCE_LIMIT multiply-adds. SDDMM:
A (M x k) and B (N x k) likewise, checked on all nonzeros or a sample of SDDMM_CHECK_NNZ. With
families to force (--families), each is compiled, checked and timed like the selected kernel,
its times under "family_ms" / "family_ms_min".
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsegen.bench import executor
from sparsegen.bench.records import join_notes, message, relative_error, seed_for
from sparsegen.errors import SparsegenError
from sparsegen.dtypes import WITH_NUMPY

TOLERANCE = {"float32": 1e-5, "float16": 1e-2}
# Above this many multiply-adds the scipy reference is computed on a sample only.
REFERENCE_LIMIT = 4e8
SPMM_CHECK_COLUMNS = 64
SDDMM_CHECK_NNZ = 1 << 20
FAMILY_TIMES = ("family_ms", "family_ms_min")

_NP_DTYPES = {name: np.dtype(name) for name in WITH_NUMPY}


class GpuExecutor(executor.GpuExecutor):
    """The shared executor with CuPy's baselines, measuring one matrix at a time (`matrix(A)`)."""

    def __init__(self, timer=None):
        super().__init__(timer=timer, cupy=True)
        self.baselines.update({
            "cusparse": "torch.mm(torch.sparse_csr_tensor(int32 crow, int32 col, values), X)",
            "cublas": "torch.matmul(dense A, X), TF32 off for float32",
            "cusparse_sddmm": "torch.sparse.sampled_addmm(CSR int32 pattern, A, B.t(), beta=0)"
                              + (" and cupyx.cusparse.sddmm" if self.cupy_sddmm else ""),
            "cupy": getattr(self.cupy, "__version__", None),
            "families": "sparsegen.compile(A, options={'family': name}) for each name (--families)",
        })

    def matrix(self, A):
        return _GpuMatrix(self, A)


def as_stored(A: sp.csr_matrix, dtype: str) -> sp.csr_matrix:
    """A with its values as `dtype` holds them (float32 storage): what every sparsegen kernel of the
    case is compiled for, here and in the compile-ahead workers alike."""
    stored = A.copy()
    stored.data = A.data.astype(_NP_DTYPES[dtype]).astype(np.float32)
    return stored


class _GpuMatrix:
    """The GPU copies of one matrix (per dtype, made on first use) and its cases."""

    def __init__(self, ex: GpuExecutor, A: sp.csr_matrix):
        self.ex = ex
        self.A = A
        self._dtype = None
        self._t = {}

    # one dtype's copies at a time; cases of a matrix come grouped by dtype
    def tensors(self, dtype: str) -> dict:
        if self._dtype == dtype:
            return self._t
        self._release()
        torch = self.ex.torch
        dev = self.ex.device
        A = self.A
        Ad = as_stored(A, dtype)
        crow = torch.from_numpy(A.indptr.astype(np.int32)).to(dev)
        col = torch.from_numpy(A.indices.astype(np.int32)).to(dev)
        vals = torch.from_numpy(A.data.astype(_NP_DTYPES[dtype])).to(dev)
        sparse = torch.sparse_csr_tensor(crow, col, vals, size=A.shape)
        self._t = {"A": Ad, "A64": Ad.astype(np.float64), "crow": crow, "col": col, "vals": vals,
                   "sparse": sparse, "dense": None}
        self._dtype = dtype
        return self._t

    def dense(self):
        t = self._t
        if t["dense"] is None:
            t["dense"] = t["sparse"].to_dense()
        return t["dense"]

    def run(self, case) -> dict:
        if case.op == "spmm":
            return self._spmm(case)
        if case.op == "sddmm":
            return self._sddmm(case)
        raise SparsegenError(f"unknown op {case.op!r}")

    # ------------------------------------------------------------------ SpMM
    def _spmm(self, case) -> dict:
        ex, torch = self.ex, self.ex.torch
        t = self.tensors(case.dtype)
        A64 = t["A64"]
        M, K = A64.shape
        n = case.n
        rng = np.random.default_rng(seed_for(case.id, "X", n))
        X = rng.standard_normal((K, n)).astype(_NP_DTYPES[case.dtype])  # cast first: both see it
        if A64.nnz * n > REFERENCE_LIMIT:
            cols = np.sort(rng.choice(n, size=min(SPMM_CHECK_COLUMNS, n), replace=False))
        else:
            cols = np.arange(n)
        ref = np.asarray(A64 @ X[:, cols].astype(np.float64))
        x = torch.from_numpy(X).to(ex.device).contiguous()
        cols_t = torch.from_numpy(cols).to(ex.device)

        def check_torch(y):
            return relative_error(y.index_select(1, cols_t).double().cpu().numpy(), ref)

        rec = {"ms": {}, "ms_min": {}, "baseline_error": {}, "checked_columns": int(len(cols))}
        self._sparsegen(rec, case, case.request,
                        lambda r, name, k, times: ex.measure_spmm(r, name, k, x, check_torch, M, times=times))
        A_sp = t["sparse"]
        ex.baseline(rec, "cusparse", lambda: torch.mm(A_sp, x), check_torch)
        dense = self.dense()
        ex.baseline(rec, "cublas", lambda: torch.matmul(dense, x), check_torch)
        if ex.cupy is not None:
            self._cupy_spmm(rec, case, t, x, cols, ref)
        return rec

    def _sparsegen(self, rec, case, request, measure):
        """The selected kernel, then each family the case forces: compiled, checked, timed.
        `measure(rec, name, kernel, times)` measures one kernel and returns its error."""
        ex = self.ex
        kern = ex.compile(rec, "sparsegen", self._t["A"], **request)
        if kern is not None:
            rec["spec"], rec["family"] = kern.spec.name, kern.spec.family
            rec["reason"] = getattr(kern.selection, "reason", None)
            rec["error"] = measure(rec, "sparsegen", kern, ("ms", "ms_min"))
        if case.families:
            ex.time_families(rec, self._t["A"], request, case.families, kern,
                             lambda name, k: measure(rec, name, k, FAMILY_TIMES),
                             times=FAMILY_TIMES, quiet_decline=True)

    def _cupy_spmm(self, rec, case, t, x, cols, ref):
        cp = self.ex.cupy
        import cupyx.scipy.sparse as csp

        try:
            stream = cp.cuda.ExternalStream(self.ex.torch.cuda.current_stream().cuda_stream)
            with stream:
                cA = csp.csr_matrix((cp.asarray(t["vals"]), cp.asarray(t["col"]),
                                     cp.asarray(t["crow"])), shape=t["A"].shape)
                cx = cp.asarray(x)
        except Exception as exc:
            rec.setdefault("baseline_notes", {})["cupy_csr"] = message(exc)
            return

        def fn():
            with stream:
                return cA @ cx

        cols_c = cp.asarray(cols)

        def check(y):
            return relative_error(cp.asnumpy(y[:, cols_c]).astype(np.float64), ref)

        self.ex.baseline(rec, "cupy_csr", fn, check)

    # ------------------------------------------------------------------ SDDMM
    def _sddmm(self, case) -> dict:
        ex, torch = self.ex, self.ex.torch
        t = self.tensors(case.dtype)
        P = t["A"]
        M, N = P.shape
        k = case.k
        nnz = P.nnz
        rng = np.random.default_rng(seed_for(case.id, "AB", k))
        npd = _NP_DTYPES[case.dtype]
        Ah = rng.standard_normal((M, k)).astype(npd)
        Bh = rng.standard_normal((N, k)).astype(npd)
        if nnz * k > REFERENCE_LIMIT:
            idx = np.sort(rng.choice(nnz, size=min(SDDMM_CHECK_NNZ, nnz), replace=False))
        else:
            idx = np.arange(nnz)
        rows_of = np.repeat(np.arange(M, dtype=np.int64), np.diff(P.indptr))
        ref = sddmm_reference(Ah, Bh, rows_of[idx], P.indices[idx])
        a = torch.from_numpy(Ah).to(ex.device).contiguous()
        b = torch.from_numpy(Bh).to(ex.device).contiguous()
        idx_t = torch.from_numpy(idx).to(ex.device)

        def check_vals(v):
            return relative_error(v.reshape(-1).index_select(0, idx_t).double().cpu().numpy(), ref)

        rec = {"ms": {}, "ms_min": {}, "baseline_error": {}, "checked_columns": None,
               "checked_nnz": int(len(idx))}
        self._sparsegen(rec, case, case.request,
                        lambda r, name, kern, times: ex.measure(r, name, lambda: kern(a, b), check_vals, times=times))
        pattern = t["sparse"]
        bt = b.t()
        ex.baseline(rec, "cusparse_torch",
                    lambda: torch.sparse.sampled_addmm(pattern, a, bt, beta=0.0, alpha=1.0),
                    lambda r: check_vals(r.values()))
        if "cusparse_torch" not in rec["ms"] and case.dtype == "float32":
            # some torch builds take only int64 CSR indices here: time that, and say so
            p64 = torch.sparse_csr_tensor(t["crow"].long(), t["col"].long(), t["vals"], size=P.shape)
            ex.baseline(rec, "cusparse_torch",
                        lambda: torch.sparse.sampled_addmm(p64, a, bt, beta=0.0, alpha=1.0),
                        lambda r: check_vals(r.values()))
            if "cusparse_torch" in rec["ms"]:
                rec["note"] = join_notes(rec.get("note"), "sampled_addmm with int64 indices")
        if ex.cupy_sddmm is not None:
            self._cupy_sddmm(rec, t, a, b, check_vals)
        self._claim_fastest_sddmm_baseline(rec, TOLERANCE.get(case.dtype, 1e-5))
        return rec

    @staticmethod
    def _claim_fastest_sddmm_baseline(rec, tol):
        """cuSPARSE for SDDMM: the faster of the baselines whose answer passed the check."""
        best = None
        for name in ("cusparse_torch", "cusparse_cupy"):
            ms = rec["ms"].get(name)
            err = rec["baseline_error"].get(name)
            if ms is not None and err is not None and err <= tol and (best is None or ms < best[1]):
                best = (name, ms)
        if best is not None:
            rec["ms"]["cusparse"] = rec["ms"][best[0]]
            rec["ms_min"]["cusparse"] = rec["ms_min"][best[0]]
            rec["cusparse_path"] = best[0]

    def _cupy_sddmm(self, rec, t, a, b, check_vals):
        cp = self.ex.cupy
        import cupyx.scipy.sparse as csp

        try:
            stream = cp.cuda.ExternalStream(self.ex.torch.cuda.current_stream().cuda_stream)
            with stream:
                ca, cbt = cp.asarray(a), cp.asarray(b).T
                cc = csp.csr_matrix((cp.asarray(t["vals"]).copy(), cp.asarray(t["col"]),
                                     cp.asarray(t["crow"])), shape=t["A"].shape)
        except Exception as exc:
            rec.setdefault("baseline_notes", {})["cusparse_cupy"] = message(exc)
            return
        sddmm = self.ex.cupy_sddmm

        def fn():
            with stream:
                r = sddmm(ca, cbt, cc, alpha=1.0, beta=0.0)
            return cc if r is None else r

        def check(r):
            return check_vals(self.ex.torch.as_tensor(r.data, device=self.ex.device))

        self.ex.baseline(rec, "cusparse_cupy", fn, check)

    # ------------------------------------------------------------------
    def _release(self):
        self._t = {}
        self._dtype = None

    def close(self):
        self._release()
        self.A = None
        self.ex.torch.cuda.empty_cache()


def sddmm_reference(A, B, rows, cols, *, chunk_elems: int = 1 << 24) -> np.ndarray:
    """vals[j] = A[rows[j]] . B[cols[j]] in float64, chunked to bound memory."""
    A64 = np.asarray(A, dtype=np.float64)
    B64 = np.asarray(B, dtype=np.float64)
    k = A64.shape[1]
    out = np.empty(len(rows), dtype=np.float64)
    step = max(1, chunk_elems // max(k, 1))
    for s in range(0, len(rows), step):
        e = min(len(rows), s + step)
        out[s:e] = np.einsum("ij,ij->i", A64[rows[s:e]], B64[cols[s:e]])
    return out
