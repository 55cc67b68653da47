"""Content-addressed on-disk cache for cubins and encoded plans.

Keys are sha256 hex digests of everything that determines the entry. Each file is an envelope:
magic, payload length, CRC32 of the payload, payload. Writes go to a temporary file in the same
directory and are published with `os.replace`, so readers never see half a file and two writers
of the same key both succeed; whatever sits in an entry's way is removed first. A read whose
envelope does not check out is a miss: it is logged, and the caller's next `put` rewrites it.

Only regular files are read (never through a link, never more than the size cap), and a cubin
entry must be a CUDA ELF file for the requested arch. The CRC detects damage, not forgery: whoever
can write the directory chooses the code that runs on the GPU, so a directory that is not this
user's alone is refused (docs/cache.md). Writes evict the least recently used entries down to
`SPARSEGEN_CACHE_MAX_BYTES`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import struct
import tempfile
import time
import zlib
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import SparsegenError

log = logging.getLogger("sparsegen.cache")

MAGIC = b"SGC1"
_HEAD = struct.Struct("<4sQI")  # magic, payload length, crc32
# plan: one request's kernel (selection, source, constants, arrays); format: an encoding shared by the
# plans of every request that reads it (a family's `encoding(spec)`, e.g. the tiles of an LLM weight
# for every N); stats: a matrix's analysis; tune: a tuning winner.
KINDS = {"cubin": ".cubin", "plan": ".plan", "format": ".fmt", "stats": ".stats", "tune": ".json"}
ENV_DIR = "SPARSEGEN_CACHE_DIR"
ENV_DISABLE = "SPARSEGEN_DISABLE_CACHE"
ENV_MAX_BYTES = "SPARSEGEN_CACHE_MAX_BYTES"
# The largest LLM benchmark weight (12288 x 49152 at 50 %) leaves 3.1 GB of encodings that all its N
# share; a smaller cap would evict them between one N and the next.
DEFAULT_MAX_BYTES = 4 << 30
TMP_PREFIX = ".tmp-"
TMP_MAX_AGE = 3600.0  # seconds: a temporary file this old belongs to a writer that died
# O_NOFOLLOW: a link swapped in after the lstat is not followed; O_NONBLOCK: a FIFO swapped in does
# not block the open (fstat then rejects it). Both are POSIX; os.open's descriptors are close-on-exec.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def key(*parts) -> str:
    """sha256 over the parts, each length-prefixed so that ("ab", "c") != ("a", "bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def _checkout_cache(root: Path | None = None) -> Path | None:
    """`cache/` of the checkout at `root` (default: the one this package runs from), or None."""
    root = Path(__file__).resolve().parent.parent if root is None else root
    if (root / "pyproject.toml").is_file() and (root / "cache").is_dir():
        return root / "cache"
    return None


def default_dir() -> Path:
    """`SPARSEGEN_CACHE_DIR`; else `cache/` of the checkout we run from; else the XDG cache."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    checkout = _checkout_cache()
    if checkout is not None:
        return checkout
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparsegen"


def enabled() -> bool:
    """False when SPARSEGEN_DISABLE_CACHE is 1, true, yes or on; True when it is unset, empty, 0, false,
    no or off (any case, spaces around ignored); anything else is an error."""
    raw = os.environ.get(ENV_DISABLE, "")
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return False
    if value in ("", "0", "false", "no", "off"):
        return True
    raise SparsegenError(f"{ENV_DISABLE}={raw!r}: expected 1, true, yes or on (cache off), "
                         "or 0, false, no, off or empty (cache on)")


def max_bytes() -> int:
    """`SPARSEGEN_CACHE_MAX_BYTES`, a whole number of bytes; else DEFAULT_MAX_BYTES."""
    raw = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not re.fullmatch(r"[0-9]+", raw):
        raise SparsegenError(f"{ENV_MAX_BYTES}={raw!r}: expected a whole number of bytes, e.g. {DEFAULT_MAX_BYTES}")
    return int(raw)


def wrap(payload: bytes) -> bytes:
    return _HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def unwrap(blob: bytes):
    """The payload (a zero-copy view), or None when the envelope is foreign, truncated or corrupt."""
    if len(blob) < _HEAD.size:
        return None
    magic, length, crc = _HEAD.unpack_from(blob)
    payload = memoryview(blob)[_HEAD.size:]
    if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


@dataclass(frozen=True)
class Entry:
    kind: str
    key: str
    path: Path
    size: int
    mtime: float


class Cache:
    """One cache directory with a subdirectory per kind of entry."""

    def __init__(self, root: Path | str | None = None, active: bool | None = None, limit: int | None = None):
        self.root = Path(root) if root is not None else default_dir()
        self.active = enabled() if active is None else active
        self.max_bytes = max_bytes() if limit is None else limit

    def path(self, kind: str, k: str) -> Path:
        return self.root / kind / k[:2] / (k + KINDS[kind])

    def refusal(self) -> str | None:
        """Why this directory must not be used, or None. Whoever can write it chooses the code that
        runs on the GPU, so it must be this user's and writable by no one else."""
        return _untrusted(self.root)

    def _usable(self) -> bool:
        return self.active and self._trusted()

    def _trusted(self) -> bool:
        why = self.refusal()
        if why is not None and (str(self.root), why) not in _WARNED:
            _WARNED.add((str(self.root), why))
            log.warning("cache: not using %s: %s", self.root, why)
        return why is None

    def get(self, kind: str, k: str, arch: str | None = None):
        """The entry's payload (a read-only bytes-like view), or None on a miss. A cubin entry must
        also be a CUDA ELF file, for `arch` when it is given."""
        if not self._usable():
            return None
        path = self.path(kind, k)
        try:
            payload = _payload(path, self.max_bytes)
            if kind == "cubin" and (problem := cubin_problem(payload, arch)):
                raise _Skip(f"not a cubin for {arch or 'any arch'}: {problem}")
        except FileNotFoundError:
            return None
        except (_Skip, OSError) as exc:
            log.warning("cache: skipping %s (%s); treating it as a miss", path, exc)
            return None
        _touch(path)
        return payload

    def put(self, kind: str, k: str, payload: bytes) -> Path | None:
        """Stores `payload`; returns its path, or None when the cache is off or cannot be written
        (logged: a read-only or full cache must not break compilation). Whatever sits in the way of
        the entry or its directories (a file, a FIFO, a link, a directory) is removed first."""
        if not self._usable():
            return None
        path, blob = self.path(kind, k), wrap(payload)
        if len(blob) > self.max_bytes:
            log.warning("cache: not storing %s: %d bytes, over the %d-byte bound (%s)", path, len(blob),
                        self.max_bytes, ENV_MAX_BYTES)
            return None
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            _real_dir(path.parent.parent)
            _real_dir(path.parent)
            _make_way(path)
            _publish(path, blob, KINDS[kind])
        except OSError as exc:
            log.warning("cache: cannot write %s (%s)", path, exc)
            return None
        self.evict(keep=path)
        return path

    def entries(self, kind: str | None = None) -> list[Entry]:
        """Every entry: regular files only, found without following links, temporaries left out."""
        found = (_entry(*item) for item in self._files([kind] if kind else list(KINDS)))
        return [e for e in found if e is not None]

    def _files(self, kinds):
        """(kind, DirEntry, lstat) of each regular file in a kind's shard directories; links are not
        followed (_listing lists real directories only)."""
        for kd in kinds:
            for shard in _listing(self.root / kd):
                yield from ((kd, f, st) for f, st in _regular_files(shard.path))

    def evict(self, keep: Path | None = None, now: float | None = None) -> int:
        """Removes temporary files older than TMP_MAX_AGE (their writer died), then the least recently
        used entries (the oldest mtime: a hit touches its entry), never `keep`, until the entries hold
        at most `max_bytes`. Returns how many files it removed."""
        now = time.time() if now is None else now
        files = list(self._files(list(KINDS)))
        stale = [f.path for _, f, st in files if f.name.startswith(TMP_PREFIX) and now - st.st_mtime > TMP_MAX_AGE]
        entries = [e for e in (_entry(*item) for item in files) if e is not None]
        return sum(_remove(Path(p)) for p in stale) + self._shrink(entries, keep)

    def _shrink(self, entries: list[Entry], keep: Path | None) -> int:
        total, removed = sum(e.size for e in entries), 0
        for e in sorted(entries, key=lambda e: (e.mtime, str(e.path))):
            if total <= self.max_bytes:
                break
            if e.path != keep and _remove(e.path):
                total -= e.size
                removed += 1
        return removed

    def clear(self) -> int:
        """Empties each kind's directory of whatever is in it: entries, temporaries, and anything in
        an entry's place (a directory, a FIFO, a link: the link, never its target), or in the place of
        a kind's or shard's directory. Returns how many of those names it removed; one it cannot
        remove is logged and not counted."""
        return sum(_clear(self.root / kd, 2) for kd in KINDS)


_WARNED: set = set()  # (directory, reason) already logged by this process


def _untrusted(root: Path) -> str | None:
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None  # the first write makes it, private
    except OSError as exc:
        return f"cannot stat it ({exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"it is not a directory ({stat.filemode(st.st_mode)})"
    if st.st_mode & 0o022:
        return f"it is group- or world-writable ({stat.filemode(st.st_mode)}); make it private: chmod 700 {root}"
    uid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}, not to this user (uid {uid})"
    return None


class _Skip(Exception):
    """An entry that must not be used: the message says why."""


def _payload(path: Path, limit: int):
    payload = unwrap(_read_entry(path, limit))
    if payload is None:
        raise _Skip("corrupt or truncated; it will be rewritten")
    return payload


def _read_entry(path: Path, limit: int):
    """The bytes of the regular file at `path` (a read-only view), read without following a link and
    never more than `limit` bytes. FileNotFoundError is a plain miss; _Skip names what is in the way."""
    for directory in (path.parent.parent, path.parent):
        mode = os.lstat(directory).st_mode
        if not stat.S_ISDIR(mode):
            raise _Skip(f"{directory} is not a directory but {stat.filemode(mode)}")
    _check_regular(os.lstat(path), limit)
    fd = os.open(path, _READ_FLAGS)
    try:
        st = os.fstat(fd)
        _check_regular(st, limit)
        with open(fd, "rb", closefd=False) as fh:
            return fh.read(st.st_size)  # fewer bytes when the file shrank since: the envelope check fails
    finally:
        os.close(fd)


def _check_regular(st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _Skip(f"not a regular file: {stat.filemode(st.st_mode)}")
    if st.st_size > limit:
        raise _Skip(f"{st.st_size} bytes, over the {limit}-byte bound ({ENV_MAX_BYTES})")


def _touch(path: Path) -> None:
    """A hit's new mtime orders eviction; a read-only cache keeps its times."""
    with suppress(OSError):
        os.utime(path)


def _real_dir(path: Path) -> None:
    """Makes `path` a directory of ours that we can write: a file, FIFO or link in its place (the
    link, never its target) is removed, a missing one is made private, a read-only one is opened."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISDIR(mode):
        os.unlink(path)
        mode = None
    if mode is None:
        with suppress(OSError):  # another writer may make it first
            os.mkdir(path, 0o700)
    _open_up(path)


def _make_way(path: Path) -> None:
    """os.replace puts the entry in place of a file, FIFO or link, but not of a directory."""
    with suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            _remove(path)


def _publish(path: Path, blob: bytes, suffix: str) -> None:
    """Writes a temporary file next to `path` and renames it over `path`; the temporary file is gone
    afterwards whatever happens."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def _clear(path: Path, depth: int) -> int:
    """Removes `path`, emptying it name by name first when it is a real directory `depth` levels above
    the entries; returns how many names it removed at entry level or in a directory's place."""
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return 0
    if depth == 0 or not is_dir:
        return _remove(path)
    _open_up(path)
    removed = sum(_clear(Path(e.path), depth - 1) for e in _listing(path))
    with suppress(OSError):
        os.rmdir(path)
    return removed


def _remove(path: Path) -> int:
    """1 once `path` (a link itself, never what it points to) is gone; 0, logged, when it stays."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            _open_up_tree(path)
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:  # another process removed it first
        return 0
    except OSError as exc:
        log.warning("cache: cannot remove %s (%s)", path, exc)
        return 0
    return 1


def _open_up_tree(top: Path) -> None:
    _open_up(top)
    for parent, dirs, _ in os.walk(top):  # top-down: each directory is opened before it is listed
        for d in dirs:
            _open_up(os.path.join(parent, d))


def _open_up(path) -> None:
    """Gives the owner read, write and search permission on a real directory, so that it can be
    listed and emptied; a link is left alone."""
    with suppress(OSError):
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            os.chmod(path, stat.S_IMODE(mode) | 0o700)


def _entry(kind: str, f: os.DirEntry, st: os.stat_result) -> Entry | None:
    suffix = KINDS[kind]
    if f.name.startswith(TMP_PREFIX) or not f.name.endswith(suffix):
        return None
    return Entry(kind, f.name[: -len(suffix)], Path(f.path), st.st_size, st.st_mtime)


def _regular_files(directory) -> list:
    """(DirEntry, lstat) of each regular file in `directory`; one removed meanwhile is left out."""
    out = []
    for f in _listing(directory):
        with suppress(OSError):
            st = f.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out.append((f, st))
    return out


def _listing(path) -> list:
    """The DirEntry objects of a real directory (not a link to one), by name; none when it is absent
    or unreadable."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return []
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


EM_CUDA = 190
# The ELF64 header up to e_flags: e_ident (magic, class, data, version, OS ABI, ABI version, padding),
# e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags.
_ELF64 = struct.Struct("<4sBBBBB7xHHIQQQI")
_SM_RE = re.compile(r"sm_([0-9]+)[af]?")


def cubin_problem(blob, arch: str | None) -> str | None:
    """Why `blob` is not a cubin for `arch` (for any arch when None), or None when it is one."""
    if len(blob) < _ELF64.size:
        return "shorter than an ELF header"
    magic, elf_class, data, _, _, abi, _, machine, _, _, _, _, flags = _ELF64.unpack_from(blob)
    if magic != b"\x7fELF" or elf_class != 2 or data != 1:
        return "not a 64-bit little-endian ELF file"
    if machine != EM_CUDA:
        return f"e_machine {machine}, not EM_CUDA ({EM_CUDA})"
    sm = cubin_sm(abi, flags)
    if sm is None:
        return f"CUDA ELF ABI version {abi}, whose e_flags sparsegen cannot read"
    if arch is not None and _sm_number(arch) != sm:
        return f"built for sm_{sm}"
    return None


def _sm_number(arch: str) -> int | None:
    """90 for sm_90, sm_90a and sm_90f; None for anything else."""
    match = _SM_RE.fullmatch(arch)
    return int(match.group(1)) if match else None


def cubin_sm(abi_version: int, flags: int) -> int | None:
    """The SM number in a cubin's e_flags (field names from LLVM's BinaryFormat/ELF.h). ABI version 7
    (ELFABIVERSION_CUDA_V1) keeps it in bits 0-7 (EF_CUDA_SM); version 8 (ELFABIVERSION_CUDA_V2, what
    nvcc 13.0 writes for every arch: sm_80 0x06005004, sm_90 0x06005a04, sm_120 0x06007802) in bits
    8-15 (EF_CUDA_SM_MASK). The a/f suffix is not in version 8's flags, so only the number is compared."""
    if abi_version == 7:
        return flags & 0xFF
    if abi_version == 8:
        return (flags >> 8) & 0xFF
    return None


PLAN_MAGIC = b"SGPLAN1\0"
_ALIGN = 64


def pack_arrays(meta: dict, arrays: dict) -> bytes:
    """Plan entries: a JSON header (meta + each array's dtype, shape, offset), then the raw arrays,
    each 64-byte aligned, so a read maps them with np.frombuffer instead of copying or unzipping."""
    layout, offset = {}, 0
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        layout[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset}
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"meta": meta, "arrays": layout}, sort_keys=True).encode()
    start = -(-(len(PLAN_MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
    buf = bytearray(start + offset)
    buf[: len(PLAN_MAGIC)] = PLAN_MAGIC
    buf[len(PLAN_MAGIC): len(PLAN_MAGIC) + 8] = struct.pack("<Q", len(header))
    buf[len(PLAN_MAGIC) + 8: len(PLAN_MAGIC) + 8 + len(header)] = header
    for name, arr in arrays.items():
        at = start + layout[name]["offset"]
        buf[at: at + arr.nbytes] = np.ascontiguousarray(arr).tobytes()
    return bytes(buf)


def unpack_arrays(payload) -> tuple[dict, dict]:
    """Inverse of pack_arrays; the arrays are read-only views of `payload`."""
    view = memoryview(payload)
    if bytes(view[: len(PLAN_MAGIC)]) != PLAN_MAGIC:
        raise ValueError("not a sparsegen plan")
    (hlen,) = struct.unpack_from("<Q", view, len(PLAN_MAGIC))
    header = json.loads(bytes(view[len(PLAN_MAGIC) + 8: len(PLAN_MAGIC) + 8 + hlen]))
    start = -(-(len(PLAN_MAGIC) + 8 + hlen) // _ALIGN) * _ALIGN
    arrays = {}
    for name, spec in header["arrays"].items():
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        arrays[name] = np.frombuffer(view, dtype, count, start + spec["offset"]).reshape(shape)
    return header["meta"], arrays
