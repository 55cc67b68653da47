"""Matrix Market: `%%MatrixMarket matrix coordinate|array real|integer|pattern general|symmetric|skew-symmetric`.

Coordinate entries are 1-based `row col [value]` lines after `%` comments and the size line
`rows cols nnz`. Symmetric files are expanded to both triangles (diagonal once), skew-symmetric ones
with the mirror negated (a diagonal entry is an error). Array files (dense, column-major; symmetric:
lower triangle) keep their nonzeros. Errors (FormatError naming the line): an entry count that
differs from the size line's nnz, duplicate (row, col) entries (also ones a mirror creates),
indices outside the size line's shape, NaN/inf values, non-numbers, wrong field counts.
Complex and hermitian matrices are not supported.
"""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ._files import check_shape
from ._text import Tokens, _shorten, cast_values, check_finite_entries, check_indices, coo_to_csr, \
    duplicate_reporter, indptr_of_rows, make_csr, read_bytes, strict_int, value_dtype

BANNER = "'%%MatrixMarket matrix coordinate|array real|integer|pattern general|symmetric|skew-symmetric'"
_FIELDS = {"real", "double", "integer", "pattern"}
_SYMMETRIES = {"general", "symmetric", "skew-symmetric"}


def read(path, *, dtype=np.float32):
    """Read a Matrix Market file (gzip'd or not) into canonical CSR with values of dtype."""
    return parse(read_bytes(path), path=path, dtype=dtype)


def parse(data: bytes, *, path="<bytes>", dtype=np.float32):
    dt = value_dtype(dtype)
    if not data.strip():
        raise FormatError(path, None, f"a {BANNER} header", "an empty file")
    fmt, field, symmetry = _banner(data, path)
    size_line, size, body = _size_line(data, path, fmt)
    check_shape(path, size[:2], len(data), line=size_line, source="the size line")
    tok = Tokens(data, path, first_line=size_line + 1, start=body)
    m, n = size[:2]
    if symmetry != "general" and m != n:
        raise FormatError(path, size_line, f"a square shape for a {symmetry} matrix", f"{m} x {n}")
    if fmt == "array":
        return _array(tok, path, field, symmetry, m, n, dt)
    return _coordinate(tok, path, field, symmetry, size, size_line, dt)


def _banner(data, path):
    end = data.find(b"\n")
    first = data[:end if end >= 0 else len(data)]
    words = first.lower().split()
    if len(words) != 5 or words[0] != b"%%matrixmarket" or words[1] != b"matrix":
        raise FormatError(path, 1, f"a {BANNER} header", _shorten(first.strip(), 80))
    fmt, field, symmetry = (w.decode("ascii", "replace") for w in words[2:])
    if fmt not in ("coordinate", "array"):
        raise FormatError(path, 1, "format coordinate or array", repr(fmt))
    if field not in _FIELDS or (fmt == "array" and field == "pattern"):
        allowed = "real or integer" if fmt == "array" else "real, integer or pattern"
        raise FormatError(path, 1, f"field {allowed}", repr(field))
    if symmetry not in _SYMMETRIES:
        raise FormatError(path, 1, "symmetry general, symmetric or skew-symmetric", repr(symmetry))
    return fmt, field, symmetry


def _size_line(data, path, fmt):
    """Skip comment and blank lines (the header is short: a loop over its lines is fine)."""
    pos, line = data.find(b"\n") + 1, 2
    layout = "rows cols nnz" if fmt == "coordinate" else "rows cols"
    while True:
        if pos <= 0 or pos >= len(data):
            raise FormatError(path, line, f"a size line '{layout}'", "end of file")
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        text = data[pos:end].strip()
        if text and not text.startswith(b"%"):
            break
        pos, line = end + 1, line + 1
    size = [strict_int(w) for w in text.split()]
    if None in size or len(size) != len(layout.split()) or min(size) < 0:
        raise FormatError(path, line, f"a size line '{layout}' of non-negative integers", _shorten(text))
    return line, size, min(end + 1, len(data))


def _coordinate(tok, path, field, symmetry, size, size_line, dt):
    m, n, nnz = size
    width = 2 if field == "pattern" else 3
    layout = "row col" if width == 2 else "row col value"
    found = tok.check_rows(width, layout) if tok.count else 0
    declared = f"{nnz} entries (size line {size_line})"
    if found > nnz:
        t = nnz * width
        tok.fail(t, declared, f"entry {nnz + 1}: {tok.line_text(t)}")
    if found < nnz:
        raise FormatError(path, tok.end_line(), declared, f"end of file after {found} entries")
    if nnz == 0:
        return make_csr(np.zeros(0, dt), np.zeros(0, np.int32), np.zeros(m + 1, np.int32), (m, n))
    why = f"shape ({m}, {n}) of the size line (line {size_line})"
    rows = check_indices(tok, tok.ints(slice(0, None, width), "row index"), 0, width, 1, m, "row", why)
    cols = check_indices(tok, tok.ints(slice(1, None, width), "column index"), 1, width, 1, n, "column", why)
    if field == "pattern":
        vals = np.ones(nnz)
    elif field == "integer":
        vals = tok.ints(slice(2, None, 3), "value (integer matrix)").astype(np.float64)
    else:
        vals = tok.floats(slice(2, None, 3), "value")
        check_finite_entries(tok, vals, 2, 3)
    vals = cast_values(vals, dt, path, where=lambda k: tok.line_of(k * width + width - 1))
    entry_of = None
    if symmetry != "general":
        off = rows != cols
        if symmetry == "skew-symmetric" and not off.all():
            k = int(np.argmin(off))
            tok.fail(k * width, "no diagonal entry in a skew-symmetric matrix", f"{tok.line_text(k * width)}")
        mirror = np.flatnonzero(off)
        sign = -1 if symmetry == "skew-symmetric" else 1
        rows, cols = np.concatenate([rows, cols[mirror]]), np.concatenate([cols, rows[mirror]])
        vals = np.concatenate([vals, sign * vals[mirror]])
        entry_of = np.concatenate([np.arange(nnz), mirror])
    return coo_to_csr(rows, cols, vals, (m, n), duplicate=duplicate_reporter(tok, width, rows, cols, 1, entry_of),
                      path=path)


def _array(tok, path, field, symmetry, m, n, dt):
    if symmetry == "general":
        count = m * n
    else:
        count = n * (n + 1) // 2 if symmetry == "symmetric" else n * (n - 1) // 2
    tok.check_rows(1, "value") if tok.count else None
    if tok.count != count:
        what = f"{count} values for a {symmetry} {m} x {n} array"
        if tok.count > count:
            tok.fail(count, what, f"value {count + 1}: {tok.text(count)}")
        raise FormatError(path, tok.end_line(), what, f"end of file after {tok.count} values")
    if field == "integer":
        vals = tok.ints(slice(None), "value (integer matrix)").astype(np.float64)
    else:
        vals = tok.floats(slice(None), "value")
        check_finite_entries(tok, vals, 0, 1)
    vals = cast_values(vals, dt, path, where=tok.line_of)
    if symmetry == "general":
        dense = vals.reshape(n, m).T  # column-major
    else:
        # column-major lower triangle (without the diagonal when skew) = row-major upper of the transpose
        c, r = np.triu_indices(n, 0 if symmetry == "symmetric" else 1)
        dense = np.zeros((n, n), dt)
        dense[r, c] = vals
        dense[c, r] = vals if symmetry == "symmetric" else -vals
    r, c = np.nonzero(dense)
    return make_csr(np.ascontiguousarray(dense[r, c]), c, indptr_of_rows(r, m, path), (m, n))
