"""Row panels cut into K chunks, as the `panel_spmm` kernel reads them.

A panel is `rows` consecutive rows of A; a chunk is `kc` consecutive columns (the rows of X one
staged tile holds). The nonzeros are stored segment by segment, a segment being one panel's
entries in one chunk, row by row inside it, columns ascending. So one thread block stages a whole
segment with a single contiguous copy, next to the X tile it multiplies.

    rowoff  int32 (panels, chunks, stride): rowoff[p, c, r] is the index in `pairs` where row r of
            panel p starts within chunk c; entry `rows` is the segment's end (stride pads the
            record to 16 bytes with that end, so a record copies with 16-byte moves).
    pairs   fp32: int32 (nnz, 2) = (offset, value bits); fp16: uint32 (nnz,) = offset | half << 16.
            `offset` is (column mod kc) x tile_n: the element offset of the X row inside the staged
            tile, so the kernel adds its lane's column and loads, with no index arithmetic.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan, csr as csr_format

NAME = "panel"


def record_stride(rows: int) -> int:
    """int32 entries per rowoff record: rows + 1 offsets, padded to a multiple of 4 (16 bytes)."""
    return -(-(rows + 1) // 4) * 4


def encode(csr: sp.csr_matrix, dtype: str, *, rows: int, kc: int, tile_n: int,
           bias: np.ndarray | None = None) -> Plan:
    """Encode a canonical CSR matrix into panel segments (see the module docstring)."""
    m, k = csr.shape
    nnz = int(csr.nnz)
    panels, chunks = max(-(-m // rows), 1), max(-(-k // kc), 1)
    if kc * tile_n > 65535 and dtype == "float16":
        raise OverflowError(f"tile of {kc} x {tile_n} elements exceeds the 16-bit offsets of fp16 pairs")
    row_of = np.repeat(np.arange(m, dtype=np.int64), np.diff(csr.indptr))
    cols = np.asarray(csr.indices, dtype=np.int64)
    # Segment-major, then row within the panel; the stable sort keeps columns ascending in a row.
    key = ((row_of // rows) * chunks + cols // kc) * rows + row_of % rows
    order = np.argsort(key, kind="stable")
    starts = np.zeros(panels * chunks * rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=panels * chunks * rows), out=starts[1:])
    stride = record_stride(rows)
    seg = np.arange(panels * chunks, dtype=np.int64)[:, None] * rows
    r = np.minimum(np.arange(stride, dtype=np.int64), rows)[None, :]  # padding repeats the end
    rowoff = starts[seg + r].reshape(panels, chunks, stride).astype(np.int32)

    offsets = (cols[order] % kc) * tile_n
    values = np.asarray(csr.data)[order]
    if dtype == "float16":
        halves = values.astype(np.float16).view(np.uint16).astype(np.uint32)
        pairs = np.zeros(max(nnz, 1), dtype=np.uint32)
        pairs[:nnz] = offsets.astype(np.uint32) | (halves << 16)
    else:
        pairs = np.zeros((max(nnz, 1), 2), dtype=np.int32)
        pairs[:nnz, 0] = offsets
        pairs[:nnz, 1] = values.astype(np.float32).view(np.int32)
    seg_len = starts[(np.arange(panels * chunks) + 1) * rows] - starts[np.arange(panels * chunks) * rows]
    arrays = {"rowoff": rowoff, "pairs": pairs}
    if bias is not None:
        arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    constants = {"m": int(m), "k": int(k), "nnz": nnz, "rows": int(rows), "kc": int(kc), "tile_n": int(tile_n),
                 "panels": int(panels), "chunks": int(chunks), "max_segment": int(seg_len.max(initial=0)),
                 "dtype": dtype}
    return Plan(NAME, arrays, constants)


def decode(plan: Plan) -> Plan:
    """The plain `csr` plan a `panel` plan stands for (the emulator reads it)."""
    a, c = plan.arrays, plan.constants
    rows, chunks, nnz = c["rows"], c["chunks"], c["nnz"]
    rowoff = a["rowoff"].astype(np.int64)
    counts = np.diff(rowoff[:, :, : rows + 1], axis=2).ravel()  # entries per (panel, chunk, row)
    slot = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    panel, rest = np.divmod(slot, chunks * rows)
    chunk, r = np.divmod(rest, rows)
    if c["dtype"] == "float16":
        p = a["pairs"][:nnz]
        offsets = (p & 0xFFFF).astype(np.int64)
        values = (p >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    else:
        offsets = a["pairs"][:nnz, 0].astype(np.int64)
        values = a["pairs"][:nnz, 1].view(np.float32)
    row = panel * rows + r
    col = chunk * c["kc"] + offsets // c["tile_n"]
    mat = sp.csr_matrix((values, (row, col)), shape=(c["m"], c["k"]))
    mat.sort_indices()
    arrays = {"indptr": mat.indptr.astype(np.int32), "indices": mat.indices.astype(np.int32),
              "values": mat.data.astype(np.dtype(c["dtype"]))}
    if "bias" in a:
        arrays["bias"] = a["bias"]
    return Plan(csr_format.NAME, arrays, {"m": c["m"], "k": c["k"], "nnz": nnz})
