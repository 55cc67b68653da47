"""Launch compiled kernels on the GPU. The only module that imports PyCUDA, and only lazily.

The runtime works in the device's primary context, the one CUDA's runtime API (and so CuPy and
PyTorch) uses, so GPU arrays from those libraries are read and written in place.
"""
from __future__ import annotations

import atexit
import os
import threading

import numpy as np

from .errors import LaunchError, ShapeError

ENV_DEVICE = "SPARSEGEN_DEVICE"
_lock = threading.Lock()
_state: dict = {}  # process-wide caches: driver module, device, context, loaded functions
_tls = threading.local()


def _driver():
    """pycuda.driver, initialised; LaunchError when PyCUDA or a GPU is missing."""
    if "drv" not in _state:
        try:
            import pycuda.driver as drv
        except ImportError as exc:
            raise LaunchError("the GPU backend needs PyCUDA: pip install 'sparsegen[gpu]' "
                              "(or use backend='emulate')") from exc
        try:
            drv.init()
            count = drv.Device.count()
        except Exception as exc:  # pycuda raises its own error types
            raise LaunchError(f"CUDA driver unavailable: {exc}") from exc
        if count == 0:
            raise LaunchError("no CUDA device found (use backend='emulate')")
        _state["drv"] = drv
    return _state["drv"]


def available() -> bool:
    """True when PyCUDA imports and a CUDA device is present."""
    try:
        _driver()
        return True
    except LaunchError:
        return False


def device():
    drv = _driver()
    if "device" not in _state:
        ordinal = int(os.environ.get(ENV_DEVICE, "0"))
        if not 0 <= ordinal < drv.Device.count():
            raise LaunchError(f"{ENV_DEVICE}={ordinal} but only {drv.Device.count()} CUDA device(s) exist")
        _state["device"] = drv.Device(ordinal)
    return _state["device"]


def device_ordinal() -> int:
    return int(os.environ.get(ENV_DEVICE, "0"))


def current_arch() -> str | None:
    """`sm_XY` of the GPU in use, or None when there is none."""
    try:
        major, minor = device().compute_capability()
    except LaunchError:
        return None
    return f"sm_{major}{minor}"


def device_name() -> str | None:
    try:
        return device().name()
    except LaunchError:
        return None


def ensure_context():
    """Make the device's primary context current in this thread (push it once per thread)."""
    drv = _driver()
    if getattr(_tls, "ctx", None) is not None:
        return _tls.ctx
    with _lock:
        if "primary" not in _state:
            _state["primary"] = device().retain_primary_context()
    ctx = _state["primary"]
    ctx.push()
    _tls.ctx = ctx
    atexit.register(_pop_context, drv)
    return ctx


def _pop_context(drv):
    try:
        drv.Context.pop()
    except Exception:  # already gone at interpreter exit
        pass


def load_function(key: str, cubin: bytes, name: str, shared_bytes: int = 0):
    """Load a cubin once per process and return its kernel, prepared for fast launches."""
    ensure_context()
    funcs = _state.setdefault("functions", {})
    if (key, name) not in funcs:
        drv = _driver()
        try:
            module = drv.module_from_buffer(cubin)
            func = module.get_function(name)
        except Exception as exc:
            raise LaunchError(f"cannot load kernel {name}: {exc}") from exc
        funcs[(key, name)] = (module, func)
    func = funcs[(key, name)][1]
    if shared_bytes > 48 * 1024:  # opt-in needed past the default 48 KB of dynamic shared memory
        drv = _driver()
        func.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
    return func


def upload(arrays: dict) -> dict:
    """Copy plan arrays to the device once; returns name -> DeviceAllocation."""
    ensure_context()
    drv = _driver()
    out = {}
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        out[name] = drv.mem_alloc(max(arr.nbytes, 1))
        if arr.nbytes:
            drv.memcpy_htod(out[name], arr)
    return out


# ---- operands ------------------------------------------------------------------------------

def is_gpu_array(x) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def _cai_dtype(cai) -> np.dtype:
    return np.dtype(cai["typestr"])


def _check_gpu(x, expect, role: str) -> int:
    """Validate a GPU operand against `expect` (an Operand); return its device pointer."""
    cai = x.__cuda_array_interface__
    shape, dtype = tuple(cai["shape"]), _cai_dtype(cai)
    if shape != tuple(expect.shape):
        raise ShapeError(f"{role} {expect.name}: expected shape {tuple(expect.shape)}, got {shape}")
    if dtype != np.dtype(expect.dtype):
        raise ShapeError(f"{role} {expect.name}: expected dtype {expect.dtype}, got {dtype}")
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise ShapeError(f"{role} {expect.name}: expected a C-contiguous (row-major) array, got strides {strides}")
    dev = getattr(x, "device", None)
    ordinal = getattr(dev, "index", getattr(dev, "id", None))
    if getattr(dev, "type", "cuda") != "cuda" or (ordinal is not None and ordinal != device_ordinal()):
        raise ShapeError(f"{role} {expect.name}: expected an array on cuda:{device_ordinal()}, got {dev}")
    if cai.get("readonly", False) and role == "output":
        raise ShapeError(f"output {expect.name}: array is read-only")
    return int(cai["data"][0])


def _c_strides(shape, itemsize) -> tuple:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _empty_like_framework(x, shape, dtype):
    """A new GPU array of the same library as `x` (PyTorch, CuPy, else PyCUDA's GPUArray)."""
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name), device=x.device)
    if module == "cupy":
        import cupy

        return cupy.empty(shape, dtype=dtype)
    import pycuda.gpuarray as gpuarray

    return gpuarray.empty(shape, dtype=dtype)


def check_alignment(ptr: int, align: int, what: str):
    if align > 1 and ptr % align:
        raise ShapeError(f"{what}: this kernel makes {align}-byte vector loads, but the array starts at an "
                         f"address {ptr % align} bytes past alignment (a sliced view?); pass a fresh array")


# ---- launching -----------------------------------------------------------------------------

def _arg_format(args) -> str:
    return "".join("i" if a.kind == "int" else "P" for a in args)


def run(kernel, inputs: tuple, out=None, stream=None):
    """Launch `kernel` (an api.Kernel) on NumPy or GPU operands; see Kernel.__call__."""
    fam, spec, plan = kernel.family, kernel.spec, kernel.plan
    expected_inputs, expected_out = fam.operands(spec, plan)
    if len(inputs) != len(expected_inputs):
        raise ShapeError(f"{spec.family} takes {len(expected_inputs)} operand(s) "
                         f"({', '.join(o.name for o in expected_inputs)}), got {len(inputs)}")
    on_gpu = [is_gpu_array(x) for x in inputs]
    if any(on_gpu) and not all(on_gpu):
        raise ShapeError("operands mix host (NumPy) and GPU arrays; pass all of one kind")
    if stream is not None and not hasattr(stream, "handle"):
        raise LaunchError("stream must be a pycuda.driver.Stream (or None for the default stream)")
    if all(on_gpu) and inputs:
        return _run_device(kernel, inputs, expected_inputs, expected_out, out, stream)
    return _run_host(kernel, inputs, expected_inputs, expected_out, out, stream)


def _run_device(kernel, inputs, expected_inputs, expected_out, out, stream):
    align = kernel.family.alignment(kernel.spec)
    ptrs = {}
    for x, exp in zip(inputs, expected_inputs):
        ptrs[exp.name] = _check_gpu(x, exp, "input")
        check_alignment(ptrs[exp.name], align, f"input {exp.name}")
    if out is None:
        out = _empty_like_framework(inputs[0], expected_out.shape, expected_out.dtype)
    elif not is_gpu_array(out):
        raise ShapeError(f"out: expected a GPU array for GPU operands, got {type(out).__name__}")
    ptrs[expected_out.name] = _check_gpu(out, expected_out, "output")
    check_alignment(ptrs[expected_out.name], align, f"output {expected_out.name}")
    _launch(kernel, ptrs, stream)
    return out


def _run_host(kernel, inputs, expected_inputs, expected_out, out, stream):
    drv = _driver()
    ensure_context()
    host = []
    for x, exp in zip(inputs, expected_inputs):
        x = np.asarray(x)
        _check_host(x, exp, "input")
        host.append(np.ascontiguousarray(x))
    if out is not None:
        _check_host(out, expected_out, "output")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ShapeError(f"out {expected_out.name}: expected a writeable C-contiguous NumPy array")
    result = out if out is not None else np.empty(expected_out.shape, dtype=expected_out.dtype)
    allocs = upload({e.name: h for e, h in zip(expected_inputs, host)})
    allocs[expected_out.name] = drv.mem_alloc(max(result.nbytes, 1))
    _launch(kernel, {k: int(v) for k, v in allocs.items()}, stream)
    if result.nbytes:
        if stream is None:
            drv.memcpy_dtoh(result, allocs[expected_out.name])
        else:
            drv.memcpy_dtoh_async(result, allocs[expected_out.name], stream)
            stream.synchronize()
    return result


def _check_host(x, exp, role):
    if x.shape != tuple(exp.shape):
        raise ShapeError(f"{role} {exp.name}: expected shape {tuple(exp.shape)}, got {x.shape}")
    if x.dtype != np.dtype(exp.dtype):
        raise ShapeError(f"{role} {exp.name}: expected dtype {exp.dtype}, got {x.dtype} "
                         f"(convert with .astype(np.{exp.dtype}))")


def _launch(kernel, ptrs: dict, stream):
    fam, spec, plan = kernel.family, kernel.spec, kernel.plan
    geometry = fam.launch(spec, plan)
    if 0 in geometry.grid:
        return  # nothing to compute (no rows, or no columns)
    func = load_function(kernel.cubin_key, kernel.cubin, fam.KERNEL, geometry.shared_bytes)
    device_plan = kernel.device_arrays()
    args = fam.arguments(spec)
    values = []
    for a in args:
        if a.kind == "plan":
            values.append(device_plan[a.name])
        elif a.kind == "int":
            values.append(np.int32(plan.constants[a.name]))
        else:
            values.append(np.uintp(ptrs[a.name]))
    prepared = _state.setdefault("prepared", set())
    if (id(func), _arg_format(args)) not in prepared:
        func.prepare(_arg_format(args))
        prepared.add((id(func), _arg_format(args)))
    try:
        if stream is None:
            func.prepared_call(geometry.grid, geometry.block, *values, shared_size=geometry.shared_bytes)
        else:
            func.prepared_async_call(geometry.grid, geometry.block, stream, *values,
                                     shared_size=geometry.shared_bytes)
    except Exception as exc:
        raise LaunchError(f"launch of {spec.name} failed: {exc}") from exc


def synchronize():
    ensure_context()
    _driver().Context.synchronize()


def to_gpu(x: np.ndarray):
    """A PyCUDA GPUArray copy of a NumPy array (it exposes `__cuda_array_interface__`)."""
    ensure_context()
    import pycuda.gpuarray as gpuarray

    return gpuarray.to_gpu(np.ascontiguousarray(x))


def time_ms(fn, runs: int = 20, warmup: int = 3) -> float:
    """Mean GPU time of `fn` over `runs` back-to-back launches, by CUDA events."""
    drv = _driver()
    ensure_context()
    for _ in range(warmup):
        fn()
    start, end = drv.Event(), drv.Event()
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    end.synchronize()
    return start.time_till(end) / runs
