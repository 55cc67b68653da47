"""Magnitude pruning: the one rule that `sparsegen.torch` and the `llm` benchmark both apply.

    keep = keep_mask(w, 0.7)                 # bool array of w's shape: True where w survives
    w2 = magnitude_prune(w, 0.7)             # a copy of w with the pruned entries set to zero
    A = magnitude_prune_csr(w, 0.7)          # the same as a canonical float32 CSR (2-D w)

The rule: exactly `pruned_count(w.size, sparsity)` = round(sparsity x size) entries (Python's
rounding) are pruned, those of smallest |w|; among equal magnitudes the lower flat (row-major)
index is pruned first, so the larger magnitude survives and, at equal magnitude, the higher index.
This is the order of a stable sort of |w|: the first `pruned_count` entries of it go. Entries that
are already zero are the smallest, so a weight holding more zeros than that count keeps them all.
Weights must be finite (NaN has no magnitude to rank).
"""
from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

from .errors import SparsegenError
from .values import check_numbers

__all__ = ["check_sparsity", "pruned_count", "keep_mask", "magnitude_prune", "magnitude_prune_csr"]


def check_sparsity(sparsity) -> float:
    """`sparsity` as a float in [0, 1]; SparsegenError naming the value otherwise."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= float(sparsity) <= 1.0:
        raise SparsegenError(f"sparsity must be a number in [0, 1] (the share of weights set to zero), "
                             f"got {sparsity!r}")
    return float(sparsity)


def pruned_count(size: int, sparsity: float) -> int:
    """How many entries magnitude pruning zeroes: round(sparsity x size), Python's rounding."""
    return int(round(check_sparsity(sparsity) * size))


def keep_mask(weight, sparsity: float) -> np.ndarray:
    """True where `weight` survives pruning to `sparsity` (the module's rule), in weight's shape.

    Linear time: the pruned_count-th smallest magnitude is found by partition; every entry below it
    is pruned, and of the entries equal to it the lowest flat indices, as many as the count needs.
    """
    w = check_numbers(weight, "float64", "weight (magnitude pruning needs finite weights)")
    k = pruned_count(w.size, sparsity)
    keep = np.ones(w.size, dtype=bool)
    if k == 0:
        return keep.reshape(w.shape)
    mag = np.abs(w).ravel()
    cut = np.partition(mag, k - 1)[k - 1]
    below = mag < cut
    keep[below] = False
    at_cut = np.flatnonzero(mag == cut)
    keep[at_cut[: k - int(np.count_nonzero(below))]] = False
    return keep.reshape(w.shape)


def magnitude_prune(weight, sparsity: float) -> np.ndarray:
    """A copy of `weight` (a NumPy array, its dtype kept) with the pruned entries set to zero."""
    w = np.asarray(weight)
    return np.where(keep_mask(w, sparsity), w, np.zeros((), dtype=w.dtype))


def magnitude_prune_csr(weight, sparsity: float) -> sp.csr_matrix:
    """The pruned 2-D `weight` as a canonical float32 CSR (sorted indices, no explicit zeros)."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2:
        raise SparsegenError(f"magnitude_prune_csr: expected a 2-D weight, got shape {w.shape}")
    A = sp.csr_matrix(magnitude_prune(w, sparsity))
    A.sort_indices()
    return A
