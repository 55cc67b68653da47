"""Getting a file's bytes without trusting the file: regular files only, bounded decompression,
shapes the content can back, and memory asked for before it is allocated.

The limits, all documented in `sparsegen.io`:

- Only regular files are read. A FIFO, a device (/dev/zero), a socket or a directory is a
  FormatError before anything is read, so nothing blocks and nothing reads without end.
- gzip is decompressed as a stream, at most `SPARSEGEN_MAX_DECOMPRESSED_BYTES` bytes (default
  4 GiB); more is a FormatError naming the limit.
- A shape is allocated for (row pointers, per-row and per-column statistics) only when the
  content backs it: rows + cols <= 2**22 + 16 * (bytes of content, after decompression). A
  larger shape is a FormatError; a 17-byte line cannot ask for 10**18 rows.
- An allocation larger than the memory this machine has available is a SparsegenError that says
  how much it needs, not a MemoryError.
"""
from __future__ import annotations

import io
import os
import stat
import zlib
from pathlib import Path

from ..errors import FormatError, SparsegenError

GZIP_MAGIC = b"\x1f\x8b"
MAX_DECOMPRESSED_ENV = "SPARSEGEN_MAX_DECOMPRESSED_BYTES"
DEFAULT_MAX_DECOMPRESSED = 4 << 30
FREE_DIMS = 1 << 22  # rows + cols any file may declare: 32 MiB of int64 row pointers
DIMS_PER_BYTE = 16  # beyond that, each byte of content backs 16 rows or columns
READ_CHUNK = 1 << 24  # stream reads go by this many bytes, so a claimed size is never allocated at once


# ---------------------------------------------------------------------------------------- limits

def max_decompressed() -> int:
    """The decompression limit in bytes: SPARSEGEN_MAX_DECOMPRESSED_BYTES, else 4 GiB."""
    text = os.environ.get(MAX_DECOMPRESSED_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_DECOMPRESSED
    if not text.isascii() or not text.isdigit() or int(text) <= 0:
        raise SparsegenError(f"{MAX_DECOMPRESSED_ENV} must be a positive whole number of bytes, not {text!r}")
    return int(text)


def dims_limit(content_bytes: int) -> int:
    """The largest rows + cols that `content_bytes` bytes of content back."""
    return FREE_DIMS + DIMS_PER_BYTE * int(content_bytes)


def check_shape(path, shape, content_bytes: int, line=None, source: str = "") -> tuple[int, int]:
    """shape as ints when its content backs it (see the module docstring), else FormatError."""
    m, n = (int(x) for x in shape)
    limit = dims_limit(content_bytes)
    if m + n > limit:
        raise FormatError(path, line, f"a shape that {content_bytes} bytes of content back "
                          f"(rows + cols <= {limit}: 2**22 + {DIMS_PER_BYTE} per byte)",
                          f"{m} x {n}" + (f" ({source})" if source else ""))
    return m, n


def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable, capped by a cgroup v2 limit; None if unknown."""
    avail = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit.isdigit() and used.isdigit():
            avail = min(avail, max(int(limit) - int(used), 0))
    except OSError:
        pass
    return avail


def human_bytes(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def require_memory(nbytes: int, what: str, path=None):
    """SparsegenError when `what` needs more than the memory available now (a lower bound is fine)."""
    avail = available_memory()
    if avail is not None and nbytes > avail:
        where = f"{path}: " if path is not None else ""
        raise SparsegenError(f"{where}{what} needs about {human_bytes(nbytes)} of memory; "
                             f"{human_bytes(avail)} is available")


# ----------------------------------------------------------------------------------------- files

def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path):
    """(binary file object, size in bytes) of a regular file; anything else is a FormatError.

    The type is checked by stat before opening and by fstat after (the path may change between),
    and the open never blocks: O_NONBLOCK makes opening a FIFO return at once.
    """
    p = Path(os.fspath(path))
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FormatError(p, None, "an existing file", "no such file") from None
    except OSError as e:
        raise FormatError(p, None, "a readable file", e.strerror or str(e)) from None
    except ValueError as e:  # a NUL byte in the name
        raise FormatError(repr(str(p)), None, "a file name", str(e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(p, None, "a regular file", _kind(st.st_mode))
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FormatError(p, None, "a readable file", e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
    except OSError as e:  # pragma: no cover - fstat on an open descriptor does not fail in practice
        os.close(fd)
        raise FormatError(p, None, "a readable file", e.strerror or str(e)) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FormatError(p, None, "a regular file", _kind(st.st_mode))
    return os.fdopen(fd, "rb"), st.st_size


def read_bytes(path) -> bytes:
    """The file's bytes, gunzipped (bounded) when they start with the gzip magic, whatever the name."""
    f, size = open_regular(path)
    p = Path(os.fspath(path))
    with f:
        require_memory(size, f"reading a file of {size} bytes", p)
        try:
            raw = f.read(size)  # a regular file's size: a file that grows meanwhile is read as it was
        except OSError as e:
            raise FormatError(p, None, "a readable file", e.strerror or str(e)) from None
    if raw[:2] == GZIP_MAGIC:
        return gunzip(raw, p)
    if p.name.lower().endswith(".gz"):
        raise FormatError(p, None, "gzip data (the name ends in .gz)", f"first bytes {raw[:4]!r}")
    return raw


def gunzip(raw, path, limit: int | None = None) -> bytes:
    """The concatenated members of a gzip stream, at most `limit` bytes (default: max_decompressed());
    damage, truncation and output past the limit are FormatErrors (see `Gunzip`)."""
    limit = max_decompressed() if limit is None else limit
    out = Gunzip(io.BytesIO(raw), path).read(limit + 1)
    if len(out) > limit:
        raise FormatError(path, None, f"at most {limit} bytes after decompression "
                          f"(the limit {MAX_DECOMPRESSED_ENV})", "more")
    return out


class Gunzip:
    """A gzip stream decompressed as it is read, member after member, each by zlib (RFC 1952:
    reserved header flags and a header CRC are checked, which Python's gzip module skips). Zero
    padding after a member is allowed, as gzip.decompress allows it; other data must be a member."""

    def __init__(self, f, path):
        self.f, self.path = f, path
        self.d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self.pending = b""  # compressed bytes read but not yet given to the decompressor
        self.end = False

    def _damaged(self, found):
        raise FormatError(self.path, None, "a complete gzip stream", found)

    def _read_file(self) -> bytes:
        try:
            return self.f.read(1 << 16)
        except OSError as e:
            raise FormatError(self.path, None, "a readable file", e.strerror or str(e)) from None

    def _input(self) -> bytes:
        if self.d.unconsumed_tail:
            return self.d.unconsumed_tail
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return self._read_file()

    def _next_member(self):
        # what follows a member: input the decompressor did not use, then the rest of the file
        rest = (self.d.unused_data + self.d.unconsumed_tail + self.pending).lstrip(b"\0")
        self.pending = b""
        while len(rest) < 2:
            more = self._read_file()
            if not more:
                if rest:
                    self._damaged("1 byte of other data after a member")
                self.end = True
                return
            rest = (rest + more).lstrip(b"\0")
        if rest[:2] != GZIP_MAGIC:
            raise FormatError(self.path, None, "a complete gzip stream (members only)", "other data after a member")
        self.d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self.pending = rest

    def read(self, n: int) -> bytes:
        """Up to n bytes; fewer only at the end of the last member."""
        parts, got = [], 0
        while got < n and not self.end:
            if self.d.eof:
                self._next_member()
                continue
            data = self._input()
            try:
                piece = self.d.decompress(data, min(n - got, READ_CHUNK))
            except zlib.error as e:
                self._damaged(f"zlib.error: {e}")
            if not piece and not data and not self.d.eof:
                self._damaged("EOFError: the stream ends before its end-of-stream marker")
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)


class Source:
    """A stream of the file's bytes, gunzipped when it starts with the gzip magic, for readers
    that need only a prefix (IDX with limit=). `size` is the plain file's size, or None for gzip."""

    def __init__(self, path):
        self.path = Path(os.fspath(path))
        self.file, size = open_regular(path)
        head = self.file.read(2)
        self.file.seek(0)
        self.gzip = head == GZIP_MAGIC
        self.size = None if self.gzip else size
        self.stream = Gunzip(self.file, self.path) if self.gzip else self.file
        self.consumed = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer only at the end), read in bounded chunks; gzip damage and
        decompressed output past the limit are FormatErrors."""
        limit = max_decompressed() if self.gzip else None
        if limit is not None and self.consumed + n > limit + 1:
            n = limit + 1 - self.consumed  # read up to the limit, then say so
        parts, got = [], 0
        while got < n:
            part = self.stream.read(min(READ_CHUNK, n - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
        self.consumed += got
        if limit is not None and self.consumed > limit:
            raise FormatError(self.path, None, f"at most {limit} bytes after decompression "
                              f"(the limit {MAX_DECOMPRESSED_ENV})", "more")
        return b"".join(parts)
