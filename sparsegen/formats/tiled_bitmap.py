"""Tiled bitmap (after SpInfer, EuroSys'25): W cut into `tile_m` x 64 tiles; per tile a bitmap of
one bit per element and the nonzero values packed, in the order the kernel's warps consume them.

Layout, chosen so that a warp decodes straight into `mma.m16n8k16` A-fragment registers:

* A tile has `warps` row slices of `tile_m / warps` rows (one per warp), each cut into 16 x 16
  fragments, numbered (k-step ks = 0..3, m-fragment mf) as the warp walks them: f = ks * MF + mf.
* Fragment element -> (lane, i): lane l holds 8 elements, i = 2 * reg + half, at
  row = l / 4 + 8 * (reg % 2), col = 2 * (l % 4) + half + 8 * (reg / 2): the A-operand layout of
  m16n8k16. Lane l's 8 bits of a fragment form one byte (bit i = element i).
* Bitmaps, lane-major per warp slice: the slice's bytes are [lane][f] (f = 0 .. FPW - 1, FPW =
  fragments per warp slice), so a lane fetches all its bits of a tile with one 4-, 8- or 16-byte
  shared load (FPW = 4, 8, 16 for tile_m = 64, 128, 256) and byte f of them is fragment f's.
* Values: per slice fragment by fragment; per fragment lane 0's nonzeros, then lane 1's, ...; each
  lane's in element order. A lane finds its first value in a fragment from the fragment's start
  (a warp sum of popcounts) and its lane prefix (a warp scan), then reads its (at most 8) values as
  consecutive halves into the mma registers: 1 bit + 2 bytes per nonzero, no positions, no scatter.
  Within a fragment the 32 lanes read from a window of 256 * density halves: few bank conflicts.

Arrays: `bitmaps` (uint32, 1/8 byte per element, tiles in order, each tile's slices in warp order),
`values` (uint16 bit patterns; each tile starts on a 16-byte boundary for cp.async),
`slice_offsets` (int32, (tiles + 1) * warps: first value of each warp slice, the last `warps`
entries the total, so a tile's 4 slice starts and the next tile's come as two 16-byte chunks).
Bytes: tile_m * 8 per tile + 2 per nonzero (+ padding to 8 halves per tile), against 4 per
nonzero for Tiled-CSL: fewer whenever density > 1/16.

Pairs (`granule=2`): one bit per *register* (the two halves a lane's mma register holds, elements
i = 2 reg, 2 reg + 1) and, for each set bit, the register's 32-bit word (its zero half included).
A lane's 4 bits of a fragment form a nibble, nibble f of its bitmap bits (FPW / 2 bytes a lane),
and it reads each nonzero register with one aligned 32-bit load: half the decode of single
elements (no 16-bit loads, no packing), for more bytes: 4 per nonzero register against 2 per
nonzero, 0.44 B per element at 90 % sparsity (bitmap 0.33, Tiled-CSL 0.40), 0.78 at 80 % (0.53,
0.80). Values and slice offsets then count 32-bit words; tiles start on 16 bytes (4 words).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan
from .halfbits import from_bits, to_bits
from .tiled_csl import multiply
from .tiling import TILE_K, Band, TileGrid, band_nonzeros, bands, check_half_csr, rank_in_group, stable_order

NAME = "tiled_bitmap"
WARPS = 4
FRAG = 16  # rows and columns of an mma A fragment
FRAG_WORDS = 8  # 256 bits
ALIGN_BYTES = 16  # tiles start on 16-byte boundaries (cp.async chunks)
GRANULES = (1, 2)  # halves per bitmap bit: single elements, or mma register pairs


def fragments_per_warp(tile_m: int, warps: int = WARPS) -> int:
    return (tile_m // warps // FRAG) * (TILE_K // FRAG)


def element_code(row, col, tile_m: int, warps: int = WARPS):
    """(fragment index within the tile, lane * 8 + i) of tile element (row, col); int32 (the sizes
    are powers of two, so every division is a shift)."""
    row = np.asarray(row, dtype=np.int32)
    col = np.asarray(col, dtype=np.int32)
    rows_per_warp = tile_m // warps
    mfs = rows_per_warp // FRAG
    shift = rows_per_warp.bit_length() - 1
    if rows_per_warp != 1 << shift or mfs < 1:
        raise ValueError(f"tile_m / warps = {tile_m} / {warps} must be a power of two >= {FRAG}")
    warp, within = row >> shift, row & (rows_per_warp - 1)
    mf, r, ks, c = within >> 4, within & 15, col >> 4, col & 15
    frag = warp * fragments_per_warp(tile_m, warps) + ks * mfs + mf
    lane = ((r & 7) << 2) + ((c & 7) >> 1)
    reg = (r >> 3) + ((c >> 3) << 1)
    return frag, (lane << 3) + (reg << 1) + (c & 1)


def element_position(frag, code, tile_m: int, warps: int = WARPS):
    """Inverse of `element_code`: (row, col) inside the tile."""
    frag = np.asarray(frag, dtype=np.int64)
    code = np.asarray(code, dtype=np.int64)
    mfs = tile_m // warps // FRAG
    warp, f = frag // fragments_per_warp(tile_m, warps), frag % fragments_per_warp(tile_m, warps)
    ks, mf = f // mfs, f % mfs
    lane, i = code // 8, code % 8
    reg, half = i // 2, i % 2
    row = warp * (tile_m // warps) + mf * FRAG + lane // 4 + 8 * (reg % 2)
    col = ks * FRAG + 2 * (lane % 4) + half + 8 * (reg // 2)
    return row, col


def value_bytes(granule: int) -> int:
    """Bytes of one stored value: a half (granule 1) or a register's two halves (granule 2)."""
    return 2 * granule


def align_values(granule: int) -> int:
    """Values per 16-byte alignment unit."""
    return ALIGN_BYTES // value_bytes(granule)


def pair_bitmap_bit(gfrag, pair, fpw: int):
    """(32-bit word, bit) of register `pair` = lane * 4 + reg of global fragment `gfrag` (granule 2):
    slice bytes are lane-major, FPW / 2 bytes a lane, and bit 4 f + reg of a lane's bits is its
    register reg of fragment f."""
    gfrag = np.asarray(gfrag, dtype=np.int64)
    pair = np.asarray(pair, dtype=np.int64)
    slice_id, f = gfrag // fpw, gfrag % fpw
    b = 4 * f + (pair & 3)
    byte = slice_id * (16 * fpw) + (pair >> 2) * (fpw // 2) + b // 8
    return byte // 4, (byte % 4) * 8 + b % 8


def bitmap_bit(gfrag, code, fpw: int):
    """(32-bit word, bit) of element `code` of global fragment `gfrag` (tile-major, slices of `fpw`
    fragments): slice bytes are lane-major, byte lane * fpw + f holds lane's 8 bits of fragment f."""
    gfrag = np.asarray(gfrag, dtype=np.int64)
    code = np.asarray(code, dtype=np.int64)
    slice_id, f = gfrag // fpw, gfrag % fpw
    byte = slice_id * (32 * fpw) + (code // 8) * fpw + f
    return byte // 4, (byte % 4) * 8 + code % 8


def encode(csr: sp.csr_matrix, dtype: str, tile_m: int = 128, bias: np.ndarray | None = None,
           warps: int = WARPS, granule: int = 1) -> Plan:
    """Encode a canonical CSR matrix; `dtype` is "float16" or "bfloat16" (values as bit patterns);
    `granule` 1 (a bit per element) or 2 (a bit per mma register pair, see the module docstring)."""
    csr = check_half_csr(csr)
    if tile_m % (warps * FRAG):
        raise ValueError(f"tile_m {tile_m} must be a multiple of {warps * FRAG} ({warps} warps of 16-row fragments)")
    if granule not in GRANULES:
        raise ValueError(f"granule {granule} is not one of {GRANULES} (halves per bitmap bit)")
    grid = TileGrid(*csr.shape, tile_m)
    encode_band = _encode_band if granule == 1 else _encode_band_pairs
    parts = [encode_band(csr, grid, band, dtype, warps) for band in bands(csr.indptr, grid)]
    value_type = np.uint16 if granule == 1 else np.uint32
    bitmaps = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint32)
    values = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, value_type)
    per_slice = (np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)).reshape(grid.tiles, warps)

    # The whole matrix's slice starts: the bands' layouts laid end to end.
    slice_start, total, padded = slice_layout(per_slice, align_values(granule))
    offsets = np.concatenate([slice_start, np.full(warps, total)])
    if offsets[-1] >= 2**31:
        raise OverflowError(f"tiled bitmap values exceed 2**31 {'halves' if granule == 1 else 'words'}")

    arrays = {"bitmaps": bitmaps, "values": values, "slice_offsets": offsets.astype(np.int32)}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    constants = {"m": grid.m, "k": grid.k, "nnz": int(csr.nnz), "tile_m": tile_m, "tile_k": TILE_K,
                 "m_tiles": grid.m_tiles, "k_tiles": grid.k_tiles, "warps": warps, "dtype": dtype, "granule": granule,
                 "max_tile_values": int(padded.max(initial=0)), "empty_tiles": int((padded == 0).sum())}
    return Plan(NAME, arrays, constants)


def _encode_band(csr, grid: TileGrid, band: Band, dtype: str, warps: int):
    """One band's bitmap words, its values (each tile padded to 16 bytes), and the nonzeros
    of each of its warp slices (tile-major)."""
    tiles, fpw, gfrag, code = _band_fragments(csr, grid, band, warps)

    # One bit per element.
    word, bit = bitmap_bit(gfrag, code, fpw)
    bitmaps = _pack_bits(word, bit, tiles * warps * fpw * FRAG_WORDS)
    del word, bit

    order = _consumption_order(gfrag, code, tiles * warps * fpw)
    halves = to_bits(csr.data[band.lo:band.hi][order], dtype)
    return (bitmaps, *_place_values(gfrag[order] // fpw, tiles, warps, halves, align_values(1)))


def _encode_band_pairs(csr, grid: TileGrid, band: Band, dtype: str, warps: int):
    """`_encode_band` for granule 2: one bit and one 32-bit word per nonzero register pair."""
    tiles, fpw, gfrag, code = _band_fragments(csr, grid, band, warps)

    # Nonzeros in consumption order; a pair starts wherever the fragment or the register (code // 2) changes.
    order = _consumption_order(gfrag, code, tiles * warps * fpw)
    g, c = gfrag[order], code[order]
    first = np.ones(order.size, dtype=bool)
    np.not_equal(g[1:] * 128 + (c[1:] >> 1), g[:-1] * 128 + (c[:-1] >> 1), out=first[1:])
    pair_id = np.cumsum(first) - 1
    pair_frag, pair_code = g[first], c[first] >> 1

    word, bit = pair_bitmap_bit(pair_frag, pair_code, fpw)
    bitmaps = _pack_bits(word, bit, tiles * warps * fpw * FRAG_WORDS // 2)  # 128 bits a fragment
    del word, bit

    halves = to_bits(csr.data[band.lo:band.hi][order], dtype).astype(np.uint32)
    high = (c & 1).astype(bool)
    words = np.zeros(pair_frag.size, dtype=np.uint32)
    words[pair_id[~high]] = halves[~high]
    words[pair_id[high]] |= halves[high] << np.uint32(16)  # each register's high half at most once
    return (bitmaps, *_place_values(pair_frag // fpw, tiles, warps, words, align_values(2)))


def _band_fragments(csr, grid: TileGrid, band: Band, warps: int):
    """(tiles, fragments per warp, global fragment, element code) of a band's nonzeros, fragments
    numbered within the band (tile-major)."""
    tiles = band.row_tiles * grid.k_tiles
    fpw = fragments_per_warp(grid.tile_m, warps)
    tile, row, col = band_nonzeros(csr, grid, band)
    frag, code = element_code(row, col, grid.tile_m, warps)
    return tiles, fpw, tile * (warps * fpw) + frag, code


def _pack_bits(word, bit, words: int) -> np.ndarray:
    """`words` little-endian uint32 with bits (word, bit) set, through a byte-per-bit image."""
    image = np.zeros(words * 32, dtype=bool)
    image[word * 32 + bit] = True
    return np.packbits(image, bitorder="little").view("<u4").astype(np.uint32, copy=False)


def _consumption_order(gfrag, code, fragments: int) -> np.ndarray:
    """Nonzeros in the order the kernel reads their values: fragment by fragment, each by lane and
    element (code)."""
    order = stable_order(code, 256)
    return order[stable_order(gfrag[order], fragments)]


def _place_values(slice_id, tiles: int, warps: int, values, align: int):
    """(values laid out slice by slice, each tile padded to `align`; values per slice) for `values`
    in consumption order, `slice_id` (tile * warps + warp, ascending) each."""
    per_slice = np.bincount(slice_id, minlength=tiles * warps)
    slice_start, total, _ = slice_layout(per_slice.reshape(tiles, warps), align)
    out = np.zeros(total, dtype=values.dtype)
    out[slice_start[slice_id] + rank_in_group(slice_id)] = values
    return out, per_slice


def slice_layout(per_slice: np.ndarray, align: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Where the values of tiles x warps slices go, `per_slice` values each: every slice's first
    value (flat, tile-major), the total, and each tile's padded length (tiles start on `align`
    values: 16 bytes)."""
    padded = -(-per_slice.sum(axis=1) // align) * align
    tile_start = np.zeros(padded.size + 1, dtype=np.int64)
    np.cumsum(padded, out=tile_start[1:])
    slice_start = tile_start[:-1, None] + np.cumsum(per_slice, axis=1) - per_slice
    return slice_start.ravel(), int(tile_start[-1]), padded


def decode(plan: Plan) -> sp.coo_matrix:
    """The matrix the kernel sees, rebuilt from bitmaps, slice offsets and values alone (granule 2:
    both halves of every stored register, a zero half as an explicit zero)."""
    c = plan.constants
    tile_m, warps, granule = c["tile_m"], c["warps"], c.get("granule", 1)
    grid = TileGrid(c["m"], c["k"], tile_m)
    fpw = fragments_per_warp(tile_m, warps)
    per_lane = 8 // granule  # bits a lane holds of one fragment
    # little-endian bits: [slice][lane][f][bit]; reorder to [slice][f][lane][bit] = value order
    bits = np.unpackbits(plan.arrays["bitmaps"].view(np.uint8), bitorder="little").reshape(-1, 32, fpw, per_lane)
    bits = bits.transpose(0, 2, 1, 3).reshape(-1, 32 * per_lane)
    gfrag, slot = np.nonzero(bits)  # row-major: fragments in order, slots ascending = value order
    slice_id = gfrag // fpw
    offsets = plan.arrays["slice_offsets"].astype(np.int64)
    stored = plan.arrays["values"][offsets[slice_id] + rank_in_group(slice_id)]
    if granule == 1:
        code, halves = slot, stored
    else:  # slot = lane * 4 + reg: the register's two elements, its word's low and high half
        gfrag = np.repeat(gfrag, 2)
        code = (np.repeat(slot, 2) << 1) + np.tile(np.arange(2), slot.size)
        halves = np.stack([stored & 0xFFFF, stored >> 16], axis=1).ravel().astype(np.uint16)
    tile = gfrag // (warps * fpw)
    row, col = element_position(gfrag % (warps * fpw), code, tile_m, warps)
    grow = (tile // grid.k_tiles) * tile_m + row
    gcol = (tile % grid.k_tiles) * TILE_K + col
    inside = (grow < grid.m) & (gcol < grid.k)  # a register's other half may lie in an edge tile's padding
    return sp.coo_matrix((from_bits(halves[inside], c["dtype"]), (grow[inside], gcol[inside])), shape=(grid.m, grid.k))


def spmm(plan: Plan, x: np.ndarray, *, relu: bool = False, out: str | None = None) -> np.ndarray:
    """W·X as the kernel computes it (see `tiled_csl.spmm` for the dtypes taken and returned)."""
    return multiply(decode(plan).tocsr(), plan, x, relu=relu, out=out)


def encoded_bytes(plan: Plan) -> int:
    return int(sum(plan.arrays[name].nbytes for name in ("bitmaps", "values", "slice_offsets")))
