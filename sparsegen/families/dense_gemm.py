"""`dense_gemm`: the dense fallback, Y = W·X (+ bias per row, ReLU) by cuBLAS on the densified W.

No kernel is generated for the product: the plan holds W densified (M x K, fp16 or bf16), uploaded
once like any plan, and a call multiplies it by cuBLAS through PyTorch (`torch.matmul(W, X,
out=Y)`) or, without PyTorch, CuPy (`cupy.matmul`, float16 and float32: CuPy has no bfloat16), on views of
the device buffers (runtime `LibraryGemm`). Bias and ReLU, when asked, are a generated epilogue
kernel launched after it in stream order: one pass over Y for both, with the bias in fp32 as the
sparse families add it (torch ops would take a launch each and work in Y's dtype). Selection
(`select/policy.py`) takes it where the skinny cost model predicts that no sparse kernel beats dense
by more than the model's error (low sparsity, wide N), and for float32 where the fp32 model predicts
cuBLAS SGEMM well ahead of the CSR kernels; cuBLAS then runs with TF32 off, full fp32 like the
kernels it replaces.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import DTYPES, NAMES, WITH_NUMPY, itemsize, long_name, short_name
from ..formats import dense as FORMAT  # noqa: N812 - the family's format module
from .base import Arg, KernelSpec, Launch, LibraryGemm, Operand, Request, Step, decline, epilogue_suffix
from .options import FamilyOptions, option

FAMILY = "dense_gemm"
OPS = ("spmm",)
EPILOGUE_KERNEL = "dense_gemm_epilogue"
EPILOGUE_THREADS = 256
LIBRARIES = ("torch", "cupy")  # in order of preference
LIBRARY_DTYPES = {"torch": NAMES, "cupy": WITH_NUMPY}  # CuPy has NumPy's dtypes: no bfloat16
CALLS = {"torch": "torch.matmul", "cupy": "cupy.matmul"}
# A densified W past this share of the device's memory is refused (32 GiB of an H100's 80): the plan
# holds it on the host, in the plan cache and on the GPU, and a matrix that large is better left sparse.
MAX_DENSE_SHARE = (2, 5)


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f16" | "bf16" | "f32": W, X and Y
    m: int
    k: int
    n: int
    library: str  # "torch" | "cupy": the binding to cuBLAS the selection found importable
    bias: bool = False
    relu: bool = False

    @property
    def name(self) -> str:
        epi = epilogue_suffix(self.bias, self.relu)
        return f"{FAMILY}.{self.dtype}.m{self.m}k{self.k}n{self.n}.{self.library}{epi}"

    @property
    def call(self) -> str:
        return CALLS[self.library]

    def fields(self) -> dict:
        d = super().fields()
        d.update(call=self.call, epilogue=self.bias or self.relu, threads=EPILOGUE_THREADS,
                 w_bytes=w_bytes(self.dtype, self.m, self.k))
        return d

    def to_dict(self) -> dict:
        return {"family": self.family, "name": self.name, **KernelSpec.fields(self)}


@dataclass(frozen=True)
class Options(FamilyOptions):
    out: Literal[NAMES] | None = option()  # Y's dtype: the input's (the gate declines another)


def w_bytes(short_dtype: str, m: int, k: int) -> int:
    """Bytes of W densified in the spec's dtype ("f16", "bf16" or "f32")."""
    return itemsize(short_dtype) * m * k


def find_library(dtype: str) -> str | None:
    """The first of LIBRARIES that is importable here and has `dtype`, else None. Looked up without
    importing (selection runs in `sparsegen inspect` and must stay cheap)."""
    for lib in LIBRARIES:
        if dtype in LIBRARY_DTYPES[lib] and importlib.util.find_spec(lib) is not None:
            return lib
    return None


def unavailable(request: Request) -> str | None:
    """Why this family cannot run here (no binding for the dtype), else None: `tune=True` skips it."""
    if request.dtype in NAMES and find_library(request.dtype) is None:
        return f"neither torch nor CuPy (float16 and float32 only) is importable for {request.dtype}"
    return None


def describe_call(library: str) -> str:
    return f"cuBLAS via {CALLS[library]}"


def gate(stats, request: Request):
    """None when a dense product can serve the request, else the Decision that declines it."""
    if request.op != "spmm":
        return decline(f"op {request.op!r} is not spmm")
    if request.dtype not in NAMES:
        return decline(f"dtype {request.dtype}: the dense fallback serves float16, bfloat16 and float32")
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    out = request.option("out")
    if out not in (None, request.dtype):
        return decline(f"options out={out!r}: cuBLAS writes Y in the input dtype here")
    m, k = stats.shape
    if m == 0 or k == 0:
        return decline(f"empty shape {m}x{k}")
    size, limit = w_bytes(short_name(request.dtype), m, k), max_dense_bytes(request.device)
    if size > limit:
        return decline(f"densified W would take {size / 2**30:.0f} GiB (> {limit / 2**30:.0f} GiB, "
                       f"{MAX_DENSE_SHARE[0]}/{MAX_DENSE_SHARE[1]} of the {request.device.name}'s memory)")
    return None


def max_dense_bytes(device) -> int:
    return device.total_memory * MAX_DENSE_SHARE[0] // MAX_DENSE_SHARE[1]


def make_spec(stats, request: Request, library: str) -> Spec:
    m, k = stats.shape
    return Spec(short_name(request.dtype), m, k, request.n, library, request.bias, request.relu)


def forced(stats, request: Request) -> tuple[Spec, str]:
    """The spec and reason when options family= asks for dense: the library found here, else the
    default one named (the emulator needs none; a GPU call says what is missing)."""
    library = find_library(request.dtype)
    if library is None:
        return make_spec(stats, request, "torch"), (
            f"dense as asked; {unavailable(request)} here, so GPU calls fail until one is installed (the spec "
            f"names the default, {describe_call('torch')})")
    return make_spec(stats, request, library), (f"dense as asked: W densified, {describe_call(library)}"
                                                f"{epilogue_text(request)}")


def describe(stats, request: Request, library: str) -> str:
    """What the dense spec does, for its selection's reason."""
    m, k = stats.shape
    w_mb = w_bytes(short_name(request.dtype), m, k) / 1e6
    return f"W densified ({w_mb:.1f} MB) for {describe_call(library)}{epilogue_text(request)}"


def epilogue_text(request: Request) -> str:
    if not (request.bias or request.relu):
        return ""
    what = " + ".join(w for w, on in (("bias", request.bias), ("ReLU", request.relu)) if on)
    return f"; {what} by a generated epilogue kernel after the GEMM"


def encoding(spec: Spec) -> tuple:
    """The spec fields the encoding reads (the dense W serves every n: the format cache)."""
    return (spec.dtype,)


def encode_format(csr, spec: Spec, bias=None):
    return FORMAT.encode(csr, long_name(spec.dtype), bias)


def specialize(plan, spec: Spec):
    return plan


def encode(csr, spec: Spec, bias=None):
    return encode_format(csr, spec, bias)


def steps(spec: Spec, plan) -> tuple:
    """The library GEMM, then (bias or ReLU) the epilogue kernel over Y in place."""
    gemm = LibraryGemm(spec.library, long_name(spec.dtype), spec.m, spec.k, spec.n,
                       (Arg("w", "plan"), Arg("x", "input"), Arg("y", "output")))
    if not (spec.bias or spec.relu):
        return (gemm,)
    args = ((Arg("bias", "plan"),) if spec.bias else ()) + (Arg("y", "output"),)
    blocks = -(-spec.m * spec.n // EPILOGUE_THREADS)
    return gemm, Step(EPILOGUE_KERNEL, args, Launch((blocks, 1, 1), (EPILOGUE_THREADS, 1, 1), 0))


def operands(spec: Spec, plan) -> tuple:
    dtype = long_name(spec.dtype)
    return (Operand("x", (spec.k, spec.n), dtype),), Operand("y", (spec.m, spec.n), dtype)


def emulate_operands(spec: Spec, plan) -> tuple:
    """NumPy has no bfloat16: bf16 X comes as float32 (rounded to bf16 on entry), bf16 Y leaves as
    float32 holding bf16-rounded values (as the tiled families' emulators do). f32 is float32."""
    host = DTYPES[long_name(spec.dtype)].host.name
    return (Operand("x", (spec.k, spec.n), host),), Operand("y", (spec.m, spec.n), host)


def alignment(spec: Spec) -> int:
    """cuBLAS takes any element-aligned pointer; the epilogue reads and writes single elements."""
    return itemsize(spec.dtype)


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], bias=spec.bias, relu=spec.relu)
