"""CSR cut into 1-D output tiles, as the `sputnik_sddmm` kernel reads it.

A tile is up to `tile` consecutive nonzeros of one row. Rows are visited longest first (Sputnik's
row swizzle) and each is cut into ceil(length / tile) tiles; `order` lays the tiles out either
row by row ("row") or phase by phase ("phase": the first tile of every row, then every row's
second tile, ...). Phase order puts tiles that cover about the same column band of equally long
rows next to each other, so the groups of one thread block read overlapping rows of B.

Arrays (what the kernel reads, nothing else):

- `tiles` int32 (T, 4): one descriptor per tile, {row, start, count, 0}: the row of A, the
  tile's first position in the CSR order (= output position), and its nonzero count (0 marks a
  padding tile, which the kernel skips). T is padded to a whole number of thread blocks.
- `slots` int32 (T * tile,): the tiles' column indices (times k when `scaled`: the element offset
  of the row of B), `tile` slots per tile; a partial tile's unused slots repeat its last column
  (the kernel loads them unguarded and never stores their sums), a padding tile's are 0. The
  slots of the `group` tiles that share a warp are interleaved four at a time, so that one
  16-byte load instruction serves every group of the warp from one cache line: slot j of tile t
  sits at
  ((t // group * tile / 4 + j // 4) * group + t % group) * 4 + j % 4.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan
from .csr import row_swizzle

NAME = "csr_sddmm"
ORDERS = ("phase", "row")
INT32_MAX = np.iinfo(np.int32).max
EMULATE_CHUNK = 1 << 22  # elements of a gathered operand per emulator step (bounds its memory)


def tile_order(indptr: np.ndarray, tile: int, order: str) -> tuple[np.ndarray, np.ndarray]:
    """(row, phase) of every tile, in launch order: rows longest first, `order` as above."""
    indptr = np.asarray(indptr, dtype=np.int64)
    swizzle = row_swizzle(indptr)
    per_row = -(-np.diff(indptr)[swizzle] // tile)  # tiles of each row, in swizzle order
    total = int(per_row.sum())
    rank = np.repeat(np.arange(swizzle.size, dtype=np.int64), per_row)  # position in swizzle order
    phase = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    if order == "phase":
        perm = np.lexsort((rank, phase))
        rank, phase = rank[perm], phase[perm]
    elif order != "row":
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    return swizzle[rank].astype(np.int64), phase


def interleave(slots: np.ndarray, tile: int, group: int) -> np.ndarray:
    """(T, tile) slots -> the flat warp-interleaved layout (T a multiple of `group`)."""
    t = slots.shape[0]
    return np.ascontiguousarray(slots.reshape(t // group, group, tile // 4, 4).transpose(0, 2, 1, 3)).ravel()


def deinterleave(flat: np.ndarray, tile: int, group: int) -> np.ndarray:
    """Inverse of `interleave`: the flat layout -> (T, tile)."""
    t = flat.size // tile
    return flat.reshape(t // group, tile // 4, group, 4).transpose(0, 2, 1, 3).reshape(t, tile)


def encode(csr: sp.csr_matrix, *, k: int, tile: int, lanes: int, block: int, order: str = "phase",
           scaled: bool = True) -> Plan:
    """Cut `csr` (canonical) into tiles for a kernel of `block` threads in groups of `lanes`."""
    if tile % 4 or tile < 4:
        raise ValueError(f"tile {tile}: must be a multiple of 4 (slots are loaded four at a time)")
    m, n = csr.shape
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    indices = np.asarray(csr.indices, dtype=np.int64)
    group, per_block = 32 // lanes, block // lanes
    row, phase = tile_order(indptr, tile, order)
    start = indptr[row] + phase * tile
    count = np.minimum(tile, indptr[row + 1] - start)
    real = row.size
    padded = -(-real // per_block) * per_block
    tiles = np.zeros((padded, 4), dtype=np.int32)
    tiles[:real, 0], tiles[:real, 1], tiles[:real, 2] = row, start, count
    slots = np.zeros((padded, tile), dtype=np.int64)
    if real:
        j = np.arange(tile, dtype=np.int64)
        # Slots past a tile's count repeat its last column: the kernel loads every slot unguarded.
        pos = start[:, None] + np.minimum(j, count[:, None] - 1)
        slots[:real] = indices[pos] * (k if scaled else 1)
    if slots.size and slots.max() > INT32_MAX:
        raise OverflowError("column offsets exceed 32 bits (encode with scaled=False)")
    arrays = {"tiles": tiles, "slots": interleave(slots.astype(np.int32), tile, group)}
    constants = {"m": int(m), "k": int(n), "n": int(n), "inner": int(k), "nnz": int(csr.nnz), "tiles": int(padded),
                 "tile": int(tile), "group": int(group), "scaled": int(bool(scaled))}
    return Plan(NAME, arrays, constants)


def gather(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output position, row, column) of every stored entry, read from the tiles as the kernel does."""
    c, a = plan.constants, plan.arrays
    tile = c["tile"]
    tiles = a["tiles"].reshape(-1, 4).astype(np.int64)
    slots = deinterleave(a["slots"], tile, c["group"]).astype(np.int64)
    valid = np.arange(tile) < tiles[:, 2:3]
    pos = (tiles[:, 1:2] + np.arange(tile))[valid]
    rows = np.broadcast_to(tiles[:, 0:1], valid.shape)[valid]
    cols = slots[valid] // (c["inner"] if c["scaled"] else 1)
    return pos, rows, cols


def sddmm(plan: Plan, a: np.ndarray, b: np.ndarray, out_dtype=None) -> np.ndarray:
    """What the kernel computes: out[pos] = A[row] . B[col] per stored entry, fp32 products and sums,
    one cast to the output dtype (the inputs' by default)."""
    pos, rows, cols = gather(plan)
    return sampled_products(pos, rows, cols, plan.constants["nnz"], a, b, out_dtype)


def sampled_products(pos, rows, cols, nnz: int, a: np.ndarray, b: np.ndarray, out_dtype=None) -> np.ndarray:
    """out[pos] = A[rows] . B[cols] (fp32 products and sums, one cast to the output dtype, the
    inputs' by default), out of length nnz: every SDDMM format's emulator once it has read its
    (position, row, column) triples."""
    out_dtype = np.dtype(out_dtype or np.asarray(a).dtype)
    a32 = np.asarray(a, dtype=np.float32)
    b32 = np.asarray(b, dtype=np.float32)
    vals = np.empty(pos.size, dtype=np.float32)
    step = max(1, EMULATE_CHUNK // max(a32.shape[1] if a32.ndim == 2 else 1, 1))
    for s in range(0, pos.size, step):
        e = min(pos.size, s + step)
        vals[s:e] = np.einsum("ij,ij->i", a32[rows[s:e]], b32[cols[s:e]])
    out = np.zeros(nnz, dtype=out_dtype)
    out[pos] = vals.astype(out_dtype)
    return out
