"""The index widths the array checks hand out: int64 by default, an array's own signed width where
the caller asks to read it in place (the warm compile's canonical CSR check)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.errors import FormatError
from sparsegen.io import _arrays


def arrays(**named):
    return _arrays.Arrays("<test>", named.get)


def test_index_arrays_are_int64_unless_read_in_place():
    a32 = np.array([0, 2, 5], np.int32)
    got = arrays(x=a32).index_array("x")
    assert got.dtype == np.int64 and np.array_equal(got, a32)
    assert arrays(x=a32).index_array("x", widen=False) is a32          # no copy
    u32 = np.array([0, 2, 5], np.uint32)
    assert arrays(x=u32).index_array("x", widen=False).dtype == np.int64  # unsigned: widened anyway


def test_checked_compressed_widens_by_default_and_keeps_widths_when_asked():
    csr = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], np.float32))
    a = arrays(data=csr.data, indices=csr.indices.astype(np.int32), indptr=csr.indptr.astype(np.int32))
    indptr, indices, _ = _arrays.checked_compressed(a, 2, 3)
    assert indptr.dtype == indices.dtype == np.int64
    indptr, indices, _ = _arrays.checked_compressed(a, 2, 3, widen=False)
    assert indptr.dtype == indices.dtype == np.int32


@pytest.mark.parametrize("bad,position", [(-1, 0), (3, 2)])
def test_bounds_name_the_first_index_outside_either_side(bad, position):
    a = arrays()
    idx = np.array([0, 1, 2], np.int32)
    idx[position] = bad
    with pytest.raises(FormatError, match=f"{bad} at position {position}"):
        a.bounds("indices", idx, 3, "column")
    a.bounds("indices", np.array([0, 2], np.int32), 3, "column")  # 0 and size - 1 pass
