"""Launch compiled kernels on the GPU. The only module that imports PyCUDA, and only lazily.

The runtime works in the device's primary context, the one CUDA's runtime API (and so CuPy and
PyTorch) uses, so GPU arrays from those libraries are read and written in place.
"""
from __future__ import annotations

import atexit
import os
import threading

import numpy as np

from .dtypes import WITH_NUMPY
from .errors import LaunchError, ShapeError
from .families.base import LibraryGemm
from .operands import check_count, host_operands, kind_of, numpy_dtype

ENV_DEVICE = "SPARSEGEN_DEVICE"
GPU_TAKES = "a NumPy array or a GPU array (anything with __cuda_array_interface__)"
_lock = threading.Lock()
_state: dict = {}  # process-wide caches: driver module, device, context, loaded functions
_tls = threading.local()


def _driver():
    """pycuda.driver, initialised; LaunchError when PyCUDA or a GPU is missing."""
    if "drv" not in _state:
        try:
            import pycuda.driver as drv
        except ImportError as exc:
            raise LaunchError("the GPU backend needs PyCUDA: pip install -e \".[gpu]\" "
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
        ordinal = device_ordinal()
        if not 0 <= ordinal < drv.Device.count():
            raise LaunchError(f"{ENV_DEVICE}={ordinal} but only {drv.Device.count()} CUDA device(s) exist")
        _state["device"] = drv.Device(ordinal)
    return _state["device"]


def device_ordinal() -> int:
    """The device sparsegen runs on: SPARSEGEN_DEVICE, read once per process (as the context is
    made once); every call checks its operands against it, and os.environ costs microseconds."""
    if "ordinal" not in _state:
        _state["ordinal"] = int(os.environ.get(ENV_DEVICE, "0"))
    return _state["ordinal"]


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


# What `select.device.DeviceModel` reads, by PyCUDA's device_attribute names (clocks in kHz).
DEVICE_ATTRIBUTES = {
    "sm_count": "MULTIPROCESSOR_COUNT",
    "clock_khz": "CLOCK_RATE",
    "shared_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "shared_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "registers_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "l2_bytes": "L2_CACHE_SIZE",
    "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "memory_clock_khz": "MEMORY_CLOCK_RATE",
    "bus_width_bits": "GLOBAL_MEMORY_BUS_WIDTH",
}


def device_properties() -> dict:
    """What the GPU in use reports: DEVICE_ATTRIBUTES by key (None where this PyCUDA or driver
    does not report one), its name, compute capability, total memory and the CUDA driver version."""
    drv, dev = _driver(), device()
    out = {}
    for key, name in DEVICE_ATTRIBUTES.items():
        try:
            out[key] = int(dev.get_attribute(getattr(drv.device_attribute, name)))
        except Exception:  # an attribute this PyCUDA build or driver lacks
            out[key] = None
    out.update(name=dev.name(), compute_capability=tuple(dev.compute_capability()),
               total_memory=int(dev.total_memory()), driver=int(drv.get_driver_version()))
    return out


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
    drv = _driver()
    static = func.get_attribute(drv.function_attribute.SHARED_SIZE_BYTES)
    if shared_bytes + static > 48 * 1024:  # opt-in needed past 48 KB, static shared memory included
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

def is_torch(x) -> bool:
    """A PyTorch tensor (or subclass, such as nn.Parameter), told by its class's module."""
    module = type(x).__module__
    return module == "torch" or module.startswith("torch.")


def is_gpu_array(x) -> bool:
    """A device array: a PyTorch CUDA tensor, or anything with `__cuda_array_interface__`. PyTorch
    answers through is_cuda: hasattr would build a tensor's interface dict, which costs more than
    the launch itself."""
    if is_torch(x):
        return bool(x.is_cuda)
    return hasattr(x, "__cuda_array_interface__")


def _cai_dtype(cai) -> np.dtype:
    return np.dtype(cai["typestr"])


def _check_gpu(x, expect, role: str) -> int:
    """Validate a GPU operand against `expect` (an Operand); return its device pointer."""
    cai = x.__cuda_array_interface__
    shape, dtype = tuple(cai["shape"]), _cai_dtype(cai)
    numpy_dtype(expect, role)
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
    if role == "output" and cai["data"][1]:  # the CUDA array interface's read-only flag
        raise ShapeError(f"output {expect.name}: expected a writeable array, got a read-only one")
    return int(cai["data"][0])


def _c_strides(shape, itemsize) -> tuple:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _empty_like_framework(x, shape, dtype):
    """A new GPU array of the same library as `x` (PyTorch, CuPy, else PyCUDA's GPUArray)."""
    if is_torch(x):
        import torch

        name = dtype if isinstance(dtype, str) else np.dtype(dtype).name  # "bfloat16" has no NumPy dtype
        return torch.empty(shape, dtype=torch_dtype(name), device=x.device)
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.empty(shape, dtype=dtype)
    import pycuda.gpuarray as gpuarray

    return gpuarray.empty(shape, dtype=dtype)


def check_alignment(ptr: int, align: int, what: str):
    if align > 1 and ptr % align:
        raise ShapeError(f"{what}: this kernel makes {align}-byte vector loads, but the array starts at an "
                         f"address {ptr % align} bytes past alignment (a sliced view?); pass a fresh array")


# ---- launching -----------------------------------------------------------------------------

def arg_format(args) -> str:
    """PyCUDA's prepared-call format for a family's argument list: 32-bit ints, else pointers."""
    return "".join("i" if a.kind in ("int", "layer") else "P" for a in args)


def scratch_buffers(all_steps, plan) -> dict:
    """Device buffers for the steps' "scratch" arguments (split-K workspaces and counters), sized by
    plan.constants[name + "_bytes"] and zeroed once; the kernels that use them leave them zeroed."""
    out = {}
    for step in all_steps:
        for a in step.args:
            if a.kind == "scratch" and a.name not in out:
                ensure_context()  # the first launch may come with torch operands, before any upload
                drv = _driver()
                size = max(int(plan.constants[f"{a.name}_bytes"]), 1)
                out[a.name] = drv.mem_alloc(size)
                drv.memset_d8(out[a.name], 0, size)
    return out


def _direct_launch(func):
    """`launch(grid, block, values, shared_bytes, stream)` for a prepared PyCUDA function: what its
    prepared_call does (pack the arguments by the prepared format, launch), without that call's
    per-launch keyword handling, import and deprecated block-shape call, which cost as much host time as
    the launch itself on a small kernel. None where this PyCUDA lacks the pieces (or the function uses
    texture references): the caller keeps prepared_call."""
    try:
        from pycuda._pvt_struct import pack
    except ImportError:
        return None
    launch_kernel = getattr(func, "_launch_kernel", None)
    if launch_kernel is None or getattr(func, "texrefs", None):
        return None
    fmt = func.arg_format

    def launch(grid, block, values, shared_bytes, stream):
        launch_kernel(grid, block, pack(fmt, *values), shared_bytes, stream)

    return launch


class _Prepared:
    """One step's launch worked out once: loaded function, geometry, and the argument template
    (fixed values in place; operand slots hold the operand's name, filled per call)."""

    def __init__(self, kernel, step, device_plan, plan):
        geometry = step.launch
        self.name = step.kernel
        self.grid, self.block, self.shared = tuple(geometry.grid), tuple(geometry.block), geometry.shared_bytes
        self.empty = 0 in geometry.grid  # nothing to compute (no rows, or no columns)
        self.func = self.fast = None
        if not self.empty:
            self.func = load_function(kernel.cubin_key, kernel.cubin, step.kernel, self.shared)
            self.func.prepare(arg_format(step.args))
            self.fast = _direct_launch(self.func)
        self.template = [int(device_plan[a.name]) if a.kind in ("plan", "scratch") else
                         np.int32(plan.constants[a.name]) if a.kind == "int" else a.name for a in step.args]
        self.slots = [i for i, v in enumerate(self.template) if isinstance(v, str)]

    def run(self, ptrs: dict, stream=None):
        values = list(self.template)
        for i in self.slots:
            values[i] = ptrs[values[i]]
        if self.fast is not None:
            self.fast(self.grid, self.block, values, self.shared, stream)
        elif stream is None:
            self.func.prepared_call(self.grid, self.block, *values, shared_size=self.shared)
        else:
            self.func.prepared_async_call(self.grid, self.block, stream, *values, shared_size=self.shared)


# ---- library steps (the dense fallback's cuBLAS GEMM) ------------------------------------------

class DeviceBuffer:
    """`__cuda_array_interface__` over a raw device pointer, so PyTorch and CuPy can view a PyCUDA
    allocation (or any caller's buffer) in place. 16-bit elements travel as int16 and are
    reinterpreted: the interface has no bfloat16."""

    def __init__(self, ptr: int, shape: tuple, typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (int(ptr), False),
                                         "strides": None, "version": 2}


class _Binding:
    """What both cuBLAS bindings share: views of device buffers, kept by (pointer, shape) because a
    kernel's calls usually reuse the same few buffers and building a view costs more than the call."""

    VIEWS = 16

    def __init__(self):
        self.views: dict = {}

    def view(self, ptr: int, shape: tuple):
        key = (ptr, shape)
        if key not in self.views:
            if len(self.views) >= self.VIEWS:
                self.views.pop(next(iter(self.views)))  # the oldest
            self.views[key] = self.wrap(ptr, shape)
        return self.views[key]


class _TorchBlas(_Binding):
    """cuBLAS through PyTorch: `torch.matmul(a, b, out=c)` on views of the device buffers."""

    def __init__(self, dtype: str):
        import torch

        if not torch.cuda.is_available():
            raise LaunchError("the dense fallback calls cuBLAS through PyTorch, which sees no CUDA device here")
        super().__init__()
        self.torch = torch
        self.dtype = getattr(torch, dtype)
        self.fp32 = dtype == "float32"
        self.device = torch.device("cuda", device_ordinal())
        self.streams: dict = {}

    def wrap(self, ptr: int, shape: tuple):
        if self.fp32:
            return self.torch.as_tensor(DeviceBuffer(ptr, shape, "<f4"), device=self.device)
        return self.torch.as_tensor(DeviceBuffer(ptr, shape, "<i2"), device=self.device).view(self.dtype)

    def matmul(self, a, b, c, stream=None):
        """On `stream` (a PyCUDA stream), else on the legacy default stream the kernels use, whatever
        stream PyTorch has made current. float32 runs with TF32 off, as the CSR kernels it stands in
        for compute, whatever the caller set (`torch.backends.cuda.matmul.allow_tf32` is restored)."""
        handle = 0 if stream is None else int(stream.handle)
        if handle not in self.streams:
            self.streams[handle] = (self.torch.cuda.default_stream(self.device) if handle == 0 else
                                    self.torch.cuda.ExternalStream(handle, device=self.device))
        flags = self.torch.backends.cuda.matmul
        tf32 = self.fp32 and flags.allow_tf32
        if tf32:
            flags.allow_tf32 = False
        try:
            with self.torch.cuda.stream(self.streams[handle]):
                self.torch.matmul(a, b, out=c)
        finally:
            if tf32:
                flags.allow_tf32 = True


class _CupyBlas(_Binding):
    """cuBLAS through CuPy: `cupy.matmul(a, b, out=c)` (float16 and float32: CuPy has no bfloat16)."""

    TYPESTR = {name: np.dtype(name).str for name in WITH_NUMPY}

    def __init__(self, dtype: str):
        import cupy

        if dtype not in self.TYPESTR:
            raise LaunchError(f"CuPy has no {dtype}: install torch for the bfloat16 dense fallback")
        if dtype == "float32" and os.environ.get("CUPY_TF32", "0") != "0":
            raise LaunchError("CUPY_TF32 is set: CuPy's float32 matmul would round to TF32, not the fp32 "
                              "the CSR kernels compute; unset it or install torch")
        super().__init__()
        self.cupy = cupy
        self.typestr = self.TYPESTR[dtype]

    def wrap(self, ptr: int, shape: tuple):
        return self.cupy.asarray(DeviceBuffer(ptr, shape, self.typestr))

    def matmul(self, a, b, c, stream=None):
        s = self.cupy.cuda.Stream.null if stream is None else self.cupy.cuda.ExternalStream(int(stream.handle))
        with s:
            self.cupy.matmul(a, b, out=c)


BLAS = {"torch": _TorchBlas, "cupy": _CupyBlas}


def blas(library: str, dtype: str):
    """The binding the spec names, else another that has `dtype`; LaunchError naming what each lacks."""
    ensure_context()  # PyCUDA's primary context current: the one PyTorch and CuPy use
    problems = []
    for lib in [library] + [other for other in BLAS if other != library]:
        try:
            return BLAS[lib](dtype)
        except ImportError:
            problems.append(f"{lib} is not importable")
        except LaunchError as exc:
            problems.append(str(exc))
    raise LaunchError(f"the dense fallback (dense_gemm) calls cuBLAS through PyTorch or CuPy: {'; '.join(problems)}. "
                      f"pip install -e \".[torch]\" (or cupy-cuda12x, float16 only), force a sparse family with "
                      f"options={{'family': ...}}, or use backend='emulate'")


class _PreparedGemm:
    """A `LibraryGemm` step: the binding loaded and the plan's operand viewed once; the call's
    operands are viewed per call (cached by pointer)."""

    def __init__(self, step, device_plan):
        self.name = step.kernel
        self.empty = 0 in (step.m, step.n)
        a, b, c = step.args
        self.operands = ((a.name, (step.m, step.k)), (b.name, (step.k, step.n)), (c.name, (step.m, step.n)))
        self.blas = blas(step.library, step.dtype) if not self.empty else None
        self.fixed = {name: self.blas.view(int(device_plan[arg.name]), shape)
                      for arg, (name, shape) in zip(step.args, self.operands)
                      if arg.kind == "plan" and not self.empty}

    def run(self, ptrs: dict, stream=None):
        a, b, c = (self.fixed[name] if name in self.fixed else self.blas.view(ptrs[name], shape)
                   for name, shape in self.operands)
        self.blas.matmul(a, b, c, stream)


def _prepare(kernel, step, device_plan, plan):
    if isinstance(step, LibraryGemm):  # cuBLAS through the library it names
        return _PreparedGemm(step, device_plan)
    return _Prepared(kernel, step, device_plan, plan)


class Launcher:
    """Everything about a kernel's launch that does not change between calls, worked out once:
    the loaded functions, grids and blocks, operand specs, and the plan's device pointers."""

    def __init__(self, kernel):
        fam, spec, plan = kernel.family, kernel.spec, kernel.plan
        self.name = spec.name
        self.inputs, self.output = fam.operands(spec, plan)
        self.align = fam.alignment(spec)
        all_steps = kernel.steps()
        self.scratch = scratch_buffers(all_steps, plan)
        device_plan = {**kernel.device_arrays(), **self.scratch}
        self.steps = [_prepare(kernel, step, device_plan, plan) for step in all_steps]
        self.empty = all(s.empty for s in self.steps)

    def launch(self, ptrs: dict, stream=None):
        for step in self.steps:
            if step.empty:
                continue
            try:
                step.run(ptrs, stream)
            except Exception as exc:
                raise LaunchError(f"launch of {self.name} ({step.name}) failed: {exc}") from exc


def run(kernel, inputs: tuple, out=None, stream=None):
    """Launch `kernel` (an api.Kernel) on NumPy or GPU operands; see Kernel.__call__."""
    launcher = kernel.launcher()
    check_count(kernel.spec.family, inputs, launcher.inputs)
    on_gpu = [is_gpu_array(x) for x in inputs]
    if any(on_gpu) and not all(on_gpu):
        raise ShapeError("operands mix host (NumPy) and GPU arrays; pass all of one kind")
    if stream is not None and not hasattr(stream, "handle"):
        raise LaunchError("stream must be a pycuda.driver.Stream (or None for the default stream)")
    if all(on_gpu) and inputs:
        return _run_device(launcher, inputs, out, stream)
    return _run_host(kernel.spec.family, launcher, inputs, out, stream)


def _run_device(launcher, inputs, out, stream):
    ptrs = {}
    for x, exp in zip(inputs, launcher.inputs):
        ptrs[exp.name] = _device_pointer(x, exp, "input", launcher.align)
    exp = launcher.output
    if out is None:
        out = _empty_like_framework(inputs[0], exp.shape, exp.dtype)
    elif not is_gpu_array(out):
        raise ShapeError(f"output {exp.name}: expected a GPU array, as the inputs are, got {kind_of(out)}")
    ptrs[exp.name] = _device_pointer(out, exp, "output", launcher.align)
    launcher.launch(ptrs, stream)
    return out


def _device_pointer(x, exp, role: str, align: int) -> int:
    ptr = _check_torch(x, exp, role) if is_torch(x) else _check_gpu(x, exp, role)
    check_alignment(ptr, align, f"{role} {exp.name}")
    return ptr


def torch_dtype(name: str):
    """torch's dtype object for a dtype name, cached: each call compares operands against it."""
    dtypes = _state.setdefault("torch_dtypes", {})
    if name not in dtypes:
        import torch

        dtypes[name] = getattr(torch, name)
    return dtypes[name]


def _check_torch(x, exp, role: str) -> int:
    """PyTorch tensors, read through their own attributes (a tensor's `__cuda_array_interface__`
    costs more than the rest of a launch); every check a comparison of cached objects."""
    if x.shape != tuple(exp.shape):
        raise ShapeError(f"{role} {exp.name}: expected shape {tuple(exp.shape)}, got {tuple(x.shape)}")
    if x.dtype is not torch_dtype(exp.dtype):
        raise ShapeError(f"{role} {exp.name}: expected dtype {exp.dtype}, got {str(x.dtype).replace('torch.', '')}")
    if not x.is_contiguous():
        raise ShapeError(f"{role} {exp.name}: expected a C-contiguous (row-major) array, got strides {x.stride()}")
    if x.get_device() != device_ordinal():
        raise ShapeError(f"{role} {exp.name}: expected an array on cuda:{device_ordinal()}, got {x.device}")
    if x.requires_grad:
        raise ShapeError(f"{role} {exp.name}: the tensor requires grad, but sparsegen kernels have no backward; "
                         f"pass it detached (x.detach())")
    return x.data_ptr()


def _run_host(family: str, launcher, inputs, out, stream):
    """NumPy operands: checked as the emulator checks them, copied to the device, the result back."""
    host, out = host_operands(family, inputs, out, launcher.inputs, launcher.output, GPU_TAKES)
    drv = _driver()
    ensure_context()
    exp = launcher.output
    result = out if out is not None else np.empty(exp.shape, dtype=exp.dtype)
    allocs = upload({e.name: h for e, h in zip(launcher.inputs, host)})
    allocs[exp.name] = drv.mem_alloc(max(result.nbytes, 1))
    launcher.launch({k: int(v) for k, v in allocs.items()}, stream)
    if result.nbytes:
        if stream is None:
            drv.memcpy_dtoh(result, allocs[exp.name])
        else:
            drv.memcpy_dtoh_async(result, allocs[exp.name], stream)
            stream.synchronize()
    return result


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
