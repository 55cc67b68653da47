"""GPU tier for SDDMM's `sputnik_sddmm` (forced; `test_gpu_dense_tile_sddmm.py` has the other family):
generated kernels against a float64 reference on random and DLMC matrices, every edge case, fp16
and fp32, NumPy / PyTorch / PyCUDA operands."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen.bench.dlmc import dlmc_matrices
from sparsegen.bench.dlmc_gpu import sddmm_reference
from sparsegen.errors import ShapeError

from .helpers import TOL, random_csr, rel_error

pytestmark = pytest.mark.gpu


def reference(a, x, y):
    """float64 (A . B^T) at a's pattern, in CSR order (the inputs are already in their dtype)."""
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    return sddmm_reference(x, y, rows, a.indices)


def operands(a, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((a.shape[0], k)).astype(dtype), rng.standard_normal((a.shape[1], k)).astype(dtype))


def run_check(a, k, dtype="float32", seed=0, via="numpy", **options):
    kernel = sparsegen.compile(a, op="sddmm", k=k, dtype=dtype, options={"family": "sputnik_sddmm", **options},
                               backend="gpu")
    x, y = operands(a, k, dtype, seed)
    if via == "numpy":
        out = kernel(x, y)
    elif via == "pycuda":
        from sparsegen import runtime

        out = kernel(runtime.to_gpu(x), runtime.to_gpu(y)).get()
    else:
        torch = pytest.importorskip("torch")
        out = kernel(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()).cpu().numpy()
    assert out.shape == (a.nnz,) and out.dtype == np.dtype(dtype)
    err = rel_error(out, reference(a, x, y))
    assert err <= TOL[dtype], (kernel.spec.name, err)
    return kernel


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), density=st.floats(0, 0.5),
       k=st.one_of(st.integers(1, 300), st.sampled_from([32, 64, 128, 256])),
       dtype=st.sampled_from(["float32", "float16"]), order=st.sampled_from(["phase", "row"]),
       tile=st.sampled_from([None, None, 4, 8, 32]), seed=st.integers(0, 10_000))
def test_random_matrices_match_reference(m, n, density, k, dtype, order, tile, seed):
    a = random_csr(m, n, density, seed=seed, empty_rows=0.1)
    options = {"order": order, **({"tile": tile} if tile else {})}
    run_check(a, k, dtype, seed, **options)


def edge_matrix(case):
    rng = np.random.default_rng(1)
    if case == "empty_rows":
        return random_csr(500, 400, 0.05, seed=1, empty_rows=0.5)
    if case == "all_empty":
        return sp.csr_matrix((64, 80), dtype=np.float32)
    if case == "one_row":
        return random_csr(1, 400, 0.3, seed=2)
    if case == "short_rows":  # every row shorter than a tile
        return random_csr(2000, 3000, 0.001, seed=3)
    if case == "one_long_row":  # 4000 nonzeros in one row, short rows elsewhere: many tiles of one row
        long_row = sp.csr_matrix((rng.standard_normal(4000), np.sort(rng.choice(5000, 4000, replace=False)),
                                  [0, 4000]), shape=(1, 5000))
        return sp.vstack([random_csr(50, 5000, 0.001, seed=4), long_row]).tocsr().astype(np.float32)
    if case == "single_column":
        return random_csr(300, 1, 0.5, seed=5)
    return sp.csr_matrix(np.ones((40, 33), np.float32))  # "dense": full tiles and a partial one per row


@pytest.mark.parametrize("case", ["empty_rows", "all_empty", "one_row", "short_rows", "one_long_row",
                                  "single_column", "dense"])
@pytest.mark.parametrize("k", [1, 2, 3, 8, 33, 100, 128, 256])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_edge_cases(case, k, dtype):
    run_check(edge_matrix(case), k, dtype, seed=k)


@pytest.mark.parametrize("k", [32768, 32772, 40001])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_huge_k_runs_its_pass_loop(k, dtype):
    kernel = run_check(random_csr(40, 30, 0.3, seed=6, empty_rows=0.2), k, dtype, seed=1)
    assert k // kernel.spec.chunk > 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("options", [{"scaled": False}, {"tile": 4}, {"tile": 4, "order": "row"},
                                     {"tile": 32, "unroll": 4, "block": 32}, {"block": 256},
                                     {"tile": 8, "unroll": 4, "block": 256, "min_blocks": 3},
                                     {"lanes": 16, "tile": 8, "unroll": 4, "block": 256, "min_blocks": 3}])
def test_every_option_shape(dtype, options):
    a = random_csr(700, 900, 0.05, seed=7, empty_rows=0.1)
    for k in (32, 100, 256):
        kernel = run_check(a, k, dtype, seed=k, **options)
        assert all(getattr(kernel.spec, key) == value for key, value in options.items())


def check_unsampled_products_stay_out(density: float, **options):
    """inf rows of A where A's rows are empty and a NaN row of B for a column no row samples:
    products the pattern does not sample must not reach the output."""
    a = sp.hstack([random_csr(300, 199, density, seed=8, empty_rows=0.3), sp.csr_matrix((300, 1))]).tocsr()
    a = a.astype(np.float32)
    x, y = operands(a, 64, "float32")
    x[np.diff(a.indptr) == 0] = np.inf  # empty rows
    y[199] = np.nan  # a column no row samples
    kernel = sparsegen.compile(a, op="sddmm", k=64, backend="gpu", options=options)
    out = kernel(x, y)
    assert np.isfinite(out).all()
    assert rel_error(out, reference(a, x, y)) <= TOL["float32"]


def test_only_stored_entries_are_computed():
    check_unsampled_products_stay_out(0.1)


@pytest.mark.parametrize("via", ["numpy", "pycuda", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_pycuda_and_torch_operands(via, dtype):
    run_check(random_csr(400, 300, 0.1, seed=9, empty_rows=0.1), 96, dtype, seed=2, via=via)


def test_torch_out_argument_stream_order_and_operand_errors():
    torch = pytest.importorskip("torch")
    a = random_csr(200, 150, 0.1, seed=10)
    kernel = sparsegen.compile(a, op="sddmm", k=64, backend="gpu")
    x, y = operands(a, 64, "float32")
    xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    out = torch.empty(a.nnz, device="cuda")
    assert kernel(xt, yt, out=out) is out
    torch.cuda.synchronize()
    assert rel_error(out.cpu().numpy(), reference(a, x, y)) <= TOL["float32"]
    with pytest.raises(ShapeError, match=r"input b: expected shape \(150, 64\)"):
        kernel(xt, yt[:-1])
    with pytest.raises(ShapeError, match="input a: expected dtype float32"):
        kernel(xt.half(), yt)
    with pytest.raises(ShapeError, match="C-contiguous"):
        kernel(xt, torch.empty((64, 150), device="cuda").t())
    with pytest.raises(ShapeError, match="past alignment"):
        kernel(torch.empty(200 * 64 + 1, device="cuda")[1:].view(200, 64), yt)
    with pytest.raises(ShapeError, match="takes 2 operand"):
        kernel(xt)


def test_every_dlmc_matrix(data_dir):
    for i, source in enumerate(dlmc_matrices(data_dir)):
        a = source.load()
        for k in (32, 128):
            run_check(a, k, "float32" if (i + k) % 3 else "float16", seed=source.seed + k)


def test_tune_times_both_sddmm_families_and_keeps_the_fastest():
    """tune=True for op='sddmm': a 50 % pattern at k = 128 is accepted by both families; the faster
    is returned, cached by structure and request, and its values match the reference."""
    a = random_csr(512, 2048, 0.5, seed=9)
    kernel = sparsegen.compile(a, op="sddmm", k=128, backend="gpu", tune=True)
    assert {t.family for t in kernel.tuning} >= {"sputnik_sddmm", "dense_tile_sddmm"}
    best = min(kernel.tuning, key=lambda t: t.ms)
    assert kernel.spec.family == best.family and kernel.spec.name == best.spec
    again = sparsegen.compile(a, op="sddmm", k=128, backend="gpu", tune=True)
    assert again.tuning == kernel.tuning  # read from the cache, not re-measured
    x, y = operands(a, 128, "float32", seed=4)
    assert rel_error(again(x, y), reference(a, x, y)) <= TOL["float32"]
