"""Cutting a CSR matrix into tensor-core tiles: which tile each nonzero falls in, and where.

Tiles are `tile_m` x `tile_k` (rows x columns) and are numbered row-major over the tile grid,
`tile = row_tile * k_tiles + col_tile`, so a thread block walking along K reads consecutive
tiles. Edge tiles are padded with zeros: the encoders simply have no nonzeros there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

TILE_K = 64  # columns of a tile: one 128-byte shared-memory row of 16-bit values


@dataclass(frozen=True)
class TileGrid:
    m: int
    k: int
    tile_m: int
    tile_k: int = TILE_K

    @property
    def m_tiles(self) -> int:
        return -(-self.m // self.tile_m)

    @property
    def k_tiles(self) -> int:
        return -(-self.k // self.tile_k)

    @property
    def tiles(self) -> int:
        return self.m_tiles * self.k_tiles

    @property
    def area(self) -> int:
        return self.tile_m * self.tile_k


@dataclass(frozen=True)
class TiledNonzeros:
    """Every nonzero of the matrix in CSR order: its tile, its row and column inside the tile."""

    tile: np.ndarray  # int64
    row: np.ndarray  # int32, 0 .. tile_m - 1
    col: np.ndarray  # int32, 0 .. tile_k - 1
    values: np.ndarray  # float32 (or float64), CSR data


def split_tiles(csr: sp.csr_matrix, grid: TileGrid) -> TiledNonzeros:
    nnz = int(csr.nnz)
    rows = np.repeat(np.arange(grid.m, dtype=np.int64), np.diff(np.asarray(csr.indptr, dtype=np.int64)))
    cols = np.asarray(csr.indices[:nnz], dtype=np.int64)
    tile = (rows // grid.tile_m) * grid.k_tiles + cols // grid.tile_k
    return TiledNonzeros(tile, (rows % grid.tile_m).astype(np.int32), (cols % grid.tile_k).astype(np.int32),
                         np.asarray(csr.data[:nnz]))


def rank_in_group(sorted_groups: np.ndarray) -> np.ndarray:
    """Position of each element inside its run of equal values (input sorted by group)."""
    n = sorted_groups.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    start = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    run_first = np.repeat(start, np.diff(np.r_[start, n]))
    return np.arange(n, dtype=np.int64) - run_first


def check_half_csr(csr) -> sp.csr_matrix:
    if not (sp.issparse(csr) and csr.format == "csr"):
        raise TypeError(f"expected a scipy.sparse CSR matrix, got {type(csr).__name__}")
    return csr
