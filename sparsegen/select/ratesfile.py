"""Fitted rates as data: a JSON rates file per device, read into a typed `Rates`.

A rates file holds every figure the cost models were fitted to or measured for one GPU, with its
provenance (docs/decisions/001-rates-files.md):

    {"schema": 1,
     "device": {what the GPU the rates were measured on reports: name, SMs, clock, ...},
     "measured": {"date", "revision", "sparsegen", "driver", "how"},
     "rates": {"memory": {...}, "launch": {...}, "cublas_fp16": {...}, "csr_fp16": {...},
               "tiles": {...}, "fp32": {...}, "errors": {...}},
     "provenance": {one entry per group of "rates": "source", "inputs", "error"}}

`load(path)` rejects an unknown or missing key anywhere in "rates" (and a missing provenance entry)
with a `FormatError` naming each; `load_or_default(path)` turns that (and a missing file, or another
schema version) into one log line and the default rates.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FormatError

log = logging.getLogger("sparsegen")
SCHEMA = 1
SHIPPED = Path(__file__).resolve().parent / "rates"
DEFAULT_FILE = SHIPPED / "h100-80gb-hbm3.json"
TOP_KEYS = ("schema", "device", "measured", "rates", "provenance")
DEVICE_KEYS = ("name", "compute_capability", "sm_count", "clock_hz", "shared_per_sm", "shared_per_block_optin",
               "registers_per_sm", "l2_bytes", "max_threads_per_sm", "total_memory", "memory_bytes_per_s")


@dataclass(frozen=True)
class Memory:
    copy_bytes_per_s: float  # a device-to-device copy, read + write
    achieved_bytes_per_s: float  # what a kernel streaming W reaches
    atomic_bytes_per_s: float  # fp32 reductions at L2


@dataclass(frozen=True)
class Launch:
    launch_s: float  # a dependent second launch on the same stream
    cluster_s: float  # a thread block cluster's reduction (two barriers, remote reads)
    tiled_floor_s: float  # the shortest time a tile kernel runs
    csr_floor_s: float  # the shortest time a CSR kernel runs (fp16)


@dataclass(frozen=True)
class CublasFp16:
    fixed_s: float  # cuBLAS fp16 on skinny products: a fixed time ...
    bytes_per_s: float  # ... plus its bytes at this rate
    flops: float  # wide products: tensor-core math
    floor_s: float  # never under this
    # per element of K, beyond the bytes: each block runs its K loop in turn, so a long K costs time
    # that W's bytes do not show (absent: a calibration whose products had one K; no such term)
    k_s: float | None = None


@dataclass(frozen=True)
class CsrFp16:
    nonzeros_per_s: float  # narrow products: per-nonzero work
    gather_bytes_per_s: float  # wide products: gathers of X (L1/L2 hits)


@dataclass(frozen=True)
class TileRates:
    """Per-SM cycles an analysed 128 x 64 tile costs a tile kernel when not bound by its bytes."""

    base: float  # per tile, whatever it holds: pipeline steps, zero-fill (CSL) or bitmap decode, loop
    per_column: float  # per column of the block (bn): the X tile's copy, ldmatrix and mma
    per_nonzero: float  # Tiled-CSL's scatter, bitmap's value reads
    fixed_s: float = 0.0  # per launch beyond the launch itself: the pipeline filling, the last wave's tail
    wide: float = 1.0  # x the cycles of wide blocks (bn > 32): N = 64 off the line through N 8-32
    n16: float = 1.0  # x the cycles of 16-column blocks: N = 16 under the line through N = 8, 32


@dataclass(frozen=True)
class Tiles:
    clock_hz: float  # the clock the tile cycles are counted at
    empty_tile_cycles: float  # an empty tile: its offsets and one loop trip
    occupancy_h: float  # the wave model: k resident blocks run at k / (k + h)
    tall_64_wide: float  # 64-row tiles of wide blocks, x the time of 128-row ones
    wide_two_step_scale: float  # a second reduction launch of wide blocks, x its two-step estimate
    tiled_csl_spmm: TileRates
    tiled_bitmap_spmm: TileRates
    tiled_bitmap_spmm_g2: TileRates  # bitmap's register-pair encoding
    # a family only newer calibrations measure; None (absent from the file): not a cost-model candidate
    tiled_lanes_spmm: TileRates | None = None

    def of(self, key: str) -> TileRates | None:
        """The rates of a `rates_key` ("tiled_csl_spmm", "tiled_bitmap_spmm", "tiled_bitmap_spmm.g2",
        "tiled_lanes_spmm"); None for a family this file has no rates for."""
        return getattr(self, key.replace(".", "_"))


@dataclass(frozen=True)
class Line:
    launch_s: float
    flops: float  # useful (CSR) or dense (GEMM) flops per second


@dataclass(frozen=True)
class Fp32:
    csr: Line  # the CSR kernels, 2 nnz n useful flops
    sgemm: Line  # cuBLAS SGEMM of the densified W, TF32 off
    tf32x3: Line  # dense_tile_spmm on 3xTF32 tensor cores
    f16x3: Line  # dense_tile_spmm where it takes 3xFP16
    epilogue_s: float  # the dense path's bias/ReLU pass: one more launch ...
    epilogue_bytes_per_s: float  # ... reading and writing Y
    sgemm_margin: float  # SGEMM taken when predicted this many times faster than the CSR kernels
    tensor_margin: float  # the tensor cores taken when this many times faster than both


@dataclass(frozen=True)
class Errors:
    """The measured error of each sparse candidate's predicted time relative to dense cuBLAS's (a high
    quantile of |log error| of the predicted ratio, as a fraction): a sparse pick must be predicted
    this much faster than dense (docs/decisions/002-dense-margin.md)."""

    tiled_csl_spmm: float
    tiled_bitmap_spmm: float
    tiled_bitmap_spmm_g2: float
    csr: float
    tiled_lanes_spmm: float | None = None  # None: too few cases measured; the largest tile error stands in

    def of(self, key: str) -> float:
        mine = getattr(self, key.replace(".", "_"))
        if mine is None:
            return max(self.tiled_csl_spmm, self.tiled_bitmap_spmm, self.tiled_bitmap_spmm_g2)
        return mine


@dataclass(frozen=True)
class Values:
    memory: Memory
    launch: Launch
    cublas_fp16: CublasFp16
    csr_fp16: CsrFp16
    tiles: Tiles
    fp32: Fp32
    errors: Errors


@dataclass(frozen=True, eq=False)
class Rates:
    """A rates file, read: the fitted values, the device they were measured on, and where they came
    from. Equal (and hashed) by `digest`, the sha256 of the values and the device."""

    values: Values
    device: dict = field(repr=False)  # what the GPU they were measured on reports (DEVICE_KEYS)
    measured: dict = field(repr=False)
    provenance: dict = field(repr=False)
    source: str = ""  # the file, or how the values were derived

    def __getattr__(self, name):  # rates.memory, rates.tiles, ...: the value groups
        if name.startswith("__") or name == "values":
            raise AttributeError(name)
        return getattr(self.values, name)

    @functools.cached_property
    def digest(self) -> str:
        text = json.dumps({"values": plain(self.values), "device": self.device}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def __eq__(self, other):
        return isinstance(other, Rates) and other.digest == self.digest

    def __hash__(self):
        return hash(self.digest)

    @property
    def label(self) -> str:
        """The file's name (or the derivation) for a reason or a log line."""
        return Path(self.source).name if self.source.endswith(".json") else self.source

    def replace(self, source: str | None = None, **groups) -> "Rates":
        """These rates with value groups replaced (`memory=Memory(...)`, ...), and a new source."""
        return Rates(dataclasses.replace(self.values, **groups), self.device, self.measured, self.provenance,
                     self.source if source is None else source)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "device": self.device, "measured": self.measured,
                "rates": plain(self.values), "provenance": self.provenance}


def plain(values) -> dict:
    """The values as the file holds them: nested dicts, an optional group that is None left out, so
    that a file without the group writes back as it was read and keeps its digest (a plan's cache
    key holds it)."""
    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}
    return strip(dataclasses.asdict(values))


# ---- reading ----------------------------------------------------------------------------------

def _number(value, where: str, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise FormatError(path, None, f"{where}: a finite number >= 0", repr(value))
    return float(value)


def _build(cls, data, where: str, path):
    """`cls` (a dataclass of numbers and dataclasses) from `data`, every key checked."""
    if not isinstance(data, dict):
        raise FormatError(path, None, f"{where or 'rates'}: an object", type(data).__name__)
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    optional = {f.name for f in fields if f.default is None}  # absent or null: None
    _check_keys(data, names, where, path, optional)
    out = {}
    for name in names:
        here = f"{where}.{name}" if where else name
        if data.get(name) is None and name in optional:
            out[name] = None
            continue
        kind = next((k for k in typing.get_args(hints[name]) if dataclasses.is_dataclass(k)), hints[name])
        out[name] = _build(kind, data[name], here, path) if dataclasses.is_dataclass(kind) else \
            _number(data[name], here, path)
    return cls(**out)


def _check_keys(data: dict, names, where: str, path, optional=()):
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data and n not in optional]
    if unknown or missing:
        prefix = f"{where}." if where else ""
        found = "; ".join(part for part in (
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(prefix + k for k in unknown)}" if unknown else "",
            f"missing key{'s' if len(missing) > 1 else ''} {', '.join(prefix + k for k in missing)}" if missing else "")
            if part)
        raise FormatError(path, None, f"the keys of {where or 'the file'}: {', '.join(names)}", found)


def from_dict(doc, path="<rates>") -> Rates:
    """A `Rates` from a parsed rates file; FormatError naming every unknown or missing key."""
    if not isinstance(doc, dict):
        raise FormatError(path, None, "a JSON object", type(doc).__name__)
    if doc.get("schema") != SCHEMA:
        raise FormatError(path, None, f"schema {SCHEMA}", f"schema {doc.get('schema')!r}")
    _check_keys(doc, TOP_KEYS, "", path)
    values = _build(Values, doc["rates"], "", path)
    device = doc["device"]
    if not isinstance(device, dict):
        raise FormatError(path, None, "device: an object", type(device).__name__)
    _check_keys(device, DEVICE_KEYS, "device", path)
    provenance = doc["provenance"]
    if not isinstance(provenance, dict):
        raise FormatError(path, None, "provenance: an object", type(provenance).__name__)
    _check_keys(provenance, [f.name for f in dataclasses.fields(Values)], "provenance", path)
    if not isinstance(doc["measured"], dict):
        raise FormatError(path, None, "measured: an object", type(doc["measured"]).__name__)
    return Rates(values, device, doc["measured"], provenance, str(path))


def load(path) -> Rates:
    """Read a rates file; FormatError when it is not one (OSError when it cannot be read). Read once
    per process while the file stays as it is."""
    st = Path(path).stat()
    return _load(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int) -> Rates:
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(path, exc.lineno, "JSON", exc.msg) from None
    return from_dict(doc, path)


_said: set = set()


def say_once(message: str, *args) -> None:
    """Log a warning once per process (the same message is not repeated)."""
    text = message % args if args else message
    if text not in _said:
        _said.add(text)
        log.warning(text)


def default() -> Rates:
    """The shipped rates of the default device (DEFAULT_FILE)."""
    return load(DEFAULT_FILE)


def load_or_default(path) -> Rates:
    """`load(path)`, or, when the file is missing, damaged or of another schema, one log line and the
    default rates."""
    try:
        return load(path)
    except (OSError, UnicodeDecodeError, FormatError) as exc:
        say_once("sparsegen: rates file %s unusable (%s); using the default rates %s", path, exc, DEFAULT_FILE.name)
        return default()


def write(rates: Rates, path) -> Path:
    """Write a rates file atomically (a temporary file in the same directory, then a rename)."""
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(rates.to_dict(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path
