"""Magnitude pruning (sparsegen.prune): the one rule both `sparsegen.torch` and the llm benchmark
apply; exact counts and the tie-break pinned on the NumPy path, and the torch path checked against it."""
from __future__ import annotations

import numpy as np
import pytest

from sparsegen import prune
from sparsegen.errors import ShapeError, SparsegenError


def by_stable_sort(w, sparsity):
    """The rule spelled out: a stable sort of |w|, its first round(sparsity x size) entries zeroed."""
    flat = np.array(w, dtype=np.float64).ravel()
    flat[np.argsort(np.abs(flat), kind="stable")[:round(sparsity * flat.size)]] = 0
    return flat.reshape(np.shape(w))


def test_ties_prune_the_lower_flat_index_first():
    w = np.array([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]], dtype=np.float32)  # six equal magnitudes
    assert (prune.magnitude_prune(w, 0.5) == [[0, 0, 0], [-1, 1, -1]]).all()
    mixed = np.array([3.0, -2.0, 2.0, 1.0, -2.0, 5.0], dtype=np.float32)  # the tie at |2| straddles the cut
    assert (prune.magnitude_prune(mixed, 0.5) == [3.0, 0, 0, 0, -2.0, 5.0]).all()
    assert (prune.keep_mask(mixed, 0.5) == [True, False, False, False, True, True]).all()


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.25, 0.5, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("levels", [3, 50, None])  # few distinct magnitudes: ties everywhere
def test_agrees_with_a_stable_sort(sparsity, levels):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((37, 29)).astype(np.float32)
    if levels is not None:
        w = (np.round(w * levels / 4) / levels).astype(np.float32)
    got = prune.magnitude_prune(w, sparsity)
    assert (got == by_stable_sort(w, sparsity)).all()
    assert int((got == 0).sum()) == max(round(sparsity * w.size), int((w == 0).sum()))


def test_existing_zeros_stay_past_the_count_and_dtype_is_kept():
    w = np.array([0.0, 0.0, 0.0, 4.0, 5.0], dtype=np.float16)
    got = prune.magnitude_prune(w, 0.2)
    assert got.dtype == np.float16 and (got == w).all()  # round(0.2 * 5) = 1, but three were zero
    assert prune.pruned_count(5, 0.2) == 1 and prune.pruned_count(7, 0.5) == 4  # round(3.5): Python's rounding


def test_csr_of_a_2d_weight():
    w = np.array([[0.1, -5.0, 0.3], [2.0, -0.2, 0.0]], dtype=np.float32)
    A = prune.magnitude_prune_csr(w, 0.5)
    assert A.nnz == 3 and A.has_sorted_indices and A.dtype == np.float32
    assert (A.toarray() == np.array([[0, -5.0, 0.3], [2.0, 0, 0]], dtype=np.float32)).all()
    assert prune.magnitude_prune_csr(w, 1.0).nnz == 0
    with pytest.raises(SparsegenError, match="2-D"):
        prune.magnitude_prune_csr(np.ones(3), 0.5)


def test_bad_inputs_are_named():
    with pytest.raises(ShapeError, match=r"magnitude pruning needs finite weights.*nan at index 1"):
        prune.keep_mask(np.array([1.0, np.nan]), 0.5)
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(SparsegenError, match=r"sparsity must be a number in \[0, 1\]"):
            prune.keep_mask(np.ones(4), bad)


def test_torch_path_applies_the_same_rule():
    torch = pytest.importorskip("torch", reason="torch not installed: sparsegen.torch is optional")
    import sparsegen.torch as sgt

    rng = np.random.default_rng(3)
    w = (np.round(rng.standard_normal((24, 40)) * 2) / 2).astype(np.float32)  # many ties
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.from_numpy(w).to(dtype)
        got = sgt.magnitude_prune(t, 0.6)
        assert got.dtype == dtype
        assert (got.float().numpy() == prune.magnitude_prune(t.float().numpy(), 0.6)).all()
