"""GPU tier: generated kernels against scipy on random and real matrices and the edge cases."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen.errors import ShapeError

from .helpers import TOL, random_csr, reference, rel_error, rounded

pytestmark = pytest.mark.gpu


SPMM_FAMILIES = ["sputnik_spmm", "csr_rowsplit", "panel_spmm"]


def run_check(a, n, dtype="float32", bias=None, relu=False, seed=0, via="numpy", family=None, **options):
    if family:
        options["family"] = family
    kernel = sparsegen.compile(a, op="spmm", n=n, dtype=dtype, bias=bias, relu=relu, backend="gpu",
                               options=options or None)
    assert family is None or kernel.spec.family == family
    a = rounded(a, dtype)
    x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(dtype)
    if via == "numpy":
        y = kernel(x)
    else:
        from sparsegen import runtime

        y = kernel(runtime.to_gpu(x)).get()
    assert y.shape == (a.shape[0], n) and y.dtype == np.dtype(dtype)
    err = rel_error(y, reference(a, x, bias, relu))
    assert err <= TOL[dtype], (kernel.spec.name, err)
    return kernel


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 300), density=st.floats(0, 0.5), n=st.integers(1, 300),
       dtype=st.sampled_from(["float32", "float16"]), epilogue=st.sampled_from(["none", "bias", "bias_relu"]),
       seed=st.integers(0, 10_000), family=st.sampled_from(SPMM_FAMILIES))
def test_random_matrices_match_scipy(m, k, density, n, dtype, epilogue, seed, family):
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    run_check(a, n, dtype, bias, epilogue == "bias_relu", seed, family=family)


@pytest.mark.parametrize("case", ["empty_rows", "one_row", "all_empty", "one_long_row", "single_column"])
@pytest.mark.parametrize("n", [1, 7, 12, 33, 128, 130])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", SPMM_FAMILIES)
def test_edge_cases(case, n, dtype, family):
    rng = np.random.default_rng(n)
    if case == "empty_rows":
        a = random_csr(500, 400, 0.05, seed=1, empty_rows=0.5)
    elif case == "one_row":
        a = random_csr(1, 400, 0.3, seed=2)
    elif case == "all_empty":
        a = sp.csr_matrix((64, 80), dtype=np.float32)
    elif case == "one_long_row":  # 4000 nonzeros in one row, short rows elsewhere: lane split + residue
        a = sp.vstack([random_csr(50, 5000, 0.001, seed=3), sp.csr_matrix(
            (rng.standard_normal(4000), np.sort(rng.choice(5000, 4000, replace=False)), [0, 4000]),
            shape=(1, 5000))]).tocsr().astype(np.float32)
    else:
        a = random_csr(300, 1, 0.5, seed=4)
    run_check(a, n, dtype, family=family)


@pytest.mark.parametrize("n", [1, 8, 64, 256])
@pytest.mark.parametrize("family", SPMM_FAMILIES)
def test_long_rows_and_fused_epilogue(n, family):
    a = random_csr(700, 3000, 0.08, seed=5)  # ~240 nonzeros per row
    bias = np.linspace(-2, 2, 700)
    kernel = run_check(a, n, "float32", bias, relu=True, family=family)
    if n == 1 and family == "csr_rowsplit":
        assert kernel.spec.lanes_k == 32


@pytest.mark.parametrize("unroll", [2, 4, 8])
@pytest.mark.parametrize("n,dtype", [(1, "float32"), (7, "float32"), (32, "float32"), (33, "float16"),
                                     (130, "float32")])
def test_rowsplit_chunks_loaded_several_a_step(unroll, n, dtype):
    """Rows of every length around the step (UNROLL x LANES nonzeros), the residue chunk, empty rows,
    a column residue (n = 7, 33, 130) and the fused epilogue."""
    a = sp.vstack([random_csr(200, 3000, 0.03, seed=unroll, empty_rows=0.2),
                   sp.csr_matrix(np.ones((1, 3000), dtype=np.float32))]).tocsr()
    bias = np.linspace(-1, 1, a.shape[0])
    kernel = run_check(a, n, dtype, bias, relu=True, family="csr_rowsplit", unroll=unroll)
    assert kernel.spec.unroll == (unroll if kernel.spec.lanes > 1 else 1)


@pytest.mark.parametrize("block", [32, 512, 1024])
@pytest.mark.parametrize("n", [1, 32, 130])
def test_rowsplit_block_option(block, n):
    """Rows per block from `options block=` (one row per 32-thread block at n = 1, 32 rows at 1024),
    the last block part-filled (201 rows)."""
    a = sp.vstack([random_csr(200, 900, 0.05, seed=block, empty_rows=0.2),
                   sp.csr_matrix(np.ones((1, 900), dtype=np.float32))]).tocsr()
    kernel = run_check(a, n, "float32", None, relu=False, family="csr_rowsplit", block=block)
    assert kernel.spec.block == block and kernel.spec.rows_per_block == block // kernel.spec.lanes


def test_official_graph_challenge_layer(examples_dir):
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    y0 = sparsegen.load(examples_dir / "sparse-images-1024-first64.tsv.gz", shape=(64, 1024))
    kernel = sparsegen.compile(w.T.tocsr(), n=64, bias=-0.3, relu=True, backend="gpu")
    y = kernel(np.ascontiguousarray(y0.T.toarray(), dtype=np.float32))
    ref = np.maximum((y0 @ w).toarray().T - 0.3, 0)
    assert rel_error(y, ref) <= 1e-6


@pytest.mark.parametrize("family", SPMM_FAMILIES)
def test_every_dlmc_matrix(data_dir, family):
    lines = (data_dir / "dlmc" / "index.tsv").read_text().splitlines()[1:]
    for i, line in enumerate(lines):
        a = sparsegen.load(data_dir / "dlmc" / line.split("\t")[0], values="random", seed=i)
        run_check(a, 128 if i % 2 else 32, "float32" if i % 3 else "float16", seed=i, family=family)


def test_gpu_array_in_gpu_array_out_and_out_argument():
    from sparsegen import runtime

    a = random_csr(200, 150, 0.1, seed=6)
    kernel = sparsegen.compile(a, n=64, backend="gpu")
    x = np.random.default_rng(0).standard_normal((150, 64)).astype(np.float32)
    xg = runtime.to_gpu(x)
    yg = kernel(xg)
    assert type(yg).__name__ == "GPUArray"
    out = runtime.to_gpu(np.zeros((200, 64), np.float32))
    assert kernel(xg, out=out) is out
    assert rel_error(out.get(), reference(a, x)) <= 1e-5
    assert rel_error(yg.get(), reference(a, x)) <= 1e-5


def test_torch_and_cupy_arrays_are_used_zero_copy():
    a = random_csr(300, 256, 0.1, seed=7)
    kernel = sparsegen.compile(a, n=128, backend="gpu")
    x = np.random.default_rng(1).standard_normal((256, 128)).astype(np.float32)
    ran = 0
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        xt = torch.from_numpy(x).cuda()
        yt = kernel(xt)
        assert isinstance(yt, torch.Tensor) and yt.is_cuda
        out = torch.empty((300, 128), device="cuda")
        assert kernel(xt, out=out) is out
        torch.cuda.synchronize()
        assert rel_error(out.cpu().numpy(), reference(a, x)) <= 1e-5
        with pytest.raises(ShapeError, match="dtype"):
            kernel(xt.double())
        with pytest.raises(ShapeError, match="C-contiguous"):
            kernel(torch.empty((128, 256), device="cuda").t())
        with pytest.raises(ShapeError, match="past alignment"):
            kernel(torch.empty(256 * 128 + 1, device="cuda")[1:].view(256, 128))
        with pytest.raises(ShapeError, match=r"expected shape \(256, 128\), got \(255, 128\)"):
            kernel(xt[:255])
        with pytest.raises(ShapeError, match="output y: expected dtype float32, got float16"):
            kernel(xt, out=torch.empty((300, 128), dtype=torch.float16, device="cuda"))
        with pytest.raises(ShapeError, match="requires grad"):
            kernel(xt.clone().requires_grad_())
        ran += 1
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        yc = kernel(cupy.asarray(x))
        assert isinstance(yc, cupy.ndarray)
        assert rel_error(cupy.asnumpy(yc), reference(a, x)) <= 1e-5
        ran += 1
    if not ran:
        pytest.skip("neither PyTorch nor CuPy with CUDA is installed")


def test_operand_errors_before_launch():
    a = random_csr(20, 30, 0.2, seed=8)
    kernel = sparsegen.compile(a, n=8, backend="gpu")
    with pytest.raises(ShapeError, match=r"expected shape \(30, 8\)"):
        kernel(np.zeros((31, 8), np.float32))
    with pytest.raises(ShapeError, match="expected dtype float32, got float64"):
        kernel(np.zeros((30, 8)))
    with pytest.raises(ShapeError, match="takes 1 operand"):
        kernel()
