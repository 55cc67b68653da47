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
    assert d.reason == "minibatch must be a multiple of 4 (float4 shared-memory reads)"
    d = spdnn._rule(st, Request("spdnn_layer", options=(("minibatch", 12),)))
    assert d.accepted and d.spec.minibatch == 12
    d = spdnn._rule(st, Request("spdnn_layer"))
    assert d.accepted and d.spec.minibatch == 16


def test_spdnn_choose_by_hand():
    dev = D.default()  # 232448 bytes a block may opt in to, 2048 threads an SM
    spec, why = spdnn.choose(SimpleNamespace(shape=(1024, 512)), Request("spdnn_layer", device=dev))
    # 1024 outputs: one 1024-thread block an SM, all its shared memory; minibatch 16 -> stride 20 floats
    assert (spec.neurons_in, spec.neurons_out, spec.block, spec.minibatch, spec.stride) == (512, 1024, 1024, 16, 20)
    assert spec.buf == 232448 // 1 // 80 == 2905 and spec.index_bits == 16
    assert (spec.width, spec.nbuf, spec.value, spec.bias, spec.cap, spec.bias_rule) == (0, 0, None, 0.0, None,
                                                                                        "nonzero")
    assert why == ("1024 output neurons in tiles of 1024; minibatch 16 in registers; footprint buffers of up to 2905 "
                   "slots (20 floats each) in shared memory, so slot indices fit 16 bits")
    spec, _ = spdnn.choose(SimpleNamespace(shape=(100, 512)), Request(
        "spdnn_layer", device=dev, options=(("bias", -0.3), ("bias_rule", "all"), ("cap", 32.0), ("minibatch", 12))))
    # 100 outputs -> 128 threads; 2048 // 128 = 16 blocks an SM share the shared memory; stride 12 (12 // 4 odd)
    assert (spec.block, spec.stride, spec.buf) == (128, 12, 232448 // 16 // 48)
    assert (spec.bias, spec.cap, spec.bias_rule) == (-0.3, 32.0, "all")
    spec, _ = spdnn.choose(SimpleNamespace(shape=(100, 512)), Request("spdnn_layer", device=dev,
                                                                      options=(("block", 1023),)))
    assert spec.block == 1023 and spec.buf == 232448 // 2 // 80  # under 1024 threads: 2048 // 1023 = 2 blocks
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
    assert rowsplit._rule(st, req(n=8, unroll=3)).reason == ("option unroll=3: expected 1, 2, 4 or 8 (chunks loaded "
                                                              "per step)")
    assert rowsplit._rule(st, req(n=8, block=96)).reason == ("option block=96: expected a power of two from 32 to "
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
    (dict(tile_m=96), "option tile_m=96: expected one of 128, 64, 32"),
    (dict(slice_k=24), "option slice_k=24: expected 8, 16, 32 or 64"),
    (dict(stages=5), "option stages=5: expected 2, 3 or 4"),
    (dict(min_blocks=3), "option min_blocks=3: expected 1, 2, 4 or 8 (resident blocks per SM asked of nvcc)"),
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


@pytest.mark.parametrize("chunks, blocks, slots, splits", [(32, 8, 396, 32), (32, 8, 100, 12), (32, 400, 396, 1),
                                                           (32, 0, 10, 10), (1, 1, 100, 1)])
def test_panel_choose_splits(chunks, blocks, slots, splits):
    assert panel.choose_splits(chunks, blocks, slots) == splits
