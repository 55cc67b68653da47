"""The families' rules pinned: each threshold of a rule on both sides (the CoV bounds, the row and
column limits, the densified-W share of memory), every decline's reason whole, and the spec fields
a rule chooses, worked out by hand from the documented formulas."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from sparsegen.analyze import LengthStats
from sparsegen.errors import UnsupportedError
from sparsegen.families import base, dense_gemm, ell_coo_spmm as ell, spdnn_sliced_ell as spdnn
from sparsegen.families.base import Request
from sparsegen.select import device as D

from .tiled_helpers import pinned_library


def req(op="spmm", n=64, dtype="float32", **options):
    return Request(op, n=n, dtype=dtype, options=tuple(sorted(options.items())))


# ===================================================================================== base.py

def test_spmm_gate():
    st = SimpleNamespace(nnz=10, shape=(4, 4))
    assert base.spmm_gate(st, req()) is None and base.spmm_gate(st, req(dtype="float16")) is None
    assert base.spmm_gate(st, req("sddmm")).reason == "op 'sddmm' is not spmm"
    assert base.spmm_gate(st, req(dtype="bfloat16")).reason == "dtype bfloat16 not in float32/float16"
    assert base.spmm_gate(SimpleNamespace(nnz=2**31 - 1, shape=(4, 4)), req()) is None
    assert base.spmm_gate(SimpleNamespace(nnz=2**31, shape=(4, 4)), req()).reason == "matrix needs 64-bit indices"
    assert base.spmm_gate(SimpleNamespace(nnz=2**31 - 5, shape=(4, 4)), req(), index_slack=4) is None
    assert base.spmm_gate(SimpleNamespace(nnz=2**31 - 5, shape=(4, 4)), req(), index_slack=5).accepted is False
    assert base.spmm_gate(SimpleNamespace(nnz=1, shape=(2**31 - 1, 4)), req()) is None
    assert base.spmm_gate(SimpleNamespace(nnz=1, shape=(4, 2**31)), req()).reason == "matrix needs 64-bit indices"
    assert base.spmm_gate(SimpleNamespace(nnz=1, shape=(2**31, 4)), req()).reason == "matrix needs 64-bit indices"


@pytest.mark.parametrize("n, itemsize, vec", [(128, 4, 4), (6, 4, 2), (7, 4, 1), (64, 2, 8), (12, 2, 4), (8, 2, 8),
                                              (4, 4, 4), (1, 4, 1), (0, 4, 4), (16, 1, 16), (24, 1, 8)])
def test_widest_vector(n, itemsize, vec):
    assert base.widest_vector(n, itemsize) == vec


@pytest.mark.parametrize("x, up, down", [(0, 1, 1), (1, 1, 1), (2, 2, 2), (3, 4, 2), (4, 4, 4), (5, 8, 4),
                                         (1023, 1024, 512), (1024, 1024, 1024), (1.5, 1, 1), (7.9, 8, 4)])
def test_powers_of_two(x, up, down):
    if isinstance(x, int):
        assert base.next_pow2(x) == up
    assert base.prev_pow2(x) == down


def test_request_option_and_short_dtype():
    r = req(n=8, dtype="bfloat16", bn=16, family="x")
    assert r.option("bn") == 16 and r.option("nothing") is None and r.option("nothing", 3) == 3
    assert r.short_dtype == "bf16" and req(dtype="float16").short_dtype == "f16" and req().short_dtype == "f32"
    assert r.device == D.default()


@pytest.mark.parametrize("value", [None, True, 3, -7, 2.5, 0.0, "abc_D9", "", 10**30])
def test_template_values_allowed(value):
    base.check_template_value("fam", "f", value)


@pytest.mark.parametrize("value", ["a b", "x*/", "q\"", "a\n", float("inf"), float("nan"), 1j, [1], b"ab"])
def test_template_values_refused(value):
    with pytest.raises(UnsupportedError) as e:
        base.check_template_value("fam", "f", value)
    assert str(e.value) == (f"fam spec field f={value!r}: expected None, a bool, an integer, a finite number or a "
                            f"word of letters, digits and _")


# =============================================================================== dense_gemm.py

def half_share_device(total):
    return dataclasses.replace(D.default(), total_memory=total)


def test_dense_gemm_gate_on_both_sides_of_two_fifths_of_memory():
    # W of m x k float32 = 4 m k bytes, at most total x 2 // 5
    st = SimpleNamespace(shape=(1000, 1000))
    dev = half_share_device(10**7)  # 2 / 5 of it: 4,000,000 bytes
    assert dense_gemm.max_dense_bytes(dev) == 4000000
    assert dense_gemm.gate(st, Request("spmm", n=8, device=dev)) is None
    d = dense_gemm.gate(st, Request("spmm", n=8, device=half_share_device(10**7 - 3)))
    assert d.reason == "densified W would take 0 GiB (> 0 GiB, 2/5 of the NVIDIA H100 80GB HBM3's memory)"
    big = SimpleNamespace(shape=(2**16, 2**16))  # 16 GiB of float32, 8 GiB of float16
    dev = half_share_device(20 * 2**30)  # 8 GiB allowed
    assert dense_gemm.gate(big, Request("spmm", n=8, dtype="float16", device=dev)) is None
    assert dense_gemm.gate(big, Request("spmm", n=8, dtype="float32", device=dev)).reason == (
        "densified W would take 16 GiB (> 8 GiB, 2/5 of the NVIDIA H100 80GB HBM3's memory)")
    assert dense_gemm.max_dense_bytes(half_share_device(11)) == 4


@pytest.mark.parametrize("request_, shape, reason", [
    (req("sddmm"), (4, 4), "op 'sddmm' is not spmm"),
    (req(dtype="float64"), (4, 4), "dtype float64: the dense fallback serves float16, bfloat16 and float32"),
    (req(dtype="float16", out="float32"), (4, 4), "options out='float32': cuBLAS writes Y in the input dtype here"),
    (req(shape=None), (0, 4), "empty shape 0x4"),
    (req(), (4, 0), "empty shape 4x0"),
    (req(out="int8"), (4, 4), "options out='int8': expected one of 'bfloat16', 'float16', 'float32'"),
])
def test_dense_gemm_gate_declines(request_, shape, reason):
    assert dense_gemm.gate(SimpleNamespace(shape=shape), request_).reason == reason


def test_dense_gemm_gate_takes_out_equal_to_the_input():
    assert dense_gemm.gate(SimpleNamespace(shape=(4, 4)), req(dtype="float16", out="float16")) is None
    assert dense_gemm.gate(SimpleNamespace(shape=(4, 4)), req(dtype="bfloat16")) is None


def test_dense_gemm_unavailable_and_forced():
    st = SimpleNamespace(shape=(8, 4))
    with pinned_library(None):
        assert dense_gemm.unavailable(req()) == ("neither torch nor CuPy (float16 and float32 only) is importable "
                                                 "for float32")
        assert dense_gemm.unavailable(req(dtype="float64")) is None
        spec, why = dense_gemm.forced(st, req(n=3, bias=True))
        assert (spec.library, spec.m, spec.k, spec.n, spec.dtype) == ("torch", 8, 4, 3, "f32")
        assert why == ("dense as asked; neither torch nor CuPy (float16 and float32 only) is importable for float32 "
                       "here, so GPU calls fail until one is installed (the spec names the default, cuBLAS via "
                       "torch.matmul)")
    with pinned_library("cupy"):
        assert dense_gemm.unavailable(req(dtype="float16")) is None
        spec, why = dense_gemm.forced(st, Request("spmm", n=3, dtype="float16", bias=True, relu=True))
        assert spec.library == "cupy" and spec.bias and spec.relu
        assert why == ("dense as asked: W densified, cuBLAS via cupy.matmul; bias + ReLU by a generated epilogue "
                       "kernel after the GEMM")
        spec, why = dense_gemm.forced(st, req(n=3))
        assert why == "dense as asked: W densified, cuBLAS via cupy.matmul"


# ========================================================================== spdnn_sliced_ell.py

def test_spdnn_rule_declines_and_chooses():
    st = SimpleNamespace(shape=(1024, 1024))
    assert spdnn._rule(st, Request("spmm", n=8)).reason == "op 'spmm' is not spdnn_layer"
    assert spdnn._rule(st, Request("spdnn_layer", dtype="float16")).reason == ("dtype float16: the SpDNN layer "
                                                                               "kernel is fp32")
    d = spdnn._rule(st, Request("spdnn_layer", options=(("minibatch", 6),)))
    assert d.reason == "options minibatch=6: expected a positive multiple of 4 (float4 shared-memory reads)"
    d = spdnn._rule(st, Request("spdnn_layer", options=(("minibatch", 12),)))
    assert d.accepted and d.spec.minibatch == 12
    d = spdnn._rule(st, Request("spdnn_layer"))
    assert d.accepted and d.spec.minibatch == 16


def test_spdnn_choose_by_hand():
    dev = D.default()  # 232448 bytes a block may opt in to, 2048 threads an SM; the epilogue keeps 512 (2x2x32x4)
    spec, why = spdnn.choose(SimpleNamespace(shape=(1024, 512)), Request("spdnn_layer", device=dev))
    # 1024 outputs: one 1024-thread block an SM, all its shared memory; minibatch 16 -> stride 20 floats
    assert (spec.neurons_in, spec.neurons_out, spec.block, spec.minibatch, spec.stride) == (512, 1024, 1024, 16, 20)
    assert spec.buf == (232448 // 1 - 512) // 80 == 2899 and spec.index_bits == 16
    assert (spec.width, spec.nbuf, spec.value, spec.bias, spec.cap, spec.bias_rule) == (0, 0, None, 0.0, None,
                                                                                        "nonzero")
    assert why == ("1024 output neurons in tiles of 1024; minibatch 16 in registers; footprint buffers of up to 2899 "
                   "slots (20 floats each) in shared memory, so slot indices fit 16 bits")
    spec, _ = spdnn.choose(SimpleNamespace(shape=(100, 512)), Request(
        "spdnn_layer", device=dev, options=(("bias", -0.3), ("bias_rule", "all"), ("cap", 32.0), ("minibatch", 12))))
    # 100 outputs -> 128 threads; 2048 // 128 = 16 blocks an SM share the shared memory; stride 12 (12 // 4 odd)
    assert (spec.block, spec.stride, spec.buf) == (128, 12, (232448 // 16 - 512) // 48)
    assert (spec.bias, spec.cap, spec.bias_rule) == (-0.3, 32.0, "all")
    spec, _ = spdnn.choose(SimpleNamespace(shape=(100, 512)), Request("spdnn_layer", device=dev,
                                                                      options=(("block", 1023),)))
    assert spec.block == 1023 and spec.buf == (232448 // 2 - 512) // 80  # under 1024 threads: 2048 // 1023 = 2 blocks
    tiny = dataclasses.replace(dev, shared_per_block_optin=10**9)
    spec, _ = spdnn.choose(SimpleNamespace(shape=(1024, 512)), Request("spdnn_layer", device=tiny))
    assert spec.buf == 65536 and spec.index_bits == 16  # capped at 16-bit slot indices


@pytest.mark.parametrize("outputs, block", [(1, 32), (32, 32), (33, 64), (1024, 1024), (5000, 1024), (0, 32)])
def test_spdnn_default_block(outputs, block):
    assert spdnn.default_block(outputs) == block


@pytest.mark.parametrize("minibatch, stride", [(4, 4), (8, 12), (12, 12), (16, 20), (20, 20), (32, 36)])
def test_spdnn_padded_stride(minibatch, stride):
    assert spdnn.padded_stride(minibatch) == stride


# ============================================================================== ell_coo_spmm.py

def ell_stats(cov, mean=20.0, mx=200, p50=10.0, m=8192, k=8192):
    return SimpleNamespace(shape=(m, k), nnz=int(mean * m),
                           row_lengths=LengthStats(0, mx, mean, cov * mean, cov, 0),
                           row_length_percentiles={"p50": p50, "p90": 0.0, "p99": 0.0})


@pytest.mark.parametrize("n, cov, accepted", [(128, 0.75, True), (128, 0.7499, False), (127, 1.3, True),
                                              (127, 1.2999, False), (1024, 0.75, True)])
def test_ell_coo_cov_bounds_on_both_sides(n, cov, accepted):
    d = ell._rule(ell_stats(cov), req(n=n, dtype="float16"))
    assert d.accepted is accepted
    if not accepted:
        bound = 0.75 if n >= 128 else 1.3
        assert d.reason == (f"row-length CoV {cov:.2f} < {bound} (n={n}): rows 0..200 nnz are even enough for one "
                            f"pass")


@pytest.mark.parametrize("n, bound", [(128, 0.75), (127, 1.3)])
def test_ell_coo_reason_at_the_cov_bound_itself(n, bound):
    # a CoV equal to the bound is inside it: accepted unasked, and the reason says ">=" even when
    # the family is asked for by name; a hair under it only by name, and the reason says so
    for options in ({}, {"family": "ell_coo_spmm"}):
        d = ell._rule(ell_stats(bound), req(n=n, dtype="float16", **options))
        assert d.reason.startswith(f"row-length CoV {bound:.2f} >= {bound} (rows 0..200 nnz, median 10): ")
    d = ell._rule(ell_stats(bound - 1e-9), req(n=n, dtype="float16", family="ell_coo_spmm"))
    assert d.reason.startswith(f"row-length CoV {bound:.2f} < (asked for by name) {bound} (rows 0..200 nnz, ")


def test_ell_coo_forced_ignores_the_bounds():
    d = ell._rule(ell_stats(0.5), req(n=64, dtype="float32", family="ell_coo_spmm"))
    assert d.accepted and "< (asked for by name)" in d.reason
    d = ell._rule(ell_stats(0.5, mean=100.0), req(n=64, dtype="float32", family="ell_coo_spmm"))
    assert d.accepted


def test_ell_coo_float32_measured_region_on_both_sides():
    assert ell._rule(ell_stats(2.0, mean=64.0), req(n=256)).accepted
    d = ell._rule(ell_stats(2.0, mean=64.5), req(n=256))
    assert d.reason == ("row-length CoV 2.00, but rows avg 64.5 nnz > 64: sputnik_spmm's row splits were measured "
                        "faster on long skewed rows")
    assert ell._rule(ell_stats(2.0, mean=64.5), req(n=256, dtype="float16")).accepted  # float16: CoV alone
    assert ell._rule(ell_stats(2.0, m=4096), req(n=255)).accepted
    d = ell._rule(ell_stats(2.0, m=4095), req(n=255))
    assert d.reason == ("row-length CoV 2.00, but 4095 rows < 4096 at n=255 < 256: csr_rowsplit and sputnik_spmm's "
                        "per-row split were measured faster")
    assert ell._rule(ell_stats(2.0, m=4095), req(n=256)).accepted


def test_ell_coo_needs_a_tail():
    # ELL width = the median rounded up: a longest row within it leaves no tail
    d = ell._rule(ell_stats(2.0, mx=10, p50=9.5), req(n=128, dtype="float16"))
    assert d.reason == ("row-length CoV 2.00 but no tail: the longest row (10 nnz) fits the ELL width 10 "
                        "(median row)")
    assert ell._rule(ell_stats(2.0, mx=11, p50=9.5), req(n=128, dtype="float16")).accepted


def test_ell_coo_block_past_32_bit_offsets():
    # width x the rows (rounded up to the row alignment) must stay under 2**31
    st = ell_stats(2.0, mx=2**21, p50=2**20, m=2**11)
    assert ell.FORMAT.ell_stride(2**11) * 2**20 == 2**31
    assert ell._rule(st, req(n=128, dtype="float16")).reason == ("ELL block of 1048576 x 2048 slots needs 64-bit "
                                                                 "offsets")
    st = ell_stats(2.0, mx=2**21, p50=2**20 - 1, m=2**11)
    assert ell._rule(st, req(n=128, dtype="float16")).accepted


def test_ell_coo_reason_and_spec():
    d = ell._rule(ell_stats(1.5, mx=200, p50=9.2), req(n=128, dtype="float16", ))
    s = d.spec
    assert (s.dtype, s.n, s.vec, s.lanes, s.width, s.chunk, s.unroll, s.block) == ("f16", 128, 8, 16, 10,
                                                                                   ell.FORMAT.chunk_size(10), 10, 128)
    assert d.reason == (f"row-length CoV 1.50 >= 0.75 (rows 0..200 nnz, median 9.2): ELL width 10 = median row, at "
                        f"least 1 (fewest padded slots + tail entries; at least half the rows fit whole, fully "
                        f"unrolled); rows over 10 spill to COO chunks of <= {s.chunk}; n=128: 8-wide loads, 16 lanes "
                        f"per row")


@pytest.mark.parametrize("dtype, n, width, vec, lanes, unroll", [
    ("float32", 128, 16, 4, 32, 16), ("float32", 6, 17, 2, 4, 4), ("float16", 24, 3, 8, 4, 3),
    ("float32", 1, 1, 1, 1, 1), ("float16", 1000, 40, 8, 32, 4),
])
def test_ell_coo_make_spec(dtype, n, width, vec, lanes, unroll):
    s = ell.make_spec(dtype, n, width, bias=True)
    assert (s.vec, s.lanes, s.unroll, s.width, s.bias, s.relu) == (vec, lanes, unroll, width, True, False)
    assert s.dtype == ("f32" if dtype == "float32" else "f16")


# ============================================================================== csr_rowsplit.py

from sparsegen.families import csr_rowsplit as rowsplit  # noqa: E402


def rows_stats(m, mean, cov=0.5):
    return SimpleNamespace(shape=(m, 4096), nnz=int(m * mean),
                           row_lengths=LengthStats(0, 10**4, mean, cov * mean, cov, 0))


def sm_device(sms):
    return dataclasses.replace(D.default(), sm_count=sms)


def rowsplit_choice(m, mean, n, dtype="float32", sms=100, **options):
    r = Request("spmm", n=n, dtype=dtype, device=sm_device(sms), options=tuple(sorted(options.items())))
    spec, why = rowsplit.choose(rows_stats(m, mean), r)
    return spec, why


def test_warps_launched_by_hand():
    # 1000 rows, n 100 in tiles of 8 lanes x 4: 4 tiles; 1000 x 4 x 8 x 2 lanes / 32 = 2000 warps
    assert rowsplit.warps_launched(1000, 100, 4, 8, 2) == 2000
    assert rowsplit.warps_launched(3, 5, 4, 1, 1) == 1  # 3 x 2 tiles of one lane: 6 lanes in one warp
    assert rowsplit.warps_launched(33, 32, 1, 32, 1) == 33


def test_rowsplit_lanes_for_many_rows():
    # enough rows: no narrowing. n 128 float32: float4, 32 lanes across columns, none left for the row
    spec, why = rowsplit_choice(100000, 10.0, 128)
    assert (spec.vec, spec.lanes_col, spec.lanes_k, spec.unroll, spec.block) == (4, 32, 1, 1, 128)
    assert why == ("rows avg 10.0 nnz (CoV 0.50), n=128: 4-wide loads, 32 lanes per row across columns; 100000 "
                   "warps, 4 rows per 128-thread block")
    # n 8 float32: float4, 2 lanes across; rows of 40 nnz split over min(16, prev_pow2(20)) = 16 lanes
    spec, why = rowsplit_choice(100000, 40.0, 8)
    assert (spec.vec, spec.lanes_col, spec.lanes_k, spec.unroll) == (4, 2, 16, 2)
    assert why.endswith("; 2 chunks of 32 nonzeros loaded per step (short rows: their loads set the time)")
    assert "2 lanes across columns x 16 splitting each row's nonzeros" in why


@pytest.mark.parametrize("mean, lanes_k", [(1.0, 1), (3.9, 1), (4.0, 2), (7.9, 2), (8.0, 4), (64.0, 16), (100.0, 16)])
def test_rowsplit_splits_rows_only_for_two_nonzeros_a_lane(mean, lanes_k):
    spec, _ = rowsplit_choice(100000, mean, 8)  # 2 lanes across columns leave 16
    assert spec.lanes_k == lanes_k


def test_rowsplit_one_lane_rows():
    spec, why = rowsplit_choice(100000, 1.0, 1)
    assert (spec.vec, spec.lanes_col, spec.lanes_k, spec.unroll) == (1, 1, 1, 1)
    assert "one thread per row and output vector (short rows, narrow n)" in why


def test_rowsplit_narrows_the_column_tile_for_few_rows():
    # 100 SMs want 1600 warps. 64 rows of 512 nnz at n 128 (float4, 32 lanes across): 64 warps; each
    # halving of the column tile doubles the warps while rows keep 4 x lanes_k nonzeros
    spec, why = rowsplit_choice(64, 512.0, 128)
    assert (spec.lanes_col, spec.lanes_k) == (1, 32)
    assert "(narrowed to 32 column tiles: 64 rows alone give too few warps for 100 SMs)" in why
    spec, _ = rowsplit_choice(64, 16.0, 128)  # rows of 16: lanes_k may reach 4 (16 >= 4 x 4), not 8
    assert (spec.lanes_col, spec.lanes_k) == (4, 8)
    spec, why = rowsplit_choice(64, 512.0, 128, sms=4)  # 64 warps wanted: already there
    assert (spec.lanes_col, spec.lanes_k) == (32, 1) and "narrowed" not in why
    spec, _ = rowsplit_choice(64, 512.0, 128, sms=5)  # 80 wanted: one halving gives 128
    assert (spec.lanes_col, spec.lanes_k) == (16, 2)
    spec, _ = rowsplit_choice(64, 2.0, 64)  # 16 lanes x 1: not a full warp, not narrowed
    assert (spec.lanes_col, spec.lanes_k) == (16, 1)


@pytest.mark.parametrize("mean, lanes", [(11.9, (8, 4)), (12.0, (8, 4)), (15.9, (8, 4)), (16.0, (4, 8)),
                                         (31.9, (4, 8)), (32.0, (2, 16))])
def test_rowsplit_narrows_while_each_lane_keeps_two_nonzeros(mean, lanes):
    # 64 rows at n 128 (32 lanes of float4 across): each halving doubles lanes_k, allowed while the
    # mean row holds 4 x lanes_k nonzeros (2 a lane after the doubling)
    spec, _ = rowsplit_choice(64, mean, 128)
    assert (spec.lanes_col, spec.lanes_k) == lanes


@pytest.mark.parametrize("n, mean, lanes, unroll", [(8, 1.0, (2, 1), 2), (4, 1.0, (1, 1), 1), (4, 4.0, (1, 2), 2)])
def test_rowsplit_unrolls_from_two_lanes(n, mean, lanes, unroll):
    # a group of 2 lanes loads chunks of 2 and unrolls them; a lone lane has no chunk to unroll
    spec, _ = rowsplit_choice(100000, mean, n)
    assert ((spec.lanes_col, spec.lanes_k), spec.unroll) == (lanes, unroll)


@pytest.mark.parametrize("dtype, n, mean, unroll", [("float32", 32, 128.0, 2), ("float32", 33, 128.0, 1),
                                                    ("float32", 32, 128.5, 1), ("float16", 32, 10.0, 1),
                                                    ("float32", 8, 10.0, 2)])
def test_rowsplit_two_chunks_a_step_for_short_float32_rows(dtype, n, mean, unroll):
    spec, _ = rowsplit_choice(100000, mean, n, dtype)
    assert spec.unroll == unroll


def test_rowsplit_options_and_rule():
    spec, _ = rowsplit_choice(100000, 10.0, 8, unroll=8, block=256)
    assert (spec.unroll, spec.block) == (8, 256)
    st = rows_stats(1000, 10.0)
    assert rowsplit._rule(st, req(n=8, unroll=3)).reason == ("options unroll=3: expected 1, 2, 4 or 8 (chunks loaded "
                                                              "per step)")
    assert rowsplit._rule(st, req(n=8, block=96)).reason == ("options block=96: expected a power of two from 32 to "
                                                              "1024 (threads per block)")
    assert rowsplit._rule(st, req("sddmm", n=8)).reason == "op 'sddmm' is not spmm"
    for u in (1, 2, 4, 8):
        assert rowsplit._rule(st, req(n=8, unroll=u)).accepted
    for b in (32, 1024):
        assert rowsplit._rule(st, req(n=8, block=b)).accepted
    spec, _ = rowsplit_choice(100000, 1.0, 1, unroll=4)  # one lane: nothing to unroll
    assert spec.unroll == 1


# ========================================================================== dense_tile_sddmm.py

from sparsegen.families import dense_tile_sddmm as dts  # noqa: E402


def sddmm_stats(m, n, nnz, nonempty):
    return SimpleNamespace(shape=(m, n), nnz=nnz, tiles=SimpleNamespace(nonempty=nonempty, tile_rows=128, tile_cols=64))


def sddmm_req(k, sms=100, **options):
    return Request("sddmm", k=k, dtype="float32", device=sm_device(sms), options=tuple(sorted(options.items())))


# 640 x 640: 5 x 10 = 50 tiles of 128 x 64 (0.5 per SM on 100 SMs); fill = nnz / (50 x 8192)
@pytest.mark.parametrize("k, m, n, nnz, accepted", [
    (128, 640, 640, 114688, True),      # fill 0.28, 0.5 per SM
    (128, 640, 640, 114687, False),     # fill just under 0.28, and too few tiles for 25 %
    (128, 896, 448, 7 * 7 * 2294, False),  # 49 tiles at fill 0.28: short of 0.5 per SM
    (128, 1152, 640, 90 * 2048, True),   # 90 tiles at fill 0.25
    (128, 1152, 640, 90 * 2048 - 1, False),
    (128, 2560, 768, 240 * 1557, False),  # 240 tiles at fill 0.19006: under 3 per SM
    (128, 3840, 512, 240 * 1557, False),
    (128, 3840, 640, 300 * 1557, True),  # 300 tiles (3.0 per SM) at fill just over 0.19
    (127, 1152, 640, 90 * 2130, False),  # fill 0.26 at k < 128: under the short bounds' 28 %
    (128, 1152, 640, 90 * 2130, True),
    (127, 1152, 640, 90 * 2704, True),   # fill 0.33 on 0.9 per SM
    (127, 1152, 640, 90 * 2703, False),
    (127, 1920, 512, 120 * 2294, False),  # fill 0.28 on 1.2 per SM: short of 1.5
    (127, 1920, 640, 150 * 2294, True),  # 150 tiles: 1.5 per SM
    (32, 1152, 640, 90 * 2704, True),
    (31, 1152, 640, 90 * 2704, False),
])
def test_dense_tile_sddmm_measured_region_on_both_sides(k, m, n, nnz, accepted):
    tiles = -(-m // 128) * -(-n // 64)
    d = dts._rule(sddmm_stats(m, n, nnz, tiles), sddmm_req(k))
    assert d.accepted is accepted, d.reason
    forced = dts._rule(sddmm_stats(m, n, nnz, tiles), sddmm_req(k, family="dense_tile_sddmm"))
    assert forced.accepted


def test_dense_tile_sddmm_decline_reasons():
    d = dts._rule(sddmm_stats(640, 640, 114687, 50), sddmm_req(128))
    assert d.reason == ("50 tiles of 128x64 for 100 SMs at 28% fill (< 0.9 per SM from 25% fill or 3.0 per SM from 19% "
                        "fill at k=128): each block walks all of k alone")
    d = dts._rule(sddmm_stats(640, 640, 50 * 1556, 50), sddmm_req(128))  # fill 0.18994
    assert d.reason == "fill of the nonempty tiles 19.0% < 19% at k=128: a B row per entry is cheaper"
    d = dts._rule(sddmm_stats(640, 640, 114688, 50), sddmm_req(31))
    assert d.reason == "k=31 < 32: one short slice does not pay for staging whole tiles"
    st = sddmm_stats(640, 640, 10, 1)
    assert dts._rule(st, Request("spmm", k=8)).reason == "op 'spmm' is not sddmm"
    assert dts._rule(st, Request("sddmm")).reason == "sddmm needs k (the inner dimension)"
    assert dts._rule(st, Request("sddmm", k=0)).reason == "sddmm needs k (the inner dimension)"
    assert dts._rule(st, Request("sddmm", k=8, dtype="float16")).reason == ("dtype float16: float32 only (fp16 would "
                                                                            "want tensor cores)")


@pytest.mark.parametrize("m, n, nnz, k, accepted", [
    (2**31 - 1, 64, 10, 512, True), (2**31, 64, 10, 8, False), (64, 2**31, 10, 8, False),
    (64, 64, 2**31 - 1, 8, True), (64, 64, 2**31, 8, False), (2**30, 64, 10, 1024, True),
    (2**30, 64, 10, 1025, False),
])
def test_dense_tile_sddmm_index_limits_on_both_sides(m, n, nnz, k, accepted):
    d = dts._rule(sddmm_stats(m, n, nnz, 1), sddmm_req(k, family="dense_tile_sddmm"))
    assert (d.reason == "matrix needs 64-bit indices") is not accepted


@pytest.mark.parametrize("options, reason", [
    (dict(tile_m=96), "options tile_m=96: expected one of 32, 64, 128"),
    (dict(slice_k=24), "options slice_k=24: expected 8, 16, 32 or 64"),
    (dict(stages=5), "options stages=5: expected 2, 3 or 4"),
    (dict(min_blocks=3), "options min_blocks=3: expected 1, 2, 4 or 8 (resident blocks per SM asked of nvcc)"),
])
def test_dense_tile_sddmm_options_checked(options, reason):
    assert dts._rule(sddmm_stats(640, 640, 114688, 50), sddmm_req(128, **options)).reason == reason


def test_dense_tile_sddmm_options_taken():
    for options in (dict(tile_m=32), dict(slice_k=8), dict(slice_k=64), dict(stages=2), dict(stages=4),
                    dict(min_blocks=1), dict(min_blocks=8), dict(tile_m=64), dict(tile_m=128)):
        d = dts._rule(sddmm_stats(640, 640, 114688, 50), sddmm_req(128, family="dense_tile_sddmm", **options))
        assert d.accepted, options
        for key, value in options.items():
            assert getattr(d.spec, key) == value


@pytest.mark.parametrize("m, k, tile_m, slice_k, vec, min_blocks", [
    (640, 128, 128, 32, 4, 2), (100, 20, 128, 24, 4, 2), (64, 100, 64, 32, 4, 4), (60, 6, 64, 8, 2, 4),
    (32, 1, 32, 8, 1, 8), (20, 64, 32, 32, 4, 8), (33, 64, 64, 32, 4, 4),
])
def test_dense_tile_sddmm_choose_by_hand(m, k, tile_m, slice_k, vec, min_blocks):
    spec, _ = dts.choose(sddmm_stats(m, 64, 10, 1), sddmm_req(k))
    assert (spec.k, spec.tile_m, spec.slice_k, spec.stages, spec.vec, spec.min_blocks) == (k, tile_m, slice_k, 3, vec,
                                                                                           min_blocks)


@pytest.mark.parametrize("k, slice_k", [(9, 16), (16, 16), (17, 24)])
def test_dense_tile_sddmm_short_k_in_one_slice_of_whole_mma_steps(k, slice_k):
    # k under 32: one slice, k rounded up to a multiple of 8 (an mma step)
    assert dts.choose(sddmm_stats(640, 64, 10, 1), sddmm_req(k))[0].slice_k == slice_k


@pytest.mark.parametrize("registers, m, tile_m, min_blocks", [
    (16384, 640, 128, 1),  # 256 threads x 128 registers are 32768: none fit, still 1
    (32768, 640, 128, 1),
    (32768, 20, 32, 4),  # 64 threads: 32768 / 8192
    (262144, 20, 32, 16),  # 32 would fit: at most 16
])
def test_dense_tile_sddmm_min_blocks_from_the_register_file(registers, m, tile_m, min_blocks):
    dev = dataclasses.replace(D.default(), registers_per_sm=registers)
    spec, _ = dts.choose(sddmm_stats(m, 64, 10, 1), Request("sddmm", k=64, dtype="float32", device=dev))
    assert (spec.tile_m, spec.min_blocks) == (tile_m, min_blocks)


def test_dense_tile_sddmm_fill_exactly_at_the_lowest_bound():
    # 100 tiles of 128 x 64 at 155648 / 819200 = 0.19 fill exactly: the 19 % pair's fill is met (its 3 tiles per
    # SM are not), so the decline names the tiles; a nonzero less is under the lowest fill
    d = dts._rule(sddmm_stats(1280, 640, 155648, 100), sddmm_req(128))
    assert d.reason == ("100 tiles of 128x64 for 100 SMs at 19% fill (< 3.0 per SM from 19% fill at k=128): each block "
                        "walks all of k alone")
    d = dts._rule(sddmm_stats(1280, 640, 155647, 100), sddmm_req(128))
    assert d.reason == "fill of the nonempty tiles 19.0% < 19% at k=128: a B row per entry is cheaper"


def test_dense_tile_sddmm_choose_reason():
    spec, why = dts.choose(sddmm_stats(640, 640, 114688, 50), sddmm_req(128))
    assert why == ("fill of the nonempty tiles 28% >= 28% at k=128: whole 128x64 tiles of A.B^T (up to 50 blocks, 0.5 "
                   "per SM) cost less than a B row per entry; k in slices of 32, 3 in flight, 4-float copies; 3xTF32 "
                   "tensor cores")
    _, why = dts.choose(sddmm_stats(1152, 640, 90 * 2048, 90), sddmm_req(128))
    assert why.startswith("fill of the nonempty tiles 25% >= 25% at k=128")
    _, why = dts.choose(sddmm_stats(640, 640, 50 * 1024, 50), sddmm_req(128))  # forced outside: the first pair
    assert why.startswith("fill of the nonempty tiles 12% >= 28% at k=128")
    _, why = dts.choose(sddmm_stats(640, 640, 50 * 1024, 50), sddmm_req(64))
    assert why.startswith("fill of the nonempty tiles 12% >= 33% at k=64")


def test_dense_tile_sddmm_bounds_and_fill():
    assert dts.bounds(128) == dts.LONG_K_BOUNDS == ((0.28, 0.5), (0.25, 0.9), (0.19, 3.0))
    assert dts.bounds(127) == dts.SHORT_K_BOUNDS == ((0.33, 0.9), (0.28, 1.5))
    assert dts.bounds_met(128, 0.3, 300, 100) == [(0.28, 0.5), (0.25, 0.9), (0.19, 3.0)]
    assert dts.bounds_met(128, 0.26, 90, 100) == [(0.25, 0.9)]
    assert dts.bounds_met(128, 0.26, 89, 100) == []
    assert dts.active_fill(sddmm_stats(100, 50, 2500, 1)) == 0.5  # a small matrix's one tile is 100 x 50
    assert dts.active_fill(sddmm_stats(300, 300, 8192, 2)) == 0.5
    assert dts.active_fill(sddmm_stats(300, 300, 0, 0)) == 0.0
    assert dts.active_fill(sddmm_stats(128, 64, 8192, 1)) == 1.0


# ================================================================================ panel_spmm.py

from sparsegen.families import panel_spmm as panel  # noqa: E402


def panel_stats(m, k, density):
    return SimpleNamespace(shape=(m, k), density=density, nnz=int(m * k * density))


@pytest.mark.parametrize("m, k, density, n, served", [
    (1024, 2048, 0.2, 256, True), (1025, 2048, 0.2, 256, False), (1024, 2047, 0.2, 256, False),
    (1000, 4096, 0.05, 256, True), (1000, 4096, 0.0499, 256, False),
    (1000, 4096, 0.15, 128, True), (1000, 4096, 0.1499, 128, False), (1000, 4096, 0.1499, 129, True),
    (512, 2048, 0.15, 1024, True), (512, 2048, 0.1499, 1024, False),  # 2**20 weights: the narrow bound at every n
    (513, 2048, 0.1499, 1024, True),
])
def test_panel_measured_region_on_both_sides(m, k, density, n, served):
    st = panel_stats(m, k, density)
    assert panel.serves_by_default(st, req(n=n)) is served
    assert panel._rule(st, req(n=n)).accepted is served
    assert panel._rule(st, req(n=n, family="panel_spmm")).accepted


def test_panel_decline_reasons():
    assert panel._outside_measured(panel_stats(1000, 4096, 0.2), req(n=64, dtype="float16")).reason == (
        "dtype float16: on the DLMC run of the H100 it lost to the CSR kernels in fp16 (1.26x vs 1.75x cuSPARSE on the "
        "same 80 cases); runs when asked for")
    assert panel._outside_measured(panel_stats(1025, 2048, 0.04), req()).reason == (
        "1025 rows, 2048 columns, density 0.040: outside <= 1024 rows, >= 2048 columns at density >= 0.05, where it "
        "was measured faster than csr_rowsplit and sputnik_spmm")
    assert panel._outside_measured(panel_stats(1000, 4096, 0.1), req(n=128)).reason == (
        "n=128 <= 128 at density 0.100 < 0.15: sputnik_spmm's split rows were measured faster there")
    assert panel._outside_measured(panel_stats(512, 2048, 0.1), req(n=256)).reason == (
        "512 x 2048 (<= 1048576 weights) at density 0.100 < 0.15: sputnik_spmm was measured faster there")
    assert panel.serves_by_default(panel_stats(1000, 4096, 0.2), req("sddmm")) is False


@pytest.mark.parametrize("options, reason", [
    (dict(reuse=0), "options reuse=0: expected an integer from 1 to 256"),
    (dict(reuse=257), "options reuse=257: expected an integer from 1 to 256"),
    (dict(reuse=2.0), "options reuse=2.0: expected an integer from 1 to 256"),
    (dict(blocks_per_sm=0), "options blocks_per_sm=0: expected an integer from 1 to 64"),
    (dict(blocks_per_sm=65), "options blocks_per_sm=65: expected an integer from 1 to 64"),
    (dict(blocks_per_sm=1.0), "options blocks_per_sm=1.0: expected an integer from 1 to 64"),
    (dict(splits=0), "options splits=0: expected a positive integer (ways to split K)"),
    (dict(splits="2"), "options splits='2': expected a positive integer (ways to split K)"),
])
def test_panel_options_checked(options, reason):
    assert panel._rule(panel_stats(1000, 4096, 0.2), req(n=256, **options)).reason == reason


def test_panel_options_taken_at_their_limits():
    st = panel_stats(1000, 4096, 0.2)
    for options in (dict(reuse=1), dict(reuse=256), dict(blocks_per_sm=1), dict(blocks_per_sm=64), dict(splits=1)):
        assert panel._rule(st, req(n=256, **options)).accepted, options
    assert panel._rule(panel_stats(1000, 4096, 0.2), req("sddmm")).reason == "op 'sddmm' is not spmm"


def test_panel_choose_by_hand():
    # float32, 1024 x 2048 at 20 %, n = 64: float4, 16-lane groups (tile 64), 16 groups of 8 rows = 128 rows
    # (16 / 0.2 = 80 -> 128); kc from 32 KB / 256 B = 128, halved once: a stage of 128 would hold
    # 32768 + 132 x 4 + 4128 x 8 = 66320 bytes > 48 KB, of 64: 16384 + 528 + 2080 x 8 = 33552.
    # 32 chunks, 8 panel tiles; 3 blocks an SM (233472 // (67104 + 1024)); 396 slots: 32 splits of 1 chunk
    spec, why = panel.choose(panel_stats(1024, 2048, 0.2), Request("spmm", n=64, dtype="float32"))
    assert (spec.vec, spec.group, spec.warps, spec.rpg, spec.kc, spec.cps, spec.pair_cap, spec.density) == (
        4, 16, 8, 8, 64, 1, 2080, 0.2)
    assert spec.panel_rows == 128 and spec.splits == 32 and spec.shared_bytes == 67104
    assert why == ("density 0.200: panels of 128 rows share each staged X row (~25.6 nonzeros per row copied); 64 x 64 "
                   "X tiles in shared memory, 4-wide loads; K split 32 ways (8 panel tiles alone): 256 blocks of 1 "
                   "chunks, one wave at 3 blocks per SM (65 KB shared memory each)")
    spec, why = panel.choose(panel_stats(1024, 2048, 0.2), Request("spmm", n=64, dtype="float32"), splits=4,
                             blocks_per_sm=2)
    assert spec.cps == 8 and why.endswith("K split 4 ways (8 panel tiles alone): 32 blocks of 8 chunks, forced at 2 "
                                          "blocks per SM (65 KB shared memory each)")


def test_panel_choose_half_and_the_rows_of_a_small_matrix():
    # float16, n = 256: 8-wide loads, 32 lanes, 8 groups; 40 rows want next_pow2(40) = 64 rows: rpg 4 (32 // 8)
    spec, _ = panel.choose(panel_stats(40, 2048, 0.5), Request("spmm", n=256, dtype="float16"))
    assert (spec.dtype, spec.vec, spec.group, spec.rpg) == ("f16", 8, 32, 4) and spec.panel_rows == 32
    # reuse 16 at density 0.01: 1600 -> at most 256 rows
    spec, _ = panel.choose(panel_stats(4096, 2048, 0.01), Request("spmm", n=8, dtype="float32"))
    assert spec.panel_rows == 256 and (spec.vec, spec.group, spec.rpg) == (4, 2, 2)
    assert spec.density == 0.01


def panel_choice(m, k, density, n, dtype="float32", **kw):
    return panel.choose(panel_stats(m, k, density), Request("spmm", n=n, dtype=dtype), **kw)


def test_panel_choose_rows_of_one_lane_groups_and_of_a_few_rows():
    # n 4 float32: one float4 lane a group, 8 warps x 32 groups = 256 groups of one row each (16 / 0.2 -> 128,
    # at least the 256 groups' rows: rpg 1)
    spec, why = panel_choice(1024, 4096, 0.2, 4)
    assert (spec.vec, spec.group, spec.rpg, spec.panel_rows) == (4, 1, 1, 256)
    # the staged pairs and the reason are sized for those 256 rows: 1.25 x 256 x 64 x 0.2 + 32 = 4128
    assert spec.pair_cap == 4128 and why.startswith("density 0.200: panels of 256 rows share each staged X row (~51.2 ")
    # 4 rows at n 256: 8 groups of 32 lanes; the panel wants next_pow2(4) = 4 rows, fewer than the groups: rpg 1
    spec, _ = panel_choice(4, 4096, 0.2, 256)
    assert (spec.group, spec.rpg, spec.panel_rows) == (32, 1, 8)


@pytest.mark.parametrize("m, k, density, n, kc", [
    (64, 16, 0.5, 4, 16),  # K of 16: one chunk of 16 rows, though a 4-float tile would allow 2048
    (1024, 8, 0.5, 64, 16),  # K of 8: chunks are never under 16 rows
    (1024, 4096, 0.01, 16, 256),  # 64-byte X rows allow 512, K 4096: at most 256 (two stages take 47 KB)
])
def test_panel_choose_chunk_rows(m, k, density, n, kc):
    assert panel_choice(m, k, density, n)[0].kc == kc


@pytest.mark.parametrize("density, kc", [(0.245, 256), (0.246, 256), (0.247, 128)])
def test_panel_choose_keeps_a_stage_of_exactly_48_kb(density, kc):
    # float16, n 16: 8-wide loads, 2-lane groups, 128-row panels (record stride 132 words), chunks of 256:
    # 256 x 16 x 2 + 132 x 4 + 4 x pairs. At 24.6 % the pairs are 1.25 x 128 x 256 x 0.246 + 32 = 10108.16 ->
    # 10108: 8192 + 528 + 40432 = 49152, one stage's budget exactly, kept; at 24.7 % 10140 pairs: halved
    spec, _ = panel_choice(1024, 4096, density, 16, "float16")
    assert (spec.vec, spec.group, spec.panel_rows, spec.record, spec.kc) == (8, 2, 128, 132, kc)
    assert spec.shared_bytes <= 2 * 49152


def test_panel_choose_one_chunk_at_least():
    # K = 64 in chunks of 64: one chunk, in one split asked for; K = 0 still makes one chunk
    assert panel_choice(1024, 64, 0.2, 64, splits=1)[0].cps == 1
    spec, _ = panel_choice(1024, 0, 0.2, 64, splits=1)
    assert (spec.kc, spec.cps, spec.splits) == (16, 1, 1)


def test_panel_choose_counts_column_tiles_and_at_least_one_panel():
    # n 2048: 16 column tiles of 128 x 16 panels of 64 rows = 256 blocks, past one wave of 396 / 256: no split
    spec, why = panel_choice(1024, 4096, 0.2, 2048)
    assert (spec.panel_rows, spec.tile_n, spec.splits, spec.cps) == (64, 128, 1, 64) and "K split" not in why
    # 100 rows in one 128-row panel: 1024 chunks over 396 / 1 slots -> 342 splits of 3 chunks
    spec, why = panel_choice(100, 65536, 0.2, 64)
    assert (spec.splits, spec.cps) == (342, 3)
    assert why.endswith("; K split 342 ways (1 panel tiles alone): 342 blocks of 3 chunks, one wave at 3 blocks per "
                        "SM (65 KB shared memory each)")
    # no rows: still one panel tile
    _, why = panel_choice(0, 4096, 0.2, 64)
    assert why.endswith("; K split 32 ways (1 panel tiles alone): 32 blocks of 1 chunks, one wave at 3 blocks per SM "
                        "(72 KB shared memory each)")


def test_panel_choose_density_to_three_places_and_the_split_in_the_reason():
    assert panel_choice(1024, 4096, 0.1234, 256)[0].density == 0.123
    spec, why = panel_choice(1024, 4096, 0.2, 256, splits=2)
    assert why == ("density 0.200: panels of 64 rows share each staged X row (~12.8 nonzeros per row copied); 64 x 128 "
                   "X tiles in shared memory, 4-wide loads; K split 2 ways (32 panel tiles alone): 64 blocks of 32 "
                   "chunks, forced at 2 blocks per SM (81 KB shared memory each)")
    spec, why = panel_choice(1024, 4096, 0.2, 256, splits=1)
    assert spec.splits == 1
    assert why == ("density 0.200: panels of 64 rows share each staged X row (~12.8 nonzeros per row copied); 64 x 128 "
                   "X tiles in shared memory, 4-wide loads")


@pytest.mark.parametrize("chunks, blocks, slots, splits", [(32, 8, 396, 32), (32, 8, 100, 12), (32, 400, 396, 1),
                                                           (32, 0, 10, 10), (1, 1, 100, 1)])
def test_panel_choose_splits(chunks, blocks, slots, splits):
    assert panel.choose_splits(chunks, blocks, slots) == splits


# ============================================================================ dense_tile_spmm.py

from sparsegen.families import dense_tile_spmm as dtm  # noqa: E402


def shape_stats(m, k):
    return SimpleNamespace(shape=(m, k), nnz=1, density=1.0)


def test_dense_tile_spmm_choose_tf32x3_by_hand():
    # 1024 x 1024, n 64: 8 tall tiles < 2 waves, so 64-row tiles (128 threads: 3 blocks asked, 4 fit in
    # 232448 B at 55296 B a block); wave 396; 16 tiles, 32 slices: min(396 // 16, 32 // 4) = 8 splits
    spec, why = dtm.choose(shape_stats(1024, 1024), Request("spmm", n=64))
    assert (spec.tile_m, spec.tile_n, spec.slice_k, spec.stages, spec.split_k, spec.min_blocks, spec.mma) == (
        64, 64, 32, 3, 8, 3, "tf32x3")
    assert why == ("64x64 tiles of Y on 3xTF32 tensor cores, W densified (4.2 MB), K in slices of 32, 3 in flight; "
                   "K split 8 ways (16 tiles alone for 132 SMs): 128 blocks, sums meet in an fp32 workspace")
    spec, why = dtm.choose(shape_stats(1024, 1024), Request("spmm", n=32, bias=True, relu=True))
    assert spec.tile_n == 32 and why.endswith("; bias + ReLU fused")
    _, why = dtm.choose(shape_stats(1024, 1024), Request("spmm", n=64, relu=True))
    assert why.endswith("; ReLU fused")


def test_dense_tile_spmm_choose_f16x3_by_hand():
    # 2048 x 2048 at n 256: 2.1 GFLOP -> 3xFP16 in 128 x 64 tiles; 98944 B a block: 2 resident, wave 264;
    # 64 tiles (2 x 64 <= 132: 4 slices a split at least), 64 slices: min(264 // 64, 64 // 4) = 4 splits
    spec, why = dtm.choose(shape_stats(2048, 2048), Request("spmm", n=256))
    assert (spec.tile_m, spec.tile_n, spec.split_k, spec.min_blocks, spec.mma) == (128, 64, 4, 2, "f16x3")
    assert why == ("128x64 tiles of Y on 3xFP16 tensor cores (rows and columns scaled into fp16's range; taken from 1 "
                   "GFLOP of dense work at n >= 256), W densified (16.8 MB), K in slices of 32, 3 in flight; K split "
                   "4 ways (64 tiles alone for 132 SMs): 256 blocks, sums meet in an fp32 workspace")
    spec, why = dtm.choose(shape_stats(2048, 2048), Request("spmm", n=256, options=(("mma", "f16x3"),)))
    assert spec.mma == "f16x3" and "taken from" not in why
    spec, _ = dtm.choose(shape_stats(2048, 2048), Request("spmm", n=256, options=(("mma", "tf32x3"),)))
    assert spec.mma == "tf32x3" and spec.tile_m == 64


@pytest.mark.parametrize("m, k, n, stages, big", [(2048, 2048, 256, 3, True), (2048, 2048, 255, 3, False),
                                                  (1000, 2000, 250, 3, False), (1000, 2000, 256, 3, True),
                                                  (976, 2000, 256, 3, False), (977, 2000, 256, 3, True),
                                                  (2048, 2048, 256, 2, False),
                                                  (2048, 2048, 256, 4, True)])
def test_takes_f16x3_on_both_sides(m, k, n, stages, big):
    # 2 m k n >= 1e9: 977 x 2000 x 256 x 2 is 1.000448e9, 976 x 2000 x 256 x 2 is 0.999424e9
    assert dtm.takes_f16x3(m, k, n, stages) is big


def test_takes_f16x3_at_exactly_one_gflop():
    # 2 x 15625 x 125 x 256 = 1e9 exactly (5**6 x 5**3 x 2**9): taken; one row less is 0.999936e9
    assert dtm.takes_f16x3(15625, 125, 256) is True
    assert dtm.takes_f16x3(15624, 125, 256) is False


@pytest.mark.parametrize("n, tile_n", [(32, 32), (33, 64)])
def test_dense_tile_spmm_narrow_tiles_up_to_n_32(n, tile_n):
    assert dtm.choose(shape_stats(1024, 1024), Request("spmm", n=n))[0].tile_n == tile_n


def test_dense_tile_spmm_tall_tiles_count_every_column_tile():
    # n 128: two 64-column tiles a row of tiles; 264 x 2 = 528 tall tiles fill two waves of 2 x 132
    assert dtm.choose(shape_stats(264 * 128, 64), Request("spmm", n=128))[0].tile_m == 128
    assert dtm.choose(shape_stats(263 * 128, 64), Request("spmm", n=128))[0].tile_m == 64


@pytest.mark.parametrize("optin, m_tiles, tile_m", [
    (165888, 527, 64), (165888, 528, 128),  # room for exactly two 82944-byte blocks: two waves are 528 tiles
    (165887, 263, 64), (165887, 264, 128),  # a byte short of two: one resident, two waves are 264 tiles
])
def test_dense_tile_spmm_tall_tiles_by_the_shared_memory_of_128_rows(optin, m_tiles, tile_m):
    # a 128 x 64 tile's block takes 4 x 3 x (128 x 36 + 32 x 72) = 82944 bytes
    assert dtm.shared_bytes(128, 64, 32, 3) == 82944
    dev = dataclasses.replace(D.default(), shared_per_block_optin=optin)
    assert dtm.choose(shape_stats(m_tiles * 128, 64), Request("spmm", n=64, device=dev))[0].tile_m == tile_m


@pytest.mark.parametrize("k, n, w_vec, x_vec", [(1024, 64, 4, 4), (1022, 6, 2, 2), (1023, 7, 1, 1)])
def test_dense_tile_spmm_copy_widths(k, n, w_vec, x_vec):
    # floats per cp.async copy: the widest of 4, 2, 1 dividing a row of W (K) and of X (N)
    spec, _ = dtm.choose(shape_stats(1024, k), Request("spmm", n=n))
    assert (spec.w_vec, spec.x_vec) == (w_vec, x_vec)


def test_dense_tile_spmm_reason_names_a_split_from_two():
    _, why = dtm.choose(shape_stats(1024, 1024), Request("spmm", n=64, options=(("split_k", 1),)))
    assert why == "64x64 tiles of Y on 3xTF32 tensor cores, W densified (4.2 MB), K in slices of 32, 3 in flight"
    _, why = dtm.choose(shape_stats(1024, 1024), Request("spmm", n=64, options=(("split_k", 2),)))
    assert why == ("64x64 tiles of Y on 3xTF32 tensor cores, W densified (4.2 MB), K in slices of 32, 3 in flight; K "
                   "split 2 ways (16 tiles alone for 132 SMs): 32 blocks, sums meet in an fp32 workspace")


@pytest.mark.parametrize("m, n, tile_m, tile_n, slices, wave, sms, split", [
    (1024, 64, 64, 64, 32, 396, 132, 8),      # 16 tiles: 4 slices a split
    (4224, 64, 64, 64, 64, 396, 132, 6),      # 66 tiles (2 x 66 = 132): still 4 slices a split
    (4288, 64, 64, 64, 64, 396, 132, 4),      # 67 tiles: 16 slices a split -> min(5, 4) = 4
    (4288, 64, 64, 64, 32, 396, 132, 2),
    (64 * 396, 64, 64, 64, 32, 396, 132, 1),  # a full wave of tiles: no split
    (64 * 395, 64, 64, 64, 32, 396, 132, 1),  # one short: 16 slices a split of 32 -> 2, wave // tiles = 1
    (64, 64, 64, 64, 2, 396, 132, 1),         # too few slices to split
])
def test_dense_tile_spmm_choose_split(m, n, tile_m, tile_n, slices, wave, sms, split):
    assert dtm.choose_split(m, n, tile_m, tile_n, slices, wave, sms) == split


def test_dense_tile_spmm_choose_tall_tiles_where_they_fill_two_waves():
    # 128-row tiles of 256 threads: 2 resident (82944 B); two waves of them on 132 SMs are 528 tiles
    spec, _ = dtm.choose(shape_stats(128 * 528, 64), Request("spmm", n=64))
    assert spec.tile_m == 128
    spec, _ = dtm.choose(shape_stats(128 * 527, 64), Request("spmm", n=64))
    assert spec.tile_m == 64


def test_dense_tile_spmm_options_force_the_choice():
    opts = (("min_blocks", 2), ("split_k", 3), ("stages", 4), ("tile_m", 128), ("tile_n", 128))
    spec, _ = dtm.choose(shape_stats(1024, 1024), Request("spmm", n=64, options=opts))
    assert (spec.tile_m, spec.tile_n, spec.stages, spec.min_blocks) == (128, 128, 4, 2)
    assert spec.split_k == 3  # 32 slices in 3 splits of 11, 11, 10
    spec, _ = dtm.choose(shape_stats(1024, 100), Request("spmm", n=64, options=(("split_k", 10),)))
    assert spec.split_k == 4  # 4 slices: at most 4 splits
    spec, _ = dtm.choose(shape_stats(1024, 320), Request("spmm", n=64, options=(("split_k", 7),)))
    assert spec.split_k == 5  # 10 slices in 7 splits would leave one without a slice: ceil(10 / ceil(10 / 7))


@pytest.mark.parametrize("options, reason", [
    (dict(mma="fp16"), "options mma='fp16': expected one of tf32x3, f16x3"),
    (dict(tile_m=32), "options tile_m=32: expected one of 64, 128"),
    (dict(tile_n=16), "options tile_n=16: expected one of 32, 64, 128"),
    (dict(split_k=0), "options split_k=0: expected a positive integer"),
    (dict(split_k=1.5), "options split_k=1.5: expected a positive integer"),
    (dict(stages=5), "options stages=5: expected 2, 3 or 4"),
    (dict(stages=2, mma="f16x3"), "options stages=2 with mma='f16x3': its split runs a slice ahead, 3 or 4 stages"),
    (dict(min_blocks=7), "options min_blocks=7: expected 1-6 or 8 (resident blocks per SM asked of nvcc)"),
])
def test_dense_tile_spmm_options_checked(options, reason):
    assert dtm.offer(shape_stats(256, 256), req(n=64, **options)).reason == reason


def test_dense_tile_spmm_options_allowed():
    for options in (dict(mma="f16x3"), dict(stages=2), dict(stages=2, mma="tf32x3"), dict(split_k=1),
                    dict(min_blocks=8), dict(min_blocks=6), dict(tile_n=32)):
        assert dtm.offer(shape_stats(256, 256), req(n=64, **options)).accepted, options


@pytest.mark.parametrize("request_, shape, reason", [
    (req("sddmm"), (4, 4), "op 'sddmm' is not spmm"),
    (req(dtype="float16"), (4, 4), "dtype float16: float32 only (fp16 and bf16 have the tiled tensor-core families)"),
    (req(out="float16"), (4, 4), "options out='float16': expected 'float32' (Y is float32)"),
    (req(), (0, 4), "empty shape 0x4, n=64"),
    (req(), (4, 0), "empty shape 4x0, n=64"),
    (req(n=0), (4, 4), "empty shape 4x4, n=0"),
    (req(), (2**15 + 1, 2**16), "densified W would take 8 GiB (> 8 GiB)"),
    (req(n=2**16), (2**15, 2**16), "an operand past 2^31 elements needs 64-bit offsets"),
    (req(n=2**15), (2**16, 2**15), "an operand past 2^31 elements needs 64-bit offsets"),
    (req(n=2**16), (2**15, 2**15), "an operand past 2^31 elements needs 64-bit offsets"),
    # each operand alone at 2**31 elements: W (exactly 8 GiB, not past it), X, Y
    (req(n=8), (2**15, 2**16), "an operand past 2^31 elements needs 64-bit offsets"),
    (req(n=2**15), (2, 2**16), "an operand past 2^31 elements needs 64-bit offsets"),
    (req(n=2**15), (2**16, 2), "an operand past 2^31 elements needs 64-bit offsets"),
])
def test_dense_tile_spmm_offer_declines(request_, shape, reason):
    assert dtm.offer(shape_stats(*shape), request_).reason == reason


def test_dense_tile_spmm_offer_at_its_limits():
    assert dtm.offer(shape_stats(4, 4), req(out="float32")).accepted
    assert dtm.offer(shape_stats(2**15, 2**16 - 1), req(n=8)).accepted  # just under 2**31 elements and 8 GiB
    assert dtm.offer(shape_stats(2**15 - 1, 2**15), req(n=2**16 - 1)).accepted
    assert dtm.offer(shape_stats(2, 2**16 - 1), req(n=2**15)).accepted  # X one column short of 2**31 elements
    assert dtm.offer(shape_stats(2**16 - 1, 2), req(n=2**15)).accepted  # Y one row short
    # rows past 65535 64-row tiles: the grid's y
    d = dtm.offer(shape_stats(64 * 65536, 8), req(n=8, tile_m=64))
    assert d.reason == "65536 row tiles of 64: past the grid's 65535 in y"
    assert dtm.offer(shape_stats(64 * 65535, 8), req(n=8, tile_m=64)).accepted


# ============================================================================== sputnik_sddmm.py

from sparsegen.families import sputnik_sddmm as ssd  # noqa: E402


def sddmm_rows(m, n, nnz, empty=0, cov=0.5):
    mean = nnz / max(m - empty, 1)
    return SimpleNamespace(shape=(m, n), nnz=nnz, row_lengths=LengthStats(0, 1000, mean, cov * mean, cov, empty))


def ssd_req(k, dtype="float32", **options):
    return Request("sddmm", k=k, dtype=dtype, options=tuple(sorted(options.items())))


def test_sputnik_sddmm_choose_by_hand():
    # float32, k 64: float4, 8 lanes (a 128-byte line); 24 x 132 = 3168 warps wanted. Rows of 40: tiles of 32
    # give ~7104 tiles (1776 warps), of 16 ~12160 (3040): 8-nonzero tiles, ~22272 of them; unroll min(32 // 8,
    # 64 // 32) = 2; 512-thread blocks: 348 of them, 2.64 an SM against 3 on the busiest (88 %)
    spec, why = ssd.choose(sddmm_rows(4096, 4096, 163840), ssd_req(64))
    assert (spec.vec, spec.lanes, spec.unroll, spec.tile, spec.block, spec.min_blocks, spec.order, spec.scaled) == (
        4, 8, 2, 8, 512, 1, "phase", True)
    assert why == ("k=64: 4-wide loads, 8 lanes per tile read 128 B of a B row per load, 2 per nonzero per chunk (1 "
                   "chunk(s) of 64); rows avg 40.0 nnz (CoV 0.50): tiles of 8 -> ~22272 tiles, 5568 warps for 132 "
                   "SMs; 512-thread blocks (2.6 per SM, 88% even); phase-major tiles")


def test_sputnik_sddmm_one_pass_at_k_128():
    spec, why = ssd.choose(sddmm_rows(4096, 4096, 163840), ssd_req(128))
    assert (spec.lanes, spec.unroll, spec.tile, spec.block, spec.min_blocks) == (8, 4, 8, 256, 3)
    assert ", 3 resident: 24 warps an SM)" in why
    assert why.endswith("; k is one pass of 8-nonzero tiles for 8-lane groups: fewer registers buy 24 warps an SM")
    # not for float16, nor with a tile, block or lanes option
    assert "one pass" not in ssd.choose(sddmm_rows(4096, 4096, 163840), ssd_req(128, "float16"))[1]
    for options in (dict(tile=16), dict(block=128), dict(lanes=8)):
        spec, why = ssd.choose(sddmm_rows(4096, 4096, 163840), ssd_req(128, **options))
        assert "one pass" not in why, options


def test_sputnik_sddmm_one_pass_at_k_256_only_under_large_blocks():
    # k 256: one pass of 16-lane groups, unless the rule's own 8-lane blocks are already 512 threads
    spec, why = ssd.choose(sddmm_rows(4096, 4096, 163840), ssd_req(256))
    assert "one pass" not in why and spec.lanes == 8
    spec, why = ssd.choose(sddmm_rows(256, 256, 2560), ssd_req(256))
    assert "one pass" in why and (spec.lanes, spec.tile, spec.unroll, spec.block) == (16, 8, 4, 256)
    spec, why = ssd.choose(sddmm_rows(256, 256, 2560), ssd_req(192))  # 192 / 16 = 12 lanes: no
    assert "one pass" not in why
    spec, why = ssd.choose(sddmm_rows(256, 256, 2560), ssd_req(130))  # a residue: no
    assert "one pass" not in why and why.startswith("k=130: 2-wide loads")


@pytest.mark.parametrize("m, nnz, empty, target, tile", [
    (4096, 163840, 0, 3168, 8), (100, 4000, 0, 1, 32), (100, 1000, 0, 1, 16), (100, 900, 0, 1, 16),
    (100, 300, 0, 1, 8), (100, 1000, 50, 1, 32), (100, 0, 100, 1, 8), (100, 3300, 0, 1, 32),
])
def test_sputnik_sddmm_choose_tile(m, nnz, empty, target, tile):
    # rows' mean (of the nonempty ones) rounded up to a power of two, between 8 and 32
    assert ssd.choose_tile(sddmm_rows(m, 64, nnz, empty), 8, target) == tile


@pytest.mark.parametrize("nnz, tile", [(800, 8), (850, 16), (1600, 16), (1650, 32)])
def test_sputnik_sddmm_choose_tile_rounds_the_mean_row_up(nnz, tile):
    # 100 rows: a mean of 8 or 16 takes that tile; 8.5 and 16.5 round up to 9 and 17, the next power of two
    assert ssd.choose_tile(sddmm_rows(100, 64, nnz), 8, 1) == tile


def test_sputnik_sddmm_choose_tile_stops_at_the_target():
    st = sddmm_rows(4096, 4096, 163840)
    # 32-nonzero tiles: ~7104 tiles x 8 lanes / 32 = 1776 warps
    assert ssd.choose_tile(st, 8, 1776) == 32
    assert ssd.choose_tile(st, 8, 1777) == 16
    assert ssd.choose_tile(st, 8, 3040) == 16
    assert ssd.choose_tile(st, 8, 3041) == 8


@pytest.mark.parametrize("tiles, lanes, sms, block", [
    (22272, 8, 132, 512), (1000, 8, 132, 64), (132 * 16, 8, 132, 128), (10, 8, 132, 64), (132 * 64, 8, 132, 512),
])
def test_sputnik_sddmm_choose_block(tiles, lanes, sms, block):
    assert ssd.choose_block(tiles, lanes, sms) == block


def test_sputnik_sddmm_choose_block_takes_a_spread_of_exactly_085():
    # 1088 tiles of 8 lanes: 17 blocks of 512 threads (64 groups), 34 of 256, 68 of 128, 136 of 64. On 20 SMs
    # 17 / 20 = 0.85 is even enough for 512; on 21 SMs 512, 256 and 128 spread 17 / 21 = 0.81, and 64 spreads
    # 136 / 21 / 7 = 0.93
    assert ssd.choose_block(1088, 8, 20) == 512
    assert ssd.choose_block(1088, 8, 21) == 64


def test_sputnik_sddmm_choose_block_without_an_even_spread_takes_the_most_even():
    # 200 tiles of 8 lanes on 132 SMs: blocks of 512 (64 groups) -> 4 blocks (3 %), ... of 32 (4 groups) -> 50 (38 %)
    assert ssd.choose_block(200, 8, 132) == 32
    assert ssd.choose_block(4, 8, 132) == 512  # one block whatever its size: the largest


@pytest.mark.parametrize("options, reason", [
    (dict(lanes=3), "options lanes=3: expected a power of two up to 32"),
    (dict(lanes=64), "options lanes=64: expected a power of two up to 32"),
    (dict(tile=2), "options tile=2: expected 4, 8, 16 or 32"),
    (dict(unroll=0), "options unroll=0: expected a power of two up to 32"),
    (dict(unroll=3), "options unroll=3: expected a power of two up to 32"),
    (dict(unroll=64), "options unroll=64: expected a power of two up to 32"),
    (dict(block=48), "options block=48: expected a multiple of 32 up to 1024"),
    (dict(block=0), "options block=0: expected a multiple of 32 up to 1024"),
    (dict(block=1056), "options block=1056: expected a multiple of 32 up to 1024"),
    (dict(min_blocks=0), "options min_blocks=0: expected an integer from 1 to 32"),
    (dict(min_blocks=33), "options min_blocks=33: expected an integer from 1 to 32"),
    (dict(min_blocks=2.0), "options min_blocks=2.0: expected an integer from 1 to 32"),
    (dict(order="col"), "options order='col': expected one of 'phase', 'row'"),
    (dict(scaled="yes"), "options scaled='yes': expected True or False"),
])
def test_sputnik_sddmm_options_checked(options, reason):
    assert ssd._rule(sddmm_rows(64, 64, 640), ssd_req(64, **options)).reason == reason


def test_sputnik_sddmm_options_taken():
    st = sddmm_rows(64, 64, 640)
    for options in (dict(lanes=1), dict(lanes=32), dict(tile=4), dict(unroll=1), dict(unroll=32), dict(block=32),
                    dict(block=1024), dict(min_blocks=1), dict(min_blocks=2), dict(order="row"),
                    dict(scaled=False), dict(scaled=True)):
        d = ssd._rule(st, ssd_req(64, **options))
        assert d.accepted, options
        for key, value in options.items():
            assert getattr(d.spec, key) == value
    d = ssd._rule(st, ssd_req(64, scaled=False))
    assert d.reason.endswith("; 64-bit offsets (option)")


@pytest.mark.parametrize("block, min_blocks", [(256, 2), (512, 1), (1024, 1)])
def test_sputnik_sddmm_min_blocks_at_least_one(block, min_blocks):
    # 65536 registers / (block x 128): 2 for 256 threads, 1 for 512, and 1 (not 0) for 1024
    assert ssd._rule(sddmm_rows(64, 64, 640), ssd_req(64, block=block)).spec.min_blocks == min_blocks


def test_sputnik_sddmm_reason_counts_only_the_nonempty_rows():
    # 600 nonzeros in 100 rows, 40 of them empty: 10 a nonempty row; no nonempty row: 0
    _, why = ssd.choose(sddmm_rows(100, 64, 600, empty=40), ssd_req(64))
    assert "; rows avg 10.0 nnz (CoV 0.50): tiles of 8 -> ~101 tiles, 26 warps for 132 SMs; " in why
    _, why = ssd.choose(sddmm_rows(100, 64, 0, empty=100), ssd_req(64))
    assert "; rows avg 0.0 nnz (CoV 0.50): tiles of 8 -> ~0 tiles, 0 warps for 132 SMs; " in why


def test_sputnik_sddmm_rule_declines():
    st = sddmm_rows(64, 64, 640)
    assert ssd._rule(st, Request("spmm", k=8)).reason == "op 'spmm' is not sddmm"
    assert ssd._rule(st, Request("sddmm")).reason == "sddmm needs k (the inner dimension)"
    assert ssd._rule(st, Request("sddmm", k=8, dtype="bfloat16")).reason == "dtype bfloat16 not in float32/float16"
    assert ssd._rule(st, ssd_req(8, "float16")).accepted
    d = ssd._rule(st, ssd_req(64, block=1024, min_blocks=3))
    assert d.reason == "option min_blocks=3: 3 blocks of 1024 threads exceed the 2048 threads an SM holds"
    assert ssd._rule(st, ssd_req(64, block=1024, min_blocks=2)).accepted


@pytest.mark.parametrize("m, n, nnz, k, accepted", [
    (64, 64, 2**31 - 1 - 64 * 32, 8, True), (64, 64, 2**31 - 64 * 32, 8, False),
    (2**31 - 1, 1, 0, 8, False), (1, 2**31 - 1, 0, 8, True), (1, 2**31, 0, 8, False), (1, 1, 0, 2**31, False),
])
def test_sputnik_sddmm_index_limits_on_both_sides(m, n, nnz, k, accepted):
    d = ssd._rule(sddmm_rows(m, n, nnz), ssd_req(k))
    assert (d.reason == "matrix needs 64-bit indices") is not accepted


def test_sputnik_sddmm_offsets_past_32_bits():
    # (n - 1) x k within 2**31 - 1: scaled column slots; past it, 64-bit offsets
    spec, why = ssd.choose(sddmm_rows(64, 2**24, 640), ssd_req(128))
    assert spec.scaled and why.endswith("warps an SM")
    spec, why = ssd.choose(sddmm_rows(64, 2**24 + 1, 640), ssd_req(128))
    assert not spec.scaled and f"; {2**24 + 1} x 128 needs 64-bit offsets" in why
    # the largest slot (n - 1) x k exactly 2**31 - 1 (a prime: k = 2**31 - 1 with 2 columns) still fits
    d = ssd._rule(sddmm_rows(64, 2, 640), ssd_req(2**31 - 1))
    assert d.accepted and d.spec.scaled
    spec, why = ssd.choose(sddmm_rows(64, 3, 640), ssd_req(2**31 - 1))
    assert not spec.scaled and why.endswith(f"; 3 x {2**31 - 1} needs 64-bit offsets")


# ==================================================================================== _tiled.py

from sparsegen.families import _tiled as T  # noqa: E402
from sparsegen.select.ratesfile import Launch, Memory  # noqa: E402


def half(n=32, **options):
    return Request("spmm", n=n, dtype="float16", options=tuple(sorted(options.items())))


def mk(m, k):
    return SimpleNamespace(shape=(m, k))


def test_choose_split_narrow_by_hand():
    # 4096 x 8192, bn 32: 128 k-tiles, 16 a split -> 8; 32 tiles x 8 = 256 blocks; atomics (4 x 8 x 4096 x 32
    # bytes at 1.5 TB/s + 8 x 4096 x 32 at 3 TB/s = 3.1 us) against a second launch (3 + 2.8 us)
    s = T.choose_split(mk(4096, 8192), half(), 32, 32, 3, 1e-4)
    assert (s.tile_m, s.split_k, s.reduction, s.blocks) == (128, 8, "atomic", None)
    assert s.reason == ("32 output tiles x split-K 8 (16 of 128 k-tiles each, target 16) = 256 blocks for 132 SMs x 3 "
                        "resident; reduce through in-kernel fp32 atomics, the last block of each tile finishes (~3.1 "
                        "us; measured faster than a cluster for narrow blocks)")


def test_choose_split_raises_the_split_until_every_sm_has_a_block():
    # one 128-row tile: the split grows to 32 (128 k-tiles, 4 each at least)
    s = T.choose_split(mk(128, 8192), half(), 32, 32, 3, 1e-4)
    assert (s.tile_m, s.split_k) == (128, 32)
    s = T.choose_split(mk(128, 64 * 40), half(), 32, 32, 3, 1e-4)  # 40 k-tiles: at most 10 splits
    assert s.split_k == 10
    s = T.choose_split(mk(66 * 128, 8192), half(), 32, 32, 3, 1e-4)  # 66 tiles x 2 = 132: enough at 8
    assert s.split_k == 8


def test_choose_split_without_a_split():
    s = T.choose_split(mk(4096, 256), half(), 32, 32, 3, 1e-4)  # 4 k-tiles: one split
    assert (s.split_k, s.reduction) == (1, "none")
    assert s.reason == "32 output tiles x split-K 1 (4 of 4 k-tiles each, target 16) = 32 blocks for 132 SMs x 3 resident"


def test_choose_split_tile_heights():
    assert T.choose_split(mk(128, 8192), half(), 32, 32, 3, 1e-4).tile_m == 128  # the tallest that fits M
    assert T.choose_split(mk(127, 8192), half(), 32, 32, 3, 1e-4).tile_m == 64
    assert T.choose_split(mk(64, 8192), half(), 32, 32, 3, 1e-4).tile_m == 64
    assert T.choose_split(mk(20, 8192), half(), 32, 32, 3, 1e-4).tile_m == 64
    assert T.choose_split(mk(4096, 8192), half(tile_m=256), 32, 32, 3, 1e-4).tile_m == 256
    # 8 warps in one k-group need 128 rows: 64 is not usable, and with none usable, 16 rows a warp
    assert T.choose_split(mk(64, 8192), half(warps=8), 32, 32, 3, 1e-4, heights=(128, 64)).tile_m == 128
    assert T.choose_split(mk(4096, 8192), half(warps=8), 32, 32, 3, 1e-4, heights=(64,)).tile_m == 128
    assert T.usable_heights((256, 128, 64, 32), half(warps=8, warp_k=2)) == (256, 128, 64)
    assert T.usable_heights((256, 128, 64, 32), half()) == (256, 128, 64)


def test_choose_split_a_second_launch_where_atomics_cost_more():
    slow_atomics = dataclasses.replace(D.default(), rates=D.default().rates.replace(
        memory=Memory(3e12, 2.5e12, 1e9), launch=Launch(1e-7, 5e-7, 8.4e-6, 8.9e-6)))
    r = Request("spmm", n=32, dtype="float16", device=slow_atomics)
    s = T.choose_split(mk(4096, 8192), r, 32, 32, 3, 1e-4)
    assert s.reduction == "two_step"
    assert s.reason.endswith("; reduce through a second, deterministic launch (~2.9 us)")
    r = Request("spmm", n=32, dtype="float16", device=slow_atomics, options=(("reduction", "atomic"),))
    assert T.choose_split(mk(4096, 8192), r, 32, 32, 3, 1e-4).reduction == "atomic"


def test_choose_split_takes_stream_k_past_one_wave():
    # 28672 rows at n 16 in 16-column blocks: 224 tiles x split 8 = 1792 blocks > 132 x 3
    s = T.choose_split(mk(28672, 8192), half(16), 16, 16, 3, 1e-4, stream_bns=(8, 16, 32))
    assert (s.split_k, s.reduction, s.tile_m) == (1, "stream", 128)
    assert s.reason.startswith("224 output tiles x split-K 8 would be 1792 blocks for 132 SMs x 3 resident, past one "
                               "wave; stream-K: every resident block")
    # within one wave (396 blocks): split-K as usual
    s = T.choose_split(mk(49 * 128, 8192), half(16), 16, 16, 3, 1e-4, stream_bns=(8, 16, 32))
    assert s.reduction == "atomic" and 49 * 8 <= 396
    s = T.choose_split(mk(50 * 128, 8192), half(16), 16, 16, 3, 1e-4, stream_bns=(8, 16, 32))
    assert s.reduction == "stream"  # 400 blocks
    # not for a width outside stream_bns, nor for n wider than one block, nor when a reduction is asked
    assert T.choose_split(mk(28672, 8192), half(16), 16, 16, 3, 1e-4, stream_bns=(32,)).reduction == "atomic"
    assert T.choose_split(mk(28672, 8192), half(32), 32, 16, 3, 1e-4, stream_bns=(16,)).reduction == "atomic"
    s = T.choose_split(mk(28672, 8192), half(16, reduction="atomic"), 16, 16, 3, 1e-4, stream_bns=(16,))
    assert s.reduction == "atomic"
    s = T.choose_split(mk(300, 8192), half(16, reduction="stream"), 16, 16, 3, 1e-4)
    assert (s.reduction, s.tile_m) == ("stream", 128)


def test_choose_split_with_no_more_than_four_k_tiles():
    # 1 and 3 k-tiles: fewer than MIN_K_TILES_PER_SPLIT, still one split (never zero)
    for k, k_tiles in ((64, 1), (192, 3)):
        s = T.choose_split(mk(4096, k), half(), 32, 32, 3, 1e-4)
        assert (s.split_k, s.reduction) == (1, "none")
        assert s.reason == (f"32 output tiles x split-K 1 ({k_tiles} of {k_tiles} k-tiles each, target 16) = 32 "
                            f"blocks for 132 SMs x 3 resident")


def test_choose_split_starts_at_one_split_for_at_most_24_k_tiles():
    # round(k_tiles / 16): 8 k-tiles round to 0 and 16 to 1; both start (and, with 256 tiles >= 132
    # SMs, stay) at one split although 2 and 4 splits would keep 4 k-tiles each
    for k in (512, 1024):
        s = T.choose_split(mk(32768, k), half(), 32, 32, 3, 1e-4)
        assert (s.split_k, s.reduction) == (1, "none")
        assert s.reason.startswith(f"256 output tiles x split-K 1 ({k // 64} of {k // 64} k-tiles each")


def test_choose_split_stops_raising_the_split_once_blocks_reach_the_sms():
    # 16 k-tiles start at one split; 44 tiles x 3 = 132 blocks fill the 132 SMs exactly: 3 (6 k-tiles
    # each); 43 tiles x 3 = 129 fall short: 4
    s = T.choose_split(mk(44 * 128, 1024), half(), 32, 32, 3, 1e-4)
    assert s.split_k == 3 and s.reason.startswith("44 output tiles x split-K 3 (6 of 16 k-tiles each, target 16) = "
                                                  "132 blocks for 132 SMs")
    s = T.choose_split(mk(43 * 128, 1024), half(), 32, 32, 3, 1e-4)
    assert s.split_k == 4 and s.reason.startswith("43 output tiles x split-K 4 (4 of 16 k-tiles each, target 16) = "
                                                  "172 blocks")


def test_choose_split_counts_every_column_tile():
    # n 64 in 32-column blocks: 32 row tiles x 2 column tiles = 64 output tiles
    s = T.choose_split(mk(4096, 8192), half(64, bn=32), 64, 32, 3, 1e-4)
    assert s.split_k == 8
    assert s.reason.startswith("64 output tiles x split-K 8 (16 of 128 k-tiles each, target 16) = 512 blocks")


def test_choose_split_takes_stream_k_only_past_one_wave():
    # 99 tiles x split 4 = 396 blocks = 132 SMs x 3 resident: one wave exactly, split-K; 100 tiles: past it
    s = T.choose_split(mk(99 * 128, 4096), half(16), 16, 16, 3, 1e-4, stream_bns=(16,))
    assert (s.split_k, s.reduction) == (4, "atomic") and "= 396 blocks for 132 SMs x 3 resident" in s.reason
    s = T.choose_split(mk(100 * 128, 4096), half(16), 16, 16, 3, 1e-4, stream_bns=(16,))
    assert (s.split_k, s.reduction) == (1, "stream")
    assert s.reason.startswith("100 output tiles x split-K 4 would be 400 blocks for 132 SMs x 3 resident, past one "
                               "wave; ")


def test_choose_split_heights_for_eight_warps_in_two_k_groups():
    # 8 warps in 2 k-groups are 4 row groups: 64-row tiles give each 16 rows, and a short M takes them
    # (M = 20 < 64: the 64-row tile still fits max(M, 64))
    for m in (20, 64):
        assert T.choose_split(mk(m, 8192), half(warps=8, warp_k=2), 32, 32, 3, 1e-4).tile_m == 64
    assert T.choose_split(mk(20, 8192), half(warps=8, warp_k=2), 32, 32, 3, 1e-4, heights=(128, 64)).tile_m == 64


def test_choose_split_models_a_split_or_reduction_asked_for():
    # narrow blocks, but split_k= or a reduction other than atomics is asked: the cost model's split
    s = T.choose_split(mk(4096, 8192), half(split_k=3), 32, 32, 3, 1e-4)
    assert s.split_k == 3 and "(split_k as asked); predicted " in s.reason
    s = T.choose_split(mk(4096, 8192), half(reduction="two_step"), 32, 32, 3, 1e-4)
    assert s.reduction == "two_step" and "; predicted " in s.reason and "target 16" not in s.reason
    s = T.choose_split(mk(4096, 8192), half(reduction="atomic"), 32, 32, 3, 1e-4)  # atomics: the narrow rule's own
    assert (s.split_k, s.reduction) == (8, "atomic") and "target 16" in s.reason


def tie_device(launch_s):
    # powers of two, so the two reductions' predicted times are exact: for 1 tile of 128 x 32 and split 2,
    # partials 4 x 2 x 128 x 32 = 2**15 bytes: atomics 2**15 / 2**39 + 8 x 128 x 32 / 2**40 = 2**-24 + 2**-25,
    # a second launch launch_s + 2 x 2**15 / 2**40 = launch_s + 2**-24
    dev = D.default()
    rates = dev.rates.replace(memory=dataclasses.replace(dev.rates.memory, copy_bytes_per_s=2.0**40,
                                                         atomic_bytes_per_s=2.0**39),
                              launch=dataclasses.replace(dev.rates.launch, launch_s=launch_s))
    return dataclasses.replace(dev, rates=rates)


@pytest.mark.parametrize("launch_s, reduction", [(2.0**-25, "atomic"), (2.0**-25 - 2.0**-40, "two_step"),
                                                 (2.0**-25 + 2.0**-40, "atomic")])
def test_choose_split_atomics_on_a_tie_with_a_second_launch(launch_s, reduction):
    r = Request("spmm", n=32, dtype="float16", device=tie_device(launch_s))
    s = T.choose_split(mk(128, 512), r, 32, 32, 3, 1e-4)  # 8 k-tiles, one tile: split raised to the most, 2
    assert (s.split_k, s.reduction) == (2, reduction)


def test_partial_wave_factor_is_exactly_one_from_one_full_wave():
    # a full wave is the reference itself: exactly 1, not the formula's (r + h) s r / (s r (r + h)), which
    # rounds to 1 - 2**-52 for h = 0.1 and would tip ties between equal candidates
    assert T.partial_wave_factor(396, 132, 3, 0.1) == 1.0
    assert T.partial_wave_factor(396, 132, 3, 1.3) == 1.0
    assert T.partial_wave_factor(395, 132, 3, 0.1) == pytest.approx(3.1 * 396 / (395 * 3.1), rel=1e-15)


def test_partial_wave_factor_by_hand():
    assert T.partial_wave_factor(264, 132, 2, 1.0) == 1.0  # one full wave
    assert T.partial_wave_factor(300, 132, 2, 1.0) == 1.0
    # 263 blocks: the busiest SM runs 2 of them: (2 + h) x 132 x 2 / (263 x (2 + h))
    assert T.partial_wave_factor(263, 132, 2, 1.0) == pytest.approx(264 / 263, rel=1e-15)
    # 100 blocks on 132 SMs at 3 resident, h 0.5: one each, (1 + 0.5) x 396 / (100 x 3.5)
    assert T.partial_wave_factor(100, 132, 3, 0.5) == pytest.approx(1.5 * 396 / 350, rel=1e-15)


def test_wave_factor_by_hand():
    # 300 blocks, 100 SMs, 2 resident, h 1: 3 an SM = a wave of 2 (3 block-times) + one of 1 (2): 5;
    # x 100 / 300 x 3 / (3 + 1)
    assert T.wave_factor(300, 100, 2, 1.0) == pytest.approx(100 / 300 * 0.75 * 5, rel=1e-15)
    assert T.wave_factor(200, 100, 2, 1.0) == pytest.approx(0.5 * 0.75 * 3, rel=1e-15)
    assert T.wave_factor(100, 100, 3, 0.0) == pytest.approx(1.0, rel=1e-15)
    assert T.wave_factor(101, 100, 1, 0.5) == pytest.approx(100 / 101 * 3 / 3.5 * 3.0, rel=1e-15)


def tspec(**f):
    base = dict(reduction="atomic", split_k=4, bn=32, m=4096, n=32, grid=0, m_tiles=32, tile_m=128)
    base.update(f)
    return SimpleNamespace(**base)


def test_spec_reduction_seconds_by_hand():
    r = D.default().rates.replace(memory=Memory(2e12, 1e12, 1e12), launch=Launch(1e-6, 7e-6, 0.0, 0.0))
    part = 4.0 * 4 * 4096 * 32
    assert T.spec_reduction_seconds(tspec(), r) == pytest.approx(part / 1e12 + 8.0 * 4096 * 32 / 2e12, rel=1e-15)
    assert T.spec_reduction_seconds(tspec(reduction="two_step"), r) == pytest.approx(1e-6 + 2 * part / 2e12, rel=1e-15)
    assert T.spec_reduction_seconds(tspec(reduction="cluster"), r) == 7e-6
    assert T.spec_reduction_seconds(tspec(split_k=1), r) == 0.0
    assert T.spec_reduction_seconds(tspec(reduction="none"), r) == 0.0
    # wide blocks reduced by a second launch: x wide_two_step_scale
    wide = r.replace(tiles=dataclasses.replace(r.tiles, wide_two_step_scale=3.0))
    assert T.spec_reduction_seconds(tspec(reduction="two_step", bn=64), wide) == pytest.approx(
        3.0 * (1e-6 + 2 * part / 2e12), rel=1e-15)
    assert T.spec_reduction_seconds(tspec(reduction="two_step", bn=32), wide) == pytest.approx(
        1e-6 + 2 * part / 2e12, rel=1e-15)
    # stream-K: a block's share cuts at most two m-tiles: grid + min(grid, m_tiles) pieces of tile_m x n
    s = tspec(reduction="stream", grid=100, m_tiles=32, split_k=1)
    assert T.spec_reduction_seconds(s, r) == pytest.approx(4.0 * 132 * 128 * 32 / 1e12 + 8.0 * 4096 * 32 / 2e12,
                                                           rel=1e-15)
    s = tspec(reduction="stream", grid=10, m_tiles=32, split_k=1)
    assert T.spec_reduction_seconds(s, r) == pytest.approx(4.0 * 20 * 128 * 32 / 1e12 + 8.0 * 4096 * 32 / 2e12,
                                                           rel=1e-15)


def gate_stats(m=4096, k=4096, density=0.3, nnz=None, tiles=2048):
    return SimpleNamespace(shape=(m, k), density=density, nnz=int(m * k * density) if nnz is None else nnz,
                           tiles=SimpleNamespace(tiles=tiles))


@pytest.mark.parametrize("request_, reason", [
    (Request("sddmm", n=8, dtype="float16"), "op 'sddmm' is not spmm"),
    (Request("spmm", n=8, dtype="float32"), "dtype float32: tensor-core tiles take float16/bfloat16 (m16n8k16 has no "
                                            "fp32 form)"),
    (half(out="float64"), "options out='float64': expected the input dtype or 'float32'"),
    (half(out="bfloat16"), "options out='bfloat16': expected the input dtype or 'float32'"),
    (half(warps=2), "options warps=2: expected 4 or 8"),
    (half(warp_k=3), "options warp_k=3: expected 1, 2 or 4 (k16 steps of a tile: 4)"),
    (half(wgmma="yes"), "options wgmma='yes': expected True or False"),
    (Request("spmm", n=8, dtype="float16", arch="sm_80", options=(("wgmma", True),)),
     "options wgmma=True on sm_80: warpgroup MMA is sm_90's (sm_90a)"),
    (half(wgmma=True, l2_prefetch=True), "options wgmma=True with l2_prefetch=True: the wgmma pipeline has no L2 "
                                         "prefetch"),
    (half(wgmma=True, warp_k=2), "options wgmma=True with warp_k=2: a warpgroup's 4 warps share each k16 step"),
    (half(reduction="stream", wgmma=True), "options reduction='stream' with wgmma or k-groups: stream-K runs the "
                                           "mma.sync kernels with one row group per warp"),
    (half(reduction="stream", warp_k=2), "options reduction='stream' with wgmma or k-groups: stream-K runs the "
                                         "mma.sync kernels with one row group per warp"),
    (half(reduction="stream", split_k=2), "options reduction='stream' with split_k=: stream-K shares all tile "
                                          "products among the resident blocks instead of splitting K"),
    (half(64, reduction="stream", bn=32), "options reduction='stream' with n=64 over 32-column blocks: stream-K "
                                          "walks one column tile"),
    (half(blocks=0), "options blocks=0: expected resident blocks per SM, a positive integer"),
    (half(blocks=17), "options blocks=17: expected resident blocks per SM, an integer from 1 to 16 for 4-warp blocks"),
    (half(blocks=True), "options blocks=True: expected resident blocks per SM, a positive integer"),
    (half(blocks=9, warps=8), "options blocks=9: expected resident blocks per SM, an integer from 1 to 8 for 8-warp "
                              "blocks"),
    (half(tile_m=64, warps=8), "options tile_m=64 with 8 warps in 8 row groups: each group needs 16 rows"),
    (half(bn=12), "options bn=12: expected one of 8, 16, 32, 64"),
    (half(8, bn=16), "options bn=16: expected 8, 16, 32 or 64, at most 8 (N = 8 rounded up to a power of two)"),
    (half(tile_m=96), "options tile_m=96: expected one of 64, 128, 256"),
    (half(split_k=0), "options split_k=0: expected a positive integer"),
    (half(reduction="tree"), "options reduction='tree': expected one of 'atomic', 'cluster', 'none', 'stream', "
                             "'two_step'"),
    (half(64, tile_m=256), "options tile_m=256, warps=4, warp_k=1 with 64 columns per block: 128 fp32 accumulators "
                           "per thread, at most 64 (spills); more row groups (options warps=8, fewer k-groups) divide "
                           "them"),
])
def test_tiled_gate_declines(request_, reason):
    d = T.gate(gate_stats(), request_)
    assert d is not None and d.reason == reason


def test_tiled_gate_accepts_at_its_limits():
    for r in (half(), Request("spmm", n=8, dtype="bfloat16"), half(out="float32"), half(out="float16"),
              half(warps=8), half(8, warp_k=4), half(wgmma=False), half(wgmma=True), half(blocks=1), half(blocks=16),
              half(tile_m=128, warps=8), half(bn=32), half(8, bn=8), half(tile_m=256), half(split_k=3),
              half(reduction="stream"), half(32, reduction="stream", bn=32), half(64, tile_m=256, warps=8),
              half(64, tile_m=128)):
        assert T.gate(gate_stats(), r) is None, r.options


def test_tiled_gate_row_groups_and_thread_slots():
    st = gate_stats()
    # 8 warps in 2 (or 4) k-groups are 4 (2) row groups: 64-row tiles give each 16 rows or more
    assert T.gate(st, half(tile_m=64, warps=8, warp_k=2)) is None
    assert T.gate(st, half(tile_m=64, warps=8, warp_k=4)) is None
    # resident blocks asked for, against thread slots: 4096 a SM hold 32 blocks of 128 threads
    dev = dataclasses.replace(D.default(), max_threads_per_sm=4096)
    assert T.gate(st, Request("spmm", n=32, dtype="float16", device=dev, options=(("blocks", 32),))) is None
    d = T.gate(st, Request("spmm", n=32, dtype="float16", device=dev, options=(("blocks", 33),)))
    assert d.reason == "options blocks=33: expected resident blocks per SM, an integer from 1 to 32 for 4-warp blocks"


def test_tiled_gate_counts_accumulators_at_the_default_height():
    # no tile_m asked: the chooser's tallest unasked height, 128 rows; 4 warps in 4 k-groups are one row
    # group of 8 m16 fragments x 8 n8 fragments x 4 = 256 accumulators
    d = T.gate(gate_stats(), half(64, warp_k=4))
    assert d.reason == ("options tile_m=128, warps=4, warp_k=4 with 64 columns per block: 256 fp32 accumulators per "
                        "thread, at most 64 (spills); more row groups (options warps=8, fewer k-groups) divide them")
    assert T.gate(gate_stats(), half(64, warp_k=2)).reason.startswith("options tile_m=128, warps=4, warp_k=2 with 64 "
                                                                      "columns per block: 128 fp32 accumulators")
    assert T.gate(gate_stats(), half(32, warp_k=2)) is None  # 4 x 4 x 4 = 64: at the limit


def test_tiled_gate_density_n_and_sizes_on_both_sides():
    assert T.gate(gate_stats(density=0.05), half()) is None
    d = T.gate(gate_stats(density=0.0499), half())
    assert d.reason == ("density 0.050 < 0.05: tile math on zeros would cost more than CSR kernels' work on the "
                        "nonzeros")
    assert T.gate(gate_stats(density=0.0499), half(family="tiled_csl_spmm")) is None
    assert T.gate(gate_stats(0, 64), half()).reason == "empty shape 0x64"
    assert T.gate(gate_stats(64, 0), half()).reason == "empty shape 64x0"
    # n past 256 with W (2 m k bytes) beyond 8/25 of L2 (52428800 x 8 // 25 = 16777216 bytes: 2048 x 4096)
    assert T.gate(gate_stats(2048, 4096), half(257)) is None
    assert T.gate(gate_stats(2048, 4097), half(257)).reason == ("n=257 > 256 with W of 16 MB as fp16 tiles: each "
                                                                "64-column tile re-reads W from memory; dense or CSR "
                                                                "kernels suit wide X")
    assert T.gate(gate_stats(2048, 4097), half(256)) is None
    # 4 x (nnz + 4 tiles) must stay under 2**33
    assert T.gate(gate_stats(nnz=2**31 - 4 * 2048 - 1), half()) is None
    assert T.gate(gate_stats(nnz=2**31 - 4 * 2048), half()).reason == "encoding needs 64-bit offsets"


# ========================================================================= tiled_bitmap_spmm.py

from sparsegen.families import tiled_bitmap_spmm as bitmap  # noqa: E402


def test_bitmap_gate_adds_its_own_refusals():
    st = gate_stats()
    assert bitmap.gate(st, half()) is None and bitmap.gate(st, half(granule=2)) is None
    assert bitmap.gate(st, half(granule=1)) is None
    assert bitmap.gate(st, half(warp_k=2)).reason == ("options warp_k=2: the bitmap encoding slices each tile by warp "
                                                      "rows (k-groups are Tiled-CSL's)")
    assert bitmap.gate(st, half(granule=3)).reason == ("options granule=3: expected one of (1, 2) (halves per bitmap "
                                                       "bit)")
    assert bitmap.gate(st, half(warps=3)).reason == "options warps=3: expected 4 or 8"  # the tile families' own first
    assert bitmap.gate(st, half(warps=3, granule=3)).reason == "options warps=3: expected 4 or 8"


def test_bitmap_granule_of_a_request():
    assert bitmap.request_granule(half()) == 1 and bitmap.request_granule(half(granule=2)) == 2
    r = bitmap.with_granule(half(bn=16, granule=1), 2)
    assert r.options == (("bn", 16), ("granule", 2)) and r.n == 32 and r.dtype == "float16"
    assert bitmap.with_granule(half(), 1).options == (("granule", 1),)


# ============================================================================== sputnik_spmm.py

from sparsegen.families import sputnik_spmm as sput  # noqa: E402


def test_sputnik_warps_by_hand():
    # 1000 rows x 2 column tiles x 2 groups x 8 threads = 32000 threads = 1000 warps
    assert sput.warps(1000, 200, 128, 8, 2) == 1000
    assert sput.warps(1, 1, 4, 1, 1) == 1 and sput.warps(33, 128, 128, 32, 1) == 33 and sput.warps(3, 8, 8, 2, 1) == 1


def test_sputnik_row_split_by_hand():
    # 132 SMs x 32 = 4224 warps. 100 rows, n 128 in one tile of 32 threads: 100 warps a split; x32 > 4224 -> 16 cap
    assert sput.row_split(100, 128, 128, 32, 4224) == 16
    assert sput.row_split(300, 128, 128, 32, 4224) == 8  # 300 x 16 = 4800 > 4224; 300 x 8 = 2400
    assert sput.row_split(264, 128, 128, 32, 4224) == 16  # 264 x 16 = 4224: still within
    assert sput.row_split(265, 128, 128, 32, 4224) == 8
    assert sput.row_split(5000, 128, 128, 32, 4224) == 1


@pytest.mark.parametrize("n, tile_n, width, target, budget", [(128, 128, 32, 4224, 4224), (256, 128, 32, 4224, 2112),
                                                               (32, 32, 8, 4224, 16896), (8, 8, 2, 1, 16),
                                                               (1024, 128, 32, 4, 1)])
def test_sputnik_group_budget(n, tile_n, width, target, budget):
    assert sput.group_budget(n, tile_n, width, target) == budget


@pytest.mark.parametrize("longest, nnz, budget, piece, cap, split", [
    (1000, 10000, 100, 0, 16, 16),  # pieces of >= 100: 10 -> 16
    (1000, 10000, 1000, 0, 16, 16),  # pieces of >= 10: 100 -> capped at 16
    (1000, 10000, 1000, 0, 8, 8),
    (300, 10000, 100, 0, 16, 4),  # 300 / 100 = 3 -> 4
    (100, 10000, 100, 0, 16, 1),
    (101, 10000, 100, 0, 16, 2),
    (1000, 10000, 100, 250, 16, 4),  # a piece size given: 1000 / 250 = 4
    (1000, 10000, 100, 251, 16, 4),
    (1000, 10000, 100, 249, 16, 8),
    (5, 0, 7, 0, 16, 8),  # no nonzeros: pieces of 1
])
def test_sputnik_most_split(longest, nnz, budget, piece, cap, split):
    assert sput.most_split(longest, nnz, budget, piece, cap) == split


@pytest.mark.parametrize("n, itemsize, tile_bytes, vec, width", [
    (128, 4, None, 4, 32), (1024, 4, None, 4, 32), (64, 4, None, 4, 16), (6, 4, None, 2, 4), (1, 4, None, 1, 1),
    (128, 2, None, 8, 16), (1024, 2, None, 8, 32), (1024, 4, 256, 4, 16), (1024, 4, 16, 4, 1), (1024, 4, 8, 4, 1),
])
def test_sputnik_row_group(n, itemsize, tile_bytes, vec, width):
    assert sput.row_group(n, itemsize, tile_bytes) == (vec, width)


@pytest.mark.parametrize("m, k, mean, f16, width, many", [
    (2048, 2048, 256, False, 8, True), (2047, 2048, 256, False, 8, False), (2048, 2047, 256, False, 8, False),
    (2048, 2048, 255.9, False, 8, False), (2048, 2048, 96, False, 32, True), (2048, 2048, 95.9, False, 32, False),
    (2048, 2048, 256, True, 8, False),
])
def test_sputnik_many_long_rows_on_both_sides(m, k, mean, f16, width, many):
    assert sput.many_long_rows(m, k, mean, f16, width) is many


@pytest.mark.parametrize("n, f16, big, swizzle, mean, block, threads, note", [
    (128, False, False, False, 100, 256, 256, ""),
    (128, False, True, False, 100, None, 512, ""),
    (1024, False, False, True, 10, None, 512, "; 512-thread blocks (n >= 1024: measured faster)"),
    (1023, False, False, True, 10, None, 128, ""),
    (1024, True, False, True, 10, None, 128, ""),
    (128, False, False, False, 90, None, 512, "; 512-thread blocks (n >= 128 with rows in order of >= 90 nonzeros: "
                                              "measured faster)"),
    (127, False, False, False, 90, None, 128, ""),
    (128, False, False, True, 90, None, 128, ""),
    (128, False, False, False, 89.9, None, 128, ""),
    (128, True, False, False, 90, None, 128, ""),
])
def test_sputnik_block_threads(n, f16, big, swizzle, mean, block, threads, note):
    assert sput.block_threads(n, f16, big, swizzle, mean, block) == (threads, note)


def sput_stats(m, k, mean, cov=0.05, longest=None):
    mx = int(mean * 1.2) if longest is None else longest
    return SimpleNamespace(shape=(m, k), nnz=int(m * mean),
                           row_lengths=LengthStats(max(0, int(mean * 0.8)), mx, mean, cov * mean, cov, 0))


def test_sputnik_choose_rows_split_alike_by_hand():
    # fp32, 256 rows of 200 at n 128: float4, 32 threads, one tile; 4224 warps wanted: 256 x 16 = 4096 -> 16
    spec, why = sput.choose(sput_stats(256, 4096, 200.0), Request("spmm", n=128))
    assert (spec.vec, spec.width, spec.ksplit, spec.rows, spec.chunk, spec.sv, spec.batch) == (4, 32, 16, 1, 32, 1, 16)
    assert (spec.index_bits, spec.prescaled, spec.wide, spec.swizzle, spec.prefetch, spec.budget) == (
        32, True, False, False, False, 0)
    assert why == ("rows avg 200.0 nnz (CoV 0.05), n=128: 4-wide loads, 32 threads x 128 columns per row group (1 tile), "
                   "16 groups per row (256 rows alone give 256 warps; split while the grid stays within 4224 for 132 "
                   "SMs); 32-nonzero chunks by 1-wide loads, 16 loads of X in flight; 512-thread blocks (n >= 128 with "
                   "rows in order of >= 90 nonzeros: measured faster); 32-bit indices pre-scaled by n; rows in order")


def test_sputnik_choose_many_long_rows_by_hand():
    # 4096 x 4096 rows of 400, CoV 0.05, n 128: rows unsplit; 4096 warps <= 8192: 64-nonzero chunks in 512-thread
    # blocks (16 rows of 32 threads)
    spec, why = sput.choose(sput_stats(4096, 4096, 400.0), Request("spmm", n=128))
    assert (spec.ksplit, spec.chunk, spec.rows, spec.batch, spec.block) == (1, 64, 16, 16, 512)
    assert "(4096 x 4096, rows unsplit, 16-row blocks: measured faster)" in why
    # n 32: 8-thread groups, 4096 x 4 tiles... 4096 rows x 1 tile x 8 threads = 1024 warps: chunks of 64, 128 threads
    spec, why = sput.choose(sput_stats(4096, 4096, 400.0), Request("spmm", n=32))
    assert (spec.width, spec.ksplit, spec.chunk, spec.rows, spec.batch) == (8, 1, 64, 16, 16)
    assert "(4096 x 4096, rows unsplit: measured faster)" in why
    # n 1024 on 16384 rows: 16384 x 8 tiles = 131072 warps > 8192: 8 loads in flight; whole warps: chunks of 64
    spec, why = sput.choose(sput_stats(16384, 4096, 400.0), Request("spmm", n=1024))
    assert (spec.ksplit, spec.chunk, spec.batch, spec.rows) == (1, 64, 8, 16)
    spec, _ = sput.choose(sput_stats(16384, 4096, 400.0), Request("spmm", n=32))  # 4096 warps: still chunks of 64
    assert (spec.chunk, spec.batch, spec.rows) == (64, 16, 16)
    spec, _ = sput.choose(sput_stats(65536, 4096, 400.0), Request("spmm", n=32))  # 16384 warps
    assert (spec.chunk, spec.batch, spec.rows) == (32, 8, 16)  # narrow groups on a large grid: chunks of 32


def test_sputnik_choose_skewed_many_rows_split_alike():
    spec, why = sput.choose(sput_stats(4096, 4096, 400.0, cov=0.5), Request("spmm", n=128))
    assert spec.ksplit == 8 and spec.swizzle and ("8 groups per row (4096 x 4096 with rows of CoV 0.50 >= 0.5: many "
                                                  "long rows, skewed; split alike measured fastest)") in why
    spec, _ = sput.choose(sput_stats(4096, 4096, 400.0, cov=0.5), Request("spmm", n=1024))
    assert spec.ksplit == 2
    spec, _ = sput.choose(sput_stats(4096, 4096, 400.0, cov=0.4999), Request("spmm", n=128))
    assert spec.ksplit == 1


def test_sputnik_choose_balanced_for_few_skewed_rows():
    # 100 rows averaging 50, the longest 2000 (>= 2 x mean and > 32 x the alike split): per-row split
    st = sput_stats(100, 4096, 50.0, cov=3.0, longest=2000)
    spec, why = sput.choose(st, Request("spmm", n=128))
    budget = 4224 * 1 // 1  # 32 threads: one group a warp, one column tile
    assert spec.budget == budget and spec.piece == 0 and spec.swizzle and not spec.prefetch
    # pieces of >= ceil(5000 / 4224) = 2: 2000 / 2 = 1000 -> capped at 16
    assert spec.ksplit == 16 and "the longest row has 2000)" in why
    spec, why = sput.choose(st, Request("spmm", n=128), piece=500)
    assert (spec.piece, spec.ksplit, spec.budget) == (500, 4, 0)
    assert "each row split over the fewest row groups (a power of two, up to 4) that leave each <= 500 nonzeros" in why
    spec, _ = sput.choose(st, Request("spmm", n=128), balance=0)
    assert spec.budget == 0 and spec.piece == 0
    spec, _ = sput.choose(st, Request("spmm", n=128, dtype="float16"))
    assert spec.budget == 0  # float16 splits alike


@pytest.mark.parametrize("m, mean, longest, balanced", [
    (4223, 50.0, 2000, True), (4224, 50.0, 2000, False),  # fewer rows than the 4224 groups a column tile may take
    (100, 300.0, 600, True), (100, 300.0, 599, False),  # the longest row at least twice the mean
    (100, 100.0, 513, True), (100, 100.0, 512, False),  # and longer than a chunk x the alike split (32 x 16)
])
def test_sputnik_choose_splits_per_row_on_both_sides_of_each_skew_bound(m, mean, longest, balanced):
    # fp32, n 128: one column tile of 32 threads; 132 SMs x 32 warps = 4224 row groups a tile
    spec, why = sput.choose(sput_stats(m, 4096, mean, cov=3.0, longest=longest), Request("spmm", n=128))
    assert spec.budget == (4224 if balanced else 0)
    assert ("each row split over the fewest row groups" in why) is balanced


def test_sputnik_choose_reason_names_a_split_from_two_groups():
    # 2000 rows at n 128: 2 x 2000 warps stay within 4224, 4 x 2000 do not: 2 groups a row, said so
    spec, why = sput.choose(sput_stats(2000, 4096, 50.0), Request("spmm", n=128))
    assert spec.ksplit == 2
    assert why == ("rows avg 50.0 nnz (CoV 0.05), n=128: 4-wide loads, 32 threads x 128 columns per row group (1 tile), "
                   "2 groups per row (2000 rows alone give 2000 warps; split while the grid stays within 4224 for 132 "
                   "SMs); 32-nonzero chunks by 1-wide loads, 16 loads of X in flight; 32-bit indices pre-scaled by n; "
                   "rows in order")
    # 5000 rows: unsplit, and the reason has no split in it
    spec, why = sput.choose(sput_stats(5000, 4096, 50.0), Request("spmm", n=128))
    assert spec.ksplit == 1
    assert why == ("rows avg 50.0 nnz (CoV 0.05), n=128: 4-wide loads, 32 threads x 128 columns per row group (1 tile); "
                   "32-nonzero chunks by 1-wide loads, 16 loads of X in flight; 32-bit indices pre-scaled by n; rows "
                   "in order")


def test_sputnik_choose_indices_and_prefetch():
    spec, why = sput.choose(sput_stats(5000, 32767, 10.0), Request("spmm", n=32, dtype="float16"))
    assert (spec.index_bits, spec.prescaled, spec.prefetch) == (16, False, False) and "16-bit indices; " in why
    spec, _ = sput.choose(sput_stats(5000, 32768, 10.0), Request("spmm", n=32, dtype="float16"))
    assert (spec.index_bits, spec.prescaled) == (32, True)
    spec, why = sput.choose(sput_stats(5000, 2**21, 10.0), Request("spmm", n=1024))  # k n = 2**31: 64-bit offsets
    assert (spec.wide, spec.prescaled) == (True, False)
    spec, _ = sput.choose(sput_stats(5000, 2**21 - 1, 10.0), Request("spmm", n=1024))
    assert (spec.wide, spec.prescaled) == (False, True)
    spec, why = sput.choose(sput_stats(50000, 4096, 10.0), Request("spmm", n=32))
    assert spec.prefetch and "; the next chunk loaded while this one computes" in why
    assert not sput.choose(sput_stats(50000, 4096, 10.0), Request("spmm", n=33))[0].prefetch
    assert not sput.choose(sput_stats(50000, 4096, 10.0), Request("spmm", n=32), prefetch=False)[0].prefetch
    spec, why = sput.choose(sput_stats(50000, 4096, 10.0, cov=0.11), Request("spmm", n=32))
    assert spec.swizzle and why.endswith("rows swizzled longest first")
    assert not sput.choose(sput_stats(50000, 4096, 10.0, cov=0.1), Request("spmm", n=32))[0].swizzle


def test_sputnik_choose_overrides():
    st = sput_stats(5000, 4096, 10.0)
    spec, _ = sput.choose(st, Request("spmm", n=128), ksplit=4, tile_bytes=256, chunk=128, batch=4, block=64)
    assert (spec.ksplit, spec.width, spec.vec, spec.chunk, spec.batch, spec.rows) == (4, 16, 4, 128, 4, 1)
    assert spec.sv == 4  # min(4, 128 // 16)


@pytest.mark.parametrize("options, reason", [
    (dict(ksplit=3), "options ksplit=3: expected 1, 2, 4, 8 or 16"),
    (dict(tile_bytes=8), "options tile_bytes=8: expected a power of two from 16 to 512"),
    (dict(chunk=16), "options chunk=16: expected 32, 64 or 128"),
    (dict(batch=2), "options batch=2: expected 4, 8, 16 or 32"),
    (dict(block=1024), "options block=1024: expected a power of two from 32 to 512"),
    (dict(balance=2), "options balance=2: expected 0 (every row split alike) or 1 (split per row)"),
    (dict(piece=0), "options piece=0: expected nonzeros per row group, 1 to 1048576"),
    (dict(piece=2**20 + 1), "options piece=1048577: expected nonzeros per row group, 1 to 1048576"),
    (dict(piece=True), "options piece=True: expected nonzeros per row group, 1 to 1048576"),
    (dict(piece=2.0), "options piece=2.0: expected nonzeros per row group, 1 to 1048576"),
    (dict(piece=64, balance=0), "options piece with balance=0: a piece size splits rows per row"),
    (dict(prefetch=2), "options prefetch=2: expected 0 or 1 (load the next chunk while this one computes)"),
])
def test_sputnik_options_checked(options, reason):
    assert sput._rule(sput_stats(5000, 4096, 200.0), req(n=128, **options)).reason == reason


def test_sputnik_options_taken():
    st = sput_stats(5000, 4096, 200.0)
    for options in (dict(ksplit=1), dict(ksplit=16), dict(tile_bytes=16), dict(tile_bytes=512), dict(chunk=32),
                    dict(chunk=128), dict(batch=4), dict(batch=32), dict(block=32), dict(block=512), dict(balance=0),
                    dict(balance=1), dict(piece=1), dict(piece=2**20), dict(piece=64, balance=1), dict(prefetch=0),
                    dict(prefetch=1), dict(prefetch=True)):
        assert sput._rule(st, req(n=128, **options)).accepted, options
    assert sput._rule(st, Request("spmm", n=128, dtype="bfloat16")).reason == "dtype bfloat16 not in float32/float16"
    big = SimpleNamespace(shape=(4, 4), nnz=2**31 - 8, row_lengths=st.row_lengths)
    assert sput._rule(big, req(n=128)).reason == "matrix needs 64-bit indices"


def test_sputnik_measured_region_on_both_sides():
    # float32: n >= 128, or rows of >= 128 split over row groups
    assert sput._rule(sput_stats(5000, 4096, 10.0), req(n=128)).accepted
    d = sput._rule(sput_stats(50000, 4096, 10.0), req(n=127))
    assert d.reason == ("n=127, rows avg 10.0 nnz, 1 row group(s) per row: outside n >= 128, or rows >= 128 split over "
                        "row groups (too few rows to fill the GPU), where it was measured faster than csr_rowsplit")
    assert sput._rule(sput_stats(100, 4096, 128.0), req(n=32)).accepted  # split: 100 rows give too few warps
    assert not sput._rule(sput_stats(100, 4096, 127.9), req(n=32)).accepted
    assert not sput._rule(sput_stats(50000, 4096, 128.0), req(n=32)).accepted  # unsplit rows
    # float16: n >= 128 and rows >= 128
    assert sput._rule(sput_stats(5000, 4096, 128.0), req(n=128, dtype="float16")).accepted
    d = sput._rule(sput_stats(5000, 4096, 127.9), req(n=128, dtype="float16"))
    assert d.reason.endswith("outside n >= 128 with rows >= 128 (float16), where it was measured faster than "
                             "csr_rowsplit")
    assert not sput._rule(sput_stats(5000, 4096, 128.0), req(n=127, dtype="float16")).accepted
    assert sput._rule(sput_stats(5000, 4096, 10.0), req(n=32, family="sputnik_spmm")).accepted
    # float32 at n 32 (8-thread groups, 4 a warp): rows of 128 split in two while 2 x m / 4 warps stay within 4224
    for m, split in ((5000, 2), (8448, 2), (8449, 1)):
        d = sput._rule(sput_stats(m, 4096, 128.0), req(n=32))
        assert d.accepted is (split == 2) and (d.spec is None or d.spec.ksplit == split), m


def test_sputnik_index_slack_of_a_whole_vector():
    # indices and values are padded by up to 8 entries: nnz + 8 must stay under 2**31
    rl = sput_stats(5000, 4096, 200.0).row_lengths
    assert sput._rule(SimpleNamespace(shape=(4, 4), nnz=2**31 - 9, row_lengths=rl), req(n=128)).accepted
    assert sput._rule(SimpleNamespace(shape=(4, 4), nnz=2**31 - 8, row_lengths=rl), req(n=128)).reason == (
        "matrix needs 64-bit indices")


# ============================================================================ tiled_csl_spmm.py

from sparsegen.families import tiled_csl_spmm as csl  # noqa: E402


def test_csl_ring_for_by_hand():
    # 128-row tiles, bn 32, 16 k-tiles a split: W buffers 2 (16384 + 128) + 4 x 17 offsets = 33092 bytes; a slot
    # of 600 uint4 is 4096 + 9600 = 13696 bytes; 96 registers allow 5 blocks, at most 4. Four blocks: 57088 bytes
    # each, too few for 3 slots (74180); three: 76544, enough, and 3 slots keep 48 KB moving
    assert csl.ring_for(128, 32, 600, 16, half()) == (3, 3, 600)
    # 1000 uint4 a slot (20096 bytes): two blocks of 3 slots
    assert csl.ring_for(128, 32, 1000, 16, half()) == (2, 3, 1000)
    # stages=6 asked: two blocks hold 33092 + 6 x 13696 = 115268 of 115456
    assert csl.ring_for(128, 32, 600, 16, half(stages=6)) == (2, 6, 600)
    assert csl.ring_for(128, 32, 600, 16, half(stages=2)) == (3, 3, 600)  # never under 3 slots
    # blocks=1 asked: one block, 5 slots (49152 / 13696 -> 4, plus the one computed)
    assert csl.ring_for(128, 32, 600, 16, half(blocks=1)) == (1, 5, 600)
    # wgmma keeps a slot one tile longer: at least 4, so two blocks
    assert csl.ring_for(128, 32, 600, 16, half(wgmma=True)) == (2, 4, 600)


def test_csl_ring_for_fits_the_tile_offsets_to_the_byte():
    # 105 uint4 a slot: 4096 + 1680 bytes, 46 rows of 128 = 5888; 96 registers a thread allow 5 blocks, at most 4.
    # Four blocks have 233472 / 4 - 1024 - 256 = 57088 bytes each and want ceil(49152 / (4 x 5888)) + 1 = 4 slots.
    # 127 k-tiles a split: W buffers 33024 + 4 x 128 offsets = 33536, + 4 x 5888 = 57088 exactly: four blocks.
    # 128 k-tiles: 4 bytes more, three blocks (4 slots in 76544)
    assert csl.ring_for(128, 32, 105, 127, half()) == (4, 4, 105)
    assert csl.ring_for(128, 32, 105, 128, half()) == (3, 4, 105)


def test_csl_ring_for_a_slot_of_one_vector_at_least():
    # a matrix without nonzeros: its slots still hold one uint4 of words
    assert csl.ring_for(128, 32, 0, 16, half()) == (4, 4, 1)


def test_csl_ring_for_caps_a_slot_at_what_fits():
    # a fuller tile than one slot of the deepest ring holds: the rest comes from global
    blocks, stages, vectors = csl.ring_for(128, 64, 20000, 16, half(64))
    one_block = 233472 - 1024 - 256  # an SM's shared memory less the driver's and the static reserve
    slot_room = (one_block - (2 * (16384 + 128) + 68)) // stages // 128 * 128
    assert blocks == 1 and vectors == (slot_room - 64 * 64 * 2) // 16 < 20000


def test_csl_choose_reason():
    st = SimpleNamespace(shape=(4096, 8192), density=0.3, nnz=int(4096 * 8192 * 0.3),
                         tiles=SimpleNamespace(max_nnz=2400, tile_rows=128, tile_cols=64, tiles=32 * 128,
                                               nonempty=32 * 128, density_hist=(0, 0, 0, 32 * 128) + (0,) * 6,
                                               density_means=(0.0, 0.0, 0.0, 0.3) + (0.0,) * 6))
    spec, why = csl.choose(st, half(), 1e-4)
    assert (spec.tile_m, spec.bn, spec.split_k, spec.reduction, spec.min_blocks, spec.stages) == (128, 32, 8,
                                                                                                 "atomic", 3, 3)
    assert why.startswith("density 0.30: Tiled-CSL 1.20 B/element (1.20 for values + positions); 128x64 tiles, 32 "
                          "columns per block (1 column tile), 3-slot cp.async ring, 3 blocks per SM; 32 output tiles "
                          "x split-K 8")
    spec, why = csl.choose(st, half(strict_banks=True, warp_k=2), 1e-4)
    assert spec.strict_banks and spec.warp_k == 2
    assert "; warps in 2 k-groups (each loads 1/2 of the X fragments)" in why
    assert why.endswith("; strictly bank-conflict-free scatter (padded banks)")


def csl_stats(m, k, max_nnz, density=0.3):
    tiles = -(-m // 128) * -(-k // 64)
    return SimpleNamespace(shape=(m, k), density=density, nnz=int(m * k * density),
                           tiles=SimpleNamespace(max_nnz=max_nnz, tile_rows=128, tile_cols=64, tiles=tiles,
                                                 nonempty=tiles, density_hist=(0, 0, 0, tiles) + (0,) * 6,
                                                 density_means=(0.0, 0.0, 0.0, density) + (0.0,) * 6))


def csl_choice(m, k, max_nnz, request):
    spec, why = csl.choose(csl_stats(m, k, max_nnz), request, 1e-4)
    return (spec.tile_m, spec.split_k, spec.reduction, spec.min_blocks, spec.stages, spec.grid), why


def test_csl_choose_estimates_residency_with_every_k_tile_of_128_row_tiles():
    # 100 x 16384, tiles of at most 1000 nonzeros (250 uint4: 8192-byte slots). The split-K rule is told the
    # residency of 128-row tiles walking all 256 k-tiles: 33024 + 4 x 257 = 34052 bytes of W buffers and offsets,
    # too many for four blocks (34052 + 3 x 8192 > 57088), three; the 64-row tiles then chosen walk 4 k-tiles a
    # split and fit four
    got, why = csl_choice(100, 16384, 1000, half())
    assert got == (64, 64, "atomic", 4, 3, 0)
    assert why.endswith("3-slot cp.async ring, 4 blocks per SM; 2 output tiles x split-K 64 (4 of 256 k-tiles each, "
                        "target 16) = 128 blocks for 132 SMs x 3 resident; reduce through in-kernel fp32 atomics, the "
                        "last block of each tile finishes (~0.6 us; measured faster than a cluster for narrow blocks)")


def test_csl_choose_slot_from_the_fullest_tile_in_uint4():
    # 8 columns, 64-row tiles of at most 1000 / 4 / 2 = 125 uint4: 1024 + 2000 bytes, 3072; four blocks want
    # ceil(49152 / 12288) + 1 = 5 slots
    got, why = csl_choice(100, 256, 1000, half(8))
    assert got == (64, 1, "none", 4, 5, 0) and "; 64x64 tiles, 8 columns per block (1 column tile), 5-slot " in why
    # 128-row tiles at n 16 with 250 uint4 (2048 + 4000 bytes, 6144): 4 blocks of 3 slots
    assert csl_choice(1024, 256, 1000, half(16))[0] == (128, 1, "none", 4, 3, 0)


def test_csl_choose_64_row_tiles_for_eight_warps_in_two_k_groups():
    got, why = csl_choice(100, 8192, 2400, half(warps=8, warp_k=2))
    assert got[0] == 64 and "; warps in 2 k-groups (each loads 1/2 of the X fragments); " in why


def test_csl_choose_sizes_a_stream_k_block_by_its_share_of_the_tile_products():
    # 8 m-tiles x 1024 k-tiles past one wave: stream-K. A block's offsets cover its share of the 8192 tile
    # products at one block an SM (ceil(8192 / 132) = 63 k-tiles), not the 1024 of a split: four blocks of 4
    # slots, 132 x 4 = 528 of them
    got, why = csl_choice(1024, 65536, 256, half())
    assert got == (128, 1, "stream", 4, 4, 528) and "8 output tiles x split-K 64 would be 512 blocks" in why


def test_csl_choose_sizes_a_block_by_its_k_tiles_rounded_up():
    # split_k 8 of 252 k-tiles: 32 a block (31.5 rounded up), 33024 + 4 x 33 = 33156 bytes; 2592 nonzeros are 648
    # uint4, a slot of 4096 + 10368 = 14464 bytes: three blocks of 3 slots would need 33156 + 43392 = 76548 of
    # 76544, so two
    got, _ = csl_choice(4096, 252 * 64, 2592, half(split_k=8))
    assert got[:5] == (128, 8, "cluster", 2, 3)


def test_csl_choose_defaults_off():
    spec, why = csl.choose(csl_stats(4096, 8192, 2400), half(), 1e-4)
    assert (spec.strict_banks, spec.l2_prefetch, spec.wgmma) == (False, False, False) and "strictly" not in why
    spec, _ = csl.choose(csl_stats(4096, 8192, 2400), half(l2_prefetch=True), 1e-4)
    assert spec.l2_prefetch is True


# ========================================================================= tiled_bitmap_spmm.py

def test_bitmap_ring_for_by_hand():
    # a stage of 128-row tiles, bn 32, 2400 values: 1024 bitmap + 32 offsets + 4864 values + 4096 X = 10016 bytes;
    # 128 registers allow 4 blocks: 3 stages of 4 blocks keep 48 KB moving in 57088 bytes each
    assert bitmap.ring_for(128, 32, 2400, half()) == (4, 3)
    # register pairs halve the bitmap and double the values: 512 + 32 + 9600 + 4096 = 14240
    assert bitmap.ring_for(128, 32, 2400, half(), granule=2) == (4, 3)
    assert bitmap.ring_for(128, 32, 2400, half(stages=2)) == (4, 2)  # 2 slots when asked (Tiled-CSL: never)
    assert bitmap.ring_for(128, 32, 2400, half(blocks=2)) == (2, 4)
    assert bitmap.ring_for(128, 32, 2400, half(), blocks=1) == (1, 6)


def test_bitmap_ring_for_fills_the_budget_to_the_byte():
    # 8-warp blocks, 2496 values: 1024 bitmap + 64 offsets + 4992 values + 8192 X = 14272 bytes a stage; four
    # blocks (asked) of 4 stages (asked) take 4 x 14272 = 57088, the budget of four exactly; 2504 values (one
    # more 128-byte row): three
    assert bitmap.stage_bytes(128, 64, 2496, 8) == 14272
    assert bitmap.ring_for(128, 64, 2496, half(64, warps=8, blocks=4, stages=4), warps=8) == (4, 4)
    assert bitmap.ring_for(128, 64, 2504, half(64, warps=8, blocks=4, stages=4), warps=8) == (3, 4)


def bitmap_choice(m, k, max_nnz, density, request):
    spec, why = bitmap.choose(csl_stats(m, k, max_nnz, density), request, 1e-4)
    assert spec.warp_k == 1 and spec.granule == bitmap.request_granule(request)
    return (spec.tile_m, spec.split_k, spec.reduction, spec.min_blocks, spec.stages), why


@pytest.mark.parametrize("m, max_nnz, density, request_, choice", [
    # n 64, a dense 128 x 64 tile among 30 % ones: 8192 values of 2 bytes, a stage of 1024 + 32 + 16384 + 8192 =
    # 25632 bytes; 168 registers allow 3 blocks, but 3 x 3 stages (76896) pass 76544: 2 blocks of 3
    (4096, 8192, 0.3, half(64), (128, 8, "two_step", 2, 3)),
    # register pairs: that tile fills 8192 x (1 - 0.3 / 2) = 6963.2 -> 6968 registers of 4 bytes: 512 + 32 +
    # 27904 + 8192 = 36640 bytes a stage, 2 blocks of 3 (109920 of 115456)
    (4096, 8192, 0.3, half(64, granule=2), (128, 8, "two_step", 2, 3)),
    (4096, 8192, 0.9, half(64, granule=2), (128, 8, "two_step", 2, 3)),  # 8192 x 0.55 = 4505.6 -> 4512
    (4096, 8192, 0.9, half(32, granule=2), (128, 8, "atomic", 3, 3)),
    # 16 columns in 64-row tiles, split_k asked (the cost model's split): up to 6 blocks of 4 warps
    (4096, 8192, 0.3, half(16, split_k=4), (64, 4, "cluster", 6, 3)),
    (4096, 8192, 0.3, half(32, split_k=4), (64, 4, "cluster", 4, 3)),
    # wgmma with stages=2 asked: at least 3
    (4096, 8192, 0.3, half(64, stages=2, wgmma=True), (128, 8, "two_step", 2, 3)),
    (28672, 2400, 0.3, half(32, split_k=4), (128, 4, "cluster", 4, 3)),
    (4096, 2992, 0.3, half(64, granule=2), (128, 16, "two_step", 4, 3)),
])
def test_bitmap_choose_by_the_fullest_tile(m, max_nnz, density, request_, choice):
    assert bitmap_choice(m, 8192, max_nnz, density, request_)[0] == choice


def test_bitmap_choose_one_block_more_than_registers_allow_for_wide_blocks():
    # n 64, 2400 values: 1024 + 32 + 4864 + 8192 = 14112 bytes a stage. 168 registers allow 3 blocks; a fourth
    # fits 57088 with 3 stages (42336), and the split model takes it
    choice, why = bitmap_choice(4096, 8192, 2400, 0.3, half(64))
    assert choice == (128, 16, "two_step", 4, 3)
    assert why.startswith("4 blocks per SM; 32 output tiles x split-K 16 = 512 blocks for 132 SMs x 4 resident (one "
                          "more than registers would allow unasked: ptxas is held to 128); ")
    # not for 8-warp blocks, nor when blocks= or wgmma is asked
    choice, why = bitmap_choice(4096, 8192, 8192, 0.3, half(64, warps=8))
    assert choice == (128, 4, "two_step", 1, 3) and "one more" not in why
    for request_ in (half(64, blocks=3), half(64, wgmma=True)):
        choice, why = bitmap_choice(4096, 8192, 2400, 0.3, request_)
        assert choice[3] == 3 and "one more" not in why, request_.options


@pytest.mark.parametrize("max_nnz", [4000, 6000])
def test_bitmap_choose_tells_the_split_the_residency_of_128_row_tiles(max_nnz):
    # n 16: 128-row tiles take 56 + 4 x 2 x 2 + 8 + 4 + 4 = 88 registers, room for 5 blocks (6 are allowed).
    # 4000 values: 1024 + 32 + 8064 + 2048 = 11168 bytes a stage; 6000: 15136, and 3 stages of 5 blocks take
    # 45408 of 233472 / 5 - 1280 = 45414. Five resident either way
    choice, why = bitmap_choice(4096, 8192, max_nnz, 0.3, half(16))
    assert choice == (128, 8, "atomic", 5, 3)
    assert why.startswith("5 blocks per SM; 32 output tiles x split-K 8 (16 of 128 k-tiles each, target 16) = 256 "
                          "blocks for 132 SMs x 5 resident; ")
