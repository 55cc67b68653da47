"""The float32 cost model: the CSR kernels, cuBLAS SGEMM (dense_gemm) and 3xTF32 / 3xFP16 tensor
cores (dense_tile_spmm).

At 50-80 % sparsity a float32 layer multiplies faster dense: cuBLAS SGEMM (TF32 off) and
dense_tile_spmm compute the zeros at tens of TFLOP/s of dense work, while the CSR kernels reach a few
TFLOP/s of useful work, one X row fetched per nonzero. Four lines, each a launch time plus flops
at a rate (the rates file's `fp32` group; docs/decisions/001-rates-files.md says what they were
fitted to):

    CSR kernels (the one selected):        csr.launch_s    + 2 nnz n / csr.flops
    cuBLAS SGEMM of the densified W:       sgemm.launch_s  + 2 m k n / sgemm.flops (+ the epilogue pass)
    dense_tile_spmm, 3xTF32 tensor cores:  tf32x3.launch_s + 2 m k n / tf32x3.flops
    dense_tile_spmm, 3xFP16 (where taken): f16x3.launch_s  + 2 m k n / f16x3.flops

The tensor cores are taken where predicted `tensor_margin` times faster than both other lines; SGEMM
where predicted `sgemm_margin` times faster than the CSR kernels and the tensor cores are not taken.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..families.dense_tile_spmm import takes_f16x3


@dataclass(frozen=True)
class Fp32Verdict:
    pick: str  # "sparse" (the CSR kernels), "sgemm" (dense_gemm) or "tensor" (dense_tile_spmm)
    sparse_s: float
    dense_s: float
    tensor_s: float
    tensor_mma: str = "3xTF32"  # the products dense_tile_spmm would run: "3xTF32" or "3xFP16"
    sgemm_margin: float = 1.0
    tensor_margin: float = 1.0
    rates: str = ""  # the rates file's label

    @property
    def dense(self) -> bool:
        """cuBLAS SGEMM (the dense_gemm fallback) should serve this request."""
        return self.pick == "sgemm"

    @property
    def text(self) -> str:
        return (f"CSR kernels {self.sparse_s * 1e3:.3g} ms, dense cuBLAS SGEMM {self.dense_s * 1e3:.3g} ms, "
                f"{self.tensor_mma} tensor cores {self.tensor_s * 1e3:.3g} ms predicted (SGEMM taken when "
                f"{self.sgemm_margin:g}x faster than the CSR kernels, tensor cores when {self.tensor_margin:g}x "
                f"faster than both; rates {self.rates})")


def sparse_seconds(nnz: int, n: int, rates) -> float:
    line = rates.fp32.csr
    return line.launch_s + 2.0 * nnz * n / line.flops


def dense_seconds(m: int, k: int, n: int, rates, epilogue: bool = False) -> float:
    """The GEMM, plus the separate pass over Y when bias or ReLU is asked (the CSR kernels fuse them)."""
    f = rates.fp32
    seconds = f.sgemm.launch_s + 2.0 * m * k * n / f.sgemm.flops
    return seconds + (f.epilogue_s + 8.0 * m * n / f.epilogue_bytes_per_s if epilogue else 0.0)


def tensor_seconds(m: int, k: int, n: int, rates, f16x3: bool | None = None) -> float:
    """dense_tile_spmm (its epilogue is fused), on the line of the products it takes there."""
    if f16x3 is None:
        f16x3 = takes_f16x3(m, k, n)
    line = rates.fp32.f16x3 if f16x3 else rates.fp32.tf32x3
    return line.launch_s + 2.0 * m * k * n / line.flops


def judge(stats, n: int, rates, epilogue: bool = False) -> Fp32Verdict:
    (m, k), nnz = stats.shape, stats.nnz
    f16x3 = takes_f16x3(m, k, n)
    sparse, dense = sparse_seconds(nnz, n, rates), dense_seconds(m, k, n, rates, epilogue)
    tensor = tensor_seconds(m, k, n, rates, f16x3)
    f = rates.fp32
    if tensor * f.tensor_margin < min(sparse, dense):
        pick = "tensor"
    elif dense * f.sgemm_margin < sparse:
        pick = "sgemm"
    else:
        pick = "sparse"
    return Fp32Verdict(pick, sparse, dense, tensor, "3xFP16" if f16x3 else "3xTF32", f.sgemm_margin,
                       f.tensor_margin, rates.label)
