"""The checks a host (NumPy) operand passes before a kernel reads or writes it.

Both backends call them: the GPU backend before it copies host operands to the device, the
emulator before it runs the plan. An operand is used as it is given or refused, never converted: a
list, a CPU tensor, a Fortran-ordered array or a strided view is a ShapeError that names the operand,
what the kernel takes and what it was given, as a read-only `out` is. (GPU operands have their own
checks in runtime.py; the messages read alike.)
"""
from __future__ import annotations

import numpy as np

from .errors import ShapeError


def shape_text(shape) -> str:
    """`(12, any)`: an Operand's shape, None dimensions taking any size."""
    return "(" + ", ".join("any" if d is None else str(d) for d in shape) + ")"


def kind_of(x) -> str:
    """What the caller passed, in words: `list`, `torch.Tensor on cpu`, `cupy.ndarray`."""
    cls = type(x)
    module = cls.__module__.split(".")[0]
    name = cls.__name__ if module in ("builtins", "numpy") else f"{module}.{cls.__name__}"
    device = getattr(x, "device", None)
    return f"{name} on {device}" if module == "torch" and device is not None else name


def numpy_dtype(exp, role: str) -> np.dtype:
    try:
        return np.dtype(exp.dtype)
    except TypeError:
        raise ShapeError(f"{role} {exp.name}: {exp.dtype} has no NumPy dtype; pass torch tensors on the GPU") from None


def check_count(family: str, given, expected) -> None:
    if len(given) != len(expected):
        raise ShapeError(f"{family} takes {len(expected)} operand(s) ({', '.join(e.name for e in expected)}), "
                         f"got {len(given)}")


def host_array(x, exp, role: str, accepted: str) -> np.ndarray:
    """`x` when it is a NumPy array the kernel can use as `exp` (an Operand) in `role` ("input" or
    "output"): its shape, dtype, C-contiguous layout, and for an output, writeable. `accepted`
    says what else the backend would take, for the error."""
    where = f"{role} {exp.name}"
    if not isinstance(x, np.ndarray):
        raise ShapeError(f"{where}: expected {accepted}, got {kind_of(x)}")
    dtype = numpy_dtype(exp, role)
    if not exp.matches(x.shape):
        raise ShapeError(f"{where}: expected shape {shape_text(exp.shape)}, got {x.shape}")
    if x.dtype != dtype:
        raise ShapeError(f"{where}: expected dtype {exp.dtype}, got {x.dtype} (convert with .astype(np.{exp.dtype}))")
    if not x.flags.c_contiguous:
        raise ShapeError(f"{where}: expected a C-contiguous (row-major) array, got strides {x.strides} "
                         f"(a transposed, Fortran-ordered or strided view: pass np.ascontiguousarray(...))")
    if role == "output" and not x.flags.writeable:
        raise ShapeError(f"{where}: expected a writeable array, got a read-only one")
    return x


def host_operands(family: str, inputs, out, expected, expected_out, accepted: str) -> tuple[list, np.ndarray | None]:
    """Every input and `out` (None: the kernel makes one) checked by `host_array`; raises before any
    of them is read or written."""
    check_count(family, inputs, expected)
    arrays = [host_array(x, exp, "input", accepted) for x, exp in zip(inputs, expected)]
    if out is not None:
        out = host_array(out, expected_out, "output", "a NumPy array, as the inputs are")
    return arrays, out
