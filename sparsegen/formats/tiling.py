"""Cutting a CSR matrix into tensor-core tiles: which tile each nonzero falls in, and where.

Tiles are `tile_m` x `tile_k` (rows x columns) and are numbered row-major over the tile grid,
`tile = row_tile * k_tiles + col_tile`, so a thread block walking along K reads consecutive
tiles. Edge tiles are padded with zeros: the encoders simply have no nonzeros there.

The encoders work through the matrix a band of row tiles at a time (`bands`): a band's nonzeros
are one contiguous slice of the CSR arrays and its tiles one contiguous run of tile numbers, so
each band is encoded on its own with 32-bit (mostly 16-bit) temporaries and its words appended.
That bounds the encoders' memory by the band, not the matrix (an OPT-175B weight has 300 M
nonzeros), and keeps every sort key inside 16 bits, where NumPy's stable sort is a radix sort.
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
class Band:
    """Row tiles [first, stop) of a grid: their nonzeros are CSR slice [lo, hi)."""

    first: int
    stop: int
    lo: int
    hi: int

    @property
    def row_tiles(self) -> int:
        return self.stop - self.first


# A band holds at most this many tiles (so tile * 32 + bank fits 16 bits) and, past one row tile,
# at most this many nonzeros (a few hundred MB of temporaries at most).
BAND_TILES = 2048
BAND_NONZEROS = 1 << 23


def bands(indptr: np.ndarray, grid: TileGrid, max_tiles: int = BAND_TILES,
          max_nonzeros: int = BAND_NONZEROS) -> list[Band]:
    """Consecutive bands of whole row tiles covering the grid (at least one row tile each)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    starts = indptr[np.minimum(np.arange(grid.m_tiles + 1, dtype=np.int64) * grid.tile_m, grid.m)]
    by_tiles = max(1, max_tiles // max(grid.k_tiles, 1))
    out, first = [], 0
    while first < grid.m_tiles:
        # the most row tiles (>= 1, <= by_tiles) whose nonzeros stay within max_nonzeros
        stop = int(np.searchsorted(starts, starts[first] + max_nonzeros, side="right")) - 1
        stop = min(max(stop, first + 1), first + by_tiles, grid.m_tiles)
        out.append(Band(first, stop, int(starts[first]), int(starts[stop])))
        first = stop
    return out


def band_nonzeros(csr: sp.csr_matrix, grid: TileGrid, band: Band) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tile within the band, row within the tile, column within the tile), int32, of the band's
    nonzeros in CSR order."""
    r0 = band.first * grid.tile_m
    r1 = min(band.stop * grid.tile_m, grid.m)
    lengths = np.diff(np.asarray(csr.indptr[r0:r1 + 1], dtype=np.int64))
    rows = np.repeat(np.arange(r1 - r0, dtype=np.int32), lengths)
    cols = np.asarray(csr.indices[band.lo:band.hi], dtype=np.int32)
    tile = (rows // np.int32(grid.tile_m)) * np.int32(grid.k_tiles) + cols // np.int32(grid.tile_k)
    return tile, rows % np.int32(grid.tile_m), cols % np.int32(grid.tile_k)


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """Stable argsort (int64) of non-negative integer keys below `bound`: least-significant-digit
    radix sort by 16-bit digits, each digit one of NumPy's radix sorts of uint16 (a 16-bit key
    takes one pass)."""
    keys = np.asarray(keys)
    passes = max(1, -(-max(int(bound) - 1, 0).bit_length() // 16))
    order = None
    for p in range(passes):
        digit = ((keys >> (16 * p)) & 0xFFFF).astype(np.uint16)
        if order is None:
            order = np.argsort(digit, kind="stable")
        else:
            order = order[np.argsort(digit[order], kind="stable")]
    return order if order is not None else np.zeros(0, dtype=np.int64)


def rank_in_group(sorted_groups: np.ndarray) -> np.ndarray:
    """Position of each element inside its run of equal values (input sorted by group)."""
    n = sorted_groups.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    index = np.arange(n, dtype=np.int64)
    start = np.empty(n, dtype=bool)
    start[0] = True
    np.not_equal(sorted_groups[1:], sorted_groups[:-1], out=start[1:])
    return index - np.maximum.accumulate(np.where(start, index, 0))


def check_half_csr(csr) -> sp.csr_matrix:
    if not (sp.issparse(csr) and csr.format == "csr"):
        raise TypeError(f"expected a scipy.sparse CSR matrix, got {type(csr).__name__}")
    return csr
