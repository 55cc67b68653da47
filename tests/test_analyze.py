"""Tests of sparsegen.analyze: hand-computed values, brute-force properties, hashes, real data."""
from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsegen.analyze import (LengthStats, MatrixStats, TileStats, analyze,
                               footprints, row_lengths, structure_hash, values_hash)
from sparsegen.errors import FormatError

# sparsegen/__init__.py re-exports the analyze() function under the submodule's name.
an = importlib.import_module("sparsegen.analyze")


def csr_from_dense(dense, dtype=np.float32) -> sp.csr_matrix:
    return sp.csr_matrix(np.asarray(dense, dtype=dtype))


def csr_from_coords(shape, coords, dtype=np.float32) -> sp.csr_matrix:
    """Canonical CSR with value 1 at each distinct (row, col) in coords."""
    coords = sorted(set(coords))
    r = np.array([rc[0] for rc in coords], dtype=np.int64)
    c = np.array([rc[1] for rc in coords], dtype=np.int64)
    a = sp.csr_matrix((np.ones(len(coords), dtype=dtype), (r, c)), shape=shape)
    a.sum_duplicates()
    return a


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Brute-force references: loops on purpose, written independently of the module.


def ref_rows(a):
    """List of sorted column lists per row, from the matrix's stored entries."""
    return [list(a.indices[a.indptr[i]:a.indptr[i + 1]]) for i in range(a.shape[0])]


def ref_length_stats(lengths):
    if not lengths:
        return dict(min=0, max=0, mean=0.0, std=0.0, cov=0.0, empty=0)
    mean = sum(lengths) / len(lengths)
    std = math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths))
    return dict(min=min(lengths), max=max(lengths), mean=mean, std=std,
                cov=std / mean if mean else 0.0, empty=sum(1 for x in lengths if x == 0))


def ref_percentile(values, p):
    v = sorted(values)
    if not v:
        return 0.0
    pos = p / 100 * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def ref_footprints(a, b):
    rows = ref_rows(a)
    out = []
    for start in range(0, a.shape[0], b):
        cols = set()
        for i in range(start, min(start + b, a.shape[0])):
            cols.update(rows[i])
        out.append(len(cols))
    return out


def ref_ell_padding(a, s=32):
    rows = ref_rows(a)
    nnz = sum(len(r) for r in rows)
    if nnz == 0:
        return 1.0
    stored = 0
    for start in range(0, len(rows), s):
        chunk = rows[start:start + s]
        stored += len(chunk) * max(len(r) for r in chunk)
    return stored / nnz


def ref_tiles(a, th=128, tw=64):
    m, n = a.shape
    ntr, ntc = -(-m // th), -(-n // tw)
    counts = {}
    for i, cols in enumerate(ref_rows(a)):
        for j in cols:
            key = (i // th, j // tw)
            counts[key] = counts.get(key, 0) + 1
    hist = [0] * 10
    sums, nonempty = [0.0] * 10, [0] * 10
    dense = 0
    for tr in range(ntr):
        for tc in range(ntc):
            area = min(th, m - tr * th) * min(tw, n - tc * tw)
            k = counts.get((tr, tc), 0)
            dens = k / area
            b = min(int(dens * 10 + 1e-9), 9)
            hist[b] += 1
            if k:
                sums[b] += dens
                nonempty[b] += 1
            dense += k > area / 2
    tiles = ntr * ntc
    return dict(tile_rows=th, tile_cols=tw, tiles=tiles, nonempty=len(counts),
                max_nnz=max(counts.values(), default=0),
                mean_nnz=a.nnz / tiles if tiles else 0.0,
                dense_share=dense / tiles if tiles else 0.0, density_hist=hist,
                density_means=[s / c if c else 0.0 for s, c in zip(sums, nonempty)])


def assert_length_stats(got: LengthStats, want: dict):
    assert got.min == want["min"] and got.max == want["max"] and got.empty == want["empty"]
    assert got.mean == approx(want["mean"])
    assert got.std == approx(want["std"])
    assert got.cov == approx(want["cov"])


def bare(t: TileStats) -> TileStats:
    """The tile stats without their per-bin means (compared apart)."""
    import dataclasses

    return dataclasses.replace(t, density_means=())


def assert_tiles(got: TileStats, want: dict):
    d = got.to_dict()
    for k in ("tile_rows", "tile_cols", "tiles", "nonempty", "max_nnz", "density_hist"):
        assert d[k] == want[k], k
    assert d["density_means"] == pytest.approx(want["density_means"])
    assert got.mean_nnz == approx(want["mean_nnz"])
    assert got.dense_share == approx(want["dense_share"])


def footprint_table(s: MatrixStats):
    return {f.block_rows: (f.mean, f.max) for f in s.footprint}


# ---------------------------------------------------------------------------------------------
# Hand-computed examples


def test_six_by_eight_every_field():
    dense = np.zeros((6, 8))
    dense[0, [0, 1, 2]] = 1      # 3
    dense[2, 7] = 2              # 1   (row 1 empty)
    dense[3, [0, 2, 4, 6]] = 3   # 4
    dense[4, [1, 3]] = 4         # 2
    dense[5, :] = 5              # 8
    a = csr_from_dense(dense)
    s = analyze(a)

    assert s.shape == (6, 8) and s.nnz == 18
    assert s.density == approx(18 / 48)
    assert s.dtype == "float32" and s.index_bits == 16
    # rows [3, 0, 1, 4, 2, 8]: mean 3, squared deviations sum 40
    assert row_lengths(a).tolist() == [3, 0, 1, 4, 2, 8]
    assert_length_stats(s.row_lengths, dict(min=0, max=8, mean=3.0, std=math.sqrt(40 / 6),
                                            cov=math.sqrt(40 / 6) / 3, empty=1))
    # cols [3, 3, 3, 2, 2, 1, 2, 2]: mean 2.25, squared deviations sum 3.5
    assert_length_stats(s.col_lengths, dict(min=1, max=3, mean=2.25, std=math.sqrt(3.5 / 8),
                                            cov=math.sqrt(3.5 / 8) / 2.25, empty=0))
    # sorted [0, 1, 2, 3, 4, 8]: positions 2.5, 4.5, 4.95
    assert s.row_length_percentiles == {"p50": approx(2.5), "p90": approx(6.0), "p99": approx(7.8)}
    # one block of every size, touching all 8 columns
    assert footprint_table(s) == {32: (8.0, 8), 64: (8.0, 8), 128: (8.0, 8), 256: (8.0, 8)}
    assert footprints(a, 4).tolist() == [6, 8]   # rows 0-3 miss cols 3, 5; row 5 is full
    # one slice of 6 rows, width 8
    assert s.ell_padding == approx(48 / 18)
    # one 6x8 edge tile holding 18 of 48: density .375 -> bin 3, not dense
    assert s.tiles == TileStats(128, 64, 1, 1, 18, 18.0, 0.0, (0, 0, 0, 1, 0, 0, 0, 0, 0, 0),
                                (0.0, 0.0, 0.0, 18 / 48, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))  # the 6 x 8 edge tile's own area
    # the hashes of the documented byte streams (header, indptr as <i8, indices as <i4; data as <f4)
    indptr, indices = [0, 3, 3, 4, 8, 10, 18], [0, 1, 2, 7, 0, 2, 4, 6, 1, 3, *range(8)]
    assert s.structure_hash == hashlib.sha256(
        b"sparsegen.structure.v1 shape=6,8 indptr=<i8 indices=<i4\n" + struct.pack("<7q", *indptr)
        + struct.pack("<18i", *indices)).hexdigest()
    assert s.values_hash == hashlib.sha256(
        b"sparsegen.values.v1 dtype=<f4\n" + struct.pack("<18f", 1, 1, 1, 2, 3, 3, 3, 3, 4, 4, *[5] * 8)).hexdigest()


def test_empty_rows_every_field():
    a = csr_from_coords((70, 10), [(0, 1), (0, 2), (65, 2), (65, 3), (65, 9)])
    s = analyze(a)
    assert s.shape == (70, 10) and s.nnz == 5 and s.density == approx(5 / 700)
    # 68 empty rows, one of 2, one of 3: E[x] = 5/70, E[x^2] = 13/70
    std = math.sqrt(13 / 70 - (5 / 70) ** 2)
    assert_length_stats(s.row_lengths, dict(min=0, max=3, mean=5 / 70, std=std,
                                            cov=std / (5 / 70), empty=68))
    # cols [0, 1, 2, 1, 0, 0, 0, 0, 0, 1]: E[x] = .5, E[x^2] = .7
    assert_length_stats(s.col_lengths, dict(min=0, max=2, mean=0.5, std=math.sqrt(0.45),
                                            cov=math.sqrt(0.45) / 0.5, empty=6))
    # sorted: 68 zeros, 2, 3; p99 position 68.31 -> 2.31
    assert s.row_length_percentiles == {"p50": 0.0, "p90": 0.0, "p99": approx(2.31)}
    # 32-row blocks: {1,2}, {}, {2,3,9} -> [2, 0, 3]; 64: [2, 3]; 128/256: {1,2,3,9}
    assert footprints(a, 32).tolist() == [2, 0, 3]
    assert footprints(a, 64).tolist() == [2, 3]
    assert footprint_table(s) == {32: (approx(5 / 3), 3), 64: (2.5, 3), 128: (4.0, 4),
                                  256: (4.0, 4)}
    # slices: 32 rows x 2, 32 rows x 0, 6 rows x 3 -> 82 / 5
    assert s.ell_padding == approx(82 / 5)
    assert bare(s.tiles) == TileStats(128, 64, 1, 1, 5, 5.0, 0.0, (1,) + (0,) * 9)
    assert s.index_bits == 16 and s.dtype == "float32"


def test_single_row_every_field():
    a = csr_from_dense([[7, 0, 0, 0, 9]], dtype=np.float64)
    s = analyze(a)
    assert s.shape == (1, 5) and s.nnz == 2 and s.density == approx(0.4)
    assert s.row_lengths == LengthStats(2, 2, 2.0, 0.0, 0.0, 0)
    assert s.col_lengths == LengthStats(0, 1, 0.4, approx(math.sqrt(0.24)),
                                        approx(math.sqrt(0.24) / 0.4), 3)
    assert s.row_length_percentiles == {"p50": 2.0, "p90": 2.0, "p99": 2.0}
    assert footprint_table(s) == {b: (2.0, 2) for b in (32, 64, 128, 256)}
    assert s.ell_padding == 1.0
    # 2 of 5: density .4 -> bin 4; 2 > 2.5 is false
    assert s.tiles == TileStats(128, 64, 1, 1, 2, 2.0, 0.0, (0, 0, 0, 0, 1, 0, 0, 0, 0, 0),
                                (0.0, 0.0, 0.0, 0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0))
    assert s.dtype == "float64" and s.index_bits == 16


def test_zero_nnz_every_field():
    a = sp.csr_matrix((3, 4), dtype=np.float32)
    s = analyze(a)
    assert s.shape == (3, 4) and s.nnz == 0 and s.density == 0.0
    assert s.row_lengths == LengthStats(0, 0, 0.0, 0.0, 0.0, 3)
    assert s.col_lengths == LengthStats(0, 0, 0.0, 0.0, 0.0, 4)
    assert s.row_length_percentiles == {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    assert footprint_table(s) == {b: (0.0, 0) for b in (32, 64, 128, 256)}
    assert s.ell_padding == 1.0
    assert s.tiles == TileStats(128, 64, 1, 0, 0, 0.0, 0.0, (1,) + (0,) * 9, (0.0,) * 10)  # no nonempty tile
    assert s.index_bits == 16 and s.dtype == "float32"
    assert s.structure_hash != analyze(sp.csr_matrix((4, 3), dtype=np.float32)).structure_hash


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (5, 0)])
def test_degenerate_shapes(shape):
    s = analyze(sp.csr_matrix(shape, dtype=np.float32))
    m, n = shape
    assert s.nnz == 0 and s.density == 0.0 and s.ell_padding == 1.0
    assert s.row_lengths == LengthStats(0, 0, 0.0, 0.0, 0.0, m)
    assert s.col_lengths == LengthStats(0, 0, 0.0, 0.0, 0.0, n)
    assert s.tiles.tiles == 0 and s.tiles.mean_nnz == 0.0 and s.tiles.dense_share == 0.0
    assert s.tiles.density_hist == (0,) * 10
    assert footprint_table(s) == {b: (0.0, 0) for b in (32, 64, 128, 256)}
    assert s.row_length_percentiles == {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    json.dumps(s.to_dict())


def test_300_rows_footprints_short_last_block():
    # row i touches column i % 7 (shared by all rows) and column 500 + i (its own), so a block of
    # k rows touches min(k, 7) + k distinct columns.
    m = 300
    a = csr_from_coords((m, 1000), [(i, i % 7) for i in range(m)] + [(i, 500 + i) for i in range(m)])
    s = analyze(a)
    assert footprints(a, 256).tolist() == [263, 51]          # 256 rows, then 44
    assert footprints(a, 128).tolist() == [135, 135, 51]
    assert footprints(a, 64).tolist() == [71] * 4 + [51]
    assert footprints(a, 32).tolist() == [39] * 9 + [19]      # 9 * 32 = 288, then 12
    assert footprint_table(s) == {32: (approx((39 * 9 + 19) / 10), 39), 64: (approx(335 / 5), 71),
                                  128: (approx(321 / 3), 135), 256: (157.0, 263)}
    assert s.row_lengths == LengthStats(2, 2, 2.0, 0.0, 0.0, 0)
    assert s.row_length_percentiles == {"p50": 2.0, "p90": 2.0, "p99": 2.0}
    assert s.ell_padding == 1.0
    # tile rows of 128, 128, 44 rows; 16 tile cols (last one 40 wide): 48 tiles.
    # Tile col 0 holds 128, 128, 44; cols 500..799 fall in tile cols 7..12:
    # rows 0-127 -> 500..627: 12 + 64 + 52; rows 128-255 -> 628..755: 12 + 64 + 52;
    # rows 256-299 -> 756..799: 12 + 32.  11 nonempty tiles, all under 10 % dense.
    assert bare(s.tiles) == TileStats(128, 64, 48, 11, 128, 12.5, 0.0, (48,) + (0,) * 9)
    assert s.nnz == 600 and s.density == approx(600 / 300_000)


@pytest.mark.parametrize("edge_nnz, dense_tiles, edge_bin", [(7, 2, 5), (6, 1, 5), (12, 2, 9)])
def test_tiles_full_tile_and_edge_tile(edge_nnz, dense_tiles, edge_bin):
    # 130 x 70: tile rows of 128 and 2, tile cols of 64 and 6; tile (0, 0) fully dense (8192),
    # tile (0, 1) one nonzero of 768, tile (1, 0) empty, edge tile (1, 1) edge_nnz of 12.
    dense = np.zeros((130, 70))
    dense[:128, :64] = 1
    dense[5, 66] = 1
    dense[128:, 64:].flat[:edge_nnz] = 1
    s = analyze(csr_from_dense(dense))
    hist = [0] * 10
    hist[0] += 2
    hist[9] += 1
    hist[edge_bin] += 1
    means = [0.0] * 10
    means[0] = 1 / 768  # tile (0, 1) alone: the empty tile (1, 0) is counted in bin 0, not averaged
    means[edge_bin] = edge_nnz / 12
    means[9] = (1.0 + (edge_nnz / 12 if edge_bin == 9 else 1.0)) / 2
    want = TileStats(128, 64, 4, 3, 8192, (8192 + 1 + edge_nnz) / 4, dense_tiles / 4, tuple(hist))
    assert bare(s.tiles) == want and s.tiles.density_means == pytest.approx(means)
    assert s.nnz == 8193 + edge_nnz


def test_tiles_huge_sparse_shape_uses_sparse_counting():
    # 10^6 x 10^6 has ~1.2e8 tiles: counted from the 4 nonempty keys only.
    n = 1_000_000
    a = csr_from_coords((n, n), [(0, 0), (0, 63), (999_999, 999_999), (500_000, 64)])
    s = analyze(a)
    assert s.tiles.tiles == 7813 * 15625
    assert s.tiles.nonempty == 3 and s.tiles.max_nnz == 2
    assert s.tiles.density_hist[0] == s.tiles.tiles
    # edge tile at (7812, 15624) is 64 x 64 (10^6 = 7812*128 + 64 = 15624*64 + 64)
    assert s.index_bits == 32
    assert footprint_table(s)[256] == (approx(4 / 3907), 2)


def test_tile_counting_paths_agree(monkeypatch):
    a = sp.random(500, 700, density=0.03, format="csr", random_state=3, dtype=np.float32)
    via_bincount = analyze(a).tiles
    monkeypatch.setattr(an, "_bincount_fits", lambda tiles, nnz: False)
    assert analyze(a).tiles == via_bincount


def test_index_bits_boundary():
    assert an.index_bits((65536, 10)) == 16
    assert an.index_bits((10, 65537)) == 32
    assert an.index_bits((2**32, 1)) == 32
    assert an.index_bits((2**32 + 1, 1)) == 64


def test_rejects_non_canonical_and_non_csr():
    a = sp.csr_matrix((np.ones(2), np.array([3, 1]), np.array([0, 2])), shape=(1, 5))
    with pytest.raises(FormatError):
        analyze(a)
    with pytest.raises(TypeError):
        analyze(np.eye(3))
    with pytest.raises(TypeError):
        analyze(sp.coo_matrix(np.eye(3)))


def test_csr_array_accepted():
    a = sp.csr_array(np.eye(4, dtype=np.float32))
    assert analyze(a) == analyze(sp.csr_matrix(a))


# ---------------------------------------------------------------------------------------------
# Properties against the brute-force references


@st.composite
def csr_matrices(draw):
    m = draw(st.integers(0, 300))
    n = draw(st.integers(0, 200))
    if m == 0 or n == 0:
        return sp.csr_matrix((m, n), dtype=np.float32)
    if draw(st.booleans()):
        # a few hand-picked coordinates: shrinks well
        coords = draw(st.lists(st.tuples(st.integers(0, m - 1), st.integers(0, n - 1)),
                               max_size=60))
        return csr_from_coords((m, n), coords)
    # random density, with rows of very different lengths and whole dense regions
    seed = draw(st.integers(0, 2**32 - 1))
    p = draw(st.sampled_from([0.01, 0.1, 0.5, 0.9, 1.0]))
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < p
    mask &= rng.random((m, 1)) < draw(st.sampled_from([0.3, 1.0]))
    return sp.csr_matrix(mask.astype(np.float32))


PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(csr_matrices())
def test_property_length_stats(a):
    s = analyze(a)
    rows = [len(r) for r in ref_rows(a)]
    cols = [0] * a.shape[1]
    for r in ref_rows(a):
        for j in r:
            cols[j] += 1
    assert_length_stats(s.row_lengths, ref_length_stats(rows))
    assert_length_stats(s.col_lengths, ref_length_stats(cols))
    for p in (50, 90, 99):
        assert s.row_length_percentiles[f"p{p}"] == approx(ref_percentile(rows, p))
    assert s.nnz == sum(rows)


@PROPS
@given(csr_matrices(), st.sampled_from([1, 3, 32, 64, 128, 256]))
def test_property_footprints(a, b):
    assert footprints(a, b).tolist() == ref_footprints(a, b)
    if b in an.FOOTPRINT_BLOCK_ROWS:
        ref = ref_footprints(a, b)
        f = analyze(a).footprint_for(b)
        assert f.max == max(ref, default=0)
        assert f.mean == approx(sum(ref) / len(ref) if ref else 0.0)


@PROPS
@given(csr_matrices())
def test_property_ell_padding(a):
    assert analyze(a).ell_padding == approx(ref_ell_padding(a))
    assert analyze(a).ell_padding >= 1.0


@PROPS
@given(csr_matrices())
def test_property_tiles(a):
    assert_tiles(analyze(a).tiles, ref_tiles(a))


@PROPS
@given(csr_matrices())
def test_property_round_trip(a):
    s = analyze(a)
    assert MatrixStats.from_dict(json.loads(json.dumps(s.to_dict()))) == s


# ---------------------------------------------------------------------------------------------
# Hashes and serialisation


def _pattern(seed=0, shape=(50, 40)):
    return sp.random(*shape, density=0.2, format="csr", random_state=seed, dtype=np.float32)


def test_hash_same_pattern_different_values():
    a = _pattern()
    b = a.copy()
    b.data = b.data * 2 + 1
    assert structure_hash(a) == structure_hash(b)
    assert values_hash(a) != values_hash(b)
    assert analyze(a).structure_hash == analyze(b).structure_hash


def test_hash_index_dtype_does_not_matter():
    a = _pattern()
    b = a.copy()
    # the constructor would downcast; assign the wider arrays directly
    b.indices = a.indices.astype(np.int64)
    b.indptr = a.indptr.astype(np.int64)
    assert b.indices.dtype == np.int64 and b.indptr.dtype == np.int64
    assert a.indices.dtype == np.int32
    assert structure_hash(a) == structure_hash(b)
    assert values_hash(a) == values_hash(b)


def test_hash_shape_matters():
    a = _pattern()
    wider = sp.csr_matrix((a.data, a.indices, a.indptr), shape=(50, 41))
    assert structure_hash(a) != structure_hash(wider)
    assert values_hash(a) == values_hash(wider)


def test_hash_pattern_matters_and_is_deterministic():
    a, b = _pattern(0), _pattern(1)
    assert structure_hash(a) != structure_hash(b)
    assert structure_hash(a) == structure_hash(a.copy())
    # moving one nonzero to another row (same indices array, different indptr)
    c = sp.csr_matrix((np.ones(2), np.array([0, 1]), np.array([0, 2, 2])), shape=(2, 2))
    d = sp.csr_matrix((np.ones(2), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 2))
    assert structure_hash(c) != structure_hash(d)


def test_values_hash_dtype_matters():
    a = _pattern()
    assert structure_hash(a) == structure_hash(a.astype(np.float64))
    assert values_hash(a) != values_hash(a.astype(np.float64))
    big_endian = a.copy()
    big_endian.data = a.data.astype(">f4")
    assert values_hash(a) == values_hash(big_endian)


def test_to_dict_is_plain_json_and_round_trips():
    s = analyze(_pattern(2, (300, 200)))
    d = s.to_dict()
    text = json.dumps(d)

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, list):
            return all(plain(v) for v in x)
        return type(x) in (int, float, str, bool)
    assert plain(d)
    back = MatrixStats.from_dict(json.loads(text))
    assert back == s
    assert back.to_dict() == d
    assert isinstance(back.shape, tuple) and isinstance(back.footprint, tuple)
    assert isinstance(back.tiles.density_hist, tuple)
    with pytest.raises(AttributeError):
        s.nnz = 3  # frozen


# ---------------------------------------------------------------------------------------------
# Real data


DATA = Path(os.environ.get("SPARSEGEN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
LAYER1 = DATA / "graphchallenge" / "n1024-l1.tsv.gz"


@pytest.mark.skipif(not LAYER1.exists(), reason=f"Graph Challenge layer not found at {LAYER1}")
def test_graphchallenge_layer1():
    with gzip.open(LAYER1, "rt") as f:
        t = np.loadtxt(f)
    a = sp.csr_matrix((t[:, 2].astype(np.float32), (t[:, 0].astype(np.int64) - 1,
                                                    t[:, 1].astype(np.int64) - 1)),
                      shape=(1024, 1024))
    a.sum_duplicates()
    s = analyze(a)
    # Both axes hold exactly 32 nonzeros per line (measured: 32768 = 1024 * 32, no duplicates).
    assert s.nnz == 32768 and s.density == 1 / 32
    assert row_lengths(a).tolist() == [32] * 1024
    assert s.row_lengths == LengthStats(32, 32, 32.0, 0.0, 0.0, 0)
    assert s.col_lengths == LengthStats(32, 32, 32.0, 0.0, 0.0, 0)
    assert s.row_length_percentiles == {"p50": 32.0, "p90": 32.0, "p99": 32.0}
    assert s.ell_padding == 1.0
    assert s.index_bits == 16 and s.dtype == "float32"
    assert set(a.data.tolist()) == {0.0625}
    # measured on this file
    assert footprint_table(s) == MEASURED_L1_FOOTPRINTS
    assert bare(s.tiles) == MEASURED_L1_TILES and s.tiles.density_means == pytest.approx((1 / 32,) + (0.0,) * 9)
    for b in an.FOOTPRINT_BLOCK_ROWS:
        assert footprints(a, b).tolist() == ref_footprints(a, b)
    assert_tiles(s.tiles, ref_tiles(a))


# Measured on n1024-l1: every 32-row block touches 528 columns, every 64-row block all 1024;
# every 128 x 64 tile holds exactly 256 nonzeros (density 1/32).
MEASURED_L1_FOOTPRINTS = {32: (528.0, 528), 64: (1024.0, 1024), 128: (1024.0, 1024),
                          256: (1024.0, 1024)}
MEASURED_L1_TILES = TileStats(128, 64, 128, 128, 256, 256.0, 0.0, (128,) + (0,) * 9)


# A matrix with far more columns than nonzeros: the analysis allocates nothing per column.

def test_wide_matrix_analysis_is_proportional_to_nnz():
    n = 10**12  # one array of n entries would need 8 TB
    a = sp.csr_matrix((np.float32([1, 2, 3]), np.array([5, n - 1, 700]), np.array([0, 2, 3])), shape=(2, n))
    s = analyze(a)
    assert s.shape == (2, n) and s.nnz == 3
    mean = 3 / n
    assert s.col_lengths == LengthStats(0, 1, approx(mean), approx(math.sqrt(mean - mean * mean)),
                                        approx(math.sqrt(mean - mean * mean) / mean), n - 3)
    assert footprint_table(s)[32] == (3.0, 3)
    assert s.tiles.nonempty == 3


def test_column_sort_path_equals_the_counting_path(monkeypatch):
    a = sp.random(300, 2000, density=0.001, format="csr", random_state=3, dtype=np.float32)
    a.sum_duplicates()
    dense_path = analyze(a)
    monkeypatch.setattr(an, "_MIN_BINCOUNT_TILES", 0)  # 2000 columns > 2 * nnz: the sort path
    assert not an._by_columns(a)
    sparse_path = analyze(a)
    c, d = sparse_path.col_lengths, dense_path.col_lengths
    assert (c.min, c.max, c.empty) == (d.min, d.max, d.empty)
    assert (c.mean, c.std, c.cov) == (approx(d.mean), approx(d.std), approx(d.cov))
    assert sparse_path.footprint == dense_path.footprint
    assert sparse_path.tiles == dense_path.tiles


def test_analysis_out_of_memory_is_a_sparsegen_error(monkeypatch):
    def no_memory(csr):
        raise MemoryError("Unable to allocate 8 TiB")
    monkeypatch.setattr(an, "_analyze", no_memory)
    with pytest.raises(an.SparsegenError, match=r"analyzing a 2 x 3 matrix .* out of memory \(Unable to allocate 8 TiB\)"):
        analyze(csr_from_dense([[1, 0, 0], [0, 0, 1]]))


def test_arrays_past_the_piece_size_hash_as_their_pieces_digests(monkeypatch):
    """The documented v2 stream: the header says v2, a small array goes in whole, a large one as
    the sha256 digests of its fixed-size pieces in order; the same matrix keeps v1 below the size."""
    an = importlib.import_module("sparsegen.analyze")

    a = sp.random(40, 300, density=0.3, format="csr", dtype=np.float32, random_state=4)
    a.indices = a.indices.astype(np.int32)
    v1 = structure_hash(a), values_hash(a)
    monkeypatch.setattr(an, "HASH_PIECE", 1000)  # indptr (41 x 8 B) whole; indices and data in pieces
    indices, data = a.indices.astype("<i4").tobytes(), a.data.astype("<f4").tobytes()

    def pieces(b):
        return b"".join(hashlib.sha256(b[i: i + 1000]).digest() for i in range(0, len(b), 1000))

    assert len(indices) > 1000 and a.indptr.astype("<i8").nbytes <= 1000
    assert structure_hash(a) == hashlib.sha256(
        b"sparsegen.structure.v2 shape=40,300 indptr=<i8 indices=<i4\n" + a.indptr.astype("<i8").tobytes()
        + pieces(indices)).hexdigest()
    assert values_hash(a) == hashlib.sha256(b"sparsegen.values.v2 dtype=<f4\n" + pieces(data)).hexdigest()
    assert (structure_hash(a), values_hash(a)) != v1
