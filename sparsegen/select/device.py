"""The GPU selection plans for: what it reports (SMs, clocks, shared memory, registers, L2, memory)
and the fitted rates of its cost models.

`DeviceModel.current()` reads the GPU in use (through `runtime.device_properties`, the only PyCUDA
code) and finds its rates: `SPARSEGEN_RATES` (a file), else a rates file `sparsegen calibrate`
wrote into the cache for this device, driver and sparsegen version, else the shipped file measured
on a GPU of this name, else the nearest shipped file with its bandwidth and compute terms scaled to
this GPU (docs/decisions/003-unknown-device.md; `SPARSEGEN_AUTO_RATES=0` takes the nearest file
unscaled). `DeviceModel.default()` is the device the shipped default rates were measured on, used
where there is no GPU (the emulator, `sparsegen inspect` on a CPU machine).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import ratesfile
from .ratesfile import CublasFp16, CsrFp16, Line, Memory, Rates

ENV_RATES = "SPARSEGEN_RATES"
ENV_AUTO = "SPARSEGEN_AUTO_RATES"


@dataclass(frozen=True, eq=False)
class DeviceModel:
    """What a GPU reports, and the rates its cost models use. Equal (and hashed, and keyed in the
    plan cache) by `digest`: the reported properties and the rates' digest."""

    name: str
    compute_capability: tuple
    sm_count: int
    clock_hz: float  # the clock the device reports (its boost clock)
    shared_per_sm: int  # bytes of shared memory per SM
    shared_per_block_optin: int  # bytes a block may use, opted in
    registers_per_sm: int
    l2_bytes: int
    max_threads_per_sm: int
    total_memory: int
    memory_bytes_per_s: float  # peak: 2 x memory clock x bus width
    rates: Rates

    @classmethod
    def default(cls) -> "DeviceModel":
        return default()

    @classmethod
    def current(cls) -> "DeviceModel":
        return current()

    @classmethod
    def from_properties(cls, props: dict, rates: Rates) -> "DeviceModel":
        return cls(**{k: props[k] for k in ratesfile.DEVICE_KEYS if k != "compute_capability"},
                   compute_capability=tuple(props["compute_capability"]), rates=rates)

    def properties(self) -> dict:
        """The reported properties (a rates file's "device" section)."""
        d = {k: getattr(self, k) for k in ratesfile.DEVICE_KEYS}
        d["compute_capability"] = list(self.compute_capability)
        return d

    @functools.cached_property
    def digest(self) -> str:
        text = json.dumps(self.properties(), sort_keys=True) + self.rates.digest
        return hashlib.sha256(text.encode()).hexdigest()

    def __eq__(self, other):
        return isinstance(other, DeviceModel) and other.digest == self.digest

    def __hash__(self):
        return hash(self.digest)

    def __repr__(self) -> str:  # what a request's repr (and so the plan cache key) carries
        return f"DeviceModel({self.name!r}, rates {self.rates.label}, {self.digest[:16]})"

    def with_rates(self, rates: Rates) -> "DeviceModel":
        return dataclasses.replace(self, rates=rates)

    def describe(self) -> dict:
        return {"name": self.name, "rates": self.rates.source, "rates_digest": self.rates.digest[:16],
                "digest": self.digest[:16], **{k: v for k, v in self.properties().items() if k != "name"}}

    @property
    def text(self) -> str:
        """One line for `sparsegen inspect`: the device and the rates file."""
        measured, source = self.rates.measured, self.rates.source
        when = f"measured {measured.get('date')} at {measured.get('revision')}" if measured.get("date") else ""
        where = f"{Path(source).name} (shipped)" if Path(source).parent == ratesfile.SHIPPED else source
        return (f"{self.name} (sm_{self.compute_capability[0]}{self.compute_capability[1]}, {self.sm_count} SMs, "
                f"{self.memory_bytes_per_s / 1e12:.2f} TB/s peak); rates {where}{f', {when}' if when else ''}")


# ---- the default device ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def default() -> DeviceModel:
    """The device the shipped default rates were measured on (ratesfile.DEFAULT_FILE), with them."""
    rates = ratesfile.default()
    return DeviceModel.from_properties(rates.device, rates)


# ---- the current device ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def current() -> DeviceModel:
    """The GPU in use (SPARSEGEN_DEVICE) with its rates (`rates_for`); LaunchError without a GPU."""
    from .. import runtime

    props = properties_from(runtime.device_properties())
    return DeviceModel.from_properties(props, rates_for(props))


REPORTED = ("sm_count", "shared_per_sm", "shared_per_block_optin", "registers_per_sm", "l2_bytes",
            "max_threads_per_sm", "total_memory")  # read as the device model keeps them


def properties_from(raw: dict) -> dict:
    """A rates file's "device" section (and the driver) from what `runtime.device_properties` read;
    a property the driver did not report is the default device's, and said once."""
    fallback = default().properties()
    missing = sorted(k for k, v in raw.items() if v is None)
    if missing:
        ratesfile.say_once("sparsegen: the GPU did not report %s; using the %s's", ", ".join(missing), fallback["name"])
    props = {k: raw.get(k) or fallback[k] for k in REPORTED}
    memory_khz, bus_bits = raw.get("memory_clock_khz"), raw.get("bus_width_bits")
    props.update(
        name=raw.get("name") or "unknown GPU",
        compute_capability=list(raw.get("compute_capability") or fallback["compute_capability"]),
        clock_hz=1e3 * raw["clock_khz"] if raw.get("clock_khz") else fallback["clock_hz"],
        memory_bytes_per_s=2e3 * memory_khz * bus_bits / 8 if memory_khz and bus_bits else fallback["memory_bytes_per_s"],
        driver=raw.get("driver"))
    return props


def slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (as the benchmark results folders are named)."""
    s = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return s[len("nvidia-"):] if s.startswith("nvidia-") else (s or "unknown-gpu")


def calibrated_path(props: dict, root: Path | None = None) -> Path:
    """Where `sparsegen calibrate` writes this device's rates: the cache, keyed by device name,
    CUDA driver version and sparsegen version."""
    from .._version import __version__
    from ..cache import default_dir

    root = default_dir() if root is None else Path(root)
    return root / "rates" / f"{slug(props['name'])}.driver{props.get('driver')}.sparsegen{__version__}.json"


def shipped() -> list:
    """Every rates file shipped with sparsegen, read (a damaged one is said once and skipped)."""
    out = []
    for path in sorted(ratesfile.SHIPPED.glob("*.json")):
        try:
            out.append(ratesfile.load(path))
        except (OSError, ValueError) as exc:
            ratesfile.say_once("sparsegen: shipped rates file %s unusable (%s); skipped", path.name, exc)
    return out


def rates_for(props: dict, root: Path | None = None) -> Rates:
    """The rates for a device with these properties (the module docstring gives the order)."""
    if os.environ.get(ENV_RATES):
        return ratesfile.load_or_default(os.environ[ENV_RATES])
    calibrated = calibrated_path(props, root)
    if calibrated.is_file():
        try:
            return ratesfile.load(calibrated)
        except (OSError, ValueError) as exc:
            ratesfile.say_once("sparsegen: calibrated rates %s unusable (%s); ignored", calibrated, exc)
    files = shipped() or [ratesfile.default()]
    same = [r for r in files if r.device["name"] == props["name"]]
    if same:
        return same[0]
    near = nearest(files, props)
    if os.environ.get(ENV_AUTO, "1").strip() == "0":
        ratesfile.say_once("sparsegen: no rates file for %s; %s=0: selecting with %s as measured on %s "
                           "(`sparsegen calibrate` measures this GPU)", props["name"], ENV_AUTO, near.label,
                           near.device["name"])
        return near
    rates = scaled(near, props)
    ratesfile.say_once("sparsegen: no rates file for %s; selecting with %s (`sparsegen calibrate` measures this "
                       "GPU; %s=0 takes the file unscaled)", props["name"], rates.source, ENV_AUTO)
    return rates


def nearest(files: list, props: dict) -> Rates:
    """The shipped rates measured on the most similar GPU: the same compute capability major first,
    then the closest reported memory bandwidth (log ratio)."""
    major = list(props["compute_capability"])[0]

    def distance(r: Rates):
        ratio = props["memory_bytes_per_s"] / r.device["memory_bytes_per_s"]
        return (r.device["compute_capability"][0] != major, abs(math.log(ratio)))

    return min(files, key=distance)


def scaled(rates: Rates, props: dict) -> Rates:
    """`rates` carried to another GPU (docs/decisions/003-unknown-device.md): terms bound by memory
    scale with the reported peak memory bandwidth, terms bound by the SMs (math, L2, issue) with
    clock x SMs; the tile cycles are counted at the measured clock scaled by the reported clocks;
    launch times, floors, margins and errors stay."""
    src = rates.device
    mem = props["memory_bytes_per_s"] / src["memory_bytes_per_s"]
    clock = props["clock_hz"] / src["clock_hz"]
    compute = clock * props["sm_count"] / src["sm_count"]
    v = rates.values
    m, c, f = v.memory, v.cublas_fp16, v.fp32
    values = dataclasses.replace(
        v,
        memory=Memory(m.copy_bytes_per_s * mem, m.achieved_bytes_per_s * mem, m.atomic_bytes_per_s * compute),
        cublas_fp16=CublasFp16(c.fixed_s, c.bytes_per_s * mem, c.flops * compute, c.floor_s,
                               None if c.k_s is None else c.k_s / clock),
        csr_fp16=CsrFp16(v.csr_fp16.nonzeros_per_s * compute, v.csr_fp16.gather_bytes_per_s * compute),
        tiles=dataclasses.replace(v.tiles, clock_hz=v.tiles.clock_hz * clock),
        fp32=dataclasses.replace(f, **{k: Line(getattr(f, k).launch_s, getattr(f, k).flops * compute)
                                       for k in ("csr", "sgemm", "tf32x3", "f16x3")},
                                 epilogue_bytes_per_s=f.epilogue_bytes_per_s * mem))
    how = (f"{rates.label} scaled to {props['name']} (memory x{mem:.2f}, clock x{clock:.2f}, "
           f"SMs x{props['sm_count'] / src['sm_count']:.2f})")
    device = {k: (list(props[k]) if k == "compute_capability" else props[k]) for k in ratesfile.DEVICE_KEYS}
    return Rates(values, device, {**rates.measured, "how": how}, rates.provenance, how)

