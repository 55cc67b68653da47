"""Stream-K for the tensor-core tile families (options reduction='stream'): the spec, its launch and
scratch, the gate, the generated source (TVM-style assertions on the text) and, in the nvcc tier,
that every code path compiles for sm_90 with HMMA and no spills. The GPU tier is in test_gpu_tiled.py."""
from __future__ import annotations

import numpy as np
import pytest

import sparsegen
from sparsegen import nvcc
from sparsegen.errors import UnsupportedError
from sparsegen.families import _tiled as T

from .helpers import random_csr
from .test_tiled_csl import assert_sass_has_hmma

FAMILIES = ["tiled_csl_spmm", "tiled_bitmap_spmm"]


def stream_kernel(family, m=700, k=2000, density=0.2, n=16, **options):
    a = random_csr(m, k, density, seed=7)
    return sparsegen.compile(a, n=n, dtype="float16", backend="emulate",
                             options={"family": family, "reduction": "stream", **options})


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_spec_grid_launch_and_scratch(family):
    kernel = stream_kernel(family)
    spec = kernel.spec
    units = spec.m_tiles * spec.k_tiles  # 6 x 32
    assert spec.reduction == "stream" and spec.split_k == 1
    assert spec.grid == T.stream_grid(spec.m_tiles, spec.k_tiles, spec.min_blocks, 132) == min(132 * spec.min_blocks, units // 4)
    assert f".stream{spec.grid}." in spec.name and ".sk" not in spec.name
    assert spec.kt_per_split == -(-units // spec.grid)
    (main,) = T.steps(spec, (), family, spec.shared_bytes)
    assert main.launch.grid == (spec.grid, 1, 1)
    assert [a.name for a in main.args][-2:] == ["workspace", "counters"]
    scratch = T.scratch_constants(spec)
    assert scratch == {"workspace_bytes": 4 * spec.m * spec.n, "counters_bytes": 4 * spec.m_tiles}


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_source_flushes_m_tiles_instead_of_the_split_epilogue(family):
    source = stream_kernel(family, bias=None).source
    assert "constexpr int GRID = " in source and "constexpr int UNITS = " in source
    assert "stream_flush(acc, (u0 + t) / K_TILES, t + 1 - first" in source
    assert "stream_after_tile(acc, u0, t, tiles, first" in source
    assert "epilogue(acc" not in source and "blockIdx.z" not in source
    assert "arrives_last(counters + mt, count, K_TILES)" in source
    assert "atomicAdd(counter, count) + count == total" in source
    split = sparsegen.compile(random_csr(700, 2000, 0.2, seed=7), n=16, dtype="float16", backend="emulate",
                              options={"family": family, "split_k": 4, "reduction": "atomic"}).source
    assert "stream_flush" not in split and "epilogue(acc" in split


def test_stream_grid_keeps_four_units_a_block():
    assert T.stream_grid(56, 448, 3, 132) == 396  # 7168 x 28672: every resident slot
    assert T.stream_grid(6, 12, 4, 132) == 18  # 72 units: 4 a block
    assert T.stream_grid(1, 2, 6, 132) == 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("options,match", [
    ({"wgmma": True}, "wgmma or k-groups"),
    ({"split_k": 3}, "instead of splitting K"),
])
def test_stream_gate_declines_what_it_cannot_run(family, options, match):
    with pytest.raises(UnsupportedError, match=match):
        stream_kernel(family, **options)


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_needs_one_column_tile(family):
    with pytest.raises(UnsupportedError, match="one column tile"):
        stream_kernel(family, n=128)
    with pytest.raises(UnsupportedError, match="one column tile"):
        stream_kernel(family, n=32, bn=16)


def test_stream_k_groups_declined():
    with pytest.raises(UnsupportedError, match="wgmma or k-groups"):
        stream_kernel("tiled_csl_spmm", warp_k=2)


def test_stream_reduction_cost_counts_partial_pieces():
    kernel = stream_kernel("tiled_bitmap_spmm")
    spec = kernel.spec
    rates = kernel.request.device.rates
    assert T.spec_reduction_seconds(spec, rates) == T.stream_reduction_seconds(spec, rates) > 0


STREAM_CODE_SHAPES = [  # (family, m, k, density, n, dtype, options)
    ("tiled_csl_spmm", 700, 2000, 0.2, 64, "float16", {}),
    ("tiled_csl_spmm", 300, 900, 0.3, 33, "bfloat16", {"out": "float32"}),
    ("tiled_bitmap_spmm", 700, 2000, 0.2, 64, "float16", {"granule": 1}),
    ("tiled_bitmap_spmm", 700, 2000, 0.2, 32, "float16", {"granule": 2}),
    ("tiled_bitmap_spmm", 1000, 300, 0.3, 8, "bfloat16", {"granule": 2, "tile_m": 64}),
]


@pytest.mark.nvcc
@pytest.mark.parametrize("shape", STREAM_CODE_SHAPES, ids=lambda s: f"{s[0]}-{s[1]}x{s[2]}-n{s[4]}")
@pytest.mark.parametrize("epilogue", [False, True])
def test_stream_code_shapes_compile_for_sm90_with_hmma(shape, epilogue, tmp_path):
    family, m, k, density, n, dtype, options = shape
    a = random_csr(m, k, density, seed=13)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", bias=np.ones(m) if epilogue else None,
                               relu=epilogue, options={"family": family, "reduction": "stream", **options})
    cubin = nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF"
    assert_sass_has_hmma(cubin, tmp_path)
