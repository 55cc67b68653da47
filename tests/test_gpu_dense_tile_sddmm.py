"""GPU tier for `dense_tile_sddmm` (forced, and as selected on DLMC): the generated kernel against a
float64 reference on random matrices, the edge cases of its tiles and of k, and every DLMC matrix."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen.bench.dlmc import dlmc_matrices

from .helpers import TOL, random_csr, rel_error
from .test_gpu_sddmm import check_unsampled_products_stay_out, operands, reference

pytestmark = pytest.mark.gpu
FAMILY = "dense_tile_sddmm"


def run_check(a, k, seed=0, forced=True, **options):
    opts = {"family": FAMILY, **options} if forced else (options or None)
    kernel = sparsegen.compile(a, op="sddmm", k=k, options=opts, backend="gpu")
    x, y = operands(a, k, "float32", seed)
    out = kernel(x, y)
    assert out.shape == (a.nnz,) and out.dtype == np.float32
    err = rel_error(out, reference(a, x, y))
    assert err <= TOL["float32"], (kernel.spec.name, err)
    return kernel


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), density=st.floats(0, 1),
       k=st.one_of(st.integers(1, 300), st.sampled_from([32, 64, 128, 256])),
       tile_m=st.sampled_from([32, 64, 128]), seed=st.integers(0, 10_000))
def test_random_matrices_match_reference(m, n, density, k, tile_m, seed):
    run_check(random_csr(m, n, density, seed=seed, empty_rows=0.1), k, seed, tile_m=tile_m)


def edge_matrix(case):
    if case == "all_empty":
        return sp.csr_matrix((64, 80), dtype=np.float32)
    if case == "full":  # every tile full, partial tiles at both edges
        return sp.csr_matrix(np.ones((130, 131), np.float32))
    if case == "one_entry":  # one active tile, in the last tile row and column
        return sp.csr_matrix(([1.0], ([299], [299])), shape=(300, 300), dtype=np.float32)
    if case == "column_63_64":  # entries either side of a mask word's edge
        rows = np.arange(100)
        return sp.csr_matrix((np.ones(200, np.float32), (np.r_[rows, rows], np.r_[[63] * 100, [64] * 100])),
                             shape=(100, 129))
    if case == "sparse_blocks":  # most tiles empty: only the diagonal ones launch
        return sp.block_diag([random_csr(64, 64, 0.5, seed=i) for i in range(6)], format="csr").astype(np.float32)
    return random_csr(1, 500, 0.4, seed=2)  # "one_row"


@pytest.mark.parametrize("case", ["all_empty", "full", "one_entry", "column_63_64", "sparse_blocks", "one_row"])
@pytest.mark.parametrize("k", [1, 2, 3, 8, 31, 33, 100, 256])
@pytest.mark.parametrize("tile_m", [32, 64, 128])
def test_edge_cases(case, k, tile_m):
    run_check(edge_matrix(case), k, seed=k, tile_m=tile_m)


@pytest.mark.parametrize("slice_k", [8, 16, 32, 64])
def test_every_slice_width(slice_k):
    a = random_csr(200, 170, 0.3, seed=3, empty_rows=0.1)
    for k in (4, 36, 100, 128):
        kernel = run_check(a, k, seed=k, slice_k=slice_k)
        assert kernel.spec.slice_k == slice_k


def test_long_k_walks_many_slices():
    kernel = run_check(random_csr(70, 90, 0.5, seed=4), 5000, seed=1)
    assert kernel.spec.k // kernel.spec.slice_k > 100


def test_only_stored_entries_are_kept():
    """Whole tiles are computed: unsampled products that are inf or NaN must not reach the output."""
    check_unsampled_products_stay_out(0.4, family=FAMILY)


def test_selected_for_a_dense_pattern():
    kernel = run_check(random_csr(512, 2048, 0.5, seed=5), 128, forced=False)
    assert kernel.spec.family == FAMILY


def test_every_dlmc_matrix(data_dir):
    for source in dlmc_matrices(data_dir):
        a = source.load()
        for k in (32, 128):
            run_check(a, k, seed=source.seed + k)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_every_pipeline_depth(stages):
    a = random_csr(150, 260, 0.3, seed=6, empty_rows=0.1)
    for k in (8, 40, 96, 200):  # one slice, two, three, seven
        kernel = run_check(a, k, seed=k, stages=stages)
        assert kernel.spec.stages == stages
