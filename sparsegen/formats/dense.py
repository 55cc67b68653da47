"""Dense: W as a row-major M x K array, zeros included: 16-bit bit patterns (fp16 or bf16) or float32.

The `dense_gemm` fallback's layout: cuBLAS multiplies it as it is. Built by scattering the
nonzeros into a zeroed array, never through a float32 copy of the whole matrix.
"""
from __future__ import annotations

import numpy as np

from . import Plan
from .halfbits import from_bits, round_to, to_bits

NAME = "dense"


def encode(csr, dtype: str, bias=None) -> Plan:
    """`dtype` "float16", "bfloat16" or "float32"; `bias` (M,) float32 or None, kept for the epilogue."""
    m, k = (int(d) for d in csr.shape)
    nnz = int(csr.nnz)
    half = dtype != "float32"
    w = np.zeros((m, k), dtype=np.uint16 if half else np.float32)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(np.asarray(csr.indptr, dtype=np.int64)))
    values = to_bits(csr.data[:nnz], dtype) if half else np.asarray(csr.data[:nnz], dtype=np.float32)
    w[rows, np.asarray(csr.indices[:nnz], dtype=np.int64)] = values
    arrays = {"w": w}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return Plan(NAME, arrays, {"m": m, "k": k, "dtype": dtype})


def spmm(plan: Plan, x, *, bias: bool, relu: bool) -> np.ndarray:
    """W·X as the fallback computes it: cuBLAS accumulates in fp32 and rounds Y to the 16-bit dtype;
    then, with bias or ReLU, the epilogue kernel reads that Y, adds the fp32 bias, clamps, and rounds
    again. X is float16 for fp16 plans and float32 holding bf16 values for bf16 (NumPy has no
    bfloat16); Y is float16, or float32 holding bf16-rounded values. float32 plans: all float32."""
    dtype = plan.constants["dtype"]
    xs = round_to(np.asarray(x, dtype=np.float32), dtype)
    w = plan.arrays["w"] if dtype == "float32" else from_bits(plan.arrays["w"], dtype)
    y = round_to(w @ xs, dtype)
    if bias:
        y = round_to(y + plan.arrays["bias"][:, None], dtype)
    if relu:
        np.maximum(y, 0.0, out=y)
    return y.astype(np.float16) if dtype == "float16" else y
