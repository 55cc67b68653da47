"""DLMC `.smtx` (Sputnik's sparsity patterns): three lines, pattern only.

    nrows, ncols, nnz
    nrows+1 row offsets (0-based CSR indptr, space separated)
    nnz column indices (0-based, strictly increasing within each row)

Checked (vectorized): offsets start at 0, end at nnz, never decrease; columns in [0, ncols);
columns strictly increasing within each row (duplicates are errors). The file holds no values:
values="random" (default) fills them with N(0, 1) draws from numpy's default_rng(seed), seed=0;
values="ones" with 1.
"""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ._files import check_shape
from ._text import Tokens, _shorten, make_csr, read_bytes, strict_int, value_dtype

HEADER = "a header line 'nrows, ncols, nnz'"


def read(path, *, values="random", seed=0, dtype=np.float32):
    """Read a .smtx file (gzip'd or not) into canonical CSR; see the module docstring."""
    return parse(read_bytes(path), path=path, values=values, seed=seed, dtype=dtype)


def parse(data: bytes, *, path="<bytes>", values="random", seed=0, dtype=np.float32):
    dt = value_dtype(dtype)
    if values not in ("random", "ones"):
        raise ValueError(f"values must be 'random' or 'ones', not {values!r}")
    if not data.strip():
        raise FormatError(path, None, HEADER, "an empty file")
    lines = data.split(b"\n", 3)  # header, offsets, columns, rest: a few copies, no per-entry work
    m, n, nnz = _header(lines[0], path)
    check_shape(path, (m, n), len(data), line=1, source="the header")
    offsets = _offsets(lines, path, m, nnz)
    cols = _columns(lines, path, n, nnz, offsets)
    rest = lines[3] if len(lines) > 3 else b""
    if rest.strip():
        blank = len(rest) - len(rest.lstrip())
        raise FormatError(path, 4 + rest.count(b"\n", 0, blank), "nothing after the 3 lines",
                          _shorten(rest.strip().split(b"\n", 1)[0]))
    if values == "ones":
        vals = np.ones(nnz, dt)
    else:
        vals = np.random.default_rng(seed).standard_normal(nnz, dtype=dt if dt.itemsize >= 4 else np.float32)
    return make_csr(vals.astype(dt, copy=False), cols, offsets, (m, n))


def _header(text, path):
    size = [strict_int(w) for w in text.replace(b",", b" ").split()]
    if len(size) != 3 or None in size:
        raise FormatError(path, 1, HEADER + " of 3 integers", _shorten(text.strip()))
    m, n, nnz = size
    if min(m, n, nnz) < 0:
        raise FormatError(path, 1, HEADER + " of non-negative integers", _shorten(text.strip()))
    return m, n, nnz


def _tokens(lines, number, path, what, count):
    if len(lines) < number:
        raise FormatError(path, number, f"{count} {what} (file truncated)", "end of file")
    tok = Tokens(lines[number - 1], path, first_line=number)
    if tok.count != count:
        found = f"{tok.count}" + (" (truncated)" if tok.count < count else "")
        raise FormatError(path, number, f"{count} {what}", found)
    return tok


def _offsets(lines, path, m, nnz):
    tok = _tokens(lines, 2, path, "row offsets (nrows + 1)", m + 1)
    off = tok.ints(slice(None), "row offset")
    if off[0] != 0:
        raise FormatError(path, 2, "row offsets starting at 0", f"first offset {off[0]}")
    if off[-1] != nnz:
        raise FormatError(path, 2, f"row offsets ending at nnz = {nnz}", f"last offset {off[-1]}")
    drop = np.flatnonzero(off[1:] < off[:-1])
    if len(drop):
        i = int(drop[0])
        raise FormatError(path, 2, "non-decreasing row offsets",
                          f"offset {i + 1} (row {i} ends) = {off[i + 1]} < offset {i} = {off[i]}")
    return off


def _columns(lines, path, n, nnz, offsets):
    if nnz == 0 and (len(lines) < 3 or not lines[2].strip()):
        return np.zeros(0, np.int64)  # an empty third line may be missing altogether
    tok = _tokens(lines, 3, path, "column indices (nnz)", nnz)
    cols = tok.ints(slice(None), "column index")
    bad = np.flatnonzero((cols < 0) | (cols >= n))
    if len(bad):
        k = int(bad[0])
        raise FormatError(path, 3, f"column indices in 0..{n - 1}",
                          f"{cols[k]} at position {k}" + (" (negative)" if cols[k] < 0 else ""))
    # within a row the next column must be larger; across a row boundary anything goes
    rising = cols[1:] > cols[:-1]
    boundary = np.zeros(max(nnz - 1, 0), bool)
    inner = offsets[1:-1]
    inner = inner[(inner > 0) & (inner < nnz)]
    boundary[inner - 1] = True
    bad = np.flatnonzero(~rising & ~boundary)
    if len(bad):
        k = int(bad[0]) + 1
        row = int(np.searchsorted(offsets, k, side="right")) - 1
        kind = "a duplicate" if cols[k] == cols[k - 1] else "out of order"
        raise FormatError(path, 3, "strictly increasing column indices within each row (no duplicates)",
                          f"{kind} column {cols[k]} after {cols[k - 1]} in row {row} (position {k})")
    return cols
