"""The float32 cost model behind the dense fallback: the CSR kernels against cuBLAS SGEMM.

At 50-70 % sparsity a float32 layer multiplies faster dense: cuBLAS SGEMM (TF32 off) runs near
45 TFLOP/s of dense work on the H100, while the CSR kernels (csr_rowsplit, sputnik_spmm, panel_spmm)
reach 1-10 TFLOP/s of useful work, one X row fetched per nonzero. Two lines, fitted to the H100
sweep of every DLMC matrix at n = 32, 128, 256, 1024 with each family and cuBLAS timed in the same
process (benchmarks/results/h100-80gb-hbm3/probes/spmm_sweep_f32_families_even.json, the
even-numbered matrices, and half the random squares of dlmc.json; least squares on log time):

    CSR kernels (the one selected):  11.0 us + 2 nnz n / 7.9 TFLOP/s
    cuBLAS SGEMM of the densified W: 12.8 us + 2 m k n / 44.8 TFLOP/s

Dense is taken only where predicted DENSE_MARGIN times faster: a dense pick where the sparse kernel
was in fact faster cost up to 1.5x on the random squares at margin 1. On the held-out odd-numbered
matrices the fallback lifts the geomean over cuSPARSE of the selected kernels from 1.64x to 1.76x
(the best of the two, known in hindsight: 1.85x), and no case runs slower than the sparse kernel
selected before it (probes/README.md, "fp32 dense fallback").
"""
from __future__ import annotations

from dataclasses import dataclass

SPARSE_LAUNCH_S = 11.0e-6
SPARSE_FLOPS = 7.9e12  # useful (2 nnz n) flops per second of the CSR kernels
DENSE_LAUNCH_S = 12.8e-6
DENSE_FLOPS = 44.8e12  # dense (2 m k n) flops per second of cuBLAS SGEMM, TF32 off
DENSE_MARGIN = 1.25  # dense must be predicted this many times faster
EPILOGUE_S = 4.0e-6  # the dense path's bias/ReLU pass: one more launch ...
EPILOGUE_BYTES_PER_S = 2.5e12  # ... reading and writing Y


@dataclass(frozen=True)
class Fp32Verdict:
    dense: bool  # the fallback should serve this request
    sparse_s: float
    dense_s: float

    @property
    def text(self) -> str:
        return (f"CSR kernels {self.sparse_s * 1e3:.3g} ms, dense cuBLAS SGEMM {self.dense_s * 1e3:.3g} ms predicted "
                f"(dense taken when {DENSE_MARGIN:g}x faster)")


def sparse_seconds(nnz: int, n: int) -> float:
    return SPARSE_LAUNCH_S + 2.0 * nnz * n / SPARSE_FLOPS


def dense_seconds(m: int, k: int, n: int, epilogue: bool = False) -> float:
    """The GEMM, plus the separate pass over Y when bias or ReLU is asked (the CSR kernels fuse them)."""
    seconds = DENSE_LAUNCH_S + 2.0 * m * k * n / DENSE_FLOPS
    return seconds + (EPILOGUE_S + 8.0 * m * n / EPILOGUE_BYTES_PER_S if epilogue else 0.0)


def judge(stats, n: int, epilogue: bool = False) -> Fp32Verdict:
    (m, k), nnz = stats.shape, stats.nnz
    sparse, dense = sparse_seconds(nnz, n), dense_seconds(m, k, n, epilogue)
    return Fp32Verdict(dense * DENSE_MARGIN < sparse, sparse, dense)
