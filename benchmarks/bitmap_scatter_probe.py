"""Probe: bitmap bytes decoded by scatter into a dense shared-memory tile (a prototype, not a family).

    python benchmarks/bitmap_scatter_probe.py [--shapes 28672x7168] [--sparsity 0.7 0.8 0.9] [--n 8 16]

Question: the register-direct bitmap decode (`tiled_bitmap_spmm`) costs issue slots per *element*
(a predicated load per bit, about 2000 warp instructions per 128 x 64 tile at 80 %, ncu: ALU-bound);
Tiled-CSL's scatter costs per *nonzero* but stores 4 bytes per nonzero. This kernel keeps the bitmap's
bytes (one 64-bit word per tile row, values in row order: 1/8 byte per element + 2 per nonzero) and
decodes per nonzero like Tiled-CSL: each lane owns one tile row, walks its set bits (find-first-set),
and stores each value into its warp's zeroed 32 x 64 slice of a dense tile in shared memory (16-byte
chunks XOR-swizzled by row), which ldmatrix then reads as mma fragments. A warp touches only its own
rows, so the decode needs no block barrier; the block syncs once per tile for the cp.async ring.

Result on the H100 (2026-11-27, probes/bitmap_scatter_probe.txt, 28672 x 7168 at 70/80/90 %, N = 8, 16):
correct, and 1.4-1.7x slower than the selected kernel in all 6 cases (the best of four split / ring
variants: 132.8 against 79.2 us at 70 %, N = 8; 104.7 against 75.7 at 80 %; 83.5 against 54.6 at 90 %).
The bit walk diverges: a warp runs as many find-first-set steps as its fullest row (about 1.7x the
mean at 80 %), 12 instructions each, so the decode costs as much as the register-direct one while it
also zero-fills and re-reads the dense tile. Not made a family.

Prototype limits: fp16, N = BN in {8, 16}, M % 128 == 0, K % 64 == 0, split-K summed by fp32 atomics
into a zeroed fp32 Y (the zeroing is not timed; the selected kernels' own reduction is in theirs).
Timed beside the selected kernel, each tile family forced, and cuBLAS fp16, all with
sparsegen.bench.timing.time_cuda (L2 warm, as the llm suite). Correctness: relative Frobenius error
against torch's fp32 product of the same fp16 operands.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sparsegen import nvcc, runtime  # noqa: E402
from standalone_probe import (CUDA_PRELUDE, print_header, print_rows, slice_offsets, start_case,  # noqa: E402
                              tile_starts, time_baselines, time_prototype)
from tiled_probe import probe_weight  # noqa: E402

TILE_M, TILE_K = 128, 64

SOURCE = r"""
#include <cuda_fp16.h>
#include <stdint.h>
constexpr int M = {M}, K = {K}, N = {N}, BN = {N};
constexpr int TILE_M = 128, TILE_K = 64, WARPS = 4, THREADS = 128;
constexpr int K_TILES = K / TILE_K;
constexpr int SPLIT = {SPLIT};
constexpr int KT_PER = (K_TILES + SPLIT - 1) / SPLIT;  // k-tiles a block walks
constexpr int STAGES = {STAGES}, AHEAD = STAGES - 1;  // cp.async ring
constexpr int X_CHUNKS = BN / 8;
constexpr int X_BYTES = TILE_K * BN * 2;
constexpr int BM_BYTES = TILE_M * 8;  // one 64-bit word per tile row
constexpr int OFF_BYTES = 32;  // the tile's 4 warp slice starts, then the next tile's
constexpr int VALUE_BYTES = {VALUE_BYTES};  // the fullest tile's values, padded to 16 bytes
constexpr int STAGE = X_BYTES + BM_BYTES + OFF_BYTES + VALUE_BYTES;
constexpr int NF = BN / 8;
constexpr unsigned FULL = 0xffffffffu;
static_assert(STAGE % 16 == 0, "16-byte copies");

{PRELUDE}
// X tile: row-major, chunk g = row * X_CHUNKS + c at g ^ ((g / 8) % 8): ldmatrix.trans conflict-free
__device__ __forceinline__ int xpos(int row, int c) {{ const int g = row * X_CHUNKS + c; return g ^ ((g >> 3) & 7); }}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t a) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t a) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}}
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], uint32_t a) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{%0,%1}}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
}}
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}

// Store a lane's row: the values of its set bits into its 128-byte dense row, highest bit first (its
// values read backwards from `last`). Column c's byte offset is 2c with the 16-byte chunk index
// (bits 4-6) XORed by the row's swizzle `swz` (= (row % 8) << 4).
__device__ __forceinline__ void scatter_word(uint32_t bits, int col0, const unsigned short*& last,
                                             uint32_t row, uint32_t swz) {{
    while (bits) {{
        const int c = 31 - __clz(bits);
        bits ^= 1u << c;
        const unsigned short v = *last--;
        asm volatile("st.shared.u16 [%0], %1;\n" :: "r"(row + ((2u * (col0 + c)) ^ swz)), "h"(v) : "memory");
    }}
}}

extern "C" __global__ void __launch_bounds__(THREADS, {MIN_BLOCKS})
bitmap_scatter(const unsigned long long* __restrict__ bitmaps, const unsigned short* __restrict__ values,
               const int* __restrict__ offs, const unsigned short* __restrict__ x, float* __restrict__ y) {{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int mt = blockIdx.y, kt0 = blockIdx.z * KT_PER;
    const int tiles = min(K_TILES - kt0, KT_PER);
    const size_t tile0 = (size_t)mt * K_TILES + kt0;
    unsigned char* mine = smem + STAGES * STAGE + warp * 32 * 128;  // this warp's 32 dense rows
    float acc[2][NF][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    auto issue = [&](int u) {{
        if (u < tiles) {{
            unsigned char* st = smem + (u % STAGES) * STAGE;
            const size_t tile = tile0 + u;
            const int k0 = (kt0 + u) * TILE_K;
#pragma unroll
            for (int c = threadIdx.x; c < X_BYTES / 16; c += THREADS)
                cp16(saddr(st + xpos(c / X_CHUNKS, c % X_CHUNKS) * 16), x + (size_t)(k0 + c / X_CHUNKS) * N + (c % X_CHUNKS) * 8);
            if (threadIdx.x < BM_BYTES / 16)
                cp16(saddr(st + X_BYTES + 16 * threadIdx.x), reinterpret_cast<const char*>(bitmaps + tile * TILE_M) + 16 * threadIdx.x);
            if (threadIdx.x < 2) cp16(saddr(st + X_BYTES + BM_BYTES + 16 * threadIdx.x), offs + tile * 4 + 4 * threadIdx.x);
            const int lo = __ldg(offs + tile * 4), hi = __ldg(offs + tile * 4 + 4);
            for (int c = threadIdx.x; c < (hi - lo) / 8; c += THREADS)
                cp16(saddr(st + X_BYTES + BM_BYTES + OFF_BYTES + 16 * c), values + lo + 8 * c);
        }}
        commit();
    }};
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) issue(u);

    for (int t = 0; t < tiles; ++t) {{
        wait_groups<AHEAD - 1>();
        __syncthreads();  // tile t landed (everyone's copies); every warp done with tile t - 1's slot
        issue(t + AHEAD);
        const unsigned char* st = smem + (t % STAGES) * STAGE;
        const int* off = reinterpret_cast<const int*>(st + X_BYTES + BM_BYTES);
        // zero this warp's 32 x 64 slice (after its last ldmatrix of it), then scatter its rows
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 8; ++i) *reinterpret_cast<uint4*>(mine + (i * 32 + lane) * 16) = make_uint4(0u, 0u, 0u, 0u);
        __syncwarp();
        const unsigned long long b = reinterpret_cast<const unsigned long long*>(st + X_BYTES)[warp * 32 + lane];
        const uint32_t lo32 = (uint32_t)b, hi32 = (uint32_t)(b >> 32);
        const int c = __popc(lo32) + __popc(hi32);
        int inc = c;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {{
            const int v = __shfl_up_sync(FULL, inc, d);
            if (lane >= d) inc += v;
        }}
        const unsigned short* last = reinterpret_cast<const unsigned short*>(st + X_BYTES + BM_BYTES + OFF_BYTES)
                                     + (off[warp] - off[0]) + inc - 1;  // the row's last value
        const uint32_t row = saddr(mine + lane * 128), swz = (uint32_t)(lane & 7) << 4;
        scatter_word(hi32, 32, last, row, swz);
        scatter_word(lo32, 0, last, row, swz);
        __syncwarp();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {{
            uint32_t a[2][4], bf[NF][2];
#pragma unroll
            for (int mf = 0; mf < 2; ++mf) {{
                const int r = mf * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, ch = ks * 2 + (lane >> 4);
                ldsm_x4(a[mf], saddr(mine + r * 128 + ((ch ^ (r & 7)) << 4)));
            }}
            const int xr = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#if {N} == 8
            ldsm_x2_t(bf[0], saddr(st + xpos(xr, 0) * 16));
#else
            {{
                uint32_t r4[4];
                ldsm_x4_t(r4, saddr(st + xpos(xr, lane >> 4) * 16));
                bf[0][0] = r4[0]; bf[0][1] = r4[1]; bf[1][0] = r4[2]; bf[1][1] = r4[3];
            }}
#endif
#pragma unroll
            for (int mf = 0; mf < 2; ++mf)
#pragma unroll
                for (int nf = 0; nf < NF; ++nf) mma(acc[mf][nf], a[mf], bf[nf]);
        }}
    }}
#pragma unroll
    for (int mf = 0; mf < 2; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {{
                const int r = mt * TILE_M + warp * 32 + mf * 16 + (lane >> 2) + 8 * h, col = nf * 8 + 2 * (lane & 3);
                atomicAdd(y + (size_t)r * N + col, acc[mf][nf][2 * h]);
                atomicAdd(y + (size_t)r * N + col + 1, acc[mf][nf][2 * h + 1]);
            }}
}}
"""


def encode(w, m: int, k: int):
    """Row bitmaps per 128 x 64 tile (tile-major, k-tiles fastest), values in row order per tile (each
    tile's run padded to 8 halves), and per tile the 4 warp slice starts (then the next tile's)."""
    coo = w.tocoo()
    r, c = coo.row.astype(np.int64), coo.col.astype(np.int64)
    kt_n = k // TILE_K
    tiles = (m // TILE_M) * kt_n
    tile = (r // TILE_M) * kt_n + c // TILE_K
    rowid = tile * TILE_M + r % TILE_M
    key = rowid * TILE_K + c % TILE_K
    order = np.argsort(key, kind="stable")
    rowid, key, vals = rowid[order], key[order], coo.data[order].astype(np.float16)
    tile = tile[order]
    bits = np.left_shift(np.uint64(1), (key % TILE_K).astype(np.uint64))
    starts = np.flatnonzero(np.r_[True, rowid[1:] != rowid[:-1]])
    bitmaps = np.zeros(tiles * TILE_M, dtype=np.uint64)
    bitmaps[rowid[starts]] = np.bitwise_or.reduceat(bits, starts)
    per_tile = np.bincount(tile, minlength=tiles)
    padded, tile_start = tile_starts(per_tile)
    first = np.r_[0, np.cumsum(per_tile)]
    values = np.zeros(int(tile_start[-1]) + 8, dtype=np.float16)
    values[tile_start[tile] + (np.arange(tile.size) - first[tile])] = vals
    per_warp = np.bincount(tile * 4 + (rowid % TILE_M) // 32, minlength=tiles * 4).reshape(tiles, 4)
    return bitmaps, values, slice_offsets(tile_start, per_warp), int(padded.max()) * 2


def build(m, k, n, split, stages, value_bytes, min_blocks):
    src = SOURCE.format(M=m, K=k, N=n, SPLIT=split, STAGES=stages, VALUE_BYTES=-(-value_bytes // 16) * 16,
                        MIN_BLOCKS=min_blocks, PRELUDE=CUDA_PRELUDE)
    stage = TILE_K * n * 2 + TILE_M * 8 + 32 + -(-value_bytes // 16) * 16
    shared = stages * stage + TILE_M * TILE_K * 2
    cubin = nvcc.compile_cubin(src, "sm_90", name="bitmap_scatter")
    func = runtime.load_function(f"scatter-{m}-{k}-{n}-{split}-{stages}-{value_bytes}-{min_blocks}", cubin,
                                 "bitmap_scatter", shared)
    func.prepare("PPPPP")
    return func, shared


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="*", default=["28672x7168", "7168x7168"])
    ap.add_argument("--sparsity", type=float, nargs="*", default=[0.7, 0.8, 0.9])
    ap.add_argument("--n", type=int, nargs="*", default=[8, 16])
    ap.add_argument("--splits", type=int, nargs="*", default=[7, 14])
    args = ap.parse_args()
    print_header()
    for shape in args.shapes:
        m, k = map(int, shape.split("x"))
        for s in args.sparsity:
            w = probe_weight(m, k, s)
            t0 = time.time()
            bitmaps, values, offs, value_bytes = encode(w, m, k)
            enc_s = time.time() - t0
            d_bm, d_v, d_o = (torch.from_numpy(a.view(np.int64) if a.dtype == np.uint64 else a).cuda()
                              for a in (bitmaps, values, offs))
            dense = torch.from_numpy(w.toarray()).to(torch.float16).cuda()
            for n in args.n:
                x, ref, cublas, rows = start_case(dense, n)
                time_baselines(w, x, ref, ("selected", "bitmap g1", "bitmap g2", "csl"), rows)
                for split in args.splits:
                    for stages, min_blocks in ((3, 4), (4, 4)):
                        name = f"scatter sk{split} st{stages} mb{min_blocks}"
                        try:
                            func, shared = build(m, k, n, split, stages, value_bytes, min_blocks)
                        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                            print(f"{shape:>11} {s:4.2f} {n:3d} {name:28} build failed: {exc}")
                            continue
                        y = torch.zeros(m, n, dtype=torch.float32, device="cuda")
                        grid, block = (1, m // TILE_M, split), (128, 1, 1)
                        ptrs = [d_bm.data_ptr(), d_v.data_ptr(), d_o.data_ptr(), x.data_ptr(), y.data_ptr()]

                        def launch():
                            func.prepared_call(grid, block, *ptrs, shared_size=shared)

                        ms, err = time_prototype(launch, y, ref)
                        rows.append((name, ms, err, f"{shared} B shared"))
                print_rows(shape, s, n, rows, cublas)
            print(f"# encoded {shape} at {s} in {enc_s:.1f} s; {w.nnz} nonzeros; fullest tile {value_bytes // 2} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
