"""nvcc tier: every spec the selector can produce compiles for sm_90."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.errors import CompileError
from sparsegen.families.base import Request
from sparsegen.render import render
from sparsegen.select import select_request

pytestmark = pytest.mark.nvcc


def _rows_of(mean):
    m, k = 64, 4096
    cols = np.sort((np.arange(m)[:, None] * 13 + np.arange(mean)[None, :]) % k, axis=1)
    return analyze(sp.csr_matrix((np.ones(m * mean, np.float32), cols.ravel(), np.arange(0, m * mean + 1, mean)),
                                 shape=(m, k)))


def selector_specs():
    """Every distinct code shape the selector makes: n across vector widths and residues, row
    lengths across the lane splits, both dtypes, with and without the epilogue."""
    specs = {}
    stats = [_rows_of(mean) for mean in (1, 4, 16, 64)]
    for s, n, dtype, epi in itertools.product(stats, (1, 3, 8, 12, 32, 100, 128, 256), ("float32", "float16"),
                                              ((False, False), (True, True))):
        spec = select_request(s, Request("spmm", n=n, dtype=dtype, bias=epi[0], relu=epi[1])).spec
        specs[spec.name] = spec
    return sorted(specs.values(), key=lambda sp_: sp_.name)


@pytest.mark.parametrize("spec", selector_specs(), ids=lambda s: s.name)
def test_every_selector_spec_compiles_for_sm90(spec):
    cubin = nvcc.compile_cubin(render(spec), "sm_90", name=spec.name)
    assert cubin[:4] == b"\x7fELF"


def test_compile_error_carries_numbered_source_and_log():
    with pytest.raises(CompileError) as err:
        nvcc.compile_cubin('extern "C" __global__ void k() { this is not cuda; }\n', "sm_90")
    assert "error" in err.value.log
    assert err.value.numbered_source.startswith("    1  extern")
    assert err.value.command[0].endswith("nvcc") and "-arch=sm_90" in err.value.command
    assert "nvcc output" in err.value.details()


def test_bad_arch_is_rejected_before_nvcc_runs():
    with pytest.raises(CompileError, match="sm_XY"):
        nvcc.compile_cubin("", "compute_90; rm -rf /")


def test_missing_nvcc_is_a_compile_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEGEN_NVCC", str(tmp_path / "no-such-nvcc"))
    with pytest.raises(CompileError, match="nvcc not found"):
        nvcc.compile_cubin("", "sm_90")


def test_version_and_toolchain_id():
    assert nvcc.version()[0].isdigit()
    assert nvcc.toolchain_id().startswith("nvcc:/")


def spdnn_specs():
    """The layer kernel's code shapes: unrolled or runtime trip counts, one weight or a value array,
    both bias rules, with and without a cap, 16- and 32-bit slot indices."""
    from sparsegen.families.spdnn_sliced_ell import Spec

    return [Spec(1024, 1024, 1024, 16, 20, 1024, 32, 1, 16, 0.0625, -0.3, 32.0, "nonzero"),
            Spec(4096, 4096, 1024, 12, 12, 2421, 0, 0, 16, None, -0.35, 32.0, "nonzero"),
            Spec(512, 300, 320, 8, 12, 512, 0, 0, 32, None, 0.1, None, "all")]


@pytest.mark.parametrize("spec", spdnn_specs(), ids=lambda s: s.name)
def test_spdnn_layer_specs_compile_for_sm90(spec):
    cubin = nvcc.compile_cubin(render(spec), "sm_90", name=spec.name)
    assert cubin[:4] == b"\x7fELF"
