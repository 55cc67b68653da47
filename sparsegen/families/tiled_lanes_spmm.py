"""`tiled_lanes_spmm`: tensor-core skinny SpMM on an encoding laid out for the decoder (`tiled_lanes`).

A block (4 warps, one `tile_m` x `tile_k` tile, `bn` columns of X) streams each tile (its lanes' bits,
their value offsets and the values, one contiguous run of 16-byte chunks) and its X tile global ->
shared with cp.async through a `stages`-deep ring, as `tiled_bitmap_spmm` does. The decode is what
differs: a lane loads its bits of the tile (one 4-, 8- or 16-byte load) and its first value's offset
(precomputed by the encoder), then walks its registers in mma order with one predicated 32-bit load
and one predicated add each: no warp scan, no popcount per fragment, no packing, no scatter.
`tile_k` 128 (the default at N <= 16) halves the fixed cost per 128 x 64 of W (the ring's wait,
barrier and copy set-up, the loop, the lane's header loads).

Not yet calibrated: the rates files hold no rates for it, so selection takes it only when asked for
(options family="tiled_lanes_spmm", `select/policy.py`), and its split-K is weighed with the bitmap
register pairs' rates, whose bytes per register it shares. Measured instructions per tile and bytes
per element: docs/decisions/009-decode-budget.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import long_name, short_name
from ..formats import tiled_lanes as FORMAT  # noqa: N812 - the family's format module
from . import _tiled as T
from .base import Arg, Request, decline
from .options import option

FAMILY = "tiled_lanes_spmm"
OPS = ("spmm",)
KERNEL = "tiled_lanes_spmm"
MIN_STAGES, MAX_STAGES = 2, 8
DEFAULT_MIN_STAGES = 3  # one tile landing while another waits its turn, as the bitmap kernel
MAX_BLOCKS = 6  # the decode is issue-bound ALU and shared-load work: warps of several blocks hide it
REGS_BASE = 40  # besides accumulators, fragments and the lane's bits and value pointers
WIDE_TILE_N = 16  # 128-wide k-tiles up to this N: at N <= 16 the per-tile fixed cost is a large share
UNTAKEN = {"wgmma": True, "l2_prefetch": True, "reduction": "stream"}  # options this kernel has no path for


@dataclass(frozen=True)
class Options(T.TiledOptions):
    tile_k: Literal[FORMAT.TILE_KS] | None = option(expected=f"one of {FORMAT.TILE_KS} (columns of a W tile)")


@dataclass(frozen=True)
class Spec(T.TiledSpec):
    family: ClassVar[str] = FAMILY
    granule: ClassVar[int] = 2  # halves per encoded position: mma registers
    stages: int = 3  # cp.async ring depth
    cap_chunks: int = 0  # 16-byte chunks a stage holds of a tile's stream: the fullest tile's (from the plan)
    tile_k: int = 128  # columns of a W tile: 64 or 128

    @property
    def tile_cols(self) -> int:
        return self.tile_k

    @property
    def name(self) -> str:
        base, epi = self.base_name()
        return f"{base}.st{self.stages}.c{self.cap_chunks}{epi}"

    @property
    def stage_bytes(self) -> int:
        return stage_bytes(self.tile_m, self.tile_k, self.bn, self.cap_chunks)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the ring (or the cluster exchange buffer, if larger)."""
        return max(self.stages * self.stage_bytes, self.exchange_bytes)

    def fields(self) -> dict:
        d = super().fields()
        d.update(header_bytes=4 * FORMAT.header_words(self.tile_m, self.tile_k, self.warps),
                 slots=FORMAT.slots(self.tile_m, self.tile_k, self.warps),
                 bit_words=FORMAT.bit_words(self.tile_m, self.tile_k, self.warps))
        return d


def stage_bytes(tile_m: int, tile_k: int, bn: int, cap_chunks: int) -> int:
    """A ring stage: the X tile, then the tile's stream (header and values) rounded up to 128 bytes."""
    return tile_k * bn * 2 + -(-16 * cap_chunks // 128) * 128


def registers(tile_m: int, bn: int, tile_k: int, warps: int = T.WARPS) -> int:
    """Registers per thread (an upper estimate): accumulators, one k-step's A and B fragments, the
    lane's bit words and value pointers, the rest."""
    mf, nf = tile_m // warps // 16, bn // 8
    bw = FORMAT.bit_words(tile_m, tile_k, warps)
    return REGS_BASE + T.accumulators(tile_m, bn, warps) + 4 * mf + 2 * nf + 2 * bw


def static_bytes(kt_per_split: int) -> int:
    """Static shared memory beside the ring: the block's tile offsets and a barrier per stage (at most
    MAX_STAGES), which the ring's budget must leave room for."""
    return 4 * (kt_per_split + 1) + 8 * MAX_STAGES


def ring_for(tile_m: int, tile_k: int, bn: int, cap_chunks: int, kt_per_split: int, request: Request,
             blocks: int | None = None) -> tuple[int, int]:
    """(resident blocks, ring depth) for stages of `cap_chunks` chunks beside the static shared memory
    of `kt_per_split` tiles: `T.ring_shape` (options stages= forces the depth, blocks= the residency)."""
    forced = request.option("stages")
    stage = stage_bytes(tile_m, tile_k, bn, cap_chunks)
    return T.ring_shape(static_bytes(kt_per_split), stage, stage, registers(tile_m, bn, tile_k), DEFAULT_MIN_STAGES,
                        MAX_STAGES, MAX_BLOCKS, None if forced is None else max(MIN_STAGES, int(forced)),
                        forced_blocks=T.request_blocks(request) or blocks, device=request.device)


def request_tile_k(request: Request) -> int:
    """Columns of a tile: options tile_k=, else 128 at N <= WIDE_TILE_N and 64 above."""
    return int(request.option("tile_k") or (128 if request.n <= WIDE_TILE_N else 64))


def lanes_bytes(tile_m: int, tile_k: int):
    """Bytes of a tile of `nnz` nonzeros for a uniform pattern in it: 4 per register holding one,
    the header, half a chunk of padding, an offset."""
    pairs = tile_m * tile_k / 2
    head = 4.0 * FORMAT.header_words(tile_m, tile_k)
    return lambda nnz: head + 4.0 * pairs * (1.0 - (1.0 - nnz / (2.0 * pairs)) ** 2) + 8.0 + 4.0


def encoded_bytes(stats, tile_m: int, tile_k: int) -> float:
    """Bytes of W in this format (`lanes_bytes` over the analysed tile-density histogram, whose
    128 x 64 tiles are scaled to `tile_m` x `tile_k`)."""
    dens, counts, empty = T.tile_densities(stats)
    per = lanes_bytes(tile_m, tile_k)(dens * tile_m * tile_k)
    scale = stats.tiles.tile_rows * stats.tiles.tile_cols / (tile_m * tile_k)
    return scale * float((per * counts).sum()) + 4.0 * empty * scale


def choose(stats, request: Request, kernel_s: float) -> tuple[Spec, str]:
    """The spec for this matrix and request; `kernel_s` (the cost model's time of the main loop with
    every SM busy) weighs the split-K grids `T.choose_split` compares, in 64-column k-tiles; the
    split is then counted in this spec's k-tiles (no split empty)."""
    n, (m, k) = request.n, stats.shape
    bn = T.request_bn(request)
    tile_k = request_tile_k(request)
    fullest = stats.tiles.max_nnz * (1.0 - stats.density / 2) * tile_k / T.TILE_K  # registers of the fullest tile
    head = FORMAT.header_words(128, tile_k)
    cap_est = -(-(head + int(round(fullest)) + 4) // 4)
    k_tiles = -(-k // tile_k)
    resident, _ = ring_for(128, tile_k, bn, cap_est, k_tiles, request)
    split = T.choose_split(stats, request, n, bn, resident, kernel_s, heights=(128, 64), stream_bns=())
    # in this spec's k-tiles: a split asked for as asked (at most one k-tile each), else the chooser's
    # (each split at least T.MIN_K_TILES_PER_SPLIT 64-column tiles' worth)
    most = k_tiles if request.option("split_k") is not None else k_tiles * tile_k // (T.MIN_K_TILES_PER_SPLIT * T.TILE_K)
    split_k = max(1, min(split.split_k, most))
    split_k = -(-k_tiles // -(-k_tiles // split_k))  # no empty split
    reduction = split.reduction if split_k > 1 else "none"
    if split_k > 1 and reduction == "none":
        reduction = "atomic"
    cap = max(1, cap_est * split.tile_m // 128)
    blocks, stages = ring_for(split.tile_m, tile_k, bn, cap, -(-k_tiles // split_k), request, blocks=split.blocks)
    spec = Spec(short_name(request.dtype), T.out_dtype(request), m, k, n, split.tile_m, bn, split_k, reduction,
                request.bias, request.relu, blocks, T.WARPS, 1, False, stages=stages, tile_k=tile_k)
    why = (f"{spec.tile_m}x{tile_k} tiles ({'128-wide at' if tile_k == 128 else 'at'} N = {n}), "
           f"{bn} columns per block, {stages}-stage cp.async ring, {blocks} blocks per SM; split-K {split_k} "
           f"of {k_tiles} k-tiles{f', reduced by {reduction}' if split_k > 1 else ''}; {split.reason}")
    return spec, why


def describe(stats, request: Request, spec: Spec, why: str) -> str:
    area = max(stats.shape[0] * stats.shape[1], 1)
    return (f"lanes {encoded_bytes(stats, spec.tile_m, spec.tile_k) / area:.2f} B/element (each lane's bits, "
            f"offset and values where it reads them: no scan at run time); {why}")


def gate(stats, request: Request):
    """The tile families' gate, and what this kernel has no path for: GPUs before sm_90 (its stream
    goes by bulk copy), warpgroup MMA, stream-K, the L2 prefetch, 8-warp blocks and k-groups."""
    declined = T.gate(stats, request, Options)
    if declined is not None:
        return declined
    if not T.cluster_ok(request):
        return decline(f"arch {request.arch}: tiled_lanes_spmm's bulk copies and mbarriers are sm_90's")
    for name, value in UNTAKEN.items():
        if request.option(name) == value:
            return decline(f"options {name}={value!r}: tiled_lanes_spmm has no such path (tiled_bitmap_spmm has)")
    if T.request_warps(request) != T.WARPS or T.request_warp_k(request) != 1:
        return decline(f"options warps / warp_k: tiled_lanes_spmm runs {T.WARPS}-warp blocks, one row group each")
    return None


FORMAT_ARGS = (Arg("stream", "plan"), Arg("tile_offsets", "plan"))


def encoding(spec: Spec) -> tuple:
    """The spec fields the encoding reads: one encoding serves every n (the format cache)."""
    return (spec.dtype, spec.tile_m, spec.tile_k, spec.warps)


def encode_format(csr, spec: Spec, bias=None):
    return FORMAT.encode(csr, long_name(spec.dtype), spec.tile_m, spec.tile_k, bias, warps=spec.warps)


specialize = T.with_scratch


def encode(csr, spec: Spec, bias=None):
    return specialize(encode_format(csr, spec, bias), spec)


def finalize(spec: Spec, plan, request: Request) -> Spec:
    """Size a stage's stream buffer for the fullest tile, then the ring depth and residency."""
    def build(cap):
        blocks, stages = ring_for(spec.tile_m, spec.tile_k, spec.bn, cap, spec.kt_per_split, request)
        return dataclasses.replace(spec, cap_chunks=cap, stages=stages, min_blocks=blocks)

    def fits(s):
        return s.shared_bytes + static_bytes(s.kt_per_split) <= T.smem_budget(s.min_blocks, request.device)

    return T.with_shared_cap(plan.constants["max_tile_chunks"], build, fits)


def steps(spec: Spec, plan) -> tuple:
    return T.steps(spec, FORMAT_ARGS, KERNEL, spec.shared_bytes)


operands = T.operands
emulate_operands = T.emulate_operands
alignment = T.alignment


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu, out=long_name(spec.out))
