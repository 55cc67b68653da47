"""What the two tensor-core tile families (`tiled_csl_spmm`, `tiled_bitmap_spmm`) share: the spec
fields, the request gate, launch geometry, split-K and its reduction, and the cost model that
chooses between them.

Both compute Y = W·X (+ bias per row, ReLU) for a W of fp16/bf16 cut into `tile_m` x 64 tiles and a
skinny row-major X (K x N, N <= 256): a block of 4 warps owns one row tile and one column tile of
`bn` <= 64 columns, walks its share of K (split-K), and multiplies with `mma.sync.m16n8k16`
(fp32 accumulation). Each warp owns `tile_m / 4` rows, so every A fragment is decoded once.
`options wgmma=True` (sm_90, compiled for sm_90a) multiplies with warpgroup MMA instead: the
decoded A fragments from registers, the X tile read by the tensor cores from shared memory (no B
fragment loads), one tile's group in flight while the next is decoded. Correct but measured 15-25 %
slower on the H100 (probes/tiled_probe_wgmma.txt), so off unless asked for.
The split_k partial sums of an output tile meet in a thread block cluster's distributed shared
memory on sm_90 (split_k <= 8: no workspace, deterministic), else through fp32 atomics or a second
launch. Residency (`ring_shape`) and split-K (`choose_split`) are chosen together: as many resident
blocks per SM as registers and shared memory allow while each block's cp.async ring keeps
IN_FLIGHT_BYTES per SM moving, and enough blocks, evenly spread, to fill them. Wide (64-column)
bitmap blocks may take one block more than the register estimate allows (`options blocks=` asks
for any residency): the split model (`wave_factor`) weighs the wave it saves.

The skinny cost model (`select/skinny_cost.py`) prices a spec and hands `choose` the kernel time
with every SM busy; here the split-K factor, tile height and residency are chosen from it
(`modelled_split`, `wave_factor`) and the request's device (SMs, shared memory, registers, and the
rates of its reductions and waves), and every choice is stated in the selection's reason.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..dtypes import DTYPES, NAMES, long_name, short_name
from ..formats.tiling import TILE_K
from .base import Arg, KernelSpec, Launch, Operand, Request, Step, decline, epilogue_suffix, widest_vector
from .options import FamilyOptions, option

WARPS = 4
THREADS = WARPS * 32
MAX_N = 256  # skinny products only: past this, W is re-read per 64-column tile and dense GEMM wins
# Wider X is taken when W, densified in fp16, fits well inside L2: at most L2_SHARE of it (16 MiB of
# the H100's 50), so the column tiles' re-reads of W hit L2 (DLMC's weight layers are 0.5-9 MB).
L2_SHARE = (8, 25)
MAX_BN = 64  # columns per block: MF x NF x 4 fp32 accumulators per thread stay <= 64 (tile_m 128)
MIN_DENSITY = 0.05  # below this, tile math on zeros costs more than CSR kernels' work on nonzeros
REDUCTIONS = ("none", "atomic", "two_step", "cluster", "stream")

MIN_K_TILES_PER_SPLIT = 4  # a block's pipeline prologue is amortised over at least this many tiles
SMEM_PER_BLOCK_RESERVED = 1024  # the driver's per-block share of shared memory on sm_80+
# Static shared memory the kernels declare beside the ring (flags, alignment: ptxas reported 128
# bytes): kept out of the ring's budget, or a block sized to the 227 KB limit fails to launch.
STATIC_SHARED_RESERVE = 256
# Split-K through a thread block cluster (sm_90): the split_k blocks of an output tile exchange their
# partial sums in distributed shared memory. 8 is the portable cluster size; the cost is two cluster
# barriers and split_k x tile remote reads per block (the rates' launch.cluster_s).
MAX_CLUSTER = 8


@dataclass(frozen=True)
class TiledSpec(KernelSpec):
    dtype: str  # "f16" | "bf16": W, X
    out: str  # "f16" | "bf16" | "f32": Y
    m: int
    k: int
    n: int
    tile_m: int  # rows of a tile (64, 128 or 256); tiles are 64 columns wide
    bn: int  # columns of X and Y per block: 8, 16, 32 or 64
    split_k: int
    reduction: str  # "none" (split_k 1) | "atomic" | "two_step" | "cluster"
    bias: bool = False
    relu: bool = False
    min_blocks: int = 1  # __launch_bounds__ minimum resident blocks per SM: caps registers at 64K / (threads x this)
    warps: int = WARPS  # warps per block, each owning tile_m / warps rows (4, or 8: half the rows per warp)
    # k-groups the warps form (Tiled-CSL): warps // warp_k row groups x warp_k k-groups, each warp
    # multiplying its row group's rows over 1 / warp_k of each tile's k16 steps, so it loads only its
    # share of the X tile's B fragments; the groups' sums meet in shared memory before the epilogue
    warp_k: int = 1
    # Hopper's warpgroup MMA (sm_90a): each warpgroup's A fragments (registers) times the X tile read
    # by the tensor cores straight from shared memory, so no warp loads B fragments
    wgmma: bool = False
    # stream-K (reduction "stream"): this many resident blocks share the m_tiles x k_tiles tile
    # products evenly (no last partial wave); 0 for the split-K grid
    grid: int = 0

    def compile_arch(self, arch: str) -> str:
        """wgmma needs the architecture-specific target (sm_90 -> sm_90a)."""
        return arch + "a" if self.wgmma and arch[-1].isdigit() else arch

    @property
    def m_tiles(self) -> int:
        return -(-self.m // self.tile_m)

    @property
    def tile_cols(self) -> int:
        """Columns of a W tile: TILE_K (a family with wider tiles says so)."""
        return TILE_K

    @property
    def k_tiles(self) -> int:
        return -(-self.k // self.tile_cols)

    @property
    def n_tiles(self) -> int:
        return -(-self.n // self.bn)

    @property
    def kt_per_split(self) -> int:
        """k-tiles a block walks: its split of K, or with stream-K its share of all tile products."""
        if self.reduction == "stream":
            return -(-self.m_tiles * self.k_tiles // max(self.grid, 1))
        return -(-self.k_tiles // self.split_k)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def row_groups(self) -> int:
        return self.warps // self.warp_k

    @property
    def warp_rows(self) -> int:
        return self.tile_m // self.row_groups

    @property
    def mf(self) -> int:
        return self.warp_rows // 16

    @property
    def nf(self) -> int:
        return self.bn // 8

    @property
    def xv(self) -> int:
        """Halves of X per copy: the widest power of two <= 8 dividing N (rows stay aligned)."""
        return widest_vector(self.n, 2)

    @property
    def x_pieces(self) -> bool:
        """Whether the ring copies X with addresses set up once per block (`x_piece`): whole 16-byte
        pieces, and the mma.sync layout (wgmma's X tile is laid out for the tensor cores instead)."""
        return self.xv == 8 and not self.wgmma

    @property
    def exchange_bytes(self) -> int:
        """Shared memory the cluster reduction's exchange buffer takes (rows of BN + 8 floats)."""
        return self.tile_m * (self.bn if self.bn == 8 else self.bn + 8) * 4 if self.reduction == "cluster" else 0

    @property
    def k_group_bytes(self) -> int:
        """Shared memory the k-groups' partial sums take before the epilogue (warp_k > 1)."""
        return (self.warp_k - 1) * self.tile_m * self.bn * 4

    def base_name(self) -> str:
        out = f".o{self.out}" if self.out != self.dtype else ""
        if self.reduction == "stream":
            work = f".stream{self.grid}"
        else:
            work = f".sk{self.split_k}" + {"none": "", "atomic": "a", "two_step": "r", "cluster": "c"}[self.reduction]
        epi = epilogue_suffix(self.bias, self.relu)
        mb = f".mb{self.min_blocks}" if self.min_blocks > 1 else ""
        mb += f".w{self.warps}" if self.warps != WARPS else ""
        mb += f".wk{self.warp_k}" if self.warp_k != 1 else ""
        mb += ".wg" if self.wgmma else ""
        return (f"{self.family}.{self.dtype}{out}.m{self.m}k{self.k}n{self.n}.t{self.tile_m}x{self.tile_cols}"
                f".bn{self.bn}{work}{mb}"), epi

    def fields(self) -> dict:
        """Template variables: the fields plus the derived constants every template needs."""
        d = super().fields()
        d.update(units=self.m_tiles * self.k_tiles, m_tiles=self.m_tiles, k_tiles=self.k_tiles, n_tiles=self.n_tiles, kt_per_split=self.kt_per_split,
                 warps=self.warps, threads=self.threads, row_groups=self.row_groups, warp_rows=self.warp_rows, mf=self.mf, nf=self.nf, xv=self.xv,
                 x_pieces=self.x_pieces, tile_k=self.tile_cols)
        return d

    def to_dict(self) -> dict:
        return {"family": self.family, "name": self.name,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


@dataclass(frozen=True)
class TiledOptions(FamilyOptions):
    """The options both tile families take; each overrides the chooser (None: it chooses). Those
    that depend on the request (bn against N, blocks against the SM, combinations) are `gate`'s."""

    out: Literal[NAMES] | None = option(expected="the input dtype or 'float32'")  # Y's dtype
    warps: Literal[4, 8] = option(WARPS, expected="4 or 8")
    warp_k: Literal[1, 2, 4] = option(1, expected="1, 2 or 4 (k16 steps of a tile: 4)")
    wgmma: bool = option(False)
    l2_prefetch: bool = option(False)
    reduction: Literal[REDUCTIONS] | None = option()
    split_k: int | None = option(expected="a positive integer", valid=lambda v: v >= 1)
    blocks: int | None = option(expected="resident blocks per SM, a positive integer", valid=lambda v: v >= 1)
    tile_m: Literal[64, 128, 256] | None = option()
    bn: Literal[8, 16, 32, 64] | None = option()  # columns per block
    stages: int | None = option()  # ring depth (the family raises it to its least)


def block_n(n: int) -> int:
    """Columns per block: N rounded up to a power of two >= 8 (mma n8 fragments), at most 64."""
    bn = 8
    while bn < min(n, MAX_BN):
        bn *= 2
    return bn


def request_bn(request: Request) -> int:
    """Columns per block: options bn= (8, 16, 32 or 64, at most `block_n(n)`), else `block_n(n)`."""
    return int(request.option("bn", block_n(request.n)))


def request_warps(request: Request) -> int:
    """Warps per block the request asks for (options warps=), else WARPS."""
    return int(request.option("warps", WARPS))


CAP_BITS = 5  # significant bits a stage's capacity keeps (it grows by less than 1/2**(CAP_BITS - 1))


def shared_cap(fullest: int) -> int:
    """A stage's capacity for a plan whose fullest tile holds `fullest` units, rounded up to
    CAP_BITS significant bits. The capacity is a constant of the kernel's source, so the exact
    fullest tile would give every weight its own cubin; rounded, the weights of one shape and
    sparsity (a model's every layer) share one: a 32-layer decoder then compiles a kernel per
    shape and N, not one per layer. 846..861 -> 864, 443 -> 448, 452 -> 464."""
    fullest = max(int(fullest), 1)
    step = 1 << max(fullest.bit_length() - CAP_BITS, 0)
    return -(-fullest // step) * step


def with_shared_cap(fullest: int, build, fits):
    """`build(cap)` at the rounded capacity (`shared_cap`) where that spec `fits` the SM, else at
    the exact one: rounding never costs a ring that fits."""
    fullest = max(int(fullest), 1)
    cap = shared_cap(fullest)
    spec = build(cap)
    return spec if cap == fullest or fits(spec) else build(fullest)


MAX_ACCUMULATORS = 64  # fp32 accumulators per thread (MF x NF x 4) a spec may ask for: more spill


def accumulators(tile_m: int, bn: int, warps: int = WARPS, warp_k: int = 1) -> int:
    """fp32 accumulators per thread: the warp's m16 fragments x n8 fragments x 4."""
    return 4 * (tile_m // (warps // warp_k) // 16) * (bn // 8)


def request_warp_k(request: Request) -> int:
    """k-groups the request asks for (options warp_k=), else 1."""
    return int(request.option("warp_k", 1))


def wgmma_ok(request: Request) -> bool:
    """Warpgroup MMA exists on sm_90 (compiled for sm_90a) only."""
    return request.arch in ("sm_90", "sm_90a")


def request_wgmma(request: Request) -> bool:
    """Whether the kernel multiplies with wgmma (options wgmma=True/False; default off)."""
    return bool(request.option("wgmma", False))


# ---- the request gate both families share ------------------------------------------------------

def gate(stats, request: Request, options: type[TiledOptions] = TiledOptions):
    """None when the request suits tensor-core tiles, else the Decision that declines it;
    `options`: the family's options."""
    if request.op != "spmm":
        return decline(f"op {request.op!r} is not spmm")
    if request.dtype not in ("float16", "bfloat16"):
        return decline(f"dtype {request.dtype}: tensor-core tiles take float16/bfloat16 (m16n8k16 has no fp32 form)")
    bad = options.problem(request)
    if bad:
        return decline(bad)
    out = request.option("out")
    if out in ("float16", "bfloat16") and out != request.dtype:
        return decline(f"options out={out!r}: expected the input dtype or 'float32'")
    m, k = stats.shape
    if request.n > MAX_N and 2 * m * k > l2_resident_bytes(request.device):
        return decline(f"n={request.n} > {MAX_N} with W of {2 * m * k >> 20} MB as fp16 tiles: each 64-column "
                       f"tile re-reads W from memory; dense or CSR kernels suit wide X")
    if m == 0 or k == 0:
        return decline(f"empty shape {m}x{k}")
    if stats.density < MIN_DENSITY and request.option("family") is None:
        return decline(f"density {stats.density:.3f} < {MIN_DENSITY}: tile math on zeros would cost more "
                       f"than CSR kernels' work on the nonzeros")
    if 4 * (stats.nnz + 4 * stats.tiles.tiles) >= 2**33:
        return decline("encoding needs 64-bit offsets")
    warps = request_warps(request)
    warp_k = request_warp_k(request)
    if request_wgmma(request):
        if not wgmma_ok(request):
            return decline(f"options wgmma=True on {request.arch}: warpgroup MMA is sm_90's (sm_90a)")
        if request.option("l2_prefetch"):
            return decline("options wgmma=True with l2_prefetch=True: the wgmma pipeline has no L2 prefetch")
        if warp_k != 1:
            return decline(f"options wgmma=True with warp_k={warp_k}: a warpgroup's 4 warps share each k16 step")
    if request.option("reduction") == "stream":
        if request_wgmma(request) or warp_k != 1:
            return decline("options reduction='stream' with wgmma or k-groups: stream-K runs the mma.sync kernels "
                           "with one row group per warp")
        if request.option("split_k") is not None:
            return decline("options reduction='stream' with split_k=: stream-K shares all tile products among "
                           "the resident blocks instead of splitting K")
        if request.n > request_bn(request):
            return decline(f"options reduction='stream' with n={request.n} over {request_bn(request)}-column "
                           f"blocks: stream-K walks one column tile")
    blocks = request.option("blocks")
    limit = block_limit(32 * warps, request.device)
    if blocks is not None and blocks > limit:
        return decline(f"options blocks={blocks!r}: expected resident blocks per SM, an integer from 1 to "
                       f"{limit} for {warps}-warp blocks")
    row_groups = warps // warp_k
    if request.option("tile_m") is not None and request.option("tile_m") < 16 * row_groups:
        return decline(f"options tile_m={request.option('tile_m')} with {warps} warps in {row_groups} row groups: "
                       f"each group needs 16 rows")
    bn = request.option("bn")
    if bn is not None and bn > block_n(request.n):
        return decline(f"options bn={bn!r}: expected 8, 16, 32 or 64, at most {block_n(request.n)} "
                       f"(N = {request.n} rounded up to a power of two)")
    tile_m = request.option("tile_m") or 128  # the tallest height the chooser takes unasked
    acc = accumulators(tile_m, request_bn(request), warps, warp_k)
    if acc > MAX_ACCUMULATORS:
        return decline(f"options tile_m={tile_m}, warps={warps}, warp_k={warp_k} with {request_bn(request)} columns "
                       f"per block: {acc} fp32 accumulators per thread, at most {MAX_ACCUMULATORS} (spills); more "
                       f"row groups (options warps=8, fewer k-groups) divide them")
    return None


# ---- cost model -------------------------------------------------------------------------------

def tile_densities(stats) -> tuple[np.ndarray, np.ndarray, int]:
    """Density and count of the nonempty tiles per histogram bin (analysis tiles are 128 x 64),
    and the number of empty tiles. A bin's density is its tiles' mean (`TileStats.density_means`),
    or its centre for stats recorded without them."""
    t = stats.tiles
    hist = np.asarray(t.density_hist, dtype=np.float64)
    centers = (np.arange(hist.size) + 0.5) / hist.size
    if len(t.density_means) == hist.size:  # the bins' own means where the analyzer recorded them
        means = np.asarray(t.density_means, dtype=np.float64)
        centers = np.where(means > 0, means, centers)
    empty = t.tiles - t.nonempty
    hist[0] -= empty
    if hist.sum() > 0:  # scale centers so the mean matches the true density exactly
        centers = centers * (stats.density * t.tiles / max(float((hist * centers).sum()), 1e-12))
    return np.clip(centers, 0.0, 1.0), hist, empty


def w_bytes(stats, tile_m: int, bytes_fn, empty_bytes: float) -> float:
    """Bytes of one pass over W in a tile format: `bytes_fn(nnz)` per nonempty tile, summed over the
    analysed tile-density histogram (scaled to `tile_m`), and `empty_bytes` per empty tile."""
    dens, counts, empty = tile_densities(stats)
    per_tile = bytes_fn(dens * (tile_m * TILE_K))
    return stats.tiles.tile_rows / tile_m * (float((per_tile * counts).sum()) + empty * empty_bytes)


# ---- split-K ----------------------------------------------------------------------------------

def l2_resident_bytes(device) -> int:
    """The most bytes of W that stay resident in the device's L2 across column tiles (L2_SHARE)."""
    return device.l2_bytes * L2_SHARE[0] // L2_SHARE[1]


def block_limit(threads: int, device) -> int:
    """Resident blocks of `threads` threads the SM's thread slots allow."""
    return device.max_threads_per_sm // threads


def register_blocks(regs: int, device, warps: int = WARPS) -> int:
    """Resident blocks of `warps` warps whose `regs` registers per thread (allocated in units of 8)
    fit the SM's register file."""
    return device.registers_per_sm // (32 * warps * (-(-regs // 8) * 8))


# Bytes in flight per SM the ring depth aims at (a ring slot's W data and X tile): an SM's share of
# HBM bandwidth (~22 GB/s) times the loaded memory latency (~1.5 us), with margin.
IN_FLIGHT_BYTES = 48 * 1024


def smem_budget(blocks: int, device) -> int:
    """Shared memory per block that leaves room for `blocks` resident blocks per SM."""
    return device.shared_per_sm // blocks - SMEM_PER_BLOCK_RESERVED - STATIC_SHARED_RESERVE


def ring_shape(fixed: int, per_stage: int, tile_bytes: float, regs: int, min_stages: int, max_stages: int,
               max_blocks: int, forced_stages: int | None = None, warps: int = WARPS,
               forced_blocks: int | None = None, *, device) -> tuple[int, int]:
    """(resident blocks per SM, ring depth) of a block with `fixed` + stages x `per_stage` bytes of
    shared memory and `regs` registers per thread, streaming `tile_bytes` per stage: the most blocks
    (at most `max_blocks`, as registers allow) whose ring keeps IN_FLIGHT_BYTES per SM moving with the
    fewest stages that fit; failing that, fewer blocks with the deepest ring that fits. Blocks have
    `warps` warps; registers are allocated in units of 8 per thread. `forced_blocks` (options blocks=,
    or a family's measured default) replaces the register estimate: __launch_bounds__ holds ptxas to
    the registers that many blocks leave, and only shared memory may lower it. The SM is `device`'s."""
    threads = 32 * warps
    reg_blocks = max(1, min(block_limit(threads, device), max_blocks, register_blocks(regs, device, warps)))
    if forced_blocks is not None:
        reg_blocks = max(1, min(block_limit(threads, device), forced_blocks))
    for blocks in range(reg_blocks, 0, -1):
        need = -(-IN_FLIGHT_BYTES // max(1, int(blocks * tile_bytes))) + 1
        stages = forced_stages or min(max_stages, max(min_stages, need))
        budget = smem_budget(blocks, device)
        if fixed + stages * per_stage <= budget and (forced_stages or stages >= need or blocks == 1):
            return blocks, stages
        if forced_stages is None and blocks <= 2:  # keep two blocks if a deepest-fitting ring allows
            deepest = min(max_stages, (budget - fixed) // max(per_stage, 1))
            if deepest >= min_stages:
                return blocks, deepest
    return 1, forced_stages or min_stages


@dataclass(frozen=True)
class Split:
    tile_m: int
    split_k: int
    reduction: str
    reason: str
    blocks: int | None = None  # resident blocks per SM chosen above the family's estimate, else None


# The wave model, for wide blocks (N = 64): a latency-bound SM holding k blocks runs them at a
# throughput k / (k + h), h the rates' tiles.occupancy_h, so a last partial wave of one block costs
# nearly what a full one does; 64-row tiles run tiles.tall_64_wide x slower than 128-row ones (each
# warp reuses an X fragment for one m16 fragment instead of two); a second reduction launch costs
# tiles.wide_two_step_scale x its two-step estimate (fitted: docs/decisions/001-rates-files.md).
REFERENCE_BLOCKS = 3  # the residency kernel_s is costed at (the skinny rates' kernels at N = 64)


def partial_wave_factor(grid: int, sms: int, resident: int, h: float) -> float:
    """A grid short of one wave of `resident` blocks per SM, relative to the same work at full
    residency: its busiest SM runs ceil(grid / sms) blocks at the lower throughput of that many
    (the wave model's k / (k + h)). 1 from one full wave on (narrow blocks' rates were fitted there)."""
    if grid >= sms * resident:
        return 1.0
    busiest = -(-grid // sms)
    return (busiest + h) * sms * resident / (grid * (resident + h))


def wave_factor(grid: int, sms: int, resident: int, h: float) -> float:
    """Time of `grid` blocks with `resident` per SM, relative to the same work spread evenly at
    REFERENCE_BLOCKS per SM: the busiest SM runs ceil(grid / sms) blocks in waves of `resident`, a
    wave of k blocks taking (k + h) block-times at the reference throughput."""
    per_sm = -(-grid // sms)
    full, rest = divmod(per_sm, resident)
    waves = full * (resident + h) + (rest + h if rest else 0.0)
    return sms / grid * REFERENCE_BLOCKS / (REFERENCE_BLOCKS + h) * waves


def reduction_seconds(split: int, m: int, n: int, rates) -> tuple[float, float]:
    """(atomic, two-step) predicted cost of reducing `split` partial sums of an M x N output."""
    mem = rates.memory
    partial = 4.0 * split * m * n
    atomic = partial / mem.atomic_bytes_per_s + 8.0 * m * n / mem.copy_bytes_per_s  # reds, then read and clear
    two_step = rates.launch.launch_s + 2 * partial / mem.copy_bytes_per_s  # a launch, write and read the partials
    return atomic, two_step


def stream_reduction_seconds(spec: TiledSpec, rates) -> float:
    """Stream-K's atomics: a block's range of tile products cuts at most two m-tiles short (more when
    its share is under an m-tile's k-tiles), each such piece reduced as a split-K partial sum."""
    pieces = spec.grid + min(spec.grid, spec.m_tiles)  # m-tiles fewer than blocks: each cut where it ends
    partial = 4.0 * pieces * spec.tile_m * spec.n
    return partial / rates.memory.atomic_bytes_per_s + 8.0 * spec.m * spec.n / rates.memory.copy_bytes_per_s


def wide_two_step_seconds(split: int, m: int, n: int, rates) -> float:
    """What the wave model charges a second launch reducing `split` partial sums of wide blocks."""
    return rates.tiles.wide_two_step_scale * reduction_seconds(split, m, n, rates)[1]


def wide_two_step(spec: TiledSpec) -> bool:
    """Wide blocks (bn > NARROW_BN) whose split-K partial sums a second launch reduces: the
    reduction `modelled_split` takes for them."""
    return spec.reduction == "two_step" and spec.bn > NARROW_BN


def spec_reduction_seconds(spec: TiledSpec, rates) -> float:
    """Predicted cost of the reduction `spec` makes (0 without split-K). Wide blocks reduced by a
    second launch: tiles.wide_two_step_scale x the two-step estimate (its partial sums' writes are
    not hidden behind the main loop)."""
    if spec.reduction == "stream":
        return stream_reduction_seconds(spec, rates)
    if spec.split_k == 1 or spec.reduction == "none":
        return 0.0
    if wide_two_step(spec):
        return wide_two_step_seconds(spec.split_k, spec.m, spec.n, rates)
    if spec.reduction == "cluster":
        return rates.launch.cluster_s
    atomic, two_step = reduction_seconds(spec.split_k, spec.m, spec.n, rates)
    return atomic if spec.reduction == "atomic" else two_step


def cluster_ok(request: Request) -> bool:
    """Thread block clusters exist from sm_90 on."""
    digits = "".join(ch for ch in request.arch if ch.isdigit())
    return bool(digits) and int(digits) >= 90


def split_reduction_seconds(split: int, m: int, n: int, cluster: bool, rates) -> tuple[str, float]:
    """The cheapest way to reduce `split` partial sums, and its predicted cost."""
    if split == 1:
        return "none", 0.0
    if cluster and split <= MAX_CLUSTER:
        return "cluster", rates.launch.cluster_s
    atomic, two_step = reduction_seconds(split, m, n, rates)
    return ("atomic", atomic) if atomic <= two_step else ("two_step", two_step)


def usable_heights(heights: tuple, request: Request) -> tuple:
    """The tile heights that give each of the request's warps whole m16 fragments."""
    return tuple(h for h in heights if h >= 16 * request_warps(request) // request_warp_k(request))


# Narrow blocks (bn <= 32): split-K measured on the H100 (probes/tiled_probe_split.txt: 4 OPT shapes
# with K 7168-9216, M 7168-28672, 70 and 90 %, N 8-32, splits 1-28 with atomics): about 16 k-tiles
# (K = 1024) per split was fastest or within 5 % of it for both families at every M, and fp32
# atomics beat the thread block cluster's reduction at the same split (CSL by up to 1.5x: a cluster
# is scheduled only when all of its blocks fit in one GPC at once, so SMs wait for slots). Wide
# blocks (bn = 64) move 4x the partial sums: the cost model below chooses their split, and
# WIDE_REDUCTION reduces it (probes/tiled_probe_reduction*.txt: over 46 OPT cases at N = 64, 70 and
# 90 %, the same split reduced by a second launch beat the thread block cluster by 1.13x (Tiled-CSL)
# and 1.17x (bitmap) geomean, and fp32 atomics by 1.17x / 1.13x; at N = 16 / 32 atomics were within
# 1-4 % of it, so narrow blocks keep them).
KT_PER_SPLIT_TARGET = 16
NARROW_BN = 32
# Stream-K instead of a split-K grid of more than one wave (probes/tiled_probe_stream{1,2}.txt: 6 OPT
# shapes at 70 and 90 %, N 8-64, each variant with its split-K grid and with stream-K; time ratios
# stream / split): Tiled-CSL at N <= 32 past one wave faster in 31 of 31 (0.82-1.00, geomean 0.92:
# fewer blocks, fewer prologues zeroing its W buffers); bitmap at 32 columns past one wave faster in
# 17 of 20 (0.76-1.01, geomean 0.93; 9216^2's grid of 1.23 waves lost the most to its last wave).
# Not taken: bitmap at 8 and 16 columns (single elements 1.03 geomean, up to 1.09; register pairs
# 0.94 at 70 % but 1.05 at 90 %), any family at 64 columns (1.09 geomean, up to 1.22: fp32 partial
# sums 4x wider), and grids within one wave (1.03 geomean).
STREAM_BNS = {"tiled_csl_spmm": (8, 16, 32), "tiled_bitmap_spmm": (32,)}
WIDE_REDUCTION = "two_step"


def choose_split(stats, request: Request, n: int, bn: int, resident: int, kernel_s: float,
                 heights: tuple = (128, 64), stream_bns: tuple = (), residencies: tuple = ()) -> Split:
    """Tile height, split-K factor and reduction, from M, K, N, the SM count and residency.

    Narrow blocks (bn <= NARROW_BN, unless options force a split or reduction): the tallest tile that
    fits M, split-K so that each split walks about KT_PER_SPLIT_TARGET k-tiles (raised until the
    blocks cover every SM, when M is short), reduced by fp32 atomics (or a second launch where
    `reduction_seconds` predicts that cheaper). Otherwise `modelled_split`, which also picks the
    residency among `residencies` (the family's estimate, and one more block where it offers one).
    Stream-K (`stream_split`)
    where asked for, and unasked for narrow blocks of a width in `stream_bns` (the family's) whose
    split-K grid would run past one wave of `resident` blocks per SM (STREAM_BNS says why)."""
    if request_stream(request):
        return stream_split(stats, request, heights)
    m, k = stats.shape
    forced = request.option("split_k") is not None or request.option("reduction") not in (None, "atomic")
    if bn > NARROW_BN or forced:
        return modelled_split(stats, request, n, bn, resident, kernel_s, heights, residencies)
    sms = request.device.sm_count
    tile_m = request.option("tile_m") or next((h for h in usable_heights(heights, request)
                                     if h <= max(m, 64)), 16 * request_warps(request))
    k_tiles = -(-k // TILE_K)
    max_split = max(1, k_tiles // MIN_K_TILES_PER_SPLIT)
    tiles = -(-m // tile_m) * -(-n // bn)
    split = min(max_split, max(1, round(k_tiles / KT_PER_SPLIT_TARGET)))
    while tiles * split < sms and split < max_split:
        split += 1
    split = max(1, -(-k_tiles // -(-k_tiles // split)))  # no empty split
    if bn in stream_bns and n <= bn and tiles * split > sms * resident and request.option("reduction") is None:
        chosen = stream_split(stats, request, heights)
        return dataclasses.replace(chosen, reason=f"{tiles} output tiles x split-K {split} would be {tiles * split} "
                                                  f"blocks for {sms} SMs x {resident} resident, past one wave; "
                                                  + chosen.reason)
    why = (f"{tiles} output tiles x split-K {split} ({-(-k_tiles // split)} of {k_tiles} k-tiles each, "
           f"target {KT_PER_SPLIT_TARGET}) = {tiles * split} blocks for {sms} SMs x {resident} resident")
    if split == 1:
        return Split(tile_m, 1, "none", why)
    atomic_s, two_step_s = reduction_seconds(split, m, n, request.device.rates)
    if request.option("reduction") == "atomic" or atomic_s <= two_step_s:
        return Split(tile_m, split, "atomic", why + f"; reduce through in-kernel fp32 atomics, the last block of "
                                                     f"each tile finishes (~{atomic_s * 1e6:.1f} us; measured faster "
                                                     f"than a cluster for narrow blocks)")
    return Split(tile_m, split, "two_step", why + f"; reduce through a second, deterministic launch "
                                                  f"(~{two_step_s * 1e6:.1f} us)")


def request_blocks(request: Request) -> int | None:
    """Resident blocks per SM asked for (options blocks=), or None: the family's estimate decides."""
    blocks = request.option("blocks")
    return None if blocks is None else int(blocks)


def request_stream(request: Request) -> bool:
    """Whether the request asks for stream-K (options reduction='stream')."""
    return request.option("reduction") == "stream"


def stream_split(stats, request: Request, heights: tuple = (128, 64)) -> Split:
    """Stream-K: the tallest tile height that fits M; the resident blocks (`stream_grid`) share the
    tile products, partial m-tiles meet through fp32 atomics."""
    m, _ = stats.shape
    tile_m = request.option("tile_m") or next((h for h in usable_heights(heights, request) if h <= max(m, 64)),
                                              16 * request_warps(request))
    return Split(tile_m, 1, "stream", "stream-K: every resident block walks an equal share of the m-tiles' k-tiles "
                                      "(no partial last wave); an m-tile shared by blocks is summed by fp32 atomics, "
                                      "the block completing its k-tiles finishes it")


def stream_grid(m_tiles: int, k_tiles: int, resident: int, sms: int) -> int:
    """Blocks of a stream-K launch: every resident slot (SMs x `resident`), each with at least
    MIN_K_TILES_PER_SPLIT tile products."""
    return max(1, min(sms * resident, m_tiles * k_tiles // MIN_K_TILES_PER_SPLIT))


def with_stream_grid(spec: TiledSpec, sms: int) -> TiledSpec:
    """A stream-K spec with its blocks set for its residency (`stream_grid`); other specs unchanged."""
    if spec.reduction != "stream":
        return spec
    return dataclasses.replace(spec, grid=stream_grid(spec.m_tiles, spec.k_tiles, spec.min_blocks, sms))


def modelled_split(stats, request: Request, n: int, bn: int, resident: int, kernel_s: float,
                   heights: tuple = (128, 64), residencies: tuple = ()) -> Split:
    """Wide blocks, or a split/reduction forced by options: the tile height, split S and residency r
    (of `residencies`, default just `resident`) minimising

      kernel_s x `wave_factor`(B blocks, r) x (tall_64_wide for 64-row tiles of wide blocks, else 1.05)
      + the reduction of S partial sums,

    with B = m_tiles x n_tiles x S and kernel_s the cost model's time with every SM busy. The
    reduction: for wide blocks (bn > NARROW_BN) a second, deterministic launch (WIDE_REDUCTION:
    measured faster than the cluster and than atomics), charged wide_two_step_scale x its bytes; for
    narrow blocks (here only when options force a split), through a thread block cluster's shared
    memory for S <= 8 on sm_90 (no workspace, deterministic), else fp32 atomics into a self-cleaning
    workspace (the last block of each output tile finishes) or a second launch, whichever
    `reduction_seconds` predicts cheaper. A reduction asked for in options is kept. Every split keeps at least
    MIN_K_TILES_PER_SPLIT k-tiles. The rates (tiles.*, the reductions') are the request's device's."""
    m, k = stats.shape
    sms, rates = request.device.sm_count, request.device.rates
    n_tiles = -(-n // bn)
    k_tiles = -(-k // TILE_K)
    max_split = max(1, k_tiles // MIN_K_TILES_PER_SPLIT)
    heights = ((request.option("tile_m"),) if request.option("tile_m")
               else tuple(h for h in usable_heights(heights, request) if h <= max(m, 64)))
    heights = heights or (16 * request_warps(request),)
    forced = request.option("split_k")
    forced_reduction = request.option("reduction")
    cluster = cluster_ok(request) and forced_reduction in (None, "cluster")
    splits = (min(int(forced), k_tiles),) if forced is not None else range(1, max_split + 1)
    wide = bn > NARROW_BN and forced_reduction is None

    def reduction_s(split: int) -> float:
        if split == 1:
            return 0.0
        if wide:
            return wide_two_step_seconds(split, m, n, rates)
        return split_reduction_seconds(split, m, n, cluster, rates)[1]

    def predicted(tile_m: int, split: int, blocks: int) -> float:
        grid = -(-m // tile_m) * n_tiles * split
        short = (rates.tiles.tall_64_wide if bn > NARROW_BN else 1.05) if tile_m == 64 else 1.0
        return kernel_s * short * wave_factor(grid, sms, blocks, rates.tiles.occupancy_h) + reduction_s(split)

    candidates = [(h, s, r) for h in heights for s in splits for r in (residencies or (resident,))]
    tile_m, split, blocks = min(candidates, key=lambda c: (predicted(*c), c[1], -c[0], c[2]))
    best_s = predicted(tile_m, split, blocks)
    split = max(1, -(-k_tiles // -(-k_tiles // split)))  # no empty split
    tiles = -(-m // tile_m) * n_tiles
    more = blocks if blocks != resident else None
    why = (f"{tiles} output tiles x split-K {split} = {tiles * split} blocks for {sms} SMs x {blocks} resident"
           f"{' (split_k as asked)' if forced is not None else ''}"
           f"{f' (one more than registers would allow unasked: ptxas is held to {request.device.registers_per_sm // (blocks * 32 * request_warps(request))})' if more else ''}"
           f"; predicted {best_s * 1e6:.1f} us")
    if split == 1:
        return Split(tile_m, 1, "none", why, more)
    if forced_reduction is None and bn > NARROW_BN:
        reduction = WIDE_REDUCTION
        why += f"; {bn}-column blocks: a second launch measured faster than a cluster or atomics"
    else:
        reduction, _ = split_reduction_seconds(split, m, n, cluster, rates)
    if forced_reduction not in (None, "none") and (forced_reduction != "cluster" or cluster_ok(request)):
        reduction = forced_reduction
    if reduction == "cluster" and split > MAX_CLUSTER:
        reduction = min(("atomic", "two_step"), key=lambda r: reduction_seconds(split, m, n, rates)[r == "two_step"])
    atomic_s, two_step_s = reduction_seconds(split, m, n, rates)
    how = {"atomic": f"in-kernel fp32 atomics, the last block of each tile finishes (~{atomic_s * 1e6:.1f} us)",
           "two_step": f"a second, deterministic reduction launch (~{two_step_s * 1e6:.1f} us)",
           "cluster": f"a {split}-block thread block cluster's shared memory (deterministic, no workspace)"}[reduction]
    why += f"; reduce through {how}"
    return Split(tile_m, split, reduction, why, more)


# ---- launch, operands, steps ------------------------------------------------------------------

def out_dtype(request: Request) -> str:
    return short_name(request.option("out") or request.dtype)


def main_args(spec: TiledSpec, format_args: tuple) -> tuple:
    args = list(format_args) + [Arg("x", "input")]
    if spec.reduction != "two_step":
        if spec.bias:
            args.append(Arg("bias", "plan"))
        args.append(Arg("y", "output"))
    if spec.reduction in ("atomic", "two_step", "stream"):
        args.append(Arg("workspace", "scratch"))
    if spec.reduction in ("atomic", "stream"):
        args.append(Arg("counters", "scratch"))
    return tuple(args)


def steps(spec: TiledSpec, format_args: tuple, kernel: str, shared_bytes: int) -> tuple:
    grid = (spec.grid, 1, 1) if spec.reduction == "stream" else (spec.n_tiles, spec.m_tiles, spec.split_k)
    main = Step(kernel, main_args(spec, format_args), Launch(grid, (spec.threads, 1, 1), shared_bytes))
    if spec.reduction != "two_step":
        return (main,)
    args = (Arg("workspace", "scratch"),) + ((Arg("bias", "plan"),) if spec.bias else ()) + (Arg("y", "output"),)
    return (main, Step(f"{kernel}_reduce", args, Launch((-(-spec.m * spec.n // 256), 1, 1), (256, 1, 1), 0)))


def scratch_constants(spec: TiledSpec) -> dict:
    """Device buffers the runtime allocates zeroed once per kernel (kind "scratch")."""
    partials = {"none": 0, "cluster": 0, "atomic": 1, "stream": 1, "two_step": spec.split_k}[spec.reduction]
    ws = partials * spec.m * spec.n
    counters = spec.m_tiles * spec.n_tiles if spec.reduction in ("atomic", "stream") else 0
    return {"workspace_bytes": 4 * ws, "counters_bytes": 4 * counters}


def operands(spec: TiledSpec, plan) -> tuple:
    return (Operand("x", (spec.k, spec.n), long_name(spec.dtype)),), Operand("y", (spec.m, spec.n), long_name(spec.out))


def emulate_operands(spec: TiledSpec, plan) -> tuple:
    """What the NumPy emulator takes: NumPy has no bfloat16, so bf16 X comes as float32 (rounded to
    bf16 on entry) and bf16 Y leaves as float32 holding bf16-rounded values."""
    (x,), y = operands(spec, plan)
    return ((Operand("x", x.shape, DTYPES[x.dtype].host.name),),
            Operand("y", y.shape, DTYPES[y.dtype].host.name))


def alignment(spec: TiledSpec) -> int:
    """X is copied in `xv`-half pieces; Y written in pairs when N is even."""
    pair = 2 * (4 if spec.out == "f32" else 2) if spec.n % 2 == 0 else 1
    return max(2 * spec.xv, pair)


def with_scratch(plan, spec: TiledSpec):
    from ..formats import Plan

    return Plan(plan.format, plan.arrays, {**plan.constants, **scratch_constants(spec)})
