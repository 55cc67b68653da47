"""Relabeling hidden neurons: which row order a layer gets (sparsegen.spdnn.row_order)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.errors import ShapeError
from sparsegen import graph, spdnn
from sparsegen.analyze import ell_padding


def kinds(order_of_kinds) -> sp.csr_matrix:
    """128 rows of three kinds: S holds column 0 (length 1), L columns 0-8 (length 9, S's columns
    and more), Q columns 20-28 (length 9); the rows come in `order_of_kinds`, a string of S/L/Q."""
    cols = {"S": [0], "L": list(range(9)), "Q": list(range(20, 29))}
    rows = [cols[k] for k in order_of_kinds]
    r = np.repeat(np.arange(len(rows)), [len(c) for c in rows])
    a = sp.csr_matrix((np.ones(r.size, np.float32), (r, np.concatenate(rows))), shape=(len(rows), 40))
    a.sort_indices()
    return a


A = kinds("S" * 32 + "L" * 32 + "Q" * 64)
S, L, Q = np.arange(32), np.arange(32, 64), np.arange(64, 128)
# tiles of 64 rows, slices of 32
BY_KIND_PAIRS = np.r_[S, Q[:32], L, Q[32:]]  # footprints 10 + 18, every slice one length
MIXED_SLICES = np.r_[np.ravel(np.c_[S, L]), Q]  # footprints 9 + 9, but S and L share slices: padded
BY_KIND = np.r_[S, L, Q]  # footprints 9 + 9, every slice one length


def footprint_and_padding(order):
    return graph.footprint(A, 64, order), ell_padding(np.diff(A.indptr)[order])


def choose(monkeypatch, by_pattern, by_graph):
    monkeypatch.setattr(graph, "pattern_order", lambda a: by_pattern)
    monkeypatch.setattr(graph, "rcm_order", lambda a: by_graph)
    return spdnn.row_order(A, 64, by_graph=True)


def test_the_cases_are_what_they_claim():
    assert footprint_and_padding(BY_KIND_PAIRS) == (28, 1.0)
    fp, pad = footprint_and_padding(MIXED_SLICES)
    assert fp == 18 and pad > 1.25
    assert footprint_and_padding(BY_KIND) == (18, 1.0)


def test_the_graph_order_wins_with_smaller_footprints_and_no_more_padding(monkeypatch):
    assert choose(monkeypatch, BY_KIND_PAIRS, BY_KIND) is BY_KIND


def test_smaller_footprints_bought_with_padding_keep_the_pattern_order(monkeypatch):
    assert choose(monkeypatch, BY_KIND_PAIRS, MIXED_SLICES) is BY_KIND_PAIRS


def test_a_tie_keeps_the_pattern_order(monkeypatch):
    assert choose(monkeypatch, BY_KIND, BY_KIND[::-1].copy()) is BY_KIND


def test_without_graph_the_pattern_order_stands_and_networkx_is_not_asked(monkeypatch):
    monkeypatch.setattr(graph, "pattern_order", lambda a: BY_KIND_PAIRS)
    monkeypatch.setattr(graph, "rcm_order", lambda a: pytest.fail("rcm_order called without relabel='graph'"))
    assert spdnn.row_order(A, 64) is BY_KIND_PAIRS


def test_relabel_graph_is_a_mode_and_unknown_modes_are_refused():
    layers = [A, A[:, :A.shape[0]].tocsr()] if A.shape[1] >= A.shape[0] else [A]
    assert spdnn.choose_relabeling(layers, 64, "graph").footprint_after <= spdnn.choose_relabeling(
        layers, 64, "auto").footprint_after
    with pytest.raises(ShapeError, match="relabel must be 'auto', 'graph', 'always' or 'never', got 'rcm'"):
        spdnn.choose_relabeling(layers, 64, "rcm")


def test_relabeled_layers_never_touch_more_inputs_than_the_pattern_order_alone():
    from sparsegen import graphchallenge as gc

    layers = [w.T.tocsr() for w in gc.generate_network(4096, 8, seed=1)]
    chosen, _ = spdnn.relabeled(layers, 1024, by_graph=True)
    by_pattern, previous = [], None
    for a in layers:  # the same chain with the pattern order only
        if previous is not None:
            a = a[:, previous].tocsr()
            a.sort_indices()
        previous = graph.pattern_order(a)
        by_pattern.append(a[previous].tocsr())
    mine = [spdnn.tile_footprint(a, 1024) for a in chosen]
    theirs = [spdnn.tile_footprint(a, 1024) for a in by_pattern]
    assert all(x <= y for x, y in zip(mine, theirs)), (mine, theirs)
    assert sum(mine) < 0.9 * sum(theirs), (mine, theirs)


def test_the_relabeling_chain_orders_unsorted_renamed_rows_as_the_sorted_matrix_would():
    """next_order reads each row's smallest and largest renamed column without sorting the rows:
    the same order as row_order of the layer with its columns renamed and sorted."""
    import numpy as np
    import scipy.sparse as sp

    from sparsegen.spdnn import row_order
    from sparsegen.spdnn_build import next_order

    rng = np.random.default_rng(3)
    a = sp.random(300, 200, density=0.05, format="csr", random_state=4)
    a.data[:] = 1.0
    a.sort_indices()
    a = sp.vstack([a, sp.csr_matrix((5, 200))]).tocsr()  # empty rows last
    previous = rng.permutation(200)
    renamed = a[:, previous].tocsr()
    renamed.sort_indices()
    assert np.array_equal(next_order(a.indptr, a.indices, a.shape, previous), row_order(renamed))
    assert np.array_equal(next_order(a.indptr, a.indices, a.shape, None), row_order(a))
