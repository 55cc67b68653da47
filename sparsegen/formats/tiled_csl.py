"""Tiled-CSL (Flash-LLM, Xia et al. VLDB'24): W cut into `tile_m` x 64 tiles, each tile's nonzeros
as 32-bit words, value in the low 16 bits and its place in the tile in the high 16 bits.

The place is the value's *byte* offset in the kernel's shared-memory copy of the tile (twice its
half-word position), so that the kernel's scatter is one `LEA.HI` (buffer + word >> 16) and one
16-bit store of the word's low half per nonzero. Row r of the tile is 64 halves (128 bytes, all 32
banks), with its eight 16-byte chunks XOR-swizzled by r mod 8 so that `ldmatrix` reads eight rows
of one chunk from eight different bank groups:

    pos = r * 64 + ((c / 8) ^ (r % 8)) * 8 + c % 8,    word = value | (2 * pos) << 16

(tile_m <= 256: byte offsets stay below 2 * 256 * 64 + 128 < 2**16.)

Word order (the scatter). Thread `tid` of the block takes uint4 vectors tid, tid + THREADS, ...
of its tile, so warp-wide store instruction (vector group g, word q) writes words
4 * (32 g + lane) + q for lanes 0..31: one "round". Banks are the 32-bit words of shared memory,
bank(pos) = (pos / 2) mod 32. The encoder numbers each bank's words 0, 1, 2, ... (virtual round v
holds the v-th word of every bank that has one) and fills the store rounds with virtual round 0,
then 1, ..., banks ascending inside each. While every bank still has words, a virtual round is
exactly 32 words in 32 distinct banks and lines up with one store round: conflict-free. Only the
last few virtual rounds, where the emptier banks have run out (random sparsity leaves banks
+-10 % around the mean), share store rounds and conflict 2-way here and there.
`strict_banks=True` instead pads every bank to the fullest one (pads write a sink past the tile),
so every store round is conflict-free, at the cost of those padding bytes (15 % at 50 % density,
~45 % at 10 %): the default spends no bytes on it, as bytes are what this memory-bound kernel
is limited by.

Tiles are padded to whole uint4 vectors with words that write 0 into the sink. `tile_offsets`
(int32, tiles + 1 entries) gives each tile's first vector.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan
from .halfbits import from_bits, round_to, to_bits
from .tiling import TILE_K, Band, TileGrid, band_nonzeros, bands, check_half_csr, rank_in_group, stable_order

NAME = "tiled_csl"
WARP = 32
VECTOR = 4  # words per uint4 load
BANKS = 32
SINK_HALVES = 64  # 128 bytes past the tile: one word per bank, where padding words write


def swizzled_position(row, col):
    """Half-word offset of tile element (row, col) in the kernel's swizzled shared-memory tile
    (in the inputs' integer type: the encoder passes int32)."""
    row = np.asarray(row)
    col = np.asarray(col)
    return row * TILE_K + (((col >> 3) ^ (row & 7)) << 3) + (col & 7)


def unswizzle(pos):
    """(row, col) of a tile position: the inverse of `swizzled_position`."""
    pos = np.asarray(pos, dtype=np.int64)
    row = pos // TILE_K
    within = pos % TILE_K
    return row, (((within >> 3) ^ (row & 7)) << 3) + (within & 7)


def encode(csr: sp.csr_matrix, dtype: str, tile_m: int = 128, bias: np.ndarray | None = None,
           strict_banks: bool = False) -> Plan:
    """Encode a canonical CSR matrix; `dtype` is "float16" or "bfloat16" (values as bit patterns)."""
    csr = check_half_csr(csr)
    grid = TileGrid(*csr.shape, tile_m)
    parts, lengths = [], []
    for band in bands(csr.indptr, grid):
        words, band_lengths = _encode_band(csr, grid, band, dtype, strict_banks)
        parts.append(words)
        lengths.append(band_lengths)
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    vec_offsets = np.zeros(grid.tiles + 1, dtype=np.int64)
    np.cumsum(lengths // VECTOR, out=vec_offsets[1:])
    if vec_offsets[-1] >= 2**31:
        raise OverflowError("Tiled-CSL encoding exceeds 2**31 vectors")
    arrays = {"words": out, "tile_offsets": vec_offsets.astype(np.int32)}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    vectors = lengths // VECTOR
    constants = {"m": grid.m, "k": grid.k, "nnz": int(csr.nnz), "tile_m": tile_m, "tile_k": TILE_K,
                 "m_tiles": grid.m_tiles, "k_tiles": grid.k_tiles, "dtype": dtype,
                 "words": int(out.size), "padding_words": int(out.size - csr.nnz),
                 "max_tile_vectors": int(vectors.max(initial=0)), "strict_banks": bool(strict_banks)}
    return Plan(NAME, arrays, constants)


def _encode_band(csr, grid: TileGrid, band: Band, dtype: str, strict_banks: bool):
    """The words of one band's tiles, in tile order (each tile's in store-round order), and the
    number of words of each of its tiles."""
    tiles = band.row_tiles * grid.k_tiles
    tile, row, col = band_nonzeros(csr, grid, band)
    pos = swizzled_position(row, col)
    bank = (pos >> 1) & (BANKS - 1)  # 32-bit word of shared memory, mod the 32 banks
    counts = np.bincount(tile, minlength=tiles)

    # Padding words: to whole vectors, or (strict) every bank up to the fullest bank of its tile.
    # They write the sink past the tile (bank b of the sink for a pad of bank b).
    if strict_banks:
        per_bank = np.bincount(tile * BANKS + bank, minlength=tiles * BANKS).reshape(-1, BANKS)
        rounds = -(-per_bank.max(axis=1, initial=0) // VECTOR) * VECTOR  # words per lane
        pads = (rounds[:, None] - per_bank).ravel()
        pad_tile = np.repeat(np.repeat(np.arange(tiles, dtype=np.int32), BANKS), pads)
        pad_bank = np.tile(np.arange(BANKS, dtype=np.int32), tiles).repeat(pads)
    else:
        pads = (-counts) % VECTOR
        pad_tile = np.repeat(np.arange(tiles, dtype=np.int32), pads)
        pad_bank = np.zeros(pad_tile.size, dtype=np.int32)
    lengths = counts + np.bincount(pad_tile, minlength=tiles)  # words per tile, multiple of 4

    tile = np.concatenate([tile, pad_tile])
    bank = np.concatenate([bank, pad_bank])
    pos = np.concatenate([pos, grid.area + 2 * pad_bank])
    bits = np.concatenate([to_bits(csr.data[band.lo:band.hi], dtype), np.zeros(pad_tile.size, np.uint16)])
    words = bits.astype(np.uint32) | (pos.astype(np.uint32) << 17)  # byte offset (2 x pos) in the high half
    del bits, pos

    # Bank-major, then virtual-round-major: the v-th word of every bank forms virtual round v
    # (stable sorts: a bank's words keep their CSR order, pads last).
    by_bank = stable_order(tile * BANKS + bank, tiles * BANKS)
    v = rank_in_group(tile[by_bank] * BANKS + bank[by_bank])
    round_key = v * BANKS + bank[by_bank]
    order = by_bank[stable_order(round_key, int(round_key.max(initial=0)) + 1)]
    order = order[stable_order(tile[order], tiles)]  # tiles in order, each by (virtual round, bank)
    del by_bank, v, round_key
    tile_sorted = tile[order]
    starts = np.zeros(tiles + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    slot = _deal_rounds(np.arange(tile_sorted.size, dtype=np.int64) - starts[tile_sorted], lengths[tile_sorted])
    out = np.zeros(int(starts[-1]), dtype=np.uint32)
    out[starts[tile_sorted] + slot] = words[order]
    return out, lengths


def _deal_rounds(rank: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Word slot inside its tile of the `rank`-th word of a tile of `length` words, filling store
    rounds in order: round (g, q) is word q of vectors 32 g .. 32 g + 31 (lanes 0..31), except the
    last group, whose rounds have only as many lanes as the tile has vectors left."""
    rank = rank.astype(np.int64, copy=False)
    vectors = length // VECTOR
    groups = -(-vectors // WARP)
    before = VECTOR * WARP * (groups - 1)  # words in the full groups
    # a full group: rank = (g * VECTOR + q) * WARP + lane -> slot VECTOR * (WARP * g + lane) + q
    slot = (rank & ~(VECTOR * WARP - 1)) + VECTOR * (rank & (WARP - 1)) + ((rank >> 5) & (VECTOR - 1))
    # the last group: rank - before = q * lanes + lane, with lanes = the vectors it has
    last = np.flatnonzero(rank >= before)
    q, lane = np.divmod(rank[last] - before[last], vectors[last] - WARP * (groups[last] - 1))
    slot[last] = VECTOR * (WARP * (groups[last] - 1) + lane) + q
    return slot


def decode(plan: Plan) -> sp.coo_matrix:
    """The matrix the kernel sees, rebuilt from the plan's arrays alone (float32 values)."""
    c = plan.constants
    grid = TileGrid(c["m"], c["k"], c["tile_m"])
    words = plan.arrays["words"]
    offsets = plan.arrays["tile_offsets"].astype(np.int64)
    tile = np.repeat(np.arange(grid.tiles, dtype=np.int64), VECTOR * np.diff(offsets))
    pos = (words >> 17).astype(np.int64)  # the high half holds the byte offset
    real = pos < grid.area  # padding words write the sink
    row, col = unswizzle(pos[real])
    tile = tile[real]
    grow = (tile // grid.k_tiles) * grid.tile_m + row
    gcol = (tile % grid.k_tiles) * grid.tile_k + col
    values = from_bits((words[real] & 0xFFFF).astype(np.uint16), c["dtype"])
    return sp.coo_matrix((values, (grow, gcol)), shape=(grid.m, grid.k))


def spmm(plan: Plan, x: np.ndarray, *, relu: bool = False, out: str | None = None) -> np.ndarray:
    """W·X as the kernel computes it: 16-bit inputs, fp32 products and sums, epilogue, one rounding.

    X is float16 for fp16 plans and float32 for bf16 plans (NumPy has no bfloat16; values are
    rounded to bf16 first). The result is float16, or float32 (holding bf16-rounded values for
    out="bfloat16", or unrounded for out="float32")."""
    return multiply(decode(plan).tocsr(), plan, x, relu=relu, out=out)


def multiply(w: sp.csr_matrix, plan: Plan, x, *, relu: bool, out: str | None) -> np.ndarray:
    """The shared half of every tiled emulator: fp32 product of decoded W and rounded X, epilogue."""
    dtype = plan.constants["dtype"]
    out = out or dtype
    xs = round_to(np.asarray(x, dtype=np.float32), dtype)
    y = np.asarray(w.astype(np.float32) @ xs, dtype=np.float32).reshape(plan.constants["m"], -1)
    if "bias" in plan.arrays:
        y += plan.arrays["bias"][:, None]
    if relu:
        np.maximum(y, 0.0, out=y)
    if out == "float16":
        return y.astype(np.float16)
    return round_to(y, out)


def round_conflicts(plan: Plan) -> np.ndarray:
    """For every store round (tile, vector group, word) the worst bank conflict: the most distinct
    32-bit words of shared memory that its lanes write in one bank (1 = conflict-free)."""
    c = plan.constants
    offsets = plan.arrays["tile_offsets"].astype(np.int64)
    lengths = VECTOR * np.diff(offsets)
    if lengths.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    tiles = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    j = np.arange(lengths.sum(), dtype=np.int64) - np.repeat(VECTOR * offsets[:-1], lengths)
    round_id = (tiles * (c["tile_m"] * TILE_K) + j // (VECTOR * WARP)) * VECTOR + j % VECTOR
    word = (plan.arrays["words"] >> 18).astype(np.int64)  # 32-bit word of shared memory written
    pairs = np.unique(np.stack([round_id, word]), axis=1)  # lanes writing one word do not conflict
    keys = pairs[0] * BANKS + pairs[1] % BANKS
    keys, per_bank = np.unique(keys, return_counts=True)
    _, first = np.unique(keys // BANKS, return_index=True)
    return np.maximum.reduceat(per_bank, first)
