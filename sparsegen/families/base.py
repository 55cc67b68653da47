"""What every kernel family shares: the request, the spec base class, rules and launch geometry.

What a family module must define and the hooks it may define are in `contract.py`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from ..dtypes import long_name, short_name
from ..errors import UnsupportedError
from ..select import device as device_model
from ..select.device import DeviceModel

TEMPLATE_WORD = re.compile(r"[A-Za-z0-9_]*")  # what a string spec field may hold: it is pasted into source


@dataclass(frozen=True)
class Request:
    """What the caller asked for, independent of the matrix."""

    op: str
    n: int | None = None
    k: int | None = None
    dtype: str = "float32"
    arch: str = "sm_90"
    bias: bool = False
    relu: bool = False
    # (name, value) pairs, sorted: the families' options and `family`; compile() gives them in the
    # normal form of `families.normalize_options`, which every cache key reads
    options: tuple = ()
    # the GPU selection plans for: its SMs, shared memory and registers, and its cost models' rates
    # (its repr, part of every cache key, names it and its rates by digest)
    device: DeviceModel = field(default_factory=lambda: device_model.default())

    @property
    def short_dtype(self) -> str:
        return short_name(self.dtype)

    def option(self, name: str, default=None):
        """The option's value, or `default` where it is not given (None is not given)."""
        value = dict(self.options).get(name)
        return default if value is None else value


@dataclass(frozen=True)
class KernelSpec:
    """Base of every family's spec: frozen, and `name` spells every template parameter."""

    family: ClassVar[str] = ""

    def __post_init__(self):
        for name in _field_names(type(self)):
            check_template_value(self.family, name, getattr(self, name))

    @property
    def name(self) -> str:  # pragma: no cover - every family overrides it
        raise NotImplementedError

    @property
    def template(self) -> str:
        return f"{self.family}.cu.j2"

    def compile_arch(self, arch: str) -> str:
        """The nvcc target for a request's `arch` (a family may need the architecture-specific one)."""
        return arch

    def fields(self) -> dict:
        """The template's variables: the spec's fields and nothing else."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict:
        return {"family": self.family, "name": self.name, **self.fields()}


@functools.cache
def _field_names(cls) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))


def check_template_value(family: str, name: str, value) -> None:
    """A spec field is pasted into CUDA source and into file names: it must be None, a bool, an
    integer, a finite real, or a string of letters, digits and `_`. Option values reach spec fields,
    so anything else (a quote, a newline, `*/`) is refused here, before any template sees it."""
    if value is None or type(value) in (bool, int) or isinstance(value, numbers.Integral):
        return
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return
    if isinstance(value, str) and TEMPLATE_WORD.fullmatch(value):
        return
    raise UnsupportedError(f"{family} spec field {name}={value!r}: expected None, a bool, an integer, a finite "
                           f"number or a word of letters, digits and _")


@dataclass(frozen=True)
class Decision:
    """A rule's answer: a spec (accepted) or None (declined), with a one-line reason."""

    spec: KernelSpec | None
    reason: str

    @property
    def accepted(self) -> bool:
        return self.spec is not None


def accept(spec: KernelSpec, reason: str) -> Decision:
    return Decision(spec, reason)


def decline(reason: str) -> Decision:
    return Decision(None, reason)


@dataclass(frozen=True)
class Rule:
    """One named entry of the ordered selection table."""

    name: str
    family: str
    decide: Callable  # (MatrixStats, Request) -> Decision


@dataclass(frozen=True)
class Arg:
    """One kernel parameter: where its value comes from.

    kind: "plan" (a device copy of plan.arrays[name]), "input" / "output" (a caller operand),
    "int" (plan.constants[name] as a 32-bit integer); a driver that launches the kernel itself may
    add its own kinds ("state" buffers, the "layer" index as a 32-bit integer).
    """

    name: str
    kind: str


@dataclass(frozen=True)
class Operand:
    """An operand the kernel takes or returns; a None dimension takes any size."""

    name: str
    shape: tuple
    dtype: str

    def matches(self, shape) -> bool:
        return len(shape) == len(self.shape) and all(e is None or e == d for e, d in zip(self.shape, shape))


@dataclass(frozen=True)
class Launch:
    grid: tuple
    block: tuple
    shared_bytes: int = 0


@dataclass(frozen=True)
class Step:
    """One kernel launch of a call. A family whose call is several launches in stream order
    (a hybrid's parts, a split-K reduction) defines `steps(spec, plan) -> tuple[Step, ...]`;
    the others define `KERNEL`, `arguments(spec)` and `launch(spec, plan)`, which make one step
    (`contract.Family.steps`)."""

    kernel: str  # the extern "C" name
    args: tuple  # Arg, ...
    launch: Launch


@dataclass(frozen=True)
class LibraryGemm:
    """A step that a library does instead of a generated kernel (the dense fallback): C = A·B for
    row-major A (m x k), B (k x n) and C (m x n) of one dtype, fp32 accumulation, by cuBLAS through
    `library` ("torch" or "cupy"). `args` name A, B and C as a kernel's arguments do; the runtime
    runs the step in stream order with the kernel steps around it."""

    library: str
    dtype: str  # "float16" | "bfloat16" | "float32"
    m: int
    k: int
    n: int
    args: tuple  # (Arg a, Arg b, Arg c)

    @property
    def kernel(self) -> str:
        return f"{self.library}.matmul"


VEC_BYTES_MAX = 16  # widest vector load: float4 / 8 halves


def widest_vector(n: int, itemsize: int) -> int:
    """The widest power-of-two vector (at most 16 bytes) that divides n, so every row of a
    row-major operand with n columns starts aligned to it."""
    vec = VEC_BYTES_MAX // itemsize
    while vec > 1 and n % vec:
        vec //= 2
    return vec


def epilogue_suffix(bias: bool, relu: bool) -> str:
    """The `.bias` / `.relu` part of a spec name."""
    return "".join(f".{e}" for e, on in (("bias", bias), ("relu", relu)) if on)


def default_device() -> DeviceModel:
    """The default device (`select.device.default`): where a family needs one without a request."""
    return device_model.default()


def spmm_gate(stats, request: Request, index_slack: int = 0) -> Decision | None:
    """The declines every CSR-based spmm family shares (op, dtype, 32-bit indices), or None.
    `index_slack`: entries the family's encoding adds past nnz (vector padding)."""
    if request.op != "spmm":
        return decline(f"op {request.op!r} is not spmm")
    if request.dtype not in ("float32", "float16"):
        return decline(f"dtype {request.dtype} not in float32/float16")
    if stats.nnz + index_slack >= 2**31 or max(stats.shape) >= 2**31:
        return decline("matrix needs 64-bit indices")
    return None


def spmm_operands(spec, plan) -> tuple[tuple[Operand, ...], Operand]:
    """X (k, n) in, Y (m, n) out, both in the spec's storage dtype."""
    dtype = long_name(spec.dtype)
    m, k = plan.constants["m"], plan.constants["k"]
    return (Operand("x", (k, spec.n), dtype),), Operand("y", (m, spec.n), dtype)


def next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def prev_pow2(x: float) -> int:
    return 1 if x < 2 else 1 << (int(x).bit_length() - 1)
