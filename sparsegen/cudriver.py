"""Kernel launches through the CUDA driver API by ctypes: argument lists packed once, a launch a
few hundred nanoseconds of Python, on any stream the caller names.

`runtime.py` launches through PyCUDA, which takes only its own stream objects and packs the
arguments on every call. `sparsegen.torch`'s operator needs neither cost nor restriction: it
launches on PyTorch's current stream (so CUDA graphs capture the launch) with the argument list of
each kernel built once (`Params`), two pointer cells patched per call. This module loads its own
copy of each cubin (`function`) in the context that is current, the device's primary context,
which PyTorch, PyCUDA and this module share; device memory still comes from the runtime.

Nothing is imported or loaded until the first `function` or `launch`; no GPU is needed to import.
"""
from __future__ import annotations

import ctypes
import sys
import threading

from .errors import LaunchError

CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CUDA_ERROR_INVALID_CONTEXT = 201
DEFAULT_SHARED_LIMIT = 48 * 1024  # a block may use more dynamic shared memory only when the function opts in
LIBRARIES = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")

_P, _U, _I = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
SIGNATURES = {  # name: argument types (every one returns a CUresult, an int)
    "cuModuleLoadData": (ctypes.POINTER(_P), ctypes.c_char_p),
    "cuModuleGetFunction": (ctypes.POINTER(_P), _P, ctypes.c_char_p),
    "cuFuncGetAttribute": (ctypes.POINTER(_I), _I, _P),
    "cuFuncSetAttribute": (_P, _I, _I),
    "cuLaunchKernel": (_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P),
    "cuGetErrorName": (_I, ctypes.POINTER(ctypes.c_char_p)),
}

_state: dict = {}  # "lib": the loaded driver; "functions": (cubin key, name) -> CUfunction
_lock = threading.Lock()


def library():
    """The CUDA driver library with the signatures above declared; LaunchError when absent."""
    if "lib" not in _state:
        for name in LIBRARIES:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise LaunchError(f"cannot load the CUDA driver library ({' or '.join(LIBRARIES)}): "
                              f"sparsegen's GPU launches need an NVIDIA driver")
        use(lib)
    return _state["lib"]


def use(lib) -> None:
    """Launch through `lib` (a ctypes library with the driver's functions): the driver, or a stand-in."""
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    _state.clear()
    _state.update(lib=lib, functions={})


def error_name(code: int) -> str:
    text = ctypes.c_char_p()
    if library().cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode()
    return f"CUresult {code}"


def check(code: int, what: str) -> None:
    if code:
        raise LaunchError(f"{what} failed: {error_name(code)}")


def function(key: str, cubin: bytes, name: str, shared_bytes: int) -> int:
    """The CUfunction `name` of `cubin` (loaded once per process and key into the current context),
    opted in to `shared_bytes` of dynamic shared memory where that passes the default limit."""
    lib = library()
    with _lock:
        functions = _state["functions"]
        if (key, name) not in functions:
            module = _P()
            image = cubin if isinstance(cubin, bytes) else bytes(cubin)  # a cache hit is a read-only view
            check(lib.cuModuleLoadData(ctypes.byref(module), image), f"loading the cubin of {name}")
            func = _P()
            check(lib.cuModuleGetFunction(ctypes.byref(func), module, name.encode()), f"finding kernel {name}")
            functions[(key, name)] = func.value
        func = functions[(key, name)]
    static = _I()
    check(lib.cuFuncGetAttribute(ctypes.byref(static), CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, func),
          f"reading {name}'s static shared memory")
    if shared_bytes + static.value > DEFAULT_SHARED_LIMIT:
        check(lib.cuFuncSetAttribute(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes),
              f"opting {name} in to {shared_bytes} bytes of dynamic shared memory")
    return func


class Params:
    """One kernel's argument list, packed once: `array` is the `void**` cuLaunchKernel reads, each
    entry pointing at a cell holding one argument. Fixed values (plan pointers, constants) are
    written here; an operand's cell is passed in, shared by every step that takes the operand, and
    its caller writes the operand's address into it before each launch."""

    def __init__(self, values):
        """`values`: per argument, a ctypes cell (an operand's, shared), or ("P", address) or
        ("i", 32-bit integer)."""
        self.cells = [(ctypes.c_uint64 if v[0] == "P" else ctypes.c_int32)(int(v[1])) if isinstance(v, tuple) else v
                      for v in values]
        self.array = (_P * max(len(self.cells), 1))(*[ctypes.addressof(c) for c in self.cells])


class Launch:
    """One kernel launch worked out once: the function, its geometry and its packed arguments."""

    def __init__(self, func: int, grid, block, shared_bytes: int, params: Params, name: str):
        self.func, self.name, self.params = _P(func), name, params
        self.launch = library().cuLaunchKernel
        # as ctypes values already: ctypes passes them as they are, converting a Python int costs more
        self.dims = tuple(_U(int(d)) for d in tuple(grid) + tuple(block) + (shared_bytes,))

    def __call__(self, stream: int, *operands) -> None:
        """Launch on `stream` (a CUstream handle; 0 is the legacy default stream); the operands
        travel in the cells (the arguments after `stream` are for library steps, which take tensors,
        and are ignored here). cuLaunchKernel copies the argument values, so the cells may change as
        soon as it returns. A thread that has
        no context current gets the runtime's (the device's primary context) and one retry."""
        code = self.launch(self.func, *self.dims, stream, self.params.array, None)
        if code == CUDA_ERROR_INVALID_CONTEXT:
            from . import runtime

            runtime.ensure_context()
            code = self.launch(self.func, *self.dims, stream, self.params.array, None)
        check(code, f"launch of {self.name}")
