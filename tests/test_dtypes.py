"""The dtype table every stage reads (sparsegen/dtypes.py)."""
from __future__ import annotations

import numpy as np
import pytest

from sparsegen import dtypes


def test_the_table_names_each_dtype_once_in_report_order():
    assert dtypes.NAMES == ("float32", "float16", "bfloat16")
    assert [dtypes.short_name(n) for n in dtypes.NAMES] == ["f32", "f16", "bf16"]
    assert sorted(["bfloat16", "float32", "float16"], key=dtypes.ORDER.get) == list(dtypes.NAMES)
    assert dtypes.HALF == ("float16", "bfloat16") and dtypes.WITH_NUMPY == ("float32", "float16")


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_short_and_long_names_round_trip_and_sizes_agree(name):
    short = dtypes.short_name(name)
    assert dtypes.long_name(short) == name
    assert dtypes.itemsize(name) == dtypes.itemsize(short) == (4 if name == "float32" else 2)


def test_numpy_dtypes_agree_and_bfloat16_travels_as_float32():
    for name in dtypes.WITH_NUMPY:
        d = dtypes.DTYPES[name]
        assert d.host == np.dtype(name) and d.host.itemsize == d.itemsize
    assert dtypes.DTYPES["bfloat16"].numpy is None and dtypes.DTYPES["bfloat16"].host == np.float32


def test_unknown_names_are_refused():
    with pytest.raises(KeyError):
        dtypes.short_name("float64")
    with pytest.raises(KeyError):
        dtypes.long_name("f64")
