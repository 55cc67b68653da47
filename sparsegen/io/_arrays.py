"""Sparse arrays from an untrusted source (an .npz archive, a caller's scipy matrix) -> canonical CSR.

Every array is checked with NumPy before anything is built from it: dtype kinds, dimensions,
lengths, index bounds, monotone pointers, block sizes, diagonal offsets. The matrix is then built
here in NumPy, as (row, col, value) triplets sorted by position with duplicates summed (in
float64): scipy's compiled converters, which trust their inputs and crash on bad ones, never see
an unchecked array.

Semantics follow scipy's own conversions to CSR: duplicates are summed; explicit zeros are kept,
except in DIA, whose zeros are padding.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import FormatError
from ._text import cast_values, check_finite, check_value_dtype, indptr_of_rows, make_csr, value_dtype

FORMATS = ("csr", "csc", "coo", "bsr", "dia")
MEMBERS = {"csr": ("indices", "indptr"), "csc": ("indices", "indptr"), "bsr": ("indices", "indptr"),
           "coo": ("row", "col"), "dia": ("offsets",)}
INT64_MAX = np.iinfo(np.int64).max


class Arrays:
    """The named arrays of one sparse matrix and where they come from, for error messages.

    find(name) returns the array or None when there is none; `label` names an array in a message
    ("member indices.npy" for an archive, "indices" for a matrix in memory).
    """

    def __init__(self, path, find, label=lambda name: name):
        self.path, self.find, self.label = path, find, label

    def fail(self, name, expected, found):
        raise FormatError(self.path, None, f"{self.label(name)}: {expected}" if name else expected, found)

    def get(self, name) -> np.ndarray:
        a = self.find(name)
        if a is None:
            self.fail(name, "present", "none")
        return a

    def index_array(self, name, ndim=1, widen=True) -> np.ndarray:
        """An integer array of `ndim` dimensions, as int64 (uint64 values past int64 are refused);
        `widen=False` keeps a signed array's own width (checks read it in place, without a copy)."""
        a = self.get(name)
        if a.dtype.kind not in "iu":
            self.fail(name, "an integer array", f"dtype {a.dtype}")
        if a.ndim != ndim:
            self.fail(name, f"a {ndim}-D array", f"shape {a.shape}")
        if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and int(a.max()) > INT64_MAX:
            self.fail(name, f"integers <= {INT64_MAX}", f"{int(a.max())}")
        if not widen and a.dtype.kind == "i":
            return a
        return a.astype(np.int64, copy=False)

    def values(self, name, ndim=1) -> np.ndarray:
        a = self.get(name)
        check_value_dtype(a.dtype, self.path, self.label(name))
        if a.ndim != ndim:
            self.fail(name, f"a {ndim}-D array", f"shape {a.shape}")
        return a

    def shape(self) -> tuple[int, int]:
        s = self.index_array("shape")
        if s.size != 2:
            self.fail("shape", "2 entries (rows, cols)", f"{s.size}: {s.tolist()[:4]}")
        if s.min() < 0:
            self.fail("shape", "non-negative sizes", f"{s.tolist()}")
        return int(s[0]), int(s[1])

    def length(self, name, a, expected: int, why: str):
        if len(a) != expected:
            self.fail(name, f"length {expected} ({why})", f"length {len(a)}")

    def bounds(self, name, a, size: int, axis: str):
        """Every entry of a lies in 0..size-1."""
        if a.size == 0 or (a.min() >= 0 and a.max() < size):  # two passes, no temporaries
            return
        bad = (a < 0) | (a >= size)
        if bad.any():
            k = int(np.argmax(bad))
            self.fail(name, f"{axis} indices in 0..{size - 1}" if size else f"no {axis} indices (size 0)",
                      f"{int(a.flat[k])} at position {k}" + (" (negative)" if a.flat[k] < 0 else ""))

    def pointers(self, name, ptr, count: int, nnz: int, what: str):
        """ptr has count + 1 entries, starts at 0, never decreases and ends at nnz."""
        self.length(name, ptr, count + 1, f"{what} + 1")
        if ptr[0] != 0:
            self.fail(name, "pointers starting at 0", f"first pointer {int(ptr[0])}")
        drop = np.flatnonzero(ptr[1:] < ptr[:-1])
        if len(drop):
            i = int(drop[0])
            self.fail(name, "non-decreasing pointers",
                      f"pointer {i + 1} = {int(ptr[i + 1])} < pointer {i} = {int(ptr[i])}")
        if ptr[-1] != nnz:
            self.fail(name, f"pointers ending at the number of stored entries, {nnz}", f"last pointer {int(ptr[-1])}")


# ----------------------------------------------------------------------------------- per format

def triplets(fmt: str, a: Arrays, shape):
    """(rows, cols, values) of a checked matrix of format fmt; values in their stored dtype."""
    return _BUILD[fmt](a, *shape)


def checked_compressed(a: Arrays, m, n, transpose: bool = False, widen: bool = True):
    """(indptr, indices, data) of CSR (CSC when transpose) arrays that agree with each other and the
    shape; the index arrays as int64, or (`widen=False`) in their own signed width."""
    major, minor = (n, m) if transpose else (m, n)
    data = a.values("data")
    indices = a.index_array("indices", widen=widen)
    indptr = a.index_array("indptr", widen=widen)
    a.length("indices", indices, len(data), "one per stored value in data")
    a.pointers("indptr", indptr, major, len(data), "columns" if transpose else "rows")
    a.bounds("indices", indices, minor, "row" if transpose else "column")
    return indptr, indices, data


def _compressed(a: Arrays, m, n, transpose: bool):
    indptr, indices, data = checked_compressed(a, m, n, transpose)
    outer = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    return (indices, outer, data) if transpose else (outer, indices, data)


def _csr(a, m, n):
    return _compressed(a, m, n, False)


def _csc(a, m, n):
    return _compressed(a, m, n, True)


def _coo(a: Arrays, m, n):
    data = a.values("data")
    if a.find("coords") is None:
        names = ("row", "col")
        rows, cols = a.index_array("row"), a.index_array("col")
    else:
        names = ("coords", "coords")
        coords = a.index_array("coords", ndim=2)
        if coords.shape[0] != 2:
            a.fail("coords", "2 rows (row and column indices)", f"shape {coords.shape}")
        rows, cols = coords
    a.length(names[0], rows, len(data), "one per stored value in data")
    a.length(names[1], cols, len(data), "one per stored value in data")
    a.bounds(names[0], rows, m, "row")
    a.bounds(names[1], cols, n, "column")
    return rows, cols, data


def _bsr(a: Arrays, m, n):
    data = a.values("data", ndim=3)
    nb, r, c = data.shape
    if r < 1 or c < 1 or m % r or n % c:
        a.fail("data", f"blocks (nblocks, R, C) with R >= 1 dividing {m} rows and C >= 1 dividing {n} columns",
               f"shape {data.shape}")
    indices = a.index_array("indices")
    indptr = a.index_array("indptr")
    a.length("indices", indices, nb, "one per block in data")
    a.pointers("indptr", indptr, m // r, nb, f"block rows ({m} / {r})")
    a.bounds("indices", indices, n // c, "block column")
    block_row = np.repeat(np.arange(m // r, dtype=np.int64), np.diff(indptr))
    rows = (block_row * r)[:, None, None] + np.arange(r)[None, :, None]
    cols = (indices * c)[:, None, None] + np.arange(c)[None, None, :]
    shape = (nb, r, c)
    return np.broadcast_to(rows, shape).ravel(), np.broadcast_to(cols, shape).ravel(), data.ravel()


def _dia(a: Arrays, m, n):
    data = a.values("data", ndim=2)
    offsets = a.index_array("offsets")
    a.length("offsets", offsets, data.shape[0], "one per diagonal in data")
    s = np.sort(offsets)
    if np.any(s[1:] == s[:-1]):
        a.fail("offsets", "distinct diagonal offsets", f"{int(s[np.argmax(s[1:] == s[:-1])])} twice")
    # diagonals wholly outside the matrix hold nothing; dropping them first keeps col - offset in range
    inside = np.flatnonzero((offsets > -m) & (offsets < n))
    width = min(data.shape[1], n)
    col = np.arange(width, dtype=np.int64)
    rows = col[None, :] - offsets[inside, None]
    block = data[inside, :width]
    keep = (rows >= 0) & (rows < m) & (block != 0)  # scipy's DIA -> CSR drops zeros, the padding
    return rows[keep], np.broadcast_to(col, rows.shape)[keep], block[keep]


_BUILD = {"csr": _csr, "csc": _csc, "coo": _coo, "bsr": _bsr, "dia": _dia}


# ----------------------------------------------------------------------------------- canonical CSR

def build(fmt: str, a: Arrays, shape, dtype, path):
    """Canonical CSR of checked arrays: sorted, duplicates summed in float64, values cast to dtype
    (None: a floating dtype is kept, others become float32), NaN/inf and overflow refused."""
    m, n = shape
    rows, cols, vals = triplets(fmt, a, shape)
    check_finite(vals, path, lambda i: (int(rows[i]), int(cols[i])))
    out_dt = np.dtype(dtype) if dtype is not None else (vals.dtype if vals.dtype.kind == "f" else np.dtype(np.float32))
    rows, cols, vals = _sorted_summed(rows, cols, vals, m, n, path)
    return make_csr(cast_values(vals, out_dt, path), cols, indptr_of_rows(rows, m, path), (m, n))


def _sorted_summed(rows, cols, vals, m, n, path):
    if m * n < 2**62:
        key = rows * n + cols
        if np.all(key[1:] > key[:-1]):  # already canonical: keep the stored values as they are
            return rows, cols.copy(), vals.copy()  # copies: the caller's arrays stay the caller's
        order = np.argsort(key, kind="stable")
        key = key[order]
        new = np.r_[True, key[1:] != key[:-1]] if key.size else np.zeros(0, bool)
    else:
        order = np.lexsort((cols, rows))
        r, c = rows[order], cols[order]
        new = np.r_[True, (r[1:] != r[:-1]) | (c[1:] != c[:-1])] if r.size else np.zeros(0, bool)
    rows, cols = rows[order], cols[order]
    v = cast_values(vals[order], np.float64, path)
    starts = np.flatnonzero(new)
    if starts.size == v.size:
        return rows, cols, v
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum is reported just below
        sums = np.add.reduceat(v, starts)
    bad = ~np.isfinite(sums)
    if bad.any():
        k = int(np.argmax(bad))
        raise FormatError(path, None, "duplicate entries whose sum is finite in float64",
                          f"a sum that overflows at (row {int(rows[starts[k]])}, col {int(cols[starts[k]])}) (0-based)")
    return rows[starts], cols[starts], sums


# ----------------------------------------------------------------------------------- in memory

def as_csr(matrix, dtype=None, *, path=None) -> sp.csr_matrix:
    """Canonical CSR of a scipy sparse matrix/array or a dense 2-D array (see sparsegen.io.as_csr)."""
    if not sp.issparse(matrix):
        return _dense(matrix, dtype, path)
    if matrix.ndim != 2:
        raise FormatError(path, None, "a 2-D matrix", f"a {matrix.ndim}-D sparse array")
    check_value_dtype(matrix.dtype, path)
    if matrix.format not in FORMATS:  # lil, dok: scipy's own conversion, in Python
        matrix = matrix.tocoo()
    a = Arrays(path, lambda name: _attribute(matrix, name))
    shape = a.shape()
    if _canonical_float_csr(matrix, dtype, a, shape):  # the common case: no copy
        csr = matrix if isinstance(matrix, sp.csr_matrix) else sp.csr_matrix(matrix, copy=False)
        csr.has_canonical_format = True  # checked just now: the flag states what is true
        return csr
    return build(matrix.format, a, shape, None if dtype is None else value_dtype(dtype), path)


def _attribute(matrix, name):
    if name == "shape":
        return np.asarray(matrix.shape)
    if name == "coords" or not hasattr(matrix, name):
        return None  # a 2-D COO in memory is read through row and col
    return np.asarray(getattr(matrix, name))


def _canonical_float_csr(matrix, dtype, a: Arrays, shape) -> bool:
    """Already what as_csr returns: CSR with float values of the asked dtype, consistent arrays
    (checked here: an inconsistent one is a FormatError), indices sorted and distinct in each row."""
    if not (matrix.format == "csr" and matrix.dtype.kind == "f" and matrix.dtype.itemsize >= 4
            and (dtype is None or value_dtype(dtype) == matrix.dtype)
            and matrix.indices.dtype == matrix.indptr.dtype and matrix.indices.dtype in (np.int32, np.int64)):
        return False
    indptr, indices, data = checked_compressed(a, *shape, widen=False)  # int32 or int64, read in place
    check_finite(data, a.path, lambda i: (int(np.searchsorted(indptr, i, side="right")) - 1, int(indices[i])))
    nnz = len(indices)
    rising = indices[1:] > indices[:-1]
    starts = indptr[1:-1]
    rising[starts[(starts > 0) & (starts < nnz)] - 1] = True  # a new row may start anywhere
    return bool(rising.all())


def _dense(matrix, dtype, path) -> sp.csr_matrix:
    a = np.asarray(matrix)
    if a.ndim != 2:
        raise FormatError(path, None, "a 2-D matrix", f"an array of shape {a.shape}")
    check_value_dtype(a.dtype, path)
    r, indices = np.nonzero(a)  # row-major order: already canonical; NaN and inf are nonzero
    values = a[r, indices]
    check_finite(values, path, lambda i: (int(r[i]), int(indices[i])))
    dt = value_dtype(dtype) if dtype is not None else (
        values.dtype if values.dtype.kind == "f" else np.dtype(np.float32))
    return make_csr(cast_values(values, dt, path), indices, indptr_of_rows(r, a.shape[0], path), a.shape)
