"""Probe: Tiled-CSL scattered into shared memory and multiplied by warpgroup MMA from shared memory (a prototype).

    python benchmarks/wgmma_csl_probe.py [--shapes 28672x7168 7168x7168] [--sparsity 0.8 0.9] [--n 32 64]
    python benchmarks/wgmma_csl_probe.py --check     # CPU only: the encoding against scipy
    ... [--ablate] [--rotate 0 7] [--variants 4:2,6:2] [--splits 1,2 | --max-splits 2]

Question: at N = 32 and 64 the tile kernels are bound by latency (ncu of the register-pair bitmap
kernel at 90 %, N = 64: 3.4 active and 0.75 eligible warps per scheduler, one HMMA per scheduler
every ~16 cycles; halving the tensor instructions with mma.sp changed nothing, probes/sparse24_probe.txt).
Every warp there decodes its own A fragments and then waits on its own mma.sync chain. Here the
tensor cores read both operands from shared memory asynchronously (`wgmma.mma_async` m64nNk16, A
K-major and B = the X tile MN-major, no swizzle): the block scatters tile t + 1's nonzeros into the
other of two zeroed dense A buffers while tile t's wgmma group runs, so the per-nonzero scatter
(Tiled-CSL's: 4 bytes a nonzero, the value and its shared-memory offset) overlaps the tensor work
instead of sharing the warps' issue slots with it. One warpgroup (128 threads) per block, a
128 x 64 tile = two m64 wgmma per k16 step.

Per tile t of a block: wait for its ring slot (cp.async: X tile and words) -> barrier -> scatter the
words into A[t % 2] (zeroed after tile t - 2's group completed) -> proxy fence -> barrier -> 8 wgmma
(2 x m64, 4 k16 steps), commit -> wait until tile t - 1's group is done -> zero A[(t + 1) % 2].

Result on the H100 (2026-11-27, probes/wgmma_csl_probe.txt): correct (fp32 out, errors <= 8e-6),
and slower than the selected kernels: 28672 x 7168 at 90 %, N = 64, 164-170 us against 116 (CSL);
N = 32 112-118 against 80-83. `--ablate` times the same kernel with parts removed (wrong product):
without the scatter and zero-fill, the wgmma and the proxy fence it still takes 151-156 us, and
without the X tile copies as well 55 us, so this ring (2 blocks per SM) is bound by its X copies;
`--rotate` (each row tile's k-order rotated) speeds that ring 1.15-1.22x. The production kernels,
by contrast, lose only 2-6 % to their X copies (probes/tiled_probe_nox.txt). Not made a family.

Prototype limits: fp16, M % 128 == 0, K % 64 == 0, N in {16, 32, 64, 128}, split-K by fp32 atomics
into a zeroed fp32 Y (the zeroing not timed). Timed beside the selected kernel, the tile families
forced, and cuBLAS fp16 (sparsegen.bench.timing.time_cuda: L2 warm, as the llm suite).
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

from standalone_probe import CUDA_PRELUDE, print_header, print_rows, start_case, time_baselines, time_prototype  # noqa: E402

TILE_M, TILE_K = 128, 64
PAD_OFFSET = TILE_M * TILE_K  # a padding word's target: one half past the dense tile

SOURCE = r"""
#include <cuda_fp16.h>
#include <stdint.h>
constexpr int M = {M}, K = {K}, N = {N};
constexpr int TILE_M = 128, TILE_K = 64, THREADS = 128;
constexpr int K_TILES = K / TILE_K;
constexpr int SPLIT = {SPLIT};
constexpr int KT_PER = (K_TILES + SPLIT - 1) / SPLIT;
constexpr int STAGES = {STAGES}, AHEAD = STAGES - 2;  // a slot stays busy while its tile's group runs
constexpr int X_CHUNKS = N / 8;
constexpr int X_BYTES = TILE_K * N * 2;
constexpr int WORD_BYTES = {WORD_BYTES};  // the fullest tile's words, padded to 128 bytes (A buffers 128-aligned)
constexpr int STAGE = X_BYTES + WORD_BYTES;
constexpr int A_BYTES = TILE_M * TILE_K * 2 + 128;  // a dense tile (K-major core matrices) + the padding target
constexpr int NF = N / 8;
constexpr bool DECODE = {DECODE};  // false: a timing ablation that skips the zero-fill and the scatter (wrong product)
constexpr bool MMA = {MMA};  // false: an ablation that also skips the wgmma (only the ring's copies and barriers)
constexpr bool FENCE = {FENCE};  // false (with MMA false): an ablation that also drops the proxy fence
constexpr bool XCOPY = {XCOPY};  // false (with the above): an ablation that also skips the X tile copies
constexpr int ROTATE = {ROTATE};  // block (row tile) y walks its k-tiles starting at (y * ROTATE) % tiles: spreads X's L2 reads
// A: core matrix (8 rows x 8 k, 128 contiguous bytes) (rb, kb) at (rb * 8 + kb) * 128
constexpr uint32_t A_LBO = 128, A_SBO = 1024;
// X (B, MN-major): core matrix (8 k x 8 n) (kb, nb) at (kb * X_CHUNKS + nb) * 128
constexpr uint32_t X_SBO = 128, X_LBO = X_CHUNKS * 128;
static_assert(STAGE % 16 == 0 && AHEAD >= 1, "ring");

{PRELUDE}
__device__ __forceinline__ void proxy_fence() {{ asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }}
__device__ __forceinline__ void wg_fence() {{ asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }}
__device__ __forceinline__ void wg_commit() {{ asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }}
template <int P> __device__ __forceinline__ void wg_wait() {{ asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(P) : "memory"); }}
__device__ __forceinline__ uint64_t desc(uint32_t a, uint32_t lbo, uint32_t sbo) {{
    return (uint64_t)((a & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}}
__device__ __forceinline__ int xpos(int row, int c) {{ return ((row >> 3) * X_CHUNKS + c) * 8 + (row & 7); }}

// acc (this warp's 16 rows of the m64 block x N) += A[64 rows x k16] * X[k16 x N]
__device__ __forceinline__ void wgmma_ss(float (&d)[NF][4], uint64_t da, uint64_t db) {{
    asm volatile("{{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
        "wgmma.mma_async.sync.aligned.m64n{N}k16.f32.f16.f16 {{ {ACC_LIST} }}, %{IA}, %{IB}, p, 1, 1, 0, 1;\n\t}}\n"
        : {ACC_OPS}
        : "l"(da), "l"(db) : "memory");
}}

extern "C" __global__ void __launch_bounds__(THREADS, {MIN_BLOCKS})
wgmma_csl(const uint32_t* __restrict__ words, const int* __restrict__ offs, const unsigned short* __restrict__ x,
          float* __restrict__ y) {{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* abuf = smem + STAGES * STAGE;  // two dense A tiles
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int mt = blockIdx.y, kt0 = blockIdx.z * KT_PER;
    const int tiles = min(K_TILES - kt0, KT_PER);
    const size_t tile0 = (size_t)mt * K_TILES + kt0;
    float acc[2][NF][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    __shared__ int soffs[KT_PER + 1];  // the block's tile starts, read once (not a global load per tile)
    for (int i = threadIdx.x; i <= tiles; i += THREADS) soffs[i] = __ldg(offs + tile0 + i);
    __syncthreads();
    constexpr int X_COPIES = X_BYTES / 16, W_ROUNDS = (WORD_BYTES / 16 + THREADS - 1) / THREADS;
    const int rot = ROTATE ? (blockIdx.y * ROTATE) % tiles : 0;
    auto kt_of = [&](int u) {{ const int v = u + rot; return v >= tiles ? v - tiles : v; }};
    auto issue = [&](int u) {{
        if (u < tiles) {{
            unsigned char* st = smem + (u % STAGES) * STAGE;
            const int v = kt_of(u);
            const int k0 = (kt0 + v) * TILE_K;
#pragma unroll
            for (int r = 0; r < (X_COPIES + THREADS - 1) / THREADS; ++r) {{
                const int p = threadIdx.x + r * THREADS;
#if {XROWS}
                const int row = p / X_CHUNKS, c = p % X_CHUNKS;  // consecutive threads along a row of X (coalesced reads)
#else
                const int row = (p & 7) + 8 * (p / (8 * X_CHUNKS)), c = (p >> 3) % X_CHUNKS;  // 8 threads fill one core matrix
#endif
                if (XCOPY && (X_COPIES % THREADS == 0 || p < X_COPIES))
                    cp16(saddr(st + xpos(row, c) * 16), x + (size_t)(k0 + row) * N + c * 8);
            }}
            const int lo = soffs[v], hi = soffs[v + 1];
            const int chunks = (hi - lo) / 4;
#pragma unroll
            for (int r = 0; r < W_ROUNDS; ++r)
                if (threadIdx.x + r * THREADS < chunks)
                    cp16(saddr(st + X_BYTES + 16 * (threadIdx.x + r * THREADS)), words + lo + 4 * (threadIdx.x + r * THREADS));
        }}
        commit();
    }};
    auto zero = [&](unsigned char* a) {{
#pragma unroll
        for (int i = 0; i < (TILE_M * TILE_K * 2) / 16 / THREADS; ++i)
            reinterpret_cast<uint4*>(a)[threadIdx.x + i * THREADS] = make_uint4(0u, 0u, 0u, 0u);
    }};
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) issue(u);
    zero(abuf);
    zero(abuf + A_BYTES);

    for (int t = 0; t < tiles; ++t) {{
        wait_groups<AHEAD - 1>();  // tile t's X and words have landed (this thread's copies)
        __syncthreads();  // everyone's; A[t % 2] zeroed by everyone; tile t - 2's slot free
        issue(t + AHEAD);
        const unsigned char* st = smem + (t % STAGES) * STAGE;
        unsigned char* a = abuf + (t & 1) * A_BYTES;
        const int vt = kt_of(t);
        const int chunks = (soffs[vt + 1] - soffs[vt]) / 4;
        const uint4* wv = reinterpret_cast<const uint4*>(st + X_BYTES);
        const uint32_t abase = saddr(a);
#pragma unroll
        for (int r = 0; r < W_ROUNDS; ++r) {{
            const int c = threadIdx.x + r * THREADS;
            if (DECODE && c < chunks) {{
                const uint4 w = wv[c];
                const uint32_t ws[4] = {{w.x, w.y, w.z, w.w}};
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    asm volatile("st.shared.u16 [%0], %1;\n" :: "r"(abase + 2 * (ws[j] & 0xffffu)), "h"((unsigned short)(ws[j] >> 16)) : "memory");
            }}
        }}
        if (FENCE) proxy_fence();  // the scatter and cp.async's X tile, to the async proxy
        __syncthreads();
        if (MMA) {{
        wg_fence();
        const uint64_t xa = desc(saddr(st), X_LBO, X_SBO);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int mf = 0; mf < 2; ++mf)
                wgmma_ss(acc[mf], desc(abase + mf * 8 * A_SBO + ks * 2 * A_LBO, A_LBO, A_SBO),
                         xa + (uint64_t)((ks * 2 * X_LBO) >> 4));
        wg_commit();
        wg_wait<1>();  // tile t - 1's group done: its A buffer is free
        }}
        if (DECODE && t + 1 < tiles) zero(abuf + ((t + 1) & 1) * A_BYTES);
    }}
    wg_wait<0>();
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mf = 0; mf < 2; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {{
                const int r = mt * TILE_M + mf * 64 + warp * 16 + g + 8 * h, col = nf * 8 + 2 * tq;
                atomicAdd(y + (size_t)r * N + col, acc[mf][nf][2 * h]);
                atomicAdd(y + (size_t)r * N + col + 1, acc[mf][nf][2 * h + 1]);
            }}
}}
"""


def a_offset(r, c):
    """Half offset of tile element (r, c) in the K-major core-matrix layout of the dense A tile."""
    return ((r // 8) * 8 + c // 8) * 64 + (r % 8) * 8 + c % 8


@dataclass
class Encoded:
    words: np.ndarray  # per tile its nonzeros' 32-bit words, runs padded to 4
    offs: np.ndarray  # first word of each tile, then the end
    word_bytes: int  # the fullest tile's words (padded), the ring slot's size


def encode(w: sp.csr_matrix) -> Encoded:
    """Per 128 x 64 tile (row tiles, k-tiles fastest) its nonzeros as 32-bit words (fp16 bits << 16 |
    half offset in the dense A tile), each tile's run padded to 4 words; offs[t] = first word of tile t."""
    m, k = w.shape
    coo = w.tocoo()
    r, c = coo.row.astype(np.int64), coo.col.astype(np.int64)
    kt_n = k // TILE_K
    tiles = (m // TILE_M) * kt_n
    tile = (r // TILE_M) * kt_n + c // TILE_K
    off = a_offset(r % TILE_M, c % TILE_K)
    bits = coo.data.astype(np.float16).view(np.uint16).astype(np.uint32)
    order = np.argsort(tile, kind="stable")
    tile, word = tile[order], (bits[order] << 16) | off[order].astype(np.uint32)
    per_tile = np.bincount(tile, minlength=tiles)
    padded = -(-per_tile // 4) * 4
    start = np.r_[0, np.cumsum(padded)]
    first = np.r_[0, np.cumsum(per_tile)]
    words = np.full(int(start[-1]) + 4, PAD_OFFSET, dtype=np.uint32)
    words[start[tile] + (np.arange(tile.size) - first[tile])] = word
    return Encoded(words, start.astype(np.int32), int(padded.max()) * 4)


def decode(enc: Encoded, m: int, k: int) -> np.ndarray:
    """Dense W from the words, the way the kernel scatters them (vectorized over words)."""
    kt_n = k // TILE_K
    tiles = enc.offs.size - 1
    tile = np.repeat(np.arange(tiles), np.diff(enc.offs))
    wd = enc.words[:enc.offs[-1]]
    off = (wd & 0xFFFF).astype(np.int64)
    keep = off < PAD_OFFSET
    tile, off, wd = tile[keep], off[keep], wd[keep]
    cm, rem = off // 64, off % 64
    rb, kb = cm // 8, cm % 8
    r = (tile // kt_n) * TILE_M + rb * 8 + rem // 8
    c = (tile % kt_n) * TILE_K + kb * 8 + rem % 8
    vals = (wd >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    out = np.zeros((m, k), dtype=np.float32)
    out[r, c] = vals
    return out


def check() -> int:
    rng = np.random.default_rng(3)
    for m, k, density in ((128, 64, 0.1), (256, 192, 0.3), (384, 128, 0.02)):
        mask = rng.random((m, k)) < density
        w = sp.csr_matrix(np.where(mask, rng.standard_normal((m, k)), 0.0).astype(np.float16).astype(np.float32))
        ok = np.array_equal(decode(encode(w), m, k), w.toarray())
        print(f"{m}x{k} density {density}: encoding {'matches' if ok else 'DIFFERS'}")
        if not ok:
            return 1
    return 0


@dataclass(frozen=True)
class Variant:
    """One kernel of the probe: its grid and ring, and the ablations (parts left out, for timing only)."""

    split: int
    stages: int
    min_blocks: int
    decode: bool = True  # False: no zero-fill and no scatter (wrong product)
    mma: bool = True  # False: no wgmma either
    fence: bool = True  # False: no proxy fence either
    xcopy: bool = True  # False: no X tile copies either
    rotate: int = 0  # each row tile's k-order rotated by rotate * row tile (mod its tiles)
    xrows: bool = False  # X copied along its rows instead of 8 threads per core matrix

    @property
    def label(self) -> str:
        return (f"wgmma-csl sk{self.split} st{self.stages} mb{self.min_blocks}" + ("" if self.decode else " -decode")
                + ("" if self.mma else " -mma") + ("" if self.fence else " -fence") + ("" if self.xcopy else " -x")
                + (f" rot{self.rotate}" if self.rotate else "") + (" xrows" if self.xrows else ""))


# --ablate: the full kernel, then one part more left out at each step
ABLATIONS = ({}, {"decode": False}, {"decode": False, "mma": False}, {"decode": False, "mma": False, "fence": False},
             {"decode": False, "mma": False, "fence": False, "xcopy": False})


def source(m, k, n, word_bytes, v: Variant) -> str:
    regs = n // 2  # per m64 block: N/8 chunks x 4 floats per thread
    acc_list = ", ".join(f"%{i}" for i in range(regs))
    acc_ops = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs))
    flag = {True: "true", False: "false"}
    return SOURCE.format(M=m, K=k, N=n, SPLIT=v.split, STAGES=v.stages, WORD_BYTES=-(-word_bytes // 128) * 128,
                         MIN_BLOCKS=v.min_blocks, ACC_LIST=acc_list, ACC_OPS=acc_ops, IA=regs, IB=regs + 1,
                         DECODE=flag[v.decode], MMA=flag[v.mma], FENCE=flag[v.fence], XCOPY=flag[v.xcopy],
                         ROTATE=v.rotate, XROWS=int(v.xrows), PRELUDE=CUDA_PRELUDE)


def build(m, k, n, word_bytes, v: Variant):
    from sparsegen import nvcc, runtime

    src = source(m, k, n, word_bytes, v)
    shared = v.stages * (TILE_K * n * 2 + -(-word_bytes // 128) * 128) + 2 * (TILE_M * TILE_K * 2 + 128)
    cubin = nvcc.compile_cubin(src, "sm_90a", name="wgmma_csl")
    func = runtime.load_function(f"wgmma-csl-{m}-{k}-{n}-{word_bytes}-{v}", cubin, "wgmma_csl", shared)
    func.prepare("PPPP")
    return func, shared, src


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="*", default=["28672x7168", "7168x7168"])
    ap.add_argument("--sparsity", type=float, nargs="*", default=[0.8, 0.9])
    ap.add_argument("--n", type=int, nargs="*", default=[32, 64])
    ap.add_argument("--splits", default="auto", help="comma list, or auto: about one to three waves")
    ap.add_argument("--max-splits", type=int, default=3, help="auto: the first this many of the split grid")
    ap.add_argument("--variants", default="4:2", help="stages:min_blocks pairs")
    ap.add_argument("--baselines", default="selected,bitmap g2,csl")
    ap.add_argument("--ablate", action="store_true", help="also time each variant with parts left out, one more at each step (ABLATIONS)")
    ap.add_argument("--rotate", type=int, nargs="*", default=[0], help="k-order rotations to time (0: every block from its first k-tile)")
    ap.add_argument("--xrows", type=int, nargs="*", default=[0], choices=[0, 1],
                    help="X copy mappings to time: 0 = 8 threads per core matrix, 1 = consecutive threads along a row")
    ap.add_argument("--check", action="store_true", help="CPU only: the encoding")
    args = ap.parse_args()
    if args.check:
        return check()
    import torch

    from tiled_probe import probe_weight

    wanted = [b.strip() for b in args.baselines.split(",") if b.strip()]
    rings = [tuple(map(int, v.split(":"))) for v in args.variants.split(",")]
    print_header()
    for shape in args.shapes:
        m, k = map(int, shape.split("x"))
        row_tiles = m // TILE_M
        splits = ([s for s in (1, 2, 3, 4, 7, 14) if 0.8 * 264 <= row_tiles * s <= 4 * 264][:args.max_splits] if args.splits == "auto"
                  else [int(s) for s in args.splits.split(",")])
        variants = [Variant(split, stages, min_blocks, rotate=rotate, xrows=bool(xrows), **ablation)
                    for split in splits for stages, min_blocks in rings for ablation in (ABLATIONS if args.ablate else ({},))
                    for rotate in args.rotate for xrows in args.xrows]
        for s in args.sparsity:
            w = probe_weight(m, k, s)
            t0 = time.time()
            enc = encode(w)
            enc_s = time.time() - t0
            d_w = torch.from_numpy(enc.words.view(np.int32)).cuda()
            d_o = torch.from_numpy(enc.offs).cuda()
            dense = torch.from_numpy(w.toarray()).to(torch.float16).cuda()
            for n in args.n:
                x, ref, cublas, rows = start_case(dense, n)
                time_baselines(w, x, ref, wanted, rows)
                for v in variants:
                    try:
                        func, shared, _ = build(m, k, n, enc.word_bytes, v)
                    except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                        print(f"{shape:>11} {s:4.2f} {n:3d} {v.label:28} build failed: {str(exc)[-1500:]}", flush=True)
                        continue
                    y = torch.zeros(m, n, dtype=torch.float32, device="cuda")
                    grid, block = (1, row_tiles, v.split), (128, 1, 1)
                    ptrs = [d_w.data_ptr(), d_o.data_ptr(), x.data_ptr(), y.data_ptr()]

                    def launch():
                        func.prepared_call(grid, block, *ptrs, shared_size=shared)

                    try:
                        ms, err = time_prototype(launch, y, ref)
                    except Exception as exc:  # noqa: BLE001
                        print(f"{shape:>11} {s:4.2f} {n:3d} {v.label:28} launch failed: {exc}", flush=True)
                        return 1
                    rows.append((v.label, ms, err, f"{shared} B shared"))
                print_rows(shape, s, n, rows, cublas)
            print(f"# encoded {shape} at {s} in {enc_s:.1f} s; {w.nnz} nonzeros; fullest tile {enc.word_bytes // 4} words",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
