"""`tiled_bitmap_spmm`: bitmap tiles decoded straight into tensor-core fragments (beyond Flash-LLM).

A block (4 warps, one `tile_m` x 64 tile, `bn` columns of X) streams each tile's bitmaps, packed
values and slice offsets, and its X tile, global -> shared with cp.async through a `stages`-deep
ring (no registers held for data in flight, so the pipeline is as deep as shared memory allows).
Each warp decodes its own A fragments: a lane takes its byte of the fragment's bitmap, finds its
first value by popcount and a warp prefix sum, and reads its (at most 8) values as consecutive
halves into the mma registers: no zero-fill, no scatter, no ldmatrix for W. Warps whose rows of a
tile are empty skip it. See `formats/tiled_bitmap.py` and `_tiled.py`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..formats import tiled_bitmap as FORMAT  # noqa: N812 - the family's format module
from . import _tiled as T
from . import tiled_csl_spmm as csl
from .base import Arg, Request, Rule, accept, decline, sm_count

FAMILY = "tiled_bitmap_spmm"
KERNEL = "tiled_bitmap_spmm"
DEFAULT_STAGES = 4
STAGE_BUDGET = 113 * 1024  # keep two blocks per SM at least
DECODE_ISSUE = 56  # warp instructions to decode one 16x16 fragment (popcount, 5-step scan, 8 loads)
OFFSET_BYTES = 32  # a tile's 4 slice starts and the next tile's (two 16-byte chunks)


@dataclass(frozen=True)
class Spec(T.TiledSpec):
    family: ClassVar[str] = FAMILY
    stages: int = DEFAULT_STAGES  # cp.async ring depth
    vcap: int = 0  # halves of values one stage holds: the fullest tile (fixed from the plan)

    @property
    def name(self) -> str:
        base, epi = self.base_name()
        return f"{base}.st{self.stages}.v{self.vcap}{epi}"

    @property
    def stage_bytes(self) -> int:
        return stage_bytes(self.tile_m, self.bn, self.vcap)

    @property
    def shared_bytes(self) -> int:
        return self.stages * self.stage_bytes


def stage_bytes(tile_m: int, bn: int, vcap: int) -> int:
    return tile_m * 8 + OFFSET_BYTES + -(-2 * vcap // 128) * 128 + T.TILE_K * bn * 2


def stages_for(tile_m: int, bn: int, vcap: int, request: Request) -> int:
    forced = request.option("stages")
    if forced is not None:
        return max(2, int(forced))  # a ring needs one stage in flight beside the one computed
    stages = DEFAULT_STAGES
    while stages > 2 and stages * stage_bytes(tile_m, bn, vcap) > STAGE_BUDGET:
        stages -= 1
    return stages


def bitmap_bytes(tile_m: int):
    return lambda nnz: tile_m * 8.0 + 2.0 * nnz + 8.0 + 16.0  # bitmap, values, padding, offsets


def bitmap_issue(tile_m: int):
    return lambda nnz: DECODE_ISSUE * (tile_m / 4) + (tile_m * 8 + 2 * nnz) / 512 + 20


def cost(stats, request: Request, tile_m: int, bn: int) -> T.Cost:
    n_tiles = -(-request.n // bn)
    return T.predict(stats, tile_m, bn, n_tiles, sm_count(request.arch), bitmap_bytes(tile_m), bitmap_issue(tile_m),
                     16.0, 30.0)


def choose(stats, request: Request) -> tuple[Spec, str]:
    n, (m, k) = request.n, stats.shape
    bn = T.block_n(n)
    sms = sm_count(request.arch)
    vcap_est = -(-max(stats.tiles.max_nnz, 8) // 8) * 8
    stages = stages_for(128, bn, vcap_est, request)
    resident = T.resident_blocks(64 + 4 * (128 // T.WARPS // 16) * (bn // 8), stages * stage_bytes(128, bn, vcap_est))
    est = cost(stats, request, 128, bn)
    split = T.choose_split(stats, request, n, bn, resident, est.bytes, est.seconds(sms))
    spec = Spec(T.DTYPE_SHORT[request.dtype], T.out_dtype(request), m, k, n, split.tile_m, bn, split.split_k,
                split.reduction, request.bias, request.relu, stages, 0)
    return spec, split.reason


def compare(stats, request: Request) -> tuple[float, float, str]:
    """(predicted bitmap seconds, predicted Tiled-CSL seconds, why) for one pass over W."""
    bn = T.block_n(request.n)
    sms = sm_count(request.arch)
    b, c = cost(stats, request, 128, bn), csl.cost(stats, request, 128, bn)
    dens, counts, empty = T.tile_densities(stats)
    nonempty = counts > 0
    spread = (f"tile densities {dens[nonempty].min():.2f}-{dens[nonempty].max():.2f}, {empty} empty"
              if nonempty.any() else f"all {empty} tiles empty")
    area = max(stats.shape[0] * stats.shape[1], 1)
    why = (f"density {stats.density:.2f} ({spread}): bitmap {b.bytes / area:.2f} B/element vs Tiled-CSL "
           f"{c.bytes / area:.2f}; predicted {b.seconds(sms) * 1e6:.1f} us vs {c.seconds(sms) * 1e6:.1f} us "
           f"(bitmap decode costs issue slots per tile, CSL's scatter per nonzero)")
    return b.seconds(sms), c.seconds(sms), why


def _rule(stats, request: Request):
    declined = T.gate(stats, request)
    if declined is not None:
        return declined
    t_bitmap, t_csl, why = compare(stats, request)
    if request.option("family") != FAMILY and t_bitmap >= t_csl:
        return decline(f"Tiled-CSL predicted faster: {why}")
    spec, split_reason = choose(stats, request)
    return accept(spec, f"{why}; {spec.tile_m}x{T.TILE_K} tiles, {spec.bn} columns per block, "
                        f"{spec.stages}-stage cp.async ring; {split_reason}")


RULES = (Rule("tiled_bitmap_spmm", FAMILY, _rule),)
FORMAT_ARGS = (Arg("bitmaps", "plan"), Arg("values", "plan"), Arg("slice_offsets", "plan"))


def encode(csr, spec: Spec, bias=None):
    plan = FORMAT.encode(csr, T.DTYPE_LONG[spec.dtype], spec.tile_m, bias, warps=T.WARPS)
    return T.with_scratch(plan, spec)


def finalize(spec: Spec, plan, request: Request) -> Spec:
    """Size a stage's value buffer for the fullest tile, then the ring depth for shared memory."""
    vcap = max(8, plan.constants["max_tile_values"])
    return dataclasses.replace(spec, vcap=vcap, stages=stages_for(spec.tile_m, spec.bn, vcap, request))


def steps(spec: Spec, plan) -> tuple:
    return T.steps(spec, FORMAT_ARGS, KERNEL, spec.shared_bytes)


operands = T.operands
emulate_operands = T.emulate_operands
alignment = T.alignment


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu, out=T.DTYPE_LONG[spec.out])
