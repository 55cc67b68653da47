"""`tiled_csl_spmm`: Flash-LLM's load-as-sparse, compute-as-dense SpMM on tensor cores.

Per k-tile a block (4 warps, one `tile_m` x 64 tile of W, `bn` columns of X) runs two pipelines
(Flash-LLM's two levels): the next tile's Tiled-CSL words go global -> registers (uint4 loads,
`reg_vecs` per thread, a rare fuller tile finishes from global) and its X tile global -> shared
(cp.async), while the warps compute the current tile from shared memory (ldmatrix, mma.m16n8k16,
fp32 accumulators); then the registers are scattered into the next W buffer, zero-filled
beforehand. On sm_90 a bulk L2 prefetch runs one tile further ahead. Empty tiles skip the math.
See `formats/tiled_csl.py` for the encoding and `_tiled.py` for split-K and the rule.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..formats import tiled_csl as FORMAT  # noqa: N812 - the family's format module
from . import _tiled as T
from .base import Arg, Request, Rule, accept, sm_count

FAMILY = "tiled_csl_spmm"
KERNEL = "tiled_csl_spmm"
REG_VECS_MAX = 12  # 48 registers of staged words per thread; fuller tiles finish from global
SINK_BYTES = 2 * FORMAT.SINK_HALVES


@dataclass(frozen=True)
class Spec(T.TiledSpec):
    family: ClassVar[str] = FAMILY
    reg_vecs: int = 0  # uint4 vectors of a tile each thread stages in registers (fixed from the plan)
    strict_banks: bool = False

    @property
    def name(self) -> str:
        base, epi = self.base_name()
        return f"{base}.r{self.reg_vecs}{'.sb' if self.strict_banks else ''}{epi}"

    @property
    def stage_bytes(self) -> int:
        return self.tile_m * T.TILE_K * 2 + SINK_BYTES + T.TILE_K * self.bn * 2

    @property
    def shared_bytes(self) -> int:
        return 2 * self.stage_bytes  # double buffer


def reg_vecs_for(max_tile_vectors: int) -> int:
    return max(1, min(REG_VECS_MAX, -(-max_tile_vectors // T.THREADS)))


def csl_bytes(nnz):
    return 4.0 * (nnz + 1.5) + 4.0  # words, average vector padding, one offset


def csl_issue(tile_m: int):
    # scatter ~3 instructions per word per lane, zero-fill and ldmatrix of W: tile_m / 4 each
    return lambda nnz: 3.0 * nnz / 32 + tile_m / 2 + 20


def cost(stats, request: Request, tile_m: int, bn: int) -> T.Cost:
    n_tiles = -(-request.n // bn)
    return T.predict(stats, tile_m, bn, n_tiles, sm_count(request.arch), csl_bytes, csl_issue(tile_m),
                     4.0, tile_m / 4 + 30)


def choose(stats, request: Request) -> tuple[Spec, str]:
    n, (m, k) = request.n, stats.shape
    bn = T.block_n(n)
    reg_est = reg_vecs_for(-(-stats.tiles.max_nnz // 4))
    mf_nf = (128 // T.WARPS // 16) * (bn // 8)
    resident = T.resident_blocks(48 + 4 * mf_nf + 4 * reg_est, 2 * (128 * 128 + SINK_BYTES + 128 * bn))
    est = cost(stats, request, 128, bn)
    split = T.choose_split(stats, request, n, bn, resident, est.bytes, est.seconds(sm_count(request.arch)))
    spec = Spec(T.DTYPE_SHORT[request.dtype], T.out_dtype(request), m, k, n, split.tile_m, bn, split.split_k,
                split.reduction, request.bias, request.relu, 0, bool(request.option("strict_banks", False)))
    reason = (f"density {stats.density:.2f}: Tiled-CSL {est.bytes / max(m * k, 1):.2f} B/element "
              f"({4 * stats.density:.2f} for values + positions); {spec.tile_m}x{T.TILE_K} tiles, {bn} columns "
              f"per block ({spec.n_tiles} column tile{'s' if spec.n_tiles > 1 else ''}); {split.reason}"
              f"{'; strictly bank-conflict-free scatter (padded banks)' if spec.strict_banks else ''}")
    return spec, reason


def _rule(stats, request: Request):
    declined = T.gate(stats, request)
    if declined is not None:
        return declined
    return accept(*choose(stats, request))


RULES = (Rule("tiled_csl_spmm", FAMILY, _rule),)
FORMAT_ARGS = (Arg("words", "plan"), Arg("tile_offsets", "plan"))


def encode(csr, spec: Spec, bias=None):
    plan = FORMAT.encode(csr, T.DTYPE_LONG[spec.dtype], spec.tile_m, bias, strict_banks=spec.strict_banks)
    return T.with_scratch(plan, spec)


def finalize(spec: Spec, plan, request: Request) -> Spec:
    """Registers for staged words: enough for the fullest tile, at most REG_VECS_MAX vectors."""
    return dataclasses.replace(spec, reg_vecs=reg_vecs_for(plan.constants["max_tile_vectors"]))


def steps(spec: Spec, plan) -> tuple:
    return T.steps(spec, FORMAT_ARGS, KERNEL, spec.shared_bytes)


operands = T.operands
emulate_operands = T.emulate_operands
alignment = T.alignment


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu, out=T.DTYPE_LONG[spec.out])
