"""`dense_tile_spmm` on the CPU: spec and split choice, the rule and the fp32 cost model's third line,
the generated source, the emulator; and that the source compiles (nvcc tier)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.families import dense_tile_spmm as fam
from sparsegen.families import spec_from_dict
from sparsegen.families.base import Request
from sparsegen.render import render
from sparsegen.select import fp32_cost, rule_decision, select
from sparsegen.select.device import default as default_device

from .helpers import TOL, random_csr, reference, rel_error, term_error, without_tensor_cores

FORCED = ("family", fam.FAMILY)


def decide(a, n=128, dtype="float32", op="spmm", forced=True, **options):
    opts = dict(options, **({FORCED[0]: FORCED[1]} if forced else {}))
    return rule_decision(analyze(a), Request(op, n=n, dtype=dtype, options=tuple(sorted(opts.items()))), fam.FAMILY)


def spec_for(a, n=128, **options):
    d = decide(a, n, **options)
    assert d.spec is not None, d.reason
    return d.spec


# ---- spec, split, rule ---------------------------------------------------------------------------

def test_name_spells_every_field_and_the_dict_round_trips():
    spec = spec_for(random_csr(512, 2048, 0.3, seed=1), 128)
    assert spec.name == "dense_tile_spmm.f32.m512k2048n128.t64x64.s32x3.sk16.mb3"
    assert spec_from_dict(spec.to_dict()) == spec
    assert (spec.threads, spec.slices, spec.slices_per_split, spec.tiles) == (128, 64, 4, 16)


def test_k_is_split_to_fill_one_wave_with_enough_slices_each():
    wave = 132 * 3  # 128-thread blocks, 3 resident
    assert fam.choose_split(512, 128, 64, 64, 64, wave, 132) == 16  # 16 tiles: 396 // 16 = 24, 64 slices // 4 = 16
    assert fam.choose_split(256, 32, 64, 64, 72, wave, 132) == 18  # 4 tiles: 72 slices // 4
    assert fam.choose_split(2048, 256, 64, 64, 16, wave, 132) == 1  # 128 tiles, K = 512: splits of < 16 slices
    assert fam.choose_split(2048, 256, 64, 64, 64, wave, 132) == 3  # ... K = 2048: 3 splits of 22
    assert fam.choose_split(2048, 128, 64, 64, 16, wave, 132) == 4  # 64 tiles, half the SMs: 4 slices a split do
    assert fam.choose_split(8192, 1024, 64, 64, 256, wave, 132) == 1  # a full wave of tiles


def test_options_win_and_a_split_never_goes_without_slices():
    a = random_csr(300, 516, 0.3, seed=2)
    assert spec_for(a, 66, split_k=1).split_k == 1
    assert spec_for(a, 66, split_k=1000).split_k == spec_for(a, 66, split_k=1000).slices == 17
    assert spec_for(a, 66, split_k=7).slices_per_split * (spec_for(a, 66, split_k=7).split_k - 1) < 17
    s = spec_for(a, 66, tile_m=128, tile_n=128, min_blocks=1, stages=2)
    assert (s.tile_m, s.tile_n, s.threads, s.min_blocks, s.stages) == (128, 128, 512, 1, 2)


@pytest.mark.parametrize("request_,needle", [
    (dict(dtype="float16"), "float32 only"),
    (dict(op="sddmm"), "is not spmm"),
    (dict(tile_m=96), "options tile_m=96: expected one of 64, 128"),
    (dict(split_k=0), "options split_k=0: expected a positive integer"),
    (dict(stages=5), "options stages=5: expected 2, 3 or 4"),
    (dict(out="float16"), "Y is float32"),
])
def test_rule_declines_what_it_cannot_serve(request_, needle):
    d = decide(random_csr(64, 64, 0.3, seed=3), **request_)
    assert d.spec is None and needle in d.reason


def test_grid_limits_decline_or_clamp():
    import scipy.sparse as sp

    tall = sp.csr_matrix((np.ones(3, np.float32), ([0, 1, 8_399_999], [0, 1, 2])), shape=(8_400_000, 3))
    d = decide(tall, 8)  # 65,625 row tiles of 128
    assert d.spec is None and "past the grid's 65535 in y" in d.reason
    long_k = random_csr(8, 2_200_000, 2e-6, seed=9)  # 68,750 slices
    assert spec_for(long_k, 8, split_k=100_000).split_k <= fam.MAX_GRID_YZ


def test_cost_model_takes_tensor_cores_only_where_dense_and_ahead():
    rates = default_device().rates

    def judge(stats, n):
        return fp32_cost.judge(stats, n, rates)

    half = analyze(random_csr(1024, 1024, 0.5, seed=20))
    v = judge(half, 256)
    assert v.pick == "tensor" and v.tensor_s * rates.fp32.tensor_margin < min(v.sparse_s, v.dense_s)
    sparse = analyze(random_csr(512, 2048, 0.05, seed=21))  # 95 %: the CSR kernels
    assert judge(sparse, 128).pick == "sparse"
    tiny = analyze(random_csr(64, 64, 0.5, seed=22))  # a small layer: the CSR kernels' shorter launch
    assert judge(tiny, 8).pick == "sparse"
    below = analyze(random_csr(8192, 8192, 0.14, seed=23))  # 3xTF32's slope crosses the CSR line's at 14.6 %
    assert judge(below, 128).pick == "sparse" and judge(below, 128).tensor_mma == "3xTF32"
    v = judge(below, 1024)  # 3xFP16 (n >= 256, >= 1 GFLOP) crosses at 11.5 %
    assert v.pick == "tensor" and v.tensor_mma == "3xFP16" and "3xFP16 tensor cores" in v.text
    assert judge(analyze(random_csr(8192, 8192, 0.10, seed=23)), 1024).pick == "sparse"


def test_default_selection_and_its_reason():
    sel = select(analyze(random_csr(512, 2048, 0.3, seed=7)), op="spmm", n=128)
    assert sel.spec.family == fam.FAMILY
    assert sel.reason.startswith("tensor cores predicted fastest: CSR kernels")
    assert "3xTF32 tensor cores" in sel.reason and "K split 16 ways" in sel.reason
    layer = analyze(random_csr(512, 2048, 0.3, seed=7))
    assert select(layer, op="spmm", n=128, dtype="float16").spec.family != fam.FAMILY
    assert select(analyze(random_csr(512, 2048, 0.02, seed=7)), op="spmm", n=128).spec.family != fam.FAMILY


# ---- generated source --------------------------------------------------------------------------

def test_source_names_the_constants_and_the_split_k_finish():
    split = render(spec_for(random_csr(512, 2048, 0.3, seed=1), 128))
    for text in ("constexpr int M = 512;", "constexpr int K = 2048;", "constexpr int N = 128;",
                 "constexpr int SPLIT_K = 16;", "constexpr int FINISH_VEC = N % 4 == 0 ? 4 : 1;",
                 "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "arrives_last(counters + tile, 1, SPLIT_K)",
                 "atomicAdd(counter, count) + count == total",
                 "float* __restrict__ workspace, int* __restrict__ counters"):
        assert text in split, text
    whole = render(spec_for(random_csr(4096, 512, 0.3, seed=1), 1024))
    assert "constexpr int SPLIT_K = 1;" in whole and "workspace" not in whole.split("dense_tile_spmm(")[-1]
    assert "float2*>(y + " in whole  # N even: pairs


def test_source_fuses_bias_and_relu():
    a = random_csr(100, 37, 0.3, seed=4)
    spec = fam.choose(analyze(a), Request("spmm", n=13, bias=True, relu=True))[0]
    src = render(spec)
    assert "v += __ldg(bias + row);" in src and "v = fmaxf(v, 0.0f);" in src
    assert "const float* __restrict__ bias" in src
    assert "y[static_cast<size_t>(row) * N + col + 1] = v1;" in src  # odd N: single stores
    plain = render(fam.choose(analyze(a), Request("spmm", n=13))[0])
    assert "__ldg(bias" not in plain and "fmaxf" not in plain


def test_plan_holds_w_densified_and_the_scratch_sizes():
    a = random_csr(300, 516, 0.3, seed=5)
    k = sparsegen.compile(a, op="spmm", n=66, backend="emulate", options={"family": fam.FAMILY})
    assert np.array_equal(k.plan.arrays["w"], a.toarray())
    c = k.plan.constants
    assert k.spec.split_k > 1 and c["workspace_bytes"] == 4 * 300 * 66 and c["counters_bytes"] == 4 * k.spec.tiles
    one = sparsegen.compile(a, op="spmm", n=66, backend="emulate", options={"family": fam.FAMILY, "split_k": 1})
    assert one.plan.constants["workspace_bytes"] == 0 and [x.kind for x in fam.arguments(one.spec)] == \
        ["plan", "input", "output"]


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 150), k=st.integers(1, 150), n=st.integers(1, 70), density=st.floats(0, 1),
       epilogue=st.booleans(), seed=st.integers(0, 1000), mma=st.sampled_from(fam.MMAS))
def test_emulator_matches_scipy(m, k, n, density, epilogue, seed, mma):
    a = random_csr(m, k, density, seed=seed)
    bias = np.linspace(-1, 1, m) if epilogue else None
    kernel = sparsegen.compile(a, op="spmm", n=n, bias=bias, relu=epilogue, backend="emulate",
                               options={"family": fam.FAMILY, "mma": mma})
    x = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    y, ref = kernel(x), reference(a, x, bias, epilogue)
    # f16x3 emulates the kernel's split: ~22 bits per product, held to the terms' magnitudes
    assert rel_error(y, ref) <= TOL["float32"] or term_error(y, ref, a, x, bias) <= 1e-6


def test_taken_where_panel_spmm_would_serve_narrow_n(monkeypatch):
    layer = analyze(random_csr(512, 4608, 0.2, seed=14))  # DLMC rn50 bottleneck: the CSR line says CSR
    sel = select(layer, op="spmm", n=32)
    assert sel.spec.family == fam.FAMILY and "where panel_spmm would serve n <= 128" in sel.reason
    assert any(r == "panel_spmm" for r, _, _ in sel.candidates)
    assert select(analyze(random_csr(512, 4608, 0.1, seed=14)), op="spmm", n=32).spec.family == "sputnik_spmm"
    without_tensor_cores(monkeypatch)
    assert select(layer, op="spmm", n=32).spec.family == "panel_spmm"


# ---- 3xFP16 --------------------------------------------------------------------------------------

def test_f16x3_taken_for_big_products_at_wide_n_only():
    big = random_csr(2048, 2048, 0.3, seed=11)  # 2 m k n = 2.1 GFLOP at n = 256
    s = spec_for(big, 256)
    assert (s.mma, s.tile_m, s.tile_n, s.threads, s.min_blocks) == ("f16x3", 128, 64, 256, 2)
    assert s.name.endswith(".mb2.h3") and "3xFP16" in decide(big, 256).reason
    assert spec_for(big, 128).mma == "tf32x3"  # n < 256
    assert spec_for(random_csr(512, 2048, 0.3, seed=11), 256).mma == "tf32x3"  # 0.54 GFLOP
    assert spec_for(random_csr(512, 2048, 0.3, seed=11), 512).mma == "f16x3"  # 1.07 GFLOP
    assert spec_for(big, 128, mma="f16x3").mma == "f16x3" and spec_for(big, 256, mma="tf32x3").tile_m == 64
    d = decide(big, 256, mma="f32")
    assert d.spec is None and "options mma='f32': expected one of tf32x3, f16x3" in d.reason
    d = decide(big, 256, mma="f16x3", stages=2)
    assert d.spec is None and "a slice ahead" in d.reason


def test_f16x3_encoding_scales_rows_and_splits_them_exactly():
    rng = np.random.default_rng(12)
    a = random_csr(40, 37, 0.5, seed=12, empty_rows=0.2)
    a.data *= np.exp2(rng.integers(-60, 60, a.nnz)).astype(np.float32)
    k = sparsegen.compile(a, op="spmm", n=300, backend="emulate", options={"family": fam.FAMILY, "mma": "f16x3"})
    arrays = k.plan.arrays
    assert arrays["w_hi"].shape == arrays["w_lo"].shape == (40, 40) and arrays["w_hi"].dtype == np.uint16
    assert not arrays["w_hi"][:, 37:].any()  # K padded to 16-byte copies with zeros
    hi = arrays["w_hi"].view(np.float16).astype(np.float64)
    lo = arrays["w_lo"].view(np.float16).astype(np.float64)
    row_max = np.abs(hi).max(axis=1)
    assert np.all((row_max == 0) | ((row_max >= 2**14) & (row_max <= 2**15)))
    w = (hi + lo)[:, :37] * arrays["w_inv"].astype(np.float64)[:, None]
    dense = a.toarray().astype(np.float64)
    # lo rounds to 11 bits while normal in fp16, else to fp16's subnormal step 2^-24 (scaled units)
    bound = 2.0**-22 * np.abs(dense) + 2.0**-25 * arrays["w_inv"].astype(np.float64)[:, None]
    assert np.all(np.abs(w - dense) <= bound)
    assert np.abs(w - dense).max() > 0  # values of more than 22 bits do lose some
    assert {a.name for a in fam.arguments(k.spec)} >= {"w_hi", "w_lo", "w_inv"} and "w" not in arrays


def test_f16x3_source_splits_x_per_slice_and_uses_fp16_mma():
    src = render(spec_for(random_csr(2048, 2048, 0.3, seed=13), 256))
    for text in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "constexpr int K_PAD = 2048;",
                 "split_x(x_ring + ((s + 1) % X_STAGES) * X_STAGE_FLOATS, split_ring + ((s + 1) & 1) * SPLIT_WORDS);", "const int s = min(max(141 - biased, -126), 126);",
                 "inv.x * row_inv[mf][h]", "const uint16_t* __restrict__ w_hi", "#include <cuda_fp16.h>"):
        assert text in src, text
    assert "tf32" not in src.split("extern \"C\"")[0].split("---- constants")[1].split("float32 accuracy on FP16")[0]
    tf32 = render(spec_for(random_csr(2048, 2048, 0.3, seed=13), 128))
    assert "m16n8k16" not in tf32 and "split_x" not in tf32 and "cuda_fp16.h" not in tf32


# ---- nvcc tier ---------------------------------------------------------------------------------

@pytest.mark.nvcc
@pytest.mark.parametrize("shape,n,options", [
    ((512, 2048), 128, {}),  # split K, float4 finish
    ((100, 37), 13, {}),  # odd K and N: 4-byte copies, scalar finish
    ((300, 516), 66, {"tile_m": 128, "tile_n": 128, "min_blocks": 1}),
    ((4096, 512), 1024, {"stages": 2}),  # unsplit
    ((512, 2048), 128, {"mma": "f16x3"}),  # 3xFP16, 64-row tiles, split K
    ((2048, 2048), 256, {}),  # 3xFP16 as selected: 128 x 64 tiles
    ((100, 37), 13, {"mma": "f16x3", "tile_m": 128}),  # odd K and N, 128 x 32 tiles
])
def test_source_compiles_for_sm90_without_spills(shape, n, options):
    a = random_csr(*shape, 0.3, seed=6)
    kernel = sparsegen.compile(a, op="spmm", n=n, bias=np.ones(shape[0]), relu=True, backend="emulate",
                               options={"family": fam.FAMILY, **options})
    cubin = nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF" and fam.KERNEL.encode() in cubin
