"""Where the host time of one kernel call goes, on PyTorch CUDA tensors (a probe).

    python lab/probes/host_overhead.py [--data DIR] [--profile] [--calls 3000]

For one small DLMC layer (512 x 4608 at 95 %: each kernel runs for a few microseconds, so Python
submits faster than the GPU finishes only if the call is cheap) it prints the host time per call of
a long loop without synchronisation (the launch_overhead.py method) for

- sparsegen's fp32 SpMM (n = 128) as kernel(x, out=y) and kernel(x), and its SDDMM (k = 128) as
  kernel(a, b) and kernel(a, b, out=v);
- the same loaded CUDA function launched directly: PyCUDA's prepared_call with the arguments the
  runtime would pass (what the runtime adds over the driver call);
- torch.mm of the int32 CSR tensor and torch.sparse.sampled_addmm (cuSPARSE through PyTorch);

and, with --profile, cProfile's top functions (by own time) over the sparsegen calls.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from launch_overhead import per_call_us  # noqa: E402  (the same loop: host time per call)

LAYER = "rn50/magnitude_pruning/0.95/bottleneck_2_block_group4_1_1"


def profile(fn, calls: int, top: int = 18) -> str:
    import torch

    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def direct_launch(kernel, ptrs: dict):
    """The first step of `kernel` launched by PyCUDA's prepared_call with `ptrs` in the operand slots."""
    step = kernel.launcher().steps[0]
    values = list(step.template)
    for i in step.slots:
        values[i] = ptrs[values[i]]
    return lambda: step.func.prepared_call(step.grid, step.block, *values, shared_size=step.shared)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("SPARSEGEN_DATA", "../shared/data"))
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    import torch

    import sparsegen
    from sparsegen.bench.dlmc import dlmc_matrices

    source = next(m for m in dlmc_matrices(args.data) if m.id == LAYER)
    a = source.load()
    m, k = a.shape
    dev = torch.device("cuda")
    spmm = sparsegen.compile(a, op="spmm", n=128, dtype="float32")
    sddmm = sparsegen.compile(a, op="sddmm", k=128, dtype="float32")
    x = torch.randn(k, 128, device=dev)
    y = torch.empty(m, 128, device=dev)
    lhs, rhs = torch.randn(m, 128, device=dev), torch.randn(k, 128, device=dev)
    v = torch.empty(a.nnz, device=dev)
    csr = torch.sparse_csr_tensor(torch.tensor(a.indptr, dtype=torch.int32), torch.tensor(a.indices, dtype=torch.int32),
                                  torch.tensor(a.data), size=a.shape, device=dev)
    print(f"# {LAYER} ({m} x {k}, {a.nnz} nonzeros) on {torch.cuda.get_device_name()}, {args.calls} calls each")
    print(f"# spmm: {spmm.spec.name} ({len(spmm.launcher().steps)} launch(es)); "
          f"sddmm: {sddmm.spec.name} ({len(sddmm.launcher().steps)} launch(es))")
    out_names = {"spmm": spmm.launcher().output.name, "sddmm": sddmm.launcher().output.name}
    spmm_ptrs = {spmm.launcher().inputs[0].name: x.data_ptr(), out_names["spmm"]: y.data_ptr()}
    sddmm_ptrs = {sddmm.launcher().inputs[0].name: lhs.data_ptr(), sddmm.launcher().inputs[1].name: rhs.data_ptr(),
                  out_names["sddmm"]: v.data_ptr()}
    cases = [
        ("sparsegen spmm kernel(x, out=y)", lambda: spmm(x, out=y)),
        ("sparsegen spmm kernel(x)", lambda: spmm(x)),
        ("  its function, prepared_call", direct_launch(spmm, spmm_ptrs)),
        ("torch.mm(csr, x)", lambda: torch.mm(csr, x)),
        ("sparsegen sddmm kernel(a, b, out=v)", lambda: sddmm(lhs, rhs, out=v)),
        ("sparsegen sddmm kernel(a, b)", lambda: sddmm(lhs, rhs)),
        ("  its function, prepared_call", direct_launch(sddmm, sddmm_ptrs)),
        ("torch.sparse.sampled_addmm", lambda: torch.sparse.sampled_addmm(csr, lhs, rhs.t(), beta=0.0)),
    ]
    for name, fn in cases:
        print(f"{name:<40} {per_call_us(fn, args.calls):7.1f} us per call", flush=True)
    if args.profile:
        for name, fn in (cases[0], cases[5]):
            print(f"\n# cProfile, {name}, {args.calls} calls")
            print(profile(fn, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
