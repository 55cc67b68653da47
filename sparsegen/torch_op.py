"""`torch.ops.sparsegen.spmm`: a pruned layer's product as a PyTorch operator, so `torch.compile`
traces models with `SparseLinear` layers whole, `torch.export` exports them, and CUDA graphs
capture their launches.

    y = torch.ops.sparsegen.spmm(x, handle, m)   # Y (m, N) = W·X + b for X (K, N), C-contiguous

An operator takes tensors and numbers only, so a layer is named by an integer `handle`: `OpLayer`
registers itself under one when it is made (`layer_of(handle)` finds it; the registry holds it
weakly, and a handle whose layer is gone is an error). `m` is W's row count, which the fake
(meta) implementation needs to give the result's shape without reading any data.

CPU tensors run sparsegen's NumPy emulator (backend "emulate"); CUDA tensors run the GPU kernel
through a `Prepared` call: the kernel compiled, its plan on the device and its split-K workspaces
allocated once per token count N, its arguments packed once (`cudriver.Params`). A call then checks
the operand (dtype, rows, device, layout), allocates Y from PyTorch's allocator, writes two pointers
and launches on PyTorch's current stream: no host synchronisation and no other allocation, so a
CUDA graph captures it, and the workspaces, which the kernels leave zeroed, serve every replay.
Preparing N inside a capture is refused (uploads and allocations cannot be captured): run the
layer once at that N, or call `prepare(n)`, before capturing. A call made during a capture pins
its preparation: it is never evicted, since the graph replays its pointers.

Kernels of one layer for different N read the same encoded W: `DevicePool` uploads each distinct
plan array once per layer.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from collections import OrderedDict

import numpy as np
import torch

from . import api, cudriver, runtime
from .errors import LaunchError, ShapeError, SparsegenError, UnsupportedError
from .families.base import LibraryGemm
from .select import select

OP = "sparsegen::spmm"
DTYPES = {name: getattr(torch, name) for name in ("float32", "float16", "bfloat16")}

_layers: dict = {}  # handle -> weakref to its OpLayer
_handles = itertools.count(1)


def layer_of(handle: int) -> "OpLayer":
    ref = _layers.get(handle)
    layer = ref() if ref is not None else None
    if layer is None:
        raise SparsegenError(f"{OP}: handle {handle} names no live SparseLinear in this process (an exported or "
                             f"compiled program runs only where the layers it was made from are alive)")
    return layer


def _register(layer: "OpLayer") -> int:
    handle = next(_handles)
    _layers[handle] = weakref.ref(layer, lambda _, h=handle: _layers.pop(h, None))
    return handle


# ---- the operator -----------------------------------------------------------------------------

@torch.library.custom_op(OP, mutates_args=(), device_types="cpu")
def spmm(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    """Y = W·X + b for the layer `handle` names; X (K, N) of the layer's dtype. CPU: the emulator."""
    return layer_of(handle).run_host(x)


@spmm.register_kernel("cuda")
def _spmm_cuda(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    return layer_of(handle).run_cuda(x)


@spmm.register_fake
def _spmm_fake(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    """The result's shape and dtype from the operands' metadata and the layer's, no data read."""
    layer = layer_of(handle)
    if x.dim() != 2 or x.dtype != layer.torch_dtype or m != layer.m:
        raise ShapeError(f"{OP}: expected X ({layer.k}, N) of {layer.dtype} and m = {layer.m}, "
                         f"got {tuple(x.shape)} of {str(x.dtype).replace('torch.', '')} and m = {m}")
    torch._check(x.shape[0] == layer.k, lambda: f"{OP}: X has {x.shape[0]} rows, the layer takes {layer.k}")
    return x.new_empty((m, x.shape[1]))


LINEAR = "sparsegen::linear"


@torch.library.custom_op(LINEAR, mutates_args=(), device_types=("cpu", "cuda"))
def linear(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    """y = x·Wᵀ + b for the layer `handle` names, as nn.Linear lays it out: x (..., K) of the layer's
    dtype, y (..., m) contiguous. What SparseLinear's traced forward calls. The layer's `forward`
    serves both devices: the emulator on CPU tensors, the kernel or F.linear on CUDA ones."""
    return layer_of(handle).forward(x)


@linear.register_fake
def _linear_fake(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    layer = layer_of(handle)
    if x.dim() == 0 or x.dtype != layer.torch_dtype or m != layer.m:
        raise ShapeError(f"{LINEAR}: expected x (..., {layer.k}) of {layer.dtype} and m = {layer.m}, "
                         f"got {tuple(x.shape)} of {str(x.dtype).replace('torch.', '')} and m = {m}")
    torch._check(x.shape[-1] == layer.k, lambda: f"{LINEAR}: x has {x.shape[-1]} features, the layer takes {layer.k}")
    return x.new_empty(tuple(x.shape[:-1]) + (m,))


# ---- one layer --------------------------------------------------------------------------------

class OpLayer:
    """What a handle names: one pruned W (CSR, float32 values holding the layer dtype's), its bias,
    how to compile it, and its kernels per token count N (at most `max_kernels`; the least recently
    used go first, except preparations a CUDA graph captured)."""

    def __init__(self, csr, bias, dtype: str, *, options: dict, tune, backend: str, max_kernels: int):
        self.csr, self.bias, self.dtype = csr, bias, dtype
        self.torch_dtype = DTYPES[dtype]
        self.m, self.k = (int(d) for d in csr.shape)
        self.options, self.tune, self.backend, self.max_kernels = options, tune, backend, max_kernels
        self.kernels: OrderedDict = OrderedDict()  # N -> api.Kernel
        self.prepared: OrderedDict = OrderedDict()  # N -> Prepared (the GPU backend)
        self.pool = DevicePool()
        self.dense_ns, self.sparse_ns = {}, set()  # N -> dense spec name (F.linear runs it) / N for the kernels
        self.dense = None  # (W, bias) as tensors of the layer's dtype on its device, once some N selects dense
        self.allocations = []  # the device memory under `dense` (the GPU backend)
        self.handle = _register(self)

    def __deepcopy__(self, memo):
        """A copy has its own handle, kernels and device buffers; W and the bias are shared (never written)."""
        return OpLayer(self.csr, self.bias, self.dtype, options=dict(self.options), tune=self.tune,
                       backend=self.backend, max_kernels=self.max_kernels)

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("csr", "bias", "dtype", "options", "tune", "backend", "max_kernels")}

    def __setstate__(self, state):
        self.__init__(state.pop("csr"), state.pop("bias"), state.pop("dtype"), **state)

    @property
    def specs(self) -> dict:
        """{N: spec name} of the kernels held, most recently used last, and of the token counts that
        run as a dense Linear."""
        out = dict(self.dense_ns)
        out.update((n, p.spec) for n, p in self.prepared.items())
        out.update((n, k.spec.name) for n, k in self.kernels.items() if n not in out)
        return out

    def routes_dense(self, n: int) -> bool:
        """Whether N = n runs as a dense Linear. Where selection picks the dense fallback for n, the
        layer computes what nn.Linear does, F.linear on W densified (one cuBLAS call with its bias),
        rather than the fallback's GEMM on the transposed operands with a bias pass and two
        transposes around it; and so it does where selection picks dense for the layer asked without
        its bias (`dense_spec_fused`). Decided once per n; the dense W is made once per layer."""
        if n in self.dense_ns:
            return True
        if n in self.sparse_ns or n <= 0:
            return False
        if self.backend == "gpu" and capturing():
            raise LaunchError(f"SparseLinear {self.m}x{self.k}: N = {n} was not prepared before this CUDA graph "
                              f"capture, and choosing its kernel cannot be captured; run the layer once at N = {n} "
                              f"(or call prepare({n})) before capturing")
        kernel = self.kernel(n)
        dense_spec = kernel.spec.name if kernel.spec.family == "dense_gemm" else self.dense_spec_fused(kernel)
        if dense_spec is None:
            self.sparse_ns.add(n)
            return False
        self.kernels.pop(n)  # F.linear reads the dense tensor below instead of this kernel's plan
        if self.dense is None:
            w = self.held(torch.from_numpy(self.csr.toarray()).to(self.torch_dtype))
            self.dense = (w, None if self.bias is None else self.held(torch.from_numpy(self.bias).to(self.torch_dtype)))
        self.dense_ns[n] = dense_spec
        return True

    def held(self, t: torch.Tensor) -> torch.Tensor:
        """The CPU tensor `t` where this layer runs: on the GPU, a view of an allocation the layer owns
        (as its plan arrays are), outside PyTorch's caching allocator. A dense W made in the warm-up
        run of `torch.compile(mode="reduce-overhead")` would otherwise land in the CUDA graph's pool,
        which refuses tensors that outlive the graph's outputs."""
        if self.backend != "gpu":
            return t
        bits = {2: torch.int16, 4: torch.int32}[t.element_size()]
        allocation = runtime.upload({"dense": t.contiguous().view(bits).numpy()})["dense"]
        self.allocations.append(allocation)
        typestr = {2: "<i2", 4: "<i4"}[t.element_size()]
        view = torch.as_tensor(runtime.DeviceBuffer(int(allocation), tuple(t.shape), typestr),
                               device=torch.device("cuda", runtime.device_ordinal()))
        return view.view(t.dtype)

    def dense_spec_fused(self, kernel: api.Kernel) -> str | None:
        """The dense spec selection picks over the sparse `kernel` when asked as a Linear runs, else
        None. The dense fallback `compile` prices adds its bias in a second launch; F.linear fuses
        it, as the sparse kernels do. So a layer with a bias asks again without it, which compares
        the two routes a Linear has, each with its bias fused (docs/decisions/012-cold-l2.md)."""
        if self.bias is None or self.options.get("family"):
            return None
        r = kernel.request
        selection = select(kernel.stats, op="spmm", n=r.n, dtype=r.dtype, arch=r.arch, options=r.options,
                           device=r.device)
        return selection.spec.name if selection.spec.family == "dense_gemm" else None

    def prepare_linear(self, n: int) -> None:
        """What `forward` needs at N = n, made now: the dense W where n runs as a dense Linear, else
        `prepare(n)`."""
        if not self.routes_dense(n):
            self.prepare(n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y = x·Wᵀ + b as (..., M), contiguous, for x (..., K) of the layer's dtype on its device (the
        caller has checked): F.linear where N selects the dense fallback, else the kernel
        (`linear_t`) and the copy that makes Yᵀ contiguous (none when N = 1)."""
        n = x.numel() // self.k if self.k else 0
        if n in self.dense_ns or (n not in self.sparse_ns and self.routes_dense(n)):
            return torch.nn.functional.linear(x, *self.dense)
        y = self.linear_t(x)
        return y if y.is_contiguous() else y.contiguous()

    def kernel(self, n: int) -> api.Kernel:
        """The kernel for N = n columns, compiled on first use."""
        if n in self.kernels:
            self.kernels.move_to_end(n)
            return self.kernels[n]
        kernel = api.compile(self.csr, op="spmm", n=n, dtype=self.dtype, bias=self.bias, options=self.options,
                             backend=self.backend, tune=self.tune)
        self.kernels[n] = kernel
        while len(self.kernels) > self.max_kernels:
            self.kernels.popitem(last=False)
        return self.kernels[n]

    def prepare(self, n: int):
        """Everything a call at N = n needs, made now (before a CUDA graph capture, say): the
        kernel, and on the GPU its plan and workspaces on the device and its launches packed."""
        if self.backend == "emulate":
            return self.kernel(n)
        if n in self.prepared:
            self.prepared.move_to_end(n)
            return self.prepared[n]
        if capturing():
            raise LaunchError(f"SparseLinear {self.m}x{self.k}: N = {n} was not prepared before this CUDA graph "
                              f"capture, and its upload and workspace allocation cannot be captured; run the layer "
                              f"once at N = {n} (or call prepare({n})) before capturing")
        runtime.ensure_context()
        self.prepared[n] = Prepared(self.kernel(n), self.pool)
        runtime.synchronize()  # the uploads and zeroed workspaces are complete before any stream reads them
        self.kernels.pop(n)  # the call needs no host plan; the pool keeps one host copy to match arrays by
        self._evict()
        return self.prepared[n]

    def _evict(self):
        unpinned = [n for n, p in self.prepared.items() if not p.pinned]
        for n in unpinned[: max(0, len(self.prepared) - self.max_kernels)]:
            self.prepared.pop(n).release()

    def device_bytes(self) -> int:
        """Bytes this layer holds on the device: the distinct plan arrays, every N's workspaces and
        the dense W and bias where some N runs as a dense Linear (backend "emulate": what the GPU
        backend would hold for the kernels compiled so far)."""
        dense = sum(t.numel() * t.element_size() for t in self.dense if t is not None) if self.dense else 0
        if self.backend == "gpu":
            return self.pool.nbytes + sum(p.scratch_bytes for p in self.prepared.values()) + dense
        distinct = []
        for kernel in self.kernels.values():
            distinct += [a for a in kernel.plan.arrays.values() if not any(_same(a, b) for b in distinct)]
        scratch = sum(v for kernel in self.kernels.values() for k, v in kernel.plan.constants.items()
                      if k.endswith("_bytes") and k[: -len("_bytes")] in _scratch_names(kernel))
        return sum(a.nbytes for a in distinct) + scratch + dense

    # -- running -----------------------------------------------------------------------------------

    def run_host(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend != "emulate":
            raise ShapeError(f"{OP}: X is on {x.device}, but this layer runs sparsegen's GPU kernel: move it to CUDA, "
                             f"or build the layer with backend='emulate' for CPU tensors")
        self._check(x)
        n = x.shape[1]
        if n == 0:
            return x.new_empty((self.m, 0))
        # NumPy has no bfloat16: the emulator takes and returns float32 holding bf16 values
        host = (x.float() if self.dtype == "bfloat16" else x).contiguous()
        y = self.kernel(n)(host.numpy())
        return torch.from_numpy(y).to(self.torch_dtype)

    def run_cuda(self, x: torch.Tensor) -> torch.Tensor:
        prepared = self.prepared.get(x.shape[1])
        if prepared is None:
            if self.backend != "gpu":
                raise ShapeError(f"{OP}: X is on {x.device}, but backend='emulate' runs on the host: pass a CPU tensor")
            self._check(x)
            if x.shape[1] == 0:
                return x.new_empty((self.m, 0))
            prepared = self.prepare(x.shape[1])
        return prepared(x)

    def linear_t(self, x: torch.Tensor) -> torch.Tensor:
        """y = x·Wᵀ + b by the kernel for x (..., K) of the layer's dtype on its device, the caller
        having checked that: the spmm operator's implementation, reading xᵀ as X and returning Yᵀ as
        (..., M) (strides (..., 1, N)) without the views' host time."""
        if not x.is_cuda:
            y = self.run_host(x.reshape(-1, self.k).t())
            return y.t().view(tuple(x.shape[:-1]) + (self.m,))
        n = x.numel() // self.k if self.k else 0
        prepared = self.prepared.get(n)
        if prepared is None:
            if n == 0:
                return x.new_empty(tuple(x.shape[:-1]) + (self.m,))
            prepared = self.prepare(n)
        return prepared.linear(x)

    def _check(self, x):
        if x.dim() != 2 or x.shape[0] != self.k or x.dtype != self.torch_dtype:
            raise ShapeError(f"{OP}: expected X ({self.k}, N) of {self.dtype}, "
                             f"got {tuple(x.shape)} of {str(x.dtype).replace('torch.', '')}")


def capturing() -> bool:
    """True while the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _stream_getter():
    """(device index) -> the raw handle of PyTorch's current stream there: its private fast call
    where this torch has it, else the public one."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


# ---- the GPU call ---------------------------------------------------------------------------

class DevicePool:
    """A layer's plan arrays on the device, one upload per distinct array (same name, shape, dtype
    and bytes): its kernels for different N share the encoded W. Counted references free an array
    when the last kernel reading it goes."""

    def __init__(self):
        self.entries: dict = {}  # name -> [[host array, allocation, users], ...]

    def acquire(self, arrays: dict) -> tuple[dict, list]:
        """{name: device pointer} for `arrays`, uploading the new ones; and the entries to release."""
        pointers, held = {}, []
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            entry = next((e for e in self.entries.get(name, ()) if _same(e[0], arr)), None)
            if entry is None:
                entry = [arr, runtime.upload({name: arr})[name], 0]
                self.entries.setdefault(name, []).append(entry)
            entry[2] += 1
            pointers[name] = int(entry[1])
            held.append((name, entry))
        return pointers, held

    def release(self, held: list) -> None:
        for name, entry in held:
            entry[2] -= 1
            if entry[2] == 0:
                self.entries[name].remove(entry)

    @property
    def nbytes(self) -> int:
        return sum(e[0].nbytes for es in self.entries.values() for e in es)


def _scratch_names(kernel) -> set:
    return {a.name for step in kernel.steps() for a in step.args if a.kind == "scratch"}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)))


class Prepared:
    """One kernel's call on CUDA tensors, worked out once: the launches packed (`cudriver.Launch`,
    with X's and Y's addresses in two shared cells), library steps bound, workspaces allocated.
    `__call__(x)` checks X, allocates Y and launches every step on PyTorch's current stream."""

    def __init__(self, kernel: api.Kernel, pool: DevicePool):
        spec, plan, family = kernel.spec, kernel.plan, kernel.family
        (x_op,), y_op = family.operands(spec, plan)
        self.spec, self.k, self.n = spec.name, int(x_op.shape[0]), int(x_op.shape[1])
        self.m, self.dtype = int(y_op.shape[0]), DTYPES[y_op.dtype]
        self.align = family.alignment(spec)
        self.ordinal = runtime.device_ordinal()
        self.device = torch.device("cuda", self.ordinal) if self.ordinal >= 0 else torch.device("cpu")
        self.layouts: dict = {}  # x's shape -> (shape, strides) of the (..., M) result
        self.stream = _stream_getter()
        # torch's own check without its Python wrapper, where CUDA is there to ask
        self.capturing = (torch._C._cuda_isCurrentStreamCapturing if torch.cuda.is_available()
                          else torch.cuda.is_current_stream_capturing)
        self.pinned = False
        self.lock = threading.Lock()
        all_steps = kernel.steps()
        self.scratch = runtime.scratch_buffers(all_steps, plan)  # zeroed once; the kernels leave them zeroed
        self.scratch_bytes = sum(int(plan.constants[f"{name}_bytes"]) for name in self.scratch)
        self.pool = pool
        pointers, self.held = pool.acquire(plan.arrays)
        pointers.update((name, int(buf)) for name, buf in self.scratch.items())
        self.x_cell, self.y_cell = ctypes.c_uint64(0), ctypes.c_uint64(0)
        cells = {x_op.name: self.x_cell, y_op.name: self.y_cell}
        self.steps = [self._step(kernel, step, pointers, cells) for step in all_steps if not _empty(step)]

    def _step(self, kernel, step, pointers: dict, cells: dict):
        if isinstance(step, LibraryGemm):
            return _Gemm(step, pointers, self.ordinal)
        values = []
        for a in step.args:
            if a.kind in ("plan", "scratch"):
                values.append(("P", pointers[a.name]))
            elif a.kind == "int":
                values.append(("i", int(np.int32(kernel.plan.constants[a.name]))))
            elif a.kind in ("input", "output"):
                values.append(cells[a.name])
            else:
                raise UnsupportedError(f"{self.spec}: argument {a.name} of kind {a.kind!r} has no place in {OP}")
        func = cudriver.function(kernel.cubin_key, kernel.cubin, step.kernel, step.launch.shared_bytes)
        return cudriver.Launch(func, step.launch.grid, step.launch.block, step.launch.shared_bytes,
                               cudriver.Params(values), f"{self.spec} ({step.kernel})")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Y (M, N) = W·X + b for X (K, N)."""
        if x.dtype != self.dtype or x.shape[0] != self.k or x.dim() != 2:
            raise ShapeError(f"{OP}: expected X ({self.k}, {self.n}) of {str(self.dtype)[6:]}, "
                             f"got {tuple(x.shape)} of {str(x.dtype)[6:]}")
        self._check_device(x)
        x = kernel_operand(x, self.align)
        y = torch.empty((self.m, self.n), dtype=self.dtype, device=self.device)
        self._launch(x, y)
        return y

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """yᵀ for x (..., K) holding N rows (dtype and K checked by the caller): X is xᵀ, read in
        place when N = 1, and Y is allocated as the (..., M) view of itself that the layer returns."""
        self._check_device(x)
        if self.n == 1 and x.is_contiguous() and x.data_ptr() % self.align == 0:
            xk = x  # one row: x's memory is X
        else:
            xk = kernel_operand(x.reshape(-1, self.k).t(), self.align)
        layout = self.layouts.get(x.shape)
        if layout is None:
            layout = self.layouts[x.shape] = _transposed_layout(tuple(x.shape[:-1]), self.m, self.n)
            if len(self.layouts) > 64:  # a few shapes at most are in use; keep the cache small
                self.layouts.pop(next(iter(self.layouts)))
        y = torch.empty_strided(*layout, dtype=self.dtype, device=self.device)
        self._launch(xk, y)
        return y

    def _check_device(self, x):
        if x.get_device() != self.ordinal:
            raise ShapeError(f"{OP}: X is on {x.device}, but sparsegen runs on cuda:{self.ordinal} "
                             f"(set {runtime.ENV_DEVICE}={x.get_device()})")

    def _launch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Every step on PyTorch's current stream, X's and Y's addresses in the cells."""
        stream = self.stream(self.ordinal)
        if self.capturing():
            self.pinned = True  # the graph replays this call's workspaces: never evict them
        with self.lock:  # the cells are shared; cuLaunchKernel copies them before returning
            self.x_cell.value, self.y_cell.value = x.data_ptr(), y.data_ptr()
            for step in self.steps:
                step(stream, x, y)

    def release(self) -> None:
        self.pool.release(self.held)
        self.held = []


def _transposed_layout(lead: tuple, m: int, n: int) -> tuple:
    """(shape, strides) of Yᵀ as a (*lead, M) tensor over Y's row-major (M, N) memory, N = prod(lead)."""
    strides, step = [], 1
    for d in reversed(lead):
        strides.append(step)
        step *= max(d, 1)
    return lead + (m,), tuple(reversed(strides)) + (n,)


def kernel_operand(x: torch.Tensor, align: int) -> torch.Tensor:
    """X as a kernel reads it: C-contiguous and starting `align`-byte aligned for its vector loads.
    A copy unless it already is (a fresh allocation is aligned; a view into a tensor may not be)."""
    if x.is_contiguous() and x.data_ptr() % align == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _empty(step) -> bool:
    if isinstance(step, LibraryGemm):
        return 0 in (step.m, step.n)
    return 0 in step.launch.grid


class _Gemm:
    """The dense fallback's GEMM, Y = W·X, by torch.matmul on PyTorch's current stream (so it is in
    stream order with the launches around it); W viewed in place once. float32 runs with TF32 off,
    as the CSR kernels it stands in for compute."""

    def __init__(self, step: LibraryGemm, pointers: dict, ordinal: int):
        w = step.args[0]
        if w.kind != "plan":
            raise UnsupportedError(f"{OP}: a library step whose A is {w.kind!r}, not the plan's W")
        self.fp32 = step.dtype == "float32"
        self.m, self.k, self.n = step.m, step.k, step.n
        typestr = "<f4" if self.fp32 else "<i2"  # 16-bit values travel as int16: the interface has no bfloat16
        view = runtime.DeviceBuffer(pointers[w.name], (step.m, step.k), typestr)
        self.w = torch.as_tensor(view, device=torch.device("cuda", ordinal)).view(DTYPES[step.dtype])

    def __call__(self, stream: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """x and y hold X (K, N) and Y (M, N) row-major, in whatever shape the caller has them."""
        x = x if tuple(x.shape) == (self.k, self.n) else x.reshape(self.k, self.n)
        y = y if tuple(y.shape) == (self.m, self.n) else y.as_strided((self.m, self.n), (self.n, 1))
        flags = torch.backends.cuda.matmul
        tf32 = self.fp32 and flags.allow_tf32
        if tf32:
            flags.allow_tf32 = False
        try:
            torch.matmul(self.w, x, out=y)
        finally:
            if tf32:
                flags.allow_tf32 = True
