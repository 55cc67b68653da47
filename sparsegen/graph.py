"""The matrix as a graph (analysis stage): independent components, row-graph bandwidth, and row
orders that put rows sharing columns next to each other.

Two graphs of an m x n matrix A:

- the bipartite graph: a node per row and per column, an edge per nonzero. Its connected
  components are the diagonal blocks of A once rows and columns are permuted: independent problems.
- the row graph: two rows are adjacent when they share a column. A tile of consecutive rows touches
  the union of its rows' columns (its footprint), so an order in which adjacent rows sit close -- a
  small bandwidth -- keeps footprints small. In a given order the bandwidth is the widest span of
  positions among the rows touching one column; `bandwidth` computes it exactly.

networkx finds the components and the reverse Cuthill-McKee order, on a coarsened graph where the
full one is too large: rows with equal columns are one node, and groups of them (components: tiles
of rows and columns) where that still leaves more than EDGE_LIMIT edges. Everything that touches
rows or nonzeros is vectorized NumPy; networkx sees only the coarse graph.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["EDGE_LIMIT", "WORK_LIMIT", "Components", "RowGraph", "GraphStats", "row_classes", "pattern_order",
           "bandwidth", "footprint", "row_graph", "rcm_order", "components", "graph_stats"]

# networkx builds and orders graphs at about 10 us per edge: a graph of 50,000 edges costs about
# half a second, 200,000 edges ten (docs/decisions/008-graph-orders.md)
EDGE_LIMIT = 50_000
# (column, pair of nodes) products scipy forms for one row graph: 20 M take about 0.2 s
WORK_LIMIT = 20_000_000



@dataclass(frozen=True)
class RowGraph:
    """The row graph, coarsened: `node` of each row; `adjacency` (nodes x nodes, symmetric, no
    diagonal) weighs each edge by the columns its nodes share. `classes` distinct row patterns, and
    `group` of them (consecutive by first row) per node: 1 is the exact graph of the patterns."""

    node: np.ndarray
    adjacency: sp.csr_matrix
    classes: int
    group: int

    @property
    def nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def edges(self) -> int:
        return int(self.adjacency.nnz // 2)


@dataclass(frozen=True)
class Components:
    """Connected components of the bipartite graph: `row_label` and `col_label` give each row's and
    column's component (-1: an empty row or column, in none), numbered by their first row.

    `tile` rows and columns were one node of the graph they were found on: 1 is exact; above 1 each
    component found is a union of exact ones, so `count` is a lower bound, and each is still
    independent of the others."""

    row_label: np.ndarray
    col_label: np.ndarray
    count: int
    tile: int

    @property
    def exact(self) -> bool:
        return self.tile == 1

    def sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows and columns of each component."""
        return (np.bincount(self.row_label[self.row_label >= 0], minlength=self.count),
                np.bincount(self.col_label[self.col_label >= 0], minlength=self.count))

    def orders(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Row and column orders that make the matrix block diagonal (empty rows and columns last),
        and each block's bounds in them: block i is rows row_order[rb[i]:rb[i+1]], columns
        col_order[cb[i]:cb[i+1]]."""
        rows, cols = self.sizes()
        return (_stable_by_label(self.row_label, self.count), _stable_by_label(self.col_label, self.count),
                np.r_[0, np.cumsum(rows)], np.r_[0, np.cumsum(cols)])

    def blocks(self, csr):
        """Each component as (rows, columns, csr[rows][:, columns]): the independent problems."""
        row_order, col_order, rb, cb = self.orders()
        for i in range(self.count):  # over components
            rows, cols = row_order[rb[i]:rb[i + 1]], col_order[cb[i]:cb[i + 1]]
            yield rows, cols, csr[rows][:, cols]


@dataclass(frozen=True)
class GraphStats:
    """What `sparsegen inspect` reports about the matrix as a graph (see the module docstring)."""

    components: int
    component_tile: int  # 1: exact; else the components of tiles this large (a lower bound)
    largest_rows: int
    largest_cols: int
    empty_rows: int
    empty_cols: int
    row_classes: int  # distinct row patterns
    nodes: int  # nodes of the coarse row graph networkx ordered
    edges: int
    group: int  # row patterns per node
    bandwidth: int  # the row graph's, rows as stored
    bandwidth_rcm: int  # the row graph's, rows in reverse Cuthill-McKee order
    seconds: float  # the graph work (coarsening, networkx, bandwidths)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# ---------------------------------------------------------------------------------------------
# Rows


def row_classes(csr, hashes=None) -> np.ndarray:
    """Class of each row (int64): rows with the same columns share one, numbered by first row.

    Rows are grouped by length and two 64-bit hashes of their columns, then each is compared with
    its group's first row entry by entry; a row that differs (a hash collision) gets a class of its
    own, so rows with different columns never share one. `hashes` (test hook): column -> (h1, h2).
    """
    m = csr.shape[0]
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    cols = np.asarray(csr.indices[: indptr[-1]], dtype=np.int64)
    lengths = np.diff(indptr)
    h1, h2 = (hashes or _column_hashes)(cols)
    key = np.stack([lengths.astype(np.uint64), _row_sums(h1, indptr), _row_sums(h2, indptr)])
    order = np.lexsort(key[::-1])
    k = key[:, order]
    group = np.cumsum(np.r_[True, np.any(k[:, 1:] != k[:, :-1], axis=0)]) - 1
    cls = np.empty(m, np.int64)
    cls[order] = group
    first = np.full(group[-1] + 1, m, np.int64)
    np.minimum.at(first, cls, np.arange(m, dtype=np.int64))
    cls = _split_collisions(cls, first[cls], cols, indptr, lengths)
    return _number_by_first_row(cls)


def _column_hashes(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes of each column index: from a table per column while there are fewer
    columns than nonzeros, else per nonzero (no array of n entries)."""
    n = int(cols.max()) + 1 if cols.size else 0
    keys = np.arange(n, dtype=np.uint64) if n <= cols.size else cols.astype(np.uint64)
    h1, h2 = _splitmix(keys), _splitmix(keys ^ np.uint64(0x5851F42D4C957F2D))
    return (h1[cols], h2[cols]) if n <= cols.size else (h1, h2)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixed 64-bit value per input (integer arithmetic wraps)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _row_sums(h: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Sum of h over each row, modulo 2**64 (a prefix sum, so empty rows cost nothing special)."""
    prefix = np.zeros(h.size + 1, np.uint64)
    np.cumsum(h, out=prefix[1:])
    return prefix[indptr[1:]] - prefix[indptr[:-1]]


def _split_collisions(cls, rep, cols, indptr, lengths) -> np.ndarray:
    """Rows whose columns differ from their class's first row `rep` get classes of their own."""
    row = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    at = np.arange(cols.size, dtype=np.int64) - indptr[row] + indptr[rep[row]]
    bad = np.zeros(lengths.size, bool)
    bad[row[cols != cols[at]]] = True
    out = cls.copy()
    out[bad] = cls.max(initial=-1) + 1 + np.arange(int(bad.sum()))
    return out


def _number_by_first_row(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0.. in order of their first row (-1 stays -1)."""
    valid = labels >= 0
    first = np.full(int(labels.max(initial=-1)) + 1, labels.size, np.int64)
    np.minimum.at(first, labels[valid], np.flatnonzero(valid))
    rank = _inverse(np.argsort(first, kind="stable"))  # labels no row has sort last: none is skipped
    out = np.full(labels.size, -1, np.int64)
    out[valid] = rank[labels[valid]]
    return out


def pattern_order(csr) -> np.ndarray:
    """Rows sorted by first column, last column, length: equal rows side by side, and rows that
    start and end together near each other (empty rows last)."""
    return pattern_order_of(csr.indptr, csr.indices, csr.shape[1])


def pattern_order_of(indptr, indices, n: int) -> np.ndarray:
    """`pattern_order` of a CSR pattern whose rows need not be sorted: each row's first and last
    column are its smallest and largest."""
    indptr = np.asarray(indptr, dtype=np.int64)
    lengths = np.diff(indptr)
    has = lengths > 0
    nnz = int(indptr[-1])
    if nnz == 0:
        return np.lexsort((lengths, np.full(lengths.size, n), np.full(lengths.size, n)))
    starts = indptr[:-1][has]  # the nonempty rows' segments tile indices[:nnz] end to end
    cols = np.asarray(indices[:nnz])
    first, last = np.full(lengths.size, n, np.int64), np.full(lengths.size, n, np.int64)
    first[has], last[has] = np.minimum.reduceat(cols, starts), np.maximum.reduceat(cols, starts)
    return np.lexsort((lengths, last, first))


def bandwidth(csr, order=None) -> int:
    """Bandwidth of the row graph with rows in `order` (default: as stored): over the columns, the
    widest span of positions of the rows touching one; 0 when no column has two rows."""
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    nnz = int(indptr[-1])
    if nnz == 0:
        return 0
    m = csr.shape[0]
    position = np.arange(m, dtype=np.int64) if order is None else _inverse(np.asarray(order))
    rows = np.repeat(position, np.diff(indptr))
    cols = np.asarray(csr.indices[:nnz])
    by_col = np.argsort(cols, kind="stable")
    c, r = cols[by_col], rows[by_col]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    return int((np.maximum.reduceat(r, starts) - np.minimum.reduceat(r, starts)).max())


def footprint(csr, tile: int, order=None) -> int:
    """Distinct columns per tile of `tile` consecutive rows, summed over the tiles, with rows in
    `order` (default: as stored); the matrix is not permuted."""
    m, n = csr.shape
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    position = np.arange(m, dtype=np.int64) if order is None else _inverse(np.asarray(order))
    keys = np.repeat(position // tile, np.diff(indptr)) * n + csr.indices[: indptr[-1]]
    space = -(-m // tile) * n
    if space <= max(4 * keys.size, 1 << 20):  # a mark per (tile, column) stays O(nnz)
        seen = np.zeros(space, bool)
        seen[keys] = True
        return int(np.count_nonzero(seen))
    return int(np.unique(keys).size)


def _inverse(order: np.ndarray) -> np.ndarray:
    inv = np.empty(order.size, np.int64)
    inv[order] = np.arange(order.size, dtype=np.int64)
    return inv


# ---------------------------------------------------------------------------------------------
# The row graph and its reverse Cuthill-McKee order


def row_graph(csr, edge_limit: int = EDGE_LIMIT, classes=None) -> RowGraph:
    """The row graph of the row patterns, coarsened to at most `edge_limit` edges.

    Node i holds the patterns i*group .. (i+1)*group - 1 (numbered by first row); group doubles
    from 1 until the graph has at most 2 * `edge_limit` nodes and `edge_limit` edges, and scipy's
    product that finds them forms at most WORK_LIMIT column pairs (one node has no edge)."""
    cls = row_classes(csr) if classes is None else classes
    n = csr.shape[1]
    _, first = np.unique(cls, return_index=True)  # each pattern's first row
    count = first.size
    reps = csr[first]
    rep_rows = np.repeat(np.arange(count, dtype=np.int64), np.diff(reps.indptr))
    group = 1
    while True:
        nodes = -(-count // group)
        if nodes > 2 * edge_limit:
            group *= 2
            continue
        incidence = sp.csr_matrix((np.ones(rep_rows.size, np.float32), (rep_rows // group, reps.indices)),
                                  shape=(nodes, n))
        incidence.data[:] = 1.0  # union of the group's columns: duplicates summed, then one
        degree = np.diff(incidence.tocsc().indptr)
        if nodes <= 1 or int(np.square(degree, dtype=np.int64).sum()) <= WORK_LIMIT:
            adjacency = _without_diagonal(incidence @ incidence.T)
            if nodes <= 1 or adjacency.nnz // 2 <= edge_limit:
                return RowGraph(cls // group, adjacency, count, group)
        group *= 2


def _without_diagonal(g) -> sp.csr_matrix:
    g = g.tocoo()
    off = g.row != g.col
    return sp.csr_matrix((g.data[off], (g.row[off], g.col[off])), shape=g.shape)


def rcm_order(csr, graph: RowGraph | None = None) -> np.ndarray:
    """Rows in the reverse Cuthill-McKee order of the (coarse) row graph, by networkx; the rows of
    one node stay in their stored order. Components come one after another, and the nodes without
    an edge (rows sharing no column with another pattern) after them all."""
    import networkx as nx

    g = row_graph(csr) if graph is None else graph
    linked = np.flatnonzero(np.diff(g.adjacency.indptr))  # nodes with an edge; the others go last
    sequence = np.r_[linked, np.setdiff1d(np.arange(g.nodes), linked)]
    if linked.size:
        nxg = nx.from_scipy_sparse_array(g.adjacency[linked][:, linked])
        sequence[: linked.size] = linked[np.fromiter(nx.utils.reverse_cuthill_mckee_ordering(nxg), np.int64,
                                                     count=linked.size)]
    return np.argsort(_inverse(sequence)[g.node], kind="stable")


# ---------------------------------------------------------------------------------------------
# Components


def components(csr, edge_limit: int = EDGE_LIMIT) -> Components:
    """Connected components of the bipartite row-column graph, by networkx.

    Exact while nnz <= `edge_limit`; beyond, on tiles of t x t (t a power of two, the smallest
    whose nonempty tiles number at most `edge_limit`): a node per block of t rows and per block
    of t columns, an edge per nonempty tile."""
    import networkx as nx

    m, n = csr.shape
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    lengths = np.diff(indptr)
    rows = np.repeat(np.arange(m, dtype=np.int64), lengths)
    cols = np.asarray(csr.indices[: indptr[-1]], dtype=np.int64)
    if cols.size == 0:
        return Components(np.full(m, -1, np.int64), np.full(n, -1, np.int64), 0, 1)
    tile = 1 << max(0, int(np.ceil(np.log2(max(rows.size / edge_limit, 1.0)) / 2)))  # a tile holds <= tile**2
    while True:
        ncb = -(-n // tile)
        keys = np.unique(rows // tile * ncb + cols // tile)
        if keys.size <= edge_limit:
            break
        tile *= 2
    # nodes: the row blocks and column blocks that hold a nonzero, numbered apart
    row_blocks, row_node = np.unique(keys // ncb, return_inverse=True)
    col_blocks, col_node = np.unique(keys % ncb, return_inverse=True)
    size = row_blocks.size + col_blocks.size
    bipartite = sp.csr_matrix((np.ones(keys.size, np.int8), (row_node, row_blocks.size + col_node)), shape=(size, size))
    label = np.full(size, -1, np.int64)
    for i, nodes in enumerate(nx.connected_components(nx.from_scipy_sparse_array(bipartite + bipartite.T))):
        label[np.fromiter(nodes, np.int64, count=len(nodes))] = i  # over components
    block = np.arange(m, dtype=np.int64) // tile
    at = np.minimum(np.searchsorted(row_blocks, block), max(row_blocks.size - 1, 0))
    row_label = _number_by_first_row(np.where(lengths > 0, label[at], -1))
    # every nonzero of a column is in the column's component: one write per nonzero carries it over
    col_label = np.full(n, -1, np.int64)
    col_label[cols] = row_label[rows]
    count = int(row_label.max()) + 1 if (row_label >= 0).any() else 0
    return Components(row_label, col_label, count, tile)


def _stable_by_label(label: np.ndarray, count: int) -> np.ndarray:
    """Indices grouped by label 0..count-1, in order within each; -1 (empty) last."""
    return np.argsort(np.where(label >= 0, label, count), kind="stable")


# ---------------------------------------------------------------------------------------------
# The report


def graph_stats(csr) -> GraphStats:
    """Components, row patterns and row-graph bandwidth as stored and in the RCM order."""
    t0 = time.perf_counter()
    comp = components(csr)
    rows, cols = comp.sizes()
    largest = int(np.argmax(rows)) if comp.count else -1
    graph = row_graph(csr)
    order = rcm_order(csr, graph)
    return GraphStats(
        components=comp.count, component_tile=comp.tile,
        largest_rows=int(rows[largest]) if comp.count else 0, largest_cols=int(cols[largest]) if comp.count else 0,
        empty_rows=int(np.count_nonzero(comp.row_label < 0)), empty_cols=int(np.count_nonzero(comp.col_label < 0)),
        row_classes=graph.classes, nodes=graph.nodes, edges=graph.edges, group=graph.group,
        bandwidth=bandwidth(csr), bandwidth_rcm=bandwidth(csr, order),
        seconds=time.perf_counter() - t0)
