"""`.npz` archives written by `scipy.sparse.save_npz` (any of its formats: csr, csc, coo, bsr, dia).

The archive is untrusted: its zip directory and each member's .npy header are read here, every
member's size is checked against its header and the decompression limit before its bytes are
read, no member is unpickled, and every array is checked (`_arrays`) before the matrix is built.
scipy.sparse.load_npz is never called: its converters trust the arrays and crash on bad ones.
"""
from __future__ import annotations

import io
import lzma
import math
import struct
import zipfile
import zlib

import numpy as np

from ..errors import FormatError
from ._arrays import FORMATS, MEMBERS, Arrays, build
from ._files import MAX_DECOMPRESSED_ENV, READ_CHUNK, check_shape, max_decompressed, read_bytes
from ._text import value_dtype

ARCHIVE = "a scipy.sparse.save_npz archive"
# what reading a damaged zip member can raise: zipfile's own errors, its decompressors' (zlib,
# bz2 as OSError, lzma), the .npy header parser's ValueError, an encrypted member's RuntimeError
_DAMAGE = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, zlib.error, lzma.LZMAError,
           RuntimeError, NotImplementedError, ValueError, struct.error)


def read(path, *, dtype=np.float32):
    """Read a save_npz archive (gzip'd or not) into canonical CSR: duplicates summed, indices sorted."""
    dt = value_dtype(dtype)
    data = read_bytes(path)
    if not data:
        raise FormatError(path, None, ARCHIVE, "an empty file")
    archive = _Archive(data, path)
    fmt = archive.format()
    a = Arrays(path, archive.array, lambda name: f"member {name}.npy")
    shape = a.shape()
    members = ("data", "coords") if fmt == "coo" and archive.array("coords") is not None else ("data",) + MEMBERS[fmt]
    for name in members:
        a.get(name)  # read every member now, so that the shape is judged against all of them
    check_shape(path, shape, archive.content, source="member shape.npy")
    return build(fmt, a, shape, dt, path)


class _Archive:
    """The .npy members of a zip, each read once, at most the decompression limit in all."""

    def __init__(self, data: bytes, path):
        self.path = path
        self.budget = max_decompressed()
        self.content = 0  # bytes of members read so far: what backs the shape
        self.cache = {}
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
        except _DAMAGE as e:
            raise FormatError(path, None, f"{ARCHIVE} (a zip of .npy members)", f"{type(e).__name__}: {e}") from None
        self.names = self.zip.namelist()

    def fail(self, name, expected, found):
        raise FormatError(self.path, None, f"member {name}.npy: {expected}", found)

    def format(self) -> str:
        a = self.array("format")
        if a is None:
            raise FormatError(self.path, None, f"{ARCHIVE} (a member format.npy)",
                              f"members {', '.join(self.names[:8]) or 'none'}")
        if a.dtype.kind not in "SU" or a.ndim != 0:
            self.fail("format", "a 0-d string array", f"dtype {a.dtype}, shape {a.shape}")
        value = a.item()
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        if text not in FORMATS:
            self.fail("format", f"one of {', '.join(FORMATS)}", repr(text[:40]))
        return text

    def array(self, name):
        """The member `name`.npy as an array, or None when the archive has none."""
        if name in self.cache:
            return self.cache[name]
        try:
            info = self.zip.getinfo(name + ".npy")
        except KeyError:
            self.cache[name] = None
            return None
        if info.file_size > self.budget - self.content:
            self.fail(name, f"at most {self.budget - self.content} more bytes after decompression "
                      f"(the limit {MAX_DECOMPRESSED_ENV})", f"{info.file_size} bytes")
        try:
            a = self._read(name, info)
        except FormatError:
            raise
        except _DAMAGE as e:
            self.fail(name, "an intact .npy member", f"{type(e).__name__}: {e}")
        self.content += info.file_size
        self.cache[name] = a
        return a

    def _read(self, name, info) -> np.ndarray:
        with self.zip.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                self.fail(name, ".npy format version 1.0 or 2.0", f"version {version[0]}.{version[1]}")
            if dtype.kind not in "biufcSU" or dtype.itemsize == 0 or dtype.hasobject:
                self.fail(name, "an array of numbers or a string (no objects, records or pickles)", f"dtype {dtype}")
            nbytes = math.prod(shape) * dtype.itemsize
            stored = info.file_size - f.tell()  # zipfile yields at most the directory's size
            if nbytes > stored:
                self.fail(name, f"{nbytes} bytes of data for its header's shape {shape} and dtype {dtype}",
                          f"at most {stored} bytes (the zip directory's size)")
            parts, got = [], 0
            while got < nbytes:
                part = f.read(min(READ_CHUNK, nbytes - got))
                if not part:
                    break
                parts.append(part)
                got += len(part)
            if got < nbytes:
                self.fail(name, f"{nbytes} bytes of data", f"{got} bytes (truncated)")
            if f.read(1):  # reading to the end also makes zipfile check the CRC
                self.fail(name, f"{nbytes} bytes of data", "more bytes after them")
        flat = np.frombuffer(b"".join(parts), dtype, math.prod(shape))
        return flat.reshape(shape, order="F" if fortran else "C")
