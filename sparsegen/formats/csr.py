"""Plain CSR, as the `csr_rowsplit` family reads it: int32 row offsets and columns, values in the
storage dtype, an optional fp32 per-row bias."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan, as_index

NAME = "csr"


def encode(csr: sp.csr_matrix, dtype: str, bias: np.ndarray | None = None) -> Plan:
    """Encode a canonical CSR matrix; `bias` (one fp32 value per row) is kept for the epilogue."""
    m, k = csr.shape
    arrays = {
        # Copies: a plan must not change when the caller later edits the matrix it came from.
        "indptr": as_index(csr.indptr).copy(),
        "indices": as_index(csr.indices).copy(),
        "values": np.array(csr.data, dtype=np.dtype(dtype)),
    }
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return Plan(NAME, arrays, {"m": int(m), "k": int(k), "nnz": int(csr.nnz)})


def spmm(plan: Plan, x: np.ndarray, *, relu: bool = False, out_dtype=None) -> np.ndarray:
    """What the kernel computes from the plan's arrays: fp32 products and sums, epilogue, one cast."""
    c = plan.constants
    a = plan.arrays
    mat = sp.csr_matrix((a["values"].astype(np.float32), a["indices"], a["indptr"]), shape=(c["m"], c["k"]))
    y = np.asarray(mat @ np.asarray(x, dtype=np.float32), dtype=np.float32)
    if "bias" in a:
        y += a["bias"][:, None]
    if relu:
        np.maximum(y, 0.0, out=y)
    return y.astype(out_dtype or a["values"].dtype, copy=False)


def row_swizzle(indptr: np.ndarray) -> np.ndarray:
    """Rows ordered by decreasing length (stable, so equal rows keep their order), as int32.

    Sputnik's row swizzle: a block takes consecutive entries of this order, so the rows it holds
    are about equally long (balance within the block) and the longest rows start first (balance
    across SMs: the short ones fill in behind them)."""
    lengths = np.diff(np.asarray(indptr, dtype=np.int64))
    return np.argsort(-lengths, kind="stable").astype(np.int32)


def row_splits(lengths: np.ndarray, piece: int, max_split: int) -> np.ndarray:
    """Row groups per row: the smallest power of two that leaves each group <= `piece` nonzeros,
    at most `max_split` (a power of two), at least 1."""
    want = np.maximum(1, -(-np.asarray(lengths, dtype=np.int64) // max(1, piece)))
    return np.minimum(1 << np.ceil(np.log2(want)).astype(np.int64), max_split)


def smallest_piece(lengths: np.ndarray, budget: int, max_split: int) -> int:
    """The smallest `piece` whose `row_splits` add up to at most `budget` row groups (the longest
    row's length when even unsplit rows exceed it): the least work per group the grid allows."""
    lengths = np.asarray(lengths, dtype=np.int64)
    lo, hi = 1, max(1, int(lengths.max(initial=0)))
    while lo < hi:  # row_splits(...).sum() does not grow with the piece
        mid = (lo + hi) // 2
        if row_splits(lengths, mid, max_split).sum() <= budget:
            hi = mid
        else:
            lo = mid + 1
    return lo


def balanced_blocks(lengths: np.ndarray, piece: int, groups: int, max_split: int) -> np.ndarray:
    """Rows, longest first (`lengths` in that order), packed into blocks of `groups` row groups,
    each row split `row_splits` ways; a block holds rows of one split only. Returns int32
    (blocks, 2): each block's first position in the order, and rows << 8 | log2(split)."""
    shift = np.log2(row_splits(lengths, piece, max_split)).astype(np.int64)  # non-increasing
    parts = []
    for s in range(int(max_split).bit_length() - 1, -1, -1):  # one split class at a time, rows in order
        where = np.flatnonzero(shift == s)
        if where.size == 0:
            continue
        per = max(1, groups >> s)
        starts = where[0] + np.arange(0, where.size, per)
        rows = np.minimum(per, where[-1] + 1 - starts)
        parts.append(np.stack([starts, (rows << 8) | s], axis=1))
    if not parts:
        return np.zeros((0, 2), dtype=np.int32)
    return np.concatenate(parts).astype(np.int32)


SPUTNIK = "csr_sputnik"


def encode_sputnik(csr: sp.csr_matrix, dtype: str, *, index_bits: int = 32, prescale: int = 0, vector: int = 1,
                   swizzle: bool = False, bias: np.ndarray | None = None,
                   balance: tuple[int, int, int, int] | None = None) -> Plan:
    """CSR as the `sputnik_spmm` kernel reads it.

    index_bits: 16 stores column indices as int16 (fp16 kernels, at most 32767 columns: half the
    index bytes); prescale: when nonzero, indices are stored as column x prescale (the element
    offset of the X row, saving the kernel a multiply per staged nonzero). vector: the kernel loads
    the row `vector` entries at a time from a boundary at or before the row start (reverse-offset
    alignment), so no row is padded; only the arrays' tails are, to a whole vector. swizzle: adds
    `order`, the rows by decreasing length. balance: (piece, budget, groups, max_split) adds
    `blocks`, the table of `balanced_blocks` over that order (swizzle implied), its length as
    `row_blocks` and the piece as `piece` (when 0, the `smallest_piece` within `budget` groups).
    """
    m, k = csr.shape
    nnz = int(csr.nnz)
    padded = max(-(-nnz // vector) * vector, vector)
    cols = np.asarray(csr.indices, dtype=np.int64)
    if prescale:
        cols = cols * prescale
    itype = np.int16 if index_bits == 16 else np.int32
    if cols.size and cols.max() > np.iinfo(itype).max:
        raise OverflowError(f"column offsets exceed {index_bits}-bit indices")
    indices = np.zeros(padded, dtype=itype)
    indices[:nnz] = cols
    values = np.zeros(padded, dtype=np.dtype(dtype))
    values[:nnz] = csr.data
    arrays = {"indptr": as_index(csr.indptr).copy(), "indices": indices, "values": values}
    constants = {"m": int(m), "k": int(k), "nnz": nnz, "prescale": int(prescale)}
    if swizzle or balance:
        arrays["order"] = row_swizzle(csr.indptr)
    if balance:
        piece, budget, groups, max_split = balance
        lengths = np.diff(np.asarray(csr.indptr, dtype=np.int64))[arrays["order"]]
        piece = piece or smallest_piece(lengths, budget, max_split)
        arrays["blocks"] = balanced_blocks(lengths, piece, groups, max_split)
        constants["row_blocks"] = int(arrays["blocks"].shape[0])
        constants["piece"] = int(piece)
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return Plan(SPUTNIK, arrays, constants)


def decode_sputnik(plan: Plan) -> Plan:
    """The plain `csr` plan a `csr_sputnik` plan stands for (emulation reads it)."""
    a, c = plan.arrays, plan.constants
    nnz = c["nnz"]
    cols = a["indices"][:nnz].astype(np.int64)
    if c["prescale"]:
        cols //= c["prescale"]
    arrays = {"indptr": a["indptr"], "indices": cols.astype(np.int32), "values": a["values"][:nnz]}
    if "bias" in a:
        arrays["bias"] = a["bias"]
    return Plan(NAME, arrays, {"m": c["m"], "k": c["k"], "nnz": nnz})
