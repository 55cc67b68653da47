"""Probe of the tensor-core tile families (issue 6) against cuBLAS fp16, with forced spec variants.

    python benchmarks/tiled_probe.py                 # on the GPU machine; < 5 minutes
    python benchmarks/tiled_probe.py --quick         # 7168 x 7168 only
    python benchmarks/tiled_probe.py --cold          # also time the defaults with L2 flushed

W: uniform random sparsity (fp16 values), 7168 x 7168 and 28672 x 7168 at 50/70/90 % sparsity;
X: K x N fp16, N in {8, 16, 32, 64}. Per (W, N) the table has cuBLAS (torch.matmul on the dense W)
and every variant: `csl` / `bitmap` are the specs the families choose by default; the others force
spec options (options={...} as sparsegen.compile takes them) to show what each knob is worth:

  csl.old, bitmap.old         the previous chooser's tile height, split-K and atomics (N = 16, 64)
  csl.atomic, bitmap.atomic   split-K reduced by fp32 atomics instead of a thread block cluster
  csl.t64, bitmap.t64         64-row tiles (7168 x 7168 only)
  csl.t256, bitmap.t256       256-row tiles, N <= 32 (four m16 fragments per warp: half the X reads;
                              7168 x 7168 only)
  csl.st+2, bitmap.st+2       the ring two stages deeper than chosen
  csl.pf, bitmap.pf           with the bulk L2 prefetch of the next ring's tiles (off by default)
  csl.sk/2, csl.sk*2          half / double the chosen split-K (cluster reduction while <= 8)

Columns: us = median of CUDA-event timings (sparsegen.bench.timing.time_cuda: L2 warm, as the llm
benchmark measures; --cold adds a column with a 256 MB L2 flush before each launch), x = cuBLAS time
/ variant time, TB/s = (encoded W bytes + X + Y) / time, err = relative Frobenius error against the
fp32 product of the fp16 operands, regs / spill / smem / blk = registers per thread, local memory
bytes (spills), dynamic shared memory, resident blocks per SM (from registers and shared memory).
A variant that fails to build, launch or match prints an error row and the probe goes on.

--baseline-templates DIR adds, for each variant, the same spec rendered from the templates in DIR
(label `<variant>.base`): a template change A/B-timed against a saved copy in one run, e.g.
`git show HEAD:templates/tiled_bitmap_spmm.cu.j2` and its includes written to DIR.

Plans are encoded once per (matrix, format, tile height) in worker processes (forked before CUDA
starts) and shared by the variants; cubins compile in parallel threads (and are cached).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import math
import multiprocessing as mp
import os
import sys
import time
import traceback

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sparsegen.analyze import analyze  # noqa: E402
from sparsegen.api import Kernel  # noqa: E402
from sparsegen.families import _tiled as T  # noqa: E402
from sparsegen.families import tiled_bitmap_spmm as BM  # noqa: E402
from sparsegen.families import tiled_csl_spmm as CSL  # noqa: E402
from sparsegen.families.base import Request  # noqa: E402
from sparsegen.render import Provenance, render  # noqa: E402
from sparsegen.select import skinny_cost  # noqa: E402
from sparsegen.select.device import default as default_device  # noqa: E402

ARCH = "sm_90"
SHAPES = [(7168, 7168), (28672, 7168)]
SPARSITIES = [0.5, 0.7, 0.9]
NS = [8, 16, 32, 64]
TOL = 1e-2
FAMILIES = {"csl": CSL, "bitmap": BM}
# The previous chooser's picks (tile height, split-K, reduction) on these shapes, before the pipelines
# were rebuilt (llm_probe.txt was measured with them): forced on the new kernels as `<family>.old`.
OLD_CHOICES = {
    (7168, 7168, 0.5, 16): {"csl": (128, 10, "atomic"), "bitmap": (64, 5, "atomic")},
    (7168, 7168, 0.5, 64): {"csl": (64, 4, "atomic"), "bitmap": (64, 4, "atomic")},
    (7168, 7168, 0.7, 16): {"csl": (64, 6, "atomic"), "bitmap": (64, 7, "atomic")},
    (7168, 7168, 0.7, 64): {"csl": (64, 4, "atomic"), "bitmap": (64, 4, "atomic")},
    (7168, 7168, 0.9, 16): {"csl": (64, 7, "atomic"), "bitmap": (64, 7, "atomic")},
    (7168, 7168, 0.9, 64): {"csl": (64, 5, "atomic"), "bitmap": (64, 5, "atomic")},
    (28672, 7168, 0.5, 16): {"csl": (128, 3, "atomic"), "bitmap": (128, 3, "atomic")},
    (28672, 7168, 0.5, 64): {"csl": (64, 1, "none"), "bitmap": (64, 1, "none")},
    (28672, 7168, 0.7, 16): {"csl": (128, 3, "atomic"), "bitmap": (128, 4, "atomic")},
    (28672, 7168, 0.7, 64): {"csl": (64, 1, "none"), "bitmap": (64, 1, "none")},
    (28672, 7168, 0.9, 16): {"csl": (64, 2, "atomic"), "bitmap": (128, 4, "atomic")},
    (28672, 7168, 0.9, 64): {"csl": (64, 1, "none"), "bitmap": (64, 2, "two_step")},
}

_MATRICES: dict = {}  # (m, k, sparsity) -> csr, filled before the encoder processes fork


# ---- operands ---------------------------------------------------------------------------------

def random_weight(m: int, k: int, density: float, seed: int) -> sp.csr_matrix:
    """Uniform random pattern, standard normal values rounded to fp16, canonical CSR."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for r0 in range(0, m, 1024):
        mask = rng.random((min(1024, m - r0), k), dtype=np.float32) < density
        r, c = np.nonzero(mask)
        rows.append(r.astype(np.int64) + r0)
        cols.append(c.astype(np.int32))
    r, c = np.concatenate(rows), np.concatenate(cols)
    vals = rng.standard_normal(r.size, dtype=np.float32).astype(np.float16).astype(np.float32)
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=m), out=indptr[1:])
    return sp.csr_matrix((vals, c, indptr.astype(np.int32)), shape=(m, k))


# ---- variants ---------------------------------------------------------------------------------

def split_grid(fam_name: str, stats, n: int, splits, heights, warps=(4,)) -> list[tuple[str, dict]]:
    """`--sweep split`: the default, then every (warps, tile height, split-K) of the grid with atomics."""
    out = [(fam_name, {})]
    k_tiles = -(-stats.shape[1] // T.TILE_K)
    for w in warps:
        for h in heights:
            if h < 16 * w or T.accumulators(h, T.block_n(n), w) > T.MAX_ACCUMULATORS:
                continue
            for s in splits:
                if s == 1 or k_tiles // s >= 2:
                    label = f"{fam_name}.t{h}.sk{s}" + (f".w{w}" if w != T.WARPS else "")
                    out.append((label, {"tile_m": h, "split_k": s, "warps": w}
                                | ({"reduction": "atomic"} if s > 1 else {})))
    return out


def probe_weight(m: int, k: int, sparsity: float) -> sp.csr_matrix:
    """The W every tile probe times for (m, k, sparsity): its seed fixed by the shape and sparsity,
    so that the probes' tables compare the same matrix."""
    return random_weight(m, k, 1 - sparsity, seed=m + 7 * k + int(round(100 * sparsity)))


def warp_k_grid(fam_name: str, n: int) -> list[tuple[str, dict]]:
    """`--sweep warpk`: the default, and Tiled-CSL with 2 and 4 k-groups where the accumulators allow."""
    out = [(fam_name, {})]
    if fam_name == "csl":
        for wk in (2, 4):
            if T.accumulators(128, T.block_n(n), T.WARPS, wk) <= T.MAX_ACCUMULATORS:
                out.append((f"csl.wk{wk}", {"warp_k": wk}))
    return out


def bn_grid(fam_name: str, n: int) -> list[tuple[str, dict]]:
    """`--sweep bn`: the default, and narrower column blocks (options bn=: N / 2 and N / 4 columns per
    block, several blocks per row tile re-reading its W), also with 256-row tiles where the
    accumulators allow (each warp's X fragments then serve four m16 fragments instead of two)."""
    out = [(fam_name, {})]
    full = T.block_n(n)
    for bn in (full // 2, full // 4):
        if bn < 8:
            continue
        out.append((f"{fam_name}.bn{bn}", {"bn": bn}))
        if T.accumulators(256, bn) <= T.MAX_ACCUMULATORS:
            out.append((f"{fam_name}.bn{bn}.t256", {"bn": bn, "tile_m": 256}))
    return out


def tall_grid(fam_name: str, n: int) -> list[tuple[str, dict]]:
    """`--sweep tall`: the default and 256-row tiles with 4 warps (64 rows, four m16 fragments per warp:
    each warp's B fragments serve twice the rows), at any N the accumulator cap (--max-acc) allows."""
    out = [(fam_name, {})]
    if T.accumulators(256, T.block_n(n)) <= T.MAX_ACCUMULATORS:
        out.append((f"{fam_name}.t256", {"tile_m": 256}))
    return out


def reduction_grid(fam_name: str, stats, n: int) -> list[tuple[str, dict]]:
    """`--sweep reduction`: the default, and where it splits K, the same split reduced by fp32 atomics,
    by a second launch and by a thread block cluster (at most 8 blocks)."""
    out = [(fam_name, {})]
    base, _ = choose(FAMILIES[fam_name], stats, Request("spmm", n=n, dtype="float16", arch=ARCH))
    if base.split_k > 1:
        for how in ("atomic", "two_step", "cluster"):
            if base.reduction != how and (how != "cluster" or base.split_k <= T.MAX_CLUSTER):
                out.append((f"{fam_name}.{how}", {"split_k": base.split_k, "reduction": how}))
    return out


def wgmma_grid(fam_name: str) -> list[tuple[str, dict]]:
    """`--sweep wgmma`: the default (mma.sync) and the same spec with warpgroup MMA (options wgmma=)."""
    return [(fam_name, {"wgmma": False}), (f"{fam_name}.wg", {"wgmma": True})]


def encodings(fam_name: str) -> list[tuple[str, dict]]:
    """(label, options) of each encoding of a family, forced: Tiled-CSL, or both bitmap granules."""
    return [("csl", {})] if fam_name == "csl" else [("bitmap", {"granule": 1}), ("bitmap.g2", {"granule": 2})]


def granule_grid(fam_name: str, stats, n: int, full: bool) -> list[tuple[str, dict]]:
    """`--sweep granule`: each family's default, and bitmap with a bit per mma register (options
    granule=2); with --granule-knobs, that spec's tile heights, residency and ring depth too."""
    out = encodings(fam_name)
    if full and fam_name != "csl":
        base, _ = choose(BM, stats, Request("spmm", n=n, dtype="float16", arch=ARCH, options=(("granule", 2),)))
        for h in (64, 128, 256):
            if h != base.tile_m and T.accumulators(h, T.block_n(n)) <= T.MAX_ACCUMULATORS:
                out.append((f"bitmap.g2.t{h}", {"granule": 2, "tile_m": h}))
        out.append(("bitmap.g2.st+2", {"granule": 2, "stages": base.stages + 2}))
        out.append(("bitmap.g2.sk*2", {"granule": 2, "split_k": base.split_k * 2, "reduction": "atomic"}))
    return out


def stream_variants(fam_name: str) -> list[tuple[str, dict]]:
    """`--sweep stream`: Tiled-CSL and both bitmap encodings with their split-K grid, and the same
    with stream-K (options reduction='stream': the resident blocks share all tile products)."""
    return [v for label, options in encodings(fam_name) for v in ((label, options), (f"{label}.stream", {**options, "reduction": "stream"}))]


def blocks_variants(fam_name: str, stats, n: int) -> list[tuple[str, dict]]:
    """`--sweep blocks`: Tiled-CSL and both bitmap encodings as chosen, and with one more resident
    block per SM (options blocks=: ptxas held to the registers it leaves, the ring and the split-K
    chosen for that residency)."""
    out = []
    for label, options in encodings(fam_name):
        out.append((label, options))
        spec, _ = choose(FAMILIES[fam_name], stats, request_for(n, options))
        if spec.min_blocks + 1 <= T.block_limit(T.THREADS, default_device()):
            out.append((f"{label}.mb{spec.min_blocks + 1}", {**options, "blocks": spec.min_blocks + 1}))
    return out


def waves_grid(fam_name: str, n: int) -> list[tuple[str, dict]]:
    """`--sweep waves` (wide blocks): the default, and each encoding with split-K 1-8 (a second
    launch reduces) at 3 and 4 resident blocks per SM: what `T.wave_factor` and the wide reduction's
    cost are fitted to."""
    out = encodings(fam_name)
    for label, options in encodings(fam_name):
        for split in (1, 2, 3, 4, 6, 8):
            for blocks in ((None,) if fam_name == "csl" else (3, 4)):
                forced = {**options, "split_k": split, "tile_m": 128} | ({"reduction": "two_step"} if split > 1 else {})
                forced |= {"blocks": blocks} if blocks else {}
                out.append((f"{label}.s{split}{f'b{blocks}' if blocks else ''}", forced))
    return out


def variants(fam_name: str, stats, n: int, full: bool, sparsity: float | None = None) -> list[tuple[str, dict]]:
    """(label, options) of the variants of one family for one (W, N)."""
    out = [(fam_name, {})]
    if not full:
        return out
    old = OLD_CHOICES.get((*stats.shape, sparsity, n), {}).get(fam_name)
    if old is not None:
        tile_m, split_k, reduction = old
        out.append((f"{fam_name}.old", {"tile_m": tile_m, "split_k": split_k}
                    | ({"reduction": reduction} if split_k > 1 else {})))
    fam = FAMILIES[fam_name]
    base, _ = choose(fam, stats, Request("spmm", n=n, dtype="float16", arch=ARCH))
    if base.split_k > 1:
        out.append((f"{fam_name}.atomic", {"split_k": base.split_k, "reduction": "atomic"}))
    if stats.shape[0] <= 8192:  # other tile heights on the smaller W only (their plans take encoding time)
        if base.tile_m != 64:
            out.append((f"{fam_name}.t64", {"tile_m": 64}))
        if base.tile_m != 256 and n <= 32:
            out.append((f"{fam_name}.t256", {"tile_m": 256}))
    out.append((f"{fam_name}.st+2", {"stages": base.stages + 2}))
    out.append((f"{fam_name}.pf", {"l2_prefetch": True}))
    if fam_name == "bitmap":
        out.append(("bitmap.sk*2", {"split_k": base.split_k * 2, "reduction": "atomic"}))
    if fam_name == "csl":
        if base.split_k > 1:
            out.append(("csl.sk/2", {"split_k": max(1, base.split_k // 2)}))
        out.append(("csl.sk*2", {"split_k": base.split_k * 2}))
    return out


def request_for(n: int, options: dict) -> Request:
    return Request("spmm", n=n, dtype="float16", arch=ARCH, options=tuple(sorted(options.items())))


def initial_spec(fam, stats, n: int, options: dict):
    request = request_for(n, options)
    declined = T.gate(stats, request)
    if declined is not None:
        raise RuntimeError(f"gate declines: {declined.reason}")
    spec, reason = choose(fam, stats, request)
    return request, spec, reason


def choose(fam, stats, request: Request):
    """The spec selection builds for the family (the split weighed by the skinny cost model)."""
    return skinny_cost.build(stats, request, fam.FAMILY)


def plan_key(fam, spec) -> tuple:
    return (fam.FAMILY, spec.tile_m, getattr(spec, "strict_banks", False), spec.warps, getattr(spec, "granule", 1))


def _encode(job):
    """Worker: encode one (matrix, family, tile height) plan (forked: the matrices are inherited)."""
    shape_key, fam_name, spec = job
    t = time.perf_counter()
    plan = FAMILIES[fam_name].encode(_MATRICES[shape_key], spec)
    return job[0], fam_name, plan_key(FAMILIES[fam_name], spec), plan, time.perf_counter() - t


# ---- GPU side ---------------------------------------------------------------------------------

def plan_bytes(plan) -> int:
    return int(sum(a.nbytes for name, a in plan.arrays.items() if name != "bias"))


def occupancy(regs: int, smem: int, static: int) -> int:
    device = default_device()
    by_regs = device.registers_per_sm // (T.THREADS * max(8, -(-regs // 8) * 8))
    by_smem = device.shared_per_sm // (smem + static + T.SMEM_PER_BLOCK_RESERVED)
    return max(0, min(T.block_limit(T.THREADS, device), by_regs, by_smem))


def function_resources(kernel) -> tuple[int, int]:
    """(registers per thread, local memory bytes per thread) of the kernel's main function, or -1s."""
    try:
        import pycuda.driver as drv

        func = kernel.launcher().steps[0].func
        attr = drv.function_attribute
        return func.get_attribute(attr.NUM_REGS), func.get_attribute(attr.LOCAL_SIZE_BYTES)
    except Exception:  # pragma: no cover - informational only
        return -1, -1


def cold_time_ms(torch, fn, flush, runs: int = 15) -> float:
    """Median GPU time of `fn` with L2 flushed before each launch (a 256 MB write, which also covers
    the host's launch of `fn`, like time_cuda's spin)."""
    times = []
    for _ in range(runs + 2):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times[2:]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="7168 x 7168 only")
    ap.add_argument("--cold", action="store_true", help="also time the default variants with L2 flushed")
    ap.add_argument("--sparsity", type=float, nargs="*", default=SPARSITIES)
    ap.add_argument("--n", type=int, nargs="*", default=NS)
    ap.add_argument("--shapes", type=str, nargs="*", default=None, help="MxK, e.g. 7168x7168")
    ap.add_argument("--sweep", choices=("all", "some", "none", "split", "warpk", "wgmma", "bn", "tall", "reduction", "granule",
                                            "stream", "blocks", "waves"),
                    default="some",
                    help="forced variants for every (W, N), for N in {16, 64} (default), or none; "
                         "split: the --splits x --heights grid (atomics) for every (W, N); "
                         "warpk: Tiled-CSL with its warps in 1, 2 and 4 k-groups (options warp_k=); "
                         "wgmma: each family with mma.sync and with warpgroup MMA (options wgmma=)")
    ap.add_argument("--granule-knobs", action="store_true", help="--sweep granule: also the pair spec's knobs")
    ap.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4, 7, 14, 28])
    ap.add_argument("--heights", type=int, nargs="*", default=[128])
    ap.add_argument("--warps", type=int, nargs="*", default=[4])
    ap.add_argument("--max-acc", type=int, default=None,
                    help="raise the families' cap on fp32 accumulators per thread (sparsegen's is 64)")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 4))
    ap.add_argument("--baseline-templates", default=None, metavar="DIR",
                    help="also time each variant rendered from the templates in DIR (label <variant>.base)")
    ap.add_argument("--families", nargs="*", choices=sorted(FAMILIES), default=sorted(FAMILIES))
    args = ap.parse_args()
    if args.max_acc is not None:
        T.MAX_ACCUMULATORS = args.max_acc  # the gate reads it at call time
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    t_start = time.time()
    lines: list[str] = []
    out_dir = os.environ.get("OUT")

    def emit(text: str = ""):
        print(text, flush=True)
        lines.append(text)

    # 1. matrices and their statistics (before any CUDA, so the encoder workers can fork)
    stats = {}
    for (m, k) in shapes:
        for s in args.sparsity:
            key = (m, k, s)
            _MATRICES[key] = probe_weight(m, k, s)
            stats[key] = analyze(_MATRICES[key])
    emit(f"# tiled_probe: {len(_MATRICES)} matrices built and analysed in {time.time() - t_start:.0f} s")

    # 2. every variant's initial spec; the distinct plans they need, encoded in parallel
    todo = []  # (key, n, label, fam_name, options)
    for key in _MATRICES:
        for n in args.n:
            full = args.sweep == "all" or (args.sweep == "some" and n in (16, 64))
            for fam_name in args.families:
                if args.sweep == "split":
                    grid = split_grid(fam_name, stats[key], n, args.splits, args.heights, args.warps)
                elif args.sweep == "warpk":
                    grid = warp_k_grid(fam_name, n)
                elif args.sweep == "wgmma":
                    grid = wgmma_grid(fam_name)
                elif args.sweep == "reduction":
                    grid = reduction_grid(fam_name, stats[key], n)
                elif args.sweep == "tall":
                    grid = tall_grid(fam_name, n)
                elif args.sweep == "bn":
                    grid = bn_grid(fam_name, n)
                elif args.sweep == "stream":
                    grid = stream_variants(fam_name)
                elif args.sweep == "waves":
                    grid = waves_grid(fam_name, n)
                elif args.sweep == "blocks":
                    grid = blocks_variants(fam_name, stats[key], n)
                elif args.sweep == "granule":
                    grid = granule_grid(fam_name, stats[key], n, args.granule_knobs)
                else:
                    grid = variants(fam_name, stats[key], n, full, key[2])
                for label, options in grid:
                    todo.append((key, n, label, fam_name, options))
                    if args.baseline_templates:
                        todo.append((key, n, label + ".base", fam_name, options))
    jobs = {}
    for key, n, label, fam_name, options in todo:
        try:
            _, spec, _ = initial_spec(FAMILIES[fam_name], stats[key], n, options)
            jobs.setdefault((key, plan_key(FAMILIES[fam_name], spec)), (key, fam_name, spec))
        except Exception:  # reported when the variant runs
            pass
    plans = {}
    t = time.time()
    with cf.ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("fork")) as pool:
        for key, fam_name, pk, plan, secs in pool.map(_encode, list(jobs.values())):
            plans[(key, pk)] = plan
    emit(f"# {len(plans)} plans encoded in {time.time() - t:.0f} s ({args.jobs} processes)")

    # 3. kernels (specs finalized against their plans), cubins compiled in parallel
    kernels = {}
    for key, n, label, fam_name, options in todo:
        fam = FAMILIES[fam_name]
        try:
            request, spec, _ = initial_spec(fam, stats[key], n, options)
            base = plans[(key, plan_key(fam, spec))]
            spec = fam.finalize(spec, T.with_scratch(base, spec), request)
            plan = T.with_scratch(base, spec)
            root = args.baseline_templates if label.endswith(".base") else None
            source = render(spec, Provenance("probe", "python benchmarks/tiled_probe.py"), root)
            kernels[(key, n, label)] = (Kernel(spec=spec, selection=None, plan=plan, source=source, request=request,
                                               backend="gpu", arch=ARCH, structure="probe"), base)
        except Exception as exc:
            kernels[(key, n, label)] = exc
    t = time.time()

    def build(item):
        k = item[1]
        if isinstance(k, tuple):
            try:
                k[0].cubin  # noqa: B018 - compiles (or loads from the cache)
            except Exception as exc:
                return item[0], exc
        return item[0], None

    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for ident, exc in pool.map(build, list(kernels.items())):
            if exc is not None:
                kernels[ident] = exc
    failed = [f"{ident[2]} (N={ident[1]}, {ident[0]}): {str(k).splitlines()[0][:120]}" for ident, k in kernels.items()
              if isinstance(k, Exception)]
    emit(f"# {len(kernels)} kernels compiled in {time.time() - t:.0f} s; {len(failed)} failed to build"
         + "".join(f"\n#   {f}" for f in failed[:10]))

    # 4. GPU: cuBLAS, every variant; correctness against the fp32 product
    import torch

    from sparsegen import runtime
    from sparsegen.bench.timing import time_cuda

    flush = torch.empty(64 * 2**20, dtype=torch.float32, device="cuda") if args.cold else None
    emit(f"# device: {torch.cuda.get_device_name()}; time_cuda medians (L2 warm)"
         f"{'; cold = L2 flushed' if args.cold else ''}")
    header = (f"{'W':>12} {'sp':>4} {'N':>3} {'variant':<14} {'us':>8} {'x':>6} {'TB/s':>6} {'err':>8} "
              f"{'regs':>4} {'spill':>5} {'smem':>6} {'blk':>3}{' cold_us  cold_x' if args.cold else ''}  spec")
    summary: dict = {}  # (label_family, sparsity) -> [speedups]
    for key in _MATRICES:
        m, k, s = key
        csr = _MATRICES[key]
        wd = torch.from_numpy(csr.toarray()).cuda().half()
        uploads = {}
        emit()
        emit(header)
        for n in args.n:
            x = torch.randn((k, n), dtype=torch.float16, device="cuda")
            ref = wd.float() @ x.float()
            ref_norm = ref.norm().item()
            cub = time_cuda(lambda: torch.matmul(wd, x), min_ms=50.0)["median_ms"]
            cub_cold = cold_time_ms(torch, lambda: torch.matmul(wd, x), flush) if args.cold else None
            dense_bytes = 2 * (m * k + k * n + m * n)
            emit(f"{m}x{k:<6} {s:>4} {n:>3} {'cuBLAS':<14} {cub * 1e3:8.1f} {1.0:6.2f} "
                 f"{dense_bytes / cub / 1e9:6.2f} {'':>8} {'':>4} {'':>5} {'':>6} {'':>3}"
                 f"{f' {cub_cold * 1e3:8.1f} {1.0:6.2f}' if args.cold else ''}  torch.matmul fp16")
            for (kk, nn, label), item in kernels.items():
                if kk != key or nn != n:
                    continue
                prefix = f"{m}x{k:<6} {s:>4} {n:>3} {label:<14}"
                if isinstance(item, Exception):
                    emit(f"{prefix} ERROR build: {type(item).__name__}: {str(item).splitlines()[0][:160]}")
                    continue
                kernel, base = item
                try:
                    if id(base) not in uploads:
                        uploads[id(base)] = runtime.upload(base.arrays)
                    kernel._device_arrays = uploads[id(base)]  # variants of one plan share its device copy
                    y = torch.empty((m, n), dtype=torch.float16, device="cuda")
                    kernel(x, out=y)
                    torch.cuda.synchronize()
                    err = ((y.float() - ref).norm() / ref_norm).item()
                    ms = time_cuda(lambda: kernel(x, out=y), min_ms=50.0)["median_ms"]
                    kernel(x, out=y)  # split-K workspaces are left clean: the result still holds
                    torch.cuda.synchronize()
                    err = max(err, ((y.float() - ref).norm() / ref_norm).item())
                    regs, local = function_resources(kernel)
                    smem = kernel.spec.shared_bytes
                    static = getattr(kernel.spec, "static_bytes", 0)
                    blk = occupancy(regs, smem, static)
                    moved = plan_bytes(base) + 2 * (k * n + m * n)
                    cold = ""
                    if args.cold and label in FAMILIES:
                        cms = cold_time_ms(torch, lambda: kernel(x, out=y), flush)
                        cold = f" {cms * 1e3:8.1f} {cub_cold / cms:6.2f}"
                    flag = "" if err <= TOL and math.isfinite(err) else "  MISMATCH"
                    emit(f"{prefix} {ms * 1e3:8.1f} {cub / ms:6.2f} {moved / ms / 1e9:6.2f} {err:8.1e} "
                         f"{regs:>4} {local:>5} {smem // 1024:>5}K {blk:>3}{cold}  {kernel.spec.name}{flag}")
                    if not flag:
                        summary.setdefault((label, s), []).append(cub / ms)
                except Exception as exc:
                    detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
                    emit(f"{prefix} ERROR run: {detail[:200]}")
            del x, ref
        del wd, uploads
        torch.cuda.empty_cache()

    # 5. geomeans of speedup over cuBLAS, per variant and sparsity (all shapes and N run)
    emit()
    emit("# geomean speedup over cuBLAS fp16 (shapes and N of this run); bitmap/csl = ratio of the defaults")
    labels = sorted({lab for lab, _ in summary}, key=lambda lab: (lab.split(".")[0], lab))
    emit(f"{'variant':<14} " + " ".join(f"{f'{int(s * 100)}%':>8}" for s in args.sparsity))
    for lab in labels:
        cells = []
        for s in args.sparsity:
            v = summary.get((lab, s))
            cells.append(f"{math.exp(np.mean(np.log(v))):8.2f}" if v else f"{'-':>8}")
        emit(f"{lab:<14} " + " ".join(cells))
    cells = []
    for s in args.sparsity:
        b, c = summary.get(("bitmap", s)), summary.get(("csl", s))
        cells.append(f"{math.exp(np.mean(np.log(b)) - np.mean(np.log(c))):8.2f}" if b and c and len(b) == len(c)
                     else f"{'-':>8}")
    emit(f"{'bitmap/csl':<14} " + " ".join(cells))
    emit(f"# total {time.time() - t_start:.0f} s")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "tiled_probe.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
