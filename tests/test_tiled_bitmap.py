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
from sparsegen.errors import UnsupportedError
from sparsegen.families import _tiled as T
from sparsegen.select import rule_decision, skinny_cost
from sparsegen.families import tiled_bitmap_spmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import halfbits
from sparsegen.formats import tiled_bitmap as fmt
from sparsegen.formats import tiled_csl
from .tiled_helpers import select_tiled as select

from .helpers import random_csr, reference, rel_error
from .test_tiled_csl import CODE_SHAPES, CSL_ONLY, assert_sass_has_hmma
from .tiled_helpers import (TOL, a_fragment_positions, b_expected, b_fragments, host_x, pinned_library,
                            rounded_half, uniform_stats, x_tile_smem)


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


# ---- the kernel's view: fragment_starts, decode_fragment and the X/B path --------------------------

U32 = 0xFFFFFFFF


def popc_bytes(w):
    """The template's popc_bytes: SWAR popcount of each byte of a uint32 (array)."""
    w = np.asarray(w, dtype=np.uint64)
    w = (w - ((w >> 1) & 0x55555555)) & U32
    w = ((w & 0x33333333) + ((w >> 2) & 0x33333333)) & U32
    return ((w + (w >> 4)) & 0x0F0F0F0F) & U32


def scan_bytes(c):
    """The template's scan_bytes over 32 lanes: Hillis-Steele with shfl_up, uint32 wrap-around."""
    c = np.asarray(c, dtype=np.uint64).copy()
    for d in (1, 2, 4, 8, 16):
        up = np.concatenate([c[:d], c[:-d]])  # shfl_up: lanes < d get their own value back (unused)
        c = np.where(np.arange(32) >= d, (c + up) & U32, c)
    return c


def fragment_starts(w, vals):
    """NumPy mirror of the template's fragment_starts: w[lane][j] (BW words per lane) -> byte
    addresses [lane][f] of each lane's first value in fragment f, from the slice's address `vals`."""
    lanes, bw = w.shape
    at = np.zeros((lanes, 4 * bw), dtype=np.int64)
    base = vals
    for j in range(bw):
        c = popc_bytes(w[:, j])
        excl = (scan_bytes(c) - c) & U32
        te = int(((c & 0x00FF00FF) & U32).sum()) & U32  # __reduce_add_sync
        to = int((((c >> 8) & 0x00FF00FF) & U32).sum()) & U32
        pair = (te + to) & U32
        b1, b2 = base + 2 * (te & 0xFFFF), base + 2 * (pair & 0xFFFF)
        e = excl.astype(np.int64)
        at[:, 4 * j + 0] = base + 2 * (e & 0xFF)
        at[:, 4 * j + 1] = b1 + 2 * ((e >> 8) & 0xFF)
        at[:, 4 * j + 2] = b2 + 2 * ((e >> 16) & 0xFF)
        at[:, 4 * j + 3] = b2 + 2 * (te >> 16) + 2 * (e >> 24)
        base = b2 + 2 * (pair >> 16)
    return at


def decode_fragment(byte, vals, at):
    """NumPy mirror of the template's decode_fragment for all lanes: lane's byte of the fragment, its
    values read consecutively from half index at // 2. Returns a[lane][reg][half]."""
    out = np.zeros((32, 4, 2), np.uint16)
    for lane in range(32):
        p = at[lane] // 2
        for i in range(8):
            if byte[lane] >> i & 1:
                out[lane, i // 2, i % 2] = vals[p]
                p += 1
    return out


@pytest.mark.parametrize("tile_m,density,warps", [(64, 0.5, 4), (128, 0.2, 4), (256, 0.9, 4), (128, 1.0, 4),
                                                 (256, 0.03, 4), (128, 0.3, 8), (256, 1.0, 8)])
def test_warp_decode_yields_the_a_fragments(tile_m, density, warps):
    """The lane-major bitmap bytes, the packed scan (a fully dense fragment sums to 256 at lane 31:
    density 1.0 checks its exclusive prefix stays exact) and the per-fragment starts reproduce every
    A fragment of every warp."""
    a = random_csr(tile_m, 64, density, seed=2)
    plan = fmt.encode(a, "float16", tile_m, warps=warps)
    w = halfbits.to_bits(a.toarray(), "float16")
    fpw = fmt.fragments_per_warp(tile_m, warps)
    words = plan.arrays["bitmaps"].reshape(warps, 32, fpw // 4)  # [warp][lane][word]: one shared load per lane
    slices = plan.arrays["slice_offsets"]
    mf_count, lane = tile_m // warps // 16, np.arange(32)
    values = plan.arrays["values"]
    for warp in range(warps):
        at = fragment_starts(words[warp].astype(np.uint64), 2 * int(slices[warp]))
        for ks in range(4):
            for mf in range(mf_count):
                f = ks * mf_count + mf
                byte = (words[warp][:, f // 4].astype(np.int64) >> (8 * (f % 4))) & 0xFF
                got = decode_fragment(byte, values, at[:, f])
                for reg in range(4):
                    r, c = a_fragment_positions(lane, reg)
                    want = w[warp * tile_m // warps + mf * 16 + r, ks * 16 + c].T
                    assert np.array_equal(got[:, reg], want)
        # the last fragment's values end where the slice ends
        last_byte = (words[warp][:, -1].astype(np.int64) >> 24) & 0xFF
        end = at[31, -1] // 2 + bin(int(last_byte[31])).count("1")
        assert end == (slices[warp + 1] if warp < warps - 1 else slices[0] + (w != 0).sum())


# ---- granule 2: a bit per mma register, its 32-bit word stored whole -------------------------------

@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 200), density=st.floats(0, 1), tile_m=st.sampled_from([64, 128, 256]),
       dtype=st.sampled_from(["float16", "bfloat16"]), seed=st.integers(0, 1000))
def test_pair_round_trip_and_layout_invariants(m, k, density, tile_m, dtype, seed):
    a = random_csr(m, k, density, seed=seed)
    plan = fmt.encode(a, dtype, tile_m, granule=2)
    assert plan.arrays["values"].dtype == np.uint32 and plan.constants["granule"] == 2
    assert np.array_equal(fmt.decode(plan).toarray(), rounded_half(a, dtype).toarray())
    tiles = -(-m // tile_m) * -(-k // 64)
    offs = plan.arrays["slice_offsets"].astype(np.int64)
    assert offs.size == (tiles + 1) * 4 and np.all(np.diff(offs) >= 0)
    assert np.all(offs[::4] % 4 == 0)  # tiles start on 16-byte boundaries: 4 words
    assert np.all(offs[-4:] == plan.arrays["values"].size) and plan.arrays["values"].size % 4 == 0
    assert plan.arrays["bitmaps"].size == tiles * tile_m * 64 // 64  # one bit per two elements
    # one bit per register holding a nonzero: a register is (row, column pair) of the tile
    coo = a.tocoo()
    registers = np.unique(coo.row.astype(np.int64) * 10**6 + coo.col // 2)
    assert np.unpackbits(plan.arrays["bitmaps"].view(np.uint8)).sum() == registers.size


def test_pair_encoding_trades_bytes_for_decode():
    """More bytes than single-element bits (4 per nonzero register against 2 per nonzero), near
    Tiled-CSL's at 90 % sparsity: the module docstring's figures."""
    a = random_csr(2048, 2048, 0.1, seed=1)
    single = fmt.encoded_bytes(fmt.encode(a, "float16", 128)) / a.size * a.nnz / 2048**2
    pairs = fmt.encoded_bytes(fmt.encode(a, "float16", 128, granule=2)) / 2048**2
    assert 0.30 < single < 0.36 and 0.40 < pairs < 0.48
    with pytest.raises(ValueError, match="granule"):
        fmt.encode(a, "float16", 128, granule=4)


def popc_nibbles(w):
    w = np.asarray(w, dtype=np.uint64)
    w = (w - ((w >> 1) & 0x55555555)) & U32
    return ((w & 0x33333333) + ((w >> 2) & 0x33333333)) & U32


def pair_fragment_starts(w, vals, fpw):
    """NumPy mirror of the granule-2 fragment_starts: w[lane][j] words of 8 nibbles -> byte addresses
    [lane][f] of each lane's first word in fragment f."""
    lanes, bw = w.shape
    at = np.zeros((lanes, fpw), dtype=np.int64)
    base = vals
    for j in range(bw):
        c = popc_nibbles(w[:, j])
        ce, co = c & 0x0F0F0F0F, (c >> 4) & 0x0F0F0F0F
        xe, xo = (scan_bytes(ce) - ce) & U32, (scan_bytes(co) - co) & U32
        t04, t26 = int((ce & 0x00FF00FF).sum()), int(((ce >> 8) & 0x00FF00FF).sum())
        t15, t37 = int((co & 0x00FF00FF).sum()), int(((co >> 8) & 0x00FF00FF).sum())
        tot = [t04 & 0xFFFF, t15 & 0xFFFF, t26 & 0xFFFF, t37 & 0xFFFF, t04 >> 16, t15 >> 16, t26 >> 16, t37 >> 16]
        for f in range(8):
            if 8 * j + f < fpw:
                x = (xo if f & 1 else xe).astype(np.int64)
                at[:, 8 * j + f] = base + 4 * ((x >> (8 * (f >> 1))) & 0xFF)
            base += 4 * tot[f]
    return at


@pytest.mark.parametrize("tile_m,density,warps", [(64, 0.5, 4), (128, 0.2, 4), (256, 0.9, 4), (128, 1.0, 4),
                                                 (256, 0.03, 4), (128, 0.3, 8), (256, 1.0, 8)])
def test_pair_warp_decode_yields_the_a_fragments(tile_m, density, warps):
    """Granule 2: a lane's nibble per fragment, the packed even/odd scans (a dense fragment's lane
    prefix reaches 4 x 31) and the fragments' totals reproduce every A fragment of every warp."""
    a = random_csr(tile_m, 64, density, seed=2)
    plan = fmt.encode(a, "float16", tile_m, warps=warps, granule=2)
    w = halfbits.to_bits(a.toarray(), "float16")
    fpw = fmt.fragments_per_warp(tile_m, warps)
    lane_bytes = fpw // 2
    raw = plan.arrays["bitmaps"].view(np.uint8).reshape(warps, 32, lane_bytes)
    if lane_bytes < 4:  # a 16-bit load into the low half of one word
        raw = np.concatenate([raw, np.zeros((warps, 32, 4 - lane_bytes), np.uint8)], axis=2)
    words = raw.copy().view("<u4").astype(np.uint64)  # [warp][lane][word]
    slices = plan.arrays["slice_offsets"]
    values = plan.arrays["values"]
    mf_count, lane = tile_m // warps // 16, np.arange(32)
    for warp in range(warps):
        at = pair_fragment_starts(words[warp], 4 * int(slices[warp]), fpw)
        for ks in range(4):
            for mf in range(mf_count):
                f = ks * mf_count + mf
                nibble = (words[warp][:, f // 8].astype(np.int64) >> (4 * (f % 8))) & 0xF
                q = at[:, f] // 4
                for reg in range(4):
                    present = (nibble >> reg) & 1
                    got = np.where(present == 1, values[np.minimum(q, values.size - 1)], 0)
                    q = q + present
                    r, c = a_fragment_positions(lane, reg)
                    want = w[warp * tile_m // warps + mf * 16 + r, ks * 16 + c].T.astype(np.uint32)
                    assert np.array_equal(got, want[:, 0] | (want[:, 1] << 16))


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 200), k=st.integers(1, 200), density=st.floats(0.05, 1), n=st.integers(1, 35),
       tile_m=st.sampled_from([64, 128, 256]), seed=st.integers(0, 1000))
def test_pair_emulator_matches_scipy(m, k, density, n, tile_m, seed):
    n = 2 * n if tile_m < 256 else 2 * min(n, 16)  # 256-row tiles take at most 32 columns (accumulators)
    kernel, y, ref = emulate(random_csr(m, k, density, seed=seed, empty_rows=0.1), n, "float16", seed=seed,
                             granule=2, tile_m=tile_m)
    assert kernel.spec.granule == 2 and kernel.spec.name.split(".")[-1] == "g2"
    assert "constexpr int GRANULE = 2;" in kernel.source and "ld.shared.u32" in kernel.source
    assert rel_error(y, ref) <= TOL["float16"]


def test_granule_other_than_one_or_two_is_declined():
    a = random_csr(100, 100, 0.3, seed=1)
    with pytest.raises(UnsupportedError, match="granule"):
        sparsegen.compile(a, n=8, dtype="float16", backend="emulate",
                          options={"family": "tiled_bitmap_spmm", "granule": 3})


def test_packed_scan_and_sums_match_plain_arithmetic():
    rng = np.random.default_rng(0)
    for trial in range(200):
        w = rng.integers(0, 2**32, size=(32, 4), dtype=np.uint64)
        if trial % 3 == 0:
            w[:, trial % 4] = U32  # fully dense fragments: lane 31's inclusive fields reach 256
        bytes_ = np.stack([(w >> (8 * b)) & 0xFF for b in range(4)], axis=-1).reshape(32, 16)  # [lane][f]
        counts = np.vectorize(lambda v: bin(int(v)).count("1"))(bytes_)
        order = counts.T.ravel()  # fragment-major, lane-major: value order
        starts = (np.cumsum(order) - order).reshape(16, 32).T
        assert np.array_equal(fragment_starts(w, 0) // 2, starts)


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


@pytest.mark.parametrize("family", ["tiled_bitmap_spmm", "tiled_csl_spmm"])
def test_eight_warp_blocks_emulate_and_template(family):
    a = random_csr(300, 500, 0.3, seed=8, empty_rows=0.1)
    x = host_x(np.random.default_rng(8), 500, 16, "float16")
    kernel = sparsegen.compile(a, n=16, dtype="float16", backend="emulate",
                               options={"family": family, "warps": 8, "split_k": 2, "reduction": "atomic"})
    assert kernel.spec.warps == 8 and ".w8." in kernel.spec.name and kernel.spec.tile_m >= 128
    assert "constexpr int WARPS = 8;" in kernel.source and "constexpr int THREADS = 256;" in kernel.source
    assert rel_error(kernel(x), reference(rounded_half(a, "float16"), x.astype(np.float32))) <= TOL["float16"]
    with pytest.raises(UnsupportedError, match="warps"):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate", options={"family": family, "warps": 6})
    with pytest.raises(UnsupportedError, match="16 rows"):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate",
                          options={"family": family, "warps": 8, "tile_m": 64})


def test_finalize_sizes_value_buffer_and_ring():
    a = sp.block_diag([np.ones((128, 64)), random_csr(128, 64, 0.2, seed=3).toarray()], format="csr")
    for granule, vcap in ((1, 8192), (2, 4096)):  # the dense tile's halves, or its registers' words
        kernel, y, ref = emulate(a, 64, "float16", tile_m=128, granule=granule)
        assert kernel.spec.vcap == vcap and fam.MIN_STAGES <= kernel.spec.stages <= fam.MAX_STAGES
        assert kernel.spec.shared_bytes <= T.smem_budget(kernel.spec.min_blocks, kernel.request.device)  # room for it
        assert rel_error(y, ref) <= TOL["float16"]
        assert f"constexpr int VCAP = {kernel.spec.vcap};" in kernel.source


# ---- rule ---------------------------------------------------------------------------------------

def test_rule_prefers_bitmap_when_it_is_predicted_faster_and_says_why():
    half = uniform_stats(7168, 7168, 0.5)  # large enough that no time floor binds
    sel = select(half, op="spmm", n=8, dtype="float16")
    assert sel.spec.family == "tiled_bitmap_spmm"
    assert "bitmap" in sel.reason and "Tiled-CSL" in sel.reason and "B/element" in sel.reason
    # only the predicted-fastest skinny family accepts: Tiled-CSL declines, naming the predictions
    assert any(r == "tiled_csl_spmm" and not ok and why.startswith("bitmap predicted faster: bitmap")
               for r, ok, why in sel.tried)
    sparse = uniform_stats(28672, 7168, 0.05)
    with pinned_library(None):
        d = rule_decision(sparse, Request("spmm", n=32, dtype="float16"), fam.FAMILY)
    assert not d.accepted and "Tiled-CSL predicted faster" in d.reason
    forced = rule_decision(sparse, Request("spmm", n=32, dtype="float16", options=(("family", fam.FAMILY),)), fam.FAMILY)
    assert forced.accepted


def test_compare_uses_the_tile_density_spread():
    """Same density, but clustered in a few dense tiles with the rest empty: CSL skips the empty
    tiles at no cost and bitmap pays its decode only on the dense ones; both predictions drop."""
    uniform = analyze(random_csr(6144, 6144, 0.1, seed=5))  # past the time floors
    mask = sp.csr_matrix((np.arange(48 * 96) % 10 == 0).reshape(48, 96).astype(np.float32))
    clustered = analyze(sp.kron(mask, sp.csr_matrix(np.ones((128, 64), np.float32)), format="csr"))
    req = Request("spmm", n=8, dtype="float16")
    u, c = skinny_cost.compare(uniform, req), skinny_cost.compare(clustered, req)
    tb_u, tb_c, tc_c = u.get(fam.FAMILY).seconds, c.get(fam.FAMILY).seconds, c.get("tiled_csl_spmm").seconds
    assert "0 of" in u.spread and "empty" in c.spread and "0 of" not in c.spread and tb_c < tb_u
    assert tb_c < tc_c  # dense tiles: 1/8 + 2 bytes per element against 4


def test_spec_name():
    spec = fam.Spec("f16", "f16", 7168, 28672, 16, 128, 16, 4, "two_step", False, True, 4, stages=3, vcap=2048)
    assert spec.name == "tiled_bitmap_spmm.f16.m7168k28672n16.t128x64.bn16.sk4r.mb4.st3.v2048.relu"
    cluster = fam.Spec("f16", "f16", 7168, 7168, 64, 128, 64, 7, "cluster", stages=2, vcap=8)
    assert ".sk7c." in cluster.name and cluster.shared_bytes == max(2 * cluster.stage_bytes, 128 * 72 * 4)
    assert fam.Spec("f16", "f16", 64, 64, 8, 64, 8, 1, "none", l2_prefetch=True).name.endswith(".pf")


# ---- nvcc tier ---------------------------------------------------------------------------------

@pytest.mark.nvcc
@pytest.mark.parametrize("shape", CODE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-n{s[3]}-{s[4]}-{'-'.join(map(str, s[5].values()))}")
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("granule", [1, 2])
def test_every_code_shape_compiles_for_sm90_with_hmma(shape, epilogue, granule, tmp_path):
    m, k, density, n, dtype, options = shape
    options = {key: v for key, v in options.items() if key not in CSL_ONLY}
    options["granule"] = granule
    a = random_csr(m, k, density, seed=13)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", bias=np.ones(m) if epilogue else None,
                               relu=epilogue, options={"family": "tiled_bitmap_spmm", **options})
    cubin = nvcc.compile_cubin(kernel.source, kernel.spec.compile_arch("sm_90"), name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF"
    assert_sass_has_hmma(cubin, tmp_path, kernel.spec.wgmma)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 60000), k=st.integers(1, 60000), density=st.floats(0.05, 1.0), n=st.integers(1, 256),
       fullest=st.floats(0.0, 1.0), tile_m=st.sampled_from([None, 64, 128, 256]))
def test_every_chosen_spec_fits_an_sm_with_the_residency_it_asks_for(m, k, density, n, fullest, tile_m):
    from sparsegen.formats import Plan

    from .test_tiled_csl import chosen_spec

    request, spec = chosen_spec(fam, m, k, density, n, tile_m)
    values = -(-max(8, int(fullest * spec.tile_m * 64)) // 8) * 8
    spec = fam.finalize(spec, Plan("tiled_bitmap", {}, {"max_tile_values": values}), request)
    assert fam.DEFAULT_MIN_STAGES <= spec.stages <= fam.MAX_STAGES and spec.vcap in (values, T.shared_cap(values))
    device = request.device
    assert spec.shared_bytes <= T.smem_budget(spec.min_blocks, device)
    # the register estimate's residency; wide blocks may ask one more of ptxas (128 registers, measured
    # without spills in probes/tiled_probe_blocks2.txt)
    extra = 1 if spec.bn > T.NARROW_BN else 0
    assert spec.min_blocks <= fam.register_blocks(spec.tile_m, spec.bn, device) + extra
    assert fam.registers(spec.tile_m, spec.bn) * T.THREADS * (spec.min_blocks - extra) <= device.registers_per_sm
    if spec.reduction == "cluster":
        assert 2 <= spec.split_k <= T.MAX_CLUSTER


@pytest.mark.parametrize("n", [1, 7, 33])
def test_odd_n_is_accepted_priced_and_emulated(n):
    """Odd N is taken (the GPU tier checks its rows: test_gpu_tiled.test_bitmap_odd_n)."""
    a = random_csr(300, 400, 0.3, seed=2)
    kernel, y, ref = emulate(a, n, "float16", None, False, 2)
    assert kernel.spec.family == fam.FAMILY and kernel.spec.xv == 1 and y.shape == (300, n)
    assert rel_error(y, ref) <= TOL["float16"]
    assert "*reinterpret_cast<unsigned short*>(sx + at)" in kernel.source  # the X tile by plain stores
    assert skinny_cost.compare(analyze(a), Request("spmm", n=n, dtype="float16")).get(fam.FAMILY) is not None


@pytest.mark.parametrize("family", ["tiled_csl_spmm", "tiled_bitmap_spmm"])
def test_warpgroup_mma_option_source_target_and_gate(family):
    """options wgmma=True: the X tile in wgmma's core-matrix layout, m64nBNk16 wgmma on register A
    fragments, compiled for sm_90a; declined off sm_90, with k-groups and with the L2 prefetch."""
    a = random_csr(300, 500, 0.3, seed=9, empty_rows=0.1)
    x = host_x(np.random.default_rng(9), 500, 16, "float16")
    kernel = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", options={"family": family, "wgmma": True})
    assert kernel.spec.wgmma and ".wg." in kernel.spec.name and kernel.spec.compile_arch("sm_90") == "sm_90a"
    assert "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16" in kernel.source
    assert "constexpr uint32_t X_LBO = X_CHUNKS * 128;" in kernel.source and "wgmma_wait<1>();" in kernel.source
    assert kernel.spec.stages >= (4 if family == "tiled_csl_spmm" else 3)
    assert rel_error(kernel(x), reference(rounded_half(a, "float16"), x.astype(np.float32))) <= TOL["float16"]
    plain = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", options={"family": family})
    assert not plain.spec.wgmma and "wgmma.mma_async" not in plain.source and plain.spec.compile_arch("sm_90") == "sm_90"
    for options, match in (({"arch": "sm_80"}, "sm_90"), ({"warp_k": 2}, "warp"), ({"l2_prefetch": True}, "prefetch"),
                           ({"wgmma": "yes"}, "True or False")):
        arch = options.pop("arch", None)
        opts = {"family": family, "wgmma": True, **options}
        with pytest.raises(UnsupportedError, match=match):
            sparsegen.compile(a, n=16, dtype="float16", backend="emulate", arch=arch, options=opts)


def test_k_groups_are_tiled_csl_only_and_bounded_by_accumulators():
    a = random_csr(300, 500, 0.3, seed=8, empty_rows=0.1)
    x = host_x(np.random.default_rng(8), 500, 16, "float16")
    kernel = sparsegen.compile(a, n=16, dtype="float16", backend="emulate",
                               options={"family": "tiled_csl_spmm", "warp_k": 4, "split_k": 2, "reduction": "atomic"})
    assert kernel.spec.warp_k == 4 and kernel.spec.row_groups == 1 and ".wk4." in kernel.spec.name
    assert "constexpr int WARP_K = 4;" in kernel.source and "reduce_k_groups(acc, smem, warp, lane);" in kernel.source
    assert "4 k-groups" in kernel.describe()["selection"]["reason"]
    assert kernel.spec.shared_bytes >= kernel.spec.k_group_bytes == 3 * kernel.spec.tile_m * 16 * 4
    assert rel_error(kernel(x), reference(rounded_half(a, "float16"), x.astype(np.float32))) <= TOL["float16"]
    plain = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", options={"family": "tiled_csl_spmm"})
    assert plain.spec.warp_k == 1 and "reduce_k_groups" not in plain.source
    with pytest.raises(UnsupportedError, match="warp rows"):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate",
                          options={"family": "tiled_bitmap_spmm", "warp_k": 2})
    with pytest.raises(UnsupportedError, match="accumulators"):  # 8 m16 x 4 n8 fragments per warp
        sparsegen.compile(a, n=32, dtype="float16", backend="emulate",
                          options={"family": "tiled_csl_spmm", "warp_k": 4})
    with pytest.raises(UnsupportedError, match="warp_k"):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate",
                          options={"family": "tiled_csl_spmm", "warp_k": 3})


@pytest.mark.parametrize("tile_m,warps", [(64, 4), (128, 4), (256, 8)])
def test_encoding_does_not_depend_on_the_bands(monkeypatch, tile_m, warps):
    """Bands of one row tile (and of a few nonzeros) give the same arrays as one band."""
    from sparsegen.formats import tiling

    a = random_csr(700, 1000, 0.3, seed=6)
    whole = fmt.encode(a, "float16", tile_m, warps=warps)
    monkeypatch.setattr(fmt, "bands", lambda indptr, grid: tiling.bands(indptr, grid, max_tiles=1, max_nonzeros=10))
    banded = fmt.encode(a, "float16", tile_m, warps=warps)
    assert banded.constants == whole.constants
    for name in whole.arrays:
        assert np.array_equal(banded.arrays[name], whole.arrays[name]), name


@pytest.mark.parametrize("threads", [128, 256])
@pytest.mark.parametrize("bn", [8, 16, 32, 64])
def test_x_pieces_cover_the_tile_once_at_a_constant_stride(threads, bn):
    """The templates' x_piece/load_x_pieces: thread t copies rows t / X_CHUNKS + r X_ROW_STEP of
    chunk t % X_CHUNKS to its first piece's shared offset + r THREADS chunks; that must be each
    piece's swizzled place (x_chunk), every piece of the 64-row tile exactly once."""
    from .tiled_helpers import x_chunk

    chunks = bn // 8
    step = threads // chunks
    seen = []
    for t in range(threads):
        row, chunk = t // chunks, t % chunks
        if row >= 64:
            continue  # no piece: the tile has fewer than THREADS
        for r in range(-(-64 // step)):
            assert x_chunk(row + r * step, chunk, bn) == x_chunk(row, chunk, bn) + r * threads
            seen.append((row + r * step, chunk))
    assert sorted(seen) == [(row, c) for row in range(64) for c in range(chunks)]


@pytest.mark.parametrize("family", ["tiled_bitmap_spmm", "tiled_csl_spmm"])
def test_x_copies_set_up_once_only_for_whole_16_byte_pieces(family):
    a = random_csr(300, 200, 0.3, seed=5)
    src = {n: sparsegen.compile(a, n=n, dtype="float16", backend="emulate", options={"family": family}).source
           for n in (16, 12)}
    assert "const XPiece xp = x_piece(x, n0);" in src[16] and "load_x_pieces(" in src[16]
    assert "XPiece" not in src[12] and "load_x_tile(" in src[12]  # N = 12: 8-byte pieces, the general copy
