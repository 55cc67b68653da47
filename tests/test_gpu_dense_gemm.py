"""GPU tier for dense_gemm, the dense cuBLAS fallback: the PyCUDA-uploaded W multiplied by cuBLAS
through torch (and CuPy where it is installed) against scipy and torch.matmul; fp16 NumPy in/out,
fp16 and bf16 torch tensors in and out (out= written in place), PyCUDA arrays, bias and ReLU by the
epilogue kernel, a PyCUDA stream, a torch side stream made current, repeated calls, the default
selection at 50 % sparsity, tune=True timing dense beside the sparse families, and fp32 (NumPy and
torch, TF32 off even where the caller turned it on, the default fp32 selection at 50 %)."""
from __future__ import annotations

import numpy as np
import pytest

import sparsegen
from sparsegen import runtime
from sparsegen.analyze import analyze
from sparsegen.errors import ShapeError

from .helpers import random_csr, reference, rel_error, torch_cuda as needs_torch, without_tensor_cores
from .test_gpu_tiled import fast_random
from .tiled_helpers import TOL, host_x, pinned_library, rounded_half

pytestmark = pytest.mark.gpu


def torch_cuda():
    return needs_torch("the dense fallback calls cuBLAS through torch (or CuPy)")


def compile_dense(a, n, dtype="float16", bias=None, relu=False, library="torch"):
    with pinned_library(library):
        kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="gpu",
                                   options={"family": "dense_gemm"})
    assert kernel.spec.family == "dense_gemm" and kernel.spec.library == library
    return kernel


def expected(a, x, dtype, bias=None, relu=False):
    return reference(rounded_half(a, dtype), np.asarray(x, dtype=np.float32), bias, relu)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (300, 500, 16), (1000, 700, 64), (129, 65, 7), (64, 4096, 256)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "relu", "bias_relu"])
def test_fp16_numpy_in_and_out_match_scipy(m, k, n, epilogue):
    torch_cuda()
    a = random_csr(m, k, 0.4, seed=m + k)
    bias = np.random.default_rng(1).standard_normal(m) if "bias" in epilogue else None
    kernel = compile_dense(a, n, bias=bias, relu="relu" in epilogue)
    x = host_x(np.random.default_rng(2), k, n, "float16")
    y = kernel(x)
    assert y.dtype == np.float16 and y.shape == (m, n)
    assert rel_error(y, expected(a, x, "float16", bias, "relu" in epilogue)) <= TOL["float16"]
    if "relu" in epilogue:
        assert (y >= 0).all()


def test_product_is_torch_matmul_of_the_densified_w():
    torch = torch_cuda()
    a = fast_random(2048, 3072, 0.5, seed=3)
    kernel = compile_dense(a, 32)
    w = torch.from_numpy(rounded_half(a, "float16").toarray()).cuda().half()
    x = torch.randn(3072, 32, device="cuda", dtype=torch.float16)
    y = kernel(x)
    torch.cuda.synchronize()
    ref = torch.matmul(w, x)
    assert rel_error(y.float().cpu().numpy(), ref.float().cpu().numpy()) <= 1e-3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_tensors_in_and_out_with_bias_and_relu(dtype):
    torch = torch_cuda()
    a = random_csr(700, 900, 0.3, seed=4)
    bias = np.linspace(-1, 1, 700)
    kernel = compile_dense(a, 40, dtype, bias=bias, relu=True)
    tdtype = getattr(torch, dtype)
    x = torch.from_numpy(host_x(np.random.default_rng(5), 900, 40, dtype).astype(np.float32)).cuda().to(tdtype)
    y = kernel(x)
    assert isinstance(y, torch.Tensor) and y.dtype == tdtype and y.device == x.device and tuple(y.shape) == (700, 40)
    out = torch.empty(700, 40, device="cuda", dtype=tdtype)
    assert kernel(x, out=out) is out
    torch.cuda.synchronize()
    ref = expected(a, x.float().cpu().numpy(), dtype, bias, relu=True)
    for got in (y, out):
        assert rel_error(got.float().cpu().numpy(), ref) <= TOL[dtype]


def test_bf16_needs_gpu_tensors():
    torch_cuda()
    kernel = compile_dense(random_csr(50, 60, 0.5, seed=6), 8, "bfloat16")
    try:  # NumPy knows bfloat16 once ml_dtypes is imported (earlier tests may have imported it)
        np.dtype("bfloat16")
        why = r"input x: expected dtype bfloat16, got float32 \(convert with .astype\(np.bfloat16\)\)"
    except TypeError:
        why = "bfloat16 has no NumPy dtype; pass torch tensors on the GPU"
    with pytest.raises(ShapeError, match=why):
        kernel(np.zeros((60, 8), np.float32))


def test_repeated_calls_on_new_and_reused_buffers():
    """The runtime caches torch views of operands by pointer: new buffers, the same buffers refilled,
    and host calls (fresh device copies each time) must all read what they are given."""
    torch = torch_cuda()
    a = random_csr(400, 300, 0.5, seed=7)
    kernel = compile_dense(a, 16, bias=np.ones(400))
    out = torch.empty(400, 16, device="cuda", dtype=torch.float16)
    x = torch.empty(300, 16, device="cuda", dtype=torch.float16)
    for seed in range(4):
        x.copy_(torch.from_numpy(host_x(np.random.default_rng(seed), 300, 16, "float16")).cuda())
        fresh = x.clone()
        kernel(x, out=out)
        y = kernel(fresh)
        torch.cuda.synchronize()
        ref = expected(a, x.cpu().numpy(), "float16", np.ones(400))
        assert rel_error(out.float().cpu().numpy(), ref) <= TOL["float16"]
        assert rel_error(y.float().cpu().numpy(), ref) <= TOL["float16"]
        host = host_x(np.random.default_rng(seed + 10), 300, 16, "float16")
        assert rel_error(kernel(host), expected(a, host, "float16", np.ones(400))) <= TOL["float16"]


def test_pycuda_arrays_and_a_pycuda_stream():
    torch_cuda()
    import pycuda.driver as drv
    import pycuda.gpuarray as gpuarray

    a = random_csr(500, 600, 0.3, seed=8)
    kernel = compile_dense(a, 24, relu=True)
    x = host_x(np.random.default_rng(9), 600, 24, "float16")
    xg = runtime.to_gpu(x)
    y = kernel(xg)
    assert isinstance(y, gpuarray.GPUArray)
    ref = expected(a, x, "float16", relu=True)
    assert rel_error(y.get(), ref) <= TOL["float16"]
    stream = drv.Stream()
    out = gpuarray.empty((500, 24), np.float16)
    kernel(xg, out=out, stream=stream)
    stream.synchronize()
    assert rel_error(out.get(), ref) <= TOL["float16"]


def test_a_torch_side_stream_made_current_does_not_reorder_the_epilogue():
    """The GEMM goes to the legacy default stream, where the epilogue kernel and host copies are,
    whatever stream torch has made current."""
    torch = torch_cuda()
    a = random_csr(3000, 2000, 0.5, seed=10)
    bias = np.random.default_rng(11).standard_normal(3000)
    kernel = compile_dense(a, 64, bias=bias, relu=True)
    x = torch.from_numpy(host_x(np.random.default_rng(12), 2000, 64, "float16")).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = kernel(x)
    torch.cuda.synchronize()
    assert rel_error(y.float().cpu().numpy(), expected(a, x.cpu().numpy(), "float16", bias, True)) <= TOL["float16"]


def test_cupy_binding_where_installed():
    try:
        import cupy  # noqa: F401
    except ImportError:
        pytest.skip("CuPy not installed")
    a = random_csr(300, 400, 0.4, seed=13)
    kernel = compile_dense(a, 16, bias=np.ones(300), relu=True, library="cupy")
    x = host_x(np.random.default_rng(14), 400, 16, "float16")
    assert rel_error(kernel(x), expected(a, x, "float16", np.ones(300), True)) <= TOL["float16"]


def test_default_selection_takes_dense_at_half_sparsity_and_runs_it():
    torch_cuda()
    a = fast_random(4096, 4096, 0.5, seed=15)
    kernel = sparsegen.compile(a, n=64, dtype="float16", backend="gpu")
    assert kernel.spec.family == "dense_gemm", kernel.selection.reason
    assert "cuBLAS via torch" in kernel.selection.reason
    x = host_x(np.random.default_rng(16), 4096, 64, "float16")
    assert rel_error(kernel(x), expected(a, x, "float16")) <= TOL["float16"]


def test_tune_times_dense_beside_the_sparse_families():
    torch_cuda()
    a = fast_random(3072, 4096, 0.3, seed=17)
    kernel = sparsegen.compile(a, n=32, dtype="float16", backend="gpu", tune=True)
    timed = {t.family for t in kernel.tuning}
    assert {"dense_gemm", "tiled_csl_spmm", "tiled_bitmap_spmm"} <= timed
    assert kernel.spec.family == min(kernel.tuning, key=lambda t: t.ms).family
    x = host_x(np.random.default_rng(18), 4096, 32, "float16")
    assert rel_error(kernel(x), expected(a, x, "float16")) <= TOL["float16"]


# ---- float32 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (300, 500, 16), (129, 65, 7), (1024, 1024, 256)])
@pytest.mark.parametrize("epilogue", ["none", "bias_relu"])
def test_fp32_numpy_in_and_out_match_scipy(m, k, n, epilogue):
    torch_cuda()
    a = random_csr(m, k, 0.5, seed=m + k)
    bias = np.random.default_rng(1).standard_normal(m) if "bias" in epilogue else None
    kernel = compile_dense(a, n, dtype="float32", bias=bias, relu="relu" in epilogue)
    x = np.random.default_rng(2).standard_normal((k, n)).astype(np.float32)
    y = kernel(x)
    assert y.dtype == np.float32 and y.shape == (m, n)
    assert rel_error(y, reference(a, x, bias, "relu" in epilogue)) <= 1e-5


def test_fp32_runs_without_tf32_even_when_the_caller_enabled_it():
    """TF32 keeps 10 mantissa bits: on K = 4096 its error is ~1e-3, far above fp32's ~1e-6."""
    torch = torch_cuda()
    a = fast_random(1024, 4096, 0.5, seed=19)
    kernel = compile_dense(a, 128, dtype="float32")
    x = torch.randn(4096, 128, device="cuda", dtype=torch.float32)
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    flags.allow_tf32 = True
    try:
        y = kernel(x)
        torch.cuda.synchronize()
        assert flags.allow_tf32  # the caller's setting is restored
    finally:
        flags.allow_tf32 = before
    assert rel_error(y.cpu().numpy(), reference(a, x.cpu().numpy())) <= 1e-5


def test_fp32_default_selection_takes_dense_at_half_sparsity_and_runs_it(monkeypatch):
    torch = torch_cuda()
    a = fast_random(2048, 2048, 0.5, seed=20)
    assert sparsegen.select(analyze(a), op="spmm", n=256).spec.family == "dense_tile_spmm"  # 3xTF32 first
    without_tensor_cores(monkeypatch)
    kernel = sparsegen.compile(a, n=256, backend="gpu")
    assert kernel.spec.family == "dense_gemm" and kernel.spec.dtype == "f32", kernel.selection.reason
    x = torch.randn(2048, 256, device="cuda", dtype=torch.float32)
    assert rel_error(kernel(x).cpu().numpy(), reference(a, x.cpu().numpy())) <= 1e-5
    sparse = sparsegen.compile(fast_random(2048, 2048, 0.05, seed=21), n=256, backend="gpu")
    assert sparse.spec.family != "dense_gemm", sparse.selection.reason
