"""Tiled-CSL: encoder invariants, the bank-ordered scatter, the kernel's ldmatrix view, the emulator
against scipy, bf16, the selection rule, split-K steps, and (nvcc tier) every code shape compiles."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.errors import ShapeError, UnsupportedError
from sparsegen.families import tiled_csl_spmm as fam
from sparsegen.formats import halfbits
from sparsegen.formats import tiled_csl as fmt
from sparsegen.render import render
from sparsegen.select import rule_decision, skinny_cost

from .helpers import random_csr, reference, rel_error, synthetic_device
from .tiled_helpers import select_tiled as select
from .tiled_helpers import TOL, a_fragment_positions, host_x, ldmatrix, rounded_half, uniform_stats


def dense_of(plan):
    return fmt.decode(plan).toarray()


# ---- bf16 bit patterns -----------------------------------------------------------------------

def test_bf16_rounding_is_nearest_even_and_keeps_specials():
    v = np.array([1.0, -2.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7, np.inf, -np.inf, 0.0, -0.0], np.float32)
    bits = halfbits.round_bf16_bits(v)
    assert list(bits) == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x0000, 0x8000]
    nan = halfbits.round_bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(halfbits.bf16_bits_to_float32(nan))[0]
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    r = halfbits.round_bf16(x)
    assert np.all(np.abs(r - x) <= np.abs(x) * 2**-8)
    assert np.array_equal(halfbits.round_bf16(r), r)


def test_fp16_bits_round_trip():
    x = np.array([0.5, -3.25, 65504.0, 6e-8], np.float32)
    assert np.array_equal(halfbits.from_bits(halfbits.to_bits(x, "float16"), "float16"), x.astype(np.float16).astype(np.float32))


# ---- swizzle and positions -------------------------------------------------------------------

def test_swizzled_positions_are_a_bijection_and_ldmatrix_reads_8_bank_groups():
    r, c = np.meshgrid(np.arange(256), np.arange(64), indexing="ij")
    pos = fmt.swizzled_position(r, c)
    assert np.array_equal(np.sort(pos.ravel()), np.arange(256 * 64))
    rr, cc = fmt.unswizzle(pos)
    assert np.array_equal(rr, r) and np.array_equal(cc, c)
    # 8 consecutive rows (aligned), one 16-byte chunk: 8 distinct 16-byte bank groups
    for r0 in range(0, 256, 8):
        for chunk in range(8):
            groups = (fmt.swizzled_position(np.arange(r0, r0 + 8), chunk * 8) % 64) // 8
            assert len(set(groups.tolist())) == 8


# ---- encoder invariants ----------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 200), density=st.floats(0, 1), tile_m=st.sampled_from([64, 128, 256]),
       dtype=st.sampled_from(["float16", "bfloat16"]), strict=st.booleans(), seed=st.integers(0, 1000))
def test_round_trip_and_layout_invariants(m, k, density, tile_m, dtype, strict, seed):
    a = random_csr(m, k, density, seed=seed)
    plan = fmt.encode(a, dtype, tile_m, strict_banks=strict)
    assert np.array_equal(dense_of(plan), rounded_half(a, dtype).toarray())
    offsets = plan.arrays["tile_offsets"].astype(np.int64)
    words = plan.arrays["words"]
    grid_tiles = -(-m // tile_m) * -(-k // 64)
    assert offsets.size == grid_tiles + 1 and offsets[0] == 0 and np.all(np.diff(offsets) >= 0)
    assert words.size == 4 * offsets[-1] and words.dtype == np.uint32
    assert np.all((words >> 16) % 2 == 0)  # the high half is a byte offset: twice the half position
    pos = words >> 17
    sink = tile_m * 64
    assert np.all(pos < sink + fmt.SINK_HALVES)
    pads = pos >= sink
    assert np.all(words[pads] & 0xFFFF == 0) and pads.sum() == words.size - a.nnz
    if not strict:
        assert np.all(np.diff(offsets) * 4 - np.bincount(
            (np.repeat(np.arange(grid_tiles), 4 * np.diff(offsets)))[~pads], minlength=grid_tiles) < 4)


def test_empty_and_fully_dense_tiles():
    dense = np.ones((128, 64), np.float32)
    a = sp.block_diag([dense, np.zeros((128, 64)), dense], format="csr")  # 3x3 tiles, 2 full, 7 empty
    a.eliminate_zeros()
    plan = fmt.encode(a, "float16", 128)
    counts = np.diff(plan.arrays["tile_offsets"]) * 4
    assert list(counts) == [8192, 0, 0, 0, 0, 0, 0, 0, 8192]
    assert plan.constants["padding_words"] == 0
    assert np.array_equal(dense_of(plan), a.toarray())
    assert np.all(fmt.round_conflicts(plan) == 1)  # a full tile's rounds are whole virtual rounds


def test_tiles_with_residue_rows_and_columns():
    a = random_csr(130, 70, 0.4, seed=3)  # 2 x 2 tiles of 128 x 64, mostly padding in the last ones
    plan = fmt.encode(a, "float16", 128)
    assert plan.constants["m_tiles"] == 2 and plan.constants["k_tiles"] == 2
    assert np.array_equal(dense_of(plan), rounded_half(a, "float16").toarray())


@pytest.mark.parametrize("density", [0.1, 0.5, 0.9])
def test_scatter_rounds_are_bank_conflict_free(density):
    """Every warp-wide store round writes 32 distinct banks, strictly with strict_banks; by default
    all but the last few virtual rounds of each tile (where the emptier banks have run out)."""
    a = random_csr(512, 512, density, seed=4)
    strict = fmt.round_conflicts(fmt.encode(a, "float16", 128, strict_banks=True))
    assert strict.size and np.all(strict == 1)
    default = fmt.round_conflicts(fmt.encode(a, "float16", 128))
    assert np.mean(default == 1) >= {0.1: 0.55, 0.5: 0.8, 0.9: 0.9}[density]
    # the scatter's time (wavefronts) is near the bound set by the fullest bank, without padding bytes
    assert default.sum() <= 1.25 * strict.size


@pytest.mark.parametrize("strict", [False, True])
def test_encoding_does_not_depend_on_the_bands(monkeypatch, strict):
    """The encoder works a band of row tiles at a time; bands of one row tile (and of a few
    nonzeros) give the same words as one band for the whole matrix."""
    from sparsegen.formats import tiling

    a = random_csr(700, 1000, 0.3, seed=5)  # 6 x 16 tiles of 128 x 64, residues both ways
    whole = fmt.encode(a, "float16", 128, strict_banks=strict)
    assert len(tiling.bands(a.indptr, tiling.TileGrid(700, 1000, 128))) == 1
    monkeypatch.setattr(fmt, "bands", lambda indptr, grid: tiling.bands(indptr, grid, max_tiles=1, max_nonzeros=10))
    assert len(fmt.bands(a.indptr, tiling.TileGrid(700, 1000, 128))) == 6
    banded = fmt.encode(a, "float16", 128, strict_banks=strict)
    assert banded.constants == whole.constants
    for name in whole.arrays:
        assert np.array_equal(banded.arrays[name], whole.arrays[name]), name


def test_bands_cover_the_grid_in_whole_row_tiles():
    from sparsegen.formats import tiling

    a = random_csr(1000, 300, 0.5, seed=2)
    grid = tiling.TileGrid(1000, 300, 64)  # 16 row tiles, 5 tile columns
    got = tiling.bands(a.indptr, grid, max_tiles=20, max_nonzeros=5000)
    assert got[0].first == 0 and got[-1].stop == grid.m_tiles and got[-1].hi == a.nnz
    for prev, band in zip(got, got[1:]):
        assert band.first == prev.stop and band.lo == prev.hi
    for band in got:
        assert 1 <= band.row_tiles <= 4  # 20 tiles = 4 row tiles
        assert band.row_tiles == 1 or band.hi - band.lo <= 5000


def test_stable_order_is_numpys_stable_argsort():
    from sparsegen.formats import tiling

    rng = np.random.default_rng(0)
    for bound in (1, 7, 1 << 16, (1 << 16) + 1, 1 << 40):
        keys = rng.integers(0, bound, 5000, dtype=np.int64)
        assert np.array_equal(tiling.stable_order(keys, bound), np.argsort(keys, kind="stable")), bound
    assert tiling.stable_order(np.zeros(0, np.int64), 10).size == 0


# ---- the kernel's view: ldmatrix of the scattered tile gives mma's A operand -------------------

@pytest.mark.parametrize("tile_m", [64, 128, 256])
def test_ldmatrix_of_the_scattered_tile_yields_the_a_fragments(tile_m):
    a = random_csr(tile_m, 64, 0.5, seed=6)
    plan = fmt.encode(a, "float16", tile_m)
    smem = np.zeros(tile_m * 64 + fmt.SINK_HALVES, np.uint16)
    words = plan.arrays["words"]
    smem[words >> 17] = words & 0xFFFF  # the scatter: byte offset (high half) / 2 (padding writes the sink)
    w = halfbits.to_bits(a.toarray(), "float16")
    warp_rows = tile_m // 4
    lane = np.arange(32)
    j = lane >> 3
    for warp in range(4):
        for mf in range(warp_rows // 16):
            for ks in range(4):
                row = warp * warp_rows + mf * 16 + (lane & 7) + ((j & 1) << 3)
                chunk = ks * 2 + (j >> 1)
                got = ldmatrix(smem, row * 64 + ((chunk ^ (row & 7)) << 3))  # [lane][reg][half]
                for reg in range(4):
                    r, c = a_fragment_positions(lane, reg)
                    want = w[warp * warp_rows + mf * 16 + r, ks * 16 + c].T
                    assert np.array_equal(got[:, reg], want)


# ---- emulator against scipy ------------------------------------------------------------------

def emulate(a, n, dtype, bias=None, relu=False, seed=0, **options):
    kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="emulate",
                               options={"family": "tiled_csl_spmm", **options})
    x = host_x(np.random.default_rng(seed), a.shape[1], n, dtype)
    return kernel, kernel(x), reference(rounded_half(a, dtype), x.astype(np.float32), bias, relu)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 200), k=st.integers(1, 200), density=st.floats(0.05, 1), n=st.integers(1, 70),
       dtype=st.sampled_from(["float16", "bfloat16"]), epilogue=st.sampled_from(["none", "bias", "bias_relu"]),
       seed=st.integers(0, 1000))
def test_emulator_matches_scipy(m, k, density, n, dtype, epilogue, seed):
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    kernel, y, ref = emulate(a, n, dtype, bias, epilogue == "bias_relu", seed)
    assert y.shape == (m, n) and y.dtype == (np.float16 if dtype == "float16" else np.float32)
    assert rel_error(y, ref) <= TOL[dtype]


def test_n1_fp32_output_and_bf16_outputs_are_bf16_values():
    a = random_csr(150, 300, 0.3, seed=7)
    kernel, y, ref = emulate(a, 1, "float16", out="float32")
    assert y.dtype == np.float32 and kernel.spec.out == "f32" and rel_error(y, ref) <= 1e-3
    kernel, y, _ = emulate(a, 8, "bfloat16")
    assert np.array_equal(halfbits.round_bf16(y), y)


def test_emulator_rejects_wrong_host_dtypes():
    a = random_csr(64, 64, 0.5, seed=8)
    k16 = sparsegen.compile(a, n=8, dtype="bfloat16", backend="emulate", options={"family": "tiled_csl_spmm"})
    with pytest.raises(ShapeError, match="float32"):
        k16(np.zeros((64, 8), np.float16))


# ---- rule, spec, steps ------------------------------------------------------------------------

def test_rule_declines_what_tensor_core_tiles_cannot_do():
    s = analyze(random_csr(256, 256, 0.3, seed=9))
    def rule(stats, request):
        return rule_decision(stats, request, fam.FAMILY)

    for request, needle in [(dict(op="sddmm", n=8, k=8), "not spmm"), (dict(n=8, dtype="float32"), "float16/bfloat16"),
                            (dict(n=8, dtype="float16", options=(("out", "bfloat16"),)), "options out")]:
        req = sparsegen.families.base.Request(**{"op": "spmm", **request})
        d = rule(s, req)
        assert not d.accepted and needle in d.reason, d.reason
    wide = rule(s, sparsegen.families.base.Request("spmm", n=300, dtype="float16"))
    assert wide.accepted or "n=300" not in wide.reason  # small W: wide X re-reads W from L2
    big = dataclasses.replace(s, shape=(4096, 4096))
    d = rule(big, sparsegen.families.base.Request("spmm", n=300, dtype="float16"))
    assert not d.accepted and "n=300 > 256 with W of 32 MB" in d.reason, d.reason
    sparse = analyze(random_csr(256, 256, 0.01, seed=9))
    d = rule(sparse, sparsegen.families.base.Request("spmm", n=8, dtype="float16"))
    assert not d.accepted and "density" in d.reason
    ok = rule(s, sparsegen.families.base.Request("spmm", n=256, dtype="bfloat16", options=(("family", fam.FAMILY),)))
    assert ok.accepted and ok.spec.dtype == "bf16" and ok.spec.n_tiles == 4


def test_spec_name_spells_every_parameter():
    spec = fam.Spec("bf16", "f32", 7168, 28672, 24, 128, 32, 5, "atomic", True, False, 3, stages=6, cap_vecs=90,
                    strict_banks=True, l2_prefetch=True)
    assert spec.name == "tiled_csl_spmm.bf16.of32.m7168k28672n24.t128x64.bn32.sk5a.mb3.st6.c90.sb.pf.bias"
    assert (fam.Spec("f16", "f16", 64, 64, 8, 64, 8, 1, "none").name
            == "tiled_csl_spmm.f16.m64k64n8.t64x64.bn8.sk1.st4.c0")
    assert fam.Spec("f16", "f16", 64, 640, 8, 64, 8, 5, "cluster").name.startswith(
        "tiled_csl_spmm.f16.m64k640n8.t64x64.bn8.sk5c.")
    assert spec.kt_per_split == 90 and spec.mf == 2 and spec.nf == 4 and spec.xv == 8
    # shared memory: two W buffers (tile + 128-byte sink) and the ring slots (X tile + words, whole 128-byte rows)
    assert spec.shared_bytes == 2 * (128 * 64 * 2 + 128) + 6 * (64 * 32 * 2 + 16 * 96)
    assert "constexpr int SLOT_BYTES = (X_TILE_BYTES + CAP_VECS * 16 + 127) / 128 * 128;" in render(spec)
    cluster = fam.Spec("f16", "f16", 4096, 4096, 64, 128, 64, 4, "cluster", stages=3, cap_vecs=1)
    assert cluster.exchange_bytes == 128 * 72 * 4 and cluster.shared_bytes >= cluster.exchange_bytes


def test_fp16_selection_picks_a_tiled_family_with_a_reason_and_float32_does_not():
    # large enough that the tile kernels' fixed ~11 us is paid back (1024 x 2048 goes to the CSR kernels)
    s = analyze(random_csr(2048, 4096, 0.2, seed=10))
    sel = select(s, op="spmm", n=16, dtype="float16")
    assert sel.spec.family in ("tiled_bitmap_spmm", "tiled_csl_spmm")
    assert "split-K" in sel.reason and "SMs" in sel.reason
    assert not select(s, op="spmm", n=16, dtype="float32").spec.family.startswith("tiled")


@pytest.mark.parametrize("m,k,n", [(7168, 28672, 8), (28672, 7168, 64), (12288, 49152, 32), (256, 256, 16)])
def test_split_k_is_derived_from_shape_and_sm_count(m, k, n):
    """No split empty; enough blocks for the SMs when K allows; the reason says how. Past one wave
    at N <= 32, stream-K instead (T.STREAM_BNS), its grid every resident slot."""
    stats = uniform_stats(m, k, 0.2)
    spec, reason = skinny_cost.build(stats, sparsegen.families.base.Request("spmm", n=n, dtype="float16"), fam.FAMILY)
    if spec.reduction == "stream":
        assert n <= 32 and "past one wave" in reason and "stream-K" in reason
        assert spec.grid == min(132 * spec.min_blocks, spec.m_tiles * spec.k_tiles // 4)
        return
    assert (spec.split_k - 1) * spec.kt_per_split < spec.k_tiles
    assert spec.reduction == ("none" if spec.split_k == 1 else spec.reduction)
    blocks = spec.m_tiles * spec.n_tiles * spec.split_k
    assert n > 32 or blocks <= 132 * spec.min_blocks  # else stream-K
    if spec.k_tiles >= 4 * 8:
        assert blocks >= 132
    assert "blocks for 132 SMs" in reason
    few = skinny_cost.build(stats, sparsegen.families.base.Request("spmm", n=n, dtype="float16",
                                                                   device=synthetic_device(sm_count=40)), fam.FAMILY)[0]
    assert few.m_tiles * few.n_tiles * few.split_k <= blocks or few.tile_m < spec.tile_m


def chosen_spec(family, m, k, density, n, tile_m):
    """(request, spec) the family's chooser builds for a matrix like m x k at `density` (tile_m
    forced when given; 256-row tiles only up to 32 columns, the chooser's own bound)."""
    from sparsegen.families.base import Request

    if tile_m == 256 and n > 32:
        tile_m = 128
    options = (("tile_m", tile_m),) if tile_m else ()
    request = Request("spmm", n=n, dtype="float16", options=options)
    spec, _ = skinny_cost.build(uniform_stats(m, k, density), request, family.FAMILY)
    return request, spec


def test_options_force_split_and_reduction_and_steps_follow():
    a = random_csr(300, 1000, 0.3, seed=11)
    for reduction, kernels, scratch in [("atomic", ["tiled_csl_spmm"], {"workspace", "counters"}),
                                        ("two_step", ["tiled_csl_spmm", "tiled_csl_spmm_reduce"], {"workspace"})]:
        kernel, y, ref = emulate(a, 12, "float16", bias=np.ones(300), split_k=3, reduction=reduction)
        spec = kernel.spec
        assert spec.split_k == 3 and spec.reduction == reduction
        steps = fam.steps(spec, kernel.plan)
        assert [s.kernel for s in steps] == kernels
        assert {a.name for s in steps for a in s.args if a.kind == "scratch"} == scratch
        assert steps[0].launch.grid == (spec.n_tiles, spec.m_tiles, 3)
        c = kernel.plan.constants
        assert c["workspace_bytes"] == 4 * 300 * 12 * (3 if reduction == "two_step" else 1)
        assert rel_error(y, ref) <= TOL["float16"]
    kernel, _, _ = emulate(a, 12, "float16")
    assert [s.kernel for s in fam.steps(kernel.spec, kernel.plan)] == ["tiled_csl_spmm"]


@pytest.mark.parametrize("family", ["tiled_csl_spmm", "tiled_bitmap_spmm"])
def test_option_bn_narrows_column_blocks_and_is_checked(family):
    """options bn= sets the columns per block (several column blocks per row tile); values that are
    not an mma-friendly power of two or exceed N rounded up are declined by name."""
    a = random_csr(200, 300, 0.3, seed=21)
    x = host_x(np.random.default_rng(3), 300, 40, "float16")
    kernel = sparsegen.compile(a, n=40, dtype="float16", backend="emulate", options={"family": family, "bn": 16})
    assert kernel.spec.bn == 16 and kernel.spec.n_tiles == 3 and ".bn16." in kernel.spec.name
    assert "constexpr int BN = 16;" in kernel.source
    assert rel_error(kernel(x), reference(rounded_half(a, "float16"), x.astype(np.float32))) <= TOL["float16"]
    for bad in (12, 128):
        with pytest.raises(UnsupportedError, match=f"bn={bad}"):
            sparsegen.compile(a, n=40, dtype="float16", backend="emulate", options={"family": family, "bn": bad})
    with pytest.raises(UnsupportedError, match="at most 16"):
        sparsegen.compile(a, n=9, dtype="float16", backend="emulate", options={"family": family, "bn": 32})


def test_api_compile_emulate_and_describe():
    a = random_csr(200, 300, 0.3, seed=12)
    kernel = sparsegen.compile(a, n=32, dtype="float16", backend="emulate", options={"family": "tiled_csl_spmm"})
    from sparsegen.families import _tiled as T

    assert kernel.spec.cap_vecs == T.shared_cap(kernel.plan.constants["max_tile_vectors"]) >= 1
    assert fam.MIN_STAGES <= kernel.spec.stages <= fam.MAX_STAGES
    assert "TILED_KERNEL\ntiled_csl_spmm(" in kernel.source
    assert f"constexpr int CAP_VECS = {kernel.spec.cap_vecs};" in kernel.source
    assert "mma.sync.aligned.m16n8k16" in kernel.source
    assert kernel.describe()["selection"]["family"] == "tiled_csl_spmm"
    with pytest.raises(UnsupportedError):
        sparsegen.compile(a, n=32, dtype="float32", backend="emulate", options={"family": "tiled_csl_spmm"})


# ---- nvcc tier -----------------------------------------------------------------------------------

CODE_SHAPES = [  # (m, k, density, n, dtype, options): one per code path
    (300, 200, 0.3, 16, "float16", {}),  # 16-byte X copies, no split
    (300, 200, 0.3, 1, "float16", {}),  # N = 1: scalar X loads, x2 ldmatrix, single stores
    (130, 300, 0.5, 12, "bfloat16", {"split_k": 2, "reduction": "atomic"}),  # 8-byte copies, red.v2
    (130, 300, 0.5, 6, "bfloat16", {"split_k": 3, "reduction": "two_step", "out": "float32"}),  # 4-byte copies
    (512, 512, 1.0, 64, "float16", {"tile_m": 128, "strict_banks": True}),  # dense tiles, 4-chunk B loads
    (256, 256, 0.6, 33, "float16", {"split_k": 2, "reduction": "atomic"}),  # odd N, scalar atomics
    (256, 300, 0.6, 24, "float16", {"tile_m": 256}),  # four m16 fragments per warp
    (600, 640, 0.2, 256, "bfloat16", {}),  # four column tiles
    (300, 2000, 0.3, 16, "float16", {"split_k": 5, "reduction": "cluster"}),  # cluster reduction, 5 blocks
    (200, 1000, 0.4, 64, "bfloat16", {"split_k": 8, "reduction": "cluster", "tile_m": 64}),  # 8 blocks, bn 64
    (300, 700, 0.5, 13, "float16", {"split_k": 2, "reduction": "cluster", "out": "float32"}),  # odd N, f32 out
    (256, 900, 0.3, 32, "float16", {"stages": 3, "l2_prefetch": True, "cap_vecs": 8}),  # shallow, rest from global
    (256, 900, 0.1, 8, "float16", {"stages": 8, "tile_m": 64}),  # deep ring, two-fragment warps
    (300, 900, 0.3, 16, "float16", {"warps": 8, "split_k": 3, "reduction": "atomic"}),  # 8 warps, one m16 each
    (512, 700, 0.4, 64, "bfloat16", {"warps": 8, "tile_m": 256, "split_k": 2, "reduction": "cluster"}),  # 8 x 32 rows
    (300, 900, 0.3, 16, "float16", {"warp_k": 4, "split_k": 3, "reduction": "atomic"}),  # 4 k-groups, 128 rows each
    (300, 900, 0.3, 13, "float16", {"warp_k": 2, "tile_m": 64, "split_k": 2, "reduction": "cluster"}),  # 2 x 2
    (300, 900, 0.3, 8, "float16", {"warp_k": 4, "warps": 8, "split_k": 2, "reduction": "two_step"}),  # 2 x 4
    (300, 900, 0.3, 16, "float16", {"wgmma": True, "split_k": 3, "reduction": "atomic"}),  # warpgroup MMA, sm_90a
    (300, 200, 0.3, 1, "float16", {"wgmma": True}),  # wgmma n8 with scalar X stores
    (512, 700, 0.4, 64, "bfloat16", {"wgmma": True, "warps": 8, "tile_m": 256, "split_k": 2, "reduction": "cluster"}),
]
CSL_ONLY = ("strict_banks", "cap_vecs", "warp_k")


@pytest.mark.nvcc
@pytest.mark.parametrize("shape", CODE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-n{s[3]}-{s[4]}-{'-'.join(map(str, s[5].values()))}")
@pytest.mark.parametrize("epilogue", [False, True])
def test_every_code_shape_compiles_for_sm90_with_hmma(shape, epilogue, tmp_path):
    m, k, density, n, dtype, options = shape
    a = random_csr(m, k, density, seed=13)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", bias=np.ones(m) if epilogue else None,
                               relu=epilogue, options={"family": "tiled_csl_spmm", **options})
    cubin = nvcc.compile_cubin(kernel.source, kernel.spec.compile_arch("sm_90"), name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF"
    assert_sass_has_hmma(cubin, tmp_path, kernel.spec.wgmma)


def assert_sass_has_hmma(cubin: bytes, tmp_path, wgmma: bool = False):
    if shutil.which("cuobjdump") is None:
        pytest.skip("cuobjdump not on PATH: SASS not inspected")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True).stdout
    if not sass:
        pytest.skip("cuobjdump could not disassemble (nvdisasm missing?)")
    assert ("HGMMA.64x" if wgmma else "HMMA.16816.F32") in sass
    assert "LDL" not in sass and "STL" not in sass  # no register spills to local memory


# ---- residency, ring depth and shared memory -----------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 60000), k=st.integers(1, 60000), density=st.floats(0.05, 1.0), n=st.integers(1, 256),
       fullest=st.floats(0.0, 1.0), tile_m=st.sampled_from([None, 64, 128, 256]))
def test_every_chosen_spec_fits_an_sm_with_the_residency_it_asks_for(m, k, density, n, fullest, tile_m):
    """Whatever the shape, density and fullest tile: a ring of at least MIN_STAGES slots that fits
    the shared memory of the min_blocks resident blocks __launch_bounds__ asks for, registers included."""
    from sparsegen.families import _tiled as T
    from sparsegen.formats import Plan

    request, spec = chosen_spec(fam, m, k, density, n, tile_m)
    vectors = max(1, int(fullest * spec.tile_m * 64 / 4))
    spec = fam.finalize(spec, Plan("tiled_csl", {}, {"max_tile_vectors": vectors}), request)
    assert fam.MIN_STAGES <= spec.stages <= fam.MAX_STAGES and 1 <= spec.cap_vecs <= T.shared_cap(vectors)
    assert spec.min_blocks >= 1
    assert spec.shared_bytes + spec.static_bytes <= T.smem_budget(spec.min_blocks, request.device)
    assert fam.registers(spec.tile_m, spec.bn) * T.THREADS * spec.min_blocks <= request.device.registers_per_sm
    if spec.reduction == "cluster":
        assert 2 <= spec.split_k <= T.MAX_CLUSTER
