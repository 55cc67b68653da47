"""GPU tier, `panel_spmm`: the code paths its spec fields select, against scipy."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsegen

from .helpers import TOL, random_csr, reference, rel_error, rounded

pytestmark = pytest.mark.gpu


def check(a, n, dtype="float32", bias=None, relu=False, seed=0, **options):
    kernel = sparsegen.compile(a, op="spmm", n=n, dtype=dtype, bias=bias, relu=relu, backend="gpu",
                               options={"family": "panel_spmm", **options})
    a = rounded(a, dtype)
    x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(dtype)
    for _ in range(2):  # the split-K workspace must be left zeroed for the next call
        err = rel_error(kernel(x), reference(a, x, bias, relu))
        assert err <= TOL[dtype], (kernel.spec.name, err)
    return kernel


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("blocks_per_sm", [1, 2, 16])
def test_k_splits_add_up(dtype, blocks_per_sm):
    a = random_csr(200, 5000, 0.15, seed=blocks_per_sm, empty_rows=0.1)
    kernel = check(a, 128, dtype, bias=np.linspace(-1, 1, 200), relu=True, blocks_per_sm=blocks_per_sm)
    assert kernel.spec.splits > 1


@pytest.mark.parametrize("splits", [1, 3, 7, 1000])
def test_forced_k_splits(splits):
    """The option `splits`: none, splits whose last one is short (65 chunks: K = 4100 leaves a residue
    chunk), more than there are chunks."""
    a = random_csr(300, 4100, 0.1, seed=splits, empty_rows=0.1)
    kernel = check(a, 256, "float32", bias=np.linspace(-1, 1, 300), relu=True, splits=splits)
    assert kernel.spec.splits == min(splits, kernel.spec.chunks)


def test_dense_block_overflows_the_staged_segment():
    """A 64 x 2000 all-dense block inside a 1 % matrix: its segments are far past the staged
    capacity sized from the density, so their remainder is read from global memory."""
    a = random_csr(1000, 2000, 0.01, seed=1).tolil()
    a[100:164, :] = np.random.default_rng(2).standard_normal((64, 2000))
    a = a.tocsr()
    kernel = check(a, 64, "float32")
    assert kernel.plan.constants["max_segment"] > kernel.spec.pair_cap


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", [1, 2, 3, 31, 130, 1000])
def test_column_residues_and_k_not_a_multiple_of_the_chunk(dtype, n):
    a = random_csr(333, 1001, 0.1, seed=n)
    check(a, n, dtype, bias=np.arange(333, dtype=np.float32), seed=n)


@pytest.mark.parametrize("reuse", [1, 64])
def test_panel_heights(reuse):
    kernel = check(random_csr(3000, 700, 0.3, seed=3), 96, "float32", reuse=reuse)
    assert kernel.spec.panel_rows == (32 if reuse == 1 else 64)  # 64: capped by 32 accumulators per lane


def test_empty_chunks_skip_their_tile():
    a = sp.hstack([random_csr(300, 256, 0.2, seed=4), sp.csr_matrix((300, 4096), dtype=np.float32),
                   random_csr(300, 100, 0.2, seed=5)]).tocsr()
    x_nan = np.full((a.shape[1], 64), np.nan, np.float32)
    x_nan[:256] = 1.0
    x_nan[-100:] = 2.0
    kernel = sparsegen.compile(a, n=64, backend="gpu", options={"family": "panel_spmm"})
    y = kernel(x_nan)  # NaN rows of X that no nonzero reads must not reach Y
    assert np.isfinite(y).all()
    assert rel_error(y, reference(a, np.nan_to_num(x_nan))) <= 1e-5
