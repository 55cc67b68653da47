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


# ---- float32 W as two fp16 planes (dense_tile_spmm's 3xFP16 products) ---------------------------
SPLIT_ROW_MAX_EXP = 15  # each row of W is scaled by a power of two to a largest magnitude in [2^14, 2^15)
SPLIT_K_ALIGN = 8  # the planes' rows are padded with zeros to a multiple of 8 halves: 16-byte copies


def split_row_length(k: int) -> int:
    """The planes' row length: K padded to whole 16-byte copies."""
    return -(-max(k, 1) // SPLIT_K_ALIGN) * SPLIT_K_ALIGN


def scale_exponents(largest, empty: int) -> np.ndarray:
    """Per largest magnitude the s with largest 2^s in [2^14, 2^15) (`empty` where it is 0), clamped to
    [-126, 126] so that 2^s and 2^-s are normal float32 numbers: the rule for W's rows here and for X's
    columns per slice in the kernel (its `141 - biased exponent`)."""
    largest = np.asarray(largest, dtype=np.float64)
    _, exponent = np.frexp(largest)  # largest in [2^(e-1), 2^e)
    return np.clip(np.where(largest > 0, SPLIT_ROW_MAX_EXP - exponent, empty), -126, 126).astype(np.int32)


def row_scale_exponents(csr, rows) -> np.ndarray:
    """scale_exponents of each row's largest magnitude, 0 for an empty row; `rows` holds each stored
    entry's row."""
    row_max = np.zeros(int(csr.shape[0]), dtype=np.float64)
    np.maximum.at(row_max, rows, np.abs(np.asarray(csr.data[:int(csr.nnz)], dtype=np.float64)))
    return scale_exponents(row_max, 0)


def encode_split_f16(csr, bias=None) -> Plan:
    """W for 3xFP16 tensor-core products: each row scaled by 2^s (row_scale_exponents), then split
    into w_hi = fp16(w 2^s) and w_lo = fp16(w 2^s - w_hi), both M x K_PAD uint16 bit patterns (about
    22 significant bits between them, as 3xTF32 keeps); `w_inv` holds 2^-s per row (float32, exact),
    which the kernel multiplies into each row's sums. The scale keeps a row's values inside fp16's range
    and its large ones normal: a value below 2^-24 of its row's largest loses bits, at most 2^-39 of
    that largest in absolute terms."""
    m, k = (int(d) for d in csr.shape)
    nnz = int(csr.nnz)
    k_pad = split_row_length(k)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(np.asarray(csr.indptr, dtype=np.int64)))
    s = row_scale_exponents(csr, rows)
    scaled = np.ldexp(np.asarray(csr.data[:nnz], dtype=np.float64), s[rows])  # exact: a power of two
    hi = scaled.astype(np.float16)
    lo = (scaled - hi.astype(np.float64)).astype(np.float16)  # the remainder is exact in float64
    cols = np.asarray(csr.indices[:nnz], dtype=np.int64)
    w_hi = np.zeros((m, k_pad), dtype=np.uint16)
    w_lo = np.zeros((m, k_pad), dtype=np.uint16)
    w_hi[rows, cols] = hi.view(np.uint16)
    w_lo[rows, cols] = lo.view(np.uint16)
    arrays = {"w_hi": w_hi, "w_lo": w_lo, "w_inv": np.ldexp(np.ones(m, dtype=np.float32), -s).astype(np.float32)}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return Plan("dense_f16x3", arrays, {"m": m, "k": k, "k_pad": k_pad, "dtype": "float32"})


def split_columns_f16(x, slice_k: int):
    """X (K x N float32) as the 3xFP16 kernel splits it: per slice of `slice_k` rows and per column, a
    power of two brings the largest magnitude into [2^14, 2^15) (as for W's rows); returns (hi, lo,
    inv) with hi, lo (slices, slice_k, N) float64 holding fp16 values and inv (slices, 1, N) the 2^-s."""
    x = np.asarray(x, dtype=np.float32)
    k, n = x.shape
    slices = -(-k // slice_k)
    padded = np.zeros((slices * slice_k, n), dtype=np.float32)
    padded[:k] = x
    blocks = padded.reshape(slices, slice_k, n)
    s = scale_exponents(np.abs(blocks).max(axis=1, keepdims=True), 126)  # an all-zero column: as the kernel
    scaled = (blocks * np.ldexp(np.float32(1.0), s).astype(np.float32)).astype(np.float32)  # fp32, as the kernel
    hi = scaled.astype(np.float16).astype(np.float32)
    lo = (scaled - hi).astype(np.float16)  # the fp32 remainder is exact
    return hi.astype(np.float64), lo.astype(np.float64), np.ldexp(1.0, -s)


def spmm_split_f16(plan: Plan, x, *, slice_k: int, bias: bool, relu: bool) -> np.ndarray:
    """Y as the 3xFP16 kernel computes it: per slice, w_lo x_hi + w_hi x_lo + w_hi x_hi (the lo lo term
    dropped) scaled back by X's per-slice column factors, then by W's row factors; float64 sums. One
    slice of K at a time (a loop over K / slice_k, each step whole matrix products), so the emulator
    holds M x N sums, not one per slice."""
    k = plan.constants["k"]
    x_hi, x_lo, inv = split_columns_f16(x, slice_k)
    y = np.zeros((plan.arrays["w_hi"].shape[0], x_hi.shape[2]), dtype=np.float64)
    for i in range(x_hi.shape[0]):
        k0, k1 = i * slice_k, min(k, (i + 1) * slice_k)
        w_hi = plan.arrays["w_hi"][:, k0:k1].view(np.float16).astype(np.float64)
        w_lo = plan.arrays["w_lo"][:, k0:k1].view(np.float16).astype(np.float64)
        xh, xl = x_hi[i, :k1 - k0], x_lo[i, :k1 - k0]
        y += (w_lo @ xh + w_hi @ xl + w_hi @ xh) * inv[i]
    y *= plan.arrays["w_inv"].astype(np.float64)[:, None]
    if bias:
        y = y + plan.arrays["bias"][:, None]
    if relu:
        y = np.maximum(y, 0.0)
    return y.astype(np.float32)
