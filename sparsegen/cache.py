"""Content-addressed on-disk cache for cubins and encoded plans.

Keys are sha256 hex digests of everything that determines the entry. Each file is an envelope:
magic, payload length, CRC32 of the payload, payload. Writes go to a temporary file in the same
directory and are published with `os.replace`, so readers never see half a file and two writers
of the same key both succeed. A read whose envelope does not check out is a miss: it is logged,
and the caller's next `put` rewrites it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("sparsegen.cache")

MAGIC = b"SGC1"
_HEAD = struct.Struct("<4sQI")  # magic, payload length, crc32
# plan: one request's kernel (selection, source, constants, arrays); format: an encoding shared by the
# plans of every request that reads it (a family's `encoding(spec)`, e.g. the tiles of an LLM weight
# for every N); stats: a matrix's analysis; tune: a tuning winner.
KINDS = {"cubin": ".cubin", "plan": ".plan", "format": ".fmt", "stats": ".stats", "tune": ".json"}
ENV_DIR = "SPARSEGEN_CACHE_DIR"
ENV_DISABLE = "SPARSEGEN_DISABLE_CACHE"


def key(*parts) -> str:
    """sha256 over the parts, each length-prefixed so that ("ab", "c") != ("a", "bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def _checkout_cache() -> Path | None:
    root = Path(__file__).resolve().parent.parent
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
    return os.environ.get(ENV_DISABLE, "").strip().lower() not in ("1", "true", "yes", "on")


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

    def __init__(self, root: Path | str | None = None, active: bool | None = None):
        self.root = Path(root) if root is not None else default_dir()
        self.active = enabled() if active is None else active

    def path(self, kind: str, k: str) -> Path:
        return self.root / kind / k[:2] / (k + KINDS[kind])

    def get(self, kind: str, k: str):
        """The entry's payload (bytes-like), or None on a miss."""
        if not self.active:
            return None
        path = self.path(kind, k)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cache: cannot read %s (%s); treating as a miss", path, exc)
            return None
        payload = unwrap(blob)
        if payload is None:
            log.warning("cache: corrupt or truncated entry %s; it will be rewritten", path)
        return payload

    def put(self, kind: str, k: str, payload: bytes) -> Path | None:
        if not self.active:
            return None
        path = self.path(kind, k)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=KINDS[kind])
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(wrap(payload))
                os.replace(tmp, path)
            except BaseException:
                with _quiet():
                    os.unlink(tmp)
                raise
        except OSError as exc:  # a read-only or full cache must not break compilation
            log.warning("cache: cannot write %s (%s)", path, exc)
            return None
        return path

    def entries(self, kind: str | None = None) -> list[Entry]:
        out = []
        for kd in ([kind] if kind else list(KINDS)):
            base = self.root / kd
            if not base.is_dir():
                continue
            for p in sorted(base.glob(f"*/*{KINDS[kd]}")):
                if p.name.startswith(".tmp-"):
                    continue
                st = p.stat()
                out.append(Entry(kd, p.name[: -len(KINDS[kd])], p, st.st_size, st.st_mtime))
        return out

    def clear(self) -> int:
        """Remove every entry (and stray temporaries); returns how many entries were removed."""
        count = len(self.entries())
        for kd in KINDS:
            shutil.rmtree(self.root / kd, ignore_errors=True)
        return count


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


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
