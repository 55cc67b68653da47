"""Probe (issue 4's lead): float32 GEMM by 3xTF32 on Hopper's warpgroup MMA, against the mma.sync kernel
of `dense_tile_spmm` and cuBLAS SGEMM, to learn what wgmma would be worth to the fp32 tensor-core families.

    python benchmarks/wgmma_tf32_probe.py [--m 4096 --k 4096 --n 128,256,1024] [--variants 128x4,64x3]

Y = W X with W (M x K) dense fp32, X (K x N). The standalone kernel computes Y^T = X^T W^T so that both
wgmma operands meet tf32's K-major rule without a transpose: A = X^T from registers (a warp's 16
columns of X read from the staged slice by scalar loads and split into hi/lo, the mma.sync m16n8k8
A layout), B = W^T from shared memory, whose rows are W's rows with k contiguous (K-major), in 8 x 4
core matrices without swizzle (LBO = 128 B along k, SBO = SK/4 x 128 B along W's rows). W is split
into hi and lo planes on the host (W is the static operand: a plan-time encoding), or with variant
suffix `w` copied as one float32 plane and split in shared memory. Suffix `p` sums each slice in
fresh accumulators promoted into float32 registers (without it the error is 1xTF32-like). Per k8 step three
wgmma: lo*hi, hi*lo, hi*hi (3xTF32, float32 accuracy as in `_tf32x3.cuh.j2`). A block is two
warpgroups (128 columns of X) by BM rows of W; K in slices of SK = 32 through a cp.async ring of SLOTS
slots, AHEAD = SLOTS - 2 slices in flight, one wgmma group in flight while the next slice's A
fragments load. Shapes must be multiples of the tiles (a probe, not a family).

Prints, per shape: time (median of time_cuda), fp32-equivalent TFLOP/s (2 M K N / t), max relative
error against float64 (all of Y), beside cuBLAS SGEMM (torch.matmul, TF32 off) and dense_tile_spmm
forced on the same W (its dense tiles: W at 0 % sparsity). Needs a GPU, torch and sparsegen.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WGS = 2  # warpgroups per block: 64 columns of X each
SK = 32  # K slice


def source(m: int, k: int, n: int, bm: int, slots: int, swap: bool = False, promote: bool = False,
           insplit: bool = False) -> str:
    """The kernel for one shape; `swap` exchanges the descriptor's LBO and SBO (a layout check);
    `promote` sums each slice in fresh tensor-core accumulators and adds them into float32 registers
    (one group in flight at a time), as dense_tile_spmm does for mma.sync; `insplit` copies W's float32
    plane alone (half the L2 traffic of W) and splits it into hi (in place) and lo in shared memory."""
    planes = 1 if insplit else 2
    insplit_code = ("""        {
            // W's float32 plane -> hi (in place) and lo: 16-byte chunks, the core-matrix layout kept
            float4* wh = reinterpret_cast<float4*>(smem + (t % SLOTS) * SLOT);
            float4* wl = reinterpret_cast<float4*>(smem + (t % SLOTS) * SLOT + W_PLANE);
#pragma unroll
            for (int round = 0; round < W_PLANE / 16 / THREADS; ++round) {
                const int i = threadIdx.x + round * THREADS;
                const float4 v = wh[i];
                uint32_t h0, l0, h1, l1, h2, l2, h3, l3;
                split(__float_as_uint(v.x), h0, l0); split(__float_as_uint(v.y), h1, l1);
                split(__float_as_uint(v.z), h2, l2); split(__float_as_uint(v.w), h3, l3);
                wh[i] = make_float4(__uint_as_float(h0), __uint_as_float(h1), __uint_as_float(h2), __uint_as_float(h3));
                wl[i] = make_float4(__uint_as_float(l0), __uint_as_float(l1), __uint_as_float(l2), __uint_as_float(l3));
            }
            asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // st.shared before wgmma's reads
            __syncthreads();
        }""" if insplit else "")
    from sparsegen.render import environment

    tf32x3 = environment().get_template("_tf32x3.cuh.j2").render()  # the families' split, not a copy
    acc = bm // 2  # fp32 accumulators per thread: 64 x BM per warpgroup over 128 threads
    outs = ", ".join(f"%{i}" for i in range(acc))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
    return f"""
#include <cstdint>
constexpr int M = {m}, K = {k}, N = {n};
constexpr int BM = {bm};  // W rows per block: wgmma's N
constexpr int BNX = 64 * {WGS};  // X columns per block: 64 per warpgroup (wgmma's M)
constexpr int SK = {SK}, KS = K / SK;
constexpr int SLOTS = {slots}, AHEAD = SLOTS - 2;
constexpr int THREADS = 128 * {WGS};
constexpr int XS = BNX + 8;  // padded staged X row (floats): lanes (k = t, n = g) hit 32 banks
constexpr int W_PLANE = BM * SK * 4;
constexpr int X_BYTES = SK * XS * 4;
constexpr int SLOT = 2 * W_PLANE + X_BYTES;
constexpr int SBO = (SK / 4) * 128;  // bytes between 8-row core-matrix groups of a W plane
constexpr int LBO_ = {"SBO" if swap else "128"}, SBO_ = {"128" if swap else "SBO"};  // descriptor fields
static_assert(M % BM == 0 && N % BNX == 0 && K % SK == 0, "probe shapes are whole tiles");

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(dst), "l"(src) : "memory");
}}
__device__ __forceinline__ uint64_t desc(uint32_t a) {{
    return (uint64_t)((a & 0x3ffff) >> 4) | ((uint64_t)(LBO_ >> 4) << 16) | ((uint64_t)(SBO_ >> 4) << 32);
}}
{tf32x3}
template <int SCALE_D>  // 0: d = a b (a slice's first product), 1: d += a b
__device__ __forceinline__ void wgmma(float (&d)[{acc}], const uint32_t (&a)[4], uint64_t b) {{
    asm volatile("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{acc + 5}, 0;\\n\\t"
        "wgmma.mma_async.sync.aligned.m64n{bm}k8.f32.tf32.tf32 {{ {outs} }}, "
        "{{ %{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3} }}, %{acc + 4}, p, 1, 1;\\n\\t}}\\n"
        : {cons}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(SCALE_D) : "memory");
}}

// Slice t of W (hi and lo planes, core-matrix layout) and of X (row-major, padded) into slot `s`.
__device__ __forceinline__ void issue(uint32_t s, const float* __restrict__ whi, const float* __restrict__ wlo,
                                      const float* __restrict__ x, int t, int m0, int n0) {{
    const int k0 = t * SK;
    constexpr int WCH = BM * (SK / 4);
static_assert(({planes} * WCH) % THREADS == 0 && (SK * (BNX / 4)) % THREADS == 0, "whole rounds of copies");
#pragma unroll
    for (int round = 0; round < {planes} * WCH / THREADS; ++round) {{
        const int i = threadIdx.x + round * THREADS;
        const int plane = i / WCH, j = i % WCH, r = j / (SK / 4), c = j % (SK / 4);
        const float* src = (plane ? wlo : whi) + (size_t)(m0 + r) * K + k0 + 4 * c;
        cp16(s + plane * W_PLANE + ((r >> 3) * (SK / 4) + c) * 128 + (r & 7) * 16, src);
    }}
#pragma unroll
    for (int round = 0; round < SK * (BNX / 4) / THREADS; ++round) {{
        const int i = threadIdx.x + round * THREADS;
        const int r = i / (BNX / 4), c = i % (BNX / 4);
        cp16(s + 2 * W_PLANE + (r * XS + 4 * c) * 4, x + (size_t)(k0 + r) * N + n0 + 4 * c);
    }}
}}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
wgmma_tf32_gemm(const float* __restrict__ whi, const float* __restrict__ wlo, const float* __restrict__ x,
                float* __restrict__ y) {{
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const int n0 = blockIdx.x * BNX, m0 = blockIdx.y * BM;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tg = lane & 3;
    const int ncol = (warp >> 2) * 64 + (warp & 3) * 16 + g;  // this thread's A rows: X columns ncol, ncol + 8
    float d[{acc}];
#pragma unroll
    for (int i = 0; i < {acc}; ++i) d[i] = 0.0f;
{"    float pd[" + str(acc) + "];  // a slice's products, promoted into d once done" if promote else ""}
    uint32_t ahi[2][SK / 8][4], alo[2][SK / 8][4];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {{
        if (u < KS) issue(base + u * SLOT, whi, wlo, x, u, m0, n0);
        asm volatile("cp.async.commit_group;\\n" ::: "memory");
    }}
    auto step = [&](int t, uint32_t (&ah)[SK / 8][4], uint32_t (&al)[SK / 8][4]) {{
        asm volatile("cp.async.wait_group %0;\\n" :: "n"(AHEAD - 1) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
        __syncthreads();  // slice t everyone's; every warpgroup waited out group t - 2: its slot is free
        if (t + AHEAD < KS) issue(base + ((t + AHEAD) % SLOTS) * SLOT, whi, wlo, x, t + AHEAD, m0, n0);
        asm volatile("cp.async.commit_group;\\n" ::: "memory");
        const uint32_t s = base + (t % SLOTS) * SLOT;
{insplit_code}
        const float* xs = reinterpret_cast<const float*>(smem + (t % SLOTS) * SLOT + 2 * W_PLANE);
#pragma unroll
        for (int q = 0; q < SK / 8; ++q)
#pragma unroll
            for (int r = 0; r < 4; ++r) {{
                const int kk = 8 * q + tg + (r >= 2 ? 4 : 0), nn = ncol + (r & 1 ? 8 : 0);
                split(__float_as_uint(xs[kk * XS + nn]), ah[q][r], al[q][r]);
            }}
        asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
#pragma unroll
        for (int q = 0; q < SK / 8; ++q) {{
            const uint64_t bh = desc(s + q * 256), bl = desc(s + W_PLANE + q * 256);
{"            if (q == 0) wgmma<0>(pd, al[q], bh); else wgmma<1>(pd, al[q], bh);" if promote else "            wgmma<1>(d, al[q], bh);"}
            wgmma<1>({"pd" if promote else "d"}, ah[q], bl);
            wgmma<1>({"pd" if promote else "d"}, ah[q], bh);
        }}
        asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned {0 if promote else 1};\\n" ::: "memory");
{"#pragma unroll" if promote else ""}
{"        for (int i = 0; i < " + str(acc) + "; ++i) d[i] += pd[i];" if promote else ""}
    }};
    for (int t = 0; t < KS; t += 2) {{
        step(t, ahi[0], alo[0]);
        if (t + 1 < KS) step(t + 1, ahi[1], alo[1]);
    }}
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
    // d[4j + e] = D[row][col], D = Y^T: row = X column (ncol, + 8 for e >= 2), col = W row 8j + 2 tg (+ 1 for odd e)
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {{
            const int row = m0 + 8 * j + 2 * tg + (e & 1), col = n0 + ncol + (e >= 2 ? 8 : 0);
            y[(size_t)row * N + col] = d[4 * j + e];
        }}
}}
"""


def tf32_round(a: np.ndarray) -> np.ndarray:
    """`split`'s hi (templates/_tf32x3.cuh.j2) on the host: round to TF32 (half an ulp added, low 13 bits cleared)."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", default="128,256,1024")
    ap.add_argument("--variants", default="128x4,128x4p,64x4,64x4p", help="BMxSLOTS list; suffixes: s swaps LBO/SBO, p promotes each slice, w splits W in shared memory")
    ap.add_argument("--no-family", action="store_true", help="skip dense_tile_spmm")
    args = ap.parse_args()
    import torch

    import sparsegen
    from sparsegen import nvcc
    from sparsegen.bench.timing import time_cuda
    from sparsegen.runtime import _driver, load_function

    drv = _driver()
    m, k = args.m, args.k
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, k), dtype=np.float32)
    whi = tf32_round(w)
    wlo = (w - whi).astype(np.float32)
    dev = torch.device("cuda")
    tw, thi, tlo = (torch.from_numpy(a).to(dev) for a in (w, whi, wlo))
    torch.backends.cuda.matmul.allow_tf32 = False
    for n in (int(v) for v in args.n.split(",")):
        x = rng.standard_normal((k, n), dtype=np.float32)
        tx = torch.from_numpy(x).to(dev)
        ref = w.astype(np.float64) @ x.astype(np.float64)
        scale = np.abs(ref).max()
        flop = 2.0 * m * k * n
        t = time_cuda(lambda: torch.matmul(tw, tx))["median_ms"]
        print(f"{m}x{k} N={n}: cuBLAS SGEMM {t * 1e3:8.1f} us {flop / t / 1e9:6.1f} TFLOP/s", flush=True)
        if not args.no_family:
            try:
                kern = sparsegen.compile(w, n=n, dtype="float32", backend="gpu", options={"family": "dense_tile_spmm"})
                ty = torch.empty((m, n), dtype=torch.float32, device=dev)
                kern(tx, out=ty)
                err = np.abs(ty.cpu().numpy() - ref).max() / scale
                t = time_cuda(lambda: kern(tx, out=ty))["median_ms"]
                print(f"    dense_tile_spmm   {t * 1e3:8.1f} us {flop / t / 1e9:6.1f} TFLOP/s err {err:.1e} {kern.spec.name}", flush=True)
            except Exception as e:  # the probe goes on
                print(f"    dense_tile_spmm   -- {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        for v in args.variants.split(","):
            swap, promote, insplit = "s" in v, "p" in v, "w" in v
            bm, slots = (int(a) for a in v.rstrip("spw").split("x"))
            try:
                src = source(m, k, n, bm, slots, swap, promote, insplit)
                cubin = nvcc.compile_cubin(src, "sm_90a", name="wgmma_tf32_gemm")
                shared = slots * (2 * bm * SK * 4 + SK * (64 * WGS + 8) * 4)
                func = load_function(f"wgmma_tf32_{m}_{k}_{n}_{v}", cubin, "wgmma_tf32_gemm", shared)
                ty = torch.empty((m, n), dtype=torch.float32, device=dev)
                grid = (n // (64 * WGS), m // bm, 1)
                ptrs = [np.uintp(a.data_ptr()) for a in ((tw, tw) if insplit else (thi, tlo)) + (tx, ty)]

                def launch():
                    func(*ptrs, block=(128 * WGS, 1, 1), grid=grid, shared=shared)
                launch()
                drv.Context.synchronize()
                err = np.abs(ty.cpu().numpy() - ref).max() / scale
                t = time_cuda(launch)["median_ms"]
                print(f"    wgmma {v:10s}  {t * 1e3:8.1f} us {flop / t / 1e9:6.1f} TFLOP/s err {err:.1e} "
                      f"({shared // 1024} KB shared, {func.get_attribute(drv.function_attribute.NUM_REGS)} registers)", flush=True)
            except Exception as e:
                print(f"    wgmma {v:10s}  -- {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
