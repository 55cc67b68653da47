"""`dense_tile_sddmm`: the rule and its measured declines, parameter choices, the tile encoder, the
emulator against a float64 reference, the source text, and (nvcc tier) every code shape compiling."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.families import dense_tile_sddmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import sampled_tiles as fmt
from sparsegen.render import render
from sparsegen.select import select_request

from .helpers import TOL, random_csr, rel_error
from .test_sputnik_sddmm import operands, reference


def pick(a, k, dtype="float32", arch="sm_90", **options):
    request = Request("sddmm", k=k, dtype=dtype, arch=arch, options=tuple(sorted(options.items())))
    return select_request(analyze(a), request)


# ---- the rule -------------------------------------------------------------------------------------

def test_dense_patterns_at_long_k_take_whole_tiles():
    sel = pick(random_csr(512, 2048, 0.5, seed=1), 128)
    assert sel.spec.family == fam.FAMILY
    assert "fill of the nonempty tiles 50% >= 28% at k=128" in sel.reason and "3xTF32" in sel.reason


def test_dense_patterns_at_short_k_need_more_fill_and_a_tile_per_sm():
    sel = pick(random_csr(512, 2048, 0.5, seed=1), 32)
    assert sel.spec.family == fam.FAMILY and "fill of the nonempty tiles 50% >= 33% at k=32" in sel.reason


@pytest.mark.parametrize("m,n,density,k,needle", [
    (512, 2048, 0.26, 128, "fill of the nonempty tiles 26% >= 25% at k=128"),  # about a tile per SM
    (4096, 4096, 0.2, 256, "fill of the nonempty tiles 20% >= 19% at k=256"),  # 15.5 tiles per SM
])
def test_long_k_takes_lower_fill_on_larger_grids(m, n, density, k, needle):
    sel = pick(random_csr(m, n, density, seed=2), k)
    assert sel.spec.family == fam.FAMILY and needle in sel.reason


def test_short_k_takes_whole_tiles_from_28_percent_on_large_grids():
    sel = pick(random_csr(1000, 2048, 0.3, seed=4), 32)  # 256 tiles: 1.9 per SM
    assert sel.spec.family == fam.FAMILY and ">= 28% at k=32" in sel.reason and "1.9 per SM" in sel.reason


@pytest.mark.parametrize("m,n,density,k,needle", [
    (512, 2048, 0.5, 16, "k=16 < 32"),
    (512, 2048, 0.15, 256, "fill of the nonempty tiles 15.0% < 19% at k=256"),
    (512, 2048, 0.2, 256, "128 tiles of 128x64 for 132 SMs at 20% fill (< 3.0 per SM from 19% fill at k=256)"),
    (512, 4608, 0.2, 128, "288 tiles of 128x64 for 132 SMs at 20% fill (< 3.0 per SM from 19% fill at k=128)"),
    (512, 2048, 0.25, 64, "fill of the nonempty tiles 25.0% < 28% at k=64"),
    (512, 2048, 0.3, 64, "128 tiles of 128x64 for 132 SMs at 30% fill (< 1.5 per SM from 28% fill at k=64)"),
    (512, 512, 0.5, 256, "32 tiles of 128x64 for 132 SMs at 50% fill (< 0.5 per SM from 28% fill or 0.9 per SM from "
                         "25% fill or 3.0 per SM from 19% fill at k=256)"),
    (256, 2304, 0.5, 32, "72 tiles of 128x64 for 132 SMs at 50% fill (< 0.9 per SM from 33% fill or 1.5 per SM "
                         "from 28% fill at k=32)"),
])
def test_measured_declines_leave_sputnik(m, n, density, k, needle):
    sel = pick(random_csr(m, n, density, seed=2), k)
    assert sel.spec.family == "sputnik_sddmm"
    assert any(name == "dense_tile_sddmm" and needle in why for name, ok, why in sel.tried)


def test_float16_and_spmm_decline():
    a = random_csr(512, 2048, 0.5, seed=3)
    assert pick(a, 128, "float16").spec.family == "sputnik_sddmm"
    sel = select_request(analyze(a), Request("spmm", n=64))
    assert any(name == "dense_tile_sddmm" and "is not sddmm" in why for name, ok, why in sel.tried)


def test_forcing_the_family_skips_the_measured_declines():
    sel = pick(random_csr(100, 90, 0.05, seed=4), 8, family=fam.FAMILY)
    assert sel.spec.family == fam.FAMILY and sel.spec.tile_m == 128 and sel.spec.slice_k == 8


@pytest.mark.parametrize("m,tile_m", [(20, 32), (64, 64), (65, 128), (5000, 128)])
def test_tile_height_covers_small_matrices_and_is_128_otherwise(m, tile_m):
    assert pick(random_csr(m, 300, 0.5, seed=5), 128, family=fam.FAMILY).spec.tile_m == tile_m


@pytest.mark.parametrize("k,vec,slice_k", [(128, 4, 32), (256, 4, 32), (100, 4, 32), (6, 2, 8), (3, 1, 8),
                                           (20, 4, 24), (33, 1, 32)])
def test_copies_and_slices_follow_k(k, vec, slice_k):
    spec = pick(random_csr(300, 300, 0.5, seed=6), k, family=fam.FAMILY).spec
    assert (spec.vec, spec.slice_k) == (vec, slice_k)


def test_bad_options_are_named():
    with pytest.raises(sparsegen.SparsegenError, match="options tile_m=48: expected one of 32, 64, 128"):
        pick(random_csr(50, 50, 0.5), 64, family=fam.FAMILY, tile_m=48)
    with pytest.raises(sparsegen.SparsegenError, match="options stages=5: expected 2, 3 or 4"):
        pick(random_csr(50, 50, 0.5), 64, family=fam.FAMILY, stages=5)
    with pytest.raises(sparsegen.SparsegenError, match="options min_blocks=3: expected 1, 2, 4 or 8"):
        pick(random_csr(50, 50, 0.5), 64, family=fam.FAMILY, min_blocks=3)
    assert pick(random_csr(300, 300, 0.5, seed=6), 128, family=fam.FAMILY, min_blocks=1).spec.min_blocks == 1


def test_spec_name_and_launch_geometry():
    spec = fam.Spec("f32", 256, 4, 64, 32, 3, 4)
    assert spec.name == "dense_tile_sddmm.f32.k256.v4.t64x64.s32x3.m4"
    assert spec.threads == 128 and spec.shared_bytes == 3 * 128 * 36 * 4 + 64 * 12
    # short slices: the finished tile (rows of 64 + 8 floats) outgrows the stages
    assert fam.Spec("f32", 8, 4, 128, 8, 2, 2).shared_bytes == 128 * 72 * 4 + 128 * 12
    plan = fmt.encode(random_csr(300, 200, 0.3, seed=7), tile_m=64)
    launch = fam.launch(spec, plan)
    assert launch.grid == (plan.constants["tiles"], 1, 1) and launch.block == (128, 1, 1)


# ---- the encoder and the emulator -----------------------------------------------------------------

@pytest.mark.parametrize("tile_m", [32, 64, 128])
def test_tiles_list_every_stored_entry_once_at_its_csr_position(tile_m):
    a = random_csr(300, 200, 0.1, seed=8, empty_rows=0.2)
    plan = fmt.encode(a, tile_m=tile_m)
    pos, rows, cols = fmt.gather(plan)
    order = np.argsort(pos)
    assert np.array_equal(pos[order], np.arange(a.nnz))
    assert np.array_equal(rows[order], np.repeat(np.arange(300), np.diff(a.indptr)))
    assert np.array_equal(cols[order], a.indices)


def test_only_tiles_with_entries_are_listed_row_major():
    a = sp.block_diag([np.ones((64, 64))] * 3, format="csr").astype(np.float32)
    plan = fmt.encode(a, tile_m=64)
    assert plan.arrays["tiles"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert (plan.arrays["masks"] == np.uint64(2**64 - 1)).all()
    assert plan.arrays["bases"][1, :3].tolist() == [64 * 64, 64 * 64 + 64, 64 * 64 + 128]


def test_mask_bits_and_bases_of_one_row():
    a = sp.csr_matrix((np.ones(4, np.float32), ([0, 0, 0, 0], [1, 63, 64, 130])), shape=(2, 140))
    plan = fmt.encode(a, tile_m=32)
    assert plan.arrays["tiles"].tolist() == [[0, 0], [0, 1], [0, 2]]
    assert plan.arrays["masks"][:, 0].tolist() == [(1 << 1) | (1 << 63), 1, 1 << 2]
    assert plan.arrays["bases"][:, 0].tolist() == [0, 2, 3]
    assert (plan.arrays["masks"][:, 1:] == 0).all()


def test_empty_pattern_has_no_tiles():
    plan = fmt.encode(sp.csr_matrix((70, 80), dtype=np.float32), tile_m=64)
    assert plan.constants["tiles"] == 0 and plan.arrays["masks"].shape == (0, 64)
    assert fmt.sddmm(plan, np.ones((70, 4), np.float32), np.ones((80, 4), np.float32)).shape == (0,)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 200), n=st.integers(1, 200), density=st.floats(0, 1), k=st.integers(1, 70),
       tile_m=st.sampled_from([32, 64, 128]), seed=st.integers(0, 10_000))
def test_emulator_matches_float64_reference(m, n, density, k, tile_m, seed):
    a = random_csr(m, n, density, seed=seed, empty_rows=0.1)
    x, y = operands(a, k, "float32", seed)
    out = fmt.sddmm(fmt.encode(a, tile_m=tile_m), x, y)
    assert rel_error(out, reference(a, x, y)) <= TOL["float32"]


def test_compile_emulate_selects_and_computes():
    a = random_csr(512, 2048, 0.4, seed=9)
    kernel = sparsegen.compile(a, op="sddmm", k=128, backend="emulate")
    assert kernel.spec.family == fam.FAMILY
    x, y = operands(a, 128, "float32", 1)
    assert rel_error(kernel(x, y), reference(a, x, y)) <= TOL["float32"]


# ---- the generated source -------------------------------------------------------------------------

def test_source_names_its_constants_and_has_no_template_leftovers():
    src = render(fam.Spec("f32", 100, 4, 128, 32, 3, 2))
    for needle in ("constexpr int K = 100;", "constexpr int TILE_M = 128;", "constexpr int SLICE_K = 32;",
                   "constexpr int STAGES = 3;", "constexpr int SLICES = (K + SLICE_K - 1) / SLICE_K;  // = 4",
                   "THREADS = 32 * WARPS_M * WARPS_N;  // = 256", "mma.sync.aligned.m16n8k8.row.col.f32.tf32",
                   "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "(x + 0x1000u) & 0xffffe000u", "3xTF32", 'extern "C"'):
        assert needle in src
    assert "{{" not in src and "{%" not in src


@pytest.mark.nvcc
@pytest.mark.parametrize("spec", [fam.Spec("f32", k, v, t, s, st_, mb) for k, v, t, s, st_, mb in [
    (128, 4, 128, 32, 3, 2), (256, 4, 64, 32, 3, 4), (33, 1, 32, 32, 2, 8), (6, 2, 128, 8, 4, 2),
    (5000, 4, 128, 64, 3, 2)]], ids=lambda s: s.name)
def test_every_code_shape_compiles_for_sm90(spec):
    assert nvcc.compile_cubin(render(spec), "sm_90", name=spec.name)[:4] == b"\x7fELF"
