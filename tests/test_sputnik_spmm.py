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

from .helpers import TOL, random_csr, reference, rel_error, rounded


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


def test_many_long_rows_take_the_measured_chunk_and_batch():
    a = random_csr(4096, 2048, 0.2, seed=3)  # 4096 rows of ~410 nonzeros
    assert (spec_for(a, 128).chunk, spec_for(a, 128).batch, spec_for(a, 128).ksplit) == (64, 16, 1)
    assert (spec_for(a, 256).chunk, spec_for(a, 256).batch) == (64, 16)  # 8192 warps
    assert (spec_for(a, 1024).chunk, spec_for(a, 1024).batch, spec_for(a, 1024).ksplit) == (32, 8, 1)
    assert spec_for(a, 1024, batch=32).batch == 32  # options still win
    short = random_csr(4096, 2048, 0.05, seed=3)  # ~100 per row: the defaults
    assert (spec_for(short, 1024).chunk, spec_for(short, 1024).batch) == (32, 16)
    assert spec_for(a, 1024, dtype="float16").batch == 16  # measured in fp32 only
    assert "4096 x 2048, rows unsplit: measured faster" in select(analyze(a), op="spmm", n=128).reason
    narrow = random_csr(4096, 1024, 0.4, seed=3)  # ~410 per row but 1024 columns: not measured, the defaults
    assert (spec_for(narrow, 128).chunk, spec_for(narrow, 128).ksplit) == (32, 1)  # 4096 warps unsplit


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


def test_default_selection_keeps_narrow_n_with_short_rows_on_csr_rowsplit():
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


def test_name_reason_and_options():
    a = random_csr(512, 2048, 0.2, seed=7)
    sel = select(analyze(a), op="spmm", n=128)
    assert sel.spec.family == "panel_spmm"  # 2048 columns at 20 %: measured faster there
    assert [c[1].family for c in sel.candidates] == ["sputnik_spmm", "csr_rowsplit"]
    sel = select(analyze(a), op="spmm", n=128, options=(("family", "sputnik_spmm"),))
    assert sel.spec.name == ("sputnik_spmm.f32.n128.v4.w32.ks8.r1.c32x1.b16.i32s")
    assert "8 groups per row (512 rows alone give 512 warps; split while the grid stays within 4224" in sel.reason
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


def test_source_names_its_constants():
    spec = spec_for(random_csr(512, 2048, 0.2, seed=10), 128)
    src = render(spec)
    for line in ("constexpr int N = 128;", "constexpr int KSPLIT = 8;", "constexpr int CHUNK = 32;",
                 "constexpr bool COL_RESIDUE = false;", "typedef int index_t;"):
        assert line in src
    assert "order" not in src.split("sputnik_spmm(")[1].split(")")[0]


SHAPES = [  # (m, k, density, n, dtype, options): one per code path the rule can pick
    (512, 2048, 0.2, 128, "float32", {}),  # ksplit 8, prescaled
    (3000, 300, 0.05, 1, "float32", {}),  # one thread per row, 4-wide sparse loads
    (300, 500, 0.1, 33, "float16", {}),  # scalar loads, 16-bit indices, column residue
    (300, 40000, 0.001, 256, "float16", {}),  # 32-bit indices in fp16
    (3, 70000, 0.001, 32768, "float16", {}),  # 64-bit offsets
    (200, 200, 0.1, 96, "float32", {"ksplit": 16}),  # block of 256+ threads
    (400, 900, 0.3, 256, "float32", {"chunk": 64, "batch": 8}),  # 2-wide sparse loads, 8 X loads in flight
    (400, 900, 0.3, 128, "float16", {"chunk": 128, "block": 256}),  # 4-wide sparse loads, 8 rows a block
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
