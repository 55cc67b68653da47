"""GPU tier, `sputnik_spmm`: the code paths its spec fields select, against scipy."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsegen

from .helpers import TOL, random_csr, reference, rel_error, rounded

pytestmark = pytest.mark.gpu


def check(a, n, dtype="float32", bias=None, relu=False, seed=0, x=None, **options):
    kernel = sparsegen.compile(a, op="spmm", n=n, dtype=dtype, bias=bias, relu=relu, backend="gpu",
                               options={"family": "sputnik_spmm", **options})
    a = rounded(a, dtype)
    if x is None:
        x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(dtype)
    y = kernel(x)
    ref = reference(a, x, bias, relu)
    assert np.isfinite(y).all() == np.isfinite(ref).all()
    err = rel_error(y, ref)
    assert err <= TOL[dtype], (kernel.spec.name, err)
    return kernel


def staircase(m: int, k: int, seed: int) -> sp.csr_matrix:
    """Row lengths 0, 1, 2, ... 37, repeating: every row start misaligned some way, rows shorter
    than the vector width, and rows that end mid-chunk."""
    rng = np.random.default_rng(seed)
    lengths = np.arange(m) % 38
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = np.concatenate([np.sort(rng.choice(k, size=L, replace=False)) for L in lengths])
    return sp.csr_matrix((rng.standard_normal(cols.size).astype(np.float32), cols, indptr), shape=(m, k))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", [1, 3, 8, 20, 64, 96, 256])
def test_misaligned_row_starts_and_short_rows(dtype, n):
    check(staircase(301, 500, n), n, dtype)


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("n,options", [(1, {}), (7, {}), (32, {}), (128, {}), (32, {"ksplit": 8}),
                                       (32, {"piece": 24}), (256, {"chunk": 64})])
def test_prefetched_and_plain_chunks_agree_with_scipy(prefetch, n, options):
    """Both loops, forced either way, over misaligned starts, rows shorter than a vector, rows
    ending mid-chunk, rows split across groups, and rows of many chunks."""
    a = sp.vstack([staircase(301, 700, n), random_csr(40, 700, 0.5, seed=n)]).tocsr()
    kernel = check(a, n, prefetch=prefetch, **options)
    assert kernel.spec.prefetch == bool(prefetch)


@pytest.mark.parametrize("ksplit", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_row_split_adds_the_shares(ksplit, dtype):
    a = random_csr(37, 4000, 0.2, seed=ksplit, empty_rows=0.2)  # ~800 per row, some empty rows
    kernel = check(a, 64, dtype, bias=np.linspace(-1, 1, 37), relu=True, ksplit=ksplit)
    assert kernel.spec.ksplit == ksplit


def skewed_rows(m: int, k: int, seed: int) -> sp.csr_matrix:
    """Mostly short rows, a few up to k long, some empty: each split class of the per-row split."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(k, (rng.pareto(1.2, m) * 20).astype(np.int64))
    lengths[rng.random(m) < 0.1] = 0
    lengths[:3] = (k, k // 2, 33)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = np.concatenate([np.sort(rng.choice(k, size=L, replace=False)) for L in lengths])
    return sp.csr_matrix((rng.standard_normal(cols.size).astype(np.float32), cols, indptr), shape=(m, k))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n,options", [(512, {"balance": 1}), (256, {"piece": 16}), (96, {"piece": 40}),
                                       (37, {"piece": 64, "ksplit": 4}), (8, {"balance": 1}), (1, {"piece": 8})])
def test_rows_split_per_row_add_their_shares(dtype, n, options):
    m = 777
    kernel = check(skewed_rows(m, 1500, n), n, dtype, bias=np.linspace(-1, 1, m), relu=True, **options)
    assert kernel.spec.balanced and kernel.spec.ksplit > 1


@pytest.mark.parametrize("tile_bytes", [16, 64, 512])
def test_tile_widths(tile_bytes):
    kernel = check(random_csr(200, 300, 0.1, seed=3), 200, "float32", tile_bytes=tile_bytes)
    assert kernel.spec.tile_n * 4 <= max(tile_bytes, 4 * kernel.spec.vec)


@pytest.mark.parametrize("chunk,batch,block", [(64, 8, 128), (128, 16, 256), (128, 4, 64), (32, 32, 512)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_chunk_batch_and_block_options(chunk, batch, block, dtype):
    a = random_csr(301, 900, 0.3, seed=chunk + batch, empty_rows=0.1)  # ~270 per row: whole and partial chunks
    kernel = check(a, 96, dtype, chunk=chunk, batch=batch, block=block)
    assert (kernel.spec.chunk, kernel.spec.batch) == (chunk, min(batch, chunk))


@pytest.mark.parametrize("n", [128, 200, 1000])
def test_many_long_rows_in_16_row_blocks(n):
    """The family's own choice for many long rows (64-nonzero chunks, 512-thread blocks), with rows left
    over in the last block and a partial column tile at n = 200 and 1000 (1000: 16800 warps, a big grid
    with 8 loads of X in flight)."""
    kernel = check(random_csr(2100, 2048, 0.2, seed=n, empty_rows=0.05), n, seed=n)
    assert (kernel.spec.chunk, kernel.spec.rows) == (64, 16)


def test_fp16_with_32768_columns_uses_32bit_indices():
    a = random_csr(64, 40000, 0.01, seed=4)
    a[3, 39999] = 1.5  # the last column is read
    a = a.tocsr()
    kernel = check(a, 16, "float16")
    assert kernel.spec.index_bits == 32


def test_fp16_with_32767_columns_uses_16bit_indices():
    a = random_csr(64, 32767, 0.01, seed=5)
    a[0, 32766] = 2.0
    kernel = check(a.tocsr(), 24, "float16")
    assert kernel.spec.index_bits == 16


def test_swizzled_rows_write_their_own_outputs():
    a = sp.vstack([random_csr(100, 600, 0.01, seed=6), random_csr(5, 600, 0.9, seed=7),
                   random_csr(100, 600, 0.05, seed=8)]).tocsr()
    kernel = check(a, 32, "float32", bias=np.arange(205, dtype=np.float32))
    assert kernel.spec.swizzle


def test_inf_in_x_reaches_only_the_rows_that_read_it():
    a = staircase(120, 64, 9)
    x = np.random.default_rng(9).standard_normal((64, 8)).astype(np.float32)
    x[5, :] = np.inf  # column 5 of A: rows without it must stay finite (no 0 * inf from padding)
    kernel = sparsegen.compile(a, n=8, backend="gpu", options={"family": "sputnik_spmm"})
    y = kernel(x)
    reads = np.asarray((a[:, 5] != 0).todense()).ravel()
    assert np.isfinite(y[~reads]).all()
    assert rel_error(y[~reads], reference(a, x)[~reads]) <= 1e-5


def test_wide_offsets_when_n_times_columns_overflows_32_bits():
    torch = pytest.importorskip("torch")
    # 70000 columns x n = 32768 > 2^31 elements: staged offsets are columns, scaled in 64-bit
    k, n = 70000, 32768
    a = sp.csr_matrix((np.array([1.0, -2.0, 0.5, 3.0], np.float32), [0, 69999, 35000, 69998], [0, 2, 3, 4]),
                      shape=(3, k))
    kernel = sparsegen.compile(a, n=n, dtype="float16", backend="gpu", options={"family": "sputnik_spmm"})
    assert kernel.spec.wide and not kernel.spec.prescaled
    x = torch.randn((k, n), dtype=torch.float16, device="cuda")
    y = kernel(x)
    dense = torch.from_numpy(a.toarray()).cuda()
    ref = dense[:, [0, 35000, 69998, 69999]].float() @ x[[0, 35000, 69998, 69999]].float()
    assert rel_error(y.float().cpu().numpy(), ref.cpu().numpy()) <= 1e-2
