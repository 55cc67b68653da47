"""GPU tier for tiled_lanes_spmm against float64 scipy: random shapes, OPT-like shapes at 80-90 %
sparsity, empty, full and ragged tiles, every tile shape, every split-K reduction with repeat calls
(barrier phases and workspaces left clean), odd N, bf16 and fp32 output, shallow and deep rings."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from .helpers import random_csr
from .test_gpu_tiled import fast_random, run_check

pytestmark = pytest.mark.gpu
FAMILY = "tiled_lanes_spmm"


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 400), k=st.integers(1, 600), density=st.floats(0.05, 1), n=st.integers(1, 48),
       shape=st.sampled_from([(128, 128), (128, 64), (64, 128), (64, 64), (256, 128)]),
       epilogue=st.sampled_from(["none", "bias", "bias_relu"]), seed=st.integers(0, 10_000))
def test_random_shapes_match_scipy(m, k, density, n, shape, epilogue, seed):
    tile_m, tile_k = shape
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    n = n if tile_m < 256 else min(n, 32)  # 256-row tiles: at most 32 columns (accumulators)
    run_check(a, n, FAMILY, bias=bias, relu=epilogue == "bias_relu", seed=seed, tile_m=tile_m, tile_k=tile_k)


@pytest.mark.parametrize("shape,sparsity,n", [((7168, 7168), 0.8, 8), ((7168, 7168), 0.9, 16),
                                              ((28672, 7168), 0.8, 16), ((9216, 4608), 0.9, 64)])
def test_opt_like_shapes(shape, sparsity, n):
    a = fast_random(*shape, 1 - sparsity, seed=1)
    kernel = run_check(a, n, FAMILY, calls=2)
    assert kernel.spec.tile_k == (128 if n <= 16 else 64)


@pytest.mark.parametrize("n", [1, 7, 8, 16, 33, 64])
@pytest.mark.parametrize("tile_k", [64, 128])
def test_empty_full_and_ragged_tiles(n, tile_k):
    """Fully dense tiles (every lane 32 or 64 values, 32-way bank conflicts), empty tiles (no stream,
    their barrier phase completed by a bare arrival), rows and columns past the grid."""
    dense = np.random.default_rng(2).standard_normal((128, 128))
    blocks = sp.block_diag([dense, np.zeros((256, 256)), random_csr(100, 77, 0.3, seed=3).toarray(), dense[:70, :]])
    a = sp.csr_matrix(blocks)
    a.eliminate_zeros()
    run_check(a, n, FAMILY, bias=np.linspace(-1, 1, a.shape[0]), relu=True, calls=2, tile_k=tile_k)


@pytest.mark.parametrize("reduction", ["atomic", "two_step", "cluster"])
@pytest.mark.parametrize("n", [1, 12, 64])
def test_split_k_reductions_and_repeat_calls(reduction, n):
    a = random_csr(300, 2000, 0.2, seed=4)
    kernel = run_check(a, n, FAMILY, bias=np.ones(300), calls=3, split_k=5, reduction=reduction)
    # K = 2000 is 16 k-tiles of 128 at N <= 16 (4 parts of 4 tiles: a fifth would be empty) and 32
    # of 64 above (5 parts of at most 7 tiles)
    assert kernel.spec.split_k == (4 if n <= 16 else 5) and kernel.spec.reduction == reduction


@pytest.mark.parametrize("stages", [2, 3, 6])
@pytest.mark.parametrize("n", [8, 16, 40])
def test_ring_depths_wrap_the_barrier_phases(stages, n):
    """Many tiles per block (no split): each stage's barrier completes many phases, its parity flips
    on every wrap of the ring; some tiles empty (a bare arrival keeps the phases counting tiles)."""
    a = random_csr(256, 128 * 40 + 3, 0.15, seed=5)
    a = sp.csr_matrix(a.multiply(np.repeat(np.arange(41) % 5 != 2, 128)[: a.shape[1]]))  # every fifth k-tile empty
    a.eliminate_zeros()
    kernel = run_check(a, n, FAMILY, calls=2, stages=stages, split_k=1)
    assert kernel.spec.stages == stages and kernel.spec.split_k == 1


@pytest.mark.parametrize("dtype,out", [("bfloat16", None), ("bfloat16", "float32"), ("float16", "float32")])
def test_dtypes(dtype, out):
    a = random_csr(500, 900, 0.15, seed=6)
    options = {"out": out} if out else {}
    run_check(a, 16, FAMILY, dtype=dtype, **options)
