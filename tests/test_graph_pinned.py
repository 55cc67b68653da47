"""sparsegen.graph pinned: the row hashes against splitmix64's reference outputs, the row-graph
limits at their defaults and at the product bound on both sides, the row classes with forced
hash collisions, the pattern order's first and last columns, the bandwidth of the first column,
and graph_stats' largest component and clock."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import graph

from .test_graph import pattern

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def path(rows: int) -> sp.csr_matrix:
    """Row i holds columns i and i + 1: each row shares a column with the next, a path of rows - 1 edges."""
    r = np.repeat(np.arange(rows), 2)
    c = np.stack([np.arange(rows), np.arange(rows) + 1], axis=1).ravel()
    return sp.csr_matrix((np.ones(r.size, np.float32), (r, c)), shape=(rows, rows + 1))


# ---- the hashes --------------------------------------------------------------------------------

def test_splitmix_is_the_reference_finaliser():
    # splitmix64 (Vigna's splitmix64.c) seeded with 0 outputs e220a8397b1dcdaf, 6e789e6aa1b965f4,
    # 06c45d188009454f: the finaliser of the states 0 + golden, 2 golden, 3 golden, i.e. of 0, golden, 2 golden
    x = np.array([0, GOLDEN, (2 * GOLDEN) & M64], np.uint64)
    assert [int(v) for v in graph._splitmix(x)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def reference_splitmix(x: int) -> int:
    """splitmix64's finaliser on Python integers, written from the published algorithm."""
    z = (x + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


# a table of 4 columns for 5 nonzeros; 2 columns for 2 (a table at equality); 8 columns past 2 nonzeros
@pytest.mark.parametrize("cols", [[0, 3, 1, 3, 2], [1, 0], [0, 7]])
def test_column_hashes_per_nonzero(cols):
    h1, h2 = graph._column_hashes(np.asarray(cols, np.int64))
    assert [int(v) for v in h1] == [reference_splitmix(c) for c in cols]
    assert [int(v) for v in h2] == [reference_splitmix(c ^ 0x5851F42D4C957F2D) for c in cols]


# ---- row classes ----------------------------------------------------------------------------------

def test_equal_rows_share_a_class_whatever_hash_sorts_them_apart():
    # h2 equal for every column, h1 not: rows 0 and 2 (column 0) are one class, row 1 (column 1) another,
    # though row 1 falls between them in row order
    def hashes(cols):
        return cols.astype(np.uint64) + np.uint64(1), np.zeros(cols.size, np.uint64)

    a = pattern([[0], [1], [0]], (3, 2))
    assert graph.row_classes(a, hashes=hashes).tolist() == [0, 1, 0]


# ---- the pattern order, bandwidth, footprint -------------------------------------------------------

@pytest.mark.parametrize("rows, n, order", [
    ([[5, 6], [0, 9]], 10, [1, 0]),  # by first column: the last row's first is its own, not the one before
    ([[], [4]], 6, [1, 0]),  # an empty row sorts past every column of a wide matrix (n, not m)
    ([[3], [9], [3, 4]], 10, [0, 2, 1]),  # a one-nonzero first row: its last column is its own (3 < 4)
    ([[3], []], 4, [0, 1]),  # one nonzero
])
def test_pattern_order_first_and_last_columns(rows, n, order):
    assert graph.pattern_order(pattern(rows, (len(rows), n))).tolist() == order


def test_bandwidth_counts_the_first_column():
    # column 0 spans rows 0..3, column 1 rows 1..2
    assert graph.bandwidth(pattern([[0], [1], [1], [0]], (4, 2))) == 3


def test_footprint_of_no_nonzeros():
    assert graph.footprint(sp.csr_matrix((4, 4), dtype=np.float32), 2) == 0


# ---- the row graph's limits ----------------------------------------------------------------------

@pytest.mark.parametrize("rows, group", [(50_001, 1), (50_002, 2)])
def test_row_graph_default_edge_limit(rows, group):
    # a path of 50,001 rows has 50,000 edges: within EDGE_LIMIT; one row more is past it, and pairs of rows halve it
    g = graph.row_graph(path(rows))
    assert (g.group, g.edges) == (group, 50_000 if group == 1 else 25_000)


# Patterns {0, 1, 2, 3} and {0}: one edge; their product forms 2**2 + 1 + 1 + 1 = 7 column pairs, and a node
# of both forms 4.
TWO_PATTERNS = pattern([[0, 1, 2, 3], [0]], (2, 4))


@pytest.mark.parametrize("work_limit, group", [(7, 1), (6, 2), (3, 2)])
def test_row_graph_product_bound_on_both_sides(monkeypatch, work_limit, group):
    # 7 pairs are within a bound of 7: the exact graph; past a bound of 6, the patterns pair up into one node,
    # which needs no product bound at all (3 < 4 pairs still gives it)
    monkeypatch.setattr(graph, "WORK_LIMIT", work_limit)
    g = graph.row_graph(TWO_PATTERNS)
    assert (g.group, g.nodes, g.edges) == (group, 3 - group, 2 - group)


# ---- components ----------------------------------------------------------------------------------

def test_components_of_no_nonzeros_are_exact():
    c = graph.components(sp.csr_matrix((3, 2), dtype=np.float32))
    assert (c.count, c.tile, c.exact) == (0, 1, True)


def test_graph_stats_largest_component_and_clock(monkeypatch):
    # rows 0, 1, 2 on columns 0, 1 (three rows, two columns); row 3 on column 2 (one and one)
    a = pattern([[0], [0, 1], [1], [2]], (4, 3))
    ticks = iter([10.0, 12.5])
    monkeypatch.setattr(graph, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    s = graph.graph_stats(a)
    assert (s.components, s.largest_rows, s.largest_cols) == (2, 3, 2)
    assert s.seconds == 2.5


def test_the_graph_values_are_frozen():
    a = pattern([[0], [0, 1]], (2, 2))
    for value in (graph.row_graph(a), graph.components(a), graph.graph_stats(a)):
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
