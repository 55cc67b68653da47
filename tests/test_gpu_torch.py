"""GPU tier for sparsegen.torch: SparseLinear on CUDA fp16/bf16 tensors against torch's dense Linear
with the same pruned weights and a float64 product, for several families, shapes and token counts
(N = 1, odd N, 3-D input), bias on and off, a side stream, chained layers, and `sparsify` on a toy
model."""
from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="torch not installed: sparsegen.torch is optional")

import sparsegen.torch as sgt  # noqa: E402
from sparsegen.errors import ShapeError  # noqa: E402

# Relative (Frobenius) error of one layer against float64: fp32 accumulation, one rounding of Y.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
# Families that take each dtype (None: sparsegen's own selection).
FAMILIES = {torch.float16: [None, "csr_rowsplit", "sputnik_spmm", "panel_spmm", "tiled_csl_spmm",
                            "tiled_bitmap_spmm", "dense_gemm"],
            torch.bfloat16: [None, "tiled_csl_spmm", "tiled_bitmap_spmm", "dense_gemm"]}
CASES = [(f, d) for d, fams in FAMILIES.items() for f in fams]


@pytest.fixture(scope="module", autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def dense(k, m, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(k, m, bias=bias).to(device="cuda", dtype=dtype)


def reference64(layer, x):
    y = x.double() @ layer.dense_weight("cuda").double().T
    if layer.bias is not None:
        y = y + torch.from_numpy(layer.bias).to("cuda").double()
    return y


def rel(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def check(layer, x, dtype):
    """Run the layer; compare with float64 and with torch's dense Linear on the pruned weights."""
    with torch.inference_mode():
        y = layer(x)
        torch_y = layer.to_linear("cuda")(x)
    assert y.is_cuda and y.device == x.device and y.dtype == dtype
    assert y.shape == x.shape[:-1] + (layer.out_features,)
    assert bool(torch.isfinite(y).all())
    ref = reference64(layer, x)
    assert rel(y, ref) <= TOL[dtype], (layer.specs, rel(y, ref))
    assert rel(y, torch_y) <= 2 * TOL[dtype], (layer.specs, rel(y, torch_y))
    return y


@pytest.mark.parametrize("family,dtype", CASES, ids=[f"{f or 'selected'}-{str(d)[6:]}" for f, d in CASES])
def test_layer_matches_dense_pruned(family, dtype):
    options = {"family": family} if family else None
    for (m, k), sparsity, bias in (((384, 384), 0.7, True), ((100, 203), 0.8, False)):
        layer = sgt.SparseLinear.from_dense(dense(k, m, dtype, bias), sparsity, options=options)
        # N = 1, odd N, 3-D input, 1-D input
        for lead in ((1,), (7,), (2, 9), ()):
            check(layer, torch.randn(lead + (k,), device="cuda", dtype=dtype), dtype)
        names = set(layer.specs.values())
        assert family is None or all(name.startswith(family + ".") for name in names), names


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [64, 300])
def test_minilm_ffn_shape_selected(dtype, n):
    """all-MiniLM-L6-v2's FFN shape with sparsegen's own selection; N = 300 is past the tile kernels."""
    for m, k in ((1536, 384), (384, 1536)):
        layer = sgt.SparseLinear.from_dense(dense(k, m, dtype), 0.7)
        check(layer, torch.randn(n, k, device="cuda", dtype=dtype), dtype)


SPIN = 200_000_000  # GPU clock cycles torch.cuda._sleep spins (~0.1 s): longer than a launch's host work


def test_side_stream_orders_the_launch():
    """On a side stream, the kernel must wait for x made there, and work queued there after the call
    must wait for the kernel: each half fails (garbage) without its wait."""
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep is missing")
    layer = sgt.SparseLinear.from_dense(dense(384, 1536, torch.float16), 0.7)
    source = torch.randn(33, 384, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    with torch.inference_mode():
        layer(source)  # compile and load now: the phases below must not wait on the host
        torch.cuda.synchronize()
        with torch.cuda.stream(side):  # x is late: made on the side stream after a spin
            torch.cuda._sleep(SPIN)
            x = source * 3
            z = layer(x).float()
        torch.cuda.synchronize()
        assert rel(z, reference64(layer, source * 3)) <= TOL[torch.float16], "kernel ran before its input"
        torch.cuda._sleep(SPIN)  # the default stream is busy: the kernel runs late
        with torch.cuda.stream(side):
            z = layer(source).float() * 1  # read on the side stream: must wait for the kernel
        torch.cuda.synchronize()
        assert rel(z, reference64(layer, source)) <= TOL[torch.float16], "result read before the kernel wrote it"


def test_chained_layers_and_transposed_views():
    first = sgt.SparseLinear.from_dense(dense(384, 1536, torch.float16, seed=1), 0.7)
    second = sgt.SparseLinear.from_dense(dense(1536, 384, torch.float16, seed=2), 0.7)
    x = torch.randn(3, 11, 384, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        h = first(x)
        y = second(torch.nn.functional.gelu(h))
        y_direct = second(h)  # Xᵀ of a transposed view is read in place
    h_ref = reference64(first, x).to(torch.float16)
    assert rel(y, reference64(second, torch.nn.functional.gelu(h_ref))) <= 2 * TOL[torch.float16]
    assert rel(y_direct, reference64(second, h)) <= TOL[torch.float16]


def test_cpu_input_is_rejected_before_launch():
    layer = sgt.SparseLinear.from_dense(dense(64, 32, torch.float16), 0.5)
    with torch.inference_mode(), pytest.raises(ShapeError, match="move it to CUDA"):
        layer(torch.randn(4, 64, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparsify_toy_model(dtype):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128),
                                torch.nn.LayerNorm(128), torch.nn.Linear(128, 10, bias=False)).to("cuda", dtype)
    ref = copy.deepcopy(model)
    report = sgt.sparsify(model, 0.75, include=lambda name: name != "4", precompile=(24,))
    assert [r.name for r in report.layers] == ["0", "2"] and type(model[4]) is torch.nn.Linear
    with torch.no_grad():
        for r in report.layers:
            ref.get_submodule(r.name).weight.copy_(r.module.dense_weight("cuda"))
            assert list(r.specs) == [24]
    x = torch.randn(4, 6, 128, device="cuda", dtype=dtype)
    with torch.inference_mode():
        y, y_ref = model(x), ref(x)
    assert y.shape == (4, 6, 10)
    assert rel(y, y_ref) <= 4 * TOL[dtype], report.table()
