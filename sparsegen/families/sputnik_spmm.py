"""`sputnik_spmm`: Sputnik's CSR SpMM (Gale et al., SC'20), Y = A·X (+ bias, ReLU).

A row group of `width` threads owns one row and a 1-D tile of `width × vec` output columns. It
stages `chunk` of the row's nonzeros at a time in shared memory (values as fp32, column indices as
element offsets into X) with vector loads that start at the vector boundary before the row start
(reverse-offset alignment: nothing is padded), then every thread reads the staged entries by
broadcast and loads its `vec` columns of X straight to registers, `chunk` independent loads in
flight. Rows are swizzled (longest first) when their lengths vary. Beyond Sputnik, `ksplit` row
groups may share one row's chunks and meet in shared memory: DLMC layers have a few hundred long
rows, too few warps for 132 SMs otherwise. With `budget`, that split is per row: the encoder finds
the least work per row group (`piece`) whose per-row splits (powers of two) fit the grid's budget
of groups, and builds a table of blocks (one split per block), so a layer's longest rows (2-5x the
mean) no longer set the kernel's time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import long_name
from ..formats import csr as FORMAT  # noqa: N812 - the family's format module
from .base import (Arg, KernelSpec, Launch, Request, Rule, accept, decline, epilogue_suffix, next_pow2,
                   spmm_gate, spmm_operands, widest_vector)
from .options import FamilyOptions, option

FAMILY = "sputnik_spmm"
OPS = ("spmm",)
KERNEL = "sputnik_spmm"
WARP = 32
CHUNK = 32  # nonzeros staged per step: Sputnik's kBlockItemsK
TILE_BYTES = 512  # a row group's output tile, at most: 128 floats (Sputnik's 64 measured 1.37x slower here)
BLOCK_THREADS = 128  # threads per block, unless one row's groups need more
MAX_KSPLIT = 16
BATCH_BYTES = 256  # bytes of X a thread has in flight: 16 float4 loads, 64 registers
# Row split: rows are shared among the largest power of two of row groups (<= MAX_KSPLIT) that keeps
# the grid within SPLIT_WARPS_PER_SM warps per SM. Measured on every DLMC matrix in fp32 at n = 32,
# 128, 256, 1024 with ksplit 1-16 forced (probes/spmm_sweep_sputnik_ksplit_dlmc_{even,odd}.json): this
# rule is 5.6 % from the best split per case in either half (a 2x-per-SM target: 8-10 %, 1x of
# 2048: 11-16 %); the earlier rule, which split only while each share kept two chunks of the mean
# row, left the 512-row layers' longest rows (2-5x the mean) on one row group and ran 1.4-2x slower.
SPLIT_WARPS_PER_SM = 32
SWIZZLE_COV = 0.1  # row-length CoV above which rows run longest first
# Per-row split (`budget`) by default, float32, where the longest row has >= 2x the mean row's
# nonzeros, the rows alone leave room in the grid (fewer rows than the budget of row groups), and
# the split above would leave the longest row more than one chunk per row group (a group with one
# chunk to do gains nothing from a finer split, and the per-row split's larger blocks cost).
# Measured on every DLMC matrix in fp32 at n = 128, 256, 1024 against the split above in the same
# process (probes/spmm_sweep_sputnik_balance.json): over the cases where sputnik_spmm is selected
# this rule gives 1.07x / 1.09x / 1.09x per n (up to 2.05x on 512-row layers whose longest row is
# 4-12x the mean; the worst 0.85x); split per row everywhere, 1.03x / 1.08x / 1.09x, the losses on
# even rows and on 512-row layers at n = 128 whose rows were already one chunk a group. The rule
# was read off this sweep, every DLMC matrix: there is no held-out half.
BALANCE_MAX_OVER_MEAN = 2.0
# Where this kernel beats csr_rowsplit on the H100, with the row split above (same sweep, both
# kernels in the same process): float32 with n >= 128, or rows of >= 128 nonzeros at any n when
# the rows are split (1.76x cuSPARSE over the 142 DLMC cases that reach these two families,
# against 1.56x all on csr_rowsplit and 1.78x with the faster of the two per case in hindsight).
# At n = 32 with shorter rows csr_rowsplit's narrow lanes win (up to 1.6x), and with unsplit rows
# too: on the 2048-8192 random squares at n = 32 sputnik_spmm ran 1.0-2.2x slower
# (probes/spmm_sweep_squares_n32.txt). float16 keeps the gate measured before the row split
# changed (spmm_sweep_f32.json: n >= 128 and rows >= 128), its sweep not repeated.
MIN_N = 128
MIN_MEAN_ROW = 128
INDEX16_MAX_COLS = 32767  # int16 column indices (fp16 only)
# Many long rows (fp32, at least 2048 x 2048 with >= 256 nonzeros a row): measured on the 2048-,
# 4096- and 8192-row random squares at 80/90 % (probes/spmm_sweep_random_sputnik.txt,
# spmm_sweep_sputnik_validate.txt, spmm_sweep_sputnik_ksplit.txt; repeated runs agree within 3 %).
# Rows are not split (a split row ran 1.2-1.5x slower there: these rows already give >= 2048
# warps); grids of <= 8192 warps stage 64-nonzero chunks (1.1-1.5x faster), larger ones keep
# 8 loads of X in flight instead of 16 (1.02-1.23x faster: more warps resident). No DLMC layer is
# this large; on them the defaults were as fast or faster (same sweeps). The 64-nonzero-chunk grids
# with whole-warp row groups (n >= 128) run 512-thread blocks (16 rows a block, not 4): 1.02-1.19x
# faster on the 4096 and 8192 squares at n = 128/256 (9 cases, geomean 1.08x; 2048 x 2048 at 80 %:
# 0.99/1.03x); 8-thread groups (n = 32) 0.92-1.05x, so those keep 128
# (probes/spmm_sweep_many_rows_block.txt). The larger grids with whole-warp groups stage 64-nonzero
# chunks in 512-thread blocks too (8 loads in flight kept), and for them the rule covers rows from
# 96 nonzeros (the 2048 x 2048 squares at 90/95 %, 4096 x 4096 at 95 %: 102-205 a row): on the 2048-8192
# squares at 90/95 %, n = 128/256/1024 (probes/spmm_sweep_squares_c64_block512*.txt) 1.04-1.34x
# faster where the choice changes (4096 at 90 %, n = 1024: 0.400 -> 0.326 ms; 8192 at 95 %:
# 1.368 -> 1.030), except 8192 at 90 % with n = 1024, 0.94x (1.320 -> 1.406 ms, 1.89x cuBLAS
# either way); 512-thread blocks of 32-nonzero chunks ran 0.58-1.05x, 256-thread blocks of 64
# 0.51-0.97x, 128-nonzero chunks 0.49-0.85x. Their fewer rows a block share X rows in L1 less:
# on 8192 at 95 %, n = 1024, ncu saw 16 % L1 hits with 4-row blocks (58 % at 90 %).
MANY_ROWS = 2048
MANY_COLS = 2048
MANY_ROWS_MEAN = 256  # nonzeros per row, at least
MANY_ROWS_MEAN_WHOLE_WARPS = 96  # with whole-warp row groups (n >= 128)
MANY_ROWS_CHUNK_WARPS = 8192  # grid warps up to which 64-nonzero chunks pay
MANY_ROWS_CHUNK = 64
MANY_ROWS_BATCH = 8
MANY_ROWS_CHUNK_BLOCK = 512  # threads per block with 64-nonzero chunks
# Only for even rows (the uniform squares' CoV is 0.05). On 4096 x 4096 squares at 10 % with lognormal
# row lengths of CoV 0.74-1.85 the many-row choice, rows unsplit, ran 1.0-5.6x slower than rows split
# 8 ways at n <= 256 (probes/spmm_sweep_skewed_sputnik_before.txt): the longest rows, several times the
# mean, hold the grid's end. Such skewed rows (CoV >= MANY_ROWS_MAX_COV) are split alike
# (probes/spmm_sweep_skewed_sputnik.txt): SKEWED_KSPLIT ways with whole-warp row groups (n = 128, 256;
# the fastest of 2/4/8 ways and the per-row split, 1.04-2.2x the per-row split, 1.15-1.42x
# ell_coo_spmm), SKEWED_WIDE_KSPLIT at n >= WIDE_N (0.99-1.18x unsplit rows, 1.42-1.72x ell_coo_spmm;
# 8 ways 0.69-0.99x); narrower groups (n <= 64) take the per-row split, 1.7-4.2x ell_coo_spmm at n = 32.
MANY_ROWS_MAX_COV = 0.5
SKEWED_KSPLIT = 8
SKEWED_WIDE_KSPLIT = 2
# Prefetch (software-pipelined sparse row: the next chunk's indices and values in flight while this
# chunk's X loads are) for float32 at n <= 32 with every row split alike, where a chunk's X loads
# are short and the row's dependent loads set the time. Measured against the same kernel without
# it, both forced, in one process (probes/spmm_sweep_prefetch_n32.txt, every DLMC matrix at n = 32):
# rows split alike 1.12x (56 matrices, 1.01-1.18x, none slower); split per row (`balanced`, mostly
# one chunk a group) 0.88x, so those stay plain. At n >= 128 it is no gain (DLMC 1.00-1.02x, random
# squares 0.80-1.03x: probes/spmm_sweep_prefetch_wide.txt).
PREFETCH_MAX_N = 32
# Wide outputs (fp32, n >= 1024: eight or more 128-column tiles a row): 512-thread blocks instead of
# 128 (4x the rows, or row groups of split rows, a block). Measured on every other DLMC matrix against
# the 128-thread default, both forced in one process (probes/spmm_sweep_sputnik_blocks_dlmc.txt): where
# sputnik_spmm is the choice, n = 1024 1.27x (8 cases, 1.14-1.41x); n = 256 1.01x (0.93-1.09x) and
# n = 128 0.99x (0.88-1.14x), so those keep 128; 64-nonzero chunks 0.72-1.27x (0.91x). Validated on
# all 74 (probes/spmm_sweep_sputnik_wide_n_dlmc.txt). At n = 128/256 the same sweep splits by row
# order: rows in order (not swizzled, split alike) 1.07-1.14x (6 of 6), swizzled rows 0.88-0.95x
# (7 of 7), so 128 <= n < 1024 takes 512-thread blocks only for rows in order (held-out half:
# probes/spmm_sweep_sputnik_in_order_dlmc.txt). At n = 32 both lose (0.84-0.95x; spmm_sweep_n32_blocks.txt).
# Those rows had 92-205 nonzeros; shorter rows in order keep 128 (not measured).
WIDE_N = 1024
WIDE_N_BLOCK = 512
IN_ORDER_MIN_MEAN = 90


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
    budget: int = 0  # > 0: rows split per row within this many row groups per column tile (ksplit the most)
    piece: int = 0  # > 0: rows split per row, <= piece nonzeros a group (ksplit the most); see `balanced`
    prefetch: bool = False  # the next chunk's indices and values loaded while this chunk's X loads are in flight

    @property
    def balanced(self) -> bool:
        return self.budget > 0 or self.piece > 0

    @property
    def name(self) -> str:
        epi = epilogue_suffix(self.bias, self.relu)
        idx = f"i{self.index_bits}" + ("s" if self.prescaled else "") + ("w" if self.wide else "")
        split = f"ks{self.ksplit}" + (f"p{self.piece}" if self.piece else f"g{self.budget}" if self.budget else "")
        return (f"{FAMILY}.{self.dtype}.n{self.n}.v{self.vec}.w{self.width}.{split}.r{self.rows}"
                f".c{self.chunk}x{self.sv}.b{self.batch}{'.pf' if self.prefetch else ''}.{idx}{'.swz' if self.swizzle else ''}{epi}")

    @property
    def tile_n(self) -> int:
        return self.width * self.vec

    @property
    def block(self) -> int:
        return self.rows * self.ksplit * self.width


def warps(m: int, n: int, tile_n: int, width: int, ksplit: int) -> int:
    return -(-(m * -(-n // tile_n) * ksplit * width) // WARP)


def row_split(m: int, n: int, tile_n: int, width: int, target: int) -> int:
    """Row groups per row: the largest power of two up to MAX_KSPLIT whose grid stays within
    `target` warps (1 when the rows alone exceed it)."""
    ksplit = 1
    while ksplit < MAX_KSPLIT and warps(m, n, tile_n, width, 2 * ksplit) <= target:
        ksplit *= 2
    return ksplit


def group_budget(n: int, tile_n: int, width: int, target: int) -> int:
    """Row groups per column tile that keep the grid within `target` warps."""
    return max(1, target * (WARP // width) // -(-n // tile_n))


def most_split(longest: int, nnz: int, budget: int, piece: int = 0, cap: int = MAX_KSPLIT) -> int:
    """The longest row's split (a power of two <= cap), or a bound on it: every piece the budget
    allows is at least nnz / budget."""
    piece = piece or max(1, -(-nnz // budget))
    return min(cap, next_pow2(-(-longest // piece)))


def row_group(n: int, itemsize: int, tile_bytes: int | None = None) -> tuple[int, int]:
    """(vec, width): elements per load and threads of a row group across at most `tile_bytes` of output."""
    vec = widest_vector(n, itemsize)
    return vec, min(WARP, max(1, (tile_bytes or TILE_BYTES) // (vec * itemsize)), next_pow2(-(-n // vec)))


def many_long_rows(m: int, k: int, mean: float, f16: bool, width: int) -> bool:
    """Many long rows (fp32, >= 2048 x 2048, rows >= 256 nonzeros, or >= 96 with whole-warp row groups):
    the measured many-row choices where they are even (CoV < MANY_ROWS_MAX_COV), else split alike
    (SKEWED_KSPLIT, SKEWED_WIDE_KSPLIT at n >= WIDE_N)."""
    least = MANY_ROWS_MEAN_WHOLE_WARPS if width == WARP else MANY_ROWS_MEAN
    return m >= MANY_ROWS and k >= MANY_COLS and mean >= least and not f16


def block_threads(n: int, f16: bool, big_block: bool, swizzle: bool, mean: float,
                  block: int | None) -> tuple[int, str]:
    """Threads per block and, for the measured 512-thread cases that are not many long rows, the
    reason's note: `block` if asked for; 512 for many long rows' 64-nonzero chunks; in fp32, 512 at
    n >= WIDE_N, or at n >= MIN_N with rows in order (not swizzled, so split alike) of at least
    IN_ORDER_MIN_MEAN nonzeros; else 128."""
    if block:
        return block, ""
    if big_block:
        return MANY_ROWS_CHUNK_BLOCK, ""
    if not f16 and n >= WIDE_N:
        return WIDE_N_BLOCK, f"; {WIDE_N_BLOCK}-thread blocks (n >= {WIDE_N}: measured faster)"
    if not f16 and n >= MIN_N and not swizzle and mean >= IN_ORDER_MIN_MEAN:
        return WIDE_N_BLOCK, (f"; {WIDE_N_BLOCK}-thread blocks (n >= {MIN_N} with rows in order of >= {IN_ORDER_MIN_MEAN} "
                              f"nonzeros: measured faster)")
    return BLOCK_THREADS, ""


def choose(stats, request: Request, *, ksplit: int | None = None, tile_bytes: int | None = None,
           chunk: int | None = None, batch: int | None = None, block: int | None = None,
           balance: int | None = None, piece: int | None = None, prefetch: bool | None = None) -> tuple[Spec, str]:
    """Vector width and tile from n and the dtype, the row split from how many warps the rows
    alone give, indices from the column count; `ksplit`, `tile_bytes`, `chunk`, `batch`, `block`
    (threads per block), `balance` (1: split per row, 0: alike), `piece` and `prefetch` override (tuning)."""
    f16 = request.dtype == "float16"
    itemsize = 2 if f16 else 4
    n, (m, k) = request.n, stats.shape
    mean = stats.row_lengths.mean
    vec, width = row_group(n, itemsize, tile_bytes)
    tile_n = width * vec
    target = SPLIT_WARPS_PER_SM * request.device.sm_count
    long_rows = many_long_rows(m, k, mean, f16, width)
    even = stats.row_lengths.cov < MANY_ROWS_MAX_COV
    many = long_rows and even
    skewed_many = (long_rows and not even and ksplit is None and balance is None and not piece
                   and width == WARP)
    if skewed_many:
        ksplit = SKEWED_WIDE_KSPLIT if n >= WIDE_N else SKEWED_KSPLIT
    groups = group_budget(n, tile_n, width, target)
    longest = stats.row_lengths.max
    alike = row_split(m, n, tile_n, width, target)
    skewed = (balance is None and ksplit is None and not f16 and m < groups and longest >= BALANCE_MAX_OVER_MEAN * mean
              and longest > CHUNK * alike)
    balanced = bool(piece) or ((balance == 1 or skewed) and not many)
    budget = groups if balanced and not piece else 0
    if balanced:
        ksplit = most_split(longest, stats.nnz, budget, piece or 0, ksplit or MAX_KSPLIT)
    elif ksplit is None:
        ksplit = 1 if many else alike
    small_grid = warps(m, n, tile_n, width, ksplit) <= MANY_ROWS_CHUNK_WARPS
    whole_warps = width == WARP and block is None  # whole-warp row groups (n >= 128): 512-thread blocks measured
    many_chunk = many and chunk is None and (small_grid or whole_warps)
    big_block = many_chunk and whole_warps
    swizzle = balanced or stats.row_lengths.cov > SWIZZLE_COV
    threads, block_note = block_threads(n, f16, big_block, swizzle, mean, block)
    rows = max(1, threads // (width * ksplit))
    many_batch = many and batch is None and not small_grid
    chunk = chunk or (MANY_ROWS_CHUNK if many_chunk else CHUNK)
    sv = max(1, min(4, chunk // width))
    index_bits = 16 if f16 and k <= INDEX16_MAX_COLS else 32
    wide = k * n >= 2**31
    prescaled = index_bits == 32 and not wide
    batch = min(chunk, batch or (MANY_ROWS_BATCH if many_batch else BATCH_BYTES // (vec * itemsize)))
    if prefetch is None:
        prefetch = not f16 and n <= PREFETCH_MAX_N and not balanced
    spec = Spec(request.short_dtype, n, vec, width, ksplit, rows, chunk, sv, batch, index_bits, prescaled, wide,
                swizzle, request.bias, request.relu, budget, piece or 0, bool(prefetch))
    tiles = -(-n // tile_n)
    many_note = ""
    if many_chunk or many_batch:
        blocks_note = f", {rows}-row blocks" if big_block else ""
        many_note = f" ({m} x {k}, rows unsplit{blocks_note}: measured faster)"
    reason = (f"rows avg {mean:.1f} nnz (CoV {stats.row_lengths.cov:.2f}), n={n}: {vec}-wide loads, "
              f"{width} thread{'s' if width > 1 else ''} x {tile_n} column{'s' if tile_n > 1 else ''} per row group ({tiles} tile{'s' if tiles > 1 else ''})")
    if spec.piece:
        reason += (f", each row split over the fewest row groups (a power of two, up to {spec.ksplit}) that leave "
                   f"each <= {spec.piece} nonzeros")
    elif spec.budget:
        reason += (f", each row split over the fewest row groups (a power of two, up to {spec.ksplit}) that leave "
                   f"each <= the least piece whose splits fit {spec.budget} groups per column tile (grid within "
                   f"{target} warps for {request.device.sm_count} SMs; the longest row has {stats.row_lengths.max})")
    elif skewed_many:
        reason += (f", {spec.ksplit} groups per row ({m} x {k} with rows of CoV {stats.row_lengths.cov:.2f} >= "
                   f"{MANY_ROWS_MAX_COV}: many long rows, skewed; split alike measured fastest)")
    elif spec.ksplit > 1:
        reason += (f", {spec.ksplit} groups per row ({m} rows alone give {warps(m, n, tile_n, width, 1)} warps; "
                   f"split while the grid stays within {target} for {request.device.sm_count} SMs)")
    reason += (f"; {chunk}-nonzero chunks by {sv}-wide loads, {spec.batch} loads of X in flight"
               f"{many_note}"
               f"{block_note}"
               f"{'; the next chunk loaded while this one computes' if spec.prefetch else ''}; {index_bits}-bit indices"
               f"{' pre-scaled by n' if prescaled else ''}; "
               f"{'rows swizzled longest first' if swizzle else 'rows in order'}")
    return spec, reason


# tune=True also times these row splits beside the rule's own (float32): over the DLMC cases where
# the rule's split was measured against them (probes/spmm_sweep_sputnik_split_128_256.json and
# spmm_sweep_worst_f32.json, 76 cases) the fastest of the three ran 1.02x faster than the rule's
# (geomean), up to 1.20x, ahead by more than 2 % in 14.
TUNE_KSPLITS = (4, 8)


def tune_variants(request: Request) -> list[dict]:
    """tune=True times the rule's split and TUNE_KSPLITS (float32), unless options fix the split."""
    fixed = any(request.option(o) is not None for o in ("ksplit", "balance", "piece"))
    if request.dtype != "float32" or fixed:
        return [{}]
    return [{}] + [{"ksplit": k} for k in TUNE_KSPLITS]


@dataclass(frozen=True)
class Options(FamilyOptions):
    """Each overrides the rule's choice (tuning, tests); None: the rule chooses."""

    ksplit: Literal[1, 2, 4, 8, 16] | None = option(expected="1, 2, 4, 8 or 16")
    tile_bytes: Literal[16, 32, 64, 128, 256, 512] | None = option(expected="a power of two from 16 to 512")
    chunk: Literal[32, 64, 128] | None = option(expected="32, 64 or 128")
    batch: Literal[4, 8, 16, 32] | None = option(expected="4, 8, 16 or 32")
    block: Literal[32, 64, 128, 256, 512] | None = option(expected="a power of two from 32 to 512")
    balance: Literal[0, 1] | None = option(expected="0 (every row split alike) or 1 (split per row)")
    piece: int | None = option(expected=f"nonzeros per row group, 1 to {1 << 20}", valid=lambda v: 1 <= v <= 1 << 20)
    prefetch: Literal[0, 1] | None = option(expected="0 or 1 (load the next chunk while this one computes)")

    def check(self) -> str | None:
        if self.piece is not None and self.balance == 0:
            return "piece with balance=0: a piece size splits rows per row"
        return None


def _rule(stats, request: Request):
    gate = spmm_gate(stats, request, index_slack=8)  # indices and values padded to a whole vector
    if gate:
        return gate
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    ksplit, tile_bytes = request.option("ksplit"), request.option("tile_bytes")
    chunk, batch, block = request.option("chunk"), request.option("batch"), request.option("block")
    balance, piece, prefetch = request.option("balance"), request.option("piece"), request.option("prefetch")
    spec, reason = choose(stats, request, ksplit=ksplit, tile_bytes=tile_bytes, chunk=chunk, batch=batch, block=block,
                          balance=balance, piece=piece, prefetch=prefetch)
    if request.option("family") == FAMILY:
        return accept(spec, reason)
    mean = stats.row_lengths.mean
    if request.dtype == "float32":
        measured = request.n >= MIN_N or (mean >= MIN_MEAN_ROW and spec.ksplit > 1)
        where = f"n >= {MIN_N}, or rows >= {MIN_MEAN_ROW} split over row groups (too few rows to fill the GPU)"
    else:
        measured = request.n >= MIN_N and mean >= MIN_MEAN_ROW
        where = f"n >= {MIN_N} with rows >= {MIN_MEAN_ROW} (float16)"
    if not measured:
        return decline(f"n={request.n}, rows avg {mean:.1f} nnz, {spec.ksplit} row group(s) per row: outside "
                       f"{where}, where it was measured faster than csr_rowsplit")
    return accept(spec, reason)


RULES = (Rule("sputnik_spmm", FAMILY, _rule),)


def arguments(spec: Spec) -> tuple[Arg, ...]:
    args = [Arg("indptr", "plan"), Arg("indices", "plan"), Arg("values", "plan")]
    if spec.swizzle:
        args.append(Arg("order", "plan"))
    if spec.balanced:
        args.append(Arg("blocks", "plan"))
    args.append(Arg("x", "input"))
    if spec.bias:
        args.append(Arg("bias", "plan"))
    return tuple(args) + (Arg("y", "output"), Arg("row_blocks" if spec.balanced else "m", "int"))


def encode(csr, spec: Spec, bias=None):
    return FORMAT.encode_sputnik(csr, long_name(spec.dtype),
                                 index_bits=spec.index_bits, prescale=spec.n if spec.prescaled else 0,
                                 vector=spec.sv, swizzle=spec.swizzle, bias=bias,
                                 balance=((spec.piece, spec.budget, spec.rows * spec.ksplit, spec.ksplit)
                                          if spec.balanced else None))


operands = spmm_operands


def launch(spec: Spec, plan) -> Launch:
    tiles = -(-spec.n // spec.tile_n)
    blocks = plan.constants["row_blocks"] if spec.balanced else -(-plan.constants["m"] // spec.rows)
    return Launch((blocks * tiles, 1, 1), (spec.block, 1, 1), 0)


def alignment(spec: Spec) -> int:
    return spec.vec * (4 if spec.dtype == "f32" else 2)


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(FORMAT.decode_sputnik(plan), inputs["x"], relu=spec.relu)
