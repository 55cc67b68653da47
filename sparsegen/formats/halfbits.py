"""16-bit floating-point values as bit patterns (NumPy has float16 but no bfloat16).

Tensor-core formats store fp16 and bf16 values alike as uint16 bit patterns; the kernel
reinterprets them. bf16 is the upper half of an IEEE float32, rounded to nearest even.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import HALF


def round_bf16_bits(values) -> np.ndarray:
    """float32 (or anything castable) -> bf16 bit patterns (uint16), round to nearest even;
    NaN stays a (quiet) NaN, infinities stay infinite."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(f)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # keep the sign, force a quiet NaN
    return out


def bf16_bits_to_float32(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(values) -> np.ndarray:
    """float32 values rounded to the nearest bf16, still as float32."""
    return bf16_bits_to_float32(round_bf16_bits(values))


def to_bits(values, dtype: str) -> np.ndarray:
    """Values -> uint16 bit patterns of `dtype` ("float16" or "bfloat16")."""
    if dtype == "float16":
        return np.ascontiguousarray(np.asarray(values, dtype=np.float32).astype(np.float16)).view(np.uint16)
    if dtype == "bfloat16":
        return round_bf16_bits(values)
    raise ValueError(f"dtype {dtype!r}: expected one of {HALF}")


def from_bits(bits, dtype: str) -> np.ndarray:
    """uint16 bit patterns of `dtype` -> float32 values (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_bits_to_float32(bits)
    raise ValueError(f"dtype {dtype!r}: expected one of {HALF}")


def round_to(values, dtype: str) -> np.ndarray:
    """float32 values rounded to `dtype` ("float16", "bfloat16" or "float32"), as float32."""
    if dtype == "float32":
        return np.asarray(values, dtype=np.float32)
    return from_bits(to_bits(values, dtype), dtype)
