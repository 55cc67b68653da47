"""`panel_spmm`: row panels with X staged in shared memory, Y = A·X (+ bias, ReLU).

csr_rowsplit and sputnik_spmm load, for every nonzero, its X row from L2: on the H100 that
saturates near 8 TB/s of L2 reads (the DLMC sweep), and a 70-90 % sparse layer then runs at a few
TFLOP/s. Here a block owns a panel of rows and walks K in chunks: it copies the X tile of a chunk
(kc rows x tile_n columns) into shared memory once with cp.async, together with the panel's
nonzeros of that chunk (one contiguous segment, see formats/panel.py), and every nonzero then
reads its X row from shared memory. One staged X row serves panel rows x density nonzeros on
average, so the L2 traffic drops by that factor and shared-memory bandwidth becomes the bound.
The copy of chunk c + 1 overlaps the multiplication of chunk c. When panels and column tiles
alone are too few blocks for the GPU, K is split across blocks that add into an fp32 workspace,
and a second kernel applies the epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..dtypes import long_name
from ..formats import csr as CSR  # noqa: N812
from ..formats import panel as FORMAT  # noqa: N812 - the family's format module
from .base import (Arg, KernelSpec, Launch, Request, Rule, Step, accept, decline, epilogue_suffix,
                   next_pow2, prev_pow2, spmm_gate, spmm_operands, widest_vector)
from .options import FamilyOptions, option

FAMILY = "panel_spmm"
OPS = ("spmm",)
KERNEL = "panel_spmm"
WARPS = 8  # warps per block
MAX_ACC = 32  # fp32 accumulators per lane (rows per group x vector)
REUSE = 16  # nonzeros one staged X row should serve: panel rows ~ REUSE / density
MIN_PANEL, MAX_PANEL = 32, 256
STAGE_BYTES = 48 * 1024  # one pipeline stage (X tile + segment); two stages, so two or more blocks per SM
X_TILE_BYTES = 32 * 1024
# The split of K fills one wave of the blocks the SMs hold (`resident_blocks`: two or three, by the
# shared memory). Before, it aimed at 2 blocks per SM whatever the SMs held: 320 blocks of 15 chunks
# where two fit (a second, partial wave) and 320 where three fit (a quarter of the slots idle). H100
# sweep at n = 1024 over the 17 DLMC cases this kernel serves (probes/spmm_sweep_panel_splits.txt,
# splits 2-6 forced): the one-wave split was the fastest of them in all 17, 1.13x over the old
# (1.00-1.40x).
BLOCK_RESERVED_BYTES = 1024  # the driver's shared memory per block
REGISTER_BLOCKS = 4  # 256-thread blocks the register file holds at this kernel's 61 registers (ncu)
PAIR_SLACK = 1.25  # staged capacity over the expected segment; longer segments read the rest from L2
FINISH_THREADS = 256
# Where it beat csr_rowsplit and sputnik_spmm in the H100 sweep over every 5th DLMC matrix at
# n = 32..1024 (docs/decisions/data/h100-80gb-hbm3/spmm_sweep_panel_f32.json): 2048-4608 columns at
# 8-20 % density (1.2-2x). At 2-3.5 % a staged X row serves too few nonzeros to pay for its copy;
# with 512 columns X stays in L1 anyway and the CSR kernels tie or win. Rows: all of those wins
# were on 256-1000 rows; the complete dlmc run of 2026-11-24 (benchmarks/results/h100-80gb-hbm3/
# dlmc.json) selected it on the 2048-8192 random squares too and it lost there to the CSR kernels
# of the earlier run on 40 of 48 cases (up to 2x at 8192 rows, 95 %): with thousands of rows the
# row kernels fill the GPU without split K, and the panels' shared-memory reads cost as much as
# the L1/L2 reads they replace.
MIN_DENSITY = 0.05
MIN_K = 2048
MAX_M = 1024
# Narrow X (n <= 128) needs more density: sputnik_spmm, splitting few rows over row groups, beats this kernel on all 22 DLMC cases at 8-11 % density and n = 32/128 that this kernel had
# (1.25x geomean, 1.02-1.56x; probes/spmm_sweep_sputnik_ksplit_dlmc_*.json against dlmc.json,
# each against its own run's cuSPARSE), while at 18-20 % and at n >= 256 the two tie or this wins.
NARROW_N = 128
NARROW_MIN_DENSITY = 0.15
# Small layers (<= 2**20 weights: the 512 x 2048 transformer layers) need that density at every n:
# with 512-thread blocks at n >= 1024 (WIDE_N in sputnik_spmm) sputnik_spmm beat this kernel on all
# five such layers at 7.7-11 % density (1.15-1.32x; probes/spmm_sweep_sputnik_wide_n_dlmc.txt), and
# at n = 256 on the same five with its 128-thread blocks (1.01-1.09x; spmm_sweep_sputnik_blocks_dlmc.txt),
# while at 18 % this kernel still won (n = 256: 21.0 against 23.6 us). On 1000 x 2048 the two tied
# at n = 1024 (0.97/1.05x) and on 512 x 4608 this kernel won (1.02-1.26x), so those keep it.
SMALL_LAYER = 1 << 20


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32" | "f16": storage of A's values, X and Y; accumulation is fp32
    m: int
    k: int
    n: int
    vec: int  # elements per lane per load of X / store of Y
    group: int  # lanes of a row group (across tile_n = group x vec columns)
    warps: int
    rpg: int  # rows per row group
    kc: int  # rows of X per staged chunk
    cps: int  # chunks per split of K
    pair_cap: int  # nonzeros of a segment staged in shared memory; the rest is read from L2
    density: float  # of the matrix, rounded: shapes the comments only
    bias: bool = False
    relu: bool = False

    @property
    def name(self) -> str:
        return (f"{FAMILY}.{self.dtype}.m{self.m}k{self.k}n{self.n}.v{self.vec}.g{self.group}.w{self.warps}"
                f".r{self.rpg}.kc{self.kc}.cps{self.cps}.p{self.pair_cap}{epilogue_suffix(self.bias, self.relu)}")

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "f16" else 4

    @property
    def tile_n(self) -> int:
        return self.group * self.vec

    @property
    def panel_rows(self) -> int:
        return self.warps * (32 // self.group) * self.rpg

    @property
    def chunks(self) -> int:
        return max(-(-self.k // self.kc), 1)

    @property
    def splits(self) -> int:
        return -(-self.chunks // self.cps)

    @property
    def panels(self) -> int:
        return max(-(-self.m // self.panel_rows), 1)

    @property
    def record(self) -> int:
        return FORMAT.record_stride(self.panel_rows)

    @property
    def shared_bytes(self) -> int:
        return 2 * stage_bytes(self.kc, self.tile_n, self.itemsize, self.record, self.pair_cap)

    def fields(self) -> dict:
        return {**super().fields(), "record": self.record}


@dataclass(frozen=True)
class Options(FamilyOptions):
    reuse: int = option(REUSE, expected="an integer from 1 to 256", valid=lambda v: 1 <= v <= 256)
    blocks_per_sm: int | None = option(expected="an integer from 1 to 64",  # None: resident_blocks
                                       valid=lambda v: 1 <= v <= 64)
    splits: int | None = option(expected="a positive integer (ways to split K)", valid=lambda v: v >= 1)


def stage_bytes(kc: int, tile_n: int, itemsize: int, record: int, pair_cap: int) -> int:
    pair_bytes = 4 if itemsize == 2 else 8
    return kc * tile_n * itemsize + record * 4 + (-(-pair_cap // 4) * 4) * pair_bytes


def pair_capacity(panel_rows: int, kc: int, density: float) -> int:
    expected = panel_rows * kc * density
    return int(min(panel_rows * kc, -(-int(PAIR_SLACK * expected + 32) // 4) * 4))


def resident_blocks(shared_bytes: int, device) -> int:
    """Blocks of this kernel an SM of `device` holds at once: shared memory (with the driver's
    reserve per block), registers (REGISTER_BLOCKS) or warps, whichever binds first."""
    warps = device.max_threads_per_sm // 32
    return max(1, min(warps // WARPS, REGISTER_BLOCKS, device.shared_per_sm // (shared_bytes + BLOCK_RESERVED_BYTES)))


def choose_splits(chunks: int, blocks: int, slots: int) -> int:
    """Ways to split K: as many as one wave of the GPU's `slots` resident blocks holds (no second,
    partial wave), at least one, at most one chunk a block."""
    return max(1, min(chunks, slots // max(blocks, 1)))


def choose(stats, request: Request, *, reuse: int = REUSE, blocks_per_sm: int | None = None,
           splits: int | None = None) -> tuple[Spec, str]:
    """Tile from n and the dtype, panel height from the density (reuse of a staged X row), chunk
    from the shared-memory budget, and a split of K when the panels alone are too few blocks
    (`choose_splits` for the blocks an SM holds, `resident_blocks`; the options `blocks_per_sm` and
    `splits` force those)."""
    f16 = request.dtype == "float16"
    itemsize = 2 if f16 else 4
    (m, k), n, density = stats.shape, request.n, max(stats.density, 1e-6)
    vec = widest_vector(n, itemsize)
    group = min(32, next_pow2(-(-n // vec)))
    tile_n = group * vec
    groups = WARPS * (32 // group)
    want_rows = min(MAX_PANEL, max(MIN_PANEL, next_pow2(reuse / density)), next_pow2(m))
    rpg = max(1, min(MAX_ACC // vec, want_rows // groups))
    panel_rows = groups * rpg
    kc = min(256, max(16, prev_pow2(X_TILE_BYTES // (tile_n * itemsize))), max(16, next_pow2(k)))
    record = FORMAT.record_stride(panel_rows)
    while kc > 16 and stage_bytes(kc, tile_n, itemsize, record, pair_capacity(panel_rows, kc, density)) > STAGE_BYTES:
        kc //= 2
    chunks = max(-(-k // kc), 1)
    blocks = max(-(-m // panel_rows), 1) * -(-n // tile_n)
    pair_cap = pair_capacity(panel_rows, kc, density)
    shared = 2 * stage_bytes(kc, tile_n, itemsize, record, pair_cap)  # = Spec.shared_bytes, needed before the Spec
    per_sm = blocks_per_sm or resident_blocks(shared, request.device)
    cps = -(-chunks // (splits or choose_splits(chunks, blocks, per_sm * request.device.sm_count)))
    spec = Spec(request.short_dtype, m, k, n, vec, group, WARPS, rpg, kc, cps, pair_cap, round(float(density), 3),
                request.bias, request.relu)
    reason = (f"density {density:.3f}: panels of {panel_rows} rows share each staged X row "
              f"(~{panel_rows * density:.1f} nonzeros per row copied); {kc} x {tile_n} X tiles in shared memory, "
              f"{vec}-wide loads")
    if spec.splits > 1:
        reason += (f"; K split {spec.splits} ways ({blocks} panel tiles alone): {blocks * spec.splits} blocks of "
                   f"{spec.cps} chunks, {'forced' if splits else 'one wave'} at {per_sm} blocks per SM "
                   f"({shared // 1024} KB shared memory each)")
    return spec, reason


def _outside_measured(stats, request: Request):
    """The decline for a request outside where this kernel was measured faster, else None."""
    (m, k), density = stats.shape, stats.density
    if request.dtype != "float32":
        return decline(f"dtype {request.dtype}: on the DLMC run of the H100 it lost to the CSR kernels in fp16 "
                       f"(1.26x vs 1.75x cuSPARSE on the same 80 cases); runs when asked for")
    if density < MIN_DENSITY or k < MIN_K or m > MAX_M:
        return decline(f"{m} rows, {k} columns, density {density:.3f}: outside <= {MAX_M} rows, >= {MIN_K} "
                       f"columns at density >= {MIN_DENSITY}, where it was measured faster than csr_rowsplit "
                       f"and sputnik_spmm")
    if request.n <= NARROW_N and density < NARROW_MIN_DENSITY:
        return decline(f"n={request.n} <= {NARROW_N} at density {density:.3f} < {NARROW_MIN_DENSITY}: "
                       f"sputnik_spmm's split rows were measured faster there")
    if m * k <= SMALL_LAYER and density < NARROW_MIN_DENSITY:
        return decline(f"{m} x {k} (<= {SMALL_LAYER} weights) at density {density:.3f} < {NARROW_MIN_DENSITY}: "
                       f"sputnik_spmm was measured faster there")
    return None


def serves_by_default(stats, request: Request) -> bool:
    """True where this family's rule takes a request unforced (its measured region): dense_tile_spmm
    asks, as it takes fp32 requests at n <= NARROW_N from this kernel."""
    return spmm_gate(stats, request) is None and _outside_measured(stats, request) is None


def _rule(stats, request: Request):
    gate = spmm_gate(stats, request)
    if gate:
        return gate
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    reuse, per_sm = request.option("reuse", REUSE), request.option("blocks_per_sm")
    splits = request.option("splits")
    outside = None if request.option("family") == FAMILY else _outside_measured(stats, request)
    if outside:
        return outside
    return accept(*choose(stats, request, reuse=reuse, blocks_per_sm=per_sm, splits=splits))


RULES = (Rule("panel_spmm", FAMILY, _rule),)


def encode(csr, spec: Spec, bias=None):
    plan = FORMAT.encode(csr, long_name(spec.dtype), rows=spec.panel_rows, kc=spec.kc, tile_n=spec.tile_n, bias=bias)
    workspace = spec.m * spec.n * 4 if spec.splits > 1 else 0
    return type(plan)(plan.format, plan.arrays, {**plan.constants, "workspace_bytes": workspace})


def steps(spec: Spec, plan) -> tuple:
    args = [Arg("rowoff", "plan"), Arg("pairs", "plan"), Arg("x", "input")]
    grid = (spec.panels if spec.m else 0, -(-spec.n // spec.tile_n), spec.splits)
    block = (spec.warps * 32, 1, 1)
    if spec.splits == 1:
        args += [Arg("bias", "plan")] if spec.bias else []
        return (Step(KERNEL, tuple(args + [Arg("y", "output")]), Launch(grid, block, spec.shared_bytes)),)
    main = Step(KERNEL, tuple(args + [Arg("workspace", "scratch")]), Launch(grid, block, spec.shared_bytes))
    finish_args = (Arg("workspace", "scratch"),) + ((Arg("bias", "plan"),) if spec.bias else ()) + (Arg("y", "output"),)
    blocks = -(-spec.m * spec.n // FINISH_THREADS)
    return main, Step(f"{KERNEL}_finish", finish_args, Launch((blocks, 1, 1), (FINISH_THREADS, 1, 1), 0))


operands = spmm_operands


def alignment(spec: Spec) -> int:
    return spec.vec * spec.itemsize


def emulate(spec: Spec, plan, inputs: dict):
    return CSR.spmm(FORMAT.decode(plan), inputs["x"], relu=spec.relu)
