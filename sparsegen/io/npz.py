"""`.npz` archives written by `scipy.sparse.save_npz` (any of its formats: csr, csc, coo, bsr, dia)."""
from __future__ import annotations

import io
import numpy as np
import scipy.sparse as sp

from ..errors import FormatError
from ._text import as_csr, read_bytes, value_dtype


def read(path, *, dtype=np.float32):
    """Read a save_npz archive (gzip'd or not) into canonical CSR: duplicates summed, indices sorted.

    Anything load_npz rejects (not a zip, no `format` key, pickled objects, ...) is a FormatError.
    """
    dt = value_dtype(dtype)
    data = read_bytes(path)
    if not data:
        raise FormatError(path, None, "a scipy.sparse.save_npz archive", "an empty file")
    try:
        matrix = sp.load_npz(io.BytesIO(data))
    except Exception as e:  # load_npz fails in many ways on a foreign or damaged archive
        raise FormatError(path, None, "a scipy.sparse.save_npz archive", f"{type(e).__name__}: {e}") from None
    return as_csr(matrix, dt, path=path)
