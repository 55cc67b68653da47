"""What is the least GPU time a launch can measure, and what do the baselines launch? (a probe)

    python lab/probes/floor_probe.py

Times with sparsegen.bench.timing.time_cuda (the suites' method): an empty kernel (CuPy RawKernel),
a one-element torch add, and on DLMC-sized shapes cuSPARSE fp32 (torch CSR int32), cuBLAS fp32
(TF32 off), cuBLAS TF32 (allow_tf32 on: the tensor-core bound a load-sparse/compute-dense fp32
kernel would work under) and cuBLAS fp16. Then lists the kernels each baseline launches (torch
profiler) with their GPU durations. Writes $OUT/floor_probe.txt when OUT is set.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from sparsegen.bench.timing import time_cuda  # noqa: E402

SHAPES = [(512, 2048), (512, 4608), (2048, 512), (256, 2304), (2048, 2048)]
SPARSITIES = [0.5, 0.8, 0.98]
NS = [32, 128, 1024]


def main() -> int:
    import cupy as cp
    import torch

    lines = []

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    empty = cp.RawKernel(r'extern "C" __global__ void empty() {}', "empty")
    one = torch.zeros(1, device="cuda")
    emit(f"empty kernel          {time_cuda(lambda: empty((1,), (32,), ()))['median_ms'] * 1e3:7.2f} us")
    emit(f"torch add_ (1 elem)   {time_cuda(lambda: one.add_(1))['median_ms'] * 1e3:7.2f} us")
    rng = np.random.default_rng(0)
    emit(f"{'shape':>12} {'sp':>5} {'n':>5} {'cusp32':>8} {'cublas32':>8} {'tf32':>8} {'fp16':>8} {'cusp16':>8}  (us)")
    for m, k in SHAPES:
        for s in SPARSITIES:
            a = sp.random(m, k, density=1 - s, format="csr", random_state=rng, dtype=np.float32)
            crow = torch.from_numpy(a.indptr.astype(np.int32)).cuda()
            col = torch.from_numpy(a.indices.astype(np.int32)).cuda()
            val = torch.from_numpy(a.data).cuda()
            csr = torch.sparse_csr_tensor(crow, col, val, (m, k))
            csr16 = torch.sparse_csr_tensor(crow, col, val.half(), (m, k))
            dense = torch.from_numpy(a.toarray()).cuda()
            dense16 = dense.half()
            for n in NS:
                x = torch.randn(k, n, device="cuda")
                x16 = x.half()
                t = {}
                torch.backends.cuda.matmul.allow_tf32 = False
                t["cusp32"] = time_cuda(lambda: torch.mm(csr, x))["median_ms"]
                t["cublas32"] = time_cuda(lambda: torch.matmul(dense, x))["median_ms"]
                torch.backends.cuda.matmul.allow_tf32 = True
                t["tf32"] = time_cuda(lambda: torch.matmul(dense, x))["median_ms"]
                torch.backends.cuda.matmul.allow_tf32 = False
                t["fp16"] = time_cuda(lambda: torch.matmul(dense16, x16))["median_ms"]
                t["cusp16"] = time_cuda(lambda: torch.mm(csr16, x16))["median_ms"]
                emit(f"{m:>5}x{k:<6} {s:5.2f} {n:5d} " + " ".join(f"{t[c] * 1e3:8.1f}" for c in
                                                                ("cusp32", "cublas32", "tf32", "fp16", "cusp16")))
    # What each baseline launches, with GPU durations (one shape).
    m, k, n = 512, 2048, 128
    a = sp.random(m, k, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    csr = torch.sparse_csr_tensor(torch.from_numpy(a.indptr.astype(np.int32)).cuda(),
                                  torch.from_numpy(a.indices.astype(np.int32)).cuda(),
                                  torch.from_numpy(a.data).cuda(), (m, k))
    dense = torch.from_numpy(a.toarray()).cuda()
    x = torch.randn(k, n, device="cuda")
    from torch.profiler import ProfilerActivity, profile
    for name, fn in (("cusparse", lambda: torch.mm(csr, x)), ("cublas fp32", lambda: torch.matmul(dense, x)),
                     ("empty", lambda: empty((1,), (32,), ()))):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        emit(f"-- {name} {m}x{k} 80% n={n}: kernels (per call, GPU us)")
        for ev in prof.key_averages():
            if ev.device_type.name == "CUDA" or getattr(ev, "self_device_time_total", 0):
                cnt = ev.count
                dev = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
                emit(f"   {ev.key[:90]:90s} calls={cnt:3d} avg={dev / max(cnt, 1):7.2f}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "floor_probe.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
