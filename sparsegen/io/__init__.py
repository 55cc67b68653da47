"""Readers: a file (or an in-memory matrix) -> canonical `scipy.sparse.csr_matrix`.

Canonical means: indices sorted within each row, no duplicate entries, int32 `indices`/`indptr`
when the shape and nnz fit (int64 otherwise), floating values (float32 unless `dtype=` says otherwise).

    load(path, format=None, **options)   one module per format, chosen by extension, `.gz` transparent
    as_csr(matrix, dtype=None)           any scipy sparse matrix/array or dense 2-D array

| format | extensions | options |
|---|---|---|
| tsv  | .tsv              | shape=(m, n) (default: largest index per axis), one_based=True, dtype |
| mtx  | .mtx, .mm         | dtype |
| npz  | .npz              | dtype (scipy.sparse.save_npz archives) |
| smtx | .smtx             | values="random" (seeded N(0,1)) or "ones", seed=0, dtype |
| idx  | .idx, .idx3-ubyte, -idx3-ubyte | limit=None (first k images), order="C" (or "F"), dtype |

Every malformed file raises `FormatError(path, line, expected, found)` (line is None for binary
formats); a missing file too. Duplicate entries are errors in tsv, mtx and smtx.

Files are untrusted (sparsegen/io/_files.py):
- only regular files are read: a FIFO, a device, a socket or a directory is a FormatError at once;
- gzip is decompressed to at most SPARSEGEN_MAX_DECOMPRESSED_BYTES bytes (default 4 GiB);
- a shape must be backed by the file: rows + cols <= 2**22 + 16 per byte of content (after
  decompression), whether the shape is declared (mtx size line, smtx header, npz shape, idx
  header) or inferred (tsv's largest indices); a shape= option is the caller's and is not limited;
- an allocation past the memory available is a SparsegenError saying how much it needs;
- .npz arrays are checked before the matrix is built (never by scipy's converters), and so are
  the arrays of a scipy matrix given to as_csr.
"""
from __future__ import annotations

import os
from pathlib import Path

import scipy.sparse as sp

from ..errors import FormatError, SparsegenError
from . import idx, mtx, npz, smtx, tsv
from ._arrays import as_csr as _as_csr

READERS = {"tsv": tsv.read, "mtx": mtx.read, "npz": npz.read, "smtx": smtx.read, "idx": idx.read}
FORMATS = tuple(READERS)
_SUFFIXES = (  # longest first: ".idx3-ubyte" before ".idx"
    (".idx3-ubyte", "idx"), ("-idx3-ubyte", "idx"), (".smtx", "smtx"), (".tsv", "tsv"), (".mtx", "mtx"),
    (".mm", "mtx"), (".npz", "npz"), (".idx", "idx"),
)

__all__ = ["load", "as_csr", "detect_format", "FORMATS", "READERS"]


def detect_format(path) -> str:
    """The format named by the file's extension (after stripping `.gz`), or FormatError."""
    name = Path(os.fspath(path)).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix):
            return fmt
    known = ", ".join(s for s, _ in _SUFFIXES)
    raise FormatError(path, None, f"a known extension ({known}, optionally + .gz) or format= one of "
                      f"{', '.join(FORMATS)}", f"name {Path(os.fspath(path)).name!r}")


def load(path, format: str | None = None, **options) -> sp.csr_matrix:
    """Read a sparse matrix file into canonical CSR.

    format overrides the extension ("tsv", "mtx", "npz", "smtx", "idx"); gzip'd files are read
    transparently whatever their name. Options depend on the format (see the module docstring);
    an option the format does not take raises TypeError.
    """
    if format is None:
        format = detect_format(path)
    elif format not in READERS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    try:
        return READERS[format](path, **options)
    except MemoryError as e:  # the readers ask for memory first; this is what their estimates missed
        raise SparsegenError(f"{path}: reading it ran out of memory ({str(e) or 'MemoryError'})") from None


def as_csr(matrix, dtype=None) -> sp.csr_matrix:
    """Canonical CSR of a scipy sparse matrix/array or a dense 2-D NumPy array.

    A CSR matrix that is already canonical with float values comes back as it is (no copy);
    anything else is copied, so the caller's matrix is never changed.

    Duplicates are summed and indices sorted. dtype=None keeps floating values as they are and makes
    bool/integer values float32. Raises FormatError (path None) for non-2-D input, complex or
    non-numeric dtypes, and NaN/inf values (how many, and where the first is).
    """
    return _as_csr(matrix, dtype)
