"""The tensor-core tile formats pinned on small hand-built matrices: tile grid and bands, Tiled-CSL
words and their store-round order, tiled-bitmap codes, bits and values. Every expected value is
written out by hand from the layouts the modules' docstrings describe; none is computed by the
encoders or their helpers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.formats import tiled_bitmap as bitmap
from sparsegen.formats import tiled_csl as csl
from sparsegen.formats import tiling
from sparsegen.formats.tiling import Band, TileGrid

from .test_formats_pinned import csr

F16 = {1.0: 0x3C00, 2.0: 0x4000, 3.0: 0x4200, 4.0: 0x4400, 5.0: 0x4500, 6.0: 0x4600, 7.0: 0x4700, 8.0: 0x4800}


# ---- formats/tiling.py -----------------------------------------------------------------------------

@pytest.mark.parametrize("m, k, tile_m, tile_k, m_tiles, k_tiles, area", [
    (130, 70, 128, 64, 2, 2, 8192), (128, 64, 128, 64, 1, 1, 8192), (0, 5, 64, 64, 0, 1, 4096),
    (5, 10, 2, 4, 3, 3, 8),
])
def test_tile_grid(m, k, tile_m, tile_k, m_tiles, k_tiles, area):
    g = TileGrid(m, k, tile_m, tile_k)
    assert (g.m_tiles, g.k_tiles, g.tiles, g.area) == (m_tiles, k_tiles, m_tiles * k_tiles, area)
    assert TileGrid(m, k, tile_m).tile_k == 64
    assert Band(2, 5, 0, 0).row_tiles == 3


def test_bands_by_hand():
    indptr = np.array([0, 3, 3, 8, 9, 11])  # rows of 3, 0, 5, 1, 2 nonzeros; one row a row tile
    grid = TileGrid(5, 10, 1)
    # at most 2 row tiles and (past the first row tile) 4 nonzeros a band
    assert tiling.bands(indptr, grid, max_tiles=2, max_nonzeros=4) == \
        [Band(0, 2, 0, 3), Band(2, 3, 3, 8), Band(3, 5, 8, 11)]
    assert tiling.bands(indptr, grid, max_tiles=2, max_nonzeros=2) == \
        [Band(0, 1, 0, 3), Band(1, 2, 3, 3), Band(2, 3, 3, 8), Band(3, 4, 8, 9), Band(4, 5, 9, 11)]
    assert tiling.bands(indptr, grid) == [Band(0, 5, 0, 11)]
    # 3 column tiles: 7 tiles a band is 2 row tiles
    assert tiling.bands(indptr, TileGrid(5, 10, 1, 4), max_tiles=7) == \
        [Band(0, 2, 0, 3), Band(2, 4, 3, 9), Band(4, 5, 9, 11)]
    assert tiling.bands(indptr, TileGrid(5, 10, 1, 4), max_tiles=2) == \
        [Band(i, i + 1, int(indptr[i]), int(indptr[i + 1])) for i in range(5)]
    assert tiling.bands(np.array([0, 1, 3]), TileGrid(2, 10, 4)) == [Band(0, 1, 0, 3)]  # a short last tile
    assert tiling.bands(np.array([0]), TileGrid(0, 10, 4)) == []
    assert tiling.bands(np.zeros(6, np.int64), TileGrid(5, 0, 2)) == [Band(0, 3, 0, 0)]  # no columns


def test_bands_default_limits():
    # at most 2048 tiles a band (tile * 32 + bank stays within 16 bits) ...
    assert [(b.first, b.stop) for b in tiling.bands(np.zeros(2050, np.int64), TileGrid(2049, 64, 1))] == \
        [(0, 2048), (2048, 2049)]
    # ... and past its first row tile at most 2**23 nonzeros
    indptr = np.array([0, 2**22, 2**23, 2**23 + 1])
    assert tiling.bands(indptr, TileGrid(3, 64, 1)) == [Band(0, 2, 0, 2**23), Band(2, 3, 2**23, 2**23 + 1)]


def test_grid_and_band_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TileGrid(1, 1, 1).m = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        Band(0, 1, 0, 0).stop = 2


def test_band_nonzeros_by_hand():
    a = csr((4, 6), {(0, 1): 1.0, (0, 4): 2.0, (1, 4): 3.0, (3, 0): 4.0, (3, 1): 5.0, (3, 5): 6.0})
    grid = TileGrid(4, 6, 2, 4)  # 2 x 2 tiles of 2 rows, 4 columns
    tile, row, col = tiling.band_nonzeros(a, grid, Band(0, 2, 0, 6))
    assert tile.tolist() == [0, 1, 1, 2, 2, 3] and row.tolist() == [0, 0, 1, 1, 1, 1]
    assert col.tolist() == [1, 0, 0, 0, 1, 1]
    assert tile.dtype == row.dtype == col.dtype == np.int32
    tile, row, col = tiling.band_nonzeros(a, grid, Band(1, 2, 3, 6))  # rows 2-3 only
    assert tile.tolist() == [0, 0, 1] and row.tolist() == [1, 1, 1] and col.tolist() == [0, 1, 1]


def test_stable_order_by_hand():
    assert tiling.stable_order(np.array([3, 1, 3, 0, 1]), 4).tolist() == [3, 1, 4, 0, 2]
    keys = np.array([70000, 5, 65536, 5, 131071])  # two 16-bit digits
    assert tiling.stable_order(keys, 131072).tolist() == [1, 3, 2, 0, 4]
    # a bound of 65537 needs the second digit, 65536 does not
    assert tiling.stable_order(np.array([65536, 0]), 65537).tolist() == [1, 0]
    assert tiling.stable_order(np.array([65535, 0, 7]), 65536).tolist() == [1, 2, 0]
    assert tiling.stable_order(np.array([0, 0]), 1).tolist() == [0, 1]
    assert tiling.stable_order(np.zeros(0, np.int64), 10).size == 0
    assert tiling.stable_order(np.array([2**31, 0, 2**31 - 1]), 2**32).tolist() == [1, 2, 0]  # bits 16-31


def test_rank_in_group_by_hand():
    assert tiling.rank_in_group(np.array([5, 5, 7, 7, 7, 9])).tolist() == [0, 1, 0, 1, 2, 0]
    assert tiling.rank_in_group(np.array([4])).tolist() == [0]
    assert tiling.rank_in_group(np.zeros(0, np.int64)).size == 0


def test_check_half_csr():
    a = csr((2, 2), {(0, 0): 1.0})
    assert tiling.check_half_csr(a) is a
    for bad in (a.toarray(), a.tocoo()):
        with pytest.raises(TypeError, match="CSR"):
            tiling.check_half_csr(bad)


# ---- formats/tiled_csl.py --------------------------------------------------------------------------

@pytest.mark.parametrize("row, col, pos", [
    (0, 0, 0), (0, 9, 9), (1, 0, 72), (1, 9, 65), (3, 17, 201), (9, 63, 631), (127, 63, 8135), (8, 8, 520),
])
def test_swizzled_position_by_hand(row, col, pos):
    assert int(csl.swizzled_position(row, col)) == pos
    r, c = csl.unswizzle(pos)
    assert (int(r), int(c)) == (row, col)


# W (2 x 70): (0, 0) = 1, (0, 9) = 2, (1, 0) = 3 in tile 0; (1, 65) = 4 in tile 1 (tile_m 64).
# Positions 0, 9, 72 (banks 0, 4, 4) and 73 (bank 4). Each tile is padded to one vector of 4 words.
W2 = {(0, 0): 1.0, (0, 9): 2.0, (1, 0): 3.0, (1, 65): 4.0}
SINK = 4096 << 17  # a padding word: value 0, byte offset 2 x 4096, just past a 64 x 64 tile


def word(value, pos):
    return F16[value] | (pos << 17)


def test_tiled_csl_encode_pinned():
    plan = csl.encode(csr((2, 70), W2), "float16", tile_m=64, bias=[1, 2])
    # tile 0 in virtual rounds: round 0 = banks 0 (value 1), 4 (value 2); round 1 = the pad (bank 0),
    # bank 4 (value 3). Tile 1: the pad of bank 0, then bank 4, then two more pads.
    assert plan.arrays["words"].dtype == np.uint32
    assert plan.arrays["words"].tolist() == [word(1.0, 0), word(2.0, 9), SINK, word(3.0, 72),
                                             SINK, word(4.0, 73), SINK, SINK]
    assert plan.arrays["tile_offsets"].dtype == np.int32 and plan.arrays["tile_offsets"].tolist() == [0, 1, 2]
    assert plan.arrays["bias"].tolist() == [1, 2]
    assert plan.constants == {"m": 2, "k": 70, "nnz": 4, "tile_m": 64, "tile_k": 64, "m_tiles": 1, "k_tiles": 2,
                              "dtype": "float16", "words": 8, "padding_words": 4, "max_tile_vectors": 1,
                              "strict_banks": False}
    assert csl.round_conflicts(plan).tolist() == [1] * 8


# V (8 x 64): rows 0-7 hold r + 1 at column 8r: position 64r, all in bank 0, eight distinct words.
V8 = {(r, 8 * r): float(r + 1) for r in range(8)}


def test_tiled_csl_two_vectors_deal_rounds_across_lanes():
    plan = csl.encode(csr((8, 64), V8), "float16", tile_m=64)
    # ranks 0..7 (virtual rounds of bank 0) dealt to two lanes: round q holds ranks 2q and 2q + 1
    assert plan.arrays["words"].tolist() == [word(r + 1.0, 64 * r) for r in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert plan.arrays["tile_offsets"].tolist() == [0, 2] and plan.constants["max_tile_vectors"] == 2
    assert csl.round_conflicts(plan).tolist() == [2, 2, 2, 2]  # both lanes of each round write bank 0


def test_tiled_csl_strict_banks_pads_every_bank_to_the_fullest():
    plan = csl.encode(csr((8, 64), V8), "float16", tile_m=64, strict_banks=True)
    # bank 0 holds 8 words: every bank is padded to 8, 256 words = 64 vectors, conflict-free
    assert plan.arrays["tile_offsets"].tolist() == [0, 64]
    assert (plan.constants["words"], plan.constants["padding_words"]) == (256, 248)
    assert plan.constants["strict_banks"] is True and plan.constants["max_tile_vectors"] == 64
    assert csl.round_conflicts(plan).tolist() == [1] * 8
    pads = plan.arrays["words"][(plan.arrays["words"] >> 17) >= 4096]
    assert pads.size == 248 and set((pads & 0xFFFF).tolist()) == {0}
    # the pad of bank b writes word b of the sink: byte offset 2 (4096 + 2 b)
    assert sorted(set(((pads >> 17) - 4096).tolist())) == list(range(2, 64, 2))
    small = csl.encode(csr((2, 70), W2), "float16", tile_m=64, strict_banks=True)
    assert small.arrays["tile_offsets"].tolist() == [0, 32, 64]  # bank 4 holds 2 (tile 0), 1 (tile 1): 4 each


@pytest.mark.parametrize("length, slots", [
    (4, {0: 0, 1: 1, 3: 3}),
    (8, {0: 0, 1: 4, 2: 1, 7: 7}),
    (128, {0: 0, 1: 4, 31: 124, 32: 1, 127: 127}),  # 32 vectors: one full group
    (160, {0: 0, 1: 4, 31: 124, 32: 1, 33: 5, 127: 127, 128: 128, 129: 132, 135: 156, 136: 129, 159: 159}),
])
def test_deal_rounds_by_hand(length, slots):
    rank = np.arange(length)
    got = csl._deal_rounds(rank, np.full(length, length))
    assert sorted(got.tolist()) == list(range(length))
    assert {r: int(got[r]) for r in slots} == slots


def test_tiled_csl_decode_and_spmm_by_hand():
    plan = csl.encode(csr((2, 70), W2), "float16", tile_m=64, bias=[1, -9])
    d = csl.decode(plan)
    assert d.shape == (2, 70) and d.dtype == np.float32
    assert sorted(zip(d.row.tolist(), d.col.tolist(), d.data.tolist())) == \
        [(0, 0, 1.0), (0, 9, 2.0), (1, 0, 3.0), (1, 65, 4.0)]
    x = np.ones((70, 2), np.float16)
    x[:, 1] = -1
    assert csl.spmm(plan, x).tolist() == [[4, -2], [-2, -16]]  # W x = [[3, -3], [7, -7]] + bias
    assert csl.spmm(plan, x, relu=True).tolist() == [[4, 0], [0, 0]]
    assert csl.spmm(plan, x).dtype == np.float16
    assert csl.spmm(plan, x, out="float32").dtype == np.float32


@pytest.mark.parametrize("dtype, out, want", [
    ("float16", None, 1.0), ("float16", "float32", 1 + 2**-11), ("bfloat16", "float32", 1 + 2**-8),
    ("bfloat16", None, 1.0),
])
def test_multiply_rounds_once_at_the_end(dtype, out, want):
    # 1 + 2^-11 (fp16) and 1 + 2^-8 (bf16) are exact in fp32 and ties to the even 1.0 in 16 bits
    small = 2.0**-11 if dtype == "float16" else 2.0**-8
    plan = csl.encode(csr((1, 2), {(0, 0): 1.0, (0, 1): small}), dtype, tile_m=64)
    x = np.ones((2, 1), np.float16 if dtype == "float16" else np.float32)
    got = csl.spmm(plan, x, out=out)
    assert float(got[0, 0]) == want


def test_bf16_x_is_rounded_before_the_product():
    plan = csl.encode(csr((1, 1), {(0, 0): 1.0}), "bfloat16", tile_m=64)
    x = np.array([[1 + 2**-8 + 2**-16]], np.float32)  # rounds up to 1 + 2^-7 in bf16
    assert float(csl.spmm(plan, x, out="float32")[0, 0]) == 1 + 2**-7


def test_tiled_csl_offsets_limit_on_both_sides(monkeypatch):
    real = csl._encode_band

    def huge(vectors):
        def band(*args):
            words, lengths = real(*args)
            return words, lengths * 0 + 4 * vectors
        return band
    monkeypatch.setattr(csl, "_encode_band", huge(2**31 - 2))  # two tiles: 2^32 - 4 vectors
    with pytest.raises(OverflowError, match="2\\*\\*31"):
        csl.encode(csr((2, 70), W2), "float16", tile_m=64)
    monkeypatch.setattr(csl, "_encode_band", huge(2**30 - 1))  # 2^31 - 2 vectors
    plan = csl.encode(csr((2, 70), W2), "float16", tile_m=64)
    assert plan.arrays["tile_offsets"].tolist() == [0, 2**30 - 1, 2**31 - 2]
    monkeypatch.setattr(csl, "_encode_band", huge(2**30))  # 2^31 vectors exactly
    with pytest.raises(OverflowError):
        csl.encode(csr((2, 70), W2), "float16", tile_m=64)


def test_tiled_csl_default_tile_is_128_rows():
    plan = csl.encode(csr((2, 70), W2), "float16")
    assert (plan.constants["tile_m"], plan.constants["m_tiles"], plan.constants["k_tiles"]) == (128, 1, 2)
    sink = (128 * 64) << 17
    assert plan.arrays["words"].tolist() == [word(1.0, 0), word(2.0, 9), sink, word(3.0, 72),
                                             sink, word(4.0, 73), sink, sink]


def test_tiled_csl_strict_banks_leave_empty_tiles_empty():
    plan = csl.encode(csr((2, 200), {(0, 0): 1.0}), "float16", tile_m=64, strict_banks=True)
    assert plan.arrays["tile_offsets"].tolist() == [0, 32, 32, 32, 32]  # 4 words in each of 32 banks, then none


def test_tiled_csl_virtual_rounds_restart_in_each_tile():
    # tile 0 holds one word of bank 0 and three pads (bank 0); tile 1 one word of bank 0, one of
    # bank 4 and two pads: its virtual round 0 is banks 0 and 4 whatever tile 0 held
    plan = csl.encode(csr((1, 128), {(0, 0): 1.0, (0, 64): 2.0, (0, 73): 3.0}), "float16", tile_m=64)
    assert plan.arrays["words"].tolist() == [word(1.0, 0), SINK, SINK, SINK, word(2.0, 0), word(3.0, 9), SINK, SINK]


def test_round_conflicts_per_round_in_order():
    # bank 0: (0, 0), (1, 8), (2, 16), (3, 24) and two pads; bank 1: (0, 2), (1, 10). Virtual order
    # A E B F C D P P, two lanes: rounds (A, E), (B, F), (C, D), (P, P): C and D are two words of bank 0,
    # the pads write one word
    entries = {(0, 0): 1.0, (0, 2): 1.0, (1, 8): 1.0, (1, 10): 1.0, (2, 16): 1.0, (3, 24): 1.0}
    plan = csl.encode(csr((4, 64), entries), "float16", tile_m=64)
    assert plan.arrays["tile_offsets"].tolist() == [0, 2]
    assert csl.round_conflicts(plan).tolist() == [1, 1, 2, 1]


def bank_column(row, bank):
    """The column of row `row` whose swizzled position holds the low half of word `bank`."""
    return ((((2 * bank) >> 3) ^ (row & 7)) << 3) + ((2 * bank) & 7)


def test_round_conflicts_across_two_vector_groups_after_another_tile():
    # tile 0: one word (one vector). Tile 1: rows 0-6 x banks 0-19, 140 words = 35 vectors: a full
    # group of 32 lanes, then 3. Virtual rounds hold 20 words, so each full store round (32
    # consecutive words) meets some banks twice; the last group's 12 words (banks 8-19) do not.
    entries = {(0, 0): 1.0}
    entries.update({(r, 64 + bank_column(r, b)): 1.0 for r in range(7) for b in range(20)})
    plan = csl.encode(csr((7, 128), entries), "float16", tile_m=64)
    assert plan.arrays["tile_offsets"].tolist() == [0, 1, 36]
    assert csl.round_conflicts(plan).tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1]


def test_tiled_csl_empty_matrix():
    plan = csl.encode(sp.csr_matrix((0, 64), dtype=np.float32), "float16", tile_m=64)
    assert plan.arrays["words"].size == 0 and plan.arrays["tile_offsets"].tolist() == [0]
    assert plan.constants["max_tile_vectors"] == 0 and csl.round_conflicts(plan).size == 0


# ---- formats/tiled_bitmap.py -----------------------------------------------------------------------

@pytest.mark.parametrize("tile_m, row, col, frag, code", [
    (64, 0, 0, 0, 0), (64, 0, 1, 0, 1), (64, 0, 2, 0, 8), (64, 1, 0, 0, 32), (64, 8, 0, 0, 2), (64, 0, 8, 0, 4),
    (64, 9, 9, 0, 39), (64, 16, 0, 4, 0), (64, 0, 16, 1, 0), (64, 63, 63, 15, 255),
    (128, 16, 0, 1, 0), (128, 0, 16, 2, 0), (128, 32, 0, 8, 0), (128, 127, 63, 31, 255),
    (256, 16, 0, 1, 0), (256, 32, 0, 2, 0), (256, 0, 16, 4, 0), (256, 64, 0, 16, 0),
])
def test_element_code_and_position_by_hand(tile_m, row, col, frag, code):
    f, c = bitmap.element_code(row, col, tile_m)
    assert (int(f), int(c)) == (frag, code)
    r, cc = bitmap.element_position(frag, code, tile_m)
    assert (int(r), int(cc)) == (row, col)


def test_element_code_two_warps():
    # 2 warps of a 64-row tile: 32 rows a warp, 2 m-fragments, 8 fragments a warp
    assert [int(v) for v in bitmap.element_code(32, 0, 64, 2)] == [8, 0]
    assert [int(v) for v in bitmap.element_code(16, 16, 64, 2)] == [3, 0]
    assert bitmap.fragments_per_warp(64, 2) == 8 and bitmap.fragments_per_warp(256) == 16


@pytest.mark.parametrize("tile_m, warps", [(32, 4), (96, 4), (64, 8)])
def test_element_code_needs_power_of_two_warp_slices_of_16_rows(tile_m, warps):
    with pytest.raises(ValueError, match="power of two"):
        bitmap.element_code(0, 0, tile_m, warps)


@pytest.mark.parametrize("gfrag, code, word, bit", [
    (0, 0, 0, 0), (1, 0, 0, 8), (0, 8, 1, 0), (0, 7, 0, 7), (4, 0, 32, 0), (3, 255, 31, 31), (2, 17, 2, 17),
])
def test_bitmap_bit_by_hand(gfrag, code, word, bit):
    assert [int(v) for v in bitmap.bitmap_bit(gfrag, code, 4)] == [word, bit]


@pytest.mark.parametrize("gfrag, pair, word, bit", [
    (0, 0, 0, 0), (1, 0, 0, 4), (2, 1, 0, 9), (0, 4, 0, 16), (4, 0, 16, 0), (3, 127, 15, 31), (0, 19, 2, 3),
])
def test_pair_bitmap_bit_by_hand(gfrag, pair, word, bit):
    assert [int(v) for v in bitmap.pair_bitmap_bit(gfrag, pair, 4)] == [word, bit]


def test_value_sizes():
    assert (bitmap.value_bytes(1), bitmap.value_bytes(2)) == (2, 4)
    assert (bitmap.align_values(1), bitmap.align_values(2)) == (8, 4)


def test_slice_layout_by_hand():
    per_slice = np.array([[1, 0, 2, 0], [0, 0, 0, 0], [3, 3, 3, 0]])
    start, total, padded = bitmap.slice_layout(per_slice, 8)
    assert start.tolist() == [0, 1, 1, 3, 8, 8, 8, 8, 8, 11, 14, 17]
    assert total == 24 and padded.tolist() == [8, 0, 16]


# T (64 x 128): (0, 0) = 1, (0, 1) = 2, (9, 9) = 3, (16, 0) = 4, (63, 63) = 5 in tile 0; tile 1 empty.
# Codes (fragment, code): (0, 0), (0, 1), (0, 39), (4, 0), (15, 255): warp slices 0, 0, 0, 1, 3.
T64 = {(0, 0): 1.0, (0, 1): 2.0, (9, 9): 3.0, (16, 0): 4.0, (63, 63): 5.0}


def test_tiled_bitmap_encode_pinned():
    plan = bitmap.encode(csr((64, 128), T64), "float16", tile_m=64, bias=np.arange(64))
    a = plan.arrays
    bits = np.zeros(256, np.uint32)  # 2 tiles x 4 slices x 4 fragments x 8 words
    bits[0] = 0b11  # lane 0, fragment 0: elements 0 and 1
    bits[4] = 1 << 7  # (9, 9): lane 4's byte of fragment 0 (byte 16), element 7
    bits[32] = 1  # (16, 0): slice 1, lane 0, fragment 0
    bits[127] = 1 << 31  # (63, 63): slice 3, lane 31, fragment 3, element 7
    assert a["bitmaps"].dtype == np.uint32 and a["bitmaps"].tolist() == bits.tolist()
    assert a["values"].dtype == np.uint16
    assert a["values"].tolist() == [F16[1.0], F16[2.0], F16[3.0], F16[4.0], F16[5.0], 0, 0, 0]  # to 16 bytes
    assert a["slice_offsets"].dtype == np.int32
    assert a["slice_offsets"].tolist() == [0, 3, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8]
    assert a["bias"].dtype == np.float32 and a["bias"][63] == 63
    assert plan.constants == {"m": 64, "k": 128, "nnz": 5, "tile_m": 64, "tile_k": 64, "m_tiles": 1, "k_tiles": 2,
                              "warps": 4, "dtype": "float16", "granule": 1, "max_tile_values": 8, "empty_tiles": 1}
    assert bitmap.encoded_bytes(plan) == 256 * 4 + 8 * 2 + 12 * 4


def test_tiled_bitmap_pairs_encode_pinned():
    plan = bitmap.encode(csr((64, 128), T64), "float16", tile_m=64, granule=2)
    a = plan.arrays
    bits = np.zeros(128, np.uint32)  # 128 bits a fragment
    bits[0] = 1  # lane 0's register 0 of fragment 0: elements (0, 0), (0, 1)
    bits[2] = 1 << 3  # (9, 9): lane 4, register 3 (byte 8, bit 3)
    bits[16] = 1  # (16, 0): slice 1
    bits[63] = 1 << 31  # (63, 63): slice 3, lane 31, fragment 3, register 3
    assert a["bitmaps"].tolist() == bits.tolist()
    # one word a register: low half the even column, high half the odd one (zero where absent)
    assert a["values"].dtype == np.uint32
    assert a["values"].tolist() == [F16[2.0] << 16 | F16[1.0], F16[3.0] << 16, F16[4.0], F16[5.0] << 16]
    assert a["slice_offsets"].tolist() == [0, 2, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4]
    assert (plan.constants["granule"], plan.constants["max_tile_values"], plan.constants["empty_tiles"]) == (2, 4, 1)


@pytest.mark.parametrize("granule", [1, 2])
def test_tiled_bitmap_decode_and_spmm_by_hand(granule):
    plan = bitmap.encode(csr((64, 128), T64), "float16", tile_m=64, granule=granule)
    d = bitmap.decode(plan).tocsr()
    want = np.zeros((64, 128))
    for (r, c), v in T64.items():
        want[r, c] = v
    assert d.toarray().tolist() == want.tolist()
    # granule 2 stores the zero half of each register: (9, 8), (16, 1), (63, 62) come back as zeros
    assert bitmap.decode(plan).nnz == (5 if granule == 1 else 8)
    y = bitmap.spmm(plan, np.ones((128, 1), np.float16), relu=True)
    want_y = np.zeros((64, 1))
    want_y[[0, 9, 16, 63], 0] = [3, 3, 4, 5]
    assert y.dtype == np.float16 and y.tolist() == want_y.tolist()


def test_pair_in_an_edge_tile_drops_the_half_past_the_matrix():
    plan = bitmap.encode(csr((64, 65), {(0, 64): 1.0}), "float16", tile_m=64, granule=2)
    d = bitmap.decode(plan)
    assert d.shape == (64, 65) and d.nnz == 1 and (int(d.row[0]), int(d.col[0])) == (0, 64)


@pytest.mark.parametrize("tile_m, granule, match", [(96, 1, "multiple of 64"), (64, 3, "granule 3")])
def test_tiled_bitmap_rejects_bad_tiles_and_granules(tile_m, granule, match):
    with pytest.raises(ValueError, match=match):
        bitmap.encode(csr((64, 128), T64), "float16", tile_m=tile_m, granule=granule)


def test_tiled_bitmap_offsets_limit_on_both_sides(monkeypatch):
    real = bitmap.slice_layout

    def layout(total):
        """The real layout for the band's values (the first call), `total` for the whole plan's."""
        calls = []

        def fake(per_slice, align):
            start, real_total, padded = real(per_slice, align)
            calls.append(per_slice)
            return start, (real_total if len(calls) == 1 else total), padded
        return fake
    monkeypatch.setattr(bitmap, "slice_layout", layout(2**31 - 1))
    plan = bitmap.encode(csr((64, 128), T64), "float16", tile_m=64)
    assert plan.arrays["slice_offsets"][-1] == 2**31 - 1
    monkeypatch.setattr(bitmap, "slice_layout", layout(2**31))
    with pytest.raises(OverflowError, match="halves"):
        bitmap.encode(csr((64, 128), T64), "float16", tile_m=64)
    monkeypatch.setattr(bitmap, "slice_layout", layout(2**31))
    with pytest.raises(OverflowError, match="words"):
        bitmap.encode(csr((64, 128), T64), "float16", tile_m=64, granule=2)
    monkeypatch.setattr(bitmap, "slice_layout", layout(2**31))
    with pytest.raises(OverflowError):  # one warp a tile: the total is the last offset alone
        bitmap.encode(csr((64, 128), T64), "float16", tile_m=64, warps=1)


def test_tiled_bitmap_default_tile_relu_and_old_plans():
    plan = bitmap.encode(csr((64, 128), T64), "float16")
    assert (plan.constants["tile_m"], plan.constants["m_tiles"]) == (128, 1)
    assert plan.arrays["bitmaps"].size == 2 * 4 * 8 * 8  # 2 tiles x 4 slices x 8 fragments x 8 words
    x = -np.ones((128, 1), np.float16)
    assert bitmap.spmm(plan, x)[[0, 9, 16, 63], 0].tolist() == [-3, -3, -4, -5]  # no ReLU unless asked
    older = bitmap.Plan(plan.format, plan.arrays, {k: v for k, v in plan.constants.items() if k != "granule"})
    assert bitmap.decode(older).nnz == 5  # a plan from before register pairs: one bit an element


@pytest.mark.parametrize("granule", [1, 2])
def test_consumption_order_past_65536_fragments_in_a_band(granule):
    # 1025 tiles of 256 x 64 in one band (64 fragments a tile): fragment 1 of tile 0 (global 1),
    # fragments 0 and 2 of tile 1024 (global 65536 and 65538, one warp slice). Sorted on their low
    # 16 bits alone they would interleave (65536, 1, 65538) and split that slice's values.
    a = csr((256, 65600), {(16, 0): 1.0, (0, 65536): 2.0, (32, 65536): 3.0})
    plan = bitmap.encode(a, "float16", tile_m=256, granule=granule)
    last = plan.arrays["values"][-8 // granule:][:2]
    assert (last & 0xFFFF).tolist() == [F16[2.0], F16[3.0]]  # tile 1024's slice, fragment by fragment
    d = bitmap.decode(plan)
    real = d.data != 0
    assert sorted(zip(d.row[real].tolist(), d.col[real].tolist(), d.data[real].tolist())) == \
        [(0, 65536, 2.0), (16, 0, 1.0), (32, 65536, 3.0)]


def test_tiled_bitmap_empty_matrix():
    plan = bitmap.encode(sp.csr_matrix((0, 64), dtype=np.float32), "float16", tile_m=64)
    assert plan.arrays["bitmaps"].size == 0 and plan.arrays["values"].size == 0
    assert plan.arrays["values"].dtype == np.uint16
    pairs = bitmap.encode(sp.csr_matrix((0, 64), dtype=np.float32), "float16", tile_m=64, granule=2)
    assert pairs.arrays["values"].dtype == np.uint32
    assert plan.arrays["slice_offsets"].tolist() == [0, 0, 0, 0]
    assert (plan.constants["max_tile_values"], plan.constants["empty_tiles"]) == (0, 0)
