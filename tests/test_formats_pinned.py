"""Encoders pinned byte by byte on small hand-built matrices, and emulators against hand-computed
products: every expected array below is written out by hand from the layout each format module's
docstring describes, never computed by the encoder or its helpers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.formats import Plan, as_index
from sparsegen.formats import csr as csr_format
from sparsegen.formats import csr_sddmm, dense, ell_coo, halfbits, panel, sampled_tiles, sliced_ell


def csr(shape, entries, dtype=np.float32) -> sp.csr_matrix:
    """Canonical CSR from {(row, col): value}."""
    rows = [r for r, _ in entries]
    cols = [c for _, c in entries]
    a = sp.csr_matrix((np.array(list(entries.values()), dtype=dtype), (rows, cols)), shape=shape)
    a.sort_indices()
    return a


def flat(length, at: dict, dtype):
    out = np.zeros(length, dtype=dtype)
    for i, v in at.items():
        out[i] = v
    return out


# ---- formats/__init__.py ---------------------------------------------------------------------------

def test_plan_nbytes_and_describe():
    p = Plan("x", {"a": np.zeros(3, np.int32), "b": np.zeros((2, 5), np.float16)}, {"m": 4})
    assert p.nbytes == 3 * 4 + 10 * 2
    assert p.describe() == {"format": "x", "constants": {"m": 4},
                            "arrays": {"a": {"dtype": "int32", "shape": [3]},
                                       "b": {"dtype": "float16", "shape": [2, 5]}}}
    assert Plan("empty").nbytes == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.format = "y"  # a plan is a value: stages never edit one


def test_as_index_accepts_int32_max_and_rejects_one_more():
    top = np.int64(np.iinfo(np.int32).max)
    got = as_index(np.array([0, top], dtype=np.int64))
    assert got.dtype == np.int32 and got.tolist() == [0, 2**31 - 1] and got.flags.c_contiguous
    with pytest.raises(OverflowError, match="32 bits"):
        as_index(np.array([0, top + 1], dtype=np.int64))
    assert as_index(np.zeros(0, dtype=np.int64)).dtype == np.int32


# ---- formats/sliced_ell.py -------------------------------------------------------------------------
# A (4 x 6): row 0 = {1: 1, 4: 2}, row 1 = {4: 3}, row 2 empty, row 3 = {0: 4, 1: 5, 5: 6}.
# One tile (block 32, one warp); its footprint is the inputs {0, 1, 4, 5}.

A4 = {(0, 1): 1.0, (0, 4): 2.0, (1, 4): 3.0, (3, 0): 4.0, (3, 1): 5.0, (3, 5): 6.0}


def test_sliced_ell_two_equal_buffers_pinned():
    plan = sliced_ell.encode(csr((4, 6), A4), 32, 2)
    a = plan.arrays
    # buffers of 2 slots: {0, 1} and {4, 5}
    assert a["map"].tolist() == [0, 1, 4, 5] and a["map"].dtype == np.int32
    assert a["map_disp"].tolist() == [0, 2, 4]
    assert a["buf_disp"].tolist() == [0, 2]
    # buffer 0: row 3 holds two entries (width 2); buffer 1: one entry per row (width 1)
    assert a["warp_disp"].tolist() == [0, 2, 3]
    # ELL row e, lane l at e * 32 + l: the slot inside the buffer, and the weight
    assert a["index"].dtype == np.uint16
    assert a["index"].tolist() == flat(96, {0: 1, 3: 0, 35: 1, 64: 0, 65: 0, 67: 1}, np.uint16).tolist()
    assert a["value"].dtype == np.float32
    assert a["value"].tolist() == flat(96, {0: 1, 3: 4, 35: 5, 64: 2, 65: 3, 67: 6}, np.float32).tolist()
    assert plan.constants == {"m": 4, "k": 6, "nnz": 6, "tiles": 1, "buffers": 2, "block": 32, "buf": 2,
                              "uniform_value": None, "uniform_width": 0, "uniform_buffers": 2,
                              "slots_max": 2, "max_width": 2, "padding": 16.0}


def test_sliced_ell_unequal_buffers_size_shared_memory_by_the_largest():
    plan = sliced_ell.encode(csr((4, 6), A4), 32, 3)
    a, c = plan.arrays, plan.constants
    # buffers {0, 1, 4} and {5}: the kernel's shared buffer holds the larger, 3 slots
    assert a["map"].tolist() == [0, 1, 4, 5] and a["map_disp"].tolist() == [0, 3, 4]
    assert c["slots_max"] == 3 and c["uniform_buffers"] == 0
    assert a["warp_disp"].tolist() == [0, 2, 3]
    assert a["index"].tolist() == flat(96, {0: 1, 1: 2, 3: 0, 32: 2, 35: 1, 67: 0}, np.uint16).tolist()
    assert a["value"].tolist() == flat(96, {0: 1, 1: 3, 3: 4, 32: 2, 35: 5, 67: 6}, np.float32).tolist()
    assert (c["max_width"], c["uniform_width"], c["padding"]) == (2, 0, 16.0)


# B (40 x 4): row 0 = {2: 1}, row 33 = {2: 2, 3: 3}: two tiles of 32 rows, or two warps of one tile.
B40 = {(0, 2): 1.0, (33, 2): 2.0, (33, 3): 3.0}


def test_sliced_ell_two_tiles_pinned():
    plan = sliced_ell.encode(csr((40, 4), B40), 32, 4)
    a, c = plan.arrays, plan.constants
    assert a["map"].tolist() == [2, 2, 3] and a["map_disp"].tolist() == [0, 1, 3]
    assert a["buf_disp"].tolist() == [0, 1, 2] and a["warp_disp"].tolist() == [0, 1, 3]
    assert a["index"].tolist() == flat(96, {0: 0, 33: 0, 65: 1}, np.uint16).tolist()
    assert a["value"].tolist() == flat(96, {0: 1, 33: 2, 65: 3}, np.float32).tolist()
    assert (c["tiles"], c["buffers"], c["uniform_buffers"], c["slots_max"]) == (2, 2, 0, 2)
    assert (c["uniform_width"], c["max_width"], c["padding"]) == (0, 2, 32.0)


def test_sliced_ell_two_warps_pinned():
    plan = sliced_ell.encode(csr((40, 4), B40), 64, 4)
    a, c = plan.arrays, plan.constants
    assert a["map"].tolist() == [2, 3] and a["map_disp"].tolist() == [0, 2] and a["buf_disp"].tolist() == [0, 1]
    # (buffer 0, warp 0) has width 1, (buffer 0, warp 1) width 2 (row 33 is lane 1 of warp 1)
    assert a["warp_disp"].tolist() == [0, 1, 3]
    assert a["index"].tolist() == flat(96, {0: 0, 33: 0, 65: 1}, np.uint16).tolist()
    assert a["value"].tolist() == flat(96, {0: 1, 33: 2, 65: 3}, np.float32).tolist()
    assert (c["tiles"], c["buffers"], c["uniform_buffers"], c["slots_max"]) == (1, 1, 1, 2)


def test_sliced_ell_one_input_two_equal_tiles():
    a = csr((64, 1), {(0, 0): 1.0, (40, 0): 2.0})  # rows 0 and 40: one slot, one buffer in each tile
    plan = sliced_ell.encode(a, 32, 4)
    p, c = plan.arrays, plan.constants
    assert p["map"].tolist() == [0, 0] and p["map_disp"].tolist() == [0, 1, 2]
    assert p["buf_disp"].tolist() == [0, 1, 2] and p["warp_disp"].tolist() == [0, 1, 2]
    assert p["index"].tolist() == [0] * 64 and p["value"].tolist() == flat(64, {0: 1, 40: 2}, np.float32).tolist()
    assert (c["tiles"], c["buffers"], c["uniform_width"], c["uniform_buffers"], c["slots_max"]) == (2, 2, 1, 1, 1)
    assert (c["max_width"], c["padding"], c["uniform_value"]) == (1, 32.0, None)
    z = sliced_ell.layer_product(plan, np.array([[3.0]], np.float32))
    assert z.shape == (1, 64) and z[0, 0] == 3 and z[0, 40] == 6 and np.count_nonzero(z) == 2


def test_sliced_ell_row_after_a_row_ending_in_a_later_buffer():
    # row 0 = {3: 1} lies in buffer 1 (inputs {3}); row 1 = {0: 2, 1: 3} in buffer 0 (inputs {0, 1})
    plan = sliced_ell.encode(csr((2, 4), {(0, 3): 1.0, (1, 0): 2.0, (1, 1): 3.0}), 32, 2)
    p = plan.arrays
    assert p["map"].tolist() == [0, 1, 3] and p["map_disp"].tolist() == [0, 2, 3] and p["buf_disp"].tolist() == [0, 2]
    assert p["warp_disp"].tolist() == [0, 2, 3]  # buffer 0: row 1's two entries; buffer 1: row 0's one
    assert p["index"].tolist() == flat(96, {33: 1}, np.uint16).tolist()
    assert p["value"].tolist() == flat(96, {1: 2, 33: 3, 64: 1}, np.float32).tolist()


def test_ranks_in_groups_by_hand():
    assert sliced_ell._ranks_in_groups(np.array([5, 5, 7, 7, 7, 9])).tolist() == [0, 1, 0, 1, 2, 0]
    assert sliced_ell._ranks_in_groups(np.zeros(0, np.int64)).size == 0


def test_sliced_ell_one_weight_without_padding_drops_the_values():
    a = csr((32, 3), {(r, 1): 0.5 for r in range(32)})
    plan = sliced_ell.encode(a, 32, 1)
    assert "value" not in plan.arrays
    assert plan.arrays["index"].tolist() == [0] * 32 and plan.arrays["map"].tolist() == [1]
    c = plan.constants
    assert (c["uniform_value"], c["uniform_width"], c["uniform_buffers"], c["slots_max"]) == (0.5, 1, 1, 1)
    assert (c["max_width"], c["padding"]) == (1, 1.0)
    y = np.array([[1.0, 2.0, -3.0]], dtype=np.float32)
    assert sliced_ell.layer_product(plan, y).tolist() == [[1.0] * 32]  # 0.5 * 2 per neuron


@pytest.mark.parametrize("entries", [
    {(r, 1): 0.5 for r in range(31)},  # one weight, but lane 31 is padding: its weight must be 0
    {**{(r, 1): 0.5 for r in range(31)}, (31, 1): 0.25},  # no padding, two weights
], ids=["padded", "two-weights"])
def test_sliced_ell_keeps_the_values_when_padded_or_mixed(entries):
    plan = sliced_ell.encode(csr((32, 3), entries), 32, 1)
    assert "value" in plan.arrays and plan.constants["uniform_value"] is None


def test_sliced_ell_empty_matrix():
    plan = sliced_ell.encode(sp.csr_matrix((0, 5), dtype=np.float32), 32, 4)
    c = plan.constants
    assert (c["tiles"], c["buffers"], c["slots_max"], c["max_width"], c["padding"]) == (0, 0, 1, 0, 1.0)
    assert c["uniform_width"] == 0 and c["uniform_buffers"] == 0 and c["uniform_value"] is None


@pytest.mark.parametrize("block", [16, 48, 100])
def test_sliced_ell_block_must_be_a_multiple_of_32(block):
    with pytest.raises(ValueError, match="multiple of 32"):
        sliced_ell.encode(csr((4, 6), A4), block, 2)


def test_sliced_ell_index_dtype_int32_when_asked():
    plan = sliced_ell.encode(csr((4, 6), A4), 32, 2, np.int32)
    assert plan.arrays["index"].dtype == np.int32


Y2 = np.array([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0],     # z = [3, 3, 0, 9]
               [0.0, -1.0, 0.0, 0.0, 0.0, 1.0]],   # z = [-1, 0, 0, 1]
              dtype=np.float32)


def test_sliced_ell_layer_product_by_hand():
    plan = sliced_ell.encode(csr((4, 6), A4), 32, 3)
    assert sliced_ell.layer_product(plan, Y2).tolist() == [[3, 3, 0, 9], [-1, 0, 0, 1]]
    rows, neuron, weight = sliced_ell.expand(plan)
    real = weight != 0
    assert sorted(zip(rows[real].tolist(), neuron[real].tolist(), weight[real].tolist())) == \
        sorted((r, c, v) for (r, c), v in A4.items())


@pytest.mark.parametrize("bias, rule, cap, want", [
    # the challenge's rule: bias only where the product is nonzero, then ReLU, then the cap
    (2.0, "nonzero", None, [[5, 5, 0, 11], [1, 0, 0, 3]]),
    (-2.0, "nonzero", None, [[1, 1, 0, 7], [0, 0, 0, 0]]),
    (2.0, "nonzero", 4.0, [[4, 4, 0, 4], [1, 0, 0, 3]]),
    # the plain rule: bias everywhere
    (2.0, "all", None, [[5, 5, 2, 11], [1, 2, 2, 3]]),
    (-2.0, "all", 8.0, [[1, 1, 0, 7], [0, 0, 0, 0]]),
])
def test_sliced_ell_layer_bias_sign_relu_cap(bias, rule, cap, want):
    plan = sliced_ell.encode(csr((4, 6), A4), 32, 2)
    got = sliced_ell.layer(plan, Y2, bias, cap, bias_rule=rule)
    assert got.dtype == np.float32 and got.tolist() == want


# ---- formats/csr.py --------------------------------------------------------------------------------

def test_csr_encode_pinned_and_independent_of_the_source():
    a = csr((4, 6), A4)
    plan = csr_format.encode(a, "float16", bias=[1, -2, 3, -4])
    p = plan.arrays
    assert p["indptr"].tolist() == [0, 2, 3, 3, 6] and p["indptr"].dtype == np.int32
    assert p["indices"].tolist() == [1, 4, 4, 0, 1, 5] and p["indices"].dtype == np.int32
    assert p["values"].tolist() == [1, 2, 3, 4, 5, 6] and p["values"].dtype == np.float16
    assert p["bias"].tolist() == [1, -2, 3, -4] and p["bias"].dtype == np.float32
    assert plan.format == "csr" and plan.constants == {"m": 4, "k": 6, "nnz": 6}
    a.indices[0], a.indptr[1], a.data[0] = 2, 1, 9  # the plan holds copies
    assert p["indptr"].tolist() == [0, 2, 3, 3, 6] and p["indices"][0] == 1 and p["values"][0] == 1
    assert "bias" not in csr_format.encode(csr((4, 6), A4), "float32").arrays


X6 = np.array([[1, 0], [1, 1], [0, 0], [0, 0], [1, -1], [0, 2]], dtype=np.float32)
# A4 @ X6 = [[3, -1], [3, -3], [0, 0], [9, 17]]


@pytest.mark.parametrize("bias, relu, want", [
    (None, False, [[3, -1], [3, -3], [0, 0], [9, 17]]),
    (None, True, [[3, 0], [3, 0], [0, 0], [9, 17]]),
    ([2, 2, -1, -10], False, [[5, 1], [5, -1], [-1, -1], [-1, 7]]),
    ([2, 2, -1, -10], True, [[5, 1], [5, 0], [0, 0], [0, 7]]),
])
def test_csr_spmm_by_hand(bias, relu, want):
    plan = csr_format.encode(csr((4, 6), A4), "float32", bias=bias)
    got = csr_format.spmm(plan, X6, relu=relu)
    assert got.dtype == np.float32 and got.tolist() == want
    half = csr_format.spmm(csr_format.encode(csr((4, 6), A4), "float16", bias=bias), X6, relu=relu)
    assert half.dtype == np.float16 and half.tolist() == want
    assert csr_format.spmm(plan, X6, relu=relu, out_dtype=np.float64).dtype == np.float64
    if not relu:
        assert csr_format.spmm(plan, X6).tolist() == want  # no ReLU unless asked


def test_row_swizzle_longest_first_ties_in_order():
    assert csr_format.row_swizzle(np.array([0, 2, 3, 3, 6])).tolist() == [3, 0, 1, 2]
    got = csr_format.row_swizzle(np.array([0, 1, 3, 4, 6]))  # lengths 1, 2, 1, 2
    assert got.tolist() == [1, 3, 0, 2] and got.dtype == np.int32


def test_row_splits_by_hand():
    lengths = np.array([0, 1, 4, 5, 9, 100])
    # groups wanted: 1, 1, 1, 2, 3, 25 -> powers of two 1, 1, 1, 2, 4, 32 -> at most 8
    assert csr_format.row_splits(lengths, 4, 8).tolist() == [1, 1, 1, 2, 4, 8]
    assert csr_format.row_splits(lengths, 4, 64).tolist() == [1, 1, 1, 2, 4, 32]
    assert csr_format.row_splits(np.array([3, 4, 5]), 0, 16).tolist() == [4, 4, 8]  # piece 0 acts as 1
    assert csr_format.row_splits(np.array([8, 9]), 8, 16).tolist() == [1, 2]


@pytest.mark.parametrize("budget, piece", [(9, 1), (8, 2), (7, 2), (6, 4), (4, 4), (3, 8), (2, 8)])
def test_smallest_piece_by_hand(budget, piece):
    # lengths 8, 4, 1 with at most 4 groups a row: piece 1 -> 4 + 4 + 1 = 9 groups; 2 and 3 -> 7;
    # 4 to 7 -> 4; 8 -> 3 (and nothing fits 2: the longest row's length)
    assert csr_format.smallest_piece(np.array([8, 4, 1]), budget, 4) == piece


def test_smallest_piece_without_rows_is_one():
    assert csr_format.smallest_piece(np.zeros(0, np.int64), 5, 4) == 1
    # rows of one nonzero over a budget of one group: the longest row's length, 1
    assert csr_format.smallest_piece(np.array([1, 1]), 1, 4) == 1


def test_balanced_blocks_by_hand():
    lengths = np.array([8, 8, 8, 4, 1, 1, 1])  # split 4, 4, 4, 2, 1, 1, 1 with piece 2
    got = csr_format.balanced_blocks(lengths, 2, 4, 4)
    # split 4: one row a block (4 groups); split 2: two rows a block, one left; split 1: four a block
    assert got.dtype == np.int32
    assert got.tolist() == [[0, 1 << 8 | 2], [1, 1 << 8 | 2], [2, 1 << 8 | 2], [3, 1 << 8 | 1], [4, 3 << 8]]
    assert csr_format.balanced_blocks(np.array([5, 5, 5, 5, 5]), 8, 2, 1).tolist() == [[0, 2 << 8], [2, 2 << 8],
                                                                                      [4, 1 << 8]]
    assert csr_format.balanced_blocks(np.zeros(0, np.int64), 2, 4, 4).shape == (0, 2)
    # a row split 4 ways in blocks of 2 groups still takes a block of its own
    assert csr_format.balanced_blocks(np.array([8]), 2, 2, 4).tolist() == [[0, 1 << 8 | 2]]


def test_encode_sputnik_pinned():
    plan = csr_format.encode_sputnik(csr((4, 6), A4), "float16", index_bits=16, prescale=3, vector=4,
                                     bias=np.array([1, 2, 3, 4]))
    p, c = plan.arrays, plan.constants
    # six nonzeros padded to two vectors of 4; columns stored times 3, as int16
    assert p["indices"].dtype == np.int16 and p["indices"].tolist() == [3, 12, 12, 0, 3, 15, 0, 0]
    assert p["values"].dtype == np.float16 and p["values"].tolist() == [1, 2, 3, 4, 5, 6, 0, 0]
    assert p["indptr"].tolist() == [0, 2, 3, 3, 6] and p["bias"].tolist() == [1, 2, 3, 4]
    assert "order" not in p and "blocks" not in p
    assert plan.format == "csr_sputnik" and c == {"m": 4, "k": 6, "nnz": 6, "prescale": 3}
    plain = csr_format.encode_sputnik(csr((3, 8), S3), "float32")  # defaults: int32, no prescale, no padding
    assert plain.arrays["indices"].dtype == np.int32
    assert plain.arrays["indices"].tolist() == [0, 1, 2, 3, 4, 5, 1, 6, 7]
    assert plain.constants == {"m": 3, "k": 8, "nnz": 9, "prescale": 0}
    assert csr_format.encode_sputnik(csr((4, 6), A4), "float32", vector=2).arrays["indices"].size == 6
    empty = csr_format.encode_sputnik(sp.csr_matrix((2, 3), dtype=np.float32), "float32", vector=4)
    assert empty.arrays["indices"].tolist() == [0, 0, 0, 0] and empty.arrays["values"].size == 4


def test_encode_sputnik_swizzle_and_balance_pinned():
    a = csr((4, 6), A4)  # lengths 2, 1, 0, 3: order 3, 0, 1, 2
    assert csr_format.encode_sputnik(a, "float32", swizzle=True).arrays["order"].tolist() == [3, 0, 1, 2]
    # piece 0: the smallest within 5 groups of at most 2: piece 1 needs 2 + 2 + 1 + 1 = 6, piece 2 needs 5
    plan = csr_format.encode_sputnik(a, "float32", balance=(0, 5, 4, 2))
    p, c = plan.arrays, plan.constants
    assert p["order"].tolist() == [3, 0, 1, 2]
    assert p["blocks"].tolist() == [[0, 1 << 8 | 1], [1, 3 << 8]]
    assert (c["row_blocks"], c["piece"]) == (2, 2)
    given = csr_format.encode_sputnik(a, "float32", balance=(3, 0, 4, 2))
    assert given.arrays["blocks"].tolist() == [[0, 4 << 8]] and given.constants["piece"] == 3


def test_encode_sputnik_index_width_limit_on_both_sides():
    edge = csr((1, 32768), {(0, 32767): 1.0})
    assert csr_format.encode_sputnik(edge, "float16", index_bits=16).arrays["indices"][0] == 32767
    with pytest.raises(OverflowError, match="16-bit"):
        csr_format.encode_sputnik(csr((1, 32769), {(0, 32768): 1.0}), "float16", index_bits=16)
    with pytest.raises(OverflowError, match="16-bit"):
        csr_format.encode_sputnik(edge, "float16", index_bits=16, prescale=2)
    one = csr((1, 2), {(0, 1): 1.0})
    top = np.iinfo(np.int32).max
    assert csr_format.encode_sputnik(one, "float32", prescale=top).arrays["indices"].tolist() == [top]
    with pytest.raises(OverflowError, match="32-bit"):
        csr_format.encode_sputnik(one, "float32", prescale=top + 1)


def test_decode_sputnik_gives_back_the_plain_plan():
    plan = csr_format.encode_sputnik(csr((4, 6), A4), "float16", prescale=3, vector=4, bias=np.array([1, 2, 3, 4]))
    back = csr_format.decode_sputnik(plan)
    assert back.format == "csr" and back.constants == {"m": 4, "k": 6, "nnz": 6}
    assert back.arrays["indices"].tolist() == [1, 4, 4, 0, 1, 5] and back.arrays["indices"].dtype == np.int32
    assert back.arrays["values"].tolist() == [1, 2, 3, 4, 5, 6] and back.arrays["bias"].tolist() == [1, 2, 3, 4]
    unscaled = csr_format.decode_sputnik(csr_format.encode_sputnik(csr((4, 6), A4), "float32", vector=4))
    assert unscaled.arrays["indices"].tolist() == [1, 4, 4, 0, 1, 5] and "bias" not in unscaled.arrays


# ---- formats/csr_sddmm.py --------------------------------------------------------------------------
# S (3 x 8): row 0 = columns 0-4, row 1 = column 5, row 2 = columns 1, 6, 7 (positions 0-4, 5, 6-8).
S3 = {**{(0, c): 1.0 for c in range(5)}, (1, 5): 1.0, (2, 1): 1.0, (2, 6): 1.0, (2, 7): 1.0}


def test_tile_order_row_and_phase_by_hand():
    indptr = np.array([0, 5, 6, 9])
    # tile 4: rows longest first 0, 2, 1 with 2, 1, 1 tiles
    row, phase = csr_sddmm.tile_order(indptr, 4, "row")
    assert row.tolist() == [0, 0, 2, 1] and phase.tolist() == [0, 1, 0, 0]
    row, phase = csr_sddmm.tile_order(indptr, 4, "phase")
    assert row.tolist() == [0, 2, 1, 0] and phase.tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="phase, row"):
        csr_sddmm.tile_order(indptr, 4, "column")


def test_csr_sddmm_encode_pinned():
    plan = csr_sddmm.encode(csr((3, 8), S3), k=10, tile=8, lanes=16, block=64)
    # one tile a row; 4 tiles a block of 64 threads in groups of 16: one padding tile
    assert plan.arrays["tiles"].tolist() == [[0, 0, 5, 0], [2, 6, 3, 0], [1, 5, 1, 0], [0, 0, 0, 0]]
    assert plan.arrays["tiles"].dtype == np.int32 and plan.arrays["slots"].dtype == np.int32
    # slots (times k = 10; a short tile repeats its last column), two tiles a warp interleaved by 4
    assert plan.arrays["slots"].tolist() == [0, 10, 20, 30, 10, 60, 70, 70, 40, 40, 40, 40, 70, 70, 70, 70,
                                             50, 50, 50, 50, 0, 0, 0, 0, 50, 50, 50, 50, 0, 0, 0, 0]
    assert plan.constants == {"m": 3, "k": 8, "n": 8, "inner": 10, "nnz": 9, "tiles": 4, "tile": 8, "group": 2,
                              "scaled": 1}
    raw = csr_sddmm.encode(csr((3, 8), S3), k=10, tile=8, lanes=16, block=64, scaled=False)
    assert raw.arrays["slots"][:8].tolist() == [0, 1, 2, 3, 1, 6, 7, 7] and raw.constants["scaled"] == 0


def test_csr_sddmm_interleave_formula_and_inverse():
    slots = np.arange(4 * 8).reshape(4, 8)  # tile t, slot j holds 8 t + j
    flat_ = csr_sddmm.interleave(slots, 8, 2)
    for t in range(4):
        for j in range(8):
            assert flat_[((t // 2 * 2 + j // 4) * 2 + t % 2) * 4 + j % 4] == 8 * t + j
    assert csr_sddmm.deinterleave(flat_, 8, 2).tolist() == slots.tolist()


@pytest.mark.parametrize("tile", [0, 2, 6])
def test_csr_sddmm_tile_must_be_a_multiple_of_four(tile):
    with pytest.raises(ValueError, match="multiple of 4"):
        csr_sddmm.encode(csr((3, 8), S3), k=4, tile=tile, lanes=16, block=64)


def test_csr_sddmm_offsets_limit_on_both_sides():
    two = csr((1, 2), {(0, 0): 1.0, (0, 1): 1.0})  # offsets 0 and k: the larger one decides
    top = np.iinfo(np.int32).max
    assert csr_sddmm.encode(two, k=top, tile=4, lanes=32, block=32).arrays["slots"].tolist() == [0, top, top, top]
    with pytest.raises(OverflowError, match="32 bits"):
        csr_sddmm.encode(two, k=top + 1, tile=4, lanes=32, block=32)
    assert csr_sddmm.encode(two, k=top + 1, tile=4, lanes=32, block=32, scaled=False).arrays["slots"].max() == 1


A3 = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
B8 = np.array([[j, 1] for j in range(8)], dtype=np.float32)
# A[r] . B[c] = A[r, 0] c + A[r, 1] at each stored entry, in CSR order
SDDMM_S3 = [2, 3, 4, 5, 6, 19, 11, 36, 41]


@pytest.mark.parametrize("order", ["phase", "row"])
def test_csr_sddmm_emulator_by_hand(order):
    plan = csr_sddmm.encode(csr((3, 8), S3), k=2, tile=4, lanes=8, block=32, order=order)
    pos, rows, cols = csr_sddmm.gather(plan)
    assert sorted(zip(pos.tolist(), rows.tolist(), cols.tolist())) == \
        [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 0, 3), (4, 0, 4), (5, 1, 5), (6, 2, 1), (7, 2, 6), (8, 2, 7)]
    got = csr_sddmm.sddmm(plan, A3, B8)
    assert got.dtype == np.float32 and got.tolist() == SDDMM_S3
    assert csr_sddmm.sddmm(plan, A3.astype(np.float16), B8.astype(np.float16)).dtype == np.float16
    assert csr_sddmm.sddmm(plan, A3, B8, out_dtype=np.float64).dtype == np.float64


def test_csr_sddmm_unscaled_slots_are_read_as_columns():
    plan = csr_sddmm.encode(csr((3, 8), S3), k=2, tile=4, lanes=8, block=32, scaled=False)
    pos, rows, cols = csr_sddmm.gather(plan)
    assert sorted(cols.tolist()) == [0, 1, 1, 2, 3, 4, 5, 6, 7]
    assert csr_sddmm.sddmm(plan, A3, B8).tolist() == SDDMM_S3


@pytest.mark.parametrize("chunk, a_cols, steps", [
    (4, 2, [2, 2, 1]),  # 4 elements a step: 2 rows of 2
    (4, 1, [4, 1]),
    (4, 5, [1, 1, 1, 1, 1]),  # a row longer than the chunk: one row a step
    (2**22, 2, [5]),
])
def test_sampled_products_gathers_at_most_a_chunk_a_step(monkeypatch, chunk, a_cols, steps):
    monkeypatch.setattr(csr_sddmm, "EMULATE_CHUNK", chunk)
    calls = []
    einsum = np.einsum

    def counting(spec, x, y):
        calls.append(x.shape[0])
        return einsum(spec, x, y)
    monkeypatch.setattr(np, "einsum", counting)
    a = np.arange(4 * a_cols, dtype=np.float32).reshape(4, a_cols)  # 4 rows of A, a_cols wide
    b = np.ones((8, a_cols), np.float32)
    pos, rows, cols = np.array([4, 0, 1, 3, 2]), np.array([3, 0, 1, 0, 2]), np.array([7, 0, 5, 1, 6])
    got = csr_sddmm.sampled_products(pos, rows, cols, 6, a, b)
    assert calls == steps
    row_sums = a.sum(axis=1)
    assert got.tolist() == [row_sums[0], row_sums[1], row_sums[2], row_sums[0], row_sums[3], 0]


def test_sampled_products_with_an_empty_inner_dimension():
    got = csr_sddmm.sampled_products(np.array([1, 0]), np.array([0, 1]), np.array([2, 3]), 3,
                                     np.zeros((2, 0), np.float32), np.zeros((4, 0), np.float32))
    assert got.tolist() == [0, 0, 0]


# ---- formats/halfbits.py ---------------------------------------------------------------------------

def f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("bits, want", [
    (0x3F800000, 0x3F80),  # 1.0
    (0xBF800000, 0xBF80),  # -1.0
    (0x3F808000, 0x3F80),  # 1 + 2^-8: a tie, rounds to the even 0x3F80
    (0x3F818000, 0x3F82),  # 1 + 3 * 2^-8: a tie, rounds up to the even 0x3F82
    (0x3F808001, 0x3F81),  # just above the tie
    (0x3F807FFF, 0x3F80),  # just below the tie
    (0x7F7FFFFF, 0x7F80),  # the largest float32 rounds to infinity
    (0x7F800000, 0x7F80),  # +inf
    (0xFF800000, 0xFF80),  # -inf
    (0x7FC00000, 0x7FC0),  # quiet NaN
    (0x7F800001, 0x7FC0),  # signalling NaN: made quiet, not rounded into infinity
    (0xFF800001, 0xFFC0),  # negative NaN keeps its sign
    (0x00000001, 0x0000),  # the smallest subnormal rounds to zero
])
def test_round_bf16_bits_pinned(bits, want):
    got = halfbits.round_bf16_bits(np.array([f32(bits)]))
    assert got.dtype == np.uint16 and int(got[0]) == want


def test_bf16_conversions_pinned():
    assert halfbits.bf16_bits_to_float32(np.array([0x3F80, 0xC000, 0x3F81])).tolist() == [1.0, -2.0, 1 + 2**-7]
    assert halfbits.round_bf16(np.array([1 + 2**-8 + 2**-20, -3.0], np.float32)).tolist() == [1 + 2**-7, -3.0]
    assert halfbits.to_bits([1.0, -2.0, 0.5], "bfloat16").tolist() == [0x3F80, 0xC000, 0x3F00]
    assert halfbits.to_bits([1.0, -2.0, 0.5, 65504.0], "float16").tolist() == [0x3C00, 0xC000, 0x3800, 0x7BFF]
    assert halfbits.from_bits([0x3C00, 0xC000, 0x7BFF], "float16").tolist() == [1.0, -2.0, 65504.0]
    assert halfbits.from_bits([0x3F80, 0xBF00], "bfloat16").tolist() == [1.0, -0.5]
    assert halfbits.from_bits([0x3C00], "float16").dtype == np.float32
    for fn in (halfbits.to_bits, halfbits.from_bits):
        with pytest.raises(ValueError, match="float16"):
            fn([0], "float32")


def test_round_to_each_dtype():
    x = np.array([1 + 2**-11, 1 + 2**-8, 3.0], dtype=np.float32)
    assert halfbits.round_to(x, "float32").tolist() == x.tolist()
    assert halfbits.round_to(x, "float16").tolist() == [1.0, 1 + 2**-8, 3.0]  # 1 + 2^-11: a tie, to even
    assert halfbits.round_to(x, "bfloat16").tolist() == [1.0, 1.0, 3.0]
    assert halfbits.round_to(x, "float16").dtype == np.float32


# ---- formats/dense.py ------------------------------------------------------------------------------
W23 = {(0, 0): 1.0, (0, 2): -2.0, (1, 1): 0.5}


@pytest.mark.parametrize("dtype, bits", [("float16", [[0x3C00, 0, 0xC000], [0, 0x3800, 0]]),
                                         ("bfloat16", [[0x3F80, 0, 0xC000], [0, 0x3F00, 0]])])
def test_dense_encode_half_bit_patterns(dtype, bits):
    plan = dense.encode(csr((2, 3), W23), dtype, bias=[1, 2])
    assert plan.arrays["w"].dtype == np.uint16 and plan.arrays["w"].tolist() == bits
    assert plan.arrays["bias"].dtype == np.float32 and plan.arrays["bias"].tolist() == [1, 2]
    assert plan.format == "dense" and plan.constants == {"m": 2, "k": 3, "dtype": dtype}


def test_dense_encode_float32():
    plan = dense.encode(csr((2, 3), W23), "float32")
    assert plan.arrays["w"].dtype == np.float32 and plan.arrays["w"].tolist() == [[1, 0, -2], [0, 0.5, 0]]
    assert "bias" not in plan.arrays


@pytest.mark.parametrize("dtype, bias, relu, want", [
    ("float32", False, False, [[-5, 1], [1, 0]]),
    ("float32", True, False, [[5, 11], [-2, -3]]),
    ("float32", True, True, [[5, 11], [0, 0]]),
    ("float32", False, True, [[0, 1], [1, 0]]),
    ("float16", True, True, [[5, 11], [0, 0]]),
    ("bfloat16", True, False, [[5, 11], [-2, -3]]),
])
def test_dense_spmm_by_hand(dtype, bias, relu, want):
    x = np.array([[1, 1], [2, 0], [3, 0]], dtype=np.float32)  # W x = [[-5, 1], [1, 0]]
    plan = dense.encode(csr((2, 3), W23), dtype, bias=np.array([10, -3]))
    got = dense.spmm(plan, x, bias=bias, relu=relu)
    assert got.tolist() == want
    assert got.dtype == (np.float16 if dtype == "float16" else np.float32)


@pytest.mark.parametrize("dtype, want", [("float32", 1 + 2**-11), ("float16", 1.0), ("bfloat16", 1.0)])
def test_dense_spmm_rounds_x_and_y_to_the_dtype(dtype, want):
    one = csr((1, 1), {(0, 0): 1.0})
    plan = dense.encode(one, dtype, bias=np.array([2**-11], np.float32))
    assert float(dense.spmm(plan, np.array([[1 + 2**-11]], np.float32), bias=False, relu=False)[0, 0]) == want
    # Y = 1, then + 2^-11: rounded again after the bias
    assert float(dense.spmm(plan, np.ones((1, 1), np.float32), bias=True, relu=False)[0, 0]) == want


@pytest.mark.parametrize("k, want", [(0, 8), (1, 8), (8, 8), (9, 16), (17, 24)])
def test_split_row_length(k, want):
    assert dense.split_row_length(k) == want


@pytest.mark.parametrize("largest, s", [
    (1.0, 14), (2.0**14, 0), (32767.0, 0), (2.0**15, -1), (3.0, 13), (0.75, 15),
    (2.0**-112, 126), (2.0**-113, 126), (2.0**-111, 125),  # clamped at 126 ...
    (2.0**140, -126), (2.0**141, -126), (2.0**139, -125),  # ... and at -126
])
def test_scale_exponents_by_hand(largest, s):
    got = dense.scale_exponents(np.array([largest]), 99)
    assert got.dtype == np.int32 and got.tolist() == [s]


def test_scale_exponents_of_zero_is_the_empty_value():
    assert dense.scale_exponents(np.array([0.0, 1.0]), 7).tolist() == [7, 14]
    assert dense.scale_exponents(np.array([0.0]), 200).tolist() == [126]  # clamped too


def test_row_scale_exponents_by_hand():
    a = csr((3, 3), {(0, 0): 1.0, (0, 2): -3.0, (2, 1): 2.0**14})
    rows = np.array([0, 0, 2])
    assert dense.row_scale_exponents(a, rows).tolist() == [13, 0, 0]  # largest |-3| -> 2^13; row 1 empty


def test_encode_split_f16_pinned():
    a = csr((2, 3), {(0, 0): 1 + 2**-12, (0, 2): -3.0})
    plan = dense.encode_split_f16(a, bias=[1, 2])
    p = plan.arrays
    # row 0 scaled by 2^13: 8194 = fp16 8192 (0x7000) + 2 (0x4000); -24576 = 0xF600; rows padded to 8
    assert p["w_hi"].dtype == np.uint16 and p["w_hi"].tolist() == [[0x7000, 0, 0xF600, 0, 0, 0, 0, 0], [0] * 8]
    assert p["w_lo"].tolist() == [[0x4000, 0, 0, 0, 0, 0, 0, 0], [0] * 8]
    assert p["w_inv"].dtype == np.float32 and p["w_inv"].tolist() == [2.0**-13, 1.0]
    assert p["bias"].tolist() == [1, 2]
    assert plan.format == "dense_f16x3" and plan.constants == {"m": 2, "k": 3, "k_pad": 8, "dtype": "float32"}
    assert "bias" not in dense.encode_split_f16(a).arrays


def test_split_columns_f16_by_hand():
    x = np.array([[1.0, 0.0], [3.0, 0.0], [0.5, 0.0]], dtype=np.float32)
    hi, lo, inv = dense.split_columns_f16(x, 2)
    # slice 0 (rows 0-1): column 0's largest 3 -> 2^13; slice 1 (row 2, padded): 0.5 -> 2^15;
    # an all-zero column takes 2^126
    assert inv.shape == (2, 1, 2) and inv[:, 0, :].tolist() == [[2.0**-13, 2.0**-126], [2.0**-15, 2.0**-126]]
    assert hi.shape == (2, 2, 2) and hi[:, :, 0].tolist() == [[8192, 24576], [16384, 0]]
    assert lo.tolist() == np.zeros((2, 2, 2)).tolist()
    x2 = np.array([[1 + 2**-20]], dtype=np.float32)  # 2^14 (1 + 2^-20) = 16384 + 2^-6
    hi, lo, inv = dense.split_columns_f16(x2, 4)
    assert hi[0, 0, 0] == 16384 and lo[0, 0, 0] == 2**-6 and hi.shape == (1, 4, 1)


@pytest.mark.parametrize("bias, relu, want", [
    (False, False, -2 + 2**-12), (True, False, 1 + 2**-12), (True, True, 1 + 2**-12), (False, True, 0.0),
])
def test_spmm_split_f16_by_hand(bias, relu, want):
    a = csr((1, 3), {(0, 0): 1 + 2**-12, (0, 2): -3.0})
    plan = dense.encode_split_f16(a, bias=np.array([3.0]))
    y = dense.spmm_split_f16(plan, np.ones((3, 1), np.float32), slice_k=2, bias=bias, relu=relu)
    assert y.dtype == np.float32 and y.tolist() == [[want]]


def test_spmm_split_f16_keeps_22_bits():
    rng = np.random.default_rng(5)
    w = sp.random(6, 20, density=0.5, random_state=5, format="csr", dtype=np.float32)
    w.data = rng.standard_normal(w.nnz).astype(np.float32)
    x = rng.standard_normal((20, 3)).astype(np.float32)
    y = dense.spmm_split_f16(dense.encode_split_f16(w), x, slice_k=8, bias=False, relu=False)
    exact = w.toarray().astype(np.float64) @ x.astype(np.float64)
    scale = np.abs(w.toarray()).max(axis=1, keepdims=True) * np.abs(x).sum(axis=0, keepdims=True)
    assert np.all(np.abs(y - exact) <= 2.0**-19 * scale)


# ---- formats/ell_coo.py ----------------------------------------------------------------------------
# E (3 x 5): row 0 = {0: 1, 1: 2, 2: 3, 3: 4}, row 1 = {4: 5}, row 2 = {0: 6, 2: 7, 4: 8}
E3 = {(0, 0): 1.0, (0, 1): 2.0, (0, 2): 3.0, (0, 3): 4.0, (1, 4): 5.0, (2, 0): 6.0, (2, 2): 7.0, (2, 4): 8.0}


@pytest.mark.parametrize("p50, width", [(0.0, 1), (0.5, 1), (1.0, 1), (2.0, 2), (2.01, 3), (7.5, 8)])
def test_width_from_median(p50, width):
    assert ell_coo.width_from_median(p50) == width


@pytest.mark.parametrize("width, chunk", [(1, 32), (31, 32), (32, 32), (33, 33), (100, 100)])
def test_chunk_size(width, chunk):
    assert ell_coo.chunk_size(width) == chunk


@pytest.mark.parametrize("m, stride", [(0, 0), (1, 32), (32, 32), (33, 64)])
def test_ell_stride(m, stride):
    assert ell_coo.ell_stride(m) == stride


def test_ell_coo_encode_pinned():
    plan = ell_coo.encode(csr((3, 5), E3), "float16", 2, 2, bias=[1, 2, 3])
    p = plan.arrays
    cols = np.zeros((2, 32), np.int32)
    vals = np.zeros((2, 32), np.float16)
    cols[0, :3], vals[0, :3] = [0, 4, 0], [1, 5, 6]  # slot 0 of rows 0, 1, 2
    cols[1, :3], vals[1, :3] = [1, 0, 2], [2, 0, 7]  # slot 1 (row 1 has none: padding)
    assert p["ell_cols"].tolist() == cols.tolist() and p["ell_cols"].dtype == np.int32
    assert p["ell_vals"].tolist() == vals.tolist() and p["ell_vals"].dtype == np.float16
    assert p["row_len"].tolist() == [4, 1, 3] and p["row_len"].dtype == np.int32
    # the tail: row 0's columns 2, 3 (one chunk of 2), row 2's column 4 (a chunk of its own)
    assert p["tail_cols"].tolist() == [2, 3, 4] and p["tail_vals"].tolist() == [3, 4, 8]
    assert p["chunk_row"].tolist() == [0, 2] and p["chunk_ptr"].tolist() == [0, 2, 3]
    assert p["tail_rows"].tolist() == [0, 2] and p["bias"].tolist() == [1, 2, 3]
    for name in ("chunk_row", "chunk_ptr", "tail_rows", "tail_cols"):
        assert p[name].dtype == np.int32, name
    assert plan.constants == {"m": 3, "k": 5, "nnz": 8, "width": 2, "chunk": 2, "stride": 32, "ell_nnz": 5,
                              "tail_nnz": 3, "chunks": 2, "tail_count": 2}
    one = ell_coo.encode(csr((3, 5), E3), "float32", 2, 1)  # a chunk a tail entry
    assert one.arrays["chunk_row"].tolist() == [0, 0, 2] and one.arrays["chunk_ptr"].tolist() == [0, 1, 2, 3]
    assert "bias" not in one.arrays


def test_ell_coo_no_tail_at_the_longest_row():
    plan = ell_coo.encode(csr((3, 5), E3), "float32", 4, 32)
    assert plan.arrays["tail_rows"].tolist() == [] and plan.constants["chunks"] == 0
    assert plan.arrays["chunk_ptr"].tolist() == [0] and plan.constants["ell_nnz"] == 8


def test_describe_split_pinned():
    assert ell_coo.describe_split(ell_coo.encode(csr((3, 5), E3), "float32", 2, 2)) == \
        "ELL width 2 holds 62 % of 8 nonzeros; 2 rows spill 3 to 2 COO chunks of <= 2"
    empty = ell_coo.encode(sp.csr_matrix((2, 3), dtype=np.float32), "float32", 1, 32)
    assert ell_coo.describe_split(empty).startswith("ELL width 1 holds 100 % of 0 nonzeros; 0 rows")


X5 = np.array([[1, 0], [1, 0], [1, 0], [1, 0], [1, -1]], dtype=np.float32)  # E X5 = [[10, 0], [5, -5], [21, -8]]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize("bias, relu, want", [
    (None, False, [[10, 0], [5, -5], [21, -8]]),
    (None, True, [[10, 0], [5, 0], [21, 0]]),
    # row 0: ELL part 3 - 4 = -1 before its tail adds 7: ReLU waits for the tail (6, not 7)
    ([-4, 1, -30], True, [[6, 0], [6, 0], [0, 0]]),
    ([-4, 1, -30], False, [[6, -4], [6, -4], [-9, -38]]),
])
def test_ell_coo_spmm_by_hand(dtype, chunk, bias, relu, want):
    plan = ell_coo.encode(csr((3, 5), E3), dtype, 2, chunk, bias=bias)
    got = ell_coo.spmm(plan, X5.astype(dtype), relu=relu)
    assert got.dtype == np.dtype(dtype) and got.tolist() == want
    if not relu:
        assert ell_coo.spmm(plan, X5.astype(dtype)).tolist() == want  # no ReLU unless asked


def test_ell_coo_relu_turns_nan_into_zero_as_fmaxf_does():
    x = np.array([[1], [1], [1], [1], [np.nan]], dtype=np.float32)  # row 1 reads only column 4
    got = ell_coo.spmm(ell_coo.encode(csr((3, 5), E3), "float32", 2, 2), x, relu=True)
    # row 1's ReLU clears its NaN at once; row 2's tail adds the NaN and the last ReLU clears it
    assert got.tolist() == [[10], [0], [0]]


def test_add_once_rounds_the_partial_to_half_then_adds():
    y = np.array([2048.0], dtype=np.float16)  # fp16 spacing at 2048 is 2
    ell_coo.add_once(y, np.array([0]), np.array([1.5], np.float32))  # 1.5 -> 1.5; 2049.5 -> 2050
    assert y.tolist() == [2050.0]
    y32 = np.array([1.0, 2.0], dtype=np.float32)
    ell_coo.add_once(y32, np.array([1]), np.array([0.25], np.float32))
    assert y32.tolist() == [1.0, 2.25]


# ---- formats/panel.py ------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, stride", [(1, 4), (3, 4), (4, 8), (7, 8), (8, 12)])
def test_panel_record_stride(rows, stride):
    assert panel.record_stride(rows) == stride


PANEL_ROWOFF = [[[0, 1, 1, 1], [1, 2, 3, 3]], [[3, 3, 5, 5], [5, 5, 6, 6]]]


def test_panel_encode_float32_pinned():
    plan = panel.encode(csr((4, 6), A4), "float32", rows=2, kc=4, tile_n=8, bias=[1, 2, 3, 4])
    p = plan.arrays
    # segments (panel, chunk): (0, 0) = row 0's column 1; (0, 1) = row 0's 4, row 1's 4;
    # (1, 0) = row 3's 0, 1; (1, 1) = row 3's 5. Records: row starts, then the end twice (stride 4)
    assert p["rowoff"].dtype == np.int32 and p["rowoff"].tolist() == PANEL_ROWOFF
    # (column mod 4) x 8, and the value's float32 bits
    assert p["pairs"].dtype == np.int32
    assert p["pairs"].tolist() == [[8, 0x3F800000], [0, 0x40000000], [0, 0x40400000], [0, 0x40800000],
                                   [8, 0x40A00000], [8, 0x40C00000]]
    assert p["bias"].tolist() == [1, 2, 3, 4]
    assert plan.constants == {"m": 4, "k": 6, "nnz": 6, "rows": 2, "kc": 4, "tile_n": 8, "panels": 2, "chunks": 2,
                              "max_segment": 2, "dtype": "float32"}


def test_panel_encode_float16_pinned():
    plan = panel.encode(csr((4, 6), A4), "float16", rows=2, kc=4, tile_n=8)
    assert plan.arrays["rowoff"].tolist() == PANEL_ROWOFF and "bias" not in plan.arrays
    assert plan.arrays["pairs"].dtype == np.uint32
    assert plan.arrays["pairs"].tolist() == [0x3C000008, 0x40000000, 0x42000000, 0x44000000, 0x45000008, 0x46000008]


def test_panel_segments_sorted_by_column_inside_a_row():
    a = csr((1, 8), {(0, 6): 1.0, (0, 1): 2.0, (0, 5): 3.0, (0, 2): 4.0})
    plan = panel.encode(a, "float32", rows=1, kc=4, tile_n=1)
    assert plan.arrays["pairs"][:, 0].tolist() == [1, 2, 1, 2]  # chunk 0: 1, 2; chunk 1: 5, 6
    assert plan.arrays["rowoff"].tolist() == [[[0, 2, 2, 2], [2, 4, 4, 4]]]
    assert plan.constants["max_segment"] == 2


def test_panel_fp16_offsets_limit_on_both_sides():
    one = csr((1, 2), {(0, 1): 1.0})
    assert panel.encode(one, "float16", rows=1, kc=65535, tile_n=1).arrays["pairs"].tolist() == [0x3C000001]
    with pytest.raises(OverflowError, match="16-bit"):
        panel.encode(one, "float16", rows=1, kc=4096, tile_n=16)
    assert panel.encode(one, "float32", rows=1, kc=4096, tile_n=16).arrays["pairs"].tolist() == [[16, 0x3F800000]]


def test_panel_empty_matrix_keeps_one_pair():
    plan = panel.encode(sp.csr_matrix((0, 0), dtype=np.float32), "float32", rows=4, kc=8, tile_n=4)
    assert plan.arrays["pairs"].shape == (1, 2) and plan.arrays["rowoff"].shape == (1, 1, 8)
    assert (plan.constants["panels"], plan.constants["chunks"], plan.constants["max_segment"]) == (1, 1, 0)
    half = panel.encode(sp.csr_matrix((3, 5), dtype=np.float32), "float16", rows=4, kc=8, tile_n=4)
    assert half.arrays["pairs"].tolist() == [0] and half.arrays["rowoff"].tolist() == [[[0] * 8]]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_panel_decode_gives_back_the_matrix(dtype):
    plan = panel.encode(csr((4, 6), A4), dtype, rows=2, kc=4, tile_n=8, bias=[1, 2, 3, 4])
    back = panel.decode(plan)
    assert back.format == "csr" and back.constants == {"m": 4, "k": 6, "nnz": 6}
    assert back.arrays["indptr"].tolist() == [0, 2, 3, 3, 6]
    assert back.arrays["indices"].tolist() == [1, 4, 4, 0, 1, 5]
    assert back.arrays["values"].tolist() == [1, 2, 3, 4, 5, 6] and back.arrays["values"].dtype == np.dtype(dtype)
    assert back.arrays["bias"].tolist() == [1, 2, 3, 4]
    assert "bias" not in panel.decode(panel.encode(csr((4, 6), A4), dtype, rows=3, kc=5, tile_n=2)).arrays


# ---- formats/sampled_tiles.py ----------------------------------------------------------------------
# P (3 x 70): (0, 0), (0, 65), (1, 63), (2, 64), (2, 69) at CSR positions 0-4: two 64-column tiles
P3 = {(0, 0): 1.0, (0, 65): 1.0, (1, 63): 1.0, (2, 64): 1.0, (2, 69): 1.0}


def test_sampled_tiles_encode_pinned():
    plan = sampled_tiles.encode(csr((3, 70), P3), tile_m=4)
    p = plan.arrays
    assert p["tiles"].dtype == np.int32 and p["tiles"].tolist() == [[0, 0], [0, 1]]
    assert p["masks"].dtype == np.uint64
    assert p["masks"].tolist() == [[1, 1 << 63, 0, 0], [1 << 1, 0, 1 << 0 | 1 << 5, 0]]
    assert p["bases"].dtype == np.int32 and p["bases"].tolist() == [[0, 2, 0, 0], [1, 0, 3, 0]]
    assert plan.constants == {"m": 3, "n": 70, "k": 70, "nnz": 5, "tiles": 2, "tile_m": 4}


def test_sampled_tiles_one_row_tiles():
    plan = sampled_tiles.encode(csr((3, 70), P3), tile_m=1)
    assert plan.arrays["tiles"].tolist() == [[0, 0], [0, 1], [1, 0], [2, 1]]
    assert plan.arrays["masks"].tolist() == [[1], [2], [1 << 63], [33]]
    assert plan.arrays["bases"].tolist() == [[0], [1], [2], [3]]


def test_sampled_tiles_rejects_empty_tiles_and_handles_no_entries():
    with pytest.raises(ValueError, match="positive"):
        sampled_tiles.encode(csr((3, 70), P3), tile_m=0)
    plan = sampled_tiles.encode(sp.csr_matrix((5, 10), dtype=np.float32), tile_m=2)
    assert plan.arrays["tiles"].shape == (0, 2) and plan.constants["tiles"] == 0
    pos, rows, cols = sampled_tiles.gather(plan)
    assert pos.size == rows.size == cols.size == 0


@pytest.mark.parametrize("tile_m", [1, 2, 4])
def test_sampled_tiles_emulator_by_hand(tile_m, monkeypatch):
    monkeypatch.setattr(sampled_tiles, "GATHER_CHUNK", 64)  # one tile row of 64 bits a step
    plan = sampled_tiles.encode(csr((3, 70), P3), tile_m=tile_m)
    pos, rows, cols = sampled_tiles.gather(plan)
    assert sorted(zip(pos.tolist(), rows.tolist(), cols.tolist())) == \
        [(0, 0, 0), (1, 0, 65), (2, 1, 63), (3, 2, 64), (4, 2, 69)]
    a = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    b = np.array([[j, 1] for j in range(70)], dtype=np.float32)  # A[r] . B[c] = A[r, 0] c + A[r, 1]
    got = sampled_tiles.sddmm(plan, a, b)
    assert got.dtype == np.float32 and got.tolist() == [2, 67, 193, 326, 351]


def test_sampled_tiles_output_positions_limit_on_both_sides(monkeypatch):
    monkeypatch.setattr(sampled_tiles, "INT32_MAX", 5)  # the limit, scaled down to P3's 5 entries
    assert sampled_tiles.encode(csr((3, 70), P3), tile_m=4).constants["nnz"] == 5
    monkeypatch.setattr(sampled_tiles, "INT32_MAX", 4)
    with pytest.raises(OverflowError, match="32 bits"):
        sampled_tiles.encode(csr((3, 70), P3), tile_m=4)


@pytest.mark.parametrize("tile_m, chunk, steps", [
    (1, 128, [2, 2]),  # 4 one-row tiles, 2 x 64 bits a step
    (1, 64, [1, 1, 1, 1]),
    (4, 64, [1, 1]),  # a tile larger than the chunk: one tile a step
    (1, 1 << 24, [4]),
])
def test_sampled_tiles_gather_expands_at_most_a_chunk_of_bits_a_step(monkeypatch, tile_m, chunk, steps):
    plan = sampled_tiles.encode(csr((3, 70), P3), tile_m=tile_m)
    monkeypatch.setattr(sampled_tiles, "GATHER_CHUNK", chunk)
    calls = []
    nonzero = np.nonzero

    def counting(bits):
        calls.append(bits.shape[0])  # the tiles expanded in this step
        return nonzero(bits)
    monkeypatch.setattr(np, "nonzero", counting)
    pos, rows, cols = sampled_tiles.gather(plan)
    monkeypatch.undo()
    assert calls == steps
    assert sorted(pos.tolist()) == [0, 1, 2, 3, 4]
