"""MNIST IDX image files: big-endian int32 magic 2051 (0x00000803), n, rows, cols, then n*rows*cols
unsigned bytes, image-major, each image row-major.

Returns the (n, rows*cols) CSR of pixel/255; order="C" flattens each image row-major (MNIST's own
order), order="F" column-major (the Graph Challenge inputs' pixel order). limit=k reads only the
first k images (and only their bytes, so a gzip'd file is decompressed no further).
"""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ._text import make_csr, open_binary, read_prefix, value_dtype

IMAGES = 2051
_KNOWN = {2049: "an IDX labels file", 2051: "an IDX image file"}


def read(path, *, limit=None, order="C", dtype=np.float32):
    """Read an IDX image file (gzip'd or not); see the module docstring."""
    dt = value_dtype(dtype)
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' (row-major) or 'F' (column-major), not {order!r}")
    if limit is not None and (int(limit) != limit or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
    with open_binary(path) as f:
        head = read_prefix(f, 16, path)
        n, rows, cols = _header(head, path)
        k = n if limit is None else min(int(limit), n)
        need = k * rows * cols
        payload = read_prefix(f, need, path)
        if len(payload) < need:
            raise FormatError(path, None, f"{need} bytes of pixels for {k} images of {rows}x{cols}",
                              f"{len(payload)} bytes (truncated)")
        if k == n and read_prefix(f, 1, path):
            raise FormatError(path, None, f"{need} bytes of pixels for {n} images (the header's count)",
                              "more bytes after them")
    pixels = np.frombuffer(payload, np.uint8).reshape(k, rows, cols)
    if order == "F":
        pixels = pixels.transpose(0, 2, 1)
    flat = pixels.reshape(k, rows * cols)
    r, c = np.nonzero(flat)  # row-major order: already canonical CSR order
    indptr = np.zeros(k + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=k), out=indptr[1:])
    vals = (flat[r, c] / 255.0).astype(dt)  # in float64, then rounded once to dt
    return make_csr(vals, c, indptr, (k, rows * cols))


def _header(head, path):
    if len(head) < 4:
        raise FormatError(path, None, "an IDX image file (magic 2051)",
                          "an empty file" if not head else f"{len(head)} bytes (truncated header)")
    magic = int.from_bytes(head[:4], "big")
    if magic != IMAGES:
        what = _KNOWN.get(magic, "an unknown magic")
        raise FormatError(path, None, f"an IDX image file (magic {IMAGES} = 0x{IMAGES:08x})",
                          f"magic {magic} = 0x{magic:08x} ({what})")
    if len(head) < 16:
        raise FormatError(path, None, "a 16-byte IDX image header", f"{len(head)} bytes (truncated)")
    n, rows, cols = (int(x) for x in np.frombuffer(head, ">u4", 3, 4))
    return n, rows, cols
