"""sparsegen.cudriver against a stand-in CUDA driver (tests/fixtures/fake_libcuda.c): no GPU needed."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from sparsegen import cudriver

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_driver(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver")
    out = tmp_path / "fake_libcuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(REPO / "tests/fixtures/fake_libcuda.c")],
                   check=True)
    saved = dict(cudriver._state)
    cudriver.use(ctypes.CDLL(str(out)))
    yield cudriver.library()
    cudriver._state.clear()
    cudriver._state.update(saved)


def test_a_cubin_read_from_the_cache_loads_like_fresh_bytes(fake_driver):
    """The cache hands out read-only views of its files; the driver's image argument takes bytes."""
    elf = b"\x7fELF" + bytes(60)
    func = cudriver.function("view-key", memoryview(elf), "kernel_from_the_cache", 0)
    assert func == cudriver.function("view-key", elf, "kernel_from_the_cache", 0)  # loaded once per key
    assert cudriver.function("bytes-key", elf, "fresh_kernel", 0) != func
