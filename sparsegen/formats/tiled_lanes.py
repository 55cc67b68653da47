"""Tiled lanes: W cut into `tile_m` x `tile_k` tiles (tile_k 64 or 128) and laid out for the decoder,
not for the file: each thread (lane) of the kernel finds everything it reads of a tile at fixed
places, so no warp scan, popcount chain or scatter runs at run time.

The unit is an mma register: lane l of warp w holds, per 16 x 16 A fragment of m16n8k16, four 32-bit
registers of two halves each, register `reg` at fragment row l / 4 + 8 (reg % 2) and columns
2 (l % 4) + 8 (reg / 2) + {0, 1} (the low half the lower column). Warp w owns rows
[w tile_m / WARPS, (w + 1) tile_m / WARPS) of the tile: MF = tile_m / WARPS / 16 m-fragments, and
K_STEPS = tile_k / 16 k-steps. A lane's SLOTS = K_STEPS x MF x 4 registers are numbered in the order
the warp consumes them, slot s = (ks MF + mf) 4 + reg: per k-step, per m-fragment, its registers.

A tile's stream (32-bit words; an empty tile has none):

* bits: [warp][lane][word], BW = SLOTS / 32 words a lane (one for 128 x 64 tiles, two for 128 x 128,
  at least one): bit s of a lane's words says whether its slot s holds a nonzero, so a lane fetches
  all its bits of a tile with one 4-, 8- or 16-byte shared load;
* offsets: [warp][lane] uint16: where the lane's first value is among the tile's values (in words):
  the prefix sum of the lanes before it, precomputed, so no scan runs in the kernel;
* values: lane by lane (warp-major), each lane's nonzero registers' words in slot order (a
  register's zero half stored as a zero), padded to 16 bytes. A lane walks its slots with one
  predicated 32-bit load and one predicated add per slot: its value pointer advances past each
  value it takes.

The header (bits and offsets) is a whole number of 128-byte rows, so in the kernel's shared copy of
a tile value v lies in bank v mod 32. `stream` holds the tiles in order, `tile_offsets` (int32,
tiles + 1) each tile's first 16-byte chunk. Bytes: 4 per nonzero register, tile_m tile_k / 16 of
bits and 2 per lane per tile (0.78 + 0.02 B per element at 80 % sparsity, 0.44 + 0.02 at 90 %, for
128 x 128 tiles), against 4 per nonzero for Tiled-CSL.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan
from .halfbits import from_bits, to_bits
from .tiled_csl import multiply
from .tiling import Band, TileGrid, band_nonzeros, bands, check_half_csr, rank_in_group, stable_order

NAME = "tiled_lanes"
WARPS = 4
LANES = 32
FRAG = 16  # rows and columns of an mma A fragment
REGS = 4  # A-fragment registers per lane
TILE_KS = (64, 128)
CHUNK_WORDS = 4  # 16-byte copies: tiles start and end on them
ROW_WORDS = 32  # a 128-byte row of shared memory: the header is whole rows


def fragments(tile_m: int, tile_k: int, warps: int = WARPS) -> tuple[int, int]:
    """(MF, K_STEPS): m-fragments per warp and k-steps per tile."""
    return tile_m // warps // FRAG, tile_k // FRAG


def slots(tile_m: int, tile_k: int, warps: int = WARPS) -> int:
    """Registers a lane holds of one tile."""
    mf, ks = fragments(tile_m, tile_k, warps)
    return mf * ks * REGS


def bit_words(tile_m: int, tile_k: int, warps: int = WARPS) -> int:
    """32-bit words of a lane's bits per tile."""
    return max(1, slots(tile_m, tile_k, warps) // 32)


def header_words(tile_m: int, tile_k: int, warps: int = WARPS) -> int:
    """Words of a tile's bits and lane offsets (a whole number of 128-byte rows)."""
    words = warps * LANES * bit_words(tile_m, tile_k, warps) + warps * LANES // 2
    return -(-words // ROW_WORDS) * ROW_WORDS


def check_shape(tile_m: int, tile_k: int, warps: int = WARPS) -> None:
    if tile_k not in TILE_KS:
        raise ValueError(f"tile_k {tile_k}: expected one of {TILE_KS}")
    if tile_m % (warps * FRAG) or tile_m // warps // FRAG & (tile_m // warps // FRAG - 1):
        raise ValueError(f"tile_m {tile_m}: expected {warps} warps of a power of two of 16-row fragments")


def register_slot(row, col, tile_m: int, tile_k: int, warps: int = WARPS):
    """(warp * 32 + lane, slot, half) of tile element (row, col); int32."""
    row = np.asarray(row, dtype=np.int32)
    col = np.asarray(col, dtype=np.int32)
    mfs, _ = fragments(tile_m, tile_k, warps)
    rows_per_warp = tile_m // warps
    warp, within = row // rows_per_warp, row % rows_per_warp
    mf, r, ks, c = within >> 4, within & 15, col >> 4, col & 15
    lane = ((r & 7) << 2) + ((c & 7) >> 1)
    reg = (r >> 3) + ((c >> 3) << 1)
    return warp * LANES + lane, ((ks * mfs + mf) << 2) + reg, c & 1


def register_position(lane_id, slot, tile_m: int, tile_k: int, warps: int = WARPS):
    """Inverse of `register_slot` for the register's low half: (row, col) inside the tile (the high
    half is at col + 1)."""
    lane_id = np.asarray(lane_id, dtype=np.int64)
    slot = np.asarray(slot, dtype=np.int64)
    mfs, _ = fragments(tile_m, tile_k, warps)
    warp, lane = lane_id // LANES, lane_id % LANES
    f, reg = slot // REGS, slot % REGS
    ks, mf = f // mfs, f % mfs
    row = warp * (tile_m // warps) + mf * FRAG + lane // 4 + 8 * (reg % 2)
    col = ks * FRAG + 2 * (lane % 4) + 8 * (reg // 2)
    return row, col


def encode(csr: sp.csr_matrix, dtype: str, tile_m: int = 128, tile_k: int = 128, bias: np.ndarray | None = None,
           warps: int = WARPS) -> Plan:
    """Encode a canonical CSR matrix; `dtype` is "float16" or "bfloat16" (values as bit patterns)."""
    csr = check_half_csr(csr)
    check_shape(tile_m, tile_k, warps)
    grid = TileGrid(*csr.shape, tile_m, tile_k)
    parts = [_encode_band(csr, grid, band, dtype, warps) for band in bands(csr.indptr, grid)]
    stream = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint32)
    lengths = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    chunks = np.zeros(grid.tiles + 1, dtype=np.int64)
    np.cumsum(lengths // CHUNK_WORDS, out=chunks[1:])
    if chunks[-1] >= 2**31:
        raise OverflowError("tiled lanes stream exceeds 2**31 16-byte chunks")
    arrays = {"stream": stream, "tile_offsets": chunks.astype(np.int32)}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    constants = {"m": grid.m, "k": grid.k, "nnz": int(csr.nnz), "tile_m": tile_m, "tile_k": tile_k,
                 "m_tiles": grid.m_tiles, "k_tiles": grid.k_tiles, "warps": warps, "dtype": dtype,
                 "registers": int(values.sum()), "max_tile_values": int(values.max(initial=0)),
                 "max_tile_chunks": int(lengths.max(initial=0)) // CHUNK_WORDS,
                 "header_words": header_words(tile_m, tile_k, warps), "empty_tiles": int((lengths == 0).sum())}
    return Plan(NAME, arrays, constants)


def _encode_band(csr, grid: TileGrid, band: Band, dtype: str, warps: int):
    """One band's stream words, the words of each of its tiles, and each tile's nonzero registers."""
    tiles = band.row_tiles * grid.k_tiles
    lanes = warps * LANES
    n_slots = slots(grid.tile_m, grid.tile_k, warps)
    bw = bit_words(grid.tile_m, grid.tile_k, warps)
    tile, row, col = band_nonzeros(csr, grid, band)
    lane_id, slot, half = register_slot(row, col, grid.tile_m, grid.tile_k, warps)
    del row, col

    # Nonzeros in the order the lanes read them: tile, lane, slot; a register is a run of equal keys.
    key = (tile.astype(np.int64) * lanes + lane_id) * n_slots + slot
    order = stable_order(key, tiles * lanes * n_slots)
    key, half = key[order], half[order]
    first = np.ones(key.size, dtype=bool)
    np.not_equal(key[1:], key[:-1], out=first[1:])
    reg_id = np.cumsum(first) - 1
    reg_key = key[first]
    bits16 = to_bits(csr.data[band.lo:band.hi][order], dtype).astype(np.uint32)
    words = np.zeros(reg_key.size, dtype=np.uint32)
    low = half == 0
    words[reg_id[low]] = bits16[low]
    words[reg_id[~low]] |= bits16[~low] << np.uint32(16)  # a register's high half at most once
    del key, half, order, bits16, reg_id

    reg_lane, reg_slot = reg_key // n_slots, reg_key % n_slots  # band-wide lane index, slot
    bitmap = _pack_bits(reg_lane * bw + (reg_slot >> 5), reg_slot & 31, tiles * lanes * bw).reshape(tiles, lanes * bw)
    per_lane = np.bincount(reg_lane, minlength=tiles * lanes).reshape(tiles, lanes)
    offsets = (np.cumsum(per_lane, axis=1) - per_lane).astype(np.uint16)
    per_tile = per_lane.sum(axis=1)
    head = header_words(grid.tile_m, grid.tile_k, warps)
    lengths = np.where(per_tile > 0, head + -(-per_tile // CHUNK_WORDS) * CHUNK_WORDS, 0)
    starts = np.zeros(tiles + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])

    stream = np.zeros(int(starts[-1]), dtype=np.uint32)
    full = np.flatnonzero(per_tile)
    at = starts[full][:, None]
    stream[at + np.arange(lanes * bw)] = bitmap[full]
    stream[at + lanes * bw + np.arange(lanes // 2)] = np.ascontiguousarray(offsets[full]).view("<u4")
    reg_tile = reg_lane // lanes
    stream[starts[reg_tile] + head + rank_in_group(reg_tile)] = words
    return stream, lengths, per_tile


def _pack_bits(word, bit, words: int) -> np.ndarray:
    """`words` little-endian uint32 with bits (word, bit) set, through a byte-per-bit image."""
    image = np.zeros(words * 32, dtype=bool)
    image[np.asarray(word, dtype=np.int64) * 32 + bit] = True
    return np.packbits(image, bitorder="little").view("<u4").astype(np.uint32, copy=False)


def _tile_headers(plan: Plan):
    """(nonempty tile numbers, their first words, bits [tile][lane][slot] as bools, lane offsets
    [tile][lane]) read from the stream as the kernel reads them."""
    c = plan.constants
    warps, lanes = c["warps"], c["warps"] * LANES
    bw = bit_words(c["tile_m"], c["tile_k"], warps)
    n_slots = slots(c["tile_m"], c["tile_k"], warps)
    chunks = plan.arrays["tile_offsets"].astype(np.int64)
    full = np.flatnonzero(np.diff(chunks))
    start = chunks[full] * CHUNK_WORDS
    stream = plan.arrays["stream"]
    words = stream[start[:, None] + np.arange(lanes * bw)]
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").reshape(full.size, lanes, bw * 32)[:, :, :n_slots]
    offsets = stream[start[:, None] + lanes * bw + np.arange(lanes // 2)].view("<u2").astype(np.int64)
    return full, start, bits.astype(bool), offsets.reshape(full.size, lanes)


def value_addresses(plan: Plan):
    """For every nonzero register, in the order the lanes read them: (tile, lane index, slot, value
    index within its tile, word of `stream` it is read from). The value index is the lane's offset
    plus the values the lane took before it; the word, the tile's first word + the header + that."""
    full, start, bits, offsets = _tile_headers(plan)
    t, lane_id, slot = np.nonzero(bits)  # row-major: tile, lane, slot ascending = each lane's read order
    lanes = bits.shape[1]
    index = offsets[t, lane_id] + rank_in_group(t * lanes + lane_id)
    return full[t], lane_id, slot, index, start[t] + plan.constants["header_words"] + index


def decode(plan: Plan) -> sp.coo_matrix:
    """The matrix the kernel sees, rebuilt from the stream alone: both halves of every stored register
    (a zero half as an explicit zero)."""
    c = plan.constants
    grid = TileGrid(c["m"], c["k"], c["tile_m"], c["tile_k"])
    tile, lane_id, slot, _, word = value_addresses(plan)
    stored = plan.arrays["stream"][word]
    row, col = register_position(lane_id, slot, c["tile_m"], c["tile_k"], c["warps"])
    grow = np.repeat((tile // grid.k_tiles) * grid.tile_m + row, 2)
    gcol = np.repeat((tile % grid.k_tiles) * grid.tile_k + col, 2) + np.tile(np.arange(2), tile.size)
    halves = np.stack([stored & 0xFFFF, stored >> 16], axis=1).ravel().astype(np.uint16)
    inside = (grow < grid.m) & (gcol < grid.k)  # a register's other half may lie past an edge tile's end
    return sp.coo_matrix((from_bits(halves[inside], c["dtype"]), (grow[inside], gcol[inside])), shape=(grid.m, grid.k))


def spmm(plan: Plan, x: np.ndarray, *, relu: bool = False, out: str | None = None) -> np.ndarray:
    """W·X as the kernel computes it (see `tiled_csl.spmm` for the dtypes taken and returned)."""
    return multiply(decode(plan).tocsr(), plan, x, relu=relu, out=out)


def encoded_bytes(plan: Plan) -> int:
    return int(plan.arrays["stream"].nbytes + plan.arrays["tile_offsets"].nbytes)


def wavefronts(plan: Plan) -> np.ndarray:
    """Shared-memory wavefronts of each nonempty tile's value loads, summed over its warps and slots:
    per (warp, slot) load, the most distinct words its active lanes read in one bank (value v of a
    tile lies in bank v mod 32; an idle load, no lane active, none). A conflict-free tile has one per
    (warp, slot) that has a nonzero."""
    c = plan.constants
    tile, lane_id, slot, index, _ = value_addresses(plan)
    if tile.size == 0:
        return np.zeros(0, dtype=np.int64)
    n_slots, warps = slots(c["tile_m"], c["tile_k"], c["warps"]), c["warps"]
    _, t = np.unique(tile, return_inverse=True)
    load = (t * warps + lane_id // LANES) * n_slots + slot
    per_bank = np.bincount(load * 32 + index % 32, minlength=(t.max() + 1) * warps * n_slots * 32)
    return per_bank.reshape(t.max() + 1, -1, 32).max(axis=2).sum(axis=1)
