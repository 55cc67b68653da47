"""`sputnik_spmm`: Sputnik's CSR SpMM (Gale et al., SC'20), Y = A·X (+ bias, ReLU).

A row group of `width` threads owns one row and a 1-D tile of `width × vec` output columns. It
stages `chunk` of the row's nonzeros at a time in shared memory (values as fp32, column indices as
element offsets into X) with vector loads that start at the vector boundary before the row start
(reverse-offset alignment: nothing is padded), then every thread reads the staged entries by
broadcast and loads its `vec` columns of X straight to registers, `chunk` independent loads in
flight. Rows are swizzled (longest first) when their lengths vary. Beyond Sputnik, `ksplit` row
groups may share one row's chunks and meet in shared memory: DLMC layers have a few hundred long
rows, too few warps for 132 SMs otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..formats import csr as FORMAT  # noqa: N812 - the family's format module
from .base import (Arg, KernelSpec, Launch, Request, Rule, accept, decline, epilogue_suffix, long_dtype, next_pow2,
                   sm_count, spmm_gate, spmm_operands, widest_vector)

FAMILY = "sputnik_spmm"
KERNEL = "sputnik_spmm"
WARP = 32
CHUNK = 32  # nonzeros staged per step: Sputnik's kBlockItemsK
TILE_BYTES = 512  # a row group's output tile, at most: 128 floats (Sputnik's 64 measured 1.37x slower here)
BLOCK_THREADS = 128  # threads per block, unless one row's groups need more
MAX_KSPLIT = 8
BATCH_BYTES = 256  # bytes of X a thread has in flight: 16 float4 loads, 64 registers
WARPS_PER_SM = 32  # warps wanted in flight per SM (of 64): below it, rows are split
SWIZZLE_COV = 0.1  # row-length CoV above which rows run longest first
# Where this kernel beats csr_rowsplit on the H100 (benchmarks/results/h100-80gb-hbm3/spmm_sweep_f32.json):
# wide outputs with long rows. Narrow n or short rows give too few warps per staged chunk.
MIN_N = 128
MIN_MEAN_ROW = 128
# Shorter rows too, where rows x column tiles alone give this many warps (rows unsplit): the sweep
# of every DLMC matrix with each family (probes/spmm_sweep_f32_families_{even,odd}.json) has
# sputnik_spmm fastest or within 7 % on the 2048-row layers at n >= 256 (rows of 26-150 nonzeros,
# where csr_rowsplit ran 1.1-1.95x slower) and on 512-row layers at n = 1024; with fewer warps
# (512 rows at n <= 256) csr_rowsplit's narrowed tiles and split rows win. float32 only: fp16 was not swept.
MIN_GRID_WARPS = 4096
MIN_GRID_MEAN_ROW = 24  # the shortest rows that sweep covered (26 nonzeros); shorter ones stay on csr_rowsplit
INDEX16_MAX_COLS = 32767  # int16 column indices (fp16 only)
# Many long rows (fp32, at least 2048 x 2048 with >= 256 nonzeros a row): measured on the 2048-,
# 4096- and 8192-row random squares at 80/90 % (probes/spmm_sweep_random_sputnik.txt,
# spmm_sweep_sputnik_validate.txt, spmm_sweep_sputnik_ksplit.txt; repeated runs agree within 3 %).
# Rows are not split (a split row ran 1.2-1.5x slower there: these rows already give >= 2048
# warps); grids of <= 8192 warps stage 64-nonzero chunks (1.1-1.5x faster), larger ones keep
# 8 loads of X in flight instead of 16 (1.02-1.23x faster: more warps resident). No DLMC layer is
# this large; on them the defaults were as fast or faster (same sweeps).
MANY_ROWS = 2048
MANY_COLS = 2048
MANY_ROWS_MEAN = 256  # nonzeros per row, at least
MANY_ROWS_CHUNK_WARPS = 8192  # grid warps up to which 64-nonzero chunks pay
MANY_ROWS_CHUNK = 64
MANY_ROWS_BATCH = 8


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32" | "f16": storage of A's values, X and Y; accumulation is fp32
    n: int  # dense columns
    vec: int  # elements of X and Y per vector load
    width: int  # threads of a row group across columns
    ksplit: int  # row groups sharing one row's nonzeros
    rows: int  # rows per block
    chunk: int  # nonzeros staged per step
    sv: int  # nonzeros per vector load of the sparse row
    batch: int  # loads of X issued back to back per thread
    index_bits: int  # 16 | 32
    prescaled: bool  # the plan's indices are column x n
    wide: bool  # n x columns needs 64-bit offsets
    swizzle: bool
    bias: bool = False
    relu: bool = False

    @property
    def name(self) -> str:
        epi = epilogue_suffix(self.bias, self.relu)
        idx = f"i{self.index_bits}" + ("s" if self.prescaled else "") + ("w" if self.wide else "")
        return (f"{FAMILY}.{self.dtype}.n{self.n}.v{self.vec}.w{self.width}.ks{self.ksplit}.r{self.rows}"
                f".c{self.chunk}x{self.sv}.b{self.batch}.{idx}{'.swz' if self.swizzle else ''}{epi}")

    @property
    def tile_n(self) -> int:
        return self.width * self.vec

    @property
    def block(self) -> int:
        return self.rows * self.ksplit * self.width


def warps(m: int, n: int, tile_n: int, width: int, ksplit: int) -> int:
    return -(-(m * -(-n // tile_n) * ksplit * width) // WARP)


def row_split(m: int, n: int, tile_n: int, width: int, mean: float, target: int) -> int:
    """Row groups per row: doubled while the rows give fewer than `target` warps and each share
    keeps two staged chunks of nonzeros."""
    ksplit = 1
    while (ksplit < MAX_KSPLIT and warps(m, n, tile_n, width, ksplit) < target
           and mean >= 4 * ksplit * CHUNK):
        ksplit *= 2
    return ksplit


def row_group(n: int, itemsize: int, tile_bytes: int | None = None) -> tuple[int, int]:
    """(vec, width): elements per load and threads of a row group across at most `tile_bytes` of output."""
    vec = widest_vector(n, itemsize)
    return vec, min(WARP, max(1, (tile_bytes or TILE_BYTES) // (vec * itemsize)), next_pow2(-(-n // vec)))


def unsplit_warps(stats, request: Request) -> int:
    """Warps of the default tile with rows unsplit: how much parallelism the rows alone give."""
    vec, width = row_group(request.n, 2 if request.dtype == "float16" else 4)
    return warps(stats.shape[0], request.n, width * vec, width, 1)


def many_long_rows(m: int, k: int, mean: float, f16: bool) -> bool:
    """Where the measured many-row choices apply (fp32, >= 2048 x 2048, rows >= 256 nonzeros)."""
    return m >= MANY_ROWS and k >= MANY_COLS and mean >= MANY_ROWS_MEAN and not f16


def choose(stats, request: Request, *, ksplit: int | None = None, tile_bytes: int | None = None,
           chunk: int | None = None, batch: int | None = None, block: int | None = None) -> tuple[Spec, str]:
    """Vector width and tile from n and the dtype, the row split from how many warps the rows
    alone give, indices from the column count; `ksplit`, `tile_bytes`, `chunk`, `batch` and
    `block` (threads per block) override (tuning)."""
    f16 = request.dtype == "float16"
    itemsize = 2 if f16 else 4
    n, (m, k) = request.n, stats.shape
    mean = stats.row_lengths.mean
    vec, width = row_group(n, itemsize, tile_bytes)
    tile_n = width * vec
    target = WARPS_PER_SM * sm_count(request.arch)
    many = many_long_rows(m, k, mean, f16)
    if ksplit is None:
        ksplit = 1 if many else row_split(m, n, tile_n, width, mean, target)
    rows = max(1, (block or BLOCK_THREADS) // (width * ksplit))
    small_grid = warps(m, n, tile_n, width, ksplit) <= MANY_ROWS_CHUNK_WARPS
    many_chunk = many and chunk is None and small_grid
    many_batch = many and batch is None and not small_grid
    chunk = chunk or (MANY_ROWS_CHUNK if many_chunk else CHUNK)
    sv = max(1, min(4, chunk // width))
    index_bits = 16 if f16 and k <= INDEX16_MAX_COLS else 32
    wide = k * n >= 2**31
    prescaled = index_bits == 32 and not wide
    swizzle = stats.row_lengths.cov > SWIZZLE_COV
    batch = min(chunk, batch or (MANY_ROWS_BATCH if many_batch else BATCH_BYTES // (vec * itemsize)))
    spec = Spec(request.short_dtype, n, vec, width, ksplit, rows, chunk, sv, batch, index_bits, prescaled, wide,
                swizzle, request.bias, request.relu)
    tiles = -(-n // tile_n)
    reason = (f"rows avg {mean:.1f} nnz (CoV {stats.row_lengths.cov:.2f}), n={n}: {vec}-wide loads, "
              f"{width} thread{'s' if width > 1 else ''} x {tile_n} column{'s' if tile_n > 1 else ''} per row group ({tiles} tile{'s' if tiles > 1 else ''})")
    if spec.ksplit > 1:
        reason += (f", {spec.ksplit} groups per row ({m} rows alone give "
                   f"{warps(m, n, tile_n, width, 1)} warps, under {target} for {sm_count(request.arch)} SMs)")
    reason += (f"; {chunk}-nonzero chunks by {sv}-wide loads, {spec.batch} loads of X in flight"
               f"{f' ({m} x {k}, rows unsplit: measured faster)' if many_chunk or many_batch else ''}; {index_bits}-bit indices"
               f"{' pre-scaled by n' if prescaled else ''}; "
               f"{'rows swizzled longest first' if swizzle else 'rows in order'}")
    return spec, reason


def _rule(stats, request: Request):
    gate = spmm_gate(stats, request, index_slack=8)  # indices and values padded to a whole vector
    if gate:
        return gate
    mean = stats.row_lengths.mean
    grid = unsplit_warps(stats, request)
    wide_grid = grid >= MIN_GRID_WARPS and mean >= MIN_GRID_MEAN_ROW and request.dtype == "float32"
    if request.option("family") != FAMILY and (request.n < MIN_N or (mean < MIN_MEAN_ROW and not wide_grid)):
        return decline(f"n={request.n}, rows avg {mean:.1f} nnz, {grid} warps unsplit: outside n >= {MIN_N} with "
                       f"rows >= {MIN_MEAN_ROW} (or, in float32, >= {MIN_GRID_MEAN_ROW} with >= {MIN_GRID_WARPS} warps), where it was "
                       f"measured faster than csr_rowsplit")
    ksplit, tile_bytes = request.option("ksplit"), request.option("tile_bytes")
    chunk, batch, block = request.option("chunk"), request.option("batch"), request.option("block")
    if ksplit is not None and ksplit not in (1, 2, 4, 8, 16):
        return decline(f"options ksplit={ksplit!r}: expected 1, 2, 4, 8 or 16")
    if tile_bytes is not None and tile_bytes not in (16, 32, 64, 128, 256, 512):
        return decline(f"options tile_bytes={tile_bytes!r}: expected a power of two from 16 to 512")
    if chunk is not None and chunk not in (32, 64, 128):
        return decline(f"options chunk={chunk!r}: expected 32, 64 or 128")
    if batch is not None and batch not in (4, 8, 16, 32):
        return decline(f"options batch={batch!r}: expected 4, 8, 16 or 32")
    if block is not None and block not in (32, 64, 128, 256, 512):
        return decline(f"options block={block!r}: expected a power of two from 32 to 512")
    return accept(*choose(stats, request, ksplit=ksplit, tile_bytes=tile_bytes, chunk=chunk, batch=batch,
                          block=block))


RULES = (Rule("sputnik_spmm", FAMILY, _rule),)


def arguments(spec: Spec) -> tuple[Arg, ...]:
    args = [Arg("indptr", "plan"), Arg("indices", "plan"), Arg("values", "plan")]
    if spec.swizzle:
        args.append(Arg("order", "plan"))
    args.append(Arg("x", "input"))
    if spec.bias:
        args.append(Arg("bias", "plan"))
    return tuple(args) + (Arg("y", "output"), Arg("m", "int"))


def encode(csr, spec: Spec, bias=None):
    return FORMAT.encode_sputnik(csr, long_dtype(spec.dtype),
                                 index_bits=spec.index_bits, prescale=spec.n if spec.prescaled else 0,
                                 vector=spec.sv, swizzle=spec.swizzle, bias=bias)


operands = spmm_operands


def launch(spec: Spec, plan) -> Launch:
    m = plan.constants["m"]
    tiles = -(-spec.n // spec.tile_n)
    return Launch((-(-m // spec.rows) * tiles, 1, 1), (spec.block, 1, 1), 0)


def alignment(spec: Spec) -> int:
    return spec.vec * (4 if spec.dtype == "f32" else 2)


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(FORMAT.decode_sputnik(plan), inputs["x"], relu=spec.relu)
