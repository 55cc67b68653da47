"""`ell_coo_spmm`: the width rule, the encoder, the emulator against scipy, selection, the launch
steps, and (nvcc tier) every code shape the rule can produce."""
from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.families import FAMILIES, ORDER, spec_from_dict
from sparsegen.families import ell_coo_spmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import ell_coo as fmt
from sparsegen.render import render
from sparsegen.runtime import arg_format
from sparsegen.select import select_request

from .helpers import TOL, reference, rel_error, rounded, term_error


def csr_from_lengths(lengths, k, seed=0, dtype=np.float32):
    """A canonical CSR matrix with the given row lengths (each <= k), distinct random columns."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    m = lengths.size
    order = np.argsort(rng.random((m, k)), axis=1)  # a random permutation of the columns per row
    take = np.arange(k)[None, :] < lengths[:, None]
    cols = np.sort(np.where(take, order, k), axis=1)[take]  # each row's chosen columns, sorted
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return sp.csr_matrix((rng.standard_normal(cols.size).astype(dtype), cols, indptr), shape=(m, k))


def skewed_csr(m, k, seed=0, alpha=1.1, scale=4.0, empty=0.1):
    """Heavy-tailed (Pareto) row lengths capped at k, a share `empty` of rows empty: CoV mostly > 1."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(k, (rng.pareto(alpha, m) * scale).astype(np.int64))
    lengths[rng.random(m) < empty] = 0
    return csr_from_lengths(lengths, k, seed)


def minilm_like(m=384, k=1536, seed=0):
    """Rows from 4 to 874 nonzeros, most short: the shape of magnitude-pruned MiniLM layers."""
    rng = np.random.default_rng(seed)
    longest = min(874, k)
    lengths = np.clip(np.exp(rng.normal(3.2, 1.0, m)), 4, longest).astype(np.int64)
    lengths[:2] = (4, longest)
    return csr_from_lengths(lengths, k, seed)


def lengths_of(a):
    return np.diff(a.indptr)


def emulate(a, n, dtype, width=None, bias=None, relu=False, x=None, seed=0):
    width = fmt.choose_width(lengths_of(a)) if width is None else width
    spec = fam.make_spec(dtype, n, width, bias=bias is not None, relu=relu)
    a = rounded(a, dtype)
    plan = fam.encode(a, spec, None if bias is None else np.asarray(bias, np.float32))
    if x is None:
        x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(dtype)
    return fam.emulate(spec, plan, {"x": x}), reference(a, x, bias, relu), plan


# ---- the width rule ------------------------------------------------------------------------

@pytest.mark.parametrize("lengths,width", [
    ([1, 1, 1, 100], 1), ([0, 0, 10, 10], 5), ([3] * 9 + [874], 3), ([1, 2, 3, 4], 3), ([7], 7),
    ([0, 0, 0, 5], 1), ([4, 10, 20, 874, 30], 20), ([], 1)])
def test_width_is_the_median_row_rounded_up_and_at_least_one(lengths, width):
    assert fmt.choose_width(lengths) == width


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=40))
def test_width_minimises_padded_slots_plus_tail_entries(lengths):
    lengths = np.array(lengths)

    def cost(w):
        return np.maximum(w - lengths, 0).sum() + np.maximum(lengths - w, 0).sum()

    best = min(cost(w) for w in range(fmt.MIN_WIDTH, lengths.max() + 2))
    assert cost(fmt.choose_width(lengths)) == best


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 60), seed=st.integers(0, 1000))
def test_selection_takes_the_same_width_as_the_encoder(m, seed):
    a = skewed_csr(m, 120, seed)
    stats = analyze(a)
    assert fmt.width_from_median(stats.row_length_percentiles["p50"]) == fmt.choose_width(lengths_of(a))


def test_chunks_are_as_long_as_an_ell_row_and_never_under_32():
    assert fmt.chunk_size(0) == fmt.chunk_size(5) == 32
    assert fmt.chunk_size(100) == 100


# ---- the encoder ---------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 50), k=st.integers(1, 80), width=st.integers(0, 12), chunk=st.integers(1, 9),
       seed=st.integers(0, 1000))
def test_encoder_splits_every_row_at_the_width(m, k, width, chunk, seed):
    a = skewed_csr(m, k, seed)
    plan = fmt.encode(a, "float32", width, chunk)
    arr, c = plan.arrays, plan.constants
    lengths = lengths_of(a)
    stride = c["stride"]
    assert stride % fmt.ROW_ALIGN == 0 and m <= stride < m + fmt.ROW_ALIGN
    assert arr["ell_cols"].shape == arr["ell_vals"].shape == (width, stride)
    assert all(arr[name].dtype == np.int32 for name in ("ell_cols", "row_len", "chunk_row", "chunk_ptr",
                                                        "tail_cols", "tail_rows"))
    np.testing.assert_array_equal(arr["row_len"], lengths)
    # ELL: slot s of row r holds the row's s-th nonzero for s < min(len, W), zeros past it
    count = np.minimum(lengths, width)
    valid = np.arange(width)[:, None] < np.pad(count, (0, stride - m))[None, :]
    rows, slots = np.nonzero(valid.T)
    np.testing.assert_array_equal(arr["ell_cols"].T[valid.T], a.indices[a.indptr[rows] + slots])
    np.testing.assert_array_equal(arr["ell_vals"].T[valid.T], a.data[a.indptr[rows] + slots])
    assert not arr["ell_cols"][~valid].any() and not arr["ell_vals"][~valid].any()
    # COO tail: every entry past W, in row order; chunks of one row each, at most `chunk` long
    ptr = arr["chunk_ptr"]
    sizes = np.diff(ptr)
    assert ptr[0] == 0 and ptr[-1] == c["tail_nnz"] == arr["tail_cols"].size
    assert (sizes >= 1).all() and (sizes <= chunk).all()
    assert (np.diff(arr["chunk_row"]) >= 0).all()
    tail_rows = np.repeat(arr["chunk_row"], sizes)
    rebuilt = sp.csr_matrix((np.concatenate([arr["ell_vals"].T[valid.T], arr["tail_vals"]]),
                             (np.concatenate([rows, tail_rows]),
                              np.concatenate([arr["ell_cols"].T[valid.T], arr["tail_cols"]]))), shape=a.shape)
    assert (rebuilt != a).nnz == 0
    np.testing.assert_array_equal(arr["tail_rows"], np.flatnonzero(lengths > width))
    np.testing.assert_array_equal(np.unique(arr["chunk_row"]), arr["tail_rows"])
    assert c["ell_nnz"] + c["tail_nnz"] == c["nnz"] == a.nnz
    assert (c["chunks"], c["tail_count"]) == (sizes.size, arr["tail_rows"].size)
    # a row's chunks are full but for its last one
    last = np.diff(np.append(arr["chunk_row"], -1)) != 0
    assert (sizes[~last] == chunk).all()


def test_encoder_copies_and_keeps_the_bias_in_fp32():
    a = skewed_csr(40, 50, 3)
    plan = fmt.encode(a, "float16", 3, 32, np.arange(40, dtype=np.float64))
    assert plan.arrays["bias"].dtype == np.float32 and plan.arrays["ell_vals"].dtype == np.float16
    a.data[:] = 7
    assert not (plan.arrays["ell_vals"] == 7).any()


def test_describe_split_names_the_shares():
    plan = fmt.encode(csr_from_lengths([1, 1, 1, 9], 20), "float32", 1, 32)
    assert fmt.describe_split(plan) == "ELL width 1 holds 33 % of 12 nonzeros; 1 rows spill 8 to 1 COO chunks of <= 32"


# ---- the emulator against scipy ------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 70), k=st.integers(1, 120), n=st.integers(1, 40), alpha=st.floats(0.6, 3.0),
       dtype=st.sampled_from(["float32", "float16"]), epilogue=st.sampled_from(["none", "bias", "bias_relu", "relu"]),
       seed=st.integers(0, 10_000))
def test_emulator_matches_scipy_on_skewed_matrices(m, k, n, alpha, dtype, epilogue, seed):
    a = skewed_csr(m, k, seed, alpha=alpha)
    bias = np.random.default_rng(seed).standard_normal(m) if "bias" in epilogue else None
    x = np.random.default_rng(seed).standard_normal((k, n)).astype(dtype)
    y, ref, _ = emulate(a, n, dtype, bias=bias, relu="relu" in epilogue, x=x)
    assert y.shape == (m, n) and y.dtype == np.dtype(dtype)
    assert term_error(y, ref, rounded(a, dtype), x, bias) <= TOL[dtype]  # the bias may cancel A·X


@pytest.mark.parametrize("width", [0, 1, 2, 7, 100])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_emulator_is_right_at_any_width(width, dtype):
    a = minilm_like(96, 900, seed=width)
    bias = np.linspace(-3, 3, 96)
    y, ref, plan = emulate(a, 24, dtype, width=width, bias=bias, relu=True)
    assert rel_error(y, ref) <= TOL[dtype]
    assert plan.constants["tail_count"] == (lengths_of(a) > width).sum()


def test_minilm_like_rows_leave_no_row_over_the_median_in_the_ell_pass():
    a = minilm_like()
    lengths = lengths_of(a)
    assert (lengths.min(), lengths.max()) == (4, 874) and lengths.std() / lengths.mean() >= 1.0
    y, ref, plan = emulate(a, 64, "float16", bias=np.zeros(384), relu=True)
    assert rel_error(y, ref) <= TOL["float16"]
    width = plan.constants["width"]
    assert width == int(np.ceil(np.median(lengths))) and (lengths <= width).mean() >= 0.5


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("width", [0, 3, 1000])
def test_inf_in_x_stays_out_of_rows_that_do_not_reference_it(dtype, width):
    """Padding slots point at column 0: an inf in X's row 0 must not become NaN through them."""
    a = minilm_like(64, 300, seed=4)
    x = np.random.default_rng(1).standard_normal((300, 16)).astype(dtype)
    x[0, :] = np.inf
    y, _, _ = emulate(a, 16, dtype, width=width, x=x, relu=True, bias=np.ones(64))
    touched = np.zeros(64, bool)
    touched[a.tocoo().row[a.tocoo().col == 0]] = True
    assert touched.any() and not touched.all()
    clean = x.copy()
    clean[0, :] = 0
    ref = reference(rounded(a, dtype), clean, np.ones(64), relu=True)
    assert np.isfinite(y[~touched]).all()
    assert rel_error(y[~touched], ref[~touched]) <= TOL[dtype]


def test_relu_waits_for_the_tail():
    """A row whose ELL part is negative and whose tail makes it positive stays positive."""
    a = sp.csr_matrix(np.array([[1.0, 1.0, 1.0, 1.0], [-1.0, 0, 0, 0], [-5.0, 1.0, 1.0, 1.0]], np.float32))
    x = np.ones((4, 1), np.float32)
    y, ref, plan = emulate(a, 1, "float32", width=1, relu=True, x=x)
    np.testing.assert_array_equal(y[:, 0], [4.0, 0.0, 0.0])
    np.testing.assert_array_equal(plan.arrays["tail_rows"], [0, 2])
    a[2, 0] = -2.0
    y, _, _ = emulate(a, 1, "float32", width=1, relu=True, x=x)
    assert y[2, 0] == 1.0  # -2 in the ELL pass, +3 from the tail: ReLU after both


# ---- selection -----------------------------------------------------------------------------

def request(n=128, dtype="float32", **kw):
    return Request("spmm", n=n, dtype=dtype, **kw)


def test_rule_accepts_high_cov_with_the_numbers_in_the_reason():
    a = minilm_like()
    sel = fam.RULES[0].decide(analyze(a), request(64, "float16", bias=True, relu=True))
    width = fmt.choose_width(lengths_of(a))
    assert sel.spec == fam.make_spec("float16", 64, width, bias=True, relu=True)
    assert f"ELL width {width} = median row, at least 1" in sel.reason and "rows 4..874 nnz" in sel.reason
    assert f"COO chunks of <= {fmt.chunk_size(width)}" in sel.reason and "CoV" in sel.reason
    # in the table it wins over the CSR kernels (families before it in the table may claim fp16)
    full = select_request(analyze(a), request(256, "float32"))  # short rows (about 40 on average), n >= 256
    tried = [rule for rule, _, _ in full.tried]
    assert ("ell_coo_spmm", True) in [(r, ok) for r, ok, _ in full.tried]
    assert full.rule == "ell_coo_spmm" or tried.index(full.rule) < tried.index("ell_coo_spmm")
    assert "csr_rowsplit" in [rule for rule, _, _ in full.candidates]


def test_rule_declines_even_rows_naming_the_cov():
    a = csr_from_lengths([10] * 30 + [12] * 30, 64)
    decision = fam.RULES[0].decide(analyze(a), request())
    assert not decision.accepted
    n = request().n
    cov_min = fam.COV_MIN if n >= fam.WIDE_N else fam.COV_MIN_NARROW
    assert decision.reason == f"row-length CoV 0.09 < {cov_min} (n={n}): rows 10..12 nnz are even enough for one pass"
    assert select_request(analyze(a), request()).spec.family != "ell_coo_spmm"


@pytest.mark.parametrize("n,accepted", [(32, False), (128, True)])
def test_cov_threshold_depends_on_n(n, accepted):
    """CoV 1.0 sits between the measured crossovers: 0.75 for n >= 128, 1.3 for narrower n (float16:
    the CoV bounds alone)."""
    stats = analyze(csr_from_lengths([5] * 40 + [60] * 4, 64))
    stats = dataclasses.replace(stats, row_lengths=dataclasses.replace(stats.row_lengths, cov=1.0))
    assert fam.RULES[0].decide(stats, request(n=n, dtype="float16")).accepted is accepted


def skewed_stats(m, mean, cov=1.5):
    """Analyzer stats of an m-row matrix with about `mean` nonzeros a row and row-length CoV `cov`."""
    lengths = [max(1, mean // 2)] * (m - m // 8) + [mean * 4] * (m // 8)
    stats = analyze(csr_from_lengths(lengths, 8 * mean))
    return dataclasses.replace(stats, row_lengths=dataclasses.replace(stats.row_lengths, cov=cov))


@pytest.mark.parametrize("m,mean,n,needle", [
    (8192, 200, 1024, "rows avg"),  # long rows: sputnik_spmm's splits
    (2048, 24, 128, "2048 rows < 4096 at n=128 < 256"),  # few rows at narrow n: the CSR kernels
    (2048, 24, 32, "2048 rows < 4096 at n=32 < 256"),
])
def test_float32_declines_where_split_csr_was_measured_faster(m, mean, n, needle):
    decision = fam.RULES[0].decide(skewed_stats(m, mean), request(n=n))
    assert not decision.accepted and needle in decision.reason and "measured faster" in decision.reason
    assert fam.RULES[0].decide(skewed_stats(m, mean), request(n=n, dtype="float16")).accepted  # fp16: CoV alone
    forced = request(n=n, options=(("family", fam.FAMILY),))
    assert fam.RULES[0].decide(skewed_stats(m, mean), forced).accepted  # asked for by name


@pytest.mark.parametrize("m,n", [(2048, 256), (2048, 1024), (4096, 128), (8192, 32)])
def test_float32_takes_short_skewed_rows_at_wide_n_or_on_many_rows(m, n):
    decision = fam.RULES[0].decide(skewed_stats(m, 24), request(n=n))
    assert decision.accepted, decision.reason


def test_rule_declines_when_no_row_spills():
    stats = analyze(csr_from_lengths([5] * 10, 64))
    skewed = dataclasses.replace(stats, row_lengths=dataclasses.replace(stats.row_lengths, cov=1.5))
    decision = fam.RULES[0].decide(skewed, request(n=256))
    assert not decision.accepted and "no tail" in decision.reason and "(5 nnz)" in decision.reason


@pytest.mark.parametrize("op,dtype,needle", [("sddmm", "float32", "not spmm"), ("spmm", "float64", "float64")])
def test_rule_declines_other_requests(op, dtype, needle):
    decision = fam.RULES[0].decide(analyze(minilm_like()), Request(op, n=8, dtype=dtype))
    assert not decision.accepted and needle in decision.reason


def test_family_goes_before_the_general_csr_families():
    """It must see a skewed matrix before the CSR kernels that take every matrix do."""
    names = [f.FAMILY for f in ORDER]
    assert names.index("spdnn_sliced_ell") < names.index("ell_coo_spmm") < names.index("csr_rowsplit")
    if "sputnik_spmm" in names:
        assert names.index("ell_coo_spmm") < names.index("sputnik_spmm")
    assert FAMILIES["ell_coo_spmm"].module is fam


# ---- spec, render, steps -------------------------------------------------------------------

@pytest.mark.parametrize("dtype,n,vec,lanes", [
    ("float32", 128, 4, 32), ("float32", 256, 4, 32), ("float32", 12, 4, 4), ("float32", 6, 2, 4),
    ("float32", 7, 1, 8), ("float32", 1, 1, 1), ("float16", 128, 8, 16), ("float16", 33, 1, 32)])
def test_vector_width_and_lanes_follow_n(dtype, n, vec, lanes):
    spec = fam.make_spec(dtype, n, 10)
    assert (spec.vec, spec.lanes) == (vec, lanes) and n % spec.vec == 0
    assert spec.block % spec.lanes == 0


def test_spec_name_spells_every_parameter_and_round_trips():
    spec = fam.make_spec("float16", 100, 20, bias=True, relu=True)
    assert spec.name == "ell_coo_spmm.f16.n100.v4.c32.w20.ch32.u4.b128.bias.relu"
    assert fam.make_spec("float32", 128, 9).name == "ell_coo_spmm.f32.n128.v4.c32.w9.ch32.u9.b128"
    assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_render_has_the_three_kernels_and_the_constants():
    src = render(fam.make_spec("float32", 100, 40, bias=True, relu=True))
    for name in (fam.KERNEL, fam.TAIL_KERNEL, fam.RELU_KERNEL):
        assert f"{name}(" in src
    assert src.count('extern "C"') == 3
    assert "constexpr int WIDTH = 40;" in src and "constexpr int CHUNK = 40;" in src
    assert "constexpr bool COL_RESIDUE = true;" in src and "const float* __restrict__ bias" in src
    plain = render(fam.make_spec("float16", 128, 4)).split("*/", 1)[1]
    assert fam.RELU_KERNEL not in plain and "bias" not in plain
    assert "#pragma unroll\n    for (int s = 0; s < ELL_UNROLL; ++s)" in plain  # width 4: fully unrolled
    assert "__half2" in plain


@pytest.mark.parametrize("relu", [False, True])
def test_steps_launch_the_ell_pass_then_the_tail_then_relu(relu):
    a = minilm_like(200, 1000)
    spec = fam.make_spec("float32", 100, fmt.choose_width(lengths_of(a)), bias=True, relu=relu)
    plan = fam.encode(a, spec, np.zeros(200, np.float32))
    steps = fam.steps(spec, plan)
    assert [s.kernel for s in steps] == [fam.KERNEL, fam.TAIL_KERNEL] + ([fam.RELU_KERNEL] if relu else [])
    c = plan.constants
    for step, items in zip(steps, (c["m"], c["chunks"], c["tail_count"])):
        assert step.launch.block == (128, 1, 1) and step.launch.shared_bytes == 0
        gx, gy, _ = step.launch.grid
        assert gx * spec.groups_per_block >= items > (gx - 1) * spec.groups_per_block
        assert gy == 1  # 100 columns in one tile of 128
        for arg in step.args:
            source = {"plan": plan.arrays, "int": plan.constants}.get(arg.kind, {"x": 0, "y": 0})
            assert arg.name in source
        assert len(arg_format(step.args)) == len(step.args)
    assert steps[0].args == fam.arguments(spec)
    assert fam.alignment(spec) == 16
    (x,), y = fam.operands(spec, plan)
    assert (x.shape, y.shape, x.dtype) == ((1000, 100), (200, 100), "float32")


@pytest.mark.parametrize("bias,relu", [(False, False), (True, True)])
def test_each_steps_arguments_match_its_kernels_parameters(bias, relu):
    import re

    a = minilm_like(64, 900)
    spec = fam.make_spec("float16", 24, 7, bias=bias, relu=relu)
    plan = fam.encode(a, spec, np.zeros(64, np.float32) if bias else None)
    body = render(spec).split("*/", 1)[1]
    for step in fam.steps(spec, plan):
        params = re.search(rf"{step.kernel}\(([^)]*)\)", body).group(1)
        names = [re.findall(r"\w+", p)[-1] for p in params.split(",")]
        assert names == [arg.name for arg in step.args], step.kernel


def test_no_tail_means_one_step_and_wide_n_tiles_columns():
    a = csr_from_lengths([3, 1, 2, 3], 10)
    spec = fam.make_spec("float16", 1000, 3, relu=True)
    steps = fam.steps(spec, fam.encode(a, spec))
    assert [s.kernel for s in steps] == [fam.KERNEL]
    assert steps[0].launch.grid == (1, 4, 1)  # 4 rows, 8 rows per block; 1000 columns in tiles of 256


# ---- through the API -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compile_emulate_through_the_api_matches_scipy(dtype):
    a = minilm_like(128, 700, seed=2)
    bias = np.linspace(-1, 1, 128)
    pin = {"family": "ell_coo_spmm"}  # families ahead of it in the table may claim the matrix too
    kernel = sparsegen.compile(a, n=48, dtype=dtype, bias=bias, relu=True, options=pin, backend="emulate")
    assert kernel.spec.family == "ell_coo_spmm"
    x = np.random.default_rng(0).standard_normal((700, 48)).astype(dtype)
    assert rel_error(kernel(x), reference(rounded(a, dtype), x, bias, relu=True)) <= TOL[dtype]
    warm = sparsegen.compile(a, n=48, dtype=dtype, bias=bias, relu=True, options=pin, backend="emulate")
    assert warm.timings.cached.get("plan") and warm.spec == kernel.spec
    np.testing.assert_array_equal(warm(x), kernel(x))
    json.dumps(kernel.describe())


# ---- nvcc tier: every code shape the rule can produce --------------------------------------

def code_shapes():
    """Both dtypes; every vector width (n = 1, 2 or 6, 12, 128, and a residue tile); ELL widths
    that unroll fully (0, small) or by 4 (large); with and without bias and ReLU."""
    shapes = {}
    cases = {"float32": (1, 6, 12, 100, 128), "float16": (1, 6, 12, 128, 1000)}
    for dtype, ns in cases.items():
        for i, (n, width) in enumerate(itertools.product(ns, (0, 5, 40))):
            bias, relu = ((False, False), (True, True), (True, False), (False, True))[i % 4]
            spec = fam.make_spec(dtype, n, width, bias=bias, relu=relu)
            shapes[spec.name] = spec
    return sorted(shapes.values(), key=lambda s: s.name)


def test_code_shapes_cover_every_branch():
    shapes = code_shapes()
    assert {(s.dtype, s.vec) for s in shapes} == {("f32", 1), ("f32", 2), ("f32", 4), ("f16", 1), ("f16", 2),
                                                  ("f16", 4), ("f16", 8)}
    assert {(s.bias, s.relu) for s in shapes} == {(False, False), (True, True), (True, False), (False, True)}
    assert {s.unroll == s.width for s in shapes} == {True, False}
    assert {s.n % s.tile_n == 0 for s in shapes} == {True, False}


@pytest.mark.nvcc
@pytest.mark.parametrize("spec", code_shapes(), ids=lambda s: s.name)
def test_every_code_shape_compiles_for_sm90(spec):
    cubin = nvcc.compile_cubin(render(spec), "sm_90", name=spec.name)
    assert cubin[:4] == b"\x7fELF"
