"""`sparsegen.compile`: read → analyze → select → encode → render → compile → cache → launch."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import nvcc
from ._version import __version__
from .analyze import analyze, structure_hash, values_hash
from .cache import Cache, key, pack_arrays, unpack_arrays
from .dtypes import DTYPES
from .errors import OptionsError, ShapeError, SparsegenError, UnsupportedError
from .families import check_taken, family_of, normalize_options
from .families.base import Request
from .families.contract import OPS
from .fingerprint import generator_fingerprint
from .formats import Plan
from .io import as_csr, load
from .operands import host_operands
from .render import Provenance, render
from .select import Selection, select_request
from .values import check_matrix, check_numbers

log = logging.getLogger("sparsegen")
BACKENDS = ("auto", "gpu", "emulate")
EMULATOR_TAKES = "a NumPy array (backend='emulate' runs on the host)"


@dataclass
class Timings:
    """Where compile() spent its time (seconds); `cached` says which stages were cache hits."""

    hash: float = 0.0
    analyze: float = 0.0
    encode: float = 0.0
    nvcc: float = 0.0
    total: float = 0.0
    cached: dict = field(default_factory=dict)


class Kernel:
    """A compiled kernel for one matrix: call it like a function.

    `kernel(x)` with a NumPy array copies in and returns NumPy; with a GPU array (anything with
    `__cuda_array_interface__`) it runs in place on the device and returns a GPU array of the same
    library, or writes into `out=`.
    """

    def __init__(self, *, spec, selection, plan, source, request, backend, arch, structure,
                 stats=None, cubin=None, cubin_key=None, timings=None):
        self.spec = spec
        self.selection = selection
        self.plan = plan
        self.source = source
        self.request = request
        self.backend = backend
        self.arch = arch
        self.structure_hash = structure
        self.stats = stats
        self.timings = timings or Timings()
        self.tuning = ()  # tune=True: the Trial of every candidate timed (family, and variant where it offers several)
        self._cubin = cubin
        self._cubin_key = cubin_key
        self._device_arrays = None
        self._launcher = None

    @property
    def family(self):
        return family_of(self.spec)

    @property
    def shape(self) -> tuple:
        return (self.plan.constants["m"], self.plan.constants["k"])

    @property
    def target(self) -> str:
        """The nvcc target: the request's arch, or the architecture-specific one the spec needs."""
        return self.spec.compile_arch(self.arch)

    @property
    def cubin_key(self) -> str:
        if self._cubin_key is None:
            self._cubin_key = cubin_key(self.source, self.target)
        return self._cubin_key

    @property
    def cubin(self) -> bytes:
        """The compiled kernel (compiled on first use when the backend is the emulator)."""
        if self._cubin is None:
            self._cubin = _cubin_for(self.source, self.target, self.spec.name, Cache(), self.timings)
        return self._cubin

    def device_arrays(self) -> dict:
        if self._device_arrays is None:
            from . import runtime

            self._device_arrays = runtime.upload(self.plan.arrays)
        return self._device_arrays

    def steps(self) -> tuple:
        """The launches one call makes, in stream order."""
        return tuple(self.family.steps(self.spec, self.plan))

    def launcher(self):
        """The GPU launch set up once (function loaded, plan on the device, geometry)."""
        if self._launcher is None:
            from . import runtime

            self._launcher = runtime.Launcher(self)
        return self._launcher

    def __call__(self, *operands, out=None, stream=None):
        if self.backend == "emulate":
            return self._emulate(operands, out)
        driver = self.family.driver
        if driver:
            raise UnsupportedError(f"{self.spec.family} kernels run on the GPU inside {driver}; "
                                   f"call that (or compile with backend='emulate' to run one layer)")
        from . import runtime

        return runtime.run(self, operands, out=out, stream=stream)

    def _emulate(self, operands, out):
        """The plan run in NumPy, its operands checked as the GPU backend checks host operands."""
        # a family whose host operands differ (bf16 travels as float32 in NumPy) says so
        expected, expected_out = self.family.emulate_operands(self.spec, self.plan)
        arrays, out = host_operands(self.spec.family, operands, out, expected, expected_out, EMULATOR_TAKES)
        y = self.family.emulate(self.spec, self.plan, {exp.name: x for x, exp in zip(arrays, expected)})
        if out is None:
            return y
        if out.shape != y.shape or out.dtype != y.dtype:  # an output dimension the inputs fix (None above)
            raise ShapeError(f"output {expected_out.name}: expected {y.dtype} {y.shape}, got {out.dtype} {out.shape}")
        out[...] = y
        return out

    def dump(self, directory) -> dict:
        """Write `<spec>.cu`, `<spec>.cubin`, `selection.json` and `<spec>.sass` (with cuobjdump)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        name = self.spec.name
        written = {"source": d / f"{name}.cu", "selection": d / "selection.json"}
        written["source"].write_text(self.source)
        written["selection"].write_text(json.dumps(self.describe(), indent=2) + "\n")
        written["cubin"] = d / f"{name}.cubin"
        written["cubin"].write_bytes(self.cubin)
        text = nvcc.sass(str(written["cubin"]))
        if text is not None:
            written["sass"] = d / f"{name}.sass"
            written["sass"].write_text(text)
        return written

    def describe(self) -> dict:
        return {
            "sparsegen": __version__,
            "request": {**vars(self.request), "device": self.request.device.describe()},
            "arch": self.arch,
            "structure_hash": self.structure_hash,
            "selection": self.selection.to_dict(),
            "plan": self.plan.describe(),
            "stats": self.stats.to_dict() if self.stats is not None else None,
        }

    def __repr__(self) -> str:
        return f"<sparsegen.Kernel {self.spec.name} {self.shape[0]}x{self.shape[1]} backend={self.backend}>"


def cubin_key(source: str, arch: str) -> str:
    """Keyed on the body only: the provenance header is comments, so kernels that differ only in
    which matrix they were made for share one cubin."""
    body = source.split("*/\n", 1)[1] if source.startswith("/*") else source
    return key("cubin", body, arch, nvcc.toolchain_id(), " ".join(nvcc.FLAGS))


def _cubin_for(source: str, arch: str, name: str, cache: Cache, timings: Timings) -> bytes:
    k = cubin_key(source, arch)
    cubin = cache.get("cubin", k, arch=arch)  # a cubin for another SM is a miss, recompiled
    timings.cached["cubin"] = cubin is not None
    if cubin is not None:
        return bytes(cubin)  # the cache's view, copied: a kernel's cubin pickles and loads as bytes
    t = time.perf_counter()
    cubin = nvcc.compile_cubin(source, arch, name=name)
    timings.nvcc = time.perf_counter() - t
    cache.put("cubin", k, cubin)
    return cubin


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise SparsegenError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    from . import runtime

    if runtime.available():
        return "gpu"
    warnings.warn("no CUDA GPU with PyCUDA here: sparsegen runs the kernel in its NumPy emulator "
                  "(backend='emulate')", RuntimeWarning, stacklevel=3)
    return "emulate"


def _resolve_device(device, backend: str):
    """The device selection plans for: as given, else the GPU in use (backend "gpu"), else the
    default device (the emulator plans for the GPU the shipped default rates were measured on)."""
    from .select.device import DeviceModel

    if device is not None:
        if not isinstance(device, DeviceModel):
            raise SparsegenError(f"device: expected a sparsegen.select.DeviceModel, got {type(device).__name__}")
        return device
    return DeviceModel.current() if backend == "gpu" else DeviceModel.default()


def _resolve_arch(arch: str | None, backend: str) -> str:
    if arch:
        return nvcc.check_arch(arch)
    if os.environ.get("SPARSEGEN_ARCH"):
        return nvcc.check_arch(os.environ["SPARSEGEN_ARCH"])
    if backend == "gpu":
        from . import runtime

        return runtime.current_arch() or nvcc.DEFAULT_ARCH
    return nvcc.DEFAULT_ARCH


def _bias_vector(bias, m: int) -> np.ndarray | None:
    """The bias as the kernels store it: one float32 per row."""
    if bias is None:
        return None
    b = check_numbers(bias, "float32", "bias")
    if b.ndim == 0:
        return np.full(m, b, dtype=np.float32)
    if b.shape != (m,):
        raise ShapeError(f"bias: expected a scalar or shape ({m},), got {b.shape}")
    return np.ascontiguousarray(b, dtype=np.float32)


def _request(op, n, k, dtype, arch, bias, relu, cap, bias_rule, options) -> Request:
    if op not in OPS:
        raise UnsupportedError(f"op {op!r}: expected one of {', '.join(OPS)}")
    if dtype not in DTYPES:
        raise UnsupportedError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if op == "spmm" and not _positive_int(n):
        raise ShapeError(f"n (columns of the dense operand) must be a positive integer, got {n!r}")
    if op == "sddmm":
        if not _positive_int(k):
            raise ShapeError(f"k (columns of A and B, the inner dimension) must be a positive integer, got {k!r}")
        if bias is not None or relu:
            raise UnsupportedError("sddmm has no epilogue: bias and relu apply to op='spmm'")
    if options is not None and not isinstance(options, Mapping):
        raise OptionsError(f"options: expected a dict of option names and values, got {type(options).__name__}")
    opts = dict(options or {})
    if op == "spdnn_layer":
        opts.update(_layer_options(bias, cap, bias_rule, opts))
        bias = None
    return Request(op=op, n=int(n) if n is not None else None, k=int(k) if k is not None else None,
                   dtype=dtype, arch=arch,
                   bias=bias is not None, relu=bool(relu), options=normalize_options(op, opts))


def _layer_options(bias, cap, bias_rule, given: dict) -> dict:
    """A SpDNN layer's epilogue as its family's options, from compile()'s arguments: one bias for the
    layer, or one per output neuron (the vector itself travels in the plan, see `_compile_request`)."""
    if bias is not None and np.ndim(bias) > 1:
        raise ShapeError("spdnn_layer: bias must be one number for the whole layer or one per output neuron")
    if bias_rule not in ("nonzero", "all"):
        raise ShapeError(f"bias_rule must be 'nonzero' or 'all', got {bias_rule!r}")
    vector = np.ndim(bias) == 1
    layer = {"bias": float(check_numbers(0.0 if bias is None or vector else bias, "float32", "bias")),
             "cap": None if cap is None else float(check_numbers(cap, "float32", "cap")), "bias_rule": bias_rule}
    if vector:
        layer["bias_vector"] = True
    clash = sorted(k for k, v in layer.items() if given.get(k) not in (None, v))
    if clash:
        raise OptionsError(f"options {', '.join(clash)}: the layer's {', '.join(clash)} come from compile()'s "
                           f"arguments of that name")
    return layer


def _check_stored_values(csr, request: Request, path) -> None:
    """The matrix's values must fit the request's dtype, which the kernel stores them in (sddmm reads
    only the pattern). as_csr has already refused NaN and inf, so float32 into float32 has nothing
    left to find."""
    if request.op == "sddmm" or (request.dtype == "float32" and csr.dtype == np.float32):
        return
    check_matrix(csr, request.dtype, path)


def request_flags(op: str, n, k, dtype: str) -> str:
    """The command-line flags that ask for this request (sddmm gives k, the others n)."""
    size = f"--k {k}" if op == "sddmm" else f"--n {n}"
    return f"--op {op} {size} --dtype {dtype}"


def _positive_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


def compile(matrix, op: str = "spmm", *, n: int | None = None, k: int | None = None,  # noqa: A001
            dtype: str = "float32", bias=None, relu: bool = False, cap: float | None = None,
            bias_rule: str = "nonzero", options: dict | None = None, arch: str | None = None,
            backend: str = "auto", tune: bool | None = None, reproduce: str = "", device=None,
            **load_options) -> Kernel:
    """Compile a kernel specialised for `matrix` (scipy sparse, dense 2-D array, or a file path).

    op="spmm" computes Y = A·X (+ bias per row, then ReLU when asked) for X of shape (A.cols, n).
    op="sddmm" samples A·Bᵀ at the matrix's pattern: the callable takes A (rows, k) and B (cols, k)
    and returns the nnz values in the matrix's CSR order (the matrix's own values are not used).
    op="spdnn_layer" is one sparse DNN layer, min(max(Y·Aᵀ + bias, 0), cap), with A's rows the
    output neurons; it runs inside `sparsegen.SparseDNN` (`bias` one number or one per output neuron,
    `bias_rule` "nonzero" as the Graph Challenge adds it, or "all"). `options` tunes the family.
    backend: "gpu", "emulate" (NumPy, exactly as the kernel reads the plan) or "auto" (GPU when
    there is one). Plans and cubins are cached (see README: Cache).
    tune: None (default) times, on the GPU, the candidates the cost model cannot tell apart within
    its measured error (`selection.contenders`) and keeps the fastest (`SPARSEGEN_TUNE=off` keeps
    the model's choice); True times every family that accepts the request; False never times.
    Measured winners are cached by structure and request. `kernel.tuning` lists the times.
    device: the `DeviceModel` selection plans for (default: the GPU in use for backend "gpu", else
    the default device); its identity is part of the plan's cache key.
    """
    t0 = time.perf_counter()
    path = matrix if isinstance(matrix, (str, os.PathLike)) else None
    if path is not None:
        reproduce = reproduce or f"sparsegen compile {matrix} {request_flags(op, n, k, dtype)}"
        matrix = load(matrix, **load_options)
    elif load_options:
        raise SparsegenError(f"unexpected options {sorted(load_options)} (reader options apply to file paths)")
    if tune not in (None, True, False):
        raise SparsegenError(f"tune: expected None, True or False, got {tune!r}")
    csr = as_csr(matrix)
    backend = _resolve_backend(backend)
    arch = _resolve_arch(arch, backend)
    device = _resolve_device(device, backend)

    def request_for(opts) -> Request:
        request = _request(op, n, k, dtype, arch, bias, relu, cap, bias_rule, opts)
        return dataclasses.replace(request, device=device)  # the GPU selection plans for

    request = request_for(options)
    _check_stored_values(csr, request, path)
    t = time.perf_counter()
    hashes = _hashes(csr)
    hashed = time.perf_counter() - t

    def compile_with(opts) -> Kernel:
        return _compile_request(csr, request_for(opts), bias, backend, arch, reproduce, hashes,
                                Timings(hash=hashed), time.perf_counter())

    if tune:
        from .tune import tuned

        return tuned(csr, request, backend, compile_with, structure=hashes[0])
    kernel = _compile_request(csr, request, bias, backend, arch, reproduce, hashes, Timings(hash=hashed), t0)
    from .tune import measures_contenders

    if measures_contenders(tune, backend, kernel.selection):
        from .tune import tuned

        return tuned(csr, request, backend, compile_with, kernel.selection.contenders, kernel.selection,
                     structure=hashes[0])
    return kernel


def _compile_request(csr, request: Request, bias, backend: str, arch: str, reproduce: str, hashes: tuple,
                     timings: Timings, t0: float) -> Kernel:
    """The plan (cached or built) and, for the GPU, its cubin: one request, the matrix hashed."""
    structure, values = hashes
    vector = request.op == "spmm" or (request.op == "spdnn_layer" and np.ndim(bias) == 1)
    bias_vec = _bias_vector(bias, csr.shape[0]) if vector else None
    cache = Cache()
    bias_bytes = bias_vec.tobytes() if bias_vec is not None else b""
    plan_key = key("plan", __version__, generator_fingerprint(), structure, values, bias_bytes,
                   repr(sorted(vars(request).items())), request.device.digest)  # selection reads the device
    kernel = _load_plan(cache, plan_key, request, backend, arch, structure, timings)
    if kernel is None:
        stored = Stored(cache, structure, values, bias_bytes)
        kernel = _build(csr, request, bias_vec, backend, arch, stored, reproduce, timings)
        meta = {"selection": kernel.selection.to_dict(),
                "plan": {"format": kernel.plan.format, "constants": kernel.plan.constants},
                "source": kernel.source, "stats": kernel.stats.to_dict()}
        arrays = kernel.plan.arrays
        if stored.format_key is not None:  # the arrays are the format entry's: point at it
            meta["plan"]["format_key"] = stored.format_key
            arrays = {k: a for k, a in arrays.items() if stored.format_arrays.get(k) is not a}
        cache.put("plan", plan_key, pack_arrays(meta, arrays))
    if backend == "gpu":
        kernel._cubin = _cubin_for(kernel.source, kernel.target, kernel.spec.name, cache, timings)
    timings.total = time.perf_counter() - t0
    return kernel


def _hashes(csr) -> tuple[str, str]:
    """Structure and values hashes, side by side: hashlib releases the GIL on large buffers, and
    on a warm compile these two hashes are most of the time."""
    if csr.nnz < 1 << 18:
        return structure_hash(csr), values_hash(csr)
    with ThreadPoolExecutor(max_workers=2) as pool:
        values = pool.submit(values_hash, csr)
        return structure_hash(csr), values.result()


@dataclass
class Stored:
    """What a plan miss may still find in the cache: the matrix's analysis, and (for families that
    name their encoding's parameters) its encoding, both shared by every request for the matrix.
    `format_key`/`format_arrays` say which format entry the built plan's arrays came from."""

    cache: Cache
    structure: str
    values: str
    bias: bytes
    format_key: str | None = None
    format_arrays: dict = field(default_factory=dict)

    def stats(self, csr):
        from .analyze import MatrixStats

        k = key("stats", __version__, generator_fingerprint(), self.structure, self.values)
        payload = self.cache.get("stats", k)
        if payload is not None:
            try:
                return MatrixStats.from_dict(json.loads(bytes(payload))), True
            except Exception as exc:  # written by another version, or damaged past its checksum
                log.warning("cache: unreadable stats entry %s (%s); analyzing again", k, exc)
        stats = analyze(csr)
        self.cache.put("stats", k, json.dumps(stats.to_dict(), sort_keys=True).encode())
        return stats, False

    def encode(self, family, csr, spec, bias_vec):
        """family.encode(csr, spec, bias), through the format cache where the family names the spec
        fields its encoding reads (`encoding(spec)`): one encoding serves every n."""
        shared = family.encoding(spec)
        if shared is None:
            return family.encode(csr, spec, bias_vec), False
        k = key("format", __version__, generator_fingerprint(), self.structure, self.values, self.bias,
                spec.family, repr(shared))
        base = _load_format(self.cache, k)
        hit = base is not None
        if not hit:
            base = family.encode_format(csr, spec, bias_vec)
            if self.cache.put("format", k, pack_arrays({"format": base.format, "constants": base.constants},
                                                         base.arrays)) is None:
                return family.specialize(base, spec), False  # not stored: the plan keeps its arrays
        self.format_key, self.format_arrays = k, base.arrays
        return family.specialize(base, spec), hit


def _load_format(cache, k) -> Plan | None:
    payload = cache.get("format", k)
    if payload is None:
        return None
    try:
        meta, arrays = unpack_arrays(payload)
        return Plan(meta["format"], arrays, meta["constants"])
    except Exception as exc:
        log.warning("cache: unreadable format entry %s (%s); encoding again", k, exc)
        return None


def _build(csr, request, bias_vec, backend, arch, stored: Stored, reproduce, timings) -> Kernel:
    t = time.perf_counter()
    stats, timings.cached["stats"] = stored.stats(csr)
    selection = select_request(stats, request)
    timings.analyze = time.perf_counter() - t
    t = time.perf_counter()
    family = family_of(selection.spec)
    check_taken(family, request)
    plan, timings.cached["format"] = stored.encode(family, csr, selection.spec, bias_vec)
    # trip counts only the encoded plan knows become constants
    selection = dataclasses.replace(selection, spec=family.finalize(selection.spec, plan, request))
    timings.encode = time.perf_counter() - t
    if not reproduce:
        reproduce = (f"sparsegen.compile(<matrix {csr.shape[0]}x{csr.shape[1]}, nnz {csr.nnz}>, op={request.op!r}, "
                     f"n={request.n}, dtype={request.dtype!r}, arch={arch!r})")
    source = render(selection.spec, Provenance(stored.structure, reproduce))
    timings.cached["plan"] = False
    return Kernel(spec=selection.spec, selection=selection, plan=plan, source=source, request=request,
                  backend=backend, arch=arch, structure=stored.structure, stats=stats, timings=timings)


def _load_plan(cache, plan_key, request, backend, arch, structure, timings) -> Kernel | None:
    payload = cache.get("plan", plan_key)
    if payload is None:
        return None
    try:
        meta, arrays = unpack_arrays(payload)
        selection = Selection.from_dict(meta["selection"])
        spec = selection.spec
        format_key = meta["plan"].get("format_key")
        if format_key is not None:  # the arrays live in the shared format entry
            base = _load_format(cache, format_key)
            if base is None:  # removed since (cache clear by hand): build the plan again
                return None
            arrays = {**base.arrays, **arrays}
        plan = Plan(meta["plan"]["format"], arrays, meta["plan"]["constants"])
        from .analyze import MatrixStats

        stats = MatrixStats.from_dict(meta["stats"])
    except Exception as exc:  # an entry written by another version, or damaged past its checksum
        log.warning("cache: unreadable plan entry %s (%s); rebuilding", plan_key, exc)
        return None
    timings.cached["plan"] = True
    return Kernel(spec=spec, selection=selection, plan=plan, source=meta["source"], request=request,
                  backend=backend, arch=arch, structure=structure, stats=stats, timings=timings)

