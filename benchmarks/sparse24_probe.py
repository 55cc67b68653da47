"""Probe: bitmap tiles decoded into 2:4 fragments for the sparse tensor cores (a prototype, not a family).

    python benchmarks/sparse24_probe.py [--shapes 28672x7168 7168x7168] [--sparsity 0.8 0.9] [--n 8 16 32 64]
                                        [--encodings values pairs] [--variants 3:4,3:3]
    python benchmarks/sparse24_probe.py --check     # CPU only: encoder + decode emulator against scipy

Question: the bitmap kernels (`tiled_bitmap_spmm`) are bound by their per-element decode (ncu: about
2000 warp instructions per 128 x 64 tile, ALU-bound at N = 8) and, at N = 32/64, by dense m16n8k16
tensor work on tiles that are 80-90 % zeros. `mma.sp` (m16n8k32, 2:4 structured A) multiplies a
16 x 32 A fragment held as 16 x 16 (two values per group of four along k, 2-bit positions in a
metadata register) at the cost of a dense m16n8k16. Unstructured sparsity at 80-90 % is almost
2:4 already: a group of four holds three or four nonzeros with probability 2.7 % (80 %) / 0.37 %
(90 %). So this kernel keeps the bitmap's bytes (one bit per element + the packed fp16 values) and
decodes per *group* instead of per element: each mma register is one group's (at most) two values,
two predicated 16-bit loads, and the metadata comes from the bitmap nibbles through a byte-permute
table (prmt), four groups per instruction.

The groups with three or four nonzeros keep their first two; the rest (the "residual", 3.6 % of the
nonzeros at 80 %, 1.0 % at 90 %) are NOT applied by this prototype: its product is checked against
W without them and its time is a lower bound for a kernel that also adds them. The probe prints the
residual's share so a design for it can be priced.

Two encodings of the values: `values` (the bitmap's own: packed fp16 values, two predicated 16-bit
loads per group) and `pairs` (each non-empty group stored as its mma register, zeros filled: one
predicated aligned 32-bit load per group, more bytes: 0.47 B per element at 90 % against 0.33).

Result on the H100 (2026-11-27, probes/sparse24_probe.txt; 28672 x 7168 and 7168^2 at 80/90 %,
N = 8-64, best of the ring / residency variants per case, against the selected kernel of the same
run): correct against W without the residual (errors <= 9.1e-7, fp32 out), and no faster. Time
ratio selected / sparse24, geomean: `values` 1.005x at 80 % (0.93-1.09), 0.87x at 90 % (0.81-0.96);
`pairs` 1.03x at 80 % (0.94-1.17), 0.99x at 90 % (0.92-1.04); and that before the residual is
added (3.6 % of the nonzeros at 80 %). Halving the tensor instructions changes nothing at N = 64
(pairs 127.7 against 117.2 us on 28672 x 7168 at 90 %): those kernels are not bound by the mma
pipe; and the per-group decode costs about what the register-pair bitmap's per-pair decode does.
Not made a family.

Layout (per 128 x 64 tile, 4 warps of 32 rows, each warp 2 x 2 fragments of 16 rows x 32 k, f = ks * 2 + mf):
- bitmap: per tile [warp][quad g][f][half p] 32-bit words. Word (g, f, p) holds rows g and g + 8 of
  fragment f, groups 4p .. 4p + 3 (4 bits each, bit = position in the group): bits 0-15 groups
  (row g: 0, 2; row g + 8: 0, 2), bits 16-31 groups (row g: 1, 3; row g + 8: 1, 3), so that
  meta(low half) | meta(high half) << 4 is the mma.sp metadata word of lanes 4g + p.
- values: per tile, warp by warp, fragment by fragment, lane by lane; a lane's values in the order of
  its registers a0 (row g, group t), a2 (row g, group t + 4), a1 (row g + 8, group t), a3 (row g + 8,
  group t + 4), positions ascending. Each tile's run padded to 8 halves; per tile the 4 warp starts.

Prototype limits: fp16, M % 128 == 0, K % 64 == 0, N in {8, 16, 32, 64}, split-K summed by fp32
atomics into a zeroed fp32 Y (the zeroing not timed). Timed beside the selected kernel, each tile
family forced, and cuBLAS fp16 (sparsegen.bench.timing.time_cuda: L2 warm, as the llm suite).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from standalone_probe import (CUDA_PRELUDE, print_header, print_rows, slice_offsets, start_case,  # noqa: E402
                              tile_starts, time_baselines, time_prototype)

TILE_M, TILE_K = 128, 64

# metadata nibble (i0 | i1 << 2, i0 < i1) per bitmap nibble b with at most two bits set; a single
# nonzero at position i < 3 takes slot 0 of (i, 3), one at position 3 slot 1 of (2, 3); an empty group (0, 1)
META = np.zeros(16, dtype=np.uint32)
for _b in range(16):
    _pos = [i for i in range(4) if _b >> i & 1]
    if len(_pos) == 0:
        META[_b] = 0x4
    elif len(_pos) == 1:
        META[_b] = 0xE if _pos[0] == 3 else (_pos[0] | 0xC)
    elif len(_pos) == 2:
        META[_b] = _pos[0] | _pos[1] << 2
    else:
        META[_b] = 0x4  # never produced: the encoder keeps at most two a group


def _table(values) -> tuple[int, int]:
    b = [int(v) for v in values]
    return b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24


LUT_LO = _table(META[0:8])   # prmt table for nibbles 0-7 (nibbles >= 8 select sign-replicated bytes: 0)
LUT_HI = _table(META[8:16])  # for nibbles 8-15, selected with bit 3 flipped (nibbles < 8 then give 0)

SOURCE = r"""
#include <cuda_fp16.h>
#include <stdint.h>
constexpr int M = {M}, K = {K}, N = {N};
constexpr int TILE_M = 128, TILE_K = 64, WARPS = 4, THREADS = 128;
constexpr int K_TILES = K / TILE_K;
constexpr int SPLIT = {SPLIT};
constexpr int KT_PER = (K_TILES + SPLIT - 1) / SPLIT;
constexpr int STAGES = {STAGES}, AHEAD = STAGES - 1;
constexpr int X_CHUNKS = N / 8;
constexpr int X_BYTES = TILE_K * N * 2;
constexpr int BM_BYTES = TILE_M * TILE_K / 8;  // 1 KB: [warp][g][f][p] words
constexpr int OFF_BYTES = 32;
constexpr int VALUE_BYTES = {VALUE_BYTES};
constexpr bool PAIRS = {PAIRS};  // values stored per non-empty group as one 32-bit register (zeros filled)
constexpr int UNIT = PAIRS ? 4 : 2;  // bytes per counted unit: a group's register, or a value
constexpr int STAGE = X_BYTES + BM_BYTES + OFF_BYTES + VALUE_BYTES;
constexpr int NF = N / 8;
constexpr unsigned FULL = 0xffffffffu;
static_assert(STAGE % 16 == 0, "16-byte copies");

{PRELUDE}
__device__ __forceinline__ int xpos(int row, int c) {{ const int g = row * X_CHUNKS + c; return g ^ ((g >> 3) & 7); }}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t a) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}}
__device__ __forceinline__ void mma_sp(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t e) {{
    asm volatile("mma.sp{ORDERED}.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
                 "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9,%10,%11}}, {{%0,%1,%2,%3}}, %12, 0x0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
}}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {{
    uint32_t d; asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}}
// mma.sp metadata of a bitmap word: each nibble's (i0, i1) from two prmt tables (bytes), halves interleaved
__device__ __forceinline__ uint32_t meta_of(uint32_t w) {{
    const uint32_t lo = prmt({LUT_LO0}u, {LUT_LO1}u, w) | prmt({LUT_HI0}u, {LUT_HI1}u, w ^ 0x8888u);
    const uint32_t hw = w >> 16;
    const uint32_t hi = prmt({LUT_LO0}u, {LUT_LO1}u, hw) | prmt({LUT_HI0}u, {LUT_HI1}u, hw ^ 0x8888u);
    return lo | (hi << 4);
}}
// One register: the group's values from `q` (at most two), predicated 16-bit loads; a lone value at
// position 3 goes to the high half (metadata (2, 3)). Advances q past the values used.
template <int S>
__device__ __forceinline__ uint32_t group_reg(uint32_t x, uint32_t cnt, uint32_t& q) {{
    uint32_t r;
    asm("{{\n\t.reg .pred p1, p2, p8;\n\t.reg .u32 e0, e1, t;\n\t"
        "and.b32 t, %2, %4; setp.ne.u32 p1, t, 0; setp.eq.u32 p8, t, %6;\n\t"
        "and.b32 t, %3, %5; setp.ne.u32 p2, t, 0;\n\t"
        "mov.u32 e0, 0; mov.u32 e1, 0;\n\t"
        "@p1 ld.shared.u16 e0, [%1]; @p2 ld.shared.u16 e1, [%1+2];\n\t"
        "@p1 add.u32 %1, %1, 2; @p2 add.u32 %1, %1, 2;\n\t"
        "prmt.b32 %0, e0, e1, 0x5410;\n\t"
        "@p8 shl.b32 %0, e0, 16;\n\t}}\n"
        : "=r"(r), "+r"(q)
        : "r"(x), "r"(cnt), "n"(0xFu << (4 * S)), "n"(2u << (4 * S)), "n"(8u << (4 * S)) : "memory");
    return r;
}}
// Pairs: the group's register as stored, one predicated aligned 32-bit load
template <int S>
__device__ __forceinline__ uint32_t group_word(uint32_t x, uint32_t& q) {{
    uint32_t r;
    asm("{{\n\t.reg .pred p;\n\t.reg .u32 t;\n\t"
        "and.b32 t, %2, %3; setp.ne.u32 p, t, 0;\n\t"
        "mov.u32 %0, 0;\n\t"
        "@p ld.shared.u32 %0, [%1]; @p add.u32 %1, %1, 4;\n\t}}\n"
        : "=&r"(r), "+r"(q) : "r"(x), "n"(0xFu << (4 * S)) : "memory");
    return r;
}}
// Popcounts of the eight nibbles of w, as nibbles
__device__ __forceinline__ uint32_t popc_nibbles(uint32_t w) {{
    w = w - ((w >> 1) & 0x55555555u);
    return (w & 0x33333333u) + ((w >> 2) & 0x33333333u);
}}
__device__ __forceinline__ uint32_t scan_bytes(uint32_t c) {{
#pragma unroll
    for (int d = 1; d < 32; d <<= 1)
        asm("{{\n\t.reg .pred p;\n\t.reg .u32 t;\n\tshfl.sync.up.b32 t|p, %0, %1, 0, -1;\n\t@p add.u32 %0, %0, t;\n\t}}\n"
            : "+r"(c) : "r"(d));
    return c;
}}

extern "C" __global__ void __launch_bounds__(THREADS, {MIN_BLOCKS})
sparse24(const uint32_t* __restrict__ bitmaps, const unsigned short* __restrict__ values,
         const int* __restrict__ offs, const unsigned short* __restrict__ x, float* __restrict__ y) {{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int mt = blockIdx.y, kt0 = blockIdx.z * KT_PER;
    const int tiles = min(K_TILES - kt0, KT_PER);
    const size_t tile0 = (size_t)mt * K_TILES + kt0;
    const int shift = (t & 1) * 16 + (t >> 1) * 4;  // this lane's nibbles in its quad's words
    float acc[2][NF][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // Fixed rounds of one 16-byte copy per thread (unrolled): X tile, bitmap words, values (the
    // fullest tile bounds the rounds; each is a predicate), as the family's ring does.
    constexpr int X_COPIES = X_BYTES / 16, BM_COPIES = BM_BYTES / 16, V_ROUNDS = (VALUE_BYTES / 16 + THREADS - 1) / THREADS;
    auto issue = [&](int u) {{
        if (u < tiles) {{
            unsigned char* st = smem + (u % STAGES) * STAGE;
            const size_t tile = tile0 + u;
            const int k0 = (kt0 + u) * TILE_K;
#pragma unroll
            for (int r = 0; r < (X_COPIES + THREADS - 1) / THREADS; ++r) {{
                const int c = threadIdx.x + r * THREADS;
                if (X_COPIES % THREADS == 0 || c < X_COPIES)
                    cp16(saddr(st + xpos(c / X_CHUNKS, c % X_CHUNKS) * 16), x + (size_t)(k0 + c / X_CHUNKS) * N + (c % X_CHUNKS) * 8);
            }}
            if (threadIdx.x < BM_COPIES)
                cp16(saddr(st + X_BYTES + 16 * threadIdx.x), reinterpret_cast<const char*>(bitmaps + tile * (BM_BYTES / 4)) + 16 * threadIdx.x);
            if (threadIdx.x < 2) cp16(saddr(st + X_BYTES + BM_BYTES + 16 * threadIdx.x), offs + tile * 4 + 4 * threadIdx.x);
            const int lo = __ldg(offs + tile * 4), hi = __ldg(offs + tile * 4 + 4);
            const int chunks = (hi - lo) / 8;
#pragma unroll
            for (int r = 0; r < V_ROUNDS; ++r)
                if (threadIdx.x + r * THREADS < chunks)
                    cp16(saddr(st + X_BYTES + BM_BYTES + OFF_BYTES + 16 * (threadIdx.x + r * THREADS)), values + lo + 8 * (threadIdx.x + r * THREADS));
        }}
        commit();
    }};
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) issue(u);

    for (int it = 0; it < tiles; ++it) {{
        wait_groups<AHEAD - 1>();
        __syncthreads();
        issue(it + AHEAD);
        const unsigned char* st = smem + (it % STAGES) * STAGE;
        const int* off = reinterpret_cast<const int*>(st + X_BYTES + BM_BYTES);
        const int lo = off[warp] - off[0], hi = off[warp + 1] - off[0];
        if (hi == lo) continue;  // warp-uniform: no nonzeros in this warp's rows of the tile
        const uint4* wq = reinterpret_cast<const uint4*>(st + X_BYTES + (warp * 8 + g) * 32);
        const uint4 w01 = wq[0], w23 = wq[1];  // fragments 0, 1 then 2, 3: (p0, p1) each
        const uint32_t wd[8] = {{w01.x, w01.y, w01.z, w01.w, w23.x, w23.y, w23.z, w23.w}};
        uint32_t nib[4], cnt[4];
        uint32_t packed = 0;  // the lane's value counts of fragments 0..3, one byte each
#pragma unroll
        for (int f = 0; f < 4; ++f) {{
            nib[f] = ((wd[2 * f] >> shift) & 0x0F0Fu) | (((wd[2 * f + 1] >> shift) & 0x0F0Fu) << 4);
            cnt[f] = popc_nibbles(nib[f]);
            if constexpr (PAIRS) {{
                uint32_t y = nib[f] | (nib[f] >> 1);
                y = (y | (y >> 2)) & 0x1111u;  // one bit per non-empty group
                packed |= __popc(y) << (8 * f);
            }} else {{
                packed |= __popc(nib[f]) << (8 * f);
            }}
        }}
        const uint32_t excl = scan_bytes(packed) - packed;
        const uint32_t te = __reduce_add_sync(FULL, packed & 0x00ff00ffu);  // totals of fragments 0 and 2
        const uint32_t to = __reduce_add_sync(FULL, (packed >> 8) & 0x00ff00ffu);  // 1 and 3
        const uint32_t base = saddr(st + X_BYTES + BM_BYTES + OFF_BYTES) + 2 * lo;
        const uint32_t t0 = te & 0xffffu, t1 = to & 0xffffu, t2 = te >> 16;
        uint32_t at[4];
        at[0] = base + UNIT * (excl & 0xffu);
        at[1] = base + UNIT * (t0 + ((excl >> 8) & 0xffu));
        at[2] = base + UNIT * (t0 + t1 + ((excl >> 16) & 0xffu));
        at[3] = base + UNIT * (t0 + t1 + t2 + (excl >> 24));
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {{
            uint32_t a[2][4], e[2];
#pragma unroll
            for (int mf = 0; mf < 2; ++mf) {{
                const int f = ks * 2 + mf;
                uint32_t q = at[f];
                if constexpr (PAIRS) {{
                    a[mf][0] = group_word<0>(nib[f], q);
                    a[mf][2] = group_word<1>(nib[f], q);
                    a[mf][1] = group_word<2>(nib[f], q);
                    a[mf][3] = group_word<3>(nib[f], q);
                }} else {{
                    a[mf][0] = group_reg<0>(nib[f], cnt[f], q);
                    a[mf][2] = group_reg<1>(nib[f], cnt[f], q);
                    a[mf][1] = group_reg<2>(nib[f], cnt[f], q);
                    a[mf][3] = group_reg<3>(nib[f], cnt[f], q);
                }}
                e[mf] = meta_of((t & 1) ? wd[2 * f + 1] : wd[2 * f]);  // lanes 4g + p: half p's word
            }}
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {{
                uint32_t b[4];
                ldsm_x4_t(b, saddr(st + xpos(ks * 32 + (lane & 7) + 8 * (lane >> 3), nf) * 16));
#pragma unroll
                for (int mf = 0; mf < 2; ++mf) mma_sp(acc[mf][nf], a[mf], b, e[mf]);
            }}
        }}
    }}
#pragma unroll
    for (int mf = 0; mf < 2; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {{
                const int r = mt * TILE_M + warp * 32 + mf * 16 + g + 8 * h, col = nf * 8 + 2 * t;
                atomicAdd(y + (size_t)r * N + col, acc[mf][nf][2 * h]);
                atomicAdd(y + (size_t)r * N + col + 1, acc[mf][nf][2 * h + 1]);
            }}
}}
"""


@dataclass
class Encoded:
    """The probe's arrays: bitmap words, values, per-tile warp starts; the kept W and the residual."""

    bitmaps: np.ndarray
    values: np.ndarray
    offs: np.ndarray
    value_bytes: int  # the fullest tile's values (padded), the ring slot's size
    kept: sp.csr_matrix  # W less the residual: what the kernel multiplies
    residual_nnz: int
    pairs: bool


def encode(w: sp.csr_matrix, pairs: bool = False) -> Encoded:
    """Vectorized: no loop over rows or nonzeros. pairs: values per non-empty group, two halves each."""
    m, k = w.shape
    coo = w.tocoo()
    r, c = coo.row.astype(np.int64), coo.col.astype(np.int64)
    v = coo.data.astype(np.float16)
    kt_n = k // TILE_K
    tiles = (m // TILE_M) * kt_n
    tile = (r // TILE_M) * kt_n + c // TILE_K
    lr, lc = r % TILE_M, c % TILE_K
    warp, wr = lr // 32, lr % 32
    mf, rr = wr // 16, wr % 16
    g, hi = rr % 8, rr // 8
    ks, kk = lc // 32, lc % 32
    grp, pos = kk // 4, kk % 4
    p, j = grp // 4, grp % 4
    f = ks * 2 + mf
    # at most two a group (row, four columns): keep the first two by position
    gid = r * (k // 4) + c // 4
    order = np.lexsort((c, gid))
    gsorted = gid[order]
    first = np.r_[True, gsorted[1:] != gsorted[:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(gsorted.size), 0))
    rank = np.empty_like(gid)
    rank[order] = np.arange(gsorted.size) - run_start
    keep = rank < 2
    residual_nnz = int((~keep).sum())
    (tile, warp, g, hi, f, p, j, pos, r, c, v) = (a[keep] for a in (tile, warp, g, hi, f, p, j, pos, r, c, v))
    t = j
    lane = g * 4 + t
    # bitmap word [tile][warp][g][f][p]; nibble: j even -> bits 4 (j // 2), odd -> 16 + 4 (j // 2); row g + 8: + 8
    word = (((tile * 4 + warp) * 8 + g) * 4 + f) * 2 + p
    bit = np.where(j % 2 == 0, 0, 16) + 4 * (j // 2) + 8 * hi + pos
    bitmaps = np.zeros(tiles * (TILE_M * TILE_K // 32), dtype=np.uint32)
    np.bitwise_or.at(bitmaps, word, np.left_shift(np.uint32(1), bit.astype(np.uint32)))
    # values: tile, warp, f, lane, register order (row g: p 0, 1; row g + 8: p 0, 1), position;
    # pairs: one 2-half register per non-empty group (slot 0 / 1 as the metadata puts them)
    unit = (((tile * 4 + warp) * 4 + f) * 32 + lane) * 4 + (hi * 2 + p)
    if pairs:
        order = np.lexsort((pos, unit))
        u_s = unit[order]
        start = np.r_[True, u_s[1:] != u_s[:-1]]
        gidx = np.cumsum(start) - 1  # group number in stream order
        n_in = np.bincount(gidx)[gidx]
        rank_in = np.arange(u_s.size) - np.flatnonzero(start)[gidx]
        slot = np.where(n_in == 2, rank_in, (pos[order] == 3).astype(np.int64))
        g_tile = tile[order][start]
        g_warp = warp[order][start]
        per_tile = 2 * np.bincount(g_tile, minlength=tiles)
        padded, tile_start = tile_starts(per_tile)
        first_g = np.r_[0, np.cumsum(per_tile // 2)]
        gpos = tile_start[g_tile] + 2 * (np.arange(g_tile.size) - first_g[g_tile])
        values = np.zeros(int(tile_start[-1]) + 16, dtype=np.float16)
        values[gpos[gidx] + slot] = v[order]
        per_warp = 2 * np.bincount(g_tile * 4 + g_warp, minlength=tiles * 4).reshape(tiles, 4)
    else:
        key = unit * 4 + pos
        order = np.argsort(key, kind="stable")
        tile_s, warp_s, v_s = tile[order], warp[order], v[order]
        per_tile = np.bincount(tile_s, minlength=tiles)
        padded, tile_start = tile_starts(per_tile)
        first_nz = np.r_[0, np.cumsum(per_tile)]
        values = np.zeros(int(tile_start[-1]) + 16, dtype=np.float16)
        values[tile_start[tile_s] + (np.arange(tile_s.size) - first_nz[tile_s])] = v_s
        per_warp = np.bincount(tile_s * 4 + warp_s, minlength=tiles * 4).reshape(tiles, 4)
    offs = slice_offsets(tile_start, per_warp)
    kept = sp.csr_matrix((v.astype(np.float32), (r, c)), shape=(m, k))
    return Encoded(bitmaps, values, offs, int(padded.max()) * 2 + 16, kept, residual_nnz, pairs)


def prmt(a: int, b: int, c: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (c_i & 7) of {b, a}, sign-replicated when c_i & 8."""
    pool = (a & 0xFFFFFFFF) | (b & 0xFFFFFFFF) << 32
    out = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (pool >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def meta_of(w: int) -> int:
    """The kernel's meta_of: a bitmap word to its mma.sp metadata word."""
    lo = prmt(*LUT_LO, w) | prmt(*LUT_HI, w ^ 0x8888)
    hw = w >> 16
    hi = prmt(*LUT_LO, hw) | prmt(*LUT_HI, hw ^ 0x8888)
    return (lo | hi << 4) & 0xFFFFFFFF


def emulate(enc: Encoded, m: int, k: int) -> np.ndarray:
    """The dense W the kernel multiplies, rebuilt from the arrays the way the kernel reads them:
    per lane its nibbles, value starts (scan), registers and the mma.sp metadata, then the
    instruction's semantics (compressed column c = group c // 2, metadata index = position)."""
    kt_n = k // TILE_K
    out = np.zeros((m, k), dtype=np.float32)
    words = enc.bitmaps.reshape(-1, 4, 8, 4, 2)  # tile, warp, g, f, p
    vals = enc.values.astype(np.float32)
    lane = np.arange(32)
    gl, tl = lane // 4, lane % 4
    shift = (tl & 1) * 16 + (tl >> 1) * 4
    for tile in range(words.shape[0]):  # the emulator may loop over tiles; the encoder does not
        mt, kt = divmod(tile, kt_n)
        for warp in range(4):
            lo = enc.offs[tile * 4 + warp]
            wd = words[tile, warp][gl]  # lane -> (f, p)
            nib = ((wd[:, :, 0] >> shift[:, None]) & 0x0F0F) | (((wd[:, :, 1] >> shift[:, None]) & 0x0F0F) << 4)
            if enc.pairs:  # counted units: non-empty groups, two halves each
                cnt = np.array([[2 * sum(1 for i in range(4) if (int(x) >> 4 * i) & 0xF) for x in row] for row in nib])
            else:
                cnt = np.array([[bin(int(x)).count("1") for x in row] for row in nib])  # lane, f
            excl = np.cumsum(cnt, axis=0) - cnt
            base = lo + np.r_[0, np.cumsum(cnt.sum(axis=0))[:3]]
            for f in range(4):
                ks, mf = divmod(f, 2)
                meta = [meta_of(int(wd[ln, f, tl[ln] & 1])) for ln in range(32)]  # the kernel's words
                for ln in range(32):
                    q = base[f] + excl[ln, f]
                    regs = []
                    for s in range(4):
                        b = (int(nib[ln, f]) >> (4 * s)) & 0xF
                        if enc.pairs:
                            regs.append((vals[q], vals[q + 1]) if b else (0.0, 0.0))
                            q += 2 if b else 0
                            continue
                        n1 = 1 if b else 0
                        n2 = 1 if bin(b).count("1") == 2 else 0
                        e0 = vals[q] if n1 else 0.0
                        e1 = vals[q + 1] if n2 else 0.0
                        q += n1 + n2
                        regs.append((0.0, e0) if b == 8 else (e0, e1))
                    a = [regs[0], regs[2], regs[1], regs[3]]  # a0, a1, a2, a3
                    g_, t_ = divmod(ln, 4)
                    for reg, (row, grp) in enumerate(((g_, t_), (g_ + 8, t_), (g_, t_ + 4), (g_ + 8, t_ + 4))):
                        # metadata of (row, grp) from lane 4g + (grp // 4): nibble order A0 B0 A1 B1 ...
                        src = 4 * g_ + grp // 4
                        jj, h8 = grp % 4, 1 if row >= 8 else 0
                        md = (meta[src] >> (4 * (jj + 4 * h8))) & 0xF  # hardware: low half row g, high row g + 8
                        i0, i1 = md & 3, md >> 2
                        rg = mt * TILE_M + warp * 32 + mf * 16 + row
                        c0 = kt * TILE_K + ks * 32 + 4 * grp
                        out[rg, c0 + i0] += a[reg][0]
                        out[rg, c0 + i1] += a[reg][1]
    return out


def check() -> int:
    rng = np.random.default_rng(5)
    for m, k, density in ((128, 64, 0.1), (256, 128, 0.2), (128, 128, 0.45), (256, 192, 0.03)):
        mask = rng.random((m, k)) < density
        w = sp.csr_matrix(np.where(mask, rng.standard_normal((m, k)), 0.0).astype(np.float16).astype(np.float32))
        for pairs in (False, True):
            enc = encode(w, pairs)
            got = emulate(enc, m, k)
            ok = np.array_equal(got, enc.kept.toarray())
            print(f"{m}x{k} density {density} {'pairs' if pairs else 'values'}: emulator {'matches' if ok else 'DIFFERS'}; "
                  f"residual {enc.residual_nnz} of {w.nnz} nonzeros; {enc.values.size} halves stored")
            if not ok:
                return 1
    return 0


def build(m, k, n, split, stages, value_bytes, min_blocks, pairs=False, ordered=True):
    from sparsegen import nvcc, runtime

    vb = -(-value_bytes // 16) * 16
    src = SOURCE.format(M=m, K=k, N=n, SPLIT=split, STAGES=stages, VALUE_BYTES=vb, MIN_BLOCKS=min_blocks,
                        ORDERED="::ordered_metadata" if ordered else "", PAIRS="true" if pairs else "false",
                        LUT_LO0=LUT_LO[0], LUT_LO1=LUT_LO[1], LUT_HI0=LUT_HI[0], LUT_HI1=LUT_HI[1], PRELUDE=CUDA_PRELUDE)
    shared = stages * (TILE_K * n * 2 + TILE_M * TILE_K // 8 + 32 + vb)
    cubin = nvcc.compile_cubin(src, "sm_90", name="sparse24")
    func = runtime.load_function(f"sparse24-{m}-{k}-{n}-{split}-{stages}-{vb}-{min_blocks}-{pairs}-{ordered}", cubin,
                                 "sparse24", shared)
    func.prepare("PPPPP")
    return func, shared, src


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="*", default=["28672x7168", "7168x7168"])
    ap.add_argument("--sparsity", type=float, nargs="*", default=[0.8, 0.9])
    ap.add_argument("--n", type=int, nargs="*", default=[8, 16, 32, 64])
    ap.add_argument("--splits", type=int, nargs="*", default=[7])
    ap.add_argument("--variants", default="3:4,4:4,3:3", help="stages:min_blocks pairs")
    ap.add_argument("--encodings", nargs="*", default=["values", "pairs"], choices=["values", "pairs"])
    ap.add_argument("--check", action="store_true", help="CPU only: encoder and decode emulator")
    ap.add_argument("--dump", help="write the first kernel's source here")
    args = ap.parse_args()
    if args.check:
        return check()
    import torch

    from tiled_probe import probe_weight

    variants = [tuple(map(int, v.split(":"))) for v in args.variants.split(",")]
    print_header()
    for shape in args.shapes:
        m, k = map(int, shape.split("x"))
        for s in args.sparsity:
            w = probe_weight(m, k, s)
            t0 = time.time()
            encs = {mode: encode(w, mode == "pairs") for mode in args.encodings}
            enc_s = time.time() - t0
            enc = next(iter(encs.values()))
            dev = {mode: [torch.from_numpy(a.view(np.int32) if a.dtype == np.uint32 else a).cuda()
                          for a in (e.bitmaps, e.values, e.offs)] for mode, e in encs.items()}
            dense = torch.from_numpy(w.toarray()).to(torch.float16).cuda()
            kept = torch.from_numpy(enc.kept.toarray()).to(torch.float16).cuda()
            for n in args.n:
                x, ref, cublas, rows = start_case(dense, n)
                ref_kept = kept.float() @ x.float()
                time_baselines(w, x, ref, ("selected", "bitmap g2", "csl"), rows)
                for mode, e in encs.items():
                    for split in args.splits:
                        for stages, min_blocks in variants:
                            name = f"sparse24 {mode} sk{split} st{stages} mb{min_blocks}"
                            try:
                                func, shared, src = build(m, k, n, split, stages, e.value_bytes, min_blocks, mode == "pairs")
                            except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                                print(f"{shape:>11} {s:4.2f} {n:3d} {name:28} build failed: {exc}", flush=True)
                                continue
                            if args.dump:
                                with open(args.dump, "w") as fh:
                                    fh.write(src)
                                args.dump = None
                            y = torch.zeros(m, n, dtype=torch.float32, device="cuda")
                            grid, block = (1, m // TILE_M, split), (128, 1, 1)
                            ptrs = [t.data_ptr() for t in dev[mode]] + [x.data_ptr(), y.data_ptr()]

                            def launch():
                                func.prepared_call(grid, block, *ptrs, shared_size=shared)

                            ms, err = time_prototype(launch, y, ref_kept)
                            rows.append((name, ms, err, f"{shared} B shared, {e.values.nbytes + e.bitmaps.nbytes} B encoded"))
                print_rows(shape, s, n, rows, cublas)
            print(f"# encoded {shape} at {s} in {enc_s:.1f} s; {w.nnz} nonzeros, residual (not applied) "
                  f"{enc.residual_nnz} ({100 * enc.residual_nnz / w.nnz:.2f} %); fullest tile {enc.value_bytes // 2} values",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
