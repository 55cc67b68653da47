"""`tiled_bitmap_spmm`: bitmap tiles decoded straight into tensor-core fragments (after SpInfer).

A block (4 warps, one `tile_m` x 64 tile, `bn` columns of X) streams each tile's bitmaps, packed
values and slice offsets, and its X tile, global -> shared with cp.async through a `stages`-deep
ring (no registers held for data in flight, so the pipeline is as deep as shared memory allows; on
sm_90 a bulk L2 prefetch runs a ring's depth further). Each warp decodes its own A fragments: per
tile a lane loads its bitmap bytes (one per fragment) in one shared load, and a packed warp scan of
byte popcounts (four fragments per scan) plus two warp sums give its first value in every fragment;
per fragment it reads its (at most 8) values as consecutive halves into the mma registers by
predicated 16-bit loads: no zero-fill, no scatter, no ldmatrix for W. Warps whose rows of a tile are
empty skip it. Residency and ring depth come from `T.ring_shape`, split-K from `T.choose_split`.
See `formats/tiled_bitmap.py` and `_tiled.py`; the skinny cost model (`select/skinny_cost.py`)
decides when this family serves a request, and in which encoding.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import long_name, short_name
from ..formats import tiled_bitmap as FORMAT  # noqa: N812 - the family's format module
from . import _tiled as T
from . import tiled_csl_spmm as csl
from .base import Arg, Request, decline
from .options import option

FAMILY = "tiled_bitmap_spmm"
OPS = ("spmm",)
KERNEL = "tiled_bitmap_spmm"
# Ring depth: a ring needs one stage in flight beside the one computed; beyond that as many as keep
# T.IN_FLIGHT_BYTES per SM moving over the resident blocks, at most MAX_STAGES.
MIN_STAGES, MAX_STAGES = 2, 8
DEFAULT_MIN_STAGES = 3  # unless asked for (options stages=2): one tile landing while another waits its turn
# The decode is ALU work (about 45 instructions per fragment and lane): it needs warps from several
# blocks to keep the schedulers busy while one block waits at its barrier or on shared memory, so
# as many resident blocks as registers and shared memory allow, up to MAX_BLOCKS (24 warps).
MAX_BLOCKS = 6
MAX_BLOCKS_W8 = 4  # 8-warp blocks: up to 32 warps
REGS_BASE = 56  # besides accumulators and fragments: bitmap words, fragment starts, decode temporaries


@dataclass(frozen=True)
class Options(T.TiledOptions):
    # halves per bitmap bit; None: the cost model builds both encodings and keeps the faster
    granule: Literal[FORMAT.GRANULES] | None = option(expected=f"one of {FORMAT.GRANULES} (halves per bitmap bit)")


def offset_bytes(warps: int) -> int:
    """A stage's slice starts: the tile's `warps` and the next tile's (16-byte chunks)."""
    return 8 * warps


@dataclass(frozen=True)
class Spec(T.TiledSpec):
    family: ClassVar[str] = FAMILY
    stages: int = 4  # cp.async ring depth
    vcap: int = 0  # values one stage holds: the fullest tile (fixed from the plan)
    # halves per bitmap bit: 1 (SpInfer's one bit per element, 2 bytes per nonzero) or 2 (one bit per
    # mma register, its 4-byte word stored whole: more bytes, half the decode; formats/tiled_bitmap.py)
    granule: int = 1
    # bulk L2 prefetch of bitmaps and values a ring's depth ahead (sm_90): off by default, since the H100
    # probe (results/.../probes/tiled_probe_knobs.txt) ran every one of 16 rows faster without it
    l2_prefetch: bool = False

    @property
    def name(self) -> str:
        base, epi = self.base_name()
        pairs = f".g{self.granule}" if self.granule != 1 else ""
        return f"{base}.st{self.stages}.v{self.vcap}{pairs}{'.pf' if self.l2_prefetch else ''}{epi}"

    @property
    def stage_bytes(self) -> int:
        return stage_bytes(self.tile_m, self.bn, self.vcap, self.warps, self.granule)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the ring (or the cluster exchange buffer, if larger)."""
        return max(self.stages * self.stage_bytes, self.exchange_bytes)


def stage_bytes(tile_m: int, bn: int, vcap: int, warps: int = T.WARPS, granule: int = 1) -> int:
    value = FORMAT.value_bytes(granule)
    return tile_m * 8 // granule + offset_bytes(warps) + -(-value * vcap // 128) * 128 + T.TILE_K * bn * 2


WIDE_REGS = 20  # bn >= 32: ptxas used 121 (bn 32) and 165 (bn 64) registers for tile_m 128, ~15 above the terms


def registers(tile_m: int, bn: int, warps: int = T.WARPS) -> int:
    """Registers per thread (ptxas, sm_90): an upper estimate, since a residency it allows caps
    them (tile_m 64, bn 64 spilled 64 bytes when the estimate without WIDE_REGS allowed 4 blocks)."""
    mf, nf = tile_m // warps // 16, bn // 8
    return REGS_BASE + 4 * mf * nf + 4 * mf + 2 * nf + 2 * mf + (WIDE_REGS if nf >= 4 else 0)


def register_blocks(tile_m: int, bn: int, device, warps: int = T.WARPS) -> int:
    """Resident blocks per SM the register estimate allows on `device` (before shared memory)."""
    return T.register_blocks(registers(tile_m, bn, warps), device, warps)


def ring_for(tile_m: int, bn: int, vcap: int, request: Request, warps: int = T.WARPS,
             granule: int = 1, blocks: int | None = None) -> tuple[int, int]:
    """(resident blocks, ring depth) for stages of `vcap` values: `T.ring_shape` (the most blocks
    whose ring keeps T.IN_FLIGHT_BYTES moving; options stages= forces the depth, blocks= (or `blocks`)
    the residency)."""
    forced = request.option("stages")
    stage = stage_bytes(tile_m, bn, vcap, warps, granule)
    max_blocks = MAX_BLOCKS if warps == T.WARPS else MAX_BLOCKS_W8
    least = DEFAULT_MIN_STAGES if T.request_wgmma(request) else MIN_STAGES  # wgmma: a slot stays busy one tile longer
    return T.ring_shape(0, stage, stage, registers(tile_m, bn, warps), DEFAULT_MIN_STAGES, MAX_STAGES, max_blocks,
                        None if forced is None else max(least, int(forced)), warps=warps,
                        forced_blocks=T.request_blocks(request) or blocks, device=request.device)


def bitmap_bytes(tile_m: int, granule: int = 1):
    """Bytes of a tile of `nnz` nonzeros: bitmap, values, padding, offsets. Register pairs (granule 2):
    the registers holding a nonzero, for a uniform pattern in the tile, 4 bytes each."""
    if granule == 1:
        return lambda nnz: tile_m * 8.0 + 2.0 * nnz + 8.0 + 16.0
    pairs = tile_m * T.TILE_K / 2
    return lambda nnz: tile_m * 4.0 + 4.0 * pairs * (1.0 - (1.0 - nnz / (2.0 * pairs)) ** 2) + 8.0 + 16.0


def encoded_bytes(stats, tile_m: int, granule: int = 1) -> float:
    """Bytes of W as bitmap tiles of `tile_m` rows (`bitmap_bytes` over the tile-density histogram)."""
    return T.w_bytes(stats, tile_m, bitmap_bytes(tile_m, granule), 16.0)


def with_granule(request: Request, granule: int) -> Request:
    """The request with its encoding fixed (options granule=): the cost model builds both encodings
    and keeps the one it predicts faster (register pairs spend 4 bytes per nonzero register on half
    the decode, which pays from ~80 % sparsity: probes/tiled_probe_granule*.txt)."""
    return dataclasses.replace(request, options=tuple(sorted({**dict(request.options), "granule": granule}.items())))


def choose(stats, request: Request, kernel_s: float) -> tuple[Spec, str]:
    """The spec for this matrix and request, in the request's encoding (options granule=, default
    single elements); `kernel_s`, the cost model's time of the main loop with every SM busy, weighs
    the split-K grids and residencies `T.choose_split` compares."""
    n, (m, k) = request.n, stats.shape
    bn = T.request_bn(request)
    sms = request.device.sm_count
    warps = T.request_warps(request)
    granule = request_granule(request)
    # the fullest analysed 128 x 64 tile; register pairs: for a uniform pattern of density d a tile's
    # nonzeros fill (1 - d / 2) as many registers (finalize sets the plan's own)
    fullest = stats.tiles.max_nnz * (1.0 - stats.density / 2 if granule == 2 else 1.0)
    vcap_est = -(-max(int(round(fullest)), 8) // 8) * 8
    resident, _ = ring_for(128, bn, vcap_est, request, warps, granule)
    residencies = (resident,)
    if bn > T.NARROW_BN and warps == T.WARPS and T.request_blocks(request) is None and not T.request_wgmma(request):
        # one block more than the register estimate allows, where shared memory has room: ptxas fits
        # wide blocks in 128 registers without spilling (probes/tiled_probe_blocks2.txt); the split
        # model weighs it against the waves it saves (T.wave_factor)
        more, _ = ring_for(128, bn, vcap_est, request, warps, granule, blocks=resident + 1)
        residencies += (more,) if more > resident else ()
    split = T.choose_split(stats, request, n, bn, resident, kernel_s, heights=(128, 64),
                           stream_bns=T.STREAM_BNS[FAMILY], residencies=residencies)
    vcap = -(-max(vcap_est * split.tile_m // 128, 8) // 8) * 8
    blocks, stages = ring_for(split.tile_m, bn, vcap, request, warps, granule, blocks=split.blocks)
    spec = Spec(short_name(request.dtype), T.out_dtype(request), m, k, n, split.tile_m, bn, split.split_k,
                split.reduction, request.bias, request.relu, blocks, warps, 1, T.request_wgmma(request), stages=stages,
                l2_prefetch=bool(request.option("l2_prefetch", False)), granule=granule)
    spec = T.with_stream_grid(spec, sms)
    return spec, f"{blocks} blocks per SM; {split.reason}"


def tune_variants(request: Request) -> list[dict]:
    """tune=True times both encodings, unless options granule= fixes one: the cost model's choice
    between them misses by up to 13 % (probes/tiled_probe_granule_more.txt, 70 % at N = 32)."""
    return [{}] if request.option("granule") is not None else [{"granule": 1}, {"granule": 2}]


def request_granule(request: Request) -> int:
    """Halves per bitmap bit: options granule= (1 or 2; the gate declines others), else 1."""
    return int(request.option("granule", 1))


def bytes_text(stats, request: Request) -> str:
    """Bytes per element of W in each format (one pass over the tile histogram, 128-row tiles)."""
    area = max(stats.shape[0] * stats.shape[1], 1)
    b, pairs, c = encoded_bytes(stats, 128, 1), encoded_bytes(stats, 128, 2), csl.encoded_bytes(stats, 128)
    return (f"bitmap {b / area:.2f} B/element (register pairs {pairs / area:.2f}) vs Tiled-CSL "
            f"{c / area:.2f} (bitmap decode costs issue slots per tile, CSL's scatter per nonzero)")


def describe(stats, request: Request, spec: Spec, why: str) -> str:
    """What a bitmap spec does, for its selection's reason: the bytes, the tiles and ring, `why`."""
    return (f"{bytes_text(stats, request)}; {spec.tile_m}x{T.TILE_K} tiles, {spec.bn} columns per block, "
            f"{spec.stages}-stage cp.async ring; {why}")


def gate(stats, request: Request):
    """The tile families' gate, and what only the bitmap kernel refuses: k-groups and unknown granules.
    Odd N is taken: N = 1 and 3 with a 3-slot ring give right rows, racecheck clean
    (docs/decisions/data/h100-80gb-hbm3/repro_bitmap_odd_n.txt); tests/test_gpu_tiled.py keeps those configurations."""
    declined = T.gate(stats, request, Options)
    if declined is None and T.request_warp_k(request) != 1:
        return decline(f"options warp_k={T.request_warp_k(request)}: the bitmap encoding slices each tile by "
                       f"warp rows (k-groups are Tiled-CSL's)")
    return declined


FORMAT_ARGS = (Arg("bitmaps", "plan"), Arg("values", "plan"), Arg("slice_offsets", "plan"))


def encoding(spec: Spec) -> tuple:
    """The spec fields the encoding reads: one encoding serves every n (the format cache)."""
    return (spec.dtype, spec.tile_m, spec.warps, spec.granule)


def encode_format(csr, spec: Spec, bias=None):
    return FORMAT.encode(csr, long_name(spec.dtype), spec.tile_m, bias, warps=spec.warps, granule=spec.granule)


specialize = T.with_scratch


def encode(csr, spec: Spec, bias=None):
    return specialize(encode_format(csr, spec, bias), spec)


def finalize(spec: Spec, plan, request: Request) -> Spec:
    """Size a stage's value buffer for the fullest tile, then the ring depth and residency."""
    estimated = register_blocks(spec.tile_m, spec.bn, request.device, spec.warps)

    def build(vcap):
        blocks, stages = ring_for(spec.tile_m, spec.bn, vcap, request, spec.warps, spec.granule,
                                  blocks=spec.min_blocks if spec.min_blocks > estimated else None)
        return dataclasses.replace(spec, vcap=vcap, stages=stages, min_blocks=blocks)

    def fits(s):
        return s.shared_bytes <= T.smem_budget(s.min_blocks, request.device)

    spec = T.with_shared_cap(max(8, plan.constants["max_tile_values"]), build, fits)
    return T.with_stream_grid(spec, request.device.sm_count)


def steps(spec: Spec, plan) -> tuple:
    return T.steps(spec, FORMAT_ARGS, KERNEL, spec.shared_bytes)


operands = T.operands
emulate_operands = T.emulate_operands
alignment = T.alignment


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu, out=long_name(spec.out))
