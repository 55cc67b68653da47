"""Dense: W as a row-major M x K array of 16-bit bit patterns (fp16 or bf16), zeros included.

The `dense_gemm` fallback's layout: cuBLAS multiplies it as it is. Built by scattering the
nonzeros into a zeroed array, never through a float32 copy of the whole matrix.
"""
from __future__ import annotations

import numpy as np

from . import Plan
from .halfbits import from_bits, round_to, to_bits

NAME = "dense"


def encode(csr, dtype: str, bias=None) -> Plan:
    """`dtype` "float16" or "bfloat16"; `bias` (M,) float32 or None, kept for the epilogue."""
    m, k = (int(d) for d in csr.shape)
    nnz = int(csr.nnz)
    w = np.zeros((m, k), dtype=np.uint16)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(np.asarray(csr.indptr, dtype=np.int64)))
    w[rows, np.asarray(csr.indices[:nnz], dtype=np.int64)] = to_bits(csr.data[:nnz], dtype)
    arrays = {"w": w}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return Plan(NAME, arrays, {"m": m, "k": k, "dtype": dtype})


def spmm(plan: Plan, x, *, bias: bool, relu: bool) -> np.ndarray:
    """W·X as the fallback computes it: cuBLAS accumulates in fp32 and rounds Y to the 16-bit dtype;
    then, with bias or ReLU, the epilogue kernel reads that Y, adds the fp32 bias, clamps, and rounds
    again. X is float16 for fp16 plans and float32 holding bf16 values for bf16 (NumPy has no
    bfloat16); Y is float16, or float32 holding bf16-rounded values."""
    dtype = plan.constants["dtype"]
    xs = round_to(np.asarray(x, dtype=np.float32), dtype)
    y = round_to(from_bits(plan.arrays["w"], dtype) @ xs, dtype)
    if bias:
        y = round_to(y + plan.arrays["bias"][:, None], dtype)
    if relu:
        np.maximum(y, 0.0, out=y)
    return y.astype(np.float16) if dtype == "float16" else y
