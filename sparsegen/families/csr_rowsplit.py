"""`csr_rowsplit`: the CSR baseline SpMM, Y = A·X (+ bias, ReLU).

A group of `lanes_col × lanes_k` threads owns one row and a tile of `lanes_col × vec` output
columns. The group loads a chunk of the row's nonzeros cooperatively (one per lane, coalesced),
then broadcasts them by warp shuffle; each thread accumulates `vec` columns of X with vector loads.
`lanes_k > 1` splits the row's nonzeros across lanes (long rows, narrow n) and adds the partial
sums by shuffle at the end. One lane per row and per column vector is the scalar
thread-per-output kernel for short rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import long_name
from ..formats import csr as FORMAT  # noqa: N812 - the family's format module
from .base import (Arg, KernelSpec, Launch, Request, Rule, accept, decline, epilogue_suffix, next_pow2,
                   prev_pow2, spmm_gate, spmm_operands, widest_vector)
from .options import FamilyOptions, option

FAMILY = "csr_rowsplit"
OPS = ("spmm",)
KERNEL = "csr_rowsplit_spmm"
WARP = 32


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32" | "f16": storage of A's values, X and Y; accumulation is always fp32
    n: int  # dense columns, a compile-time constant
    vec: int  # elements of X and Y per vector load
    lanes_col: int  # lanes across output columns
    lanes_k: int  # lanes across a row's nonzeros
    block: int  # threads per block
    bias: bool = False
    relu: bool = False
    unroll: int = 1  # full chunks whose loads go out together (lanes > 1)

    @property
    def name(self) -> str:
        epi = epilogue_suffix(self.bias, self.relu)
        return (f"{FAMILY}.{self.dtype}.n{self.n}.v{self.vec}."
                f"c{self.lanes_col}k{self.lanes_k}.b{self.block}{f'.u{self.unroll}' if self.unroll > 1 else ''}{epi}")

    @property
    def lanes(self) -> int:
        return self.lanes_col * self.lanes_k

    @property
    def tile_n(self) -> int:
        return self.lanes_col * self.vec

    @property
    def rows_per_block(self) -> int:
        return self.block // self.lanes


WARPS_PER_SM = 16  # resident warps per SM wanted to hide load latency (of 64 possible)
# Two chunks a step (their index loads together, then all their X loads) for float32 at n <= 32 when
# rows average <= UNROLL_MAX_MEAN nonzeros: there a row's dependent loads set the time. H100 sweep over
# every DLMC matrix and four squares at n = 32 (docs/decisions/data/h100-80gb-hbm3/
# spmm_sweep_rowsplit_unroll_n32.txt): on the 28 cases the rule gives csr_rowsplit, 1.13x (two chunks)
# and 1.04x (four); rows of 410-819 nonzeros (the 4096 and 8192 squares at 90 %) 0.82-0.91x, so they
# stay at one.
UNROLL = 2
BLOCK_THREADS = 128  # threads per block unless `options block=` asks otherwise
UNROLL_MAX_N = 32
UNROLL_MAX_MEAN = 128


@dataclass(frozen=True)
class Options(FamilyOptions):
    unroll: Literal[1, 2, 4, 8] | None = option(expected="1, 2, 4 or 8 (chunks loaded per step)")  # None: UNROLL or 1
    block: Literal[32, 64, 128, 256, 512, 1024] | None = option(  # None: BLOCK_THREADS
        expected="a power of two from 32 to 1024 (threads per block)")


def warps_launched(m: int, n: int, vec: int, lanes_col: int, lanes_k: int) -> int:
    tiles = -(-n // (lanes_col * vec))
    return -(-(m * tiles * lanes_col * lanes_k) // WARP)


def choose(stats, request: Request) -> tuple[Spec, str]:
    """Pick vector width and lane split from n, the row count and the row-length statistics."""
    itemsize = 4 if request.dtype == "float32" else 2
    n, m = request.n, stats.shape[0]
    mean = stats.row_lengths.mean
    vec = widest_vector(n, itemsize)
    lanes_col = min(WARP, next_pow2(-(-n // vec)))
    # Split a row's nonzeros over spare lanes only when each of them still gets a few (>= 2).
    lanes_k = min(WARP // lanes_col, prev_pow2(max(1.0, mean / 2)))
    # Too few rows to fill the GPU: narrow the column tile (more tiles) and hand the freed lanes
    # to the nonzero split, while each lane keeps at least 2 nonzeros of the row.
    target = WARPS_PER_SM * request.device.sm_count
    narrowed = False
    while (warps_launched(m, n, vec, lanes_col, lanes_k) < target and lanes_col > 1
           and mean >= 4 * lanes_k and lanes_col * lanes_k == WARP):
        lanes_col, lanes_k, narrowed = lanes_col // 2, lanes_k * 2, True
    block = int(request.option("block") or BLOCK_THREADS)
    chunked = (request.dtype == "float32" and n <= UNROLL_MAX_N and mean <= UNROLL_MAX_MEAN)
    unroll = int(request.option("unroll") or (UNROLL if chunked else 1)) if lanes_col * lanes_k > 1 else 1
    spec = Spec(request.short_dtype, n, vec, lanes_col, lanes_k, block, request.bias, request.relu, unroll)
    if spec.lanes == 1:
        shape = "one thread per row and output vector (short rows, narrow n)"
    elif lanes_k == 1:
        shape = f"{lanes_col} lanes per row across columns"
    else:
        shape = f"{lanes_col} lanes across columns x {lanes_k} splitting each row's nonzeros"
    warps = warps_launched(m, n, vec, lanes_col, lanes_k)
    why_narrow = (f" (narrowed to {-(-n // spec.tile_n)} column tiles: {m} rows alone give too few warps "
                  f"for {request.device.sm_count} SMs)" if narrowed else "")
    steps = (f"; {unroll} chunks of {spec.lanes} nonzeros loaded per step (short rows: their loads set the time)"
             if unroll > 1 else "")
    reason = (f"rows avg {mean:.1f} nnz (CoV {stats.row_lengths.cov:.2f}), n={n}: "
              f"{vec}-wide loads, {shape}{why_narrow}; {warps} warps, {spec.rows_per_block} rows per "
              f"{block}-thread block{steps}")
    return spec, reason


def _rule(stats, request: Request):
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    return spmm_gate(stats, request) or accept(*choose(stats, request))


RULES = (Rule("csr_rowsplit", FAMILY, _rule),)

ARGUMENTS = (Arg("indptr", "plan"), Arg("indices", "plan"), Arg("values", "plan"),
             Arg("x", "input"), Arg("bias", "plan"), Arg("y", "output"), Arg("m", "int"))


def arguments(spec: Spec) -> tuple[Arg, ...]:
    return tuple(a for a in ARGUMENTS if a.name != "bias" or spec.bias)


def encode(csr, spec: Spec, bias=None):
    return FORMAT.encode(csr, long_name(spec.dtype), bias)


operands = spmm_operands


def launch(spec: Spec, plan) -> Launch:
    m = plan.constants["m"]
    grid = (-(-m // spec.rows_per_block), -(-spec.n // spec.tile_n), 1)
    return Launch(grid, (spec.block, 1, 1), 0)


def alignment(spec: Spec) -> int:
    """Bytes every X and Y pointer must be aligned to (vector loads)."""
    return spec.vec * (4 if spec.dtype == "f32" else 2)


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu)
