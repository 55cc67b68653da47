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
from sparsegen.families import fp32_cost, spec_from_dict
from sparsegen.families.base import Request
from sparsegen.render import render
from sparsegen.select import select

from .helpers import TOL, random_csr, reference, rel_error

FORCED = ("family", fam.FAMILY)


def decide(a, n=128, dtype="float32", op="spmm", forced=True, **options):
    opts = dict(options, **({FORCED[0]: FORCED[1]} if forced else {}))
    return fam._rule(analyze(a), Request(op, n=n, dtype=dtype, options=tuple(sorted(opts.items()))))


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
    (dict(tile_m=96), "option tile_m=96"),
    (dict(split_k=0), "option split_k=0"),
    (dict(stages=5), "option stages=5"),
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
    half = analyze(random_csr(1024, 1024, 0.5, seed=20))
    v = fp32_cost.judge(half, 256)
    assert v.pick == "tensor" and v.tensor_s * fp32_cost.TENSOR_MARGIN < min(v.sparse_s, v.dense_s)
    sparse = analyze(random_csr(512, 2048, 0.05, seed=21))  # 95 %: the CSR kernels
    assert fp32_cost.judge(sparse, 128).pick == "sparse"
    tiny = analyze(random_csr(64, 64, 0.5, seed=22))  # a small layer: the CSR kernels' shorter launch
    assert fp32_cost.judge(tiny, 8).pick == "sparse"
    below = analyze(random_csr(8192, 8192, 0.14, seed=23))  # the slopes cross at 14.6 %
    assert fp32_cost.judge(below, 1024).pick == "sparse"


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
       epilogue=st.booleans(), seed=st.integers(0, 1000))
def test_emulator_matches_scipy(m, k, n, density, epilogue, seed):
    a = random_csr(m, k, density, seed=seed)
    bias = np.linspace(-1, 1, m) if epilogue else None
    kernel = sparsegen.compile(a, op="spmm", n=n, bias=bias, relu=epilogue, backend="emulate",
                               options={"family": fam.FAMILY})
    x = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    assert rel_error(kernel(x), reference(a, x, bias, epilogue)) <= TOL["float32"]


# ---- nvcc tier ---------------------------------------------------------------------------------

@pytest.mark.nvcc
@pytest.mark.parametrize("shape,n,options", [
    ((512, 2048), 128, {}),  # split K, float4 finish
    ((100, 37), 13, {}),  # odd K and N: 4-byte copies, scalar finish
    ((300, 516), 66, {"tile_m": 128, "tile_n": 128, "min_blocks": 1}),
    ((4096, 512), 1024, {"stages": 2}),  # unsplit
])
def test_source_compiles_for_sm90_without_spills(shape, n, options):
    a = random_csr(*shape, 0.3, seed=6)
    kernel = sparsegen.compile(a, op="spmm", n=n, bias=np.ones(shape[0]), relu=True, backend="emulate",
                               options={"family": fam.FAMILY, **options})
    cubin = nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF" and fam.KERNEL.encode() in cubin
