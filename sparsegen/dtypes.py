"""The dtypes sparsegen computes in: one table that every stage reads.

Each dtype has the name the API, NumPy and PyTorch give it ("bfloat16"), the short name spec fields
and spec names carry ("bf16"), its size in bytes, and the NumPy dtype its host arrays have. NumPy
has no bfloat16, so bf16 operands travel on the host as float32 holding bf16-rounded values (the
emulators take and return those), and CuPy, which has NumPy's dtypes, has no bfloat16 either.
Accumulation is fp32 in every family whatever the storage dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # the API's, NumPy's and torch's name: "float32", "float16", "bfloat16"
    short: str  # in spec fields and names: "f32", "f16", "bf16"
    itemsize: int  # bytes per element on the device
    numpy: str | None  # NumPy's dtype of that name, or None (bfloat16)

    @property
    def host(self) -> np.dtype:
        """The NumPy dtype of a host array of this dtype (bfloat16: float32 holding bf16 values)."""
        return np.dtype(self.numpy or "float32")


# In the order reports and error messages list them.
DTYPES = {d.name: d for d in (DType("float32", "f32", 4, "float32"),
                              DType("float16", "f16", 2, "float16"),
                              DType("bfloat16", "bf16", 2, None))}
NAMES = tuple(DTYPES)
ORDER = {name: i for i, name in enumerate(NAMES)}  # a sort key: float32, float16, bfloat16
HALF = tuple(d.name for d in DTYPES.values() if d.itemsize == 2)  # the 16-bit floating-point dtypes
WITH_NUMPY = tuple(d.name for d in DTYPES.values() if d.numpy)  # those NumPy (and CuPy) have
_BY_SHORT = {d.short: d for d in DTYPES.values()}


def short_name(name: str) -> str:
    """"float16" -> "f16"."""
    return DTYPES[name].short


def long_name(short: str) -> str:
    """"f16" -> "float16": a spec's storage dtype as the API and NumPy name it."""
    return _BY_SHORT[short].name


def itemsize(name: str) -> int:
    """Bytes per element of a dtype given by name or short name."""
    return (DTYPES.get(name) or _BY_SHORT[name]).itemsize
