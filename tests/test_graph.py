"""The matrix as a graph: components, row-graph bandwidth, row orders, and inspect's graph section."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import graph
from sparsegen.cli import main

from .helpers import random_csr


def pattern(rows, shape) -> sp.csr_matrix:
    """A canonical float32 CSR with ones at the listed columns of each row."""
    r = np.repeat(np.arange(len(rows)), [len(c) for c in rows])
    c = np.concatenate([np.asarray(c, np.int64) for c in rows]) if r.size else np.zeros(0, np.int64)
    a = sp.csr_matrix((np.ones(r.size, np.float32), (r, c)), shape=shape)
    a.sort_indices()
    return a


def band(n: int) -> sp.csr_matrix:
    """Tridiagonal n x n: the row graph links rows up to two apart, so its bandwidth is 2."""
    return sp.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1], format="csr", dtype=np.float32)


# ---- components -----------------------------------------------------------------------------------

# rows 0, 2 and columns 0, 2 are one block; rows 1, 4 and columns 1, 4 the other; row 3 and column 3 empty
TWO_BLOCKS = pattern([[0, 2], [1], [0], [], [1, 4]], (5, 5))


def test_two_components_with_their_rows_and_columns():
    c = graph.components(TWO_BLOCKS)
    assert c.exact and c.count == 2
    assert c.row_label.tolist() == [0, 1, 0, -1, 1]
    assert c.col_label.tolist() == [0, 1, 0, -1, 1]
    rows, cols = c.sizes()
    assert rows.tolist() == [2, 2] and cols.tolist() == [2, 2]


def test_blocks_are_the_independent_problems():
    blocks = list(graph.components(TWO_BLOCKS).blocks(TWO_BLOCKS))
    assert [(r.tolist(), c.tolist()) for r, c, _ in blocks] == [([0, 2], [0, 2]), ([1, 4], [1, 4])]
    assert blocks[0][2].toarray().tolist() == [[1, 1], [1, 0]]
    assert blocks[1][2].toarray().tolist() == [[1, 0], [1, 1]]
    # every nonzero lies in one block: the blocks' nonzeros add up to the matrix's
    assert sum(b.nnz for _, _, b in blocks) == TWO_BLOCKS.nnz


def test_block_diagonal_order_recovers_a_permuted_block_diagonal_matrix():
    rng = np.random.default_rng(3)
    parts = [random_csr(30, 20, 0.3, seed=s) for s in (1, 2, 3)]
    a = sp.block_diag(parts, format="csr")
    p, q = rng.permutation(a.shape[0]), rng.permutation(a.shape[1])
    shuffled = a[p][:, q].tocsr()
    shuffled.sort_indices()
    c = graph.components(shuffled)
    assert c.count == 3 and sorted(c.sizes()[0].tolist()) == [30, 30, 30]
    rows, cols, rb, cb = c.orders()
    ordered = shuffled[rows][:, cols].toarray()
    # nothing outside the diagonal blocks
    inside = np.zeros(ordered.shape, bool)
    for i in range(c.count):
        inside[rb[i]:rb[i + 1], cb[i]:cb[i + 1]] = True
    assert not ordered[~inside].any()


def test_components_on_tiles_are_unions_of_exact_ones():
    a = sp.eye(200, format="csr", dtype=np.float32)  # 200 components of one row and one column
    exact = graph.components(a)
    coarse = graph.components(a, edge_limit=20)
    assert exact.count == 200 and exact.exact
    assert not coarse.exact and coarse.tile == 16 and coarse.count == 13  # ceil(200 / 16) diagonal tiles
    # still independent: each nonzero's row and column are in one component
    coo = a.tocoo()
    assert np.array_equal(coarse.row_label[coo.row], coarse.col_label[coo.col])


def test_no_nonzeros_no_components():
    c = graph.components(sp.csr_matrix((3, 4), dtype=np.float32))
    assert c.count == 0 and (c.row_label == -1).all() and (c.col_label == -1).all()


def test_component_tiles_are_the_smallest_that_fit():
    a = sp.csr_matrix(np.pad(np.ones((40, 40), np.float32), ((0, 24), (0, 24))))  # one dense 40 x 40 block
    c = graph.components(a, edge_limit=100)
    assert c.tile == 4 and c.count == 1  # (40 / 4)**2 = 100 nonempty tiles; 2 x 2 tiles would be 400
    assert (c.row_label[:40] == 0).all() and (c.row_label[40:] == -1).all()


# ---- the row graph ----------------------------------------------------------------------------------

def test_bandwidth_of_a_band_and_of_its_rows_permuted():
    a = band(40)
    assert graph.bandwidth(a) == 2
    p = np.random.default_rng(1).permutation(40)
    shuffled = a[p]
    assert graph.bandwidth(shuffled) > 20
    assert graph.bandwidth(shuffled, np.argsort(p)) == 2  # undoing the permutation undoes it
    assert graph.bandwidth(shuffled, graph.rcm_order(shuffled)) == 2


def test_bandwidth_of_a_wide_matrix_and_of_none():
    a = pattern([[0, 9], [5], [9], [5, 8]], (4, 10))
    assert graph.bandwidth(a) == 2  # column 9: rows 0 and 2; column 5: rows 1 and 3
    assert graph.bandwidth(a, [0, 2, 1, 3]) == 1
    assert graph.bandwidth(sp.csr_matrix((4, 10), dtype=np.float32)) == 0


def test_rcm_reduces_the_bandwidth_of_a_band_of_separate_chains():
    # row i holds columns i and i + 7: column j links rows j - 7 and j, so the stored order has
    # bandwidth 7, while the row graph is 7 chains that can each sit in consecutive rows
    n, d = 60, 7
    a = pattern([[i, i + d] if i + d < n else [i] for i in range(n)], (n, n))
    assert graph.bandwidth(a) == d
    order = graph.rcm_order(a)
    assert sorted(order.tolist()) == list(range(n))
    assert graph.bandwidth(a, order) == 1


def test_rcm_keeps_linked_rows_together_and_puts_rows_without_a_neighbour_last():
    order = graph.rcm_order(TWO_BLOCKS).tolist()
    assert order[-1] == 3  # the empty row
    assert {frozenset(order[0:2]), frozenset(order[2:4])} == {frozenset({0, 2}), frozenset({1, 4})}


def test_identical_rows_are_one_class_numbered_by_first_row():
    a = pattern([[3, 5], [1], [3, 5], [], [1], [], [2, 5]], (7, 6))
    assert graph.row_classes(a).tolist() == [0, 1, 0, 2, 1, 2, 3]
    assert graph.row_classes(a[:1]).tolist() == [0] and graph.row_classes(a[:0]).tolist() == []


def test_a_hash_collision_never_merges_different_rows():
    a = pattern([[0, 1], [2, 3], [0, 1], [4, 5]], (4, 6))

    def collide(cols):  # every column hashes alike: all rows of a length collide
        z = np.zeros(cols.size, np.uint64)
        return z, z

    cls = graph.row_classes(a, hashes=collide)
    assert cls[0] == cls[2] and len({cls[0], cls[1], cls[3]}) == 3


def edges_of_groups(a, group: int) -> int:
    """Edges of the row graph whose nodes are `group` consecutive rows (all rows distinct), by hand."""
    nodes = np.zeros((-(-a.shape[0] // group), a.shape[1]), bool)
    np.logical_or.at(nodes, np.arange(a.shape[0]) // group, a.toarray() != 0)
    shared = nodes.astype(np.int64) @ nodes.T.astype(np.int64)
    return int(np.count_nonzero(np.triu(shared, 1)))


@pytest.mark.parametrize("limit", [675, 1000])
def test_row_graph_coarsens_to_the_edge_limit(limit):
    a = (random_csr(300, 300, 0.01, seed=4) + sp.eye(300, dtype=np.float32)).tocsr()  # rows all distinct
    a.sort_indices()
    # by hand: 2,182 edges; groups of 4 rows 1,487, of 8 rows 675
    full = graph.row_graph(a)
    assert full.group == 1 and full.nodes == 300 and full.edges == edges_of_groups(a, 1) == 2182
    small = graph.row_graph(a, edge_limit=limit)
    assert small.group == 8 and small.nodes == 38 and small.edges == edges_of_groups(a, 8) == 675
    assert edges_of_groups(a, 4) == 1487
    assert np.array_equal(small.node, np.arange(300) // small.group)  # patterns numbered by first row
    order = graph.rcm_order(a, small)
    assert sorted(order.tolist()) == list(range(300))
    # the rows of one node stay together, in their stored order
    assert (np.diff(small.node[order]) != 0).sum() == small.nodes - 1


@pytest.mark.parametrize("rows,group", [(300, 4), (200, 2)])
def test_row_graph_coarsens_to_twice_the_edge_limit_in_nodes(rows, group):
    a = sp.eye(rows, format="csr", dtype=np.float32)  # patterns without an edge
    g = graph.row_graph(a, edge_limit=50)
    assert g.group == group and g.nodes == rows // group <= 100 < 2 * g.nodes and g.edges == 0


def test_row_graph_weighs_edges_by_shared_columns():
    a = pattern([[0, 1, 2], [1, 2], [5]], (3, 6))
    g = graph.row_graph(a)
    assert g.adjacency.toarray().tolist() == [[0, 2, 0], [2, 0, 0], [0, 0, 0]]


def test_pattern_order_sorts_by_first_column_last_column_length():
    a = pattern([[4, 6], [1, 6], [1, 3], [], [1, 2, 3], [5], [0], []], (8, 7))
    assert graph.pattern_order(a).tolist() == [6, 2, 4, 1, 0, 5, 3, 7]  # empty rows last


@pytest.mark.parametrize("n", [300, 10**7])  # a mark per (tile, column), and past O(nnz) a sort
def test_footprint_in_an_order_is_the_permuted_matrix_footprint(n):
    from sparsegen.spdnn import tile_footprint

    a = random_csr(500, n, 0.04 if n < 1000 else 2e-6, seed=5)
    order = np.random.default_rng(2).permutation(500)
    for tile in (32, 96):
        assert graph.footprint(a, tile, order) == tile_footprint(a[order], tile)
        assert graph.footprint(a, tile) == tile_footprint(a, tile)


# ---- the report and inspect ------------------------------------------------------------------------

def test_graph_stats_of_two_components():
    g = graph.graph_stats(TWO_BLOCKS)
    assert (g.components, g.component_tile, g.largest_rows, g.largest_cols) == (2, 1, 2, 2)
    assert (g.empty_rows, g.empty_cols, g.row_classes) == (1, 1, 5)  # the empty row is a pattern too
    assert g.bandwidth == 3  # column 1: rows 1 and 4
    assert g.bandwidth_rcm == 1  # rows 0, 2 together and rows 1, 4 together


@pytest.mark.parametrize("shape", [(0, 5), (3, 5)])
def test_graph_stats_of_matrices_without_nonzeros(shape):
    g = graph.graph_stats(sp.csr_matrix(shape, dtype=np.float32))
    assert (g.components, g.largest_rows, g.largest_cols, g.bandwidth, g.bandwidth_rcm) == (0, 0, 0, 0, 0)
    assert (g.empty_rows, g.empty_cols, g.row_classes) == (shape[0], 5, min(shape[0], 1))


def test_inspect_reports_the_graph(tmp_path, capsys):
    p = np.random.default_rng(7).permutation(64)
    path = tmp_path / "band.npz"
    sp.save_npz(path, band(64)[p].tocsr())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "graph       1 component of rows and columns linked by nonzeros; largest 64 rows x 64 columns; " \
           "0 empty rows, 0 empty columns" in out
    line = next(s for s in out.splitlines() if s.startswith("bandwidth"))
    stored = graph.bandwidth(band(64)[p].tocsr())
    assert line.startswith(f"bandwidth   row graph (rows sharing a column): {stored} as stored, 2 in reverse "
                           "Cuthill-McKee order (64 distinct rows; networkx on 64 nodes, 125 edges; ")


CHAINS = pattern([[i, i + 7] if i + 7 < 60 else [i] for i in range(60)], (60, 60))  # 7 chains, bandwidth 7
SHUFFLED_BAND = band(64)[np.random.default_rng(7).permutation(64)].tocsr()


def test_the_permuted_band_is_spread():
    assert graph.bandwidth(band(64)) == 2 and graph.bandwidth(SHUFFLED_BAND) > 20


@pytest.mark.parametrize("matrix,expected", [
    # components, empty rows, bandwidth as stored, in RCM order
    (TWO_BLOCKS, (2, 1, 3, 1)),
    (CHAINS, (7, 0, 7, 1)),
    (SHUFFLED_BAND, (1, 0, graph.bandwidth(SHUFFLED_BAND), 2)),
], ids=["two-components", "band-of-chains", "permuted-band"])
def test_inspect_json_has_the_graph(tmp_path, capsys, matrix, expected):
    path = tmp_path / "m.npz"
    sp.save_npz(path, matrix)
    assert main(["inspect", str(path), "--json", "--dtype", "float32"]) == 0
    g = json.loads(capsys.readouterr().out)["graph"]
    assert g["component_tile"] == 1
    assert (g["components"], g["empty_rows"], g["bandwidth"], g["bandwidth_rcm"]) == expected
