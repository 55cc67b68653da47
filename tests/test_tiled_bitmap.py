"""Tiled bitmap: encoder invariants and bytes against Tiled-CSL, the kernel's fragment decode and
X/B path mirrored in NumPy, the emulator against scipy, the bitmap-vs-CSL rule, and (nvcc tier)
every code shape compiles."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.families import tiled_bitmap_spmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import halfbits
from sparsegen.formats import tiled_bitmap as fmt
from sparsegen.formats import tiled_csl
from .tiled_helpers import select_tiled as select

from .helpers import random_csr, reference, rel_error
from .test_tiled_csl import CODE_SHAPES, assert_sass_has_hmma
from .tiled_helpers import (TOL, a_fragment_positions, b_expected, b_fragments, host_x, rounded_half,
                            x_tile_smem)


@pytest.mark.parametrize("tile_m", [64, 128, 256])
def test_element_codes_cover_each_fragment_once_in_a_fragment_layout(tile_m):
    r, c = np.meshgrid(np.arange(tile_m), np.arange(64), indexing="ij")
    frag, code = fmt.element_code(r.ravel(), c.ravel(), tile_m)
    assert np.array_equal(np.sort(frag * 256 + code), np.arange(tile_m * 64))
    rr, cc = fmt.element_position(frag, code, tile_m)
    assert np.array_equal(rr, r.ravel()) and np.array_equal(cc, c.ravel())
    # code = lane * 8 + 2 reg + half at the m16n8k16 A-operand position of (lane, reg, half)
    lane, i = code // 8, code % 8
    fr, fc = a_fragment_positions(lane, i // 2)
    assert np.array_equal(r.ravel() % 16, fr) and np.array_equal(c.ravel() % 16, fc[i % 2, np.arange(i.size)])


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 200), density=st.floats(0, 1), tile_m=st.sampled_from([64, 128, 256]),
       dtype=st.sampled_from(["float16", "bfloat16"]), seed=st.integers(0, 1000))
def test_round_trip_and_layout_invariants(m, k, density, tile_m, dtype, seed):
    a = random_csr(m, k, density, seed=seed)
    plan = fmt.encode(a, dtype, tile_m)
    assert np.array_equal(fmt.decode(plan).toarray(), rounded_half(a, dtype).toarray())
    tiles = -(-m // tile_m) * -(-k // 64)
    offs = plan.arrays["slice_offsets"].astype(np.int64)
    assert offs.size == (tiles + 1) * 4 and np.all(np.diff(offs) >= 0)
    assert np.all(offs[::4] % 8 == 0)  # tiles start on 16-byte boundaries (cp.async)
    assert np.all(offs[-4:] == plan.arrays["values"].size) and plan.arrays["values"].size % 8 == 0
    assert plan.arrays["bitmaps"].size == tiles * tile_m * 64 // 32
    popcounts = np.unpackbits(plan.arrays["bitmaps"].view(np.uint8)).sum()
    assert popcounts == a.nnz
    # a slice's values are exactly its fragments' nonzeros; a tile's last slice also holds its padding
    per_slice = np.unpackbits(plan.arrays["bitmaps"].view(np.uint8)).reshape(tiles * 4, -1).sum(axis=1)
    lengths = np.diff(offs)[: tiles * 4]
    last = np.arange(tiles * 4) % 4 == 3
    assert np.array_equal(lengths[~last], per_slice[~last])
    assert np.all((lengths[last] - per_slice[last] >= 0) & (lengths[last] - per_slice[last] < 8))


def test_bitmap_is_smaller_than_csl_above_one_sixteenth():
    for density, smaller in [(0.03, False), (0.1, True), (0.3, True), (0.5, True), (0.9, True)]:
        a = random_csr(1024, 1024, density, seed=1)
        b = fmt.encoded_bytes(fmt.encode(a, "float16", 128))
        c = tiled_csl.encode(a, "float16", 128)
        csl = c.arrays["words"].nbytes + c.arrays["tile_offsets"].nbytes
        assert (b < csl) == smaller, (density, b, csl)
    a = random_csr(1024, 1024, 0.5, seed=1)
    assert fmt.encoded_bytes(fmt.encode(a, "float16", 128)) < 0.6 * a.nnz * 4


def test_empty_and_fully_dense_tiles():
    a = sp.block_diag([np.ones((128, 64)), np.zeros((128, 64)), np.ones((128, 64))], format="csr")
    a.eliminate_zeros()
    plan = fmt.encode(a, "bfloat16", 128)
    assert plan.constants["empty_tiles"] == 7 and plan.constants["max_tile_values"] == 8192
    assert np.array_equal(fmt.decode(plan).toarray(), a.toarray())
    offs = plan.arrays["slice_offsets"]
    assert list(offs[::4]) == [0] + [8192] * 8 + [16384]


# ---- the kernel's view: decode_fragment and the X/B path ----------------------------------------

def decode_fragment(bitmap_bytes, vals, vo):
    """NumPy mirror of the template's decode_fragment: per lane its byte, a warp prefix sum of
    popcounts, its values read consecutively. Returns a[lane][reg][half] and the new offset."""
    bits = bitmap_bytes.astype(np.int64)
    count = np.array([bin(int(b)).count("1") for b in bits])
    incl = np.cumsum(count)
    out = np.zeros((32, 4, 2), np.uint16)
    for lane in range(32):
        p = vo + incl[lane] - count[lane]
        for i in range(8):
            if bits[lane] >> i & 1:
                out[lane, i // 2, i % 2] = vals[p]
                p += 1
    return out, vo + int(incl[-1])


@pytest.mark.parametrize("tile_m,density", [(64, 0.5), (128, 0.2), (256, 0.9)])
def test_warp_decode_yields_the_a_fragments(tile_m, density):
    a = random_csr(tile_m, 64, density, seed=2)
    plan = fmt.encode(a, "float16", tile_m)
    w = halfbits.to_bits(a.toarray(), "float16")
    bm = plan.arrays["bitmaps"].view(np.uint8)
    slices = plan.arrays["slice_offsets"]
    mf_count, lane = tile_m // 64, np.arange(32)
    for warp in range(4):
        vals = plan.arrays["values"][slices[warp]:]
        vo = 0
        for ks in range(4):
            for mf in range(mf_count):
                f = warp * 4 * mf_count + ks * mf_count + mf
                got, vo = decode_fragment(bm[f * 32:(f + 1) * 32], vals, vo)
                for reg in range(4):
                    r, c = a_fragment_positions(lane, reg)
                    want = w[warp * tile_m // 4 + mf * 16 + r, ks * 16 + c].T
                    assert np.array_equal(got[:, reg], want)
        assert vo == slices[warp + 1] - slices[warp] or warp == 3


@pytest.mark.parametrize("bn,xv", [(8, 1), (8, 8), (16, 4), (32, 2), (64, 8)])
def test_x_tile_swizzle_and_ldmatrix_trans_yield_the_b_fragments(bn, xv):
    x = np.arange(64 * bn, dtype=np.uint16).reshape(64, bn)
    smem = x_tile_smem(x, bn, xv)
    assert np.array_equal(np.sort(smem), np.sort(x.ravel()))
    for ks in range(4):
        got = b_fragments(smem, bn, ks)
        for nf in range(bn // 8):
            assert np.array_equal(got[nf], b_expected(x, ks, nf))


def test_x_tile_rows_read_together_hit_distinct_bank_groups():
    from .tiled_helpers import x_chunk

    for bn in (8, 16, 32, 64):
        for r0 in range(0, 64, 8):
            for chunk in range(bn // 8):
                groups = [x_chunk(r, chunk, bn) % 8 for r in range(r0, r0 + 8)]
                assert len(set(groups)) == 8, (bn, r0, chunk)


# ---- emulator ---------------------------------------------------------------------------------

def emulate(a, n, dtype, bias=None, relu=False, seed=0, **options):
    kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="emulate",
                               options={"family": "tiled_bitmap_spmm", **options})
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
    assert y.shape == (m, n)
    assert rel_error(y, ref) <= TOL[dtype]


def test_finalize_sizes_value_buffer_and_ring():
    a = sp.block_diag([np.ones((128, 64)), random_csr(128, 64, 0.2, seed=3).toarray()], format="csr")
    kernel, y, ref = emulate(a, 64, "float16", tile_m=128)
    assert kernel.spec.vcap == 8192 and 2 <= kernel.spec.stages <= 4
    assert kernel.spec.shared_bytes <= fam.STAGE_BUDGET or kernel.spec.stages == 2
    assert rel_error(y, ref) <= TOL["float16"]
    assert f"constexpr int VCAP = {kernel.spec.vcap};" in kernel.source


# ---- rule ---------------------------------------------------------------------------------------

def test_rule_prefers_bitmap_when_it_is_predicted_faster_and_says_why():
    half = analyze(random_csr(2048, 2048, 0.5, seed=4))
    sel = select(half, op="spmm", n=8, dtype="float16")
    assert sel.spec.family == "tiled_bitmap_spmm"
    assert "bitmap" in sel.reason and "Tiled-CSL" in sel.reason and "B/element" in sel.reason
    assert any(r == "tiled_csl_spmm" for r, _, _ in sel.candidates)
    sparse = analyze(random_csr(2048, 2048, 0.08, seed=4))
    d = fam.RULES[0].decide(sparse, Request("spmm", n=8, dtype="float16"))
    assert not d.accepted and "Tiled-CSL predicted faster" in d.reason
    forced = fam.RULES[0].decide(sparse, Request("spmm", n=8, dtype="float16", options=(("family", fam.FAMILY),)))
    assert forced.accepted


def test_compare_uses_the_tile_density_spread():
    """Same density, but clustered in a few dense tiles with the rest empty: CSL skips the empty
    tiles at no cost and bitmap pays its decode only on the dense ones; both predictions drop."""
    uniform = analyze(random_csr(2048, 2048, 0.1, seed=5))
    blocks = [np.ones((128, 64)) if i % 10 == 0 else np.zeros((128, 64)) for i in range(16 * 32)]
    clustered = analyze(sp.csr_matrix(np.block([blocks[r * 32:(r + 1) * 32] for r in range(16)])))
    req = Request("spmm", n=8, dtype="float16")
    tb_u, tc_u, why_u = fam.compare(uniform, req)
    tb_c, tc_c, why_c = fam.compare(clustered, req)
    assert "empty" in why_c and tb_c < tb_u
    assert tb_c < tc_c  # dense tiles: 1/8 + 2 bytes per element against 4


def test_spec_name():
    spec = fam.Spec("f16", "f16", 7168, 28672, 16, 128, 16, 4, "two_step", False, True, 3, 2048)
    assert spec.name == "tiled_bitmap_spmm.f16.m7168k28672n16.t128x64.bn16.sk4r.st3.v2048.relu"


# ---- nvcc tier ---------------------------------------------------------------------------------

@pytest.mark.nvcc
@pytest.mark.parametrize("shape", CODE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-n{s[3]}-{s[4]}-{'-'.join(map(str, s[5].values()))}")
@pytest.mark.parametrize("epilogue", [False, True])
def test_every_code_shape_compiles_for_sm90_with_hmma(shape, epilogue, tmp_path):
    m, k, density, n, dtype, options = shape
    options = {key: v for key, v in options.items() if key != "strict_banks"}
    a = random_csr(m, k, density, seed=13)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", bias=np.ones(m) if epilogue else None,
                               relu=epilogue, options={"family": "tiled_bitmap_spmm", **options})
    cubin = nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF"
    assert_sass_has_hmma(cubin, tmp_path)
