"""Residency of the tensor-core tile kernels: options blocks=, the extra block the split model may
give wide bitmap blocks, and the wave model (`_tiled.wave_factor`) that weighs it. The GPU tier
(every residency correct, held by __launch_bounds__) is test_gpu_tiled.py::test_bitmap_residency_*."""
from __future__ import annotations

import pytest

import sparsegen
from sparsegen.errors import UnsupportedError
from sparsegen.families import _tiled as T
from sparsegen.families import tiled_bitmap_spmm as BM
from sparsegen.families.base import Request
from sparsegen.select import skinny_cost
from sparsegen.select.device import default as default_device

from .helpers import random_csr
from .tiled_helpers import uniform_stats

H100 = default_device()
SMS, H = H100.sm_count, H100.rates.tiles.occupancy_h


def bitmap(stats, request):
    return skinny_cost.build(stats, request, BM.FAMILY)


def test_wave_factor_counts_the_busiest_sms_waves():
    assert T.wave_factor(3 * SMS, SMS, 3, H) == pytest.approx(1.0)  # the reference: one full wave of 3
    # one block more per SM: a second wave of one block, nearly as long as a full one
    assert T.wave_factor(4 * SMS, SMS, 3, H) > 1.1 * T.wave_factor(4 * SMS, SMS, 4, H)
    # a single block past the wave costs a whole extra wave on that SM
    assert T.wave_factor(3 * SMS + 1, SMS, 3, H) > 1.2
    # fewer blocks than SMs: the idle SMs are lost
    assert T.wave_factor(SMS // 2, SMS, 3, H) > 1.5


@pytest.mark.parametrize("blocks", [0, 17, 2.5, "4", True])
def test_gate_declines_bad_residency(blocks):
    a = random_csr(300, 500, 0.3, seed=1)
    with pytest.raises(UnsupportedError, match="options blocks="):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate",
                          options={"family": "tiled_bitmap_spmm", "blocks": blocks})


def test_blocks_option_sets_launch_bounds_in_the_source():
    a = random_csr(700, 900, 0.3, seed=2)
    kernel = sparsegen.compile(a, n=64, dtype="float16", backend="emulate",
                               options={"family": "tiled_bitmap_spmm", "blocks": 4, "split_k": 2})
    assert kernel.spec.min_blocks == 4 and ".mb4." in kernel.spec.name
    assert "constexpr int MIN_BLOCKS = 4;" in kernel.source
    assert "__launch_bounds__(THREADS, MIN_BLOCKS)" in kernel.source


def test_wide_bitmap_takes_a_fourth_block_where_it_saves_a_wave():
    """21504 x 7168 at N = 64: 168 m-tiles; split-K 3 with 4 resident blocks is one wave (504 of
    528 slots), where 3 blocks per SM needed split 7 (1176 blocks) or left a partial wave
    (probes/tiled_probe_blocks2.txt: 126.7 -> 106.3 us at 70 %)."""
    stats = uniform_stats(21504, 7168, 0.3)
    request = Request("spmm", n=64, dtype="float16", options=(("granule", 2),))  # waves probe: 106.6 us, the best
    spec, why = bitmap(stats, request)
    assert (spec.split_k, spec.min_blocks) == (3, 4), spec.name
    assert "one more than registers would allow" in why


@pytest.mark.parametrize("shape,split_k,blocks", [((28672, 7168), 4, 4), ((12288, 12288), 4, 3), ((7168, 7168), 7, 3)])
def test_wide_bitmap_split_and_residency_are_the_measured_best(shape, split_k, blocks):
    """probes/tiled_probe_waves.txt (register pairs at 70 %, N = 64, split-K 1-8 at 3 and 4 blocks):
    28672 x 7168 fastest at split 4 with 4 blocks (142.7 us; 3 blocks 152.3, split 1 144.3), 12288^2
    at split 4 with 3 (100.6; 4 blocks 103.3, every other split >= 111.7), 7168^2 at its one-wave
    split 7 with 3 (47.1; the grid's best 48.3)."""
    spec, _ = bitmap(uniform_stats(*shape, 0.3), Request("spmm", n=64, dtype="float16", options=(("granule", 2),)))
    assert (spec.tile_m, spec.split_k, spec.min_blocks) == (128, split_k, blocks), spec.name


def test_narrow_blocks_are_not_given_extra_residency():
    """Only wide blocks (bn = 64) were measured with a block past the register estimate."""
    stats = uniform_stats(21504, 7168, 0.3)
    for n in (8, 16, 32):
        spec, why = bitmap(stats, Request("spmm", n=n, dtype="float16", options=(("granule", 2),)))
        assert "one more than registers" not in why, spec.name
        assert spec.min_blocks <= BM.register_blocks(spec.tile_m, spec.bn, H100)


def test_partial_wave_factor_charges_a_grid_short_of_one_wave():
    assert T.partial_wave_factor(SMS * 4, SMS, 4, H) == 1.0 == T.partial_wave_factor(SMS * 9, SMS, 4, H)
    # 160 blocks at 4 per SM: 28 SMs run two blocks at the throughput of two
    assert T.partial_wave_factor(160, SMS, 4, H) == pytest.approx((2 + H) * SMS * 4 / (160 * (4 + H)))
    assert T.partial_wave_factor(160, SMS, 4, H) > 1.9


def test_small_square_at_n32_stays_dense():
    """random/4096/0.9 at n = 32: Tiled-CSL's 5 x 32 = 160 blocks are short of two waves; costed as one
    full wave per partial one it is slower than cuBLAS, as measured (21.5 us against 11.4)."""
    from sparsegen.select import select_request

    from .tiled_helpers import pinned_library

    stats = uniform_stats(4096, 4096, 0.1)
    request = Request("spmm", n=32, dtype="float16", arch="sm_90")
    with pinned_library("torch"):
        assert skinny_cost.compare(stats, request).get("tiled_csl_spmm").seconds > 19e-6
        assert select_request(stats, request).spec.family == "dense_gemm"
