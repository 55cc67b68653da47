"""Host time per call of a SparseLinear on CUDA tensors: eager (forward), through the dispatcher
(torch.ops.sparsegen.spmm), a compiled kernel called directly (kernel(x, out=y), PyCUDA's launch),
and inside a replayed CUDA graph of 100 calls; beside torch's dense Linear.

    python lab/probes/op_host_time.py [--shape 4096x4096] [--sparsity 0.8] [--n 1] [--calls 5000]
                                      [--family tiled_lanes_spmm]

--family forces the layer's kernel family (else selection may route the layer to F.linear, whose
host time is then the layer's).

Only the time each Python call takes is summed, in batches of 100 with the GPU synchronised
between batches, so a slow kernel never makes the host wait on a full launch queue.
"""
from __future__ import annotations

import argparse
import time


def per_call_us(fn, calls: int) -> float:
    import torch

    for _ in range(50):
        fn()
    total = 0.0
    for _ in range(max(calls // 100, 1)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100):
            fn()
        total += time.perf_counter() - t
    return 1e6 * total / (max(calls // 100, 1) * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4096x4096", help="out x in features")
    parser.add_argument("--sparsity", type=float, default=0.8)
    parser.add_argument("--n", type=int, default=1, help="tokens per call")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--family", help="force this kernel family (options={'family': ...})")
    args = parser.parse_args()

    import torch

    import sparsegen
    import sparsegen.torch as sgt

    m, k = (int(d) for d in args.shape.split("x"))
    torch.manual_seed(0)
    dense = torch.nn.Linear(k, m).to("cuda", torch.float16)
    options = {"family": args.family} if args.family else None
    layer = sgt.SparseLinear.from_dense(dense, args.sparsity, tune=False, options=options)
    x = torch.randn(args.n, k, device="cuda", dtype=torch.float16)
    xt = x.t().contiguous()
    kernel = sparsegen.compile(layer.csr, n=args.n, dtype="float16", bias=layer.bias, backend="gpu", tune=False,
                               options=options)
    y = torch.empty(m, args.n, device="cuda", dtype=torch.float16)
    rows = []
    with torch.inference_mode():
        rows.append(("SparseLinear eager: layer(x)", per_call_us(lambda: layer(x), args.calls)))
        rows.append(("torch.ops.sparsegen.spmm(xt, handle, m)",
                     per_call_us(lambda: torch.ops.sparsegen.spmm(xt, layer.handle, m), args.calls)))
        rows.append(("sparsegen kernel(xt, out=y) (PyCUDA)", per_call_us(lambda: kernel(xt, out=y), args.calls)))
        rows.append(("torch dense Linear: dense(x)", per_call_us(lambda: dense(x), args.calls)))
        w, b = dense.weight, dense.bias
        rows.append(("torch.nn.functional.linear(x, w, b)", per_call_us(lambda: torch.nn.functional.linear(x, w, b),
                                                                        args.calls)))
        rows.append(("torch.empty(m, n) (the output's allocation)",
                     per_call_us(lambda: torch.empty(m, args.n, device="cuda", dtype=torch.float16), args.calls)))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(100):
                layer(x)
        rows.append(("inside a CUDA graph (replay / 100 calls)", per_call_us(graph.replay, args.calls // 10) / 100))
    print(f"{m}x{k} at {args.sparsity:.0%}, N = {args.n}: {layer.specs.get(args.n)} on {torch.cuda.get_device_name()}")
    for name, us in rows:
        print(f"{name:<44} {us:8.3f} us per call")


if __name__ == "__main__":
    main()
