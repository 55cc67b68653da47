"""The float32 cost model: the CSR kernels, cuBLAS SGEMM (dense_gemm) and 3xTF32 tensor cores (dense_tile_spmm).

At 50-80 % sparsity a float32 layer multiplies faster dense: cuBLAS SGEMM (TF32 off) runs near
45 TFLOP/s of dense work on the H100, dense_tile_spmm (TF32 tensor cores at fp32 accuracy) near 53,
while the CSR kernels (csr_rowsplit, sputnik_spmm, panel_spmm) reach 1-10 TFLOP/s of useful work,
one X row fetched per nonzero. Four lines, least squares on log time:

    CSR kernels (the one selected):        7.80 us + 2 nnz n / 7.76 TFLOP/s
    cuBLAS SGEMM of the densified W:      12.8 us  + 2 m k n / 44.8 TFLOP/s
    dense_tile_spmm (3xTF32 tensor cores): 8.97 us + 2 m k n / 53.2 TFLOP/s
    dense_tile_spmm (3xFP16, where taken): 11.3 us + 2 m k n / 67.5 TFLOP/s

The CSR line is fitted to the 272 dlmc.json float32 SpMM cases that ran a CSR kernel (median error
13.5 %; the line it replaces, 11.0 us + 2 nnz n / 7.9 TFLOP/s from the family sweep of
probes/spmm_sweep_f32_families_even.json, had 25 % and over-predicted small layers), the SGEMM line
to that sweep, the tensor-core line to the kernel's own probe over the ten DLMC and random-square
shapes at n = 32-1024 (probes/dense_tile_spmm_probe.txt and dense_tile_spmm_probe_n32.txt; median
error 3.2 %; 0.91-1.46x cuBLAS SGEMM in the same runs).

The 3xFP16 line (dense_tile_spmm takes 3xFP16 from 1 GFLOP of dense work at n >= 256) is fitted to the
80 measured runs of that kernel: the 53 dlmc.json cases it served at 6dc2aa2 and 27 of the 48 fp32 cases of
probes/spmm_sweep_worst_f32.json where it was forced (median error 2.4 %, at most 9.8 %); the 3xTF32
line over-predicted them by 16 % (median; 6-25 %). Refitted on its 273 runs of those files and of
probes/spmm_sweep_dense_tile_vs_selection_narrow.json, the 3xTF32 line stays where it was
(8.68 us + 2 m k n / 53.3 TFLOP/s, median error 1.5 %).

The tensor cores are taken where predicted TENSOR_MARGIN times faster than both other lines: never
below 14.6 % density (7.76 / 53.2, the slopes' ratio; its intercept is the higher too), 11.5 % on the
3xFP16 line (7.76 / 67.5). Over the
344 float32 SpMM cases of dlmc.json, with the measured times of the kernel each rule picks, margin
1.1 gives 2.30x cuSPARSE against 2.13x before the family (1.0: 2.30x, 1.2: 2.28x; the faster of
the two per case, known in hindsight: 2.33x): 140 cases move, 13 of them run slower.
SGEMM is taken where predicted DENSE_MARGIN times faster than the CSR kernels and the tensor-core
line is not taken; with the lines as fitted the tensor cores are always ahead of SGEMM, so the
float32 dense_gemm path runs only when forced (or with TENSOR_MARGIN raised).
"""
from __future__ import annotations

from dataclasses import dataclass

SPARSE_LAUNCH_S = 7.80e-6
SPARSE_FLOPS = 7.76e12  # useful (2 nnz n) flops per second of the CSR kernels
DENSE_LAUNCH_S = 12.8e-6
DENSE_FLOPS = 44.8e12  # dense (2 m k n) flops per second of cuBLAS SGEMM, TF32 off
DENSE_MARGIN = 1.25  # dense must be predicted this many times faster
TENSOR_LAUNCH_S = 8.97e-6  # dense_tile_spmm: 3xTF32 tensor cores on the densified W
TENSOR_FLOPS = 53.2e12  # dense (2 m k n) flops per second
F16X3_LAUNCH_S = 11.3e-6  # dense_tile_spmm where it takes 3xFP16 (dense_tile_spmm.takes_f16x3)
F16X3_FLOPS = 67.5e12
TENSOR_MARGIN = 1.1  # the tensor-core kernel must be predicted this many times faster than the others
EPILOGUE_S = 4.0e-6  # the dense path's bias/ReLU pass: one more launch ...
EPILOGUE_BYTES_PER_S = 2.5e12  # ... reading and writing Y


@dataclass(frozen=True)
class Fp32Verdict:
    pick: str  # "sparse" (the CSR kernels), "sgemm" (dense_gemm) or "tensor" (dense_tile_spmm)
    sparse_s: float
    dense_s: float
    tensor_s: float
    tensor_mma: str = "3xTF32"  # the products dense_tile_spmm would run: "3xTF32" or "3xFP16"

    @property
    def dense(self) -> bool:
        """cuBLAS SGEMM (the dense_gemm fallback) should serve this request."""
        return self.pick == "sgemm"

    @property
    def text(self) -> str:
        return (f"CSR kernels {self.sparse_s * 1e3:.3g} ms, dense cuBLAS SGEMM {self.dense_s * 1e3:.3g} ms, "
                f"{self.tensor_mma} tensor cores {self.tensor_s * 1e3:.3g} ms predicted (SGEMM taken when {DENSE_MARGIN:g}x "
                f"faster than the CSR kernels, tensor cores when {TENSOR_MARGIN:g}x faster than both)")


def sparse_seconds(nnz: int, n: int) -> float:
    return SPARSE_LAUNCH_S + 2.0 * nnz * n / SPARSE_FLOPS


def dense_seconds(m: int, k: int, n: int, epilogue: bool = False) -> float:
    """The GEMM, plus the separate pass over Y when bias or ReLU is asked (the CSR kernels fuse them)."""
    seconds = DENSE_LAUNCH_S + 2.0 * m * k * n / DENSE_FLOPS
    return seconds + (EPILOGUE_S + 8.0 * m * n / EPILOGUE_BYTES_PER_S if epilogue else 0.0)


def f16x3_taken(m: int, k: int, n: int) -> bool:
    """Whether dense_tile_spmm would multiply this product with 3xFP16 (its own rule)."""
    from .dense_tile_spmm import takes_f16x3  # imported here: that family imports this module

    return takes_f16x3(m, k, n)


def tensor_seconds(m: int, k: int, n: int, f16x3: bool | None = None) -> float:
    """dense_tile_spmm (its epilogue is fused), on the line of the products it takes there."""
    if f16x3 is None:
        f16x3 = f16x3_taken(m, k, n)
    if f16x3:
        return F16X3_LAUNCH_S + 2.0 * m * k * n / F16X3_FLOPS
    return TENSOR_LAUNCH_S + 2.0 * m * k * n / TENSOR_FLOPS


def judge(stats, n: int, epilogue: bool = False) -> Fp32Verdict:
    (m, k), nnz = stats.shape, stats.nnz
    f16x3 = f16x3_taken(m, k, n)
    sparse, dense, tensor = sparse_seconds(nnz, n), dense_seconds(m, k, n, epilogue), tensor_seconds(m, k, n, f16x3)
    if tensor * TENSOR_MARGIN < min(sparse, dense):
        pick = "tensor"
    elif dense * DENSE_MARGIN < sparse:
        pick = "sgemm"
    else:
        pick = "sparse"
    return Fp32Verdict(pick, sparse, dense, tensor, "3xFP16" if f16x3 else "3xTF32")
