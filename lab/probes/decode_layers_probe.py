"""A decoder's Linears as a decode step runs them: L layers of one shape back to back in a CUDA
graph, sparse (SparseLinear, each option variant) against dense (nn.Linear), per token count.

    python lab/probes/decode_layers_probe.py --model opt-6.7b --sparsity 0.8 --batch 1,16 \
        --variants 'default;family=tiled_lanes_spmm,split_k=16;family=tiled_bitmap_spmm'

Why a graph of L layers: in a decode step every Linear reads a different W once, so W comes from
DRAM, not L2, and kernels follow one another without host gaps. Timing one small kernel alone
(`time_cuda`) reads W from L2 once it fits (a 4096 x 4096 W at 80 % is 9 MB, the H200's L2 50 MB).
The L layers share one pruned W (one encoding, one cubin per variant: cheap to compile) but each
holds its own device copy, so L copies of the shape's bytes stream through per replay; L = 8 of
the smallest OPT-6.7B shape is 72 MB sparse, 268 MB dense.

Per shape (h x h, 4h x h, h x 4h), batch and variant: microseconds per layer (median of the
replays / L), the ratio over dense, the spec, the plan's bytes and their fraction of the device's
copy bandwidth. Kernels are compiled ahead in `--workers` processes (`sparsegen.torch.precompile`).
Writes $OUT/decode_layers_probe.txt when $OUT is set.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _emit import emitter  # noqa: E402  (lab/probes/_emit.py)

MODELS = {"opt-1.3b": 2048, "opt-6.7b": 4096, "opt-13b": 5120, "opt-30b": 7168}


def parse_variants(text: str) -> list[tuple[str, dict]]:
    out = []
    for v in (s.strip() for s in text.split(";") if s.strip()):
        if v == "default":
            out.append((v, {}))
            continue
        opts = {}
        for kv in v.split(","):
            key, val = kv.split("=")
            opts[key] = int(val) if val.lstrip("-").isdigit() else val
        out.append((v, opts))
    return out


def replay_us(torch, graph, replays: int = 30) -> float:
    """Median GPU time of one replay (CUDA events), after two warm replays."""
    for _ in range(2):
        graph.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b))
    return statistics.median(times)


def capture(torch, layers, x):
    for layer in layers:  # warm-up: kernels prepared, workspaces made, before the capture
        layer(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for layer in layers:
            layer(x)
    return g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="opt-6.7b", choices=sorted(MODELS))
    ap.add_argument("--sparsity", default="0.8")
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--shapes", default=None, help="MxK list; default: the model's h x h, 4h x h, h x 4h")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    import torch

    from sparsegen.bench.executor import GpuExecutor
    from sparsegen.torch import SparseLinear, magnitude_prune, precompile

    emit = emitter("decode_layers_probe.txt", "a")

    h = MODELS[args.model]
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes
              else [(h, h), (4 * h, h), (h, 4 * h)])
    batches = [int(b) for b in args.batch.split(",")]
    variants = parse_variants(args.variants)
    ex = GpuExecutor()
    bw = ex.copy_bandwidth().bytes_per_s
    emit(f"# {args.model}: {args.layers} layers per graph, copy bandwidth {bw / 1e12:.2f} TB/s, variants: "
         + "; ".join(v for v, _ in variants))
    torch.manual_seed(0)
    for s in (float(v) for v in args.sparsity.split(",")):
        for m, k in shapes:
            t0 = time.time()
            base = torch.nn.Linear(k, m, device="cuda", dtype=torch.float16)
            with torch.no_grad():
                base.weight.copy_(magnitude_prune(base.weight, s))
            dense = [torch.nn.Linear(k, m, device="cuda", dtype=torch.float16) for _ in range(args.layers)]
            with torch.no_grad():
                for d in dense:
                    d.weight.copy_(base.weight)
                    d.bias.copy_(base.bias)
            built = {}
            for name, opts in variants:
                try:
                    built[name] = [SparseLinear(base.weight, base.bias, options=opts) for _ in range(args.layers)]
                except Exception as exc:  # noqa: BLE001 - a rejected variant is a row
                    emit(f"{m}x{k} s={s} {name}: rejected: {str(exc).splitlines()[0][:160]}")
            precompile([layers[0] for layers in built.values()], batches, workers=args.workers)
            emit(f"# {m}x{k} s={s}: built and compiled {len(built)} variants in {time.time() - t0:.0f} s")
            for n in batches:
                x = torch.randn((n, k), device="cuda", dtype=torch.float16)
                with torch.no_grad():
                    ref = dense[0](x).float()
                    dense_us = replay_us(torch, capture(torch, dense, x)) / args.layers
                    emit(f"{m}x{k} s={s} N={n} dense {dense_us:7.1f} us/layer "
                         f"({2 * m * k / (dense_us * 1e-6) / bw:.0%} of bandwidth)")
                    for name, layers in built.items():
                        try:
                            y = layers[0](x).float()
                            err = ((y - ref).norm() / ref.norm()).item()
                            us = replay_us(torch, capture(torch, layers, x)) / args.layers
                        except Exception as exc:  # noqa: BLE001 - a failing variant is a row
                            emit(f"    {name:48s} -- {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
                            continue
                        spec = layers[0].specs.get(n, "?")
                        nbytes = layers[0].device_bytes()
                        emit(f"    {name:48s} {us:7.1f} us {dense_us / us:5.2f}x  err {err:.1e}  "
                             f"{nbytes / 1e6:6.1f} MB {nbytes / (us * 1e-6) / bw:4.0%}  {spec}")
            del built, dense, base
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
