"""How much of a skinny product's time L2 hides: the selected kernel and cuBLAS fp16, each timed
with L2 warm (back-to-back launches) and flushed before every launch (`time_cuda(flush_l2=True)`).

    python lab/probes/cold_l2_probe.py --cases 4096x4096:0.8:1,7168x7168:0.9:16,28672x7168:0.9:16

A case is MxK:sparsity:N. W: the llm suite's uniform random pattern, fp16 values. Per case: the
selected spec, its bytes and cuBLAS's, both times warm and cold, the speedup both ways. A W whose
encoding fits L2 reads from it when launched back to back, and so does a dense W under 50 MB.
Writes $OUT/cold_l2_probe.txt when $OUT is set. The finding: docs/decisions/012-cold-l2.md.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402
from sparsegen.bench.timing import time_cuda  # noqa: E402
from sparsegen.bench.weights import as_dtype, random_weight  # noqa: E402
from _emit import emitter  # noqa: E402  (lab/probes/_emit.py)

DEFAULT = "4096x4096:0.8:1,4096x4096:0.8:16,7168x7168:0.8:16,7168x7168:0.9:16,28672x7168:0.9:16,28672x7168:0.8:16"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT)
    args = ap.parse_args()
    import torch

    emit = emitter("cold_l2_probe.txt")

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    emit(f"# {torch.cuda.get_device_name()}: L2 {l2 / 1e6:.0f} MB")
    emit("| W | sparsity | N | selected | sparse MB | dense MB | sparse us warm / cold | cuBLAS us warm / cold "
         "| speedup warm | speedup cold |")
    emit("|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        shape, s, n = case.split(":")
        m, k = (int(v) for v in shape.split("x"))
        s, n = float(s), int(n)
        W = as_dtype(random_weight(m, k, s, seed=0), "float16")
        kern = sparsegen.compile(W, n=n, dtype="float16", backend="gpu")
        Wd = torch.from_numpy(W.toarray()).cuda().half()
        X = torch.randn((k, n), dtype=torch.float16, device="cuda")
        Y = torch.empty((m, n), dtype=torch.float16, device="cuda")

        def sparse():
            kern(X, out=Y)

        def dense():
            torch.matmul(Wd, X)

        t = {(name, cold): 1e3 * time_cuda(fn, flush_l2=cold)["median_ms"]
             for name, fn in (("sparse", sparse), ("dense", dense)) for cold in (False, True)}
        emit(f"| {m}x{k} | {s:g} | {n} | {kern.spec.family} | {kern.plan.nbytes / 1e6:.1f} | {2 * m * k / 1e6:.1f} "
             f"| {t['sparse', False]:.1f} / {t['sparse', True]:.1f} | {t['dense', False]:.1f} / {t['dense', True]:.1f} "
             f"| {t['dense', False] / t['sparse', False]:.2f}x | {t['dense', True] / t['sparse', True]:.2f}x |")
        del Wd
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
