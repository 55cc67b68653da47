"""Graph Challenge TSV: one entry per line, `row<TAB>col<TAB>value`, 1-based.

Any whitespace separates fields; blank lines are ignored. Duplicate (row, col) entries, NaN/inf
values and indices outside the shape are errors (FormatError naming the line).

Timing (2-core dev box, best of several runs, file read and gunzip included): n1024-l1.tsv.gz
(32768 lines) 6-8 ms; a synthetic 2M-line TSV (`%d\\t%d\\t%e`, 45 MB) 0.53 s, gzip'd 0.68 s;
200k lines of 17-digit repr floats (grammar check + NumPy's slower string parser) 0.2 s.
"""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ._files import check_shape, dims_limit
from ._text import Tokens, check_finite_entries, check_indices, coo_to_csr, cast_values, \
    duplicate_reporter, read_bytes, value_dtype

LAYOUT = "row col value"


def read(path, *, shape=None, one_based=True, dtype=np.float32):
    """Read a TSV file (gzip'd or not) into canonical CSR; see `parse`."""
    return parse(read_bytes(path), path=path, shape=shape, one_based=one_based, dtype=dtype)


def parse(data: bytes, *, path="<bytes>", shape=None, one_based=True, dtype=np.float32):
    """Parse TSV bytes. shape=(m, n) bounds the indices (default: the largest index per axis);
    one_based=False reads 0-based indices; dtype is the values' dtype (float32 by default)."""
    dt = value_dtype(dtype)
    shape = _shape_option(shape)
    tok = Tokens(data, path)
    if tok.count == 0:
        raise FormatError(path, None, f"lines of {LAYOUT}", "an empty file")
    tok.check_rows(3, LAYOUT)
    base = 1 if one_based else 0
    rows = tok.ints(slice(0, None, 3), "row index")
    cols = tok.ints(slice(1, None, 3), "column index")
    vals = tok.floats(slice(2, None, 3), "value")
    why = f"declared shape {shape}"
    rows = check_indices(tok, rows, 0, 3, base, shape and shape[0], "row", why)
    cols = check_indices(tok, cols, 1, 3, base, shape and shape[1], "column", why)
    if shape is None:
        shape = _inferred_shape(tok, rows, cols, base, len(data))
    check_finite_entries(tok, vals, 2, 3)
    vals = cast_values(vals, dt, path, where=lambda k: tok.line_of(3 * k + 2))
    return coo_to_csr(rows, cols, vals, shape, duplicate=duplicate_reporter(tok, 3, rows, cols, base), path=path)


def _inferred_shape(tok, rows, cols, base, content_bytes):
    """(largest row + 1, largest column + 1), when the file's length backs it (see sparsegen.io)."""
    r, c = int(rows.argmax()), int(cols.argmax())
    m, n = int(rows[r]) + 1, int(cols[c]) + 1
    if m + n <= dims_limit(content_bytes):
        return m, n
    line = tok.line_of(3 * r if m >= n else 3 * c + 1)
    return check_shape(tok.path, (m, n), content_bytes, line=line,
                       source=f"inferred from the largest row index {m - 1 + base} and column index {n - 1 + base}")


def _shape_option(shape):
    if shape is None:
        return None
    try:
        m, n = (int(x) for x in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a pair of integers, not {shape!r}") from None
    if m < 0 or n < 0:
        raise ValueError(f"shape must be non-negative, not {shape!r}")
    return (m, n)
