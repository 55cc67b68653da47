"""`tiled_csl_spmm`: Flash-LLM's load-as-sparse, compute-as-dense SpMM on tensor cores.

A block (4 warps, one `tile_m` x 64 tile of W, `bn` columns of X) walks its share of K through a
pipeline of three places (Flash-LLM's two levels, the first made deep): a cp.async ring of
`stages` slots, each one tile's Tiled-CSL words (up to `cap_vecs` uint4; a rare fuller tile
finishes from global) and its X tile, `stages - 1` tiles in flight ahead of the math with no
registers held for them (a bulk L2 prefetch runs a ring's depth further on sm_90); two dense W
buffers the words are scattered into (one `LEA.HI` and one 16-bit store per nonzero: the words
hold byte offsets); and the warps' registers (ldmatrix, mma.m16n8k16, fp32 accumulators). Iteration
t scatters tile t + 1 while the warps multiply tile t, then each warp re-zeroes its own rows of
tile t's buffer: one barrier per tile. Empty tiles skip the math. See `formats/tiled_csl.py` for the
encoding and `_tiled.py` for split-K; the skinny cost model (`select/skinny_cost.py`) decides when
this family serves a request.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..dtypes import long_name, short_name
from ..formats import tiled_csl as FORMAT  # noqa: N812 - the family's format module
from . import _tiled as T
from .base import Arg, Request
from .options import option

FAMILY = "tiled_csl_spmm"
OPS = ("spmm",)
KERNEL = "tiled_csl_spmm"
SINK_BYTES = 2 * FORMAT.SINK_HALVES
# Ring depth: the loop needs tile t + 1 landed at iteration t, so at least 3 slots; beyond that as
# many as keep T.IN_FLIGHT_BYTES of words per SM moving (deep for sparse tiles, shallow for full ones),
# at most MAX_STAGES (every slot also holds an X tile).
MIN_STAGES, MAX_STAGES = 3, 8
WGMMA_MIN_STAGES = 4  # with wgmma a tile's slot stays busy one iteration longer (its group in flight)
# Resident blocks per SM wanted, at most: the scatter of one block, the ldmatrix/mma chains of another
# and the copies of a third overlap only across blocks (each syncs once per tile); past 4, a block's
# share of shared memory (two 16 KB W buffers at tile_m 128) would starve its ring.
MAX_BLOCKS = 4
REGS_BASE = 48  # registers besides the accumulators and fragments (addresses, offsets, loop state)


@dataclass(frozen=True)
class Spec(T.TiledSpec):
    family: ClassVar[str] = FAMILY
    granule: ClassVar[int] = 1  # halves per encoded position: one encoding (bitmap's has two)
    stages: int = 4  # ring slots: tiles of words and X in flight per block, plus the one computed
    cap_vecs: int = 0  # uint4 of words a ring slot holds (fixed from the plan: the fullest tile, or capped)
    strict_banks: bool = False
    # bulk L2 prefetch of the words a ring's depth ahead (sm_90): off by default, since the H100
    # probe (results/.../probes/tiled_probe_knobs.txt) ran every one of 16 rows faster without it
    l2_prefetch: bool = False

    @property
    def name(self) -> str:
        base, epi = self.base_name()
        return (f"{base}.st{self.stages}.c{self.cap_vecs}{'.sb' if self.strict_banks else ''}"
                f"{'.pf' if self.l2_prefetch else ''}{epi}")

    @property
    def slot_bytes(self) -> int:
        return slot_bytes(self.bn, self.cap_vecs)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: two W buffers and the ring (or the cluster exchange or the k-groups'
        partial sums, if larger)."""
        return max(w_buffers_bytes(self.tile_m) + self.stages * self.slot_bytes, self.exchange_bytes,
                   self.k_group_bytes)

    @property
    def static_bytes(self) -> int:
        return 4 * (self.kt_per_split + 1)  # the block's tile offsets


@dataclass(frozen=True)
class Options(T.TiledOptions):
    strict_banks: bool = option(False)  # padded banks: a strictly bank-conflict-free scatter
    cap_vecs: int | None = option()  # uint4 of words a ring slot holds (the rest of a fuller tile from global)


def w_buffers_bytes(tile_m: int) -> int:
    return 2 * (tile_m * T.TILE_K * 2 + SINK_BYTES)


def slot_bytes(bn: int, cap_vecs: int) -> int:
    """A ring slot: the X tile and `cap_vecs` uint4 of words, rounded up to 128 bytes (the template's
    SLOT_BYTES) so every slot's cp.async copies start on a bank row."""
    return -(-(T.TILE_K * bn * 2 + 16 * cap_vecs) // 128) * 128


def registers(tile_m: int, bn: int, warps: int = T.WARPS, warp_k: int = 1) -> int:
    """Registers per thread (ptxas, sm_90, within 10 %): accumulators, A and B fragments, the rest."""
    mf, nf = tile_m // (warps // warp_k) // 16, bn // 8
    return REGS_BASE + T.accumulators(tile_m, bn, warps, warp_k) + 4 * mf + 2 * nf


def ring_for(tile_m: int, bn: int, vectors: int, kt_per_split: int, request: Request,
             warps: int = T.WARPS, warp_k: int = 1) -> tuple[int, int, int]:
    """(resident blocks, ring depth, vectors per slot) for tiles of at most `vectors` uint4 of words:
    `T.ring_shape` (the most blocks whose ring keeps T.IN_FLIGHT_BYTES moving; options stages= forces
    the depth, blocks= the residency); a slot holds the fullest tile unless even the shallowest ring of one block could not,
    then what fits (the rest of a fuller tile comes from global)."""
    forced = request.option("stages")
    least = WGMMA_MIN_STAGES if T.request_wgmma(request) else MIN_STAGES
    forced = None if forced is None else max(least, int(forced))
    fixed = w_buffers_bytes(tile_m) + 4 * (kt_per_split + 1)  # W buffers, the block's tile offsets
    slot = slot_bytes(bn, vectors)
    blocks, stages = T.ring_shape(fixed, slot, slot, registers(tile_m, bn, warps, warp_k), least, MAX_STAGES,
                                  MAX_BLOCKS, forced, warps=warps, forced_blocks=T.request_blocks(request),
                                  device=request.device)
    per_slot = (T.smem_budget(blocks, request.device) - fixed) // stages // 128 * 128  # whole 128-byte rows
    return blocks, stages, max(1, min(vectors, (per_slot - slot_bytes(bn, 0)) // 16))


def csl_bytes(nnz):
    return 4.0 * (nnz + 1.5) + 4.0  # words, average vector padding, one offset


def encoded_bytes(stats, tile_m: int) -> float:
    """Bytes of W as Tiled-CSL tiles of `tile_m` rows (`csl_bytes` over the tile-density histogram)."""
    return T.w_bytes(stats, tile_m, csl_bytes, 4.0)


def choose(stats, request: Request, kernel_s: float) -> tuple[Spec, str]:
    """The spec for this matrix and request; `kernel_s`, the cost model's time of the main loop with
    every SM busy, weighs the split-K grids `T.choose_split` compares."""
    n, (m, k) = request.n, stats.shape
    bn = T.request_bn(request)
    k_tiles = -(-k // T.TILE_K)
    warps, warp_k = T.request_warps(request), T.request_warp_k(request)
    vectors = -(-stats.tiles.max_nnz // 4)  # the fullest analysed 128 x 64 tile, in uint4 of words
    resident, _, _ = ring_for(128, bn, vectors, k_tiles, request, warps, warp_k)
    split = T.choose_split(stats, request, n, bn, resident, kernel_s, heights=(128, 64),
                           stream_bns=T.STREAM_BNS[FAMILY])
    kt_per_split = stream_kt_bound(m, split.tile_m, k_tiles, request) if split.reduction == "stream" \
        else -(-k_tiles // split.split_k)
    blocks, stages, _ = ring_for(split.tile_m, bn, max(1, vectors * split.tile_m // 128), kt_per_split, request,
                                 warps, warp_k)
    spec = Spec(short_name(request.dtype), T.out_dtype(request), m, k, n, split.tile_m, bn, split.split_k,
                split.reduction, request.bias, request.relu, blocks, warps, warp_k, T.request_wgmma(request), stages=stages,
                strict_banks=bool(request.option("strict_banks", False)),
                l2_prefetch=bool(request.option("l2_prefetch", False)))
    spec = T.with_stream_grid(spec, request.device.sm_count)
    reason = (f"density {stats.density:.2f}: Tiled-CSL {encoded_bytes(stats, 128) / max(m * k, 1):.2f} B/element "
              f"({4 * stats.density:.2f} for values + positions); {spec.tile_m}x{T.TILE_K} tiles, {bn} columns "
              f"per block ({spec.n_tiles} column tile{'s' if spec.n_tiles > 1 else ''}), {stages}-slot cp.async ring, "
              f"{blocks} blocks per SM"
              f"{f'; warps in {warp_k} k-groups (each loads 1/{warp_k} of the X fragments)' if warp_k > 1 else ''}"
              f"; {split.reason}"
              f"{'; strictly bank-conflict-free scatter (padded banks)' if spec.strict_banks else ''}")
    return spec, reason


def gate(stats, request: Request):
    """The tile families' shared gate (`_tiled.gate`): Tiled-CSL adds nothing to it."""
    return T.gate(stats, request, Options)


FORMAT_ARGS = (Arg("words", "plan"), Arg("tile_offsets", "plan"))


def encoding(spec: Spec) -> tuple:
    """The spec fields the encoding reads: one encoding serves every n (the format cache)."""
    return (spec.dtype, spec.tile_m, spec.strict_banks)


def encode_format(csr, spec: Spec, bias=None):
    return FORMAT.encode(csr, long_name(spec.dtype), spec.tile_m, bias, strict_banks=spec.strict_banks)


specialize = T.with_scratch


def encode(csr, spec: Spec, bias=None):
    return specialize(encode_format(csr, spec, bias), spec)


def finalize(spec: Spec, plan, request: Request) -> Spec:
    """Size a ring slot for the fullest tile, then the depth and residency (`ring_for`); options
    cap_vecs= forces the slot size (e.g. to exercise the from-global rest)."""
    kt_per_split = (stream_kt_bound(spec.m, spec.tile_m, spec.k_tiles, request) if spec.reduction == "stream"
                    else spec.kt_per_split)
    blocks, stages, cap = ring_for(spec.tile_m, spec.bn, T.shared_cap(plan.constants["max_tile_vectors"]), kt_per_split,
                                   request, spec.warps, spec.warp_k)
    forced = request.option("cap_vecs")
    cap = max(1, int(forced)) if forced is not None else cap
    spec = dataclasses.replace(spec, min_blocks=blocks, stages=stages, cap_vecs=cap)
    return T.with_stream_grid(spec, request.device.sm_count)


def stream_kt_bound(m: int, tile_m: int, k_tiles: int, request: Request) -> int:
    """Stream-K: the most tile products a block walks whatever its residency (one block per SM, at
    least 4 each), which sizes the block's shared tile offsets before the residency is known."""
    units = -(-m // tile_m) * k_tiles
    return -(-units // T.stream_grid(-(-m // tile_m), k_tiles, 1, request.device.sm_count))


def steps(spec: Spec, plan) -> tuple:
    return T.steps(spec, FORMAT_ARGS, KERNEL, spec.shared_bytes)


operands = T.operands
emulate_operands = T.emulate_operands
alignment = T.alignment


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu, out=long_name(spec.out))
