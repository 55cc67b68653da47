"""`sputnik_sddmm`: Sputnik's SDDMM (Gale et al., SC'20): out[j] = A[row_j] · B[col_j] for every
stored entry j of a CSR pattern P (m × n), in P's CSR order; A (m × k) and B (n × k) row-major.

The output is cut into 1-D tiles of `tile` consecutive nonzeros of one row (formats/csr_sddmm).
A group of `lanes` threads computes one tile: it walks k in passes of `lanes × vec × unroll`
elements; in a pass each lane holds its `unroll` vectors of A's row in registers, reused for
every nonzero of the tile, and loads the matching vectors of each nonzero's B row (the group
reads a whole 128-byte line of the row per load instruction), accumulating one fp32 partial sum
per nonzero: `tile × unroll` independent loads per lane and pass, unguarded (a partial tile's
spare slots repeat its last column). A transposing warp-shuffle reduction then leaves each lane
`tile / lanes` finished sums, which it stores if they are real. Rows are visited longest first
(row swizzle); tiles are laid out phase by phase, so a block's groups hold same-phase tiles of
consecutive rows and read overlapping rows of B (L1 reuse); the block is as large as an even
spread over the SMs allows. Column indices are pre-scaled by k when that fits in 32 bits. k is
a compile-time constant: the loops over a pass unroll and the k residue is resolved at compile
time. Request options `tile`, `unroll`, `block`, `min_blocks`, `order`, `scaled`, `lanes` override
the rule (tuning).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import long_name
from ..formats import csr_sddmm as FORMAT  # noqa: N812 - the family's format module
from .base import (Arg, KernelSpec, Launch, Operand, Request, Rule, accept, decline, next_pow2,
                   prev_pow2, widest_vector)
from .options import FamilyOptions, option

FAMILY = "sputnik_sddmm"
OPS = ("sddmm",)
KERNEL = "sputnik_sddmm"
WARP = 32
LINE_BYTES = 128  # a group reads one L1 line of a B row per load instruction
TILES = (32, 16, 8)  # nonzeros per tile, largest first (Sputnik: 32)
LOADS_IN_FLIGHT = 32  # tile x unroll: independent vector loads per lane and chunk
# Warps wanted per SM: latency hiding between load rounds. The tile halves until the tiles give this
# many. 24 (was 16): in the H100 sweep of every 6th DLMC matrix at k = 32/128/256
# (docs/decisions/data/h100-80gb-hbm3/sddmm_sweep_tile.txt) 32-nonzero tiles that gave 2.3-3.0k
# warps ran 12-21 % slower at k >= 128 than 16-nonzero tiles (twice the warps), and those that gave
# 3.7k or more ran 3-11 % faster.
WARPS_PER_SM = 24
BLOCKS = (512, 256, 128, 64, 32)  # threads per block, largest first (more groups share B rows in L1)
SPREAD = 0.85  # least acceptable `spread` of the blocks over the SMs (a larger block is worth a little)
REGISTERS = 128  # per-thread register budget, through __launch_bounds__' minimum blocks per SM
MAX_BLOCKS_PER_SM = 32
INT32_MAX = 2**31 - 1
# float32 with k exactly one pass of ONE_PASS_TILE-nonzero tiles of ONE_PASS_UNROLL float4 loads per lane
# (k = 128 with 8-lane groups, k = 256 with 16): such tiles, ONE_PASS_BLOCK-thread blocks and
# ONE_PASS_MIN_BLOCKS of them per SM (85 registers, 24 warps an SM, against 16 at REGISTERS). H100 sweeps
# (docs/decisions/data/h100-80gb-hbm3/sddmm_sweep_one_pass*.txt, sddmm_sweep_occupancy.txt): at
# k = 128 1.06x faster than the rule's tiles over 27 DLMC matrices and two squares (0.91-1.22x), 1.053x
# over the suite's 62 cases; at k = 256 with 16-lane groups 1.10x where the rule's blocks are under
# LARGE_BLOCK threads (12 of 20 cases, 0.93-1.22x) and 0.84-1.01x where they are not; narrower groups
# (k = 32 with 2 or 4 lanes: 0.64x, 0.87x) and a second pass (k = 256 with 8 lanes: 0.83x) lose.
ONE_PASS_LANES = (8, 16)
LARGE_BLOCK = 512
ONE_PASS_TILE, ONE_PASS_UNROLL, ONE_PASS_BLOCK, ONE_PASS_MIN_BLOCKS = 8, 4, 256, 3


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32" | "f16": storage of A, B and the output; products and sums are fp32
    k: int  # inner dimension (columns of A and B), a compile-time constant
    vec: int  # elements per vector load of A and B
    lanes: int  # threads of a tile group, splitting k
    unroll: int  # vector loads per lane and nonzero in one k chunk
    tile: int  # nonzeros per tile
    block: int  # threads per block
    min_blocks: int  # __launch_bounds__ minimum resident blocks per SM (caps registers)
    order: str  # tile layout: "phase" | "row" (formats/csr_sddmm)
    scaled: bool  # column slots hold column x k

    @property
    def name(self) -> str:
        return (f"{FAMILY}.{self.dtype}.k{self.k}.v{self.vec}.w{self.lanes}.u{self.unroll}.x{self.tile}"
                f".b{self.block}m{self.min_blocks}.{self.order}{'.s' if self.scaled else ''}")

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "f32" else 2

    @property
    def chunk(self) -> int:
        """Elements of k one pass over the tile covers."""
        return self.lanes * self.vec * self.unroll

    @property
    def groups_per_block(self) -> int:
        return self.block // self.lanes


@dataclass(frozen=True)
class Options(FamilyOptions):
    """Each overrides the rule's choice; None: the rule chooses."""

    tile: Literal[4, 8, 16, 32] | None = option(expected="4, 8, 16 or 32")
    unroll: Literal[1, 2, 4, 8, 16, 32] | None = option(expected="a power of two up to 32")
    block: int | None = option(expected="a multiple of 32 up to 1024", valid=lambda v: v % WARP == 0 and WARP <= v <= 1024)
    min_blocks: int | None = option(expected=f"an integer from 1 to {MAX_BLOCKS_PER_SM}",
                                    valid=lambda v: 1 <= v <= MAX_BLOCKS_PER_SM)
    order: Literal[FORMAT.ORDERS] = option("phase")  # the tile layout
    scaled: bool = option(True)  # False forces 64-bit offsets (tests that path)
    lanes: Literal[1, 2, 4, 8, 16, 32] | None = option(expected="a power of two up to 32")


def group_lanes(k: int, vec: int, itemsize: int) -> int:
    """Lanes that together read one 128-byte line of a B row (fewer when the row is shorter)."""
    return min(WARP, LINE_BYTES // (vec * itemsize), next_pow2(-(-k // vec)))


def estimated_tiles(stats, tile: int) -> int:
    """Tiles of the matrix (about half a tile of slack per nonempty row: MatrixStats has no histogram)."""
    nonempty = stats.shape[0] - stats.row_lengths.empty
    return int(round(stats.nnz / tile + 0.5 * nonempty * (tile - 1) / tile)) if stats.nnz else 0


def choose_tile(stats, lanes: int, target: int) -> int:
    """The largest tile that rows fill (<= next_pow2 of the mean nonempty row) and that still gives
    `target` warps; never below 8."""
    nonempty = stats.shape[0] - stats.row_lengths.empty
    mean = stats.nnz / nonempty if nonempty else 0.0
    tile = max(TILES[-1], min(TILES[0], next_pow2(int(-(-mean // 1)))))
    while tile > TILES[-1] and estimated_tiles(stats, tile) * lanes / WARP < target:
        tile //= 2
    return tile


def spread(blocks: int, sms: int) -> float:
    """How evenly `blocks` equal blocks load the SMs: the average SM's share of the busiest SM's
    blocks (1.0 when they divide evenly), or the share of SMs used when there are fewer blocks."""
    if blocks < sms:
        return blocks / sms
    return blocks / sms / -(-blocks // sms)


def choose_block(tiles: int, lanes: int, sms: int) -> int:
    """The largest block that still spreads evenly (SPREAD) over the SMs: in phase order a block's
    groups are same-phase tiles of consecutive rows, so a larger block shares more rows of B in L1.
    Failing that, the most even one."""
    def score(b):
        return spread(-(-tiles // (b // lanes)), sms)
    for b in BLOCKS:
        if score(b) >= SPREAD:
            return b
    return max(BLOCKS, key=lambda b: (round(score(b), 2), b))


def one_pass_lanes(stats, request: Request, vec: int, lanes: int, sms: int) -> int:
    """The group width of the ONE_PASS configuration where it applies, else 0: float32, no tile,
    block or lanes option, and k one pass of ONE_PASS_TILE x ONE_PASS_UNROLL vectors for groups of
    ONE_PASS_LANES; wider groups than the rule's (k = 256) only where the rule's own blocks stay
    under LARGE_BLOCK threads (with many tiles the rule's large blocks share B rows among more groups)."""
    if request.dtype != "float32" or any(request.option(o) is not None for o in ("tile", "block", "lanes")):
        return 0
    width, rest = divmod(request.k, vec * ONE_PASS_UNROLL)
    if rest or width not in ONE_PASS_LANES:
        return 0
    if width > lanes:
        tile = choose_tile(stats, lanes, WARPS_PER_SM * sms)
        if choose_block(estimated_tiles(stats, tile), lanes, sms) >= LARGE_BLOCK:
            return 0
    return width


def choose(stats, request: Request) -> tuple[Spec, str]:
    """Vector width and lanes from k and dtype; tile size from row lengths and the SM count; unroll
    to keep LOADS_IN_FLIGHT loads per lane; block size for an even spread over the SMs. Where
    8-nonzero tiles cover k in one pass (ONE_PASS), that configuration instead."""
    k, itemsize = request.k, (4 if request.dtype == "float32" else 2)
    m, n = stats.shape
    sms = request.device.sm_count
    vec = widest_vector(k, itemsize)
    lanes = int(request.option("lanes") or group_lanes(k, vec, itemsize))
    target = WARPS_PER_SM * sms
    single = one_pass_lanes(stats, request, vec, lanes, sms)
    lanes = single or lanes
    tile = int(request.option("tile") or (ONE_PASS_TILE if single else choose_tile(stats, lanes, target)))
    unroll = int(request.option("unroll") or (ONE_PASS_UNROLL if single else
                 max(1, min(LOADS_IN_FLIGHT // tile, prev_pow2(max(1, k // (lanes * vec)))))))
    tiles = estimated_tiles(stats, tile)
    block = int(request.option("block") or (ONE_PASS_BLOCK if single else choose_block(tiles, lanes, sms)))
    min_blocks = int(request.option("min_blocks") or (ONE_PASS_MIN_BLOCKS if single else
                     max(1, min(MAX_BLOCKS_PER_SM, request.device.registers_per_sm // (block * REGISTERS)))))
    order = request.option("order", "phase")
    fits = max(n - 1, 0) * k <= INT32_MAX
    scaled = fits and request.option("scaled", True)  # scaled=False forces 64-bit offsets (tests that path)
    spec = Spec(request.short_dtype, k, vec, lanes, unroll, tile, block, min_blocks, order, scaled)
    chunks, residue = divmod(k, spec.chunk)
    warps = -(-tiles * lanes // WARP)
    nblocks = -(-tiles // spec.groups_per_block)
    nonempty = m - stats.row_lengths.empty
    mean = stats.nnz / nonempty if nonempty else 0.0
    reason = (f"k={k}: {vec}-wide loads, {lanes} lanes per tile read {lanes * vec * itemsize} B of a B row per "
              f"load, {unroll} per nonzero per chunk ({chunks} chunk(s) of {spec.chunk}"
              f"{f' + residue {residue}' if residue else ''}); rows avg {mean:.1f} nnz (CoV "
              f"{stats.row_lengths.cov:.2f}): tiles of {tile} -> ~{tiles} tiles, {warps} warps for {sms} SMs; "
              f"{block}-thread blocks ({nblocks / sms:.1f} per SM, {spread(nblocks, sms):.0%} even"
              f"{f', {min_blocks} resident: {min_blocks * block // WARP} warps an SM' if single else ''}); "
              f"{order}-major tiles"
              f"{'' if scaled else f'; {n} x {k} needs 64-bit offsets' if not fits else '; 64-bit offsets (option)'}")
    if single:
        reason += (f"; k is one pass of {ONE_PASS_TILE}-nonzero tiles for {lanes}-lane groups: fewer registers buy "
                   f"{ONE_PASS_MIN_BLOCKS * ONE_PASS_BLOCK // WARP} warps an SM")
    return spec, reason


def _rule(stats, request: Request):
    if request.op != "sddmm":
        return decline(f"op {request.op!r} is not sddmm")
    if not request.k:
        return decline("sddmm needs k (the inner dimension)")
    if request.dtype not in ("float32", "float16"):
        return decline(f"dtype {request.dtype} not in float32/float16")
    m, n = stats.shape
    if stats.nnz + m * TILES[0] > INT32_MAX or max(m, n, request.k) > INT32_MAX:
        return decline("matrix needs 64-bit indices")
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    spec, reason = choose(stats, request)
    if spec.min_blocks * spec.block > request.device.max_threads_per_sm:
        return decline(f"option min_blocks={spec.min_blocks}: {spec.min_blocks} blocks of {spec.block} threads "
                       f"exceed the {request.device.max_threads_per_sm} threads an SM holds")
    return accept(spec, reason)


RULES = (Rule("sputnik_sddmm", FAMILY, _rule),)

ARGUMENTS = (Arg("tiles", "plan"), Arg("slots", "plan"), Arg("a", "input"), Arg("b", "input"),
             Arg("out", "output"))


def arguments(spec: Spec) -> tuple[Arg, ...]:
    return ARGUMENTS


def encode(csr, spec: Spec, bias=None):
    if bias is not None:
        raise ValueError("sddmm takes no bias")
    return FORMAT.encode(csr, k=spec.k, tile=spec.tile, lanes=spec.lanes, block=spec.block, order=spec.order,
                         scaled=spec.scaled)


def operands(spec: Spec, plan) -> tuple[tuple[Operand, ...], Operand]:
    c, dtype = plan.constants, long_name(spec.dtype)
    return ((Operand("a", (c["m"], spec.k), dtype), Operand("b", (c["n"], spec.k), dtype)),
            Operand("out", (c["nnz"],), dtype))


def launch(spec: Spec, plan) -> Launch:
    """One group per tile; the plan pads the tiles to whole blocks (an empty matrix has none)."""
    return Launch((plan.constants["tiles"] // spec.groups_per_block, 1, 1), (spec.block, 1, 1), 0)


def alignment(spec: Spec) -> int:
    """Bytes the A and B pointers must be aligned to (vector loads)."""
    return spec.vec * spec.itemsize


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.sddmm(plan, inputs["a"], inputs["b"])
