"""Where a decode step's time goes: one replayed CUDA graph of the dense and of the sparse model,
kernel by kernel (torch.profiler), for each batch size.

    python lab/probes/decode_profile.py --model opt-6.7b --layers 4 --sparsity 0.8 --batch 1,16

It builds the model as `examples/sparse_decode.py` does (random weights, nothing downloaded),
prunes it into the dense and the sparse pair, captures a decode step of each (torch.compile and a
CUDA graph, as `sparsegen bench decode` measures), replays it `--steps` times under the profiler,
and prints per model the GPU time per step and the kernels that take it, grouped by name, with the
sparse model's extra time beside the dense one's. GPU only.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from sparsegen.bench.decode import load_example

REPO = Path(__file__).resolve().parents[2]


def kernel_times(runner, steps: int) -> dict:
    """{kernel name: (GPU microseconds per step, launches per step)} over `steps` replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner.decoder.reset()
    runner.next()  # one replay outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.next()
        torch.cuda.synchronize()
    out = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type.name == "CUDA":
            out[event.name][0] += event.device_time / steps
            out[event.name][1] += 1 / steps
    return {name: tuple(v) for name, v in out.items()}


def table(times: dict, top: int) -> list[str]:
    total = sum(us for us, _ in times.values())
    rows = sorted(times.items(), key=lambda kv: -kv[1][0])[:top]
    lines = [f"  {total:9.1f} us per step in {sum(n for _, n in times.values()):.0f} launches"]
    lines += [f"  {us:9.1f} us {n:5.1f}x  {name[:110]}" for name, (us, n) in rows]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="opt-6.7b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sparsity", type=float, default=0.8)
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        sys.exit("decode_profile needs a CUDA GPU")
    ex = load_example(REPO / "examples" / "sparse_decode.py")
    batches = [int(b) for b in args.batch.split(",")]
    model = ex.build(args.model, getattr(torch, args.dtype), "cuda", args.layers)
    dense, sparse, report = ex.pruned_pair(model, args.sparsity, backend="gpu", workers=8, ns=batches)
    config = dense.config
    for batch in batches:
        ids = torch.randint(config.vocab_size, (batch, args.prompt + args.steps + 2),
                            generator=torch.Generator().manual_seed(batch)).cuda()
        cache = ex.KVCache(config, batch, args.prompt + args.steps + 2, dense.dtype, "cuda")
        times = {}
        with torch.inference_mode():
            first = ex.Decoder(dense, cache, ids[:, args.prompt:], args.prompt)
            first.prefill(ids[:, :args.prompt])
            for name, net in (("dense", dense), ("sparse", sparse)):
                decoder = first if name == "dense" else ex.Decoder(net, cache, ids[:, args.prompt:], args.prompt)
                runner = ex.Runner(decoder, "inductor", True)
                times[name] = kernel_times(runner, args.steps)
                del runner
        print(f"batch {batch}: kernels per decode step ({args.model}, {args.layers} layers, {args.sparsity:.0%})")
        for name in ("dense", "sparse"):
            print(f" {name}")
            print("\n".join(table(times[name], args.top)))
        specs = sorted({r.specs.get(batch, "-") for r in report.layers})
        print(f" sparse kernels at N = {batch}: {', '.join(specs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
