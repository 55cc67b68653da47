"""`sputnik_sddmm`: parameter choices, the rule, the tile encoder, the emulator against a float64
reference, the API path, and (nvcc tier) every code shape the rule can pick compiling for sm_90."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.errors import ShapeError, UnsupportedError
from sparsegen.families import sputnik_sddmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import csr_sddmm as fmt
from sparsegen.render import render
from sparsegen.select import select, select_request

from .helpers import TOL, random_csr, rel_error


def uniform_rows(m, n, length, seed=0):
    """m x n CSR, every row `length` distinct random columns."""
    rng = np.random.default_rng(seed)
    cols = np.sort(np.argsort(rng.random((m, n)), axis=1)[:, :length], axis=1)
    return sp.csr_matrix((rng.standard_normal(m * length).astype(np.float32), cols.ravel(),
                          np.arange(0, m * length + 1, length)), shape=(m, n))


@functools.lru_cache(maxsize=None)
def stats_of(m, n, length):
    return analyze(uniform_rows(m, n, length))


def choose(stats, k, dtype="float32", **options):
    return fam.choose(stats, Request("sddmm", k=k, dtype=dtype, options=tuple(sorted(options.items()))))


def reference(a, x, y):
    """float64 (A . B^T) sampled at a's pattern, in CSR order."""
    coo = a.tocoo()
    return np.einsum("ij,ij->i", np.asarray(x, np.float64)[coo.row], np.asarray(y, np.float64)[coo.col])


def operands(a, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((a.shape[0], k)).astype(dtype), rng.standard_normal((a.shape[1], k)).astype(dtype))


# ---- parameter choices ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,k,vec,lanes", [
    ("float32", 32, 4, 8), ("float32", 128, 4, 8), ("float32", 256, 4, 16), ("float32", 100, 4, 8),
    ("float32", 6, 2, 4), ("float32", 3, 1, 4), ("float32", 1, 1, 1), ("float32", 33, 1, 32),
    ("float16", 32, 8, 4), ("float16", 128, 8, 8), ("float16", 100, 4, 16), ("float16", 2, 2, 1),
    ("float16", 33, 1, 32), ("float32", 32768, 4, 8)])
def test_vector_width_and_lanes_follow_k(dtype, k, vec, lanes):
    spec, _ = choose(stats_of(2048, 512, 100), k, dtype)
    assert (spec.vec, spec.lanes) == (vec, lanes)
    assert k % spec.vec == 0
    assert spec.lanes * spec.vec * spec.itemsize <= fam.LINE_BYTES or spec.chunk == k  # or one pass (ONE_PASS)
    assert spec.tile * spec.unroll <= fam.LOADS_IN_FLIGHT or spec.unroll == 1
    assert spec.chunk <= max(k, spec.lanes * spec.vec)  # no pass beyond k unless k is under one load round


def test_many_long_rows_take_whole_tiles_few_rows_smaller_ones():
    big, _ = choose(stats_of(2048, 1024, 256), 512)
    small, reason = choose(stats_of(512, 4608, 92), 512)
    assert big.tile == 32 and big.unroll == 1
    assert small.tile < 32 and small.tile * small.unroll == fam.LOADS_IN_FLIGHT
    assert "tiles of" in reason and "132 SMs" in reason


@pytest.mark.parametrize("rows,cols,per_row", [(2048, 1024, 256), (512, 4608, 92), (100_000, 512, 5)])
def test_float32_k_of_one_pass_takes_the_one_pass_configuration(rows, cols, per_row):
    spec, reason = choose(stats_of(rows, cols, per_row), 128)
    assert (spec.lanes, spec.tile, spec.unroll, spec.block, spec.min_blocks) == (8, 8, 4, 256, 3)
    assert spec.chunk == 128 and "one pass of 8-nonzero tiles for 8-lane groups" in reason
    assert "24 warps an SM" in reason
    for k, dtype in ((512, "float32"), (64, "float32"), (32, "float32"), (128, "float16"), (120, "float32")):
        other, why = choose(stats_of(rows, cols, per_row), k, dtype)
        assert "one pass" not in why and other.min_blocks == max(1, 65536 // (other.block * fam.REGISTERS))
    forced, why = choose(stats_of(rows, cols, per_row), 128, tile=16, block=512)
    assert (forced.tile, forced.unroll, forced.block, forced.min_blocks) == (16, 2, 512, 1) and "one pass" not in why
    assert choose(stats_of(rows, cols, per_row), 128, min_blocks=2)[0].min_blocks == 2


def test_k_256_takes_16_lane_groups_in_one_pass_unless_the_rule_wants_large_blocks():
    few, why = choose(stats_of(2048, 1024, 256), 256)  # the rule's blocks: 128 threads
    assert (few.lanes, few.tile, few.unroll, few.block, few.min_blocks) == (16, 8, 4, 256, 3) and few.chunk == 256
    assert "for 16-lane groups" in why
    many, why = choose(stats_of(8192, 8192, 1640), 256)  # the rule's blocks: 512 threads
    assert many.lanes == 8 and many.block == fam.LARGE_BLOCK and "one pass" not in why
    assert choose(stats_of(2048, 1024, 256), 256, lanes=8)[0].lanes == 8  # an option turns it off


def test_short_rows_take_short_tiles():
    spec, reason = choose(stats_of(100_000, 512, 5), 32)
    assert spec.tile == 8
    assert "rows avg 5.0 nnz" in reason


def test_small_matrices_get_small_blocks_large_ones_large_blocks():
    small, reason = choose(stats_of(300, 512, 20), 32)
    large, _ = choose(stats_of(50_000, 512, 64), 32)
    assert small.block <= 64 and small.min_blocks == 65536 // (small.block * fam.REGISTERS)
    tiles = fam.estimated_tiles(stats_of(300, 512, 20), small.tile)
    scores = {b: round(fam.spread(-(-tiles // (b // small.lanes)), 132), 2) for b in fam.BLOCKS}
    assert scores[small.block] == max(scores.values()) < fam.SPREAD  # none is even enough: the most even one
    assert "even" in reason
    assert large.block == 512 and large.min_blocks == 1
    assert fam.spread(250, 132) == 250 / 132 / 2 and fam.spread(66, 132) == 0.5


def test_sm_count_follows_the_device_model():
    from .helpers import synthetic_device

    s90, _ = fam.choose(stats_of(512, 4608, 92), Request("sddmm", k=128))
    s75, _ = fam.choose(stats_of(512, 4608, 92), Request("sddmm", k=128, device=synthetic_device(sm_count=40)))
    assert s75.tile >= s90.tile
    assert fam.choose(stats_of(512, 4608, 92), Request("sddmm", k=128, arch="sm_75"))[0] == s90  # not the target


def test_offsets_widen_when_col_times_k_overflows():
    stats = dataclasses.replace(stats_of(64, 512, 8), shape=(64, 40_000))
    spec, reason = choose(stats, 65_536)
    assert not spec.scaled and "64-bit offsets" in reason
    assert choose(stats, 32)[0].scaled


def test_options_override_the_rule():
    spec, reason = choose(stats_of(512, 512, 64), 128, tile=8, unroll=2, block=64, order="row")
    assert (spec.tile, spec.unroll, spec.block, spec.order) == (8, 2, 64, "row")
    assert "row-major" in reason
    assert choose(stats_of(512, 512, 64), 128, block=256, min_blocks=3)[0].min_blocks == 3


def test_min_blocks_that_overfill_an_sm_are_declined():
    decision = fam._rule(stats_of(64, 64, 4), Request("sddmm", k=8, options=(("block", 512), ("min_blocks", 5))))
    assert not decision.accepted and "5 blocks of 512 threads exceed the 2048" in decision.reason
    assert fam._rule(stats_of(64, 64, 4), Request("sddmm", k=8, options=(("block", 512), ("min_blocks", 4)))).accepted


def test_spec_name_spells_every_parameter():
    spec = fam.Spec("f16", 100, 4, 16, 1, 8, 128, 4, "row", False)
    assert spec.name == "sputnik_sddmm.f16.k100.v4.w16.u1.x8.b128m4.row"
    assert fam.Spec("f32", 128, 4, 8, 1, 32, 256, 2, "phase", True).name == \
        "sputnik_sddmm.f32.k128.v4.w8.u1.x32.b256m2.phase.s"
    for field in dataclasses.fields(spec):
        assert field.name in fam.Spec.__dataclass_fields__


# ---- the rule -----------------------------------------------------------------------------------

def test_selection_picks_the_family_for_sddmm_only():
    sel = select(stats_of(512, 512, 64), op="sddmm", k=64)
    assert sel.rule == "sputnik_sddmm" and sel.spec.family == "sputnik_sddmm"
    tried = {rule: (ok, why) for rule, ok, why in sel.tried}
    assert tried["csr_rowsplit"][0] is False
    spmm = select(stats_of(512, 512, 64), op="spmm", n=64)
    assert dict((r, ok) for r, ok, _ in spmm.tried)["sputnik_sddmm"] is False


@pytest.mark.parametrize("request_,needle", [
    (Request("spmm", n=8), "not sddmm"), (Request("sddmm"), "needs k"),
    (Request("sddmm", k=8, dtype="float64"), "float64"),
    (Request("sddmm", k=8, options=(("tile", 12),)), "tile=12"),
    (Request("sddmm", k=8, options=(("order", "zigzag"),)), "order='zigzag'"),
    (Request("sddmm", k=8, options=(("block", 48),)), "block=48"),
    (Request("sddmm", k=8, options=(("unroll", 3),)), "unroll=3"),
    (Request("sddmm", k=8, options=(("min_blocks", 0),)), "min_blocks=0"),
    (Request("sddmm", k=8, options=(("lanes", 3),)), "lanes=3")])
def test_rule_declines_with_reasons(request_, needle):
    decision = fam._rule(stats_of(64, 64, 4), request_)
    assert not decision.accepted and needle in decision.reason


def test_rule_declines_64_bit_sizes():
    huge = dataclasses.replace(stats_of(64, 64, 4), nnz=2**31 - 10)
    decision = fam._rule(huge, Request("sddmm", k=8))
    assert not decision.accepted and "64-bit" in decision.reason
    with pytest.raises(UnsupportedError, match="sputnik_sddmm"):
        select_request(huge, Request("sddmm", k=8))


# ---- the encoder --------------------------------------------------------------------------------

def encode(a, k=8, tile=8, lanes=8, block=64, order="phase", scaled=True):
    return fmt.encode(a, k=k, tile=tile, lanes=lanes, block=block, order=order, scaled=scaled)


@pytest.mark.parametrize("order", fmt.ORDERS)
@pytest.mark.parametrize("tile,lanes", [(8, 8), (32, 4), (4, 8), (16, 1), (32, 32)])
def test_tiles_cover_every_nonzero_once_in_csr_order(order, tile, lanes):
    a = random_csr(150, 90, 0.2, seed=3, empty_rows=0.3)
    plan = encode(a, tile=tile, lanes=lanes, block=128, order=order)
    pos, rows, cols = fmt.gather(plan)
    assert np.array_equal(np.sort(pos), np.arange(a.nnz))
    coo = a.tocoo()
    assert np.array_equal(rows[np.argsort(pos)], coo.row) and np.array_equal(cols[np.argsort(pos)], coo.col)
    tiles = plan.arrays["tiles"]
    assert tiles.shape[0] % (128 // lanes) == 0 and plan.constants["tiles"] == tiles.shape[0]
    assert (tiles[:, 2] <= tile).all()


def test_tiles_run_longest_rows_first_and_phase_major():
    a = sp.csr_matrix(np.triu(np.ones((6, 40), np.float32), k=0)[:, ::-1])  # row lengths 40, 39, ..., 35
    a = sp.csr_matrix(a[[5, 0, 3, 1, 4, 2]])  # lengths 35, 40, 37, 39, 36, 38
    tiles = encode(a, tile=16, block=64).arrays["tiles"]
    real = tiles[tiles[:, 2] > 0]
    assert list(real[:6, 0]) == [1, 3, 5, 2, 4, 0]  # phase 0, rows by decreasing length
    assert list(real[:6, 1]) == list(a.indptr[[1, 3, 5, 2, 4, 0]])
    assert list(real[12:, 2]) == [8, 7, 6, 5, 4, 3]  # phase 2: each row's remainder
    by_row = encode(a, tile=16, block=64, order="row").arrays["tiles"]
    assert list(by_row[:3, 0]) == [1, 1, 1] and list(by_row[:3, 2]) == [16, 16, 8]


def test_partial_tiles_repeat_their_last_column_and_slots_are_scaled():
    a = sp.csr_matrix(([1.0, 1.0, 1.0], [2, 5, 7], [0, 3]), shape=(1, 10))
    plan = encode(a, k=12, tile=8, lanes=8)
    slots = fmt.deinterleave(plan.arrays["slots"], 8, plan.constants["group"])
    assert list(slots[0]) == [24, 60, 84, 84, 84, 84, 84, 84]
    assert (slots[1:] == 0).all()  # padding tiles
    raw = fmt.deinterleave(encode(a, k=12, tile=8, lanes=8, scaled=False).arrays["slots"], 8, 4)
    assert list(raw[0][:3]) == [2, 5, 7]


def test_slots_of_a_warp_interleave_four_at_a_time():
    flat = fmt.interleave(np.arange(4 * 8).reshape(4, 8), 8, 2)
    # warp 0 holds tiles 0 and 1: slots 0-3 of tile 0, then of tile 1, then slots 4-7 of each
    assert list(flat[:16]) == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    assert np.array_equal(fmt.deinterleave(flat, 8, 2), np.arange(32).reshape(4, 8))


def test_empty_matrix_encodes_and_launches_nothing():
    a = sp.csr_matrix((40, 30), dtype=np.float32)
    kernel = sparsegen.compile(a, op="sddmm", k=16, backend="emulate")
    assert kernel.plan.constants["tiles"] == 0 and kernel.plan.arrays["tiles"].shape == (0, 4)
    assert 0 in fam.launch(kernel.spec, kernel.plan).grid
    out = kernel(*operands(a, 16, "float32"))
    assert out.shape == (0,) and out.dtype == np.float32


def test_launch_geometry_gives_one_group_per_tile():
    a = random_csr(500, 300, 0.1, seed=4)
    spec, _ = choose(analyze(a), 64)
    plan = fam.encode(a, spec)
    g = fam.launch(spec, plan)
    assert g.block == (spec.block, 1, 1) and g.shared_bytes == 0
    assert g.grid[0] * spec.groups_per_block == plan.constants["tiles"]
    assert fam.alignment(spec) == spec.vec * spec.itemsize
    (x, y), out = fam.operands(spec, plan)
    assert (x.name, x.shape, y.name, y.shape) == ("a", (500, 64), "b", (300, 64))
    assert (out.name, out.shape, out.dtype) == ("out", (a.nnz,), "float32")


# ---- the emulator -------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 60), n=st.integers(1, 60), density=st.floats(0, 0.7), k=st.integers(1, 70),
       dtype=st.sampled_from(["float32", "float16"]), order=st.sampled_from(fmt.ORDERS),
       tile=st.sampled_from([None, 4, 32]), seed=st.integers(0, 10_000))
def test_emulator_matches_float64_reference(m, n, density, k, dtype, order, tile, seed):
    a = random_csr(m, n, density, seed=seed, empty_rows=0.2)
    options = {"order": order, **({"tile": tile} if tile else {})}
    spec = select_request(analyze(a), Request("sddmm", k=k, dtype=dtype, options=tuple(options.items()))).spec
    plan = fam.encode(a, spec)
    x, y = operands(a, k, dtype, seed)
    out = fam.emulate(spec, plan, {"a": x, "b": y})
    assert out.shape == (a.nnz,) and out.dtype == np.dtype(dtype)
    assert rel_error(out, reference(a, x, y)) <= TOL[dtype]


def test_only_stored_entries_are_computed():
    a = sp.csr_matrix(([1.0, 1.0], [0, 2], [0, 1, 1, 2]), shape=(3, 3))
    x = np.ones((3, 4), np.float32)
    y = np.ones((3, 4), np.float32)
    x[1] = np.inf  # row 1 is empty
    y[1] = np.nan  # column 1 is never sampled
    out = sparsegen.compile(a, op="sddmm", k=4, backend="emulate")(x, y)
    assert np.array_equal(out, [4.0, 4.0])


def test_emulator_on_dlmc_matrices(data_dir):
    from sparsegen.bench.dlmc import dlmc_matrices

    for source in dlmc_matrices(data_dir)[::25]:  # a spread of shapes and sparsities
        a = source.load()
        for dtype in ("float32", "float16"):
            kernel = sparsegen.compile(a, op="sddmm", k=32, dtype=dtype, backend="emulate")
            x, y = operands(a, 32, dtype, seed=5)
            assert rel_error(kernel(x, y), reference(a, x, y)) <= TOL[dtype], source.id


# ---- the API ------------------------------------------------------------------------------------

def test_compile_emulate_returns_values_in_csr_order():
    a = random_csr(40, 30, 0.2, seed=6)
    kernel = sparsegen.compile(a, op="sddmm", k=24, dtype="float16", backend="emulate")
    assert kernel.spec.family == "sputnik_sddmm" and kernel.shape == (40, 30)
    assert "sputnik_sddmm" in kernel.source and "constexpr int K = 24;" in kernel.source
    x, y = operands(a, 24, "float16")
    out = kernel(x, y)
    assert out.dtype == np.float16 and rel_error(out, reference(a, x, y)) <= TOL["float16"]
    buf = np.empty(a.nnz, np.float16)
    assert kernel(x, y, out=buf) is buf and np.array_equal(buf, out)


@pytest.mark.parametrize("args,needle", [
    (lambda x, y: (x[:, :5], y), r"input a: expected shape \(40, 6\), got \(40, 5\)"),
    (lambda x, y: (x, y[:-1]), r"input b: expected shape \(30, 6\), got \(29, 6\)"),
    (lambda x, y: (x.astype(np.float64), y), "input a: expected dtype float32, got float64"),
    (lambda x, y: (x,), "takes 2 operand")])
def test_bad_operands_name_the_operand(args, needle):
    a = random_csr(40, 30, 0.2, seed=7)
    kernel = sparsegen.compile(a, op="sddmm", k=6, backend="emulate")
    with pytest.raises(ShapeError, match=needle):
        kernel(*args(*operands(a, 6, "float32")))


def test_source_names_its_constants_and_has_no_template_leftovers():
    spec = fam.Spec("f32", 100, 4, 8, 2, 16, 128, 4, "phase", False)
    src = render(spec)
    for needle in ("constexpr int K = 100;", "constexpr int TILE = 16;", "constexpr int LANES = 8;",
                   "K = 100 is not a multiple of CHUNK = 64", "(size_t)slot * K", 'extern "C"'):
        assert needle in src
    assert "{{" not in src and "{%" not in src


# ---- nvcc tier: every code shape the rule can pick ---------------------------------------------

def shape_key(spec):
    return dataclasses.replace(spec, block=32, min_blocks=1)


def rule_specs():
    """The code shapes the rule makes: k across vector widths, lane counts, residues and a runtime
    pass loop; rows short, long and few (tile 8/16/32); both dtypes; 64-bit offsets and the
    option-only shapes (tile 4 below the lane count, row order). Block sizes only change two constants
    (every one keeps the same register budget), so one per shape is compiled."""
    specs = {}
    shapes = [stats_of(100_000, 512, 5), stats_of(512, 4608, 92), stats_of(50_000, 512, 64), stats_of(300, 512, 20)]
    for stats in shapes:
        for k in (1, 2, 3, 6, 32, 33, 100, 128, 256, 32768):
            for dtype in ("float32", "float16"):
                spec, _ = choose(stats, k, dtype)
                specs.setdefault(shape_key(spec), spec)
    wide = dataclasses.replace(stats_of(64, 512, 8), shape=(64, 40_000))
    for spec in (choose(wide, 65_536)[0], choose(shapes[1], 128, tile=4, order="row")[0],
                 choose(shapes[1], 96, "float16", tile=4)[0], choose(shapes[2], 128, block=512)[0]):
        specs[spec.name] = spec
    return sorted(specs.values(), key=lambda s: s.name)


@pytest.mark.nvcc
@pytest.mark.parametrize("spec", rule_specs(), ids=lambda s: s.name)
def test_every_code_shape_compiles_for_sm90(spec):
    assert nvcc.compile_cubin(render(spec), "sm_90", name=spec.name)[:4] == b"\x7fELF"
