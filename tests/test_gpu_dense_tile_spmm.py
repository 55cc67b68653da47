"""GPU tier for `dense_tile_spmm` (forced, and as selected on DLMC): the generated kernel against a
float64 reference on random matrices, the edges of its tiles, copies and K splits, and DLMC layers."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen.bench.dlmc import dlmc_matrices

from .helpers import TOL, random_csr, reference, rel_error, term_error

pytestmark = pytest.mark.gpu
FAMILY = "dense_tile_spmm"
MMAS = ("tf32x3", "f16x3")


# 3xTF32 carries about 22 significant bits per product, fp32 24: where an output's terms cancel (one
# output of a dozen terms, say), its error against the output itself can pass 1e-5 as SGEMM's nearly
# could. Such a case is held to the dot product's own error bound instead: error relative to
# |W| |X| (+ |bias|), the sum of the magnitudes of the terms, at most SCALED_TOL.
SCALED_TOL = 1e-6


def check(a, n, bias=None, relu=False, seed=0, forced=True, **options):
    opts = {"family": FAMILY, **options} if forced else (options or None)
    kernel = sparsegen.compile(a, op="spmm", n=n, bias=bias, relu=relu, backend="gpu", options=opts)
    x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(np.float32)
    ref = reference(a, x, bias, relu)
    for _ in range(2):  # a split K's workspace and counters must come back zeroed
        y = kernel(x)
        assert y.shape == (a.shape[0], n) and y.dtype == np.float32
        err = rel_error(y, ref)
        scaled = term_error(y, ref, a, x, bias)
        assert err <= TOL["float32"] or scaled <= SCALED_TOL, (kernel.spec.name, err, scaled)
    return kernel


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 700), n=st.integers(1, 200), density=st.floats(0, 1),
       tile_m=st.sampled_from([64, 128]), tile_n=st.sampled_from([64, 128]),
       split_k=st.sampled_from([None, 1, 2, 5, 64]), epilogue=st.booleans(), seed=st.integers(0, 10_000),
       mma=st.sampled_from(MMAS))
def test_random_matrices_match_reference(m, k, n, density, tile_m, tile_n, split_k, epilogue, seed, mma):
    options = {"tile_m": tile_m, "tile_n": tile_n, "mma": mma, **({"split_k": split_k} if split_k else {})}
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue else None
    check(random_csr(m, k, density, seed=seed, empty_rows=0.1), n, bias, epilogue, seed, **options)


@pytest.mark.parametrize("shape,n", [
    ((64, 64), 64),  # one whole tile, one slice pair
    ((65, 33), 65),  # a row and a column past the tile, K past a slice: zero-filled copies
    ((1, 1), 1), ((1, 4096), 1), ((4096, 1), 3),  # single rows, columns, K = 1
    ((130, 4100), 6),  # K % 4 == 0 but N % 4 != 0: float2 copies of X, scalar finish
    ((200, 2050), 128),  # K % 4 == 2: 8-byte copies of W
])
@pytest.mark.parametrize("split_k", [1, 3, 1000])
@pytest.mark.parametrize("mma", MMAS)
def test_edges_of_tiles_copies_and_splits(shape, n, split_k, mma):
    a = random_csr(*shape, 0.3, seed=shape[0] + n)
    kernel = check(a, n, np.linspace(-1, 1, shape[0]), True, split_k=split_k, mma=mma)
    assert kernel.spec.split_k == min(split_k, kernel.spec.slices)


@pytest.mark.parametrize("mma", MMAS)
def test_empty_matrix_gives_the_epilogue_of_zero(mma):
    a = sp.csr_matrix((150, 300), dtype=np.float32)
    check(a, 40, np.linspace(-1, 1, 150), True, split_k=4, mma=mma)


@pytest.mark.parametrize("mma", MMAS)
def test_large_values_keep_float32_accuracy(mma):
    """~22 bits per product: values spread over 2^-20..2^20 still meet fp32's tolerance (f16x3: fp16's
    range is reached by scaling W's rows and X's columns)."""
    rng = np.random.default_rng(5)
    a = random_csr(256, 1024, 0.5, seed=5)
    a.data *= np.exp2(rng.integers(-20, 20, a.nnz)).astype(np.float32)
    check(a, 96, split_k=4, mma=mma)


@pytest.mark.parametrize("x_scale", [1e-30, 1e-8, 1e8, 1e25])
@pytest.mark.parametrize("spread", [False, True])
def test_f16x3_scales_x_past_fp16_range(x_scale, spread):
    """X far outside fp16's range (6e-8..65504), whole or per column and row, keeps fp32 accuracy:
    each slice's columns are scaled before the split. Checked against the CPU emulator too."""
    a = random_csr(200, 700, 0.4, seed=7)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((700, 48)).astype(np.float32) * np.float32(x_scale)
    if spread:
        x *= np.exp2(rng.integers(-30, 30, x.shape)).astype(np.float32)
    kernel = sparsegen.compile(a, op="spmm", n=48, backend="gpu", options={"family": FAMILY, "mma": "f16x3",
                                                                           "split_k": 3})
    y = kernel(x)
    ref = reference(a, x, None, False)
    assert term_error(y, ref, a, x, None) <= SCALED_TOL, (x_scale, spread)
    emulated = sparsegen.compile(a, op="spmm", n=48, backend="emulate", options={"family": FAMILY, "mma": "f16x3",
                                                                             "split_k": 3})(x)
    assert rel_error(y, emulated) <= 1e-6


@pytest.mark.parametrize("n", [32, 256])
def test_dlmc_layers_it_is_selected_for(n, data_dir):
    picked = 0
    for m in dlmc_matrices(data_dir)[::3]:
        a = m.load()
        kernel = sparsegen.compile(a, op="spmm", n=n, backend="gpu")
        if kernel.spec.family != FAMILY:
            continue
        picked += 1
        check(a, n, forced=False, seed=picked)
    assert picked > 0
