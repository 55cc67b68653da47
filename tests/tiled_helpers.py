"""Shared by the tiled-family tests: bf16-aware references, and NumPy mirrors of the kernels' index
math (ldmatrix addressing, the X tile swizzle, fragment layouts) as PTX documents them, so the
encoders and templates are checked against the mma operand layouts without a GPU."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsegen.formats.halfbits import round_to

TOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5}


def rounded_half(a, dtype):
    """`a` with values rounded to `dtype` (float16 or bfloat16), stored as float32."""
    a = sp.csr_matrix(a, dtype=np.float32, copy=True)
    a.data = round_to(a.data, dtype)
    return a


def host_x(rng, k, n, dtype):
    """X as the emulator takes it: float16, float32, or float32 holding bf16 values for bfloat16."""
    x = rng.standard_normal((k, n)).astype(np.float32)
    if dtype == "float32":
        return x
    return x.astype(np.float16) if dtype == "float16" else round_to(x, "bfloat16")


def a_fragment_positions(lane, reg):
    """(row, col) inside a 16x16 tile of A-operand element (lane, reg) of m16n8k16, both halves."""
    g, t = lane // 4, lane % 4
    row = g + 8 * (reg % 2)
    col = 2 * t + 8 * (reg // 2)
    return row, np.stack([col, col + 1])


def ldmatrix(smem_halves, row_addr_halves, trans=False):
    """ldmatrix.x4 (or .trans): lane l supplies the half address of row l % 8 of matrix l // 8; lane t
    receives per matrix j (non-trans) row t // 4, halves 2 (t % 4) + {0, 1}; with .trans the
    transpose: halves at rows 2 (t % 4) + {0, 1}, column t // 4. Returns [lane][j][2] halves."""
    mats = np.stack([np.stack([smem_halves[row_addr_halves[8 * j + r] + np.arange(8)] for r in range(8)])
                     for j in range(len(row_addr_halves) // 8)])  # [j][row][col]
    t = np.arange(32)
    if not trans:
        return np.stack([mats[:, t // 4, 2 * (t % 4)], mats[:, t // 4, 2 * (t % 4) + 1]], axis=-1).transpose(1, 0, 2)
    return np.stack([mats[:, 2 * (t % 4), t // 4], mats[:, 2 * (t % 4) + 1, t // 4]], axis=-1).transpose(1, 0, 2)


def x_chunk(row, chunk, bn):
    g = row * (bn // 8) + chunk
    return g ^ ((g >> 3) & 7)


def x_tile_smem(x_tile, bn, xv):
    """The shared X tile as load_x_tile writes it (halves), from a dense 64 x bn block."""
    smem = np.zeros(64 * bn, dtype=x_tile.dtype)
    for row in range(64):
        for col in range(0, bn, xv):
            at = x_chunk(row, col >> 3, bn) * 8 + (col & 7)
            smem[at:at + xv] = x_tile[row, col:col + xv]
    return smem


def b_fragments(smem_x, bn, ks):
    """load_b's registers: [nf][lane][reg][half] from the swizzled X tile."""
    lane = np.arange(32)
    j = lane >> 3
    row = ks * 16 + (lane & 7) + ((j & 1) << 3)
    out = np.zeros((bn // 8, 32, 2, 2), dtype=smem_x.dtype)
    if bn == 8:
        r = ldmatrix(smem_x, x_chunk(row, 0, bn)[:16] * 8, trans=True)
        out[0] = r[:, :2]
        return out
    for nf in range(0, bn // 8, 2):
        r = ldmatrix(smem_x, x_chunk(row, nf + (j >> 1), bn) * 8, trans=True)
        out[nf], out[nf + 1] = r[:, 0:2], r[:, 2:4]
    return out


def b_expected(x_tile, ks, nf):
    """B operand of m16n8k16 (col): lane t, reg j, half h = X[ks*16 + 2 (t % 4) + h + 8 j][nf*8 + t // 4]."""
    t = np.arange(32)[:, None, None]
    j = np.arange(2)[None, :, None]
    h = np.arange(2)[None, None, :]
    return x_tile[ks * 16 + 2 * (t % 4) + h + 8 * j, nf * 8 + t // 4]


def pinned_library(library):
    """Pin the dense fallback's cuBLAS binding ("torch", "cupy" or None for a machine with neither),
    so a selection test decides the same here and on the GPU machine."""
    from unittest import mock

    from sparsegen.families import dense_gemm

    def find(dtype):
        return library if library is not None and dtype in dense_gemm.LIBRARY_DTYPES[library] else None

    return mock.patch.object(dense_gemm, "find_library", find)


def select_tiled(stats, op="spmm", n=None, dtype="float16", arch="sm_90", dense=None, **options):
    """The rule table, with the dense fallback's binding pinned (`dense`: "torch", "cupy" or None):
    by default no binding, as on a machine without torch or CuPy, so the tiled tests see the choice
    between the two tile formats and the CSR kernels."""
    from sparsegen.families.base import Request
    from sparsegen.select import select_request

    with pinned_library(dense):
        return select_request(stats, Request(op=op, n=n, dtype=dtype, arch=arch,
                                             options=tuple(sorted(options.items()))))


def uniform_stats(m, k, density, seed=1):
    """MatrixStats of an m x k matrix with a uniformly random pattern of `density`, without building
    it (OPT shapes hold hundreds of millions of entries): every 128 x 64 tile near the same density,
    so the tile-density histogram is one bin."""
    import dataclasses

    from sparsegen.analyze import LengthStats, TileStats, analyze

    from .helpers import random_csr

    s = analyze(random_csr(256, 256, density, seed=seed))
    tiles = -(-m // 128) * -(-k // 64)
    hist = [0] * 10
    hist[min(int(density * 10), 9)] = tiles
    means = tuple(density if count else 0.0 for count in hist)
    t = TileStats(128, 64, tiles, tiles, int(density * 8192 * 1.1), density * 8192, float(density > 0.5), tuple(hist),
                  means)
    mean, std = density * k, (k * density * (1 - density)) ** 0.5  # binomial row lengths
    rows = LengthStats(int(max(0, mean - 5 * std)), int(mean + 5 * std), mean, std, std / mean, 0)
    return dataclasses.replace(s, shape=(m, k), nnz=int(density * m * k), density=density, tiles=t, row_lengths=rows)
