"""ELL head + COO tail, as the `ell_coo_spmm` family reads it (Kashid et al.'s hybrid).

Every row keeps its first min(len, W) nonzeros in a slot-major ELL block: slot s of row r sits at
`ell_cols[s, r]` / `ell_vals[s, r]`, so the row groups of a warp, which hold consecutive rows,
read one contiguous segment per slot (coalesced for every group size, thread-per-row included).
A row's slots past its length are padding: zero-filled, never read (the kernel loops to
min(row_len, W)), so a padding zero never meets an inf in X.

The entries past W of the long rows form the COO tail, in row order and cut into chunks of at
most `chunk` entries of one row. A chunk never straddles two rows, so its row is stored once
(`chunk_row`) instead of once per entry, and the kernel adds each chunk's fp32 partial sum to Y
once per (row, column). `tail_rows` lists the rows that have a tail (ReLU waits for them).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from . import Plan, as_index

NAME = "ell_coo"
ROW_ALIGN = 32  # ELL slots are padded to a multiple of 32 rows: each slot starts 128-byte aligned
MIN_CHUNK = 32  # a chunk adds its partial to Y once per column: >= 32 entries keep atomics <= 1/32 of the FMAs
MIN_WIDTH = 1  # the ELL pass visits every row anyway (it writes Y): a first slot costs no extra wait


def width_from_median(p50: float) -> int:
    """The ELL width for a median row length `p50` (NumPy's linearly interpolated 50th
    percentile, as `MatrixStats.row_length_percentiles["p50"]` holds it): rounded up, at least 1."""
    return max(MIN_WIDTH, int(math.ceil(p50)))


def choose_width(row_lengths) -> int:
    """ELL width W: the median row length, rounded up.

    W minimises padded slots + tail entries, sum_r (W - len_r)+ + sum_r (len_r - W)+ =
    sum_r |len_r - W|, and the minimiser of a sum of absolute deviations is the median (any W
    between the two middle lengths; ceil picks one). Equal weights because in these kernels a
    padded slot and a tail entry cost about one step each: a padded slot is a step its row group
    idles while longer rows of its warp or block run on; a tail entry is one step of a COO group
    (the same index, value and X loads as an ELL slot; its atomics are spread over a chunk of
    >= MIN_CHUNK entries). So at least half the rows fit whole, and no row keeps more than the
    median in the ELL pass. It is also exactly what selection can compute: `MatrixStats` holds p50.

    At least MIN_WIDTH = 1: when most rows are empty the median is 0, yet the ELL pass visits every
    row regardless, so each row's first nonzero is taken there rather than as a one-entry chunk
    with its own atomics (and a matrix of 0/1-entry rows then has no tail, so the hybrid declines).
    """
    lengths = np.asarray(row_lengths, dtype=np.int64)
    return width_from_median(np.percentile(lengths, 50) if lengths.size else 0.0)


def chunk_size(width: int) -> int:
    """Tail entries per chunk: as long as an ELL row, so an item of either pass takes at most
    max(W, MIN_CHUNK) steps, and never under MIN_CHUNK (atomics per FMA)."""
    return max(int(width), MIN_CHUNK)


def ell_stride(m: int) -> int:
    return -(-int(m) // ROW_ALIGN) * ROW_ALIGN


def encode(csr: sp.csr_matrix, dtype: str, width: int, chunk: int, bias: np.ndarray | None = None) -> Plan:
    """Split a canonical CSR matrix at ELL width `width`; the tail in chunks of at most `chunk`."""
    m, k = csr.shape
    dtype = np.dtype(dtype)
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    nnz = int(indptr[-1])
    lengths = np.diff(indptr)
    cols = as_index(csr.indices[:nnz])
    vals = np.asarray(csr.data[:nnz]).astype(dtype)
    row = np.repeat(np.arange(m, dtype=np.int64), lengths)
    pos = np.arange(nnz, dtype=np.int64) - indptr[row]  # place of each nonzero within its row
    head = pos < width

    stride = ell_stride(m)
    ell_cols = np.zeros((width, stride), dtype=np.int32)  # padding: column 0, value 0, never read
    ell_vals = np.zeros((width, stride), dtype=dtype)
    ell_cols[pos[head], row[head]] = cols[head]
    ell_vals[pos[head], row[head]] = vals[head]

    tail = ~head
    tail_row, tail_pos = row[tail], pos[tail] - width
    starts = np.flatnonzero(tail_pos % chunk == 0)  # a row's tail restarts the chunk count
    arrays = {
        "ell_cols": ell_cols,
        "ell_vals": ell_vals,
        "row_len": lengths.astype(np.int32),
        "chunk_row": tail_row[starts].astype(np.int32),
        "chunk_ptr": np.append(starts, tail_row.size).astype(np.int32),
        "tail_cols": np.ascontiguousarray(cols[tail]),
        "tail_vals": np.ascontiguousarray(vals[tail]),
        "tail_rows": np.flatnonzero(lengths > width).astype(np.int32),
    }
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    constants = {"m": int(m), "k": int(k), "nnz": nnz, "width": int(width), "chunk": int(chunk),
                 "stride": stride, "ell_nnz": int(head.sum()), "tail_nnz": int(tail_row.size),
                 "chunks": int(starts.size), "tail_count": int(arrays["tail_rows"].size)}
    return Plan(NAME, arrays, constants)


def describe_split(plan: Plan) -> str:
    """One line: how the plan divides the matrix between the two passes."""
    c = plan.constants
    share = c["ell_nnz"] / c["nnz"] if c["nnz"] else 1.0
    return (f"ELL width {c['width']} holds {100 * share:.0f} % of {c['nnz']} nonzeros; "
            f"{c['tail_count']} rows spill {c['tail_nnz']} to {c['chunks']} COO chunks of <= {c['chunk']}")


# ---- emulation: the kernels' reads, in NumPy -----------------------------------------------

def ell_part(plan: Plan, x32: np.ndarray) -> np.ndarray:
    """fp32 sums over each row's first min(row_len, W) slots (padding never read)."""
    a, c = plan.arrays, plan.constants
    count = np.minimum(a["row_len"].astype(np.int64), c["width"])
    rows = np.repeat(np.arange(c["m"]), count)
    first = np.cumsum(count) - count
    slots = np.arange(rows.size) - np.repeat(first, count)
    mat = sp.csr_matrix((a["ell_vals"][slots, rows].astype(np.float32), a["ell_cols"][slots, rows],
                         np.append(first, rows.size)), shape=(c["m"], c["k"]))
    return np.asarray(mat @ x32, dtype=np.float32)


def chunk_partials(plan: Plan, x32: np.ndarray) -> np.ndarray:
    """Each chunk's fp32 partial sum, one row per chunk."""
    a, c = plan.arrays, plan.constants
    mat = sp.csr_matrix((a["tail_vals"].astype(np.float32), a["tail_cols"], a["chunk_ptr"]),
                        shape=(c["chunks"], c["k"]))
    return np.asarray(mat @ x32, dtype=np.float32)


def add_once(y: np.ndarray, rows: np.ndarray, partial: np.ndarray):
    """The tail kernel's atomic add: fp32 in fp32; fp16 as the partial rounded to half, then one
    correctly rounded half addition (float64 holds the sum of two halves exactly)."""
    if y.dtype == np.float16:
        y[rows] = (y[rows].astype(np.float64) + partial.astype(np.float16).astype(np.float64)).astype(np.float16)
    else:
        y[rows] += partial


def spmm(plan: Plan, x: np.ndarray, *, relu: bool = False) -> np.ndarray:
    """Y from the plan's arrays alone, pass by pass as the kernels compute it."""
    a, c = plan.arrays, plan.constants
    dtype = a["ell_vals"].dtype
    x32 = np.asarray(x, dtype=np.float32).reshape(c["k"], -1)
    # Pass 1 (ELL): every row; bias; ReLU only for rows without a tail; one store in storage dtype.
    y = ell_part(plan, x32)
    if "bias" in a:
        y += a["bias"][:, None]
    if relu:
        whole = a["row_len"] <= c["width"]
        y[whole] = np.fmax(y[whole], 0.0)  # fmaxf: a NaN becomes 0, as on the GPU
    y = y.astype(dtype)
    # Pass 2 (COO): each chunk's partial added once per (row, column); a row's chunks in order.
    partial = chunk_partials(plan, x32)
    rank = np.arange(c["chunks"]) - np.searchsorted(a["chunk_row"], a["chunk_row"], side="left")
    for j in range(int(rank.max()) + 1 if rank.size else 0):  # a loop over chunk ranks, not rows
        take = rank == j
        add_once(y, a["chunk_row"][take], partial[take])
    # Pass 3: ReLU of the rows the tail touched.
    if relu:
        t = a["tail_rows"]
        y[t] = np.fmax(y[t], 0).astype(dtype)
    return y
