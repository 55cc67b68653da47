"""Host time per call of a compiled kernel on PyTorch CUDA tensors, beside torch.mm (cuSPARSE).

    python lab/probes/launch_overhead.py

A tiny matrix, so the GPU finishes each launch before Python submits the next: the wall time per
call of a long loop is then the host-side cost of a call (argument checks plus the launch itself).
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp


def per_call_us(fn, calls: int = 3000) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t) / calls


def main() -> None:
    import torch

    import sparsegen

    a = sp.random(256, 256, density=0.05, format="csr", random_state=np.random.default_rng(0), dtype=np.float32)
    kernel = sparsegen.compile(a, n=32, backend="gpu")
    x = torch.randn(256, 32, device="cuda")
    y = torch.empty(256, 32, device="cuda")
    a_t = torch.sparse_csr_tensor(torch.tensor(a.indptr, dtype=torch.int32), torch.tensor(a.indices, dtype=torch.int32),
                                  torch.tensor(a.data), size=a.shape, device="cuda")
    rows = [("sparsegen kernel(x, out=y)", per_call_us(lambda: kernel(x, out=y))),
            ("sparsegen kernel(x)", per_call_us(lambda: kernel(x))),
            ("torch.mm(csr, x)", per_call_us(lambda: torch.mm(a_t, x)))]
    print(f"{kernel.spec.name} on {torch.cuda.get_device_name()}")
    for name, us in rows:
        print(f"{name:<30} {us:7.1f} us per call")


if __name__ == "__main__":
    main()
