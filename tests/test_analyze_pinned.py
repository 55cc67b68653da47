"""sparsegen.analyze pinned: hash digests from hand-built byte streams, the exact limits of the
index widths and of the tile-counting paths, immutability, and the edge tiles' own areas."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import struct

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.analyze import Footprint, LengthStats, MatrixStats, TileStats, analyze, structure_hash, values_hash
from sparsegen.errors import FormatError

an = importlib.import_module("sparsegen.analyze")

# 2 x 3: (0, 2) = 1.5, (1, 0) = -2: indptr [0, 1, 2], indices [2, 0]
M23 = sp.csr_matrix((np.array([1.5, -2.0], np.float32), np.array([2, 0]), np.array([0, 1, 2])), shape=(2, 3))
STRUCTURE_M23 = "ad2b3d3e4b89230d5e68b2a19004ebdad05982425e6349ae7782fc87126efb09"
VALUES_M23 = "cd9e2873ab7513d2db9db1d99a5b74cb24d85b9cfdd0e378e05bd92e018f4aec"


def sha(*parts: bytes) -> str:
    return hashlib.sha256(b"".join(parts)).hexdigest()


def test_structure_hash_is_the_documented_byte_stream():
    stream = (b"sparsegen.structure.v1 shape=2,3 indptr=<i8 indices=<i4\n"
              + struct.pack("<3q", 0, 1, 2) + struct.pack("<2i", 2, 0))
    assert structure_hash(M23) == sha(stream) == STRUCTURE_M23
    assert analyze(M23).structure_hash == STRUCTURE_M23


def test_values_hash_is_the_documented_byte_stream():
    assert values_hash(M23) == sha(b"sparsegen.values.v1 dtype=<f4\n", struct.pack("<2f", 1.5, -2.0)) == VALUES_M23
    assert values_hash(M23.astype(np.float64)) == sha(b"sparsegen.values.v1 dtype=<f8\n",
                                                      struct.pack("<2d", 1.5, -2.0))
    big = M23.copy()
    big.data = M23.data.astype(">f4")  # stored big-endian, hashed little-endian
    assert values_hash(big) == VALUES_M23
    assert analyze(M23).values_hash == VALUES_M23


def test_structure_hash_reads_the_indices():
    moved = sp.csr_matrix((M23.data, np.array([1, 0]), M23.indptr), shape=(2, 3))  # same indptr, other columns
    assert structure_hash(moved) == sha(b"sparsegen.structure.v1 shape=2,3 indptr=<i8 indices=<i4\n",
                                        struct.pack("<3q", 0, 1, 2), struct.pack("<2i", 1, 0))


@pytest.mark.parametrize("n, width", [(2**31, b"<i4"), (2**31 + 1, b"<i8")])
def test_structure_hash_index_width_changes_past_2_to_the_31_columns(n, width):
    a = sp.csr_matrix((1, n), dtype=np.float32)
    head = f"sparsegen.structure.v1 shape=1,{n} indptr=<i8 indices=".encode() + width + b"\n"
    assert structure_hash(a) == sha(head, struct.pack("<2q", 0, 0))


def test_empty_values_hash():
    assert values_hash(sp.csr_matrix((3, 2), dtype=np.float32)) == sha(b"sparsegen.values.v1 dtype=<f4\n")


@pytest.mark.parametrize("cls, args", [
    (LengthStats, (0, 0, 0.0, 0.0, 0.0, 0)), (Footprint, (32, 0.0, 0)),
    (TileStats, (128, 64, 0, 0, 0, 0.0, 0.0, (0,) * 10)),
])
def test_value_types_are_frozen(cls, args):
    v = cls(*args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(v, dataclasses.fields(cls)[0].name, 1)
    assert hash(v) == hash(cls(*args))


def test_stats_are_frozen():
    s = analyze(M23)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.nnz = 3
    assert isinstance(s, MatrixStats)


def test_footprint_for_an_unanalysed_block_size_is_a_key_error():
    s = analyze(M23)
    assert s.footprint_for(64) == Footprint(64, 2.0, 2)
    with pytest.raises(KeyError):
        s.footprint_for(48)


def test_one_dimensional_csr_is_rejected():
    with pytest.raises(FormatError, match="2-D"):
        analyze(sp.csr_array(np.array([1.0, 0.0, 2.0])))


@pytest.mark.parametrize("tiles, nnz, fits", [
    (2**20, 0, True), (2**20 + 1, 0, False), (2**20 + 1, 2**19 + 1, True),
    (3 * 2**20, 3 * 2**19, True), (3 * 2**20 + 1, 3 * 2**19, False),
])
def test_tile_counts_use_bincount_while_it_stays_within_twice_nnz_or_a_million_slots(tiles, nnz, fits):
    assert an._bincount_fits(tiles, nnz) is fits


def test_a_one_by_one_edge_tile_uses_its_own_area():
    # 129 x 65: tile (1, 1) is the single element (128, 64); a nonzero there makes it fully dense
    a = sp.csr_matrix((np.ones(2, np.float32), ([0, 128], [0, 64])), shape=(129, 65))
    t = analyze(a).tiles
    assert (t.tiles, t.nonempty, t.max_nnz) == (4, 2, 1)
    assert t.density_hist == (3, 0, 0, 0, 0, 0, 0, 0, 0, 1)  # 1/8192 in bin 0 with the 2 empty tiles
    assert t.density_means == (1 / 8192, 0, 0, 0, 0, 0, 0, 0, 0, 1.0)
    assert t.dense_share == 0.25


def test_slice_widths_and_padding_by_hand():
    lengths = np.array([3, 0, 1, 7, 2])
    assert an.slice_widths(lengths, 2).tolist() == [3, 7, 2]
    assert an.ell_padding(lengths, 2) == (2 * 3 + 2 * 7 + 1 * 2) / 13
    assert an.slice_widths(np.zeros(0, np.int64), 32).size == 0
    assert an.ell_padding(np.zeros(4, np.int64)) == 1.0


def test_index_bits_by_hand():
    assert [an.index_bits(s) for s in ((1, 1), (65536, 65536), (65537, 2), (2, 2**32), (2**32 + 1, 1))] == \
        [16, 16, 32, 32, 64]


def test_length_stats_of_counts_by_hand():
    # lengths 3, 1, 0, 0: mean 1, variance ((3-1)**2 + 0 + 1 + 1) / 4 = 1.5
    s = LengthStats.of_counts(np.array([3, 1]), 4)
    assert (s.min, s.max, s.mean, s.empty) == (0, 3, 1.0, 2)
    assert s.std == pytest.approx(1.5 ** 0.5, rel=1e-15) and s.cov == pytest.approx(1.5 ** 0.5, rel=1e-15)
    # lengths 3, 1: no empty one, so the smallest count is the minimum
    s = LengthStats.of_counts(np.array([3, 1]), 2)
    assert (s.min, s.max, s.mean, s.std, s.cov, s.empty) == (1, 3, 2.0, 1.0, 0.5, 0)
    s = LengthStats.of_counts(np.array([2]), 1)
    assert (s.min, s.max, s.mean, s.std, s.cov, s.empty) == (2, 2, 2.0, 0.0, 0.0, 0)
    s = LengthStats.of_counts(np.array([], np.int64), 5)  # five empty lengths: no division by a zero mean
    assert (s.min, s.max, s.mean, s.std, s.cov, s.empty) == (0, 0, 0.0, 0.0, 0.0, 5)
    assert LengthStats.of_counts(np.array([], np.int64), 0) == LengthStats(0, 0, 0.0, 0.0, 0.0, 0)


def test_per_column_arrays_while_columns_stay_within_twice_nnz_or_a_million():
    def csr(n, nnz):
        return sp.csr_matrix((np.ones(nnz), np.arange(nnz), np.array([0, nnz])), shape=(1, n))
    assert an._by_columns(csr(2**20, 1)) is True
    assert an._by_columns(csr(2**20 + 1, 1)) is False
    assert an._by_columns(csr(3 * 2**20, 3 * 2**19)) is True
    assert an._by_columns(csr(3 * 2**20 + 1, 3 * 2**19)) is False


def test_column_stats_agree_on_both_paths(monkeypatch):
    # columns 0..5, nonzeros in columns 1, 1, 4 (rows 0, 1, 1): lengths 0, 2, 0, 0, 1, 0
    a = sp.csr_matrix((np.ones(3), np.array([1, 1, 4]), np.array([0, 1, 3])), shape=(2, 6))
    a.has_canonical_format = True
    expected = LengthStats.of(np.array([0, 2, 0, 0, 1, 0]))
    assert (expected.min, expected.max, expected.mean, expected.empty) == (0, 2, 0.5, 4)
    assert analyze(a).col_lengths == expected
    monkeypatch.setattr(an, "_MIN_BINCOUNT_TILES", 0)  # 6 columns = 2 * nnz: still per column
    assert an._by_columns(a)
    b = sp.csr_matrix((np.ones(3), np.array([1, 1, 6]), np.array([0, 1, 3])), shape=(2, 7))
    assert not an._by_columns(b)  # 7 > 2 * 3: the sort path
    s = analyze(b).col_lengths
    assert (s.min, s.max, s.mean, s.empty) == (0, 2, 3 / 7, 5)
