"""`sparsegen demo`: the main job on the inputs that ship in examples/data, checked against scipy."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .errors import SparsegenError

TOLERANCE = {"float32": 1e-5, "float16": 1e-2}
GC_BIAS = -0.3  # the Graph Challenge bias of the 1024-neuron network


def examples_dir() -> Path:
    d = Path(__file__).resolve().parent.parent / "examples" / "data"
    if not d.is_dir():
        raise SparsegenError(f"example data not found at {d}: run the demo from a checkout (pip install -e .)")
    return d


def rel_error(y, ref) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(np.asarray(y, dtype=np.float64) - ref)
    return float(diff / denom) if denom else float(diff)


def _cases(d: Path):
    from .io import load

    layer = load(d / "n1024-l1.tsv.gz", shape=(1024, 1024))
    images = load(d / "sparse-images-1024-first64.tsv.gz", shape=(64, 1024))
    # The challenge multiplies row vectors, Y·W; as SpMM that is Wᵀ·Yᵀ with neurons as rows.
    yield ("graph challenge layer 1: relu(W^T Y + b), 64 images", layer.T.tocsr(), images.T.toarray(),
           {"bias": GC_BIAS, "relu": True}, "float32")
    dlmc = load(d / "dlmc-transformer-mp0.9-encoder0-ffn1.smtx.gz", values="random", seed=0)
    x = np.random.default_rng(0).standard_normal((dlmc.shape[1], 128))
    yield "DLMC transformer FFN (90 % sparse) x 128 columns, fp32", dlmc, x, {}, "float32"
    yield "DLMC transformer FFN (90 % sparse) x 128 columns, fp16", dlmc, x, {}, "float16"


def _rounded(a, dtype):
    """`a` with values rounded to `dtype`, kept in float32 (scipy.sparse has no float16)."""
    a = a.astype(np.float32, copy=True)
    a.data = a.data.astype(dtype).astype(np.float32)
    return a


def _reference(a, x, bias=None, relu=False):
    y = a.astype(np.float64) @ x.astype(np.float64)
    if bias is not None:
        y = y + bias
    return np.maximum(y, 0.0) if relu else y


def run_demo(backend: str = "auto") -> int:
    from . import api

    d = examples_dir()
    failures = 0
    for title, a, x, epilogue, dtype in _cases(d):
        x = np.ascontiguousarray(x, dtype=dtype)
        t = time.perf_counter()
        kernel = api.compile(a, op="spmm", n=x.shape[1], dtype=dtype, backend=backend, **epilogue)
        compile_ms = 1e3 * (time.perf_counter() - t)
        print(f"\n{title}")
        print(f"  matrix   {a.shape[0]}x{a.shape[1]}, {a.nnz} nonzeros")
        print(f"  kernel   {kernel.spec.name}  [{kernel.backend}]")
        print(f"  reason   {kernel.selection.reason}")
        print(f"  compile  {compile_ms:.1f} ms ({'plan cached' if kernel.timings.cached.get('plan') else 'analyzed'}, "
              f"{'cubin cached' if kernel.timings.cached.get('cubin') else 'nvcc ran' if kernel.backend == 'gpu' else 'no cubin needed'})")
        y, ms, how = _run_timed(kernel, x)
        err = rel_error(y, _reference(_rounded(a, dtype), x, epilogue.get("bias"), epilogue.get("relu", False)))
        ok = err <= TOLERANCE[dtype]
        failures += not ok
        print(f"  time     {ms:.4f} ms per call ({how})")
        print(f"  check    relative error vs scipy float64 {err:.2e} -> {'PASS' if ok else 'FAIL'}")
    if backend != "gpu" and kernel.backend == "emulate":
        print("\nno GPU here: the kernels ran in sparsegen's NumPy emulator (backend='emulate').")
    print(f"\n{'all checks passed' if not failures else f'{failures} check(s) FAILED'}")
    return 1 if failures else 0


def _run_timed(kernel, x):
    if kernel.backend == "emulate":
        t = time.perf_counter()
        y = kernel(x)
        return y, 1e3 * (time.perf_counter() - t), "emulator, wall clock"
    from . import runtime

    x_gpu = runtime.to_gpu(x)
    y_gpu = kernel(x_gpu)
    ms = runtime.time_ms(lambda: kernel(x_gpu, out=y_gpu))
    return y_gpu.get(), ms, "GPU, CUDA events, mean of 20 launches"
