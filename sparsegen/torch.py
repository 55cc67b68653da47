"""PyTorch use: `SparseLinear`, a pruned `torch.nn.Linear` whose product runs in sparsegen kernels,
and `sparsify(model, sparsity)`, which swaps a model's Linear layers for it. Inference only.

    import sparsegen.torch as sgt
    layer = sgt.SparseLinear.from_dense(linear, sparsity=0.7)   # prune, keep W as CSR
    y = layer(x)                                                # x: CUDA tensor (..., in_features)
    report = sgt.sparsify(model, 0.7, include=lambda name: ".encoder." in name)
    compiled = torch.compile(model, fullgraph=True)             # the layers trace as one operator

The layer is the operator `torch.ops.sparsegen.linear` (sparsegen/torch_op.py; `spmm` is its
product in the kernels' layout): `torch.compile` traces it without a graph break, `torch.export`
exports it, CUDA graphs capture it. In eager mode `forward` calls the operator's implementation
directly, skipping the dispatcher's few microseconds. Where selection picks the dense fallback for
a token count, the layer runs F.linear on W densified, exactly what nn.Linear does.

Layout. nn.Linear computes y = x·Wᵀ + b for row-major x (..., K); every sparsegen spmm family
computes Y = W·X for a row-major (C-contiguous) X of shape (K, N), so no kernel can read x in
place. `forward` therefore
  1. views x as (N, K) (free for contiguous x),
  2. makes xᵀ a contiguous (K, N) tensor: a copy of N·K elements (none when N = 1),
  3. runs the kernel (bias fused) into a fresh (M, N) tensor,
  4. returns Yᵀ as a contiguous (..., M) tensor: for N = 1 that is Y itself, for N > 1 one copy of
     N·M elements. Consumers read their operands' last dimension with stride 1: a strided query
     sends scaled-dot-product attention to its float32 math path, which made a compiled OPT-6.7B
     decode step at batch 16 2.4x slower than with the copy (docs/torch.md).
No host round trip, and W is never copied per call: it is encoded and uploaded once per layer
(the kernels for every N share it). Kernels are specialised by N, so one is compiled per distinct
token count on first use (sparsegen's cache makes a repeat compile cheap) and the layer keeps the
last `max_kernels`. Kernels launch on PyTorch's current stream.

CUDA graphs: run the layer once at each token count before capturing (or call `prepare(n)`); a
capture cannot make a kernel's device buffers, and preparing inside one is an error that says so.

Importing `sparsegen` never imports torch; importing this module does.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.sparse as sp

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only where torch is absent
    raise ImportError("sparsegen.torch needs PyTorch: pip install -e \".[torch]\"") from exc
if not hasattr(torch.library, "custom_op"):  # pragma: no cover - torch older than 2.4
    raise ImportError(f"sparsegen.torch needs PyTorch 2.4 or later (torch.library.custom_op); this is {torch.__version__}")

from . import api, dtypes, prune, torch_op
from .errors import ShapeError, SparsegenError, UnsupportedError
from .values import check_numbers

METHODS = ("magnitude",)
BACKENDS = ("gpu", "emulate")
DTYPES = {name: getattr(torch, name) for name in dtypes.NAMES}  # torch names them as sparsegen does


# ---- pruning ----------------------------------------------------------------------------------

def check_sparsity(sparsity) -> float:
    """A layer's sparsity: a number in [0, 1) (a layer pruned to nothing computes only its bias)."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= float(sparsity) < 1.0:
        raise SparsegenError(f"sparsity must be a number in [0, 1) (the share of weights set to zero), "
                             f"got {sparsity!r}")
    return float(sparsity)


def magnitude_prune(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """A copy of `weight` (its dtype and device kept) pruned by `sparsegen.prune`'s rule: exactly
    round(sparsity·numel) smallest-magnitude entries zeroed, among equal |w| the lower flat index first
    (more zeros only where `weight` already held them). A CUDA weight is pruned on its device."""
    check_sparsity(sparsity)
    w = weight.detach()
    if w.is_cuda:
        keep = keep_mask_sorted(w, sparsity)
    else:
        keep = torch.from_numpy(prune.keep_mask(_host64(w), sparsity))  # float64 holds every torch float exactly
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))


def keep_mask_sorted(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """`prune.keep_mask` on the weight's own device: the rule is the order of a stable sort of |w|
    (|w| is exact in every float dtype), whose first round(sparsity·numel) entries go."""
    if not bool(torch.isfinite(weight).all()):
        prune.keep_mask(_host64(weight), sparsity)  # raises the rule's error, naming the first bad entry
    k = prune.pruned_count(weight.numel(), sparsity)
    keep = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    keep[torch.sort(weight.detach().abs().flatten(), stable=True).indices[:k]] = False
    return keep.view(weight.shape)


# ---- the layer --------------------------------------------------------------------------------

def resolve_dtype(dtype, weight_dtype: torch.dtype) -> str:
    """A sparsegen dtype name from a torch dtype, a name, or None (the weight's own dtype)."""
    name = str(weight_dtype if dtype is None else dtype).replace("torch.", "")
    if name not in DTYPES:
        where = "the weight's dtype" if dtype is None else "dtype"
        raise UnsupportedError(f"{where} {name}: SparseLinear computes in {', '.join(DTYPES)}"
                               f"{' (pass dtype= to convert)' if dtype is None else ''}")
    return name


class SparseLinear(torch.nn.Module):
    """y = x·Wᵀ + b with a sparse W, run by a sparsegen kernel compiled per token count N.

    Build it with `from_dense` (prunes an nn.Linear) or from any weight whose zeros are the
    pattern. W and the bias are kept on the host (CSR, bias as float32) to compile new kernels; the
    device copy belongs to the layer's operator state (`torch_op.OpLayer`, named by `handle`).
    Parameters: none (nothing to train; state_dict is empty, rebuild with `from_dense`).
    `backend="gpu"` takes CUDA tensors; "emulate" takes CPU tensors and runs sparsegen's NumPy
    emulator, the same plan the kernel reads (for tests). See the module docstring for the layout
    mapping and its one copy.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, dtype=None,
                 options: dict | None = None, tune: bool | None = None, backend: str = "gpu", max_kernels: int = 8):
        super().__init__()
        if weight.dim() != 2:
            raise ShapeError(f"weight: expected a 2-D (out_features, in_features) tensor, "
                             f"got shape {tuple(weight.shape)}")
        if backend not in BACKENDS:
            raise SparsegenError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
        if not (isinstance(max_kernels, int) and max_kernels >= 1):
            raise SparsegenError(f"max_kernels must be a positive integer, got {max_kernels!r}")
        if options and "out" in options:  # a Linear returns its input's dtype; the kernel writes into that
            raise UnsupportedError(f"options out={options['out']!r}: SparseLinear returns the layer's dtype")
        self.dtype = resolve_dtype(dtype, weight.dtype)
        self.out_features, self.in_features = (int(d) for d in weight.shape)
        bias = None if bias is None else _bias(bias, self.out_features, DTYPES[self.dtype])
        self.op = torch_op.OpLayer(_csr(weight, DTYPES[self.dtype]), bias, self.dtype, options=dict(options or {}),
                                   tune=tune, backend=backend, max_kernels=max_kernels)

    @classmethod
    def from_dense(cls, linear: torch.nn.Linear, sparsity: float, method: str = "magnitude", dtype=None,
                   options: dict | None = None, tune: bool | None = None, backend: str = "gpu",
                   max_kernels: int = 8) -> "SparseLinear":
        """Prune `linear` (keep the largest |w|: round(sparsity·numel) weights become zero, see
        `magnitude_prune`) and wrap it. `dtype` (default: the weight's) is what the kernel computes
        in; `options` and `tune` go to `sparsegen.compile` for every N."""
        if not isinstance(linear, torch.nn.Linear):
            raise SparsegenError(f"from_dense takes a torch.nn.Linear, got {type(linear).__name__}")
        check_sparsity(sparsity)
        if method not in METHODS:
            raise SparsegenError(f"method {method!r}: expected one of {', '.join(METHODS)}")
        resolve_dtype(dtype, linear.weight.dtype)  # fail before the sort on an unusable dtype
        return cls(magnitude_prune(linear.weight, sparsity), linear.bias, dtype=dtype, options=options, tune=tune,
                   backend=backend, max_kernels=max_kernels)

    # -- what it holds ---------------------------------------------------------------------------

    csr = property(lambda self: self.op.csr, doc="W as float32 CSR (values the layer dtype holds)")
    bias = property(lambda self: self.op.bias, doc="the bias as float32 (rounded to the layer dtype), or None")
    options = property(lambda self: self.op.options)
    tune = property(lambda self: self.op.tune)
    backend = property(lambda self: self.op.backend)
    max_kernels = property(lambda self: self.op.max_kernels)
    handle = property(lambda self: self.op.handle, doc="what torch.ops.sparsegen.spmm calls this layer")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def nnz(self) -> int:
        return int(self.csr.nnz)

    @property
    def sparsity(self) -> float:
        """The share of W that is zero."""
        return 1.0 - self.nnz / max(self.in_features * self.out_features, 1)

    @property
    def specs(self) -> dict:
        """{N: spec name} of the kernels held (most recently used last)."""
        return self.op.specs

    def device_bytes(self) -> int:
        """Bytes the layer holds on the GPU: its plan (one copy for every N) and workspaces."""
        return self.op.device_bytes()

    def dense_weight(self, device=None) -> torch.Tensor:
        """The pruned W as a dense tensor in the layer's dtype (a copy: for references and tests)."""
        return torch.from_numpy(self.csr.toarray()).to(device=device, dtype=self.torch_dtype)

    def to_linear(self, device=None) -> torch.nn.Linear:
        """A dense nn.Linear holding the pruned weights in the layer's dtype: the reference."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                 device=device, dtype=self.torch_dtype)
        with torch.no_grad():
            linear.weight.copy_(self.dense_weight(device))
            if self.bias is not None:
                linear.bias.copy_(torch.from_numpy(self.bias))
        return linear

    def kernel(self, n: int) -> api.Kernel:
        """The kernel for N = n columns, compiled on first use; the oldest is dropped past max_kernels."""
        return self.op.kernel(n)

    def prepare(self, *ns: int) -> None:
        """Compile the kernels for these token counts now and, on the GPU, put their plans and
        workspaces on the device and pack their launches: what a CUDA graph capture needs done."""
        for n in ns:
            self.op.prepare_linear(int(n))  # where n selects the dense fallback: the dense W for F.linear

    # -- forward ---------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = self.op
        if type(x) is torch.Tensor and not torch.compiler.is_compiling():
            # eager: the operator's own implementation, without the dispatcher's round trip and with
            # the layout's views folded into the call; every check here is one attribute read
            if not (x.dtype is op.torch_dtype and x.is_cuda is (op.backend == "gpu") and x.dim()
                    and x.shape[-1] == op.k and not (x.requires_grad and torch.is_grad_enabled())):
                self._check_input(x)
            return op.forward(x)
        self._check_input(x)
        return torch.ops.sparsegen.linear(x, op.handle, self.out_features)  # see the module docstring

    def _check_input(self, x):
        if not isinstance(x, torch.Tensor):
            raise ShapeError(f"SparseLinear takes a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(f"input: expected shape (..., {self.in_features}), got {tuple(x.shape)}")
        if x.dtype != self.torch_dtype:
            given = str(x.dtype).replace("torch.", "")
            raise ShapeError(f"input: expected dtype {self.dtype} (the layer's), got {given}")
        if self.backend == "gpu" and not x.is_cuda:
            raise ShapeError(f"input is on {x.device}, but this layer runs sparsegen's GPU kernel: move it to CUDA, "
                             f"or build the layer with backend='emulate' for CPU tensors")
        if self.backend == "emulate" and x.device.type != "cpu":
            raise ShapeError(f"input is on {x.device}, but backend='emulate' runs on the host: pass a CPU tensor")
        if torch.is_grad_enabled() and x.requires_grad:
            raise UnsupportedError("SparseLinear is inference-only (its kernels have no backward): "
                                   "run under torch.no_grad() or torch.inference_mode()")

    def extra_repr(self) -> str:
        specs = ", ".join(f"n={n}: {name}" for n, name in self.specs.items()) or "none yet"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.dtype}, sparsity={self.sparsity:.3f}, backend={self.backend}, kernels=[{specs}]")


def _host64(t: torch.Tensor) -> np.ndarray:
    """A tensor's values on the host as float64, which holds every value of every float dtype torch has."""
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def _csr(weight: torch.Tensor, dtype: torch.dtype) -> sp.csr_matrix:
    """W in `dtype` (rounded as a dense layer of that dtype would hold it), stored as float32 CSR:
    scipy has no 16-bit floats, and float32 holds every fp16/bf16 value exactly. A weight that
    `dtype` cannot hold is an error, not an inf. A CUDA weight is compressed on its device; only
    its nonzeros travel to the host."""
    w = weight.detach().to(dtype=dtype)
    if w.is_cuda and bool(torch.isfinite(w).all()):  # else NaN or inf given, or a value `dtype` rounds to inf
        return compressed(w)
    check_numbers(_host64(weight), str(dtype).replace("torch.", ""), "weight")  # names the first bad value
    csr = sp.csr_matrix(w.float().cpu().numpy())
    csr.sort_indices()
    return csr


def compressed(w: torch.Tensor) -> sp.csr_matrix:
    """A 2-D tensor's nonzeros as a canonical float32 scipy CSR, compressed where the tensor lives."""
    c = w.float().to_sparse_csr()
    csr = sp.csr_matrix((c.values().cpu().numpy(), c.col_indices().cpu().numpy(), c.crow_indices().cpu().numpy()),
                        shape=tuple(w.shape))
    csr.sort_indices()
    return csr


def _bias(bias: torch.Tensor, m: int, dtype: torch.dtype) -> np.ndarray:
    """The bias rounded to the layer's dtype (as the dense layer holds it), as float32 for the kernel."""
    if tuple(bias.shape) != (m,):
        raise ShapeError(f"bias: expected shape ({m},), got {tuple(bias.shape)}")
    check_numbers(_host64(bias), str(dtype).replace("torch.", ""), "bias")
    b = bias.detach().to(device="cpu", dtype=dtype)
    return np.ascontiguousarray(b.float().numpy())


# ---- compiling ahead ---------------------------------------------------------------------------

def precompile(layers, ns, *, workers: int | None = None) -> None:
    """Compile the kernels of `layers` (SparseLinear) for the token counts `ns` in `workers`
    processes (default: half the CPUs, at most 8), into sparsegen's cache: plans, encodings and,
    for GPU layers, cubins for this GPU. Each layer's first use at those N then loads them instead
    of analysing, encoding and running nvcc (seconds per large layer: a model's worth adds up).
    The workers plan for the GPU in use (its DeviceModel and arch), as the layers' own compile does."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from . import runtime
    from .select.device import DeviceModel

    ns = tuple(int(n) for n in ns)
    gpu = [layer for layer in layers if layer.backend == "gpu"]
    device = DeviceModel.current() if gpu else DeviceModel.default()
    arch = os.environ.get("SPARSEGEN_ARCH") or (runtime.current_arch() if gpu else None)
    jobs = [(layer.csr, layer.bias, layer.dtype, layer.options, ns, arch, device, layer.backend == "gpu")
            for layer in layers]
    workers = workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    # spawn: a worker must not inherit the parent's CUDA context
    with ProcessPoolExecutor(min(workers, max(len(jobs), 1)), mp_context=multiprocessing.get_context("spawn")) as pool:
        for _ in pool.map(_compile_ahead, jobs):
            pass


def _compile_ahead(job) -> None:
    csr, bias, dtype, options, ns, arch, device, cubin = job
    for n in ns:
        kernel = api.compile(csr, op="spmm", n=n, dtype=dtype, bias=bias, options=options, backend="emulate",
                             arch=arch, device=device, tune=False)
        if cubin:
            kernel.cubin  # noqa: B018 - compiles and caches it


# ---- whole models -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerReport:
    """One replaced layer: its name in the model, shape, kept weights, and (live) compiled specs."""

    name: str
    in_features: int
    out_features: int
    nnz: int
    bias: bool
    module: SparseLinear = field(repr=False, compare=False)

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nnz / max(self.in_features * self.out_features, 1)

    @property
    def specs(self) -> dict:
        """{N: spec name} of the layer's kernels compiled so far."""
        return self.module.specs


@dataclass(frozen=True)
class SparsifyReport:
    """What `sparsify` replaced, in model order."""

    sparsity: float  # as requested
    layers: tuple

    def table(self) -> str:
        """One line per layer: name, shape, achieved sparsity, and the kernels compiled so far."""
        width = max((len(r.name) for r in self.layers), default=4)
        lines = [f"{'layer':<{width}}  {'out x in':>11}  sparsity  kernels (n: spec)"]
        for r in self.layers:
            specs = "; ".join(f"{n}: {name}" for n, name in r.specs.items()) or "-"
            lines.append(f"{r.name:<{width}}  {r.out_features:>5} x {r.in_features:<5}  {r.sparsity:8.4f}  {specs}")
        return "\n".join(lines)


def sparsify(model: torch.nn.Module, sparsity: float, *, include: Callable[[str], bool] | None = None,
             method: str = "magnitude", dtype=None, options: dict | None = None, tune: bool | None = None,
             backend: str = "gpu", precompile=(), max_kernels: int = 8) -> SparsifyReport:
    """Replace every nn.Linear of `model` (those whose qualified name `include` accepts, when given)
    by `SparseLinear.from_dense(...)`, in place; returns a report of what changed.

    `precompile`: token counts N to prepare each layer for now (`SparseLinear.prepare`: compiled,
    and on the GPU uploaded, so the report lists the specs and a CUDA graph may capture them);
    otherwise kernels compile on first forward.
    """
    check_sparsity(sparsity)
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (include is None or include(name))]
    if any(name == "" for name, _ in targets):
        raise SparsegenError("sparsify replaces Linear submodules; wrap a bare Linear with SparseLinear.from_dense")
    if not targets:
        raise SparsegenError("sparsify: no torch.nn.Linear in the model"
                             f"{' matches include' if include is not None else ''}")
    layers = []
    for name, linear in targets:
        layer = SparseLinear.from_dense(linear, sparsity, method=method, dtype=dtype, options=options, tune=tune,
                                        backend=backend, max_kernels=max_kernels)
        layer.prepare(*precompile)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
        layers.append(LayerReport(name, layer.in_features, layer.out_features, layer.nnz, layer.bias is not None,
                                  layer))
    return SparsifyReport(float(sparsity), tuple(layers))
