"""What the standalone kernel probes (bitmap_scatter_probe, sparse24_probe, wgmma_csl_probe) share:
the PTX wrappers their CUDA sources open with, and the harness that times a prototype beside cuBLAS
fp16 and sparsegen's own kernels on the same W and X (sparsegen.bench.timing.time_cuda: L2 warm, as
the llm suite), printing one row per kernel.

A probe's CUDA source is a str.format template with doubled braces; it takes CUDA_PRELUDE through a
`{PRELUDE}` field, so the prelude itself is plain CUDA.
"""
from __future__ import annotations

import numpy as np

# shared-memory address, 16-byte cp.async (L2 only), its group commit and wait
CUDA_PRELUDE = r"""__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int P> __device__ __forceinline__ void wait_groups() { asm volatile("cp.async.wait_group %0;\n" :: "n"(P) : "memory"); }"""

# the sparsegen kernels a probe can time beside its prototype: label -> compile options
BASELINES = {"selected": {}, "bitmap g1": {"family": "tiled_bitmap_spmm", "granule": 1},
             "bitmap g2": {"family": "tiled_bitmap_spmm", "granule": 2}, "csl": {"family": "tiled_csl_spmm"}}


def tile_starts(per_tile: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each tile's run of values padded to 8 halves (16-byte copies): (padded counts, the runs'
    starts in halves, then the end)."""
    padded = -(-per_tile // 8) * 8
    return padded, np.r_[0, np.cumsum(padded)]


def slice_offsets(tile_start: np.ndarray, per_warp: np.ndarray) -> np.ndarray:
    """The 4-warp kernels' slice starts (int32): per tile, where each warp's values begin (the tile's
    run in warp order), then the end four times, so tile u's slices are offs[4u .. 4u + 4]."""
    tiles = per_warp.shape[0]
    warp_start = tile_start[:-1, None] + np.c_[np.zeros(tiles, dtype=np.int64), np.cumsum(per_warp, axis=1)[:, :3]]
    return np.r_[warp_start.ravel(), np.full(4, tile_start[-1])].astype(np.int32)


def print_header() -> None:
    import torch

    print(f"# device: {torch.cuda.get_device_name()}; time_cuda medians (L2 warm); x = cuBLAS time / time")
    print(f"{'W':>11} {'sp':>4} {'N':>3} {'variant':28} {'us':>7} {'x':>6} {'err':>8}  spec")


def rel_error(y, ref) -> float:
    import torch

    return float(torch.linalg.norm(y.float() - ref) / torch.linalg.norm(ref))


def start_case(dense, n: int):
    """X (K x n, fp16, random), the fp32 reference W X, and the rows so far: cuBLAS fp16 timed.
    Returns (x, ref, cublas_ms, rows); a row is (label, ms, error, spec)."""
    import torch

    from sparsegen.bench.timing import time_cuda

    x = torch.randn(dense.shape[1], n, device="cuda", dtype=torch.float16)
    ref = dense.float() @ x.float()
    cublas = time_cuda(lambda: torch.matmul(dense, x))["median_ms"]
    return x, ref, cublas, [("cuBLAS fp16", cublas, 0.0, "torch.matmul")]


def time_baselines(w, x, ref, labels, rows: list) -> None:
    """Compile (as sparsegen.compile selects, or with a family forced) and time each labelled kernel."""
    import torch

    import sparsegen
    from sparsegen.bench.timing import time_cuda

    m, n = w.shape[0], x.shape[1]
    for label in labels:
        kern = sparsegen.compile(w, n=n, dtype="float16", options=BASELINES[label] or None)
        yk = torch.empty(m, n, dtype=torch.float16, device="cuda")
        kern(x, out=yk)
        rows.append((label, time_cuda(lambda: kern(x, out=yk))["median_ms"], rel_error(yk, ref), kern.spec.name))
        del kern


def time_prototype(launch, y, ref) -> tuple[float, float]:
    """One launch checked against `ref` (the prototype's output y, fp32), then the timed median:
    (ms, relative error). A launch error propagates."""
    import torch

    from sparsegen.bench.timing import time_cuda

    launch()
    torch.cuda.synchronize()
    err = rel_error(y, ref)
    return time_cuda(launch)["median_ms"], err


def print_rows(shape: str, sparsity: float, n: int, rows: list, cublas_ms: float) -> None:
    for label, ms, err, spec in rows:
        print(f"{shape:>11} {sparsity:4.2f} {n:3d} {label:28} {ms * 1e3:7.1f} {cublas_ms / ms:6.2f} {err:8.1e}  {spec}",
              flush=True)
