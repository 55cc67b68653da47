"""An SDDMM pattern cut into dense output tiles, as the `dense_tile_sddmm` kernel reads it.

The pattern (m x n) is cut into `tile_m` x 64 tiles; only tiles holding a stored entry are listed
("active"), in row-major tile order. A thread block computes one active tile of A·Bᵀ densely and
stores the entries the pattern samples. Where the entries of one row inside one tile go in the CSR
output is a single range (CSR is sorted by column), so a row of a tile needs only the 64-bit mask
of its stored columns and the output position of its first one: entry (r, c) goes to
base + popcount(mask & (2^c - 1)).

Arrays (what the kernel reads, nothing else):

- `tiles` int32 (T, 2): {tile row, tile column} of each active tile.
- `masks` uint64 (T, tile_m): bit c of row r = entry (tile row x tile_m + r, tile column x 64 + c)
  is stored. Rows past m are 0.
- `bases` int32 (T, tile_m): the CSR position of row r's first stored entry in the tile (0 where
  the mask is 0).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan
from .csr_sddmm import sampled_products

NAME = "sampled_tiles"
TILE_N = 64  # columns of a tile: one 64-bit mask per tile row
INT32_MAX = np.iinfo(np.int32).max
GATHER_CHUNK = 1 << 24  # tile elements expanded to bits per step of `gather`


def encode(csr: sp.csr_matrix, *, tile_m: int) -> Plan:
    """Cut `csr` (canonical: sorted, no duplicates) into tile_m x 64 tiles and list the active ones."""
    if tile_m < 1:
        raise ValueError(f"tile_m {tile_m}: must be positive")
    m, n = csr.shape
    if csr.nnz > INT32_MAX:
        raise OverflowError("output positions exceed 32 bits")
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    cols = np.asarray(csr.indices, dtype=np.int64)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(indptr))
    tile_cols = -(-n // TILE_N)
    # One segment per (row, tile column) that holds entries: contiguous in CSR order.
    seg_key = rows * tile_cols + cols // TILE_N
    starts = np.flatnonzero(np.r_[True, seg_key[1:] != seg_key[:-1]]) if seg_key.size else np.zeros(0, np.int64)
    seg_row, seg_tc = rows[starts], cols[starts] // TILE_N
    bits = np.left_shift(np.uint64(1), (cols % TILE_N).astype(np.uint64))
    seg_mask = np.bitwise_or.reduceat(bits, starts) if starts.size else np.zeros(0, np.uint64)
    tile_key = (seg_row // tile_m) * tile_cols + seg_tc
    active = np.unique(tile_key)
    slot = np.searchsorted(active, tile_key)
    masks = np.zeros((active.size, tile_m), dtype=np.uint64)
    bases = np.zeros((active.size, tile_m), dtype=np.int32)
    masks[slot, seg_row % tile_m] = seg_mask
    bases[slot, seg_row % tile_m] = starts
    tiles = np.stack([active // tile_cols, active % tile_cols], axis=1).astype(np.int32).reshape(-1, 2)
    arrays = {"tiles": tiles, "masks": masks, "bases": bases}
    constants = {"m": int(m), "n": int(n), "k": int(n), "nnz": int(csr.nnz), "tiles": int(active.size),
                 "tile_m": int(tile_m)}
    return Plan(NAME, arrays, constants)


def gather(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output position, row, column) of every stored entry, read from the tiles as the kernel does."""
    a, tile_m = plan.arrays, plan.constants["tile_m"]
    tiles = a["tiles"].astype(np.int64).reshape(-1, 2)
    c = np.arange(TILE_N, dtype=np.uint64)
    step = max(1, GATHER_CHUNK // (tile_m * TILE_N))
    parts = []
    for s in range(0, tiles.shape[0], step):  # tiles expanded to dense bits a chunk at a time
        bits = ((a["masks"][s:s + step, :, None] >> c) & np.uint64(1)).astype(bool)  # (t, tile_m, 64)
        below = np.cumsum(bits, axis=2) - bits  # stored entries left of each column
        t, r, col = np.nonzero(bits)
        pos = a["bases"][s + t, r].astype(np.int64) + below[t, r, col]
        parts.append((pos, tiles[s + t, 0] * tile_m + r, tiles[s + t, 1] * TILE_N + col))
    if not parts:
        return (np.zeros(0, np.int64),) * 3
    return tuple(np.concatenate(p) for p in zip(*parts))


def sddmm(plan: Plan, a: np.ndarray, b: np.ndarray, out_dtype=None) -> np.ndarray:
    """What the kernel computes: out[pos] = A[row] . B[col] per stored entry, fp32 products and sums,
    one cast to the output dtype (the inputs' by default)."""
    pos, rows, cols = gather(plan)
    return sampled_products(pos, rows, cols, plan.constants["nnz"], a, b, out_dtype)
