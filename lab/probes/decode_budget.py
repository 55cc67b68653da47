"""The decode budget: SASS instructions per 128 x 64 tile per warp of each tile encoding, counted
statically from the cubin, with its bytes per element beside it (no GPU needed).

    python lab/probes/decode_budget.py [--shape 7168x7168] [--sparsity 0.8,0.9] [--n 8,16] \
        [--variants 'bitmap=family=tiled_bitmap_spmm,granule=1;pairs=...'] [--out FILE]

Each variant is compiled through `sparsegen.compile` (backend="emulate", arch sm_90, its options
forcing the family and encoding) for a uniform random W (`sparsegen.bench.weights.random_weight`,
the llm suite's) and each N; `lab/profile/sass_loop.py` finds the kernel's main loop in
`cuobjdump -sass` and counts the instructions one warp issues through one trip over a non-empty
tile (every block on the fall-through path once; predicated instructions count, since they take an
issue slot whatever their predicate). A trip covers `tile_m` x `tile_k` of W, so

    per tile per warp = path x (128 / tile_m) x (64 / tile_k)

and a block issues `outside` instructions once, over its `kt_per_split` trips (the column "+out":
outside / trips, per 128 x 64 tile, an upper bound: every block of the epilogue counted). ncu's
"warp instructions per 128 x 64 tile" sum the block's warps: compare it with
warps x (per tile + out). Inner loops on the path are counted once, except the rows' own rule
(Tiled-CSL's rest-from-global loop: no trips when a ring slot holds the fullest tile); one thread's
work (a producer's bulk copy, `sass_loop.LoopCount.single`) counts 1 / warps per warp.

B/elem: the plan's arrays (everything the kernel reads of W) over m x k. wf: for the tiled_lanes
format, the shared-memory wavefronts of its value loads per 128 x 64 tile per warp (the most
distinct words a load's active lanes read in one bank, summed over loads; at least one per load
with a nonzero), computed from the plan's arrays as docs/families.md lays them out, over the
first 512 nonempty tiles.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "profile"))

import sparsegen  # noqa: E402
from sparsegen.bench.weights import random_weight  # noqa: E402

import sass_loop  # noqa: E402

VARIANTS = ("bitmap=family=tiled_bitmap_spmm,granule=1;pairs=family=tiled_bitmap_spmm,granule=2;"
            "csl=family=tiled_csl_spmm;lanes=family=tiled_lanes_spmm;lanes.k64=family=tiled_lanes_spmm,tile_k=64;"
            "lanes.t256=family=tiled_lanes_spmm,tile_m=256")
SHOWN = ("mma", "ldmatrix", "shared load", "bit", "shuffle", "cp.async", "alu", "move", "branch", "barrier")


def parse_variants(text: str) -> list[tuple[str, dict]]:
    """'name=k=v,k=v;name=...' -> [(name, options)] (integers and True/False parsed)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, opts = part.partition("=")
        options = {}
        for kv in filter(None, opts.split(",")):
            k, _, v = kv.partition("=")
            options[k] = {"True": True, "False": False}.get(v, int(v) if v.lstrip("-").isdigit() else v)
        out.append((name, options))
    return out


def inner_trips(kernel, loop: sass_loop.LoopCount) -> dict:
    """Trips per tile of the inner loops on the path, where the plan fixes them: Tiled-CSL's loop over
    the vectors a ring slot could not hold runs none when the slot holds the fullest tile."""
    spec, plan = kernel.spec, kernel.plan
    if spec.family == "tiled_csl_spmm" and spec.cap_vecs >= plan.constants["max_tile_vectors"]:
        return {h: 0.0 for h, _, _ in loop.inner}
    return {}


def encoded_bytes(kernel) -> int:
    return sum(a.nbytes for name, a in kernel.plan.arrays.items() if name != "bias")


def lanes_wavefronts(plan, sample: int = 512) -> float | None:
    """Shared wavefronts of the value loads per nonempty tile (tiled_lanes plans only; see the module
    docstring), from the layout: per lane, BW bit words [warp][lane], uint16 offsets [warp][lane], then
    the values; a lane's slot s, when set, is read from value offset + (set slots before s)."""
    import numpy as np

    if plan.format != "tiled_lanes":
        return None
    c = plan.constants
    warps, lanes = c["warps"], 32 * c["warps"]
    slots = (c["tile_m"] // warps // 16) * (c["tile_k"] // 16) * 4
    bw = max(1, slots // 32)
    chunks = plan.arrays["tile_offsets"].astype(np.int64)
    start = 4 * chunks[np.flatnonzero(np.diff(chunks))[:sample]]
    if start.size == 0:
        return 0.0
    stream = plan.arrays["stream"]
    words = stream[start[:, None] + np.arange(lanes * bw)]
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").reshape(start.size, lanes, -1)[:, :, :slots]
    offs = stream[start[:, None] + lanes * bw + np.arange(lanes // 2)].view("<u2").reshape(start.size, lanes)
    bits = bits.astype(np.int64)
    rank = np.cumsum(bits, axis=2) - bits  # set slots before each slot
    bank = (offs[:, :, None].astype(np.int64) + rank) % 32
    load = (np.arange(start.size)[:, None, None] * warps + np.arange(lanes)[None, :, None] // 32) * slots + np.arange(slots)
    t, lane, s = np.nonzero(bits)
    per_bank = np.bincount(load[t, lane, s] * 32 + bank[t, lane, s], minlength=start.size * warps * slots * 32)
    return float(per_bank.reshape(-1, 32).max(axis=1).sum()) / start.size


def row(name: str, kernel, loop: sass_loop.LoopCount, m: int, k: int) -> dict:
    spec, c = kernel.spec, kernel.plan.constants
    per_trip = (spec.tile_m / 128) * (c.get("tile_k", 64) / 64)  # 128 x 64 tiles one trip covers
    path = loop.per_warp(spec.warps, inner_trips(kernel, loop))
    trips = max(spec.kt_per_split, 1)
    wf = lanes_wavefronts(kernel.plan)
    return {"variant": name, "spec": spec.name, "bytes_per_element": encoded_bytes(kernel) / (m * k),
            "body": loop.body, "path": path, "per_tile": path / per_trip, "outside_per_tile": loop.outside / trips / per_trip,
            "warps": spec.warps, "classes": {key: v / per_trip for key, v in loop.classes.items()},
            "wavefronts": None if wf is None else wf / spec.warps / per_trip}


def line(r: dict) -> str:
    cls = " ".join(f"{key.split()[0]}={r['classes'].get(key, 0):.0f}" for key in SHOWN)
    wf = "" if r["wavefronts"] is None else f" wf {r['wavefronts']:5.1f}"
    return (f"{r['variant']:10s} {r['bytes_per_element']:5.3f} B/el  per tile/warp {r['per_tile']:6.1f} "
            f"(+out {r['outside_per_tile']:5.1f}; body {r['body']}){wf}  x{r['warps']} warps = "
            f"{r['warps'] * (r['per_tile'] + r['outside_per_tile']):6.0f}/tile  [{cls}]  {r['spec']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="7168x7168")
    ap.add_argument("--sparsity", default="0.8,0.9")
    ap.add_argument("--n", default="8,16")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--dump", help="write each kernel's SASS here")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    m, k = (int(v) for v in args.shape.lower().split("x"))
    lines = [f"decode budget: {m}x{k}, uniform random W, SASS for sm_90 ({sparsegen.__version__})"]
    print(lines[0], flush=True)
    for s in (float(v) for v in args.sparsity.split(",")):
        t0 = time.time()
        w = random_weight(m, k, s, seed=0)
        for n in (int(v) for v in args.n.split(",")):
            head = f"-- sparsity {s:.0%}, N = {n}"
            print(head, flush=True)
            lines.append(head)
            for name, options in parse_variants(args.variants):
                try:
                    kernel = sparsegen.compile(w, op="spmm", n=n, dtype="float16", backend="emulate", arch="sm_90",
                                               options=options)
                    loop = sass_loop.count_cubin(kernel.cubin)
                except Exception as exc:  # a variant that declines or fails is reported, the rest go on
                    text = f"{name:10s} failed: {type(exc).__name__}: {exc}"
                else:
                    text = line(row(name, kernel, loop, m, k))
                    if args.dump:
                        os.makedirs(args.dump, exist_ok=True)
                        with open(os.path.join(args.dump, f"{name}_s{int(s * 100)}_n{n}.sass"), "w") as f:
                            f.write(sass_loop.disassemble(kernel.cubin))
                print(text, flush=True)
                lines.append(text)
        print(f"   ({time.time() - t0:.0f} s)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
