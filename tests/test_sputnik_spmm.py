"""`sputnik_spmm`: parameter choices, the encoder, the emulator, and every code shape through nvcc."""
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
from sparsegen.families import sputnik_spmm as fam
from sparsegen.formats import csr as fmt
from sparsegen.render import render
from sparsegen.select import select

from .helpers import TOL, random_csr, reference, rel_error, rounded, without_tensor_cores


def spec_for(a, n, dtype="float32", **options):
    options.setdefault("family", "sputnik_spmm")
    return select(analyze(a), op="spmm", n=n, dtype=dtype, options=tuple(sorted(options.items()))).spec


@pytest.mark.parametrize("dtype,n,vec,width", [
    ("float32", 1, 1, 1), ("float32", 6, 2, 4), ("float32", 32, 4, 8), ("float32", 128, 4, 32),
    ("float32", 1024, 4, 32), ("float32", 130, 2, 32), ("float32", 33, 1, 32),
    ("float16", 64, 8, 8), ("float16", 256, 8, 32), ("float16", 12, 4, 4), ("float16", 7, 1, 8)])
def test_vector_and_tile_follow_n(dtype, n, vec, width):
    spec = spec_for(random_csr(5000, 500, 0.02, seed=1), n, dtype)
    assert spec.family == "sputnik_spmm"
    assert (spec.vec, spec.width) == (vec, width)
    assert spec.sv == min(4, 32 // width) and spec.chunk == 32


def test_many_long_rows_take_the_measured_chunk_and_batch(monkeypatch):
    without_tensor_cores(monkeypatch)  # 20 % dense: dense_tile_spmm would take it
    a = random_csr(4096, 2048, 0.2, seed=3)  # 4096 rows of ~410 nonzeros
    assert (spec_for(a, 128).chunk, spec_for(a, 128).batch, spec_for(a, 128).ksplit) == (64, 16, 1)
    assert (spec_for(a, 256).chunk, spec_for(a, 256).batch) == (64, 16)  # 8192 warps
    assert (spec_for(a, 1024).chunk, spec_for(a, 1024).batch, spec_for(a, 1024).ksplit) == (64, 8, 1)  # 32768 warps
    assert (spec_for(a, 128).rows, spec_for(a, 256).rows, spec_for(a, 1024).rows) == (16, 16, 16)  # 512 threads
    assert spec_for(a, 128, block=128).rows == 4  # options still win
    assert spec_for(a, 1024, block=128).chunk == 32  # a block size asked for: the big grid's defaults
    assert spec_for(a, 1024, batch=32).batch == 32  # options still win
    short = random_csr(4096, 2048, 0.05, seed=3)  # ~100 per row: whole-warp groups only (from 96 a row)
    assert (spec_for(short, 1024).chunk, spec_for(short, 1024).batch, spec_for(short, 1024).rows) == (64, 8, 16)
    assert (spec_for(short, 32).chunk, spec_for(short, 32).batch) == (32, 16)  # 8-thread groups: from 256 a row
    shorter = random_csr(4096, 2048, 0.04, seed=3)  # ~82 per row: the defaults
    assert (spec_for(shorter, 1024).chunk, spec_for(shorter, 1024).batch) == (32, 16)
    assert spec_for(a, 1024, dtype="float16").batch == 16  # measured in fp32 only
    assert "4096 x 2048, rows unsplit, 16-row blocks: measured faster" in select(analyze(a), op="spmm", n=128).reason
    narrow = random_csr(4096, 1024, 0.4, seed=3)  # ~410 per row but 1024 columns: not measured, the defaults
    assert (spec_for(narrow, 128).chunk, spec_for(narrow, 128).ksplit) == (32, 1)  # 4096 warps unsplit


def skewed_rows(m, k, mean, cov, seed=0):
    """m x k with lognormal row lengths of about `mean` nonzeros and CoV `cov`, uniform columns."""
    rng = np.random.default_rng(seed)
    sigma = np.sqrt(np.log1p(cov * cov))
    lengths = np.clip(np.rint(rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, m)), 0, k).astype(np.int64)
    order = np.argsort(rng.random((m, k)), axis=1)  # each row's columns in a random order
    mask = np.zeros((m, k), bool)
    np.put_along_axis(mask, order, np.arange(k)[None, :] < lengths[:, None], axis=1)
    return sp.csr_matrix(mask.astype(np.float32))


def test_many_long_skewed_rows_are_split_alike():
    """Skewed rows (CoV >= 0.5) leave the many-row choices: split 8 ways at n = 128/256, 2 at n >= 1024;
    8-thread groups (n = 32) take the per-row split."""
    a = skewed_rows(2048, 2048, 200, 1.5, seed=1)
    assert analyze(a).row_lengths.cov >= fam.MANY_ROWS_MAX_COV
    for n, ksplit in ((128, fam.SKEWED_KSPLIT), (256, fam.SKEWED_KSPLIT), (1024, fam.SKEWED_WIDE_KSPLIT)):
        spec = spec_for(a, n)
        assert (spec.ksplit, spec.budget, spec.chunk) == (ksplit, 0, 32), n
    assert "many long rows, skewed; split alike measured fastest" in select(analyze(a), op="spmm", n=256,
                                                                             options={"family": "sputnik_spmm"}).reason
    assert spec_for(a, 32).budget > 0  # per-row split
    assert spec_for(a, 256, ksplit=4).ksplit == 4  # options still win
    even = random_csr(2048, 2048, 0.1, seed=2)  # ~200 a row, CoV ~0.07: the many-row choices, unsplit
    assert (spec_for(even, 256).ksplit, spec_for(even, 256).chunk) == (1, 64)


def test_rows_split_until_the_grid_reaches_32_warps_per_sm():
    target = fam.SPLIT_WARPS_PER_SM * 132
    few = spec_for(random_csr(512, 2048, 0.2, seed=2), 128)  # 512 warps unsplit
    assert few.ksplit == 8 and few.rows * few.ksplit * few.width >= 128
    assert fam.warps(512, 128, 128, 32, 8) <= target < fam.warps(512, 128, 128, 32, 16)
    assert spec_for(random_csr(20000, 2048, 0.02, seed=3), 128).ksplit == 1  # the rows alone fill it
    assert spec_for(random_csr(100, 2048, 0.01, seed=4), 128).ksplit == fam.MAX_KSPLIT  # capped
    assert spec_for(random_csr(512, 2048, 0.2, seed=2), 32).ksplit == 16  # 8-thread groups: 128 warps unsplit
    assert spec_for(random_csr(512, 2048, 0.2, seed=2), 1024).ksplit == 1  # 8 column tiles: 4096 warps


def test_indices_16_bit_only_for_fp16_within_32767_columns():
    assert spec_for(random_csr(10, 32767, 0.001, seed=5), 8, "float16").index_bits == 16
    assert spec_for(random_csr(10, 32768, 0.001, seed=5), 8, "float16").index_bits == 32
    s32 = spec_for(random_csr(10, 100, 0.1, seed=5), 8, "float32")
    assert s32.index_bits == 32 and s32.prescaled and not s32.wide


def test_swizzle_follows_row_length_cov():
    uniform = sp.csr_matrix(np.ones((64, 64), np.float32))
    assert not spec_for(uniform, 32).swizzle
    skewed = sp.vstack([random_csr(60, 64, 0.05, seed=6), sp.csr_matrix(np.ones((4, 64), np.float32))]).tocsr()
    assert spec_for(skewed, 32).swizzle


def test_default_selection_keeps_narrow_n_with_short_rows_on_csr_rowsplit(monkeypatch):
    without_tensor_cores(monkeypatch)  # the 20 % layers would go to dense_tile_spmm
    def chosen(a, n, dtype="float32"):
        return select(analyze(a), op="spmm", n=n, dtype=dtype).spec.family

    long_rows = random_csr(512, 1024, 0.2, seed=12)  # ~205 per row (past 2048 columns panel_spmm takes it)
    assert chosen(long_rows, 128) == "sputnik_spmm"
    assert chosen(long_rows, 32) == "sputnik_spmm"  # rows >= 128: any n in float32
    short_rows = random_csr(2048, 512, 0.1, seed=13)  # ~51 per row
    assert chosen(short_rows, 32) == "csr_rowsplit"
    assert chosen(short_rows, 128) == "sputnik_spmm"  # n >= 128: any rows in float32
    why = dict((r, w) for r, _, w in select(analyze(short_rows), op="spmm", n=32).tried)["sputnik_spmm"]
    assert "outside n >= 128, or rows >= 128 split over row groups" in why
    square = random_csr(4096, 2048, 0.2, seed=3)  # ~410 per row, but 4096 rows: unsplit
    assert chosen(square, 32) == "csr_rowsplit" and chosen(square, 128) == "sputnik_spmm"
    assert chosen(short_rows, 256, "float16") != "sputnik_spmm"  # float16 keeps n >= 128 with rows >= 128


def test_name_reason_and_options(monkeypatch):
    without_tensor_cores(monkeypatch)  # 20 % dense: dense_tile_spmm would take it
    a = random_csr(512, 2048, 0.2, seed=7)
    sel = select(analyze(a), op="spmm", n=128)
    assert sel.spec.family == "panel_spmm"  # 2048 columns at 20 %: measured faster there
    assert [c[1].family for c in sel.candidates] == ["sputnik_spmm", "csr_rowsplit"]
    sel = select(analyze(a), op="spmm", n=128, options=(("family", "sputnik_spmm"),))
    assert sel.spec.name == ("sputnik_spmm.f32.n128.v4.w32.ks8.r2.c32x1.b16.i32s")  # rows in order: 512 threads
    assert "8 groups per row (512 rows alone give 512 warps; split while the grid stays within 4224" in sel.reason
    assert "512-thread blocks (n >= 128 with rows in order of >= 90 nonzeros: measured faster)" in sel.reason
    forced = select(analyze(a), op="spmm", n=128, options=(("family", "csr_rowsplit"),))
    assert forced.spec.family == "csr_rowsplit"
    assert ("sputnik_spmm", False, "family 'csr_rowsplit' was requested") in forced.tried
    assert spec_for(a, 128, ksplit=2).ksplit == 2
    with pytest.raises(UnsupportedError, match="ksplit=3"):
        spec_for(a, 128, ksplit=3, family="sputnik_spmm")
    with pytest.raises(UnsupportedError, match="no such kernel family"):
        spec_for(a, 128, family="nope")


def test_encoder_pads_only_the_tail_and_prescales():
    a = random_csr(50, 70, 0.1, seed=8)
    plan = fmt.encode_sputnik(a, "float32", prescale=12, vector=4, swizzle=True)
    assert plan.arrays["indices"].size % 4 == 0 and plan.arrays["indices"].size - a.nnz < 4
    np.testing.assert_array_equal(plan.arrays["indices"][:a.nnz], a.indices * 12)
    np.testing.assert_array_equal(plan.arrays["indptr"], a.indptr)
    lengths = np.diff(a.indptr)[plan.arrays["order"]]
    assert (np.diff(lengths) <= 0).all() and sorted(plan.arrays["order"]) == list(range(50))
    back = fmt.decode_sputnik(plan)
    np.testing.assert_array_equal(back.arrays["indices"], a.indices)
    h = fmt.encode_sputnik(a, "float16", index_bits=16)
    assert h.arrays["indices"].dtype == np.int16 and h.arrays["values"].dtype == np.float16
    with pytest.raises(OverflowError):
        fmt.encode_sputnik(random_csr(4, 40000, 0.01, seed=9), "float16", index_bits=16, prescale=2)


def test_balanced_blocks_cover_every_row_once_split_by_length():
    rng = np.random.default_rng(12)
    lengths = np.concatenate([rng.integers(0, 60, 300), [0, 0, 700, 250, 130, 64, 65]])
    order = fmt.row_swizzle(np.concatenate([[0], np.cumsum(lengths)]))
    table = fmt.balanced_blocks(lengths[order], 64, 8, 8)
    starts, rows, shift = table[:, 0], table[:, 1] >> 8, table[:, 1] & 0xFF
    covered = np.concatenate([np.arange(s, s + r) for s, r in zip(starts, rows)])
    np.testing.assert_array_equal(covered, np.arange(lengths.size))  # each position of `order` once, in order
    assert ((rows << shift) <= 8).all() and (rows >= 1).all()
    split = np.repeat(1 << shift, rows)[np.argsort(order)]  # each row's split, by row
    np.testing.assert_array_equal(split, fmt.row_splits(lengths, 64, 8))
    assert split[lengths == 700] == 8 and split[lengths == 250] == 4 and split[lengths == 130] == 4
    assert split[lengths == 65] == 2 and split[lengths == 64] == 1 and (split[lengths == 0] == 1).all()
    assert fmt.balanced_blocks(np.zeros(0, np.int64), 64, 8, 8).shape == (0, 2)


def test_rows_split_per_row_by_default_where_the_longest_row_is_twice_the_mean():
    skewed = sp.vstack([random_csr(500, 2048, 0.05, seed=1), random_csr(12, 2048, 0.3, seed=2)]).tocsr()
    assert spec_for(skewed, 1024).budget == 528 and spec_for(skewed, 128).budget == 4224
    assert spec_for(skewed, 1024, balance=0).budget == 0  # the uniform split on request
    assert spec_for(skewed, 1024, ksplit=2).budget == 0  # a forced ksplit is uniform
    assert spec_for(skewed, 1024, dtype="float16").budget == 0  # measured in float32 only
    assert spec_for(random_csr(512, 2048, 0.05, seed=1), 1024).budget == 0  # even rows: max < 2x mean
    many = sp.vstack([random_csr(600, 2048, 0.05, seed=1), random_csr(12, 2048, 0.3, seed=2)]).tocsr()
    assert spec_for(many, 1024).budget == 0  # 612 rows fill the budget of 528 groups: nothing to split
    short = sp.vstack([random_csr(500, 2048, 0.01, seed=1), random_csr(12, 2048, 0.1, seed=2)]).tocsr()
    assert spec_for(short, 1024).budget > 0  # longest ~200 on one group of 8 tiles x 512 rows
    assert spec_for(short, 128).ksplit == 8 and spec_for(short, 128).budget == 0  # ~200 / 8: one chunk a group


def test_smallest_piece_fits_the_budget():
    lengths = np.array([400, 100, 100, 100, 100, 3, 0])
    piece = fmt.smallest_piece(lengths, 24, 16)
    assert fmt.row_splits(lengths, piece, 16).sum() <= 24 < fmt.row_splits(lengths, piece - 1, 16).sum()
    assert fmt.row_splits(lengths, piece, 16).tolist() == [8, 2, 2, 2, 2, 1, 1]  # 50 per group (4-way: 26 > 24)
    even = np.full(512, 102)  # equal rows: the uniform split, every row alike
    assert set(fmt.row_splits(even, fmt.smallest_piece(even, 2112, 16), 16)) == {4}
    assert fmt.smallest_piece(np.full(100, 7), 50, 16) == 7  # even unsplit rows exceed the budget
    assert fmt.smallest_piece(np.zeros(0, np.int64), 50, 16) == 1


def test_balanced_split_spec_name_reason_and_options():
    a = sp.vstack([random_csr(500, 2048, 0.05, seed=1), random_csr(12, 2048, 0.3, seed=2)]).tocsr()
    spec = spec_for(a, 1024, balance=1)
    target = fam.SPLIT_WARPS_PER_SM * 132
    assert spec.budget == fam.group_budget(1024, 128, 32, target) == target // 8 and spec.piece == 0
    assert spec.ksplit == fam.most_split(np.diff(a.indptr).max(), a.nnz, spec.budget) and spec.swizzle
    assert f".ks{spec.ksplit}g{spec.budget}." in spec.name
    forced = spec_for(a, 1024, piece=32)
    assert (forced.piece, forced.budget, forced.ksplit, forced.rows, forced.block) == (32, 0, 16, 1, 512)
    assert spec_for(a, 1024, piece=32, ksplit=4).ksplit == 4  # ksplit caps the split
    sel = select(analyze(a), op="spmm", n=1024, options=(("balance", 1), ("family", "sputnik_spmm")))
    assert "that leave each <= the least piece whose splits fit 528 groups per column tile" in sel.reason
    for bad, match in (({"balance": 2}, "balance=2"), ({"piece": 0}, "piece=0"),
                       ({"piece": 8, "balance": 0}, "piece with balance=0")):
        with pytest.raises(UnsupportedError, match=match):
            spec_for(a, 1024, **bad)
    plan = sparsegen.compile(a, n=1024, backend="emulate", options={"family": "sputnik_spmm", "balance": 1}).plan
    assert plan.constants["row_blocks"] == plan.arrays["blocks"].shape[0]
    assert fam.launch(spec, plan).grid[0] == 8 * plan.constants["row_blocks"]
    lengths = np.sort(np.diff(a.indptr))[::-1]
    piece = plan.constants["piece"]  # the least piece whose splits fit the budget: one less does not
    assert fmt.row_splits(lengths, piece, spec.ksplit).sum() <= spec.budget < \
        fmt.row_splits(lengths, piece - 1, spec.ksplit).sum()


def test_empty_matrix_encodes_and_launches_nothing():
    a = sp.csr_matrix((0, 10), dtype=np.float32)
    k = sparsegen.compile(a, n=4, backend="emulate", options={"family": "sputnik_spmm"})
    assert fam.launch(k.spec, k.plan).grid[0] == 0
    assert k(np.zeros((10, 4), np.float32)).shape == (0, 4)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 120), k=st.integers(1, 120), density=st.floats(0, 0.6), n=st.integers(1, 70),
       dtype=st.sampled_from(["float32", "float16"]), relu=st.booleans(), seed=st.integers(0, 1000))
def test_emulator_matches_scipy(m, k, density, n, dtype, relu, seed):
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="emulate",
                               options={"family": "sputnik_spmm"})
    x = np.random.default_rng(seed + 1).standard_normal((k, n)).astype(dtype)
    assert rel_error(kernel(x), reference(rounded(a, dtype), x, bias, relu)) <= TOL[dtype]


def test_balanced_source_reads_the_block_table():
    a = sp.vstack([random_csr(500, 2048, 0.05, seed=1), random_csr(12, 2048, 0.3, seed=2)]).tocsr()
    src = render(spec_for(a, 1024, piece=32))
    assert src.split("*/", 1)[1] == render(spec_for(a, 1024, piece=33)).split("*/", 1)[1]  # one cubin
    params = src.split("sputnik_spmm(")[1].split(")")[0]
    assert "const int2* __restrict__ blocks" in params and "int row_blocks" in params and "int m" not in params
    assert "constexpr int KSPLIT = 16;" in src and "__shared__ float s_part[GROUPS][TILE_N];" in src
    assert "c += split * CHUNK" in src and "each block takes the rows the encoder's" in src


def test_source_names_its_constants():
    spec = spec_for(random_csr(512, 2048, 0.2, seed=10), 128)
    src = render(spec)
    for line in ("constexpr int N = 128;", "constexpr int KSPLIT = 8;", "constexpr int CHUNK = 32;",
                 "constexpr bool COL_RESIDUE = false;", "typedef int index_t;"):
        assert line in src
    assert "order" not in src.split("sputnik_spmm(")[1].split(")")[0]


def test_prefetch_by_default_for_float32_at_narrow_n():
    a = random_csr(512, 2048, 0.2, seed=7)
    narrow, wide = spec_for(a, 32), spec_for(a, 128)
    assert narrow.prefetch and ".b16.pf.i32s" in narrow.name and not wide.prefetch and ".pf" not in wide.name
    assert not spec_for(a, 32, dtype="float16").prefetch  # measured in float32 only
    assert "the next chunk loaded while this one computes" in select(
        analyze(a), op="spmm", n=32, options=(("family", "sputnik_spmm"),)).reason
    assert not spec_for(a, 32, prefetch=0).prefetch and spec_for(a, 128, prefetch=1).prefetch
    assert not spec_for(a, 32, balance=1).prefetch and spec_for(a, 32, balance=1, prefetch=1).prefetch  # measured slower
    with pytest.raises(UnsupportedError, match="options prefetch=2: expected 0 or 1"):
        spec_for(a, 32, prefetch=2)


def test_prefetch_source_loads_the_next_chunk_before_the_x_loads():
    a = random_csr(512, 2048, 0.2, seed=7)
    src = render(spec_for(a, 32)).split("*/", 1)[1]
    loop = src.split("Software-pipelined sparse row")[1]
    assert "fetch_chunk(next, indices, values, aligned + ks * CHUNK" in loop  # chunk 0 before the loop
    whole = loop.split("put<false>(s_o, s_v, next")[1]
    assert whole.index("fetch_chunk(next, indices, values, c + step") < whole.index("__ldg(reinterpret_cast<const xvec_t*>")
    assert "stage<false>(s_o, s_v, indices" not in loop
    plain = render(spec_for(a, 32, prefetch=0)).split("*/", 1)[1]
    assert "fetch_chunk" not in plain and "struct Chunk" not in plain  # the kernel of before, text for text


SHAPES = [  # (m, k, density, n, dtype, options): one per code path the rule can pick
    (512, 2048, 0.2, 128, "float32", {}),  # ksplit 8, prescaled
    (3000, 300, 0.05, 1, "float32", {}),  # one thread per row, 4-wide sparse loads
    (300, 500, 0.1, 33, "float16", {}),  # scalar loads, 16-bit indices, column residue
    (300, 40000, 0.001, 256, "float16", {}),  # 32-bit indices in fp16
    (3, 70000, 0.001, 32768, "float16", {}),  # 64-bit offsets
    (200, 200, 0.1, 96, "float32", {"ksplit": 16}),  # block of 256+ threads
    (400, 900, 0.3, 256, "float32", {"chunk": 64, "batch": 8}),  # 2-wide sparse loads, 8 X loads in flight
    (400, 900, 0.3, 128, "float16", {"chunk": 128, "block": 256}),  # 4-wide sparse loads, 8 rows a block
    (400, 900, 0.3, 1024, "float32", {"piece": 32}),  # split per row, 16 at most
    (400, 900, 0.3, 40, "float16", {"balance": 1}),  # split per row, narrow groups, column residue
    (400, 900, 0.3, 32, "float32", {}),  # prefetched chunks
    (400, 900, 0.3, 20, "float32", {"piece": 32}),  # prefetched chunks, split per row
]


@pytest.mark.nvcc
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-n{s[3]}-{s[4]}")
@pytest.mark.parametrize("epilogue", [False, True])
def test_every_code_shape_compiles_for_sm90(shape, epilogue):
    m, k, density, n, dtype, options = shape
    a = random_csr(m, k, density, seed=11)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", bias=np.ones(m) if epilogue else None,
                               relu=epilogue, options={"family": "sputnik_spmm", **options})
    assert nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)


def test_wide_outputs_run_512_thread_blocks_in_fp32():
    a = random_csr(512, 2048, 0.1, seed=9)  # a DLMC-sized layer: rows split at narrower n
    wide = spec_for(a, 1024)
    assert wide.rows * wide.ksplit * wide.width == fam.WIDE_N_BLOCK
    reason = select(analyze(a), op="spmm", n=1024, options=(("family", "sputnik_spmm"),)).reason
    assert "512-thread blocks (n >= 1024: measured faster)" in reason
    in_order = spec_for(a, 256)  # uniform rows, not swizzled: 512 threads from n = 128
    assert not in_order.swizzle and in_order.rows * in_order.ksplit * in_order.width == fam.WIDE_N_BLOCK
    rng = np.random.default_rng(9)  # 512 rows of exactly 40 nonzeros: in order, shorter than measured
    cols = np.sort(np.argsort(rng.random((512, 2048)), axis=1)[:, :40], axis=1).ravel()
    even = sp.csr_matrix((np.ones(cols.size, np.float32), cols, np.arange(0, cols.size + 1, 40)), shape=(512, 2048))
    short = spec_for(even, 256)
    assert not short.swizzle and short.rows * short.ksplit * short.width == max(fam.BLOCK_THREADS,
                                                                                 short.ksplit * short.width)
    skewed = sp.vstack([random_csr(500, 2048, 0.05, seed=9), random_csr(12, 2048, 0.6, seed=9)]).tocsr()
    narrow = spec_for(skewed, 256)  # swizzled rows keep 128 below n = 1024
    assert narrow.swizzle and narrow.rows * narrow.ksplit * narrow.width == max(fam.BLOCK_THREADS,
                                                                                 narrow.ksplit * narrow.width)
    assert spec_for(a, 32).rows * spec_for(a, 32).ksplit * spec_for(a, 32).width <= fam.BLOCK_THREADS  # n = 32
    asked = spec_for(a, 1024, block=128)  # options still win
    assert asked.rows * asked.ksplit * asked.width == max(128, asked.ksplit * asked.width)
    half = spec_for(a, 1024, dtype="float16")
    assert half.rows * half.ksplit * half.width == max(fam.BLOCK_THREADS, half.ksplit * half.width)  # measured in fp32 only
