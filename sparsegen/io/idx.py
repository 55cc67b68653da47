"""MNIST IDX image files: big-endian int32 magic 2051 (0x00000803), n, rows, cols, then n*rows*cols
unsigned bytes, image-major, each image row-major.

Returns the (n, rows*cols) CSR of pixel/255; order="C" flattens each image row-major (MNIST's own
order), order="F" column-major (the Graph Challenge inputs' pixel order). limit=k reads only the
first k images (and only their bytes, so a gzip'd file is decompressed no further).
"""
from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ._files import Source, check_shape
from ._text import indptr_of_rows, make_csr, value_dtype

IMAGES = 2051
_KNOWN = {2049: "an IDX labels file", 2051: "an IDX image file"}


def read(path, *, limit=None, order="C", dtype=np.float32):
    """Read an IDX image file (gzip'd or not); see the module docstring."""
    dt = value_dtype(dtype)
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' (row-major) or 'F' (column-major), not {order!r}")
    if limit is not None and (int(limit) != limit or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
    with Source(path) as f:
        head = f.read(16)
        n, rows, cols = _header(head, path)
        k = n if limit is None else min(int(limit), n)
        need = k * rows * cols
        what = f"{need} bytes of pixels for {k} images of {rows}x{cols}"
        if f.size is not None and need > f.size - 16:  # a plain file's size settles it before any read
            raise FormatError(path, None, what, f"{f.size - 16} bytes (truncated)")
        payload = f.read(need)
        if len(payload) < need:
            raise FormatError(path, None, what, f"{len(payload)} bytes (truncated)")
        if k == n and f.read(1):
            raise FormatError(path, None, f"{need} bytes of pixels for {n} images (the header's count)",
                              "more bytes after them")
    check_shape(path, (k, rows * cols), 16 + need, source=f"{k} images of {rows}x{cols} pixels")
    pixels = np.frombuffer(payload, np.uint8).reshape(k, rows, cols)
    if order == "F":
        pixels = pixels.transpose(0, 2, 1)
    flat = pixels.reshape(k, rows * cols)
    r, c = np.nonzero(flat)  # row-major order: already canonical CSR order
    vals = (flat[r, c] / 255.0).astype(dt)  # in float64, then rounded once to dt
    return make_csr(vals, c, indptr_of_rows(r, k, path), (k, rows * cols))


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
