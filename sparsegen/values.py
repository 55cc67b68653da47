"""Values a kernel stores must be finite in the dtype it stores them in.

Casts overflow silently: 1e300 becomes inf as float32, 70000 as float16, 3.4e38 as bfloat16, and one
inf or NaN in a weight or a bias spreads to every output it reaches. Every value that comes from the
caller (matrix values, biases, caps, SpDNN weights and inputs, SparseLinear's weights and bias)
passes `check_matrix` or `check_numbers` before it is cast; the error names the value, where it is,
and the dtype that cannot hold it.
"""
from __future__ import annotations

import numpy as np

from .errors import FormatError, ShapeError

STORAGE = ("float64", "float32", "float16", "bfloat16")
# The smallest float32 magnitude each 16-bit dtype rounds to infinity (round to nearest even, as
# formats/halfbits stores them): its largest value plus half of its last step.
_HALF_INF_FROM = {"float16": np.float32(65520.0), "bfloat16": np.uint32(0x7F7F8000).view(np.float32)}
LARGEST = {"float64": float(np.finfo(np.float64).max), "float32": float(np.finfo(np.float32).max),
           "float16": 65504.0, "bfloat16": float(np.uint32(0x7F7F0000).view(np.float32))}


def unstorable(values, dtype: str) -> np.ndarray:
    """Mask of the entries of `values` (real numbers) that are NaN or infinite once stored in `dtype`:
    every storage dtype but float64 sees them as float32 first."""
    if dtype not in STORAGE:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(STORAGE)}")
    v = np.asarray(values)
    if dtype == "float64":
        return ~np.isfinite(v)
    with np.errstate(over="ignore", invalid="ignore"):  # the overflow is what this finds
        v = v.astype(np.float32, copy=False)
    if dtype == "float32":
        return ~np.isfinite(v)
    return ~(np.abs(v) < _HALF_INF_FROM[dtype])  # NaN compares False: flagged too


def first_unstorable(values, dtype: str) -> tuple[int, int] | None:
    """(flat index of the first value `dtype` cannot hold, how many there are), or None."""
    v = np.asarray(values)
    if dtype in _HALF_INF_FROM and v.dtype in (np.float32, np.float16) and v.size:
        # no rounding to float32 in between: the extremes decide (NaN fails both comparisons)
        limit = _HALF_INF_FROM[dtype]
        if v.max() < limit and v.min() > -limit:
            return None
    bad = unstorable(v, dtype).ravel()
    if not bad.any():
        return None
    return int(np.argmax(bad)), int(np.count_nonzero(bad))


def expected_text(dtype: str) -> str:
    return f"finite values that {dtype} can hold (magnitude at most {LARGEST[dtype]:g})"


def found_text(value, dtype: str, place: str, count: int) -> str:
    """`1e+300 at (row 0, col 1) (0-based), which is inf in float32` (and how many more there are)."""
    text = str(value) + place  # str, not format: a NumPy scalar's shortest digits in its own dtype
    if np.isfinite(value):
        text += f", which is inf in {dtype}"
    return text + (f" ({count - 1} more such value(s))" if count > 1 else "")


def check_matrix(csr, dtype: str, path=None) -> None:
    """FormatError (as the readers raise) when a value of the CSR matrix `csr` does not fit `dtype`,
    naming the first one by 0-based (row, col)."""
    hit = first_unstorable(csr.data, dtype)
    if hit is None:
        return
    i, count = hit
    row = int(np.searchsorted(csr.indptr, i, side="right")) - 1
    place = f" at (row {row}, col {int(csr.indices[i])}) (0-based)"
    raise FormatError(path, None, expected_text(dtype), found_text(csr.data[i], dtype, place, count))


def check_numbers(values, dtype: str, what: str) -> np.ndarray:
    """`values` (a number or an array of them) as a NumPy array, or ShapeError naming `what` when one
    is not a real number or does not fit `dtype` (the first one by index)."""
    v = np.asarray(values)
    if v.dtype.kind not in "biuf":
        raise ShapeError(f"{what}: expected real numbers, got {type(values).__name__} of dtype {v.dtype}")
    hit = first_unstorable(v, dtype)
    if hit is not None:
        i, count = hit
        place = "" if v.ndim == 0 else f" at index {i}" if v.ndim == 1 else \
            f" at index {tuple(int(j) for j in np.unravel_index(i, v.shape))}"
        raise ShapeError(f"{what}: expected {expected_text(dtype)}, found {found_text(v.flat[i], dtype, place, count)}")
    return v
