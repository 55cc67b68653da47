"""GPU tier for the tensor-core tile families (tiled_csl_spmm, tiled_bitmap_spmm) against scipy:
random shapes, OPT-like shapes at 50-90 % sparsity, empty and dense tiles, residues, N = 1, every
split-K reduction, fp32 output, bf16 through torch tensors, fused bias and ReLU."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen

from .helpers import random_csr, reference, rel_error, torch_cuda as needs_torch
from .tiled_helpers import TOL, host_x, rounded_half

pytestmark = pytest.mark.gpu
FAMILIES = ["tiled_csl_spmm", "tiled_bitmap_spmm"]


def torch_cuda():
    return needs_torch("bf16 operands travel as torch tensors")


def run_check(a, n, family, dtype="float16", bias=None, relu=False, seed=0, calls=1, **options):
    """Compile for the GPU, run (NumPy for fp16, torch tensors for bf16), compare with float64 scipy."""
    kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="gpu",
                               options={"family": family, **options})
    x = host_x(np.random.default_rng(seed), a.shape[1], n, dtype)
    ref = reference(rounded_half(a, dtype), x.astype(np.float32), bias, relu)
    for _ in range(calls):  # split-K workspaces must be left clean for the next call
        if dtype == "bfloat16":
            torch = torch_cuda()
            y = kernel(torch.from_numpy(x).cuda().to(torch.bfloat16))
            assert y.dtype == (torch.float32 if options.get("out") == "float32" else torch.bfloat16)
            y = y.float().cpu().numpy()
        else:
            y = kernel(x)
        assert y.shape == (a.shape[0], n)
        err = rel_error(y, ref)
        assert err <= TOL[dtype], (kernel.spec.name, err)
    return kernel


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 400), k=st.integers(1, 400), density=st.floats(0.05, 1), n=st.integers(1, 80),
       family=st.sampled_from(FAMILIES), epilogue=st.sampled_from(["none", "bias", "bias_relu"]),
       seed=st.integers(0, 10_000))
def test_random_shapes_match_scipy(m, k, density, n, family, epilogue, seed):
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    run_check(a, n, family, bias=bias, relu=epilogue == "bias_relu", seed=seed)


def fast_random(m, k, density, seed):
    """A large uniform random pattern without scipy.sparse.random's cost (row blocks of a mask)."""
    rng = np.random.default_rng(seed)
    parts = []
    for r0 in range(0, m, 1024):
        rows = min(1024, m - r0)
        mask = rng.random((rows, k), dtype=np.float32) < density
        vals = np.where(mask, rng.standard_normal((rows, k), dtype=np.float32), 0)
        parts.append(sp.csr_matrix(vals))
    a = sp.vstack(parts).tocsr()
    a.sort_indices()
    return a


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape,sparsity,n", [((7168, 7168), 0.5, 16), ((4096, 14336), 0.9, 64),
                                              ((9216, 4608), 0.7, 8)])
def test_opt_like_shapes(family, shape, sparsity, n):
    a = fast_random(*shape, 1 - sparsity, seed=1)
    kernel = run_check(a, n, family)
    assert kernel.spec.split_k >= 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [1, 7, 8, 33, 64, 256])
def test_empty_and_dense_tiles_with_residues(family, n):
    dense = np.random.default_rng(2).standard_normal((128, 64))
    blocks = sp.block_diag([dense, np.zeros((128, 64)), random_csr(100, 50, 0.3, seed=3).toarray(), dense])
    a = sp.csr_matrix(blocks)  # tiles fully dense, empty, sparse, and rows/columns past the grid
    a.eliminate_zeros()
    run_check(a, n, family, bias=np.linspace(-1, 1, a.shape[0]), relu=True)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("reduction", ["atomic", "two_step", "cluster"])
@pytest.mark.parametrize("n", [1, 12, 64])
def test_split_k_reductions_and_repeat_calls(family, reduction, n):
    a = random_csr(300, 2000, 0.3, seed=4)
    kernel = run_check(a, n, family, bias=np.ones(300), calls=3, split_k=5, reduction=reduction)
    assert kernel.spec.split_k == 5 and kernel.spec.reduction == reduction


@pytest.mark.parametrize("granule", [1, 2])
@pytest.mark.parametrize("n,blocks,split_k", [(64, 4, 3), (64, 4, 1), (60, 4, 2), (32, 5, 4)])
def test_bitmap_residency_held_by_launch_bounds(granule, n, blocks, split_k):
    """options blocks= past the register estimate (ptxas held to 128 or 96 registers): wide and
    narrow blocks, residues in every dimension, split-K by a second launch, bias + ReLU, repeat calls."""
    a = random_csr(2000 + 37, 64 * 23 + 9, 0.25, seed=40 + n)
    kernel = run_check(a, n, "tiled_bitmap_spmm", bias=np.linspace(-1, 1, a.shape[0]), relu=True, calls=2,
                       granule=granule, blocks=blocks, split_k=split_k, tile_m=128)
    assert kernel.spec.min_blocks == blocks and kernel.spec.split_k == split_k


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("split_k", [2, 3, 7, 8])
def test_cluster_reduction_sizes_residues_and_relu(family, split_k):
    """Thread block clusters of 2..8 blocks (K not a multiple of the split, rows and columns past the
    last tile) reduce in distributed shared memory; bias + ReLU applied once, by the finishing block."""
    a = random_csr(333, 64 * 17 + 5, 0.35, seed=20 + split_k)
    kernel = run_check(a, 24, family, bias=np.linspace(-2, 2, 333), relu=True, calls=2, split_k=split_k,
                       reduction="cluster")
    k_tiles = -(-a.shape[1] // 64)  # the factor is lowered until no split is left empty
    assert kernel.spec.reduction == "cluster" and kernel.spec.split_k == -(-k_tiles // -(-k_tiles // split_k))
    kernel = run_check(a, 40, family, dtype="bfloat16", split_k=split_k, reduction="cluster", out="float32")
    assert kernel.spec.out == "f32"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n,tile_m,reduction", [(8, 128, "atomic"), (34, 128, "cluster"), (64, 256, "atomic"),
                                                (16, 256, "two_step")])
def test_eight_warp_blocks(family, n, tile_m, reduction):
    """Blocks of 8 warps (each 16 or 32 rows of the tile): full, empty and sparse tiles, residues,
    split-K through every reduction, bias + ReLU, repeat calls."""
    dense = np.random.default_rng(5).standard_normal((128, 64))
    a = sp.csr_matrix(sp.block_diag([dense, np.zeros((128, 64)), random_csr(300, 700, 0.3, seed=6).toarray(), dense]))
    a.eliminate_zeros()
    kernel = run_check(a, n, family, bias=np.linspace(-1, 1, a.shape[0]), relu=True, calls=2, warps=8, tile_m=tile_m,
                       split_k=3, reduction=reduction)
    assert kernel.spec.warps == 8 and kernel.spec.tile_m == tile_m and ".w8" in kernel.spec.name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n,bn,tile_m,reduction", [(64, 16, 128, "cluster"), (40, 8, 256, "atomic"),
                                                   (30, 16, 64, "two_step"), (100, 32, 128, "none")])
def test_narrow_column_blocks(family, n, bn, tile_m, reduction):
    """options bn= below N rounded up: several column blocks per row tile (the last one partial),
    full, empty and sparse tiles, every reduction, bias + ReLU, repeat calls."""
    dense = np.random.default_rng(5).standard_normal((128, 64))
    a = sp.csr_matrix(sp.block_diag([dense, np.zeros((128, 64)), random_csr(300, 700, 0.3, seed=6).toarray(), dense]))
    a.eliminate_zeros()
    split = {"split_k": 3, "reduction": reduction} if reduction != "none" else {}
    kernel = run_check(a, n, family, bias=np.linspace(-1, 1, a.shape[0]), relu=True, calls=2, bn=bn, tile_m=tile_m,
                       **split)
    assert kernel.spec.bn == bn and kernel.spec.n_tiles == -(-n // bn)


@pytest.mark.parametrize("n,warp_k,tile_m,warps,reduction", [
    (8, 4, 128, 4, "atomic"), (16, 4, 64, 4, "cluster"), (13, 4, 128, 4, "two_step"), (32, 2, 128, 4, "none"),
    (24, 2, 64, 4, "atomic"), (16, 4, 128, 8, "cluster"), (1, 2, 128, 4, "atomic")])
def test_k_group_warps(n, warp_k, tile_m, warps, reduction):
    """Tiled-CSL with its warps in k-groups: full, empty and sparse tiles, residues, every reduction,
    bias + ReLU, repeat calls (the k-groups re-zero only what they read)."""
    dense = np.random.default_rng(5).standard_normal((128, 64))
    a = sp.csr_matrix(sp.block_diag([dense, np.zeros((128, 64)), random_csr(300, 700, 0.3, seed=6).toarray(), dense]))
    a.eliminate_zeros()
    split = {"split_k": 3, "reduction": reduction} if reduction != "none" else {}
    kernel = run_check(a, n, "tiled_csl_spmm", bias=np.linspace(-1, 1, a.shape[0]), relu=True, calls=2,
                       warp_k=warp_k, tile_m=tile_m, warps=warps, **split)
    assert kernel.spec.warp_k == warp_k and f".wk{warp_k}" in kernel.spec.name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n,tile_m,warps,reduction,dtype", [
    (1, 128, 4, "none", "float16"), (7, 64, 4, "atomic", "float16"), (8, 128, 4, "atomic", "float16"),
    (16, 256, 8, "cluster", "float16"), (24, 128, 4, "two_step", "float16"), (32, 128, 4, "cluster", "bfloat16"),
    (64, 128, 4, "cluster", "float16"), (64, 64, 4, "atomic", "float16"), (80, 128, 8, "none", "float16"),
    (40, 128, 4, "atomic", "bfloat16")])
def test_warpgroup_mma(family, n, tile_m, warps, reduction, dtype):
    """options wgmma=True (the X tile read by the tensor cores from shared memory): full, empty and
    sparse tiles (a warp whose rows are empty still joins its warpgroup's wgmma), residues in M, K and
    N, every reduction, 8-warp blocks (two warpgroups), bf16, bias + ReLU, repeat calls."""
    dense = np.random.default_rng(7).standard_normal((128, 64))
    a = sp.csr_matrix(sp.block_diag([dense, np.zeros((128, 64)), random_csr(300, 700, 0.3, seed=8).toarray(),
                                     np.ones((20, 64)), dense]))
    a.eliminate_zeros()
    split = {"split_k": 3, "reduction": reduction} if reduction != "none" else {}
    kernel = run_check(a, n, family, dtype=dtype, bias=np.linspace(-1, 1, a.shape[0]), relu=True, calls=2,
                       wgmma=True, tile_m=tile_m, warps=warps, **split)
    assert kernel.spec.wgmma and ".wg" in kernel.spec.name


# Stream-K: (m, k, density, n, options). Units (m-tiles x k-tiles) shared so that blocks end inside
# m-tiles, span several, or hold whole ones (straight to Y); rows and columns past the tiles.
STREAM_CASES = [
    (700, 64 * 11 + 5, 0.15, 16, {}),  # 6 x 12 units: m-tiles shared by 3 blocks
    (2000, 3000, 0.1, 64, {}),  # 16 x 47 units
    (1000, 300, 0.3, 8, {"tile_m": 64}),  # 16 x 5 units, 4 a block: blocks span m-tiles
    (2000, 128, 0.3, 16, {}),  # 16 x 2 units, 4 a block: whole m-tiles written straight to Y
    (129, 5000, 0.2, 32, {}),  # two m-tiles, the second one row
    (300, 2000, 0.3, 34, {"out": "float32"}),
]


@pytest.mark.parametrize("family,granule", [("tiled_csl_spmm", None), ("tiled_bitmap_spmm", 1),
                                            ("tiled_bitmap_spmm", 2)])
@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: f"{c[0]}x{c[1]}-n{c[3]}")
def test_stream_k(family, granule, case):
    """Stream-K (options reduction='stream'): partial m-tiles summed by atomics and finished by the
    block completing them, whole ones stored directly; bias + ReLU; repeat calls (self-cleaning)."""
    m, k, density, n, options = case
    a = random_csr(m, k, density, seed=41, empty_rows=0.1)
    extra = {} if granule is None else {"granule": granule}
    kernel = run_check(a, n, family, bias=np.linspace(-1, 1, m), relu=True, calls=3, reduction="stream",
                       **options, **extra)
    assert kernel.spec.reduction == "stream" and ".stream" in kernel.spec.name
    assert 1 <= kernel.spec.grid <= kernel.spec.m_tiles * kernel.spec.k_tiles // 4 or kernel.spec.grid == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_stream_k_odd_n_and_bf16(family):
    a = random_csr(500, 1500, 0.3, seed=42, empty_rows=0.05)
    run_check(a, 33, family, reduction="stream", calls=2)
    run_check(a, 40, family, dtype="bfloat16", reduction="stream", calls=2)


def test_split_past_the_cluster_limit_falls_back_to_atomics():
    a = random_csr(256, 64 * 40, 0.3, seed=21)
    kernel = run_check(a, 16, "tiled_csl_spmm", split_k=10)
    assert kernel.spec.split_k == 10 and kernel.spec.reduction in ("atomic", "two_step")


@pytest.mark.parametrize("stages", [3, 4, 8])
@pytest.mark.parametrize("n", [8, 33, 64])
def test_csl_ring_depths_prefetch_and_slot_overflow(stages, n):
    """Ring depths, without the L2 prefetch, and slots too small for the fuller tiles (their rest
    comes from global memory) all give the same product."""
    a = sp.csr_matrix(sp.block_diag([np.ones((128, 64)), random_csr(300, 64 * 11, 0.3, seed=22).toarray()]))
    run_check(a, n, "tiled_csl_spmm", stages=stages)
    run_check(a, n, "tiled_csl_spmm", stages=stages, l2_prefetch=True, cap_vecs=24, split_k=3,
              reduction="cluster")
    run_check(a, n, "tiled_csl_spmm", stages=stages, cap_vecs=1, tile_m=64)


@pytest.mark.parametrize("granule", [1, 2])
@pytest.mark.parametrize("n", [1, 3, 33])
@pytest.mark.parametrize("options", [
    {"split_k": 1}, {"split_k": 3, "reduction": "atomic"}, {"split_k": 3, "reduction": "cluster"},
    {"split_k": 3, "reduction": "atomic", "l2_prefetch": True}, {"split_k": 2, "reduction": "two_step"},
    {"reduction": "stream"}, {"tile_m": 128, "split_k": 2, "reduction": "atomic"}, {"wgmma": True}])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_bitmap_odd_n(stages, options, n, granule):
    """Odd N: X rows only 2-byte aligned, so the ring writes the X tile with plain shared stores beside
    the cp.async copies. N = 1 and 3 with a 3-slot ring (600 x 800, 64-row tiles) are where a ring that
    mixes the two kinds of store goes wrong first; repeated calls check the split-K workspaces are left clean."""
    a = random_csr(600, 800, 0.3, seed=8)
    run_check(a, n, "tiled_bitmap_spmm", calls=3, stages=stages, granule=granule, **{"tile_m": 64, **options})


@pytest.mark.parametrize("stages", [2, 3, 8])
@pytest.mark.parametrize("tile_m", [64, 128, 256])
def test_bitmap_ring_depths_and_tile_heights(stages, tile_m):
    a = random_csr(600, 64 * 13 + 3, 0.4, seed=23)
    run_check(a, 16, "tiled_bitmap_spmm", stages=stages, tile_m=tile_m)
    run_check(a, 32, "tiled_bitmap_spmm", stages=stages, tile_m=tile_m, split_k=4, reduction="cluster",
              l2_prefetch=True)


def test_fully_dense_fragments_decode_exactly():
    """A dense 16 x 16 fragment has 256 values: the packed lane scan reaches 256 at lane 31."""
    a = sp.csr_matrix(np.random.default_rng(24).standard_normal((256, 256)))
    for family in FAMILIES:
        for tile_m in (64, 128, 256):
            run_check(a, 16, family, tile_m=tile_m)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 400), k=st.integers(1, 400), density=st.floats(0.05, 1), n=st.integers(1, 40),
       tile_m=st.sampled_from([64, 128, 256]), epilogue=st.sampled_from(["none", "bias", "bias_relu"]),
       seed=st.integers(0, 10_000))
def test_pair_bitmap_random_shapes_match_scipy(m, k, density, n, tile_m, epilogue, seed):
    """Granule 2 (a bit per mma register): every tile height, residues, empty rows, epilogues."""
    a = random_csr(m, k, density, seed=seed, empty_rows=0.1)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    n = 2 * n if tile_m < 256 else 2 * min(n, 16)
    run_check(a, n, "tiled_bitmap_spmm", bias=bias, relu=epilogue == "bias_relu", seed=seed, granule=2,
              tile_m=tile_m)


@pytest.mark.parametrize("options", [
    {"tile_m": 64}, {"tile_m": 128, "stages": 2}, {"tile_m": 256, "stages": 8},
    {"split_k": 3, "reduction": "atomic"}, {"split_k": 4, "reduction": "two_step"},
    {"split_k": 5, "reduction": "cluster", "l2_prefetch": True}, {"warps": 8, "split_k": 2, "reduction": "atomic"},
    {"wgmma": True, "split_k": 2, "reduction": "cluster"}, {"out": "float32"}])
@pytest.mark.parametrize("n", [2, 16, 64])
def test_pair_bitmap_configurations(options, n):
    if options.get("tile_m") == 256 and n > 32:
        n = 32
    a = random_csr(700, 64 * 11 + 5, 0.15, seed=31, empty_rows=0.05)
    run_check(a, n, "tiled_bitmap_spmm", granule=2, calls=2, **options)


def test_pair_bitmap_dense_fragments_and_bf16():
    """Dense fragments: a lane's prefix reaches 4 x 31 words in the packed even/odd scans."""
    a = sp.csr_matrix(np.random.default_rng(25).standard_normal((256, 256)))
    for tile_m in (64, 128, 256):
        run_check(a, 16, "tiled_bitmap_spmm", tile_m=tile_m, granule=2)
    run_check(random_csr(300, 500, 0.2, seed=26), 24, "tiled_bitmap_spmm", dtype="bfloat16", granule=2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tile_m", [64, 128, 256])
def test_tile_heights(family, tile_m):
    run_check(random_csr(700, 900, 0.4, seed=5), 24, family, tile_m=tile_m)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_output(family):
    a = random_csr(500, 700, 0.3, seed=6)
    kernel = run_check(a, 16, family, out="float32", split_k=2, reduction="two_step")
    assert kernel.spec.out == "f32"


def test_strict_banks_encoding():
    run_check(random_csr(512, 640, 0.2, seed=7), 32, "tiled_csl_spmm", strict_banks=True)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [1, 16, 40])
def test_bf16_through_torch(family, n):
    run_check(random_csr(600, 800, 0.3, seed=8), n, family, dtype="bfloat16", bias=np.ones(600))
    run_check(random_csr(300, 500, 0.5, seed=9), n, family, dtype="bfloat16", split_k=3, reduction="atomic",
              out="float32")


def test_torch_fp16_zero_copy_and_out_argument():
    torch = torch_cuda()
    a = random_csr(400, 300, 0.3, seed=10)
    kernel = sparsegen.compile(a, n=16, dtype="float16", backend="gpu", options={"family": "tiled_bitmap_spmm"})
    x = torch.randn(300, 16, device="cuda", dtype=torch.float16)
    out = torch.empty(400, 16, device="cuda", dtype=torch.float16)
    assert kernel(x, out=out) is out
    ref = reference(rounded_half(a, "float16"), x.float().cpu().numpy())
    assert rel_error(out.float().cpu().numpy(), ref) <= TOL["float16"]


def test_tuned_kernel_on_a_pruned_weight():
    """tune=True times the tiled families beside the CSR kernels and dense cuBLAS (where torch or
    CuPy is importable) and keeps the fastest."""
    from sparsegen.families import dense_gemm

    a = fast_random(3072, 8192, 0.3, seed=11)
    kernel = sparsegen.compile(a, n=32, dtype="float16", backend="gpu", tune=True)
    dense = {"dense_gemm"} if dense_gemm.find_library("float16") else set()
    assert {t.family for t in kernel.tuning} >= set(FAMILIES) | dense
    # bitmap timed in both encodings, each under its own spec
    bitmap = {t.options: t.spec for t in kernel.tuning if t.family == "tiled_bitmap_spmm"}
    assert set(bitmap) == {"granule=1", "granule=2"} and bitmap["granule=2"].endswith(".g2")
    best = min(kernel.tuning, key=lambda t: t.ms)
    assert kernel.spec.family == best.family and kernel.spec.name == best.spec
    x = host_x(np.random.default_rng(0), 8192, 32, "float16")
    assert rel_error(kernel(x), reference(rounded_half(a, "float16"), x.astype(np.float32))) <= TOL["float16"]
    again = sparsegen.compile(a, n=32, dtype="float16", backend="gpu", tune=True)
    assert again.tuning == kernel.tuning and again.spec.name == kernel.spec.name  # from the cache, same variant
