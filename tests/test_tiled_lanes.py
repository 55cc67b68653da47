"""tiled_lanes_spmm: the register layout against the mma A operand, the encoder's invariants and the
emulator against float64 scipy (random shapes, empty and full tiles, ragged edges, odd N), the
kernel's per-lane decode mirrored in NumPy, the value loads' bank conflicts, selection only when
forced, the generated source (TVM style) and (nvcc tier) every code shape compiling for sm_90."""
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
from sparsegen.families import tiled_lanes_spmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import halfbits, tiling
from sparsegen.formats import tiled_lanes as fmt
from sparsegen.select import rule_decision

from .helpers import random_csr, reference, rel_error
from .test_tiled_csl import assert_sass_has_hmma
from .tiled_helpers import TOL, a_fragment_positions, host_x, rounded_half, select_tiled, uniform_stats

SHAPES = [(64, 64), (64, 128), (128, 64), (128, 128), (256, 64), (256, 128)]  # (tile_m, tile_k)


# ---- the register layout --------------------------------------------------------------------------

@pytest.mark.parametrize("tile_m,tile_k", SHAPES)
def test_every_element_has_one_register_half_in_the_mma_a_layout(tile_m, tile_k):
    r, c = np.meshgrid(np.arange(tile_m), np.arange(tile_k), indexing="ij")
    lane_id, slot, half = fmt.register_slot(r.ravel(), c.ravel(), tile_m, tile_k)
    n_slots = fmt.slots(tile_m, tile_k)
    assert n_slots == (tile_m // 64) * (tile_k // 16) * 4
    key = (lane_id.astype(np.int64) * n_slots + slot) * 2 + half
    assert np.array_equal(np.sort(key), np.arange(tile_m * tile_k))  # a bijection onto (lane, slot, half)
    row, col = fmt.register_position(lane_id, slot, tile_m, tile_k)
    assert np.array_equal(row, r.ravel()) and np.array_equal(col + half, c.ravel())
    # slot (ks MF + mf) 4 + reg of warp w is register reg of fragment (mf, ks), lane at the A position
    mfs = tile_m // 64
    reg, f = slot % 4, slot // 4
    ks, mf = f // mfs, f % mfs
    fr, fc = a_fragment_positions(lane_id % 32, reg)
    assert np.array_equal(r.ravel(), (lane_id // 32) * (tile_m // 4) + mf * 16 + fr)
    assert np.array_equal(c.ravel(), ks * 16 + fc[half, np.arange(half.size)])


def test_header_is_whole_bank_rows_and_bits_fill_whole_words():
    for tile_m, tile_k in SHAPES:
        head = fmt.header_words(tile_m, tile_k)
        assert head % 32 == 0 and head >= 128 * fmt.bit_words(tile_m, tile_k) + 64
        assert fmt.bit_words(tile_m, tile_k) * 32 >= fmt.slots(tile_m, tile_k)
    assert [fmt.bit_words(*s) for s in SHAPES] == [1, 1, 1, 2, 2, 4]
    with pytest.raises(ValueError, match="tile_k 32"):
        fmt.check_shape(128, 32)
    with pytest.raises(ValueError, match="tile_m 96"):
        fmt.check_shape(96, 64)


# ---- the encoding ---------------------------------------------------------------------------------

def stored_registers(a: sp.csr_matrix) -> int:
    """Registers (row, column pair) holding a nonzero."""
    coo = a.tocoo()
    return np.unique(coo.row.astype(np.int64) * 10**6 + coo.col // 2).size


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 300), density=st.floats(0, 1), shape=st.sampled_from(SHAPES),
       dtype=st.sampled_from(["float16", "bfloat16"]), seed=st.integers(0, 1000))
def test_round_trip_and_layout_invariants(m, k, density, shape, dtype, seed):
    tile_m, tile_k = shape
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    plan = fmt.encode(a, dtype, tile_m, tile_k)
    assert np.array_equal(fmt.decode(plan).toarray(), rounded_half(a, dtype).toarray())
    c, chunks = plan.constants, plan.arrays["tile_offsets"].astype(np.int64)
    tiles = -(-m // tile_m) * -(-k // tile_k)
    assert chunks.size == tiles + 1 and chunks[0] == 0 and np.all(np.diff(chunks) >= 0)
    assert plan.arrays["stream"].size == 4 * chunks[-1]
    assert c["registers"] == stored_registers(a) and c["empty_tiles"] == (np.diff(chunks) == 0).sum()
    lengths = np.diff(chunks)
    full = lengths[lengths > 0]
    assert np.all(full * 4 >= c["header_words"]) and c["max_tile_chunks"] == lengths.max(initial=0)
    # each nonempty tile: the lanes' offsets are the prefix sums of their bit counts, and the values
    # (padded to 16 bytes) fill the tile's run exactly
    words = fmt.bit_words(tile_m, tile_k)
    for t in np.flatnonzero(lengths)[:8]:
        run = plan.arrays["stream"][4 * chunks[t]:4 * chunks[t + 1]]
        counts = np.unpackbits(run[:128 * words].view(np.uint8)).reshape(128, -1).sum(axis=1).astype(np.int64)
        offsets = run[128 * words:128 * words + 64].view("<u2").astype(np.int64)
        assert np.array_equal(offsets, np.cumsum(counts) - counts)
        assert run.size == c["header_words"] + -(-counts.sum() // 4) * 4


def test_empty_full_and_ragged_tiles():
    full = np.ones((128, 128), dtype=np.float32)
    a = sp.csr_matrix(sp.block_diag([full, np.zeros((128, 128)), full[:70, :77]]))  # 326 x 333: ragged edges
    a.eliminate_zeros()
    plan = fmt.encode(a, "float16", 128, 128)
    lengths = np.diff(plan.arrays["tile_offsets"].astype(np.int64))
    assert lengths.size == 9 and np.flatnonzero(lengths).tolist() == [0, 8]  # the full tile and the ragged corner
    head = plan.constants["header_words"]
    assert lengths[0] * 4 == head + 128 * 128 // 2  # a full tile: every register, no padding
    assert plan.constants["registers"] == 128 * 64 + 70 * 39  # odd width 77 from column 256: 39 registers a row
    assert np.array_equal(fmt.decode(plan).toarray(), a.toarray())
    empty = fmt.encode(sp.csr_matrix((300, 200), dtype=np.float32), "float16")
    assert empty.arrays["stream"].size == 0 and empty.constants["max_tile_chunks"] == 0
    assert fmt.decode(empty).nnz == 0 and fmt.wavefronts(empty).size == 0


def test_bytes_per_element_near_register_pairs_plus_the_header():
    """4 bytes per nonzero register, tile_m tile_k / 16 of bits and 2 per lane (the docstring's
    figures: 0.80 B/element at 80 % sparsity, 0.46 at 90 %, for 128 x 128 tiles)."""
    for density, lo, hi in ((0.2, 0.78, 0.82), (0.1, 0.44, 0.48)):
        a = random_csr(1024, 1024, density, seed=4)
        per = fmt.encoded_bytes(fmt.encode(a, "float16", 128, 128)) / a.size / (1 / density)
        assert lo <= per <= hi, (density, per)
        est = fam.encoded_bytes(analyze(a), 128, 128) / (1024 * 1024)
        assert abs(est - per) / per < 0.05  # the chooser's estimate of the same bytes


@pytest.mark.parametrize("tile_m,tile_k", [(128, 128), (64, 64)])
def test_encoding_does_not_depend_on_the_bands(monkeypatch, tile_m, tile_k):
    a = random_csr(700, 900, 0.3, seed=5)
    whole = fmt.encode(a, "float16", tile_m, tile_k)
    monkeypatch.setattr(tiling, "BAND_TILES", 3)
    monkeypatch.setattr(tiling, "BAND_NONZEROS", 5000)
    assert len(tiling.bands(a.indptr, tiling.TileGrid(700, 900, tile_m, tile_k), 3, 5000)) > 3
    banded = fmt.encode(a, "float16", tile_m, tile_k)
    for name in whole.arrays:
        assert np.array_equal(whole.arrays[name], banded.arrays[name])


# ---- the kernel's decode, mirrored ----------------------------------------------------------------

def lane_decode(stream_tile: np.ndarray, head: int, words: int, mfs: int, k_steps: int, warp: int) -> np.ndarray:
    """What `compute` gives every lane of `warp`: a[ks][mf][reg] (uint32) from the lane's bit words,
    its offset and one value pointer per bit word (the second starts past the first word's values),
    each slot a predicated load and add, as the template walks them."""
    lanes = np.arange(32) + 32 * warp
    bits = stream_tile[lanes[:, None] * words + np.arange(words)].astype(np.int64)  # [lane][word]
    first = stream_tile[128 * words:128 * words + 64].view("<u2").astype(np.int64)[lanes]
    q = np.zeros((32, words), dtype=np.int64)
    q[:, 0] = head + first
    for j in range(1, words):
        q[:, j] = q[:, j - 1] + np.array([bin(int(b)).count("1") for b in bits[:, j - 1]])
    out = np.zeros((32, k_steps, mfs, 4), dtype=np.uint32)
    for ks in range(k_steps):
        for mf in range(mfs):
            for reg in range(4):
                slot = (ks * mfs + mf) * 4 + reg
                w, b = slot // 32, slot % 32
                taken = (bits[:, w] >> b) & 1 == 1
                out[taken, ks, mf, reg] = stream_tile[q[taken, w]]
                q[taken, w] += 1
    return out


@pytest.mark.parametrize("tile_m,tile_k,density", [(128, 128, 0.2), (128, 128, 1.0), (256, 128, 0.1),
                                                   (64, 64, 0.5), (128, 64, 0.02)])
def test_lane_decode_yields_the_a_fragments(tile_m, tile_k, density):
    a = random_csr(tile_m, tile_k, density, seed=6)
    plan = fmt.encode(a, "float16", tile_m, tile_k)
    w = halfbits.to_bits(a.toarray(), "float16").astype(np.uint32)
    tile = plan.arrays["stream"]
    mfs, k_steps = fmt.fragments(tile_m, tile_k)
    lane = np.arange(32)
    for warp in range(4):
        got = lane_decode(tile, plan.constants["header_words"], fmt.bit_words(tile_m, tile_k), mfs, k_steps, warp)
        for ks in range(k_steps):
            for mf in range(mfs):
                for reg in range(4):
                    r, c = a_fragment_positions(lane, reg)
                    rows = warp * (tile_m // 4) + mf * 16 + r
                    want = w[rows, ks * 16 + c[0]] | (w[rows, ks * 16 + c[1]] << 16)
                    assert np.array_equal(got[:, ks, mf, reg], want), (warp, ks, mf, reg)


def test_wavefronts_count_bank_conflicts_of_the_value_loads():
    # one value per lane in one slot: lane l's word l, banks 0..31, one wavefront for that load
    a = sp.csr_matrix(([1.0] * 8, ([0, 1, 2, 3, 4, 5, 6, 7], [0] * 8)), shape=(128, 128))
    plan = fmt.encode(a, "float16", 128, 128)
    assert fmt.wavefronts(plan).tolist() == [1]
    # a full tile: every lane's 64 values back to back, so lane l starts at word 64 l, bank 0: each
    # load of the 4 warps x 64 slots meets all 32 lanes in one bank
    full = sp.csr_matrix(np.ones((128, 128), dtype=np.float32))
    assert fmt.wavefronts(fmt.encode(full, "float16", 128, 128)).tolist() == [4 * 64 * 32]
    # a uniform pattern: at least one per load with a nonzero, at most the lanes of the warp
    b = random_csr(256, 256, 0.2, seed=7)
    p = fmt.encode(b, "float16", 128, 128)
    wf = fmt.wavefronts(p)
    assert wf.size == 4 and np.all((wf >= 4 * 64 * 0.9) & (wf <= 4 * 64 * 4))


# ---- the emulator ---------------------------------------------------------------------------------

def emulate(a, n, dtype="float16", bias=None, relu=False, seed=0, **options):
    kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="emulate", arch="sm_90",
                               options={"family": "tiled_lanes_spmm", **options})
    x = host_x(np.random.default_rng(seed), a.shape[1], n, dtype)
    ref = reference(rounded_half(a, dtype), x.astype(np.float32), bias, relu)
    return kernel, kernel(x), ref


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 260), k=st.integers(1, 300), density=st.floats(0.05, 1), n=st.integers(1, 70),
       dtype=st.sampled_from(["float16", "bfloat16"]), epilogue=st.sampled_from(["none", "bias", "bias_relu"]),
       seed=st.integers(0, 1000))
def test_emulator_matches_scipy(m, k, density, n, dtype, epilogue, seed):
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    kernel, y, ref = emulate(a, n, dtype, bias, epilogue == "bias_relu", seed)
    assert kernel.spec.family == "tiled_lanes_spmm" and y.shape == (m, n)
    assert rel_error(y, ref) <= TOL[dtype]


@pytest.mark.parametrize("n", [1, 3, 8, 17, 64])
@pytest.mark.parametrize("options", [{}, {"tile_k": 64}, {"tile_m": 256}, {"tile_m": 64, "tile_k": 128},
                                     {"split_k": 2, "reduction": "atomic"},
                                     {"split_k": 4, "reduction": "two_step", "tile_k": 64}])
def test_edge_tiles_and_options_emulate(n, options):
    dense = np.ones((128, 128), dtype=np.float32)
    a = sp.csr_matrix(sp.block_diag([dense, np.zeros((64, 64)), random_csr(83, 201, 0.15, seed=9).toarray()]))
    if options.get("tile_m") == 256 and n > 32:  # 4 m-fragments x 8 n-fragments: 128 accumulators a thread
        with pytest.raises(UnsupportedError, match="128 fp32 accumulators"):
            emulate(a, n, "float16", **options)
        return
    kernel, y, ref = emulate(a, n, "float16", **options)
    assert rel_error(y, ref) <= TOL["float16"]
    assert all(getattr(kernel.spec, key) == value for key, value in options.items())


# ---- the family: spec, choice, finalize, gate, selection --------------------------------------------

def test_tile_width_follows_n_and_the_spec_names_it():
    a = random_csr(512, 1024, 0.2, seed=10)
    narrow, _, _ = emulate(a, 16)
    wide, _, _ = emulate(a, 32)
    asked, _, _ = emulate(a, 16, tile_k=64)
    assert (narrow.spec.tile_k, wide.spec.tile_k, asked.spec.tile_k) == (128, 64, 64)
    assert ".t128x128." in narrow.spec.name and ".t128x64." in wide.spec.name
    assert narrow.spec.k_tiles == 8 and wide.spec.k_tiles == 16
    assert narrow.spec.name.endswith(f".st{narrow.spec.stages}.c{narrow.spec.cap_chunks}")
    assert narrow.spec.kt_per_split * narrow.spec.split_k >= narrow.spec.k_tiles


def test_finalize_sizes_the_stream_buffer_for_the_fullest_tile():
    a = sp.csr_matrix(sp.block_diag([np.ones((128, 128)), random_csr(128, 128, 0.2, seed=3).toarray()]))
    kernel, y, ref = emulate(a, 8)
    head = fmt.header_words(128, 128)
    assert kernel.plan.constants["max_tile_chunks"] == (head + 128 * 64) // 4
    assert kernel.spec.cap_chunks == T.shared_cap((head + 128 * 64) // 4)
    assert fam.MIN_STAGES <= kernel.spec.stages <= fam.MAX_STAGES
    static = fam.static_bytes(kernel.spec.kt_per_split)  # the block's tile offsets and barriers
    assert kernel.spec.shared_bytes + static <= T.smem_budget(kernel.spec.min_blocks, kernel.request.device)
    assert rel_error(y, ref) <= TOL["float16"]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 60000), k=st.integers(1, 60000), density=st.floats(0.05, 1.0), n=st.integers(1, 256),
       fullest=st.floats(0.0, 1.0), tile_m=st.sampled_from([None, 64, 128, 256]),
       tile_k=st.sampled_from([None, 64, 128]))
def test_every_chosen_spec_fits_an_sm_with_the_residency_it_asks_for(m, k, density, n, fullest, tile_m, tile_k):
    """Ring, tile offsets and barriers fit the shared memory the residency leaves, whatever the
    fullest tile; the registers the residency allows cover the estimate; clusters of 2-8."""
    from sparsegen.formats import Plan

    if tile_m == 256 and n > 32:
        tile_m = 128
    options = tuple((key, v) for key, v in (("family", fam.FAMILY), ("tile_k", tile_k), ("tile_m", tile_m)) if v)
    request = Request("spmm", n=n, dtype="float16", arch="sm_90", options=options)
    stats = uniform_stats(m, k, density)
    decision = rule_decision(stats, request, fam.FAMILY)
    if 4 * (stats.nnz + 4 * stats.tiles.tiles) >= 2**33:  # the tile families' 32-bit offset limit
        assert not decision.accepted and decision.reason == "encoding needs 64-bit offsets"
        return
    assert decision.accepted, decision.reason
    spec = decision.spec
    head = fmt.header_words(spec.tile_m, spec.tile_k)
    chunks = (head + max(1, int(fullest * spec.tile_m * spec.tile_k / 2))) // 4 + 1
    spec = fam.finalize(spec, Plan("tiled_lanes", {}, {"max_tile_chunks": chunks}), request)
    assert fam.MIN_STAGES <= spec.stages <= fam.MAX_STAGES and spec.cap_chunks in (chunks, T.shared_cap(chunks))
    device = request.device
    assert spec.shared_bytes + fam.static_bytes(spec.kt_per_split) <= T.smem_budget(spec.min_blocks, device)
    assert spec.min_blocks == 1 or fam.registers(spec.tile_m, spec.bn, spec.tile_k) * T.THREADS * spec.min_blocks \
        <= device.registers_per_sm
    assert spec.kt_per_split * spec.split_k >= spec.k_tiles > spec.kt_per_split * (spec.split_k - 1)
    if spec.reduction == "cluster":
        assert 2 <= spec.split_k <= T.MAX_CLUSTER


@pytest.mark.parametrize("options,needle", [({"wgmma": True}, "wgmma"), ({"reduction": "stream"}, "reduction"),
                                            ({"l2_prefetch": True}, "l2_prefetch"), ({"warps": 8}, "warps"),
                                            ({"warp_k": 2}, "warp_k")])
def test_gate_declines_the_paths_it_has_not(options, needle):
    a = random_csr(256, 256, 0.3, seed=11)
    with pytest.raises(UnsupportedError, match=needle):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate", arch="sm_90",
                          options={"family": "tiled_lanes_spmm", **options})
    with pytest.raises(UnsupportedError, match="sm_80"):
        sparsegen.compile(a, n=16, dtype="float16", backend="emulate", arch="sm_80",
                          options={"family": "tiled_lanes_spmm"})


@pytest.mark.parametrize("density,n", [(0.1, 8), (0.2, 16), (0.3, 64), (0.5, 32)])
def test_selection_takes_it_only_when_asked(density, n):
    stats = uniform_stats(7168, 7168, density)
    unforced = select_tiled(stats, n=n)
    assert unforced.spec.family != "tiled_lanes_spmm"
    decision = rule_decision(stats, Request("spmm", n=n, dtype="float16", arch="sm_90"), "tiled_lanes_spmm")
    assert not decision.accepted and "not calibrated (no rates for it in" in decision.reason
    forced = select_tiled(stats, n=n, family="tiled_lanes_spmm")
    assert forced.spec.family == "tiled_lanes_spmm" and "tiled lanes as asked" in forced.reason
    assert forced.spec.split_k >= 1 and forced.spec.tile_k == (128 if n <= 16 else 64)


# ---- the generated source -------------------------------------------------------------------------

def test_source_decodes_each_fragment_from_its_word_and_copies_the_stream_in_bulk():
    a = random_csr(256, 512, 0.2, seed=12)
    kernel, _, _ = emulate(a, 16)
    src, spec = kernel.source, kernel.spec
    assert src.startswith("/*") and f"spec:      {spec.name}" in src  # provenance header
    assert "constexpr int SLOTS = 64;" in src and "constexpr int BW = 2;" in src
    assert f"constexpr int HEADER_BYTES = {4 * fmt.header_words(128, 128)};" in src
    assert f"constexpr int CAP_CHUNKS = {spec.cap_chunks};" in src and "constexpr int TILE_K = 128;" in src
    # 2 m-fragments x 8 k-steps: fragment (ks, mf) reads bits 4 (2 ks + mf) mod 32 of word (2 ks + mf) / 8
    for ks in range(8):
        for mf in range(2):
            slot = (ks * 2 + mf) * 4
            assert f"decode_fragment<{slot % 32}>(a[{mf}], w[{slot // 32}], q[{slot // 32}]);" in src
        assert f"load_b_at<{ks}>(b, sx, bo);" in src
    assert src.count("decode_fragment<") == 16  # one call per fragment (the definition reads "decode_fragment(")
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in src
    assert "mbarrier.try_wait.parity" in src
    for scan in ("shfl", "__reduce_add_sync", "popc_bytes"):  # no scan or per-fragment popcount at run time
        assert scan not in src
    assert src.count("__popc(") == 1  # the second chain's start, once per tile
    narrow, _, _ = emulate(random_csr(64, 64, 0.4, seed=13), 8, tile_m=64, tile_k=64)
    assert "constexpr int SLOTS = 16;" in narrow.source and "constexpr int BW = 1;" in narrow.source
    assert "decode_fragment<12>(a[0], w[0], q[0]);" in narrow.source and "load_b_at<3>" in narrow.source


# ---- nvcc tier ------------------------------------------------------------------------------------

CODE_SHAPES = [  # (m, k, density, n, dtype, options): one per code path
    (300, 700, 0.2, 16, "float16", {}),  # 128 x 128 tiles, 16-byte X pieces, x4 B loads
    (300, 700, 0.2, 8, "float16", {}),  # x2 B loads
    (130, 300, 0.5, 12, "bfloat16", {"split_k": 2, "reduction": "atomic"}),  # 8-byte X copies, red.v2
    (130, 300, 0.5, 3, "float16", {"split_k": 3, "reduction": "two_step", "out": "float32"}),  # odd N
    (256, 256, 0.6, 64, "float16", {"split_k": 2, "reduction": "cluster"}),  # 64-column blocks, a cluster
    (256, 300, 0.1, 24, "float16", {"tile_m": 256}),  # four m-fragments, four bit words
    (64, 200, 0.3, 33, "bfloat16", {"tile_m": 64, "tile_k": 64}),  # half a bit word
]


@pytest.mark.nvcc
@pytest.mark.parametrize("shape", CODE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-n{s[3]}-{s[4]}-{'-'.join(map(str, s[5].values()))}")
@pytest.mark.parametrize("epilogue", [False, True])
def test_every_code_shape_compiles_for_sm90_with_hmma_and_bulk_copies(shape, epilogue, tmp_path):
    import shutil
    import subprocess

    m, k, density, n, dtype, options = shape
    a = random_csr(m, k, density, seed=13)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", arch="sm_90",
                               bias=np.ones(m) if epilogue else None, relu=epilogue,
                               options={"family": "tiled_lanes_spmm", **options})
    cubin = nvcc.compile_cubin(kernel.source, kernel.spec.compile_arch("sm_90"), name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF"
    assert_sass_has_hmma(cubin, tmp_path)
    if shutil.which("cuobjdump"):
        sass = subprocess.run(["cuobjdump", "-sass", str(tmp_path / "k.cubin")], capture_output=True, text=True).stdout
        assert "UBLKCP" in sass and "SYNCS.PHASECHK" in sass  # the stream's bulk copy and its barrier wait
        assert "STL" not in sass  # no spills


def test_stage_capacity_keeps_five_significant_bits():
    assert [T.shared_cap(v) for v in (0, 1, 31, 32, 33, 443, 452, 846, 861, 864, 865)] == \
        [1, 1, 31, 32, 34, 448, 464, 864, 864, 864, 896]
    for v in range(1, 5000):
        assert v <= T.shared_cap(v) < v * (1 + 2 ** (1 - T.CAP_BITS))


@pytest.mark.parametrize("family", ["tiled_lanes_spmm", "tiled_bitmap_spmm", "tiled_csl_spmm"])
def test_weights_of_one_shape_and_sparsity_share_one_kernel_source(family):
    """A model's layers differ in their fullest tile; the stage capacity rounds that away, so they
    compile to one cubin, or two where their fullest tiles straddle a step (the cubin key is the
    source's body)."""
    keys, fullest = set(), set()
    for seed in range(6):
        a = random_csr(512, 1024, 0.2, seed=40 + seed)
        kernel = sparsegen.compile(a, n=8, dtype="float16", backend="emulate", options={"family": family})
        keys.add(kernel.cubin_key)
        fullest.add(next(v for c, v in kernel.plan.constants.items() if c.startswith("max_tile_")))
    assert len(fullest) >= 4 and len(keys) <= 2
