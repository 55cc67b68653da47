"""What every suite's case records share: seeds, the matrix's figures, the error measure, notes.

Plain functions of NumPy arrays and dicts: the CPU tests exercise them without a GPU.
"""
from __future__ import annotations

import zlib

import numpy as np
import scipy.sparse as sp

__all__ = ["seed_for", "matrix_info", "relative_error", "ratio", "join_notes", "message"]


def seed_for(*parts) -> int:
    """A stable 32-bit seed from strings/numbers (Python's hash() is salted per process)."""
    return zlib.crc32("|".join(str(p) for p in parts).encode())


def matrix_info(A: sp.csr_matrix) -> dict:
    """Shape, nnz, sparsity and the row lengths' coefficient of variation, as the records keep them."""
    M, K = A.shape
    lengths = np.diff(A.indptr)
    mean = lengths.mean() if M else 0.0
    return {"shape": [int(M), int(K)], "nnz": int(A.nnz),
            "sparsity": float(1.0 - A.nnz / (M * K)) if M * K else 0.0,
            "row_cov": float(lengths.std() / mean) if mean > 0 else 0.0}


def relative_error(got, ref) -> float:
    """Relative Frobenius error of `got` against `ref` (float64); absolute when ref is zero."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    num = float(np.linalg.norm((got - ref).ravel()))
    den = float(np.linalg.norm(ref.ravel()))
    return num / den if den > 0 else num


def ratio(a, b):
    """a / b for two positive times; None when either is missing."""
    return a / b if a and b and a > 0 and b > 0 else None


def join_notes(a, b):
    return b if not a else f"{a}; {b}"


def message(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its text."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500]
