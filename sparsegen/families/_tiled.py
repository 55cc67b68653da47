"""What the two tensor-core tile families (`tiled_csl_spmm`, `tiled_bitmap_spmm`) share: the spec
fields, the request gate, launch geometry, split-K and its reduction, and the cost model that
chooses between them.

Both compute Y = W·X (+ bias per row, ReLU) for a W of fp16/bf16 cut into `tile_m` x 64 tiles and a
skinny row-major X (K x N, N <= 256): a block of 4 warps owns one row tile and one column tile of
`bn` <= 64 columns, walks its share of K (split-K), and multiplies with `mma.sync.m16n8k16`
(fp32 accumulation). Each warp owns `tile_m / 4` rows, so every A fragment is decoded once.

The cost model (per-SM cycles of one tile: the larger of its bytes over the SM's share of HBM
bandwidth and its warp instructions over the issue rate) uses estimates for the H100 that the
`llm` benchmark should calibrate; it picks between the two formats, the split-K factor and the
reduction, and every choice is stated in the selection's reason.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..formats.tiling import TILE_K
from .base import Arg, KernelSpec, Launch, Operand, Request, Step, decline, epilogue_suffix, sm_count, widest_vector

WARPS = 4
THREADS = WARPS * 32
MAX_N = 256  # skinny products only: past this, W is re-read per 64-column tile and dense GEMM wins
MAX_BN = 64  # columns per block: MF x NF x 4 fp32 accumulators per thread stay <= 64 (tile_m 128)
MIN_DENSITY = 0.05  # below this, tile math on zeros costs more than CSR kernels' work on nonzeros
DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
DTYPE_LONG = {v: k for k, v in DTYPE_SHORT.items()}
REDUCTIONS = ("none", "atomic", "two_step")

# ---- H100 estimates (calibrate with `sparsegen bench llm`) ----------------------------------
HBM_BYTES_PER_S = 3.0e12  # measured copy bandwidth 2.96 TB/s
CLOCK_HZ = 1.755e9
ISSUE_PER_SM_CYCLE = 2.5  # warp instructions per SM cycle sustained (4 schedulers, ~60 %)
LAUNCH_S = 3e-6  # a dependent second launch on the same stream
ATOMIC_BYTES_PER_S = 1.5e12  # fp32 reductions at L2, 8-byte red.v2 per pair of outputs
MIN_K_TILES_PER_SPLIT = 4  # a block's pipeline prologue is amortised over at least this many tiles
SMEM_PER_SM = 228 * 1024
REGS_PER_SM = 65536
MAX_BLOCKS_PER_SM = 16


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
    reduction: str  # "none" (split_k 1) | "atomic" | "two_step"
    bias: bool = False
    relu: bool = False

    @property
    def m_tiles(self) -> int:
        return -(-self.m // self.tile_m)

    @property
    def k_tiles(self) -> int:
        return -(-self.k // TILE_K)

    @property
    def n_tiles(self) -> int:
        return -(-self.n // self.bn)

    @property
    def kt_per_split(self) -> int:
        return -(-self.k_tiles // self.split_k)

    @property
    def warp_rows(self) -> int:
        return self.tile_m // WARPS

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

    def base_name(self) -> str:
        out = f".o{self.out}" if self.out != self.dtype else ""
        red = {"none": "", "atomic": "a", "two_step": "r"}[self.reduction]
        epi = epilogue_suffix(self.bias, self.relu)
        return (f"{self.family}.{self.dtype}{out}.m{self.m}k{self.k}n{self.n}.t{self.tile_m}x{TILE_K}"
                f".bn{self.bn}.sk{self.split_k}{red}"), epi

    def fields(self) -> dict:
        """Template variables: the fields plus the derived constants every template needs."""
        d = super().fields()
        d.update(m_tiles=self.m_tiles, k_tiles=self.k_tiles, n_tiles=self.n_tiles, kt_per_split=self.kt_per_split,
                 warps=WARPS, threads=THREADS, warp_rows=self.warp_rows, mf=self.mf, nf=self.nf, xv=self.xv,
                 tile_k=TILE_K)
        return d

    def to_dict(self) -> dict:
        return {"family": self.family, "name": self.name,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


def block_n(n: int) -> int:
    """Columns per block: N rounded up to a power of two >= 8 (mma n8 fragments), at most 64."""
    bn = 8
    while bn < min(n, MAX_BN):
        bn *= 2
    return bn


# ---- the request gate both families share ------------------------------------------------------

def gate(stats, request: Request):
    """None when the request suits tensor-core tiles, else the Decision that declines it."""
    if request.op != "spmm":
        return decline(f"op {request.op!r} is not spmm")
    if request.dtype not in ("float16", "bfloat16"):
        return decline(f"dtype {request.dtype}: tensor-core tiles take float16/bfloat16 (m16n8k16 has no fp32 form)")
    out = request.option("out")
    if out not in (None, "float16", "bfloat16", "float32") or (out in ("float16", "bfloat16") and out != request.dtype):
        return decline(f"options out={out!r}: expected the input dtype or 'float32'")
    if request.n > MAX_N:
        return decline(f"n={request.n} > {MAX_N}: skinny kernels re-read W per 64-column tile; "
                       f"dense or CSR kernels suit wide X")
    m, k = stats.shape
    if m == 0 or k == 0:
        return decline(f"empty shape {m}x{k}")
    if stats.density < MIN_DENSITY and request.option("family") is None:
        return decline(f"density {stats.density:.3f} < {MIN_DENSITY}: tile math on zeros would cost more "
                       f"than CSR kernels' work on the nonzeros")
    if 4 * (stats.nnz + 4 * stats.tiles.tiles) >= 2**33:
        return decline("encoding needs 64-bit offsets")
    for name, allowed in (("tile_m", (64, 128, 256)), ("split_k", None), ("reduction", REDUCTIONS)):
        value = request.option(name)
        if value is None:
            continue
        if name == "split_k" and not (isinstance(value, int) and value >= 1):
            return decline(f"options split_k={value!r}: expected a positive integer")
        if allowed is not None and value not in allowed:
            return decline(f"options {name}={value!r}: expected one of {allowed}")
    if request.option("tile_m") == 256 and block_n(request.n) > 32:
        return decline("options tile_m=256 with 64 columns per block needs 128 accumulators per thread (spills)")
    return None


# ---- cost model -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """Predicted per-SM cycles and bytes of one pass over W (all tiles, one column tile)."""

    cycles: float  # summed over tiles, per SM-cycle units (divide by SMs for wall time)
    bytes: float

    def seconds(self, sms: int) -> float:
        return self.cycles / sms / CLOCK_HZ


def tile_densities(stats) -> tuple[np.ndarray, np.ndarray, int]:
    """Density and count of the nonempty tiles per histogram bin (analysis tiles are 128 x 64),
    and the number of empty tiles."""
    t = stats.tiles
    hist = np.asarray(t.density_hist, dtype=np.float64)
    centers = (np.arange(hist.size) + 0.5) / hist.size
    empty = t.tiles - t.nonempty
    hist[0] -= empty
    if hist.sum() > 0:  # scale centers so the mean matches the true density exactly
        centers = centers * (stats.density * t.tiles / max(float((hist * centers).sum()), 1e-12))
    return np.clip(centers, 0.0, 1.0), hist, empty


def tile_cost(bytes_per_tile, issue_per_tile, sms: int) -> np.ndarray:
    bytes_per_cycle = HBM_BYTES_PER_S / (sms * CLOCK_HZ)
    return np.maximum(np.asarray(bytes_per_tile) / bytes_per_cycle, np.asarray(issue_per_tile) / ISSUE_PER_SM_CYCLE)


def mma_issue(tile_m: int, bn: int) -> float:
    """Warp instructions of the dense math of one tile: mma, ldmatrix of X fragments, loop."""
    ksteps = TILE_K // 16
    return (tile_m // 16) * ksteps * (bn // 8) + WARPS * ksteps * max(1, bn // 16) + 40


def predict(stats, tile_m: int, bn: int, n_tiles: int, sms: int, bytes_fn, issue_fn, empty_bytes, empty_issue):
    """Sum the per-tile cost over the analysed tile-density histogram (scaled to `tile_m`)."""
    dens, counts, empty = tile_densities(stats)
    scale = stats.tiles.tile_rows / tile_m  # number of our tiles per analysis tile
    area = tile_m * TILE_K
    nnz = dens * area
    b = bytes_fn(nnz)
    issue = (issue_fn(nnz) + mma_issue(tile_m, bn)) * n_tiles
    cyc = tile_cost(b, issue, sms)
    empty_cyc = float(tile_cost(empty_bytes, empty_issue, sms))
    total_cycles = scale * (float((cyc * counts).sum()) + empty * empty_cyc)
    total_bytes = scale * (float((b * counts).sum()) + empty * empty_bytes)
    return Cost(total_cycles, total_bytes)


# ---- split-K ----------------------------------------------------------------------------------

def resident_blocks(regs_per_thread: int, smem_bytes: int) -> int:
    regs = -(-regs_per_thread // 8) * 8
    return max(1, min(MAX_BLOCKS_PER_SM, REGS_PER_SM // (regs * THREADS), SMEM_PER_SM // (smem_bytes + 1024)))


@dataclass(frozen=True)
class Split:
    tile_m: int
    split_k: int
    reduction: str
    reason: str


def reduction_seconds(split: int, m: int, n: int) -> tuple[float, float]:
    """(atomic, two-step) predicted cost of reducing `split` partial sums of an M x N output."""
    partial = 4.0 * split * m * n
    atomic = partial / ATOMIC_BYTES_PER_S + 8.0 * m * n / HBM_BYTES_PER_S  # reds, then read and clear
    two_step = LAUNCH_S + 2 * partial / HBM_BYTES_PER_S  # a launch, write and read the partials
    return atomic, two_step


def choose_split(stats, request: Request, n: int, bn: int, resident: int, w_bytes: float, kernel_s: float) -> Split:
    """Tile height, split-K factor and reduction, from M, K, N and the SM count.

    Predicted time of (tile_m, S) = kernel_s / min(1, blocks / (resident x SMs)) + the cheaper
    reduction of S partial sums (none for S = 1), where kernel_s is the cost model's time with every
    SM busy; 64-row tiles pay ~5 % more per byte (twice the tiles). Every split keeps at least
    MIN_K_TILES_PER_SPLIT k-tiles. The reduction: fp32 atomics into a self-cleaning workspace,
    finished in-kernel by the last block of each output tile (one launch), or a second,
    deterministic launch that sums the partials, whichever `reduction_seconds` predicts cheaper."""
    m, k = stats.shape
    sms = sm_count(request.arch)
    target = resident * sms
    n_tiles = -(-n // bn)
    k_tiles = -(-k // TILE_K)
    max_split = max(1, k_tiles // MIN_K_TILES_PER_SPLIT)
    heights = (request.option("tile_m"),) if request.option("tile_m") else ((128, 64) if m > 64 else (64,))
    forced = request.option("split_k")
    splits = (min(int(forced), k_tiles),) if forced is not None else range(1, max_split + 1)

    def predicted(tile_m: int, split: int) -> float:
        blocks = -(-m // tile_m) * n_tiles * split
        t = kernel_s * (1.05 if tile_m == 64 else 1.0) / min(1.0, blocks / target)
        return t + (min(reduction_seconds(split, m, n)) if split > 1 else 0.0)

    tile_m, split = min(((h, s) for h in heights for s in splits), key=lambda hs: (predicted(*hs), hs[1], -hs[0]))
    split = max(1, -(-k_tiles // -(-k_tiles // split)))  # no empty split
    blocks = -(-m // tile_m) * n_tiles
    why = (f"{blocks} output tiles x split-K {split} = {blocks * split} blocks for {sms} SMs x {resident} resident"
           f"{' (split_k as asked)' if forced is not None else ''}; predicted {predicted(tile_m, split) * 1e6:.1f} us")
    if split == 1:
        return Split(tile_m, 1, "none", why)
    atomic_s, two_step_s = reduction_seconds(split, m, n)
    reduction = request.option("reduction") or ("atomic" if atomic_s <= two_step_s else "two_step")
    if reduction == "none":
        reduction = "atomic"
    how = {"atomic": "in-kernel fp32 atomics, the last block of each tile finishes",
           "two_step": "a second, deterministic reduction launch"}[reduction]
    why += f"; reduce by {how} (atomics ~{atomic_s * 1e6:.1f} us vs reduction step ~{two_step_s * 1e6:.1f} us)"
    return Split(tile_m, split, reduction, why)


# ---- launch, operands, steps ------------------------------------------------------------------

def out_dtype(request: Request) -> str:
    return DTYPE_SHORT[request.option("out") or request.dtype]


def main_args(spec: TiledSpec, format_args: tuple) -> tuple:
    args = list(format_args) + [Arg("x", "input")]
    if spec.reduction != "two_step":
        if spec.bias:
            args.append(Arg("bias", "plan"))
        args.append(Arg("y", "output"))
    if spec.reduction != "none":
        args.append(Arg("workspace", "scratch"))
    if spec.reduction == "atomic":
        args.append(Arg("counters", "scratch"))
    return tuple(args)


def steps(spec: TiledSpec, format_args: tuple, kernel: str, shared_bytes: int) -> tuple:
    main = Step(kernel, main_args(spec, format_args),
                Launch((spec.n_tiles, spec.m_tiles, spec.split_k), (THREADS, 1, 1), shared_bytes))
    if spec.reduction != "two_step":
        return (main,)
    args = (Arg("workspace", "scratch"),) + ((Arg("bias", "plan"),) if spec.bias else ()) + (Arg("y", "output"),)
    return (main, Step(f"{kernel}_reduce", args, Launch((-(-spec.m * spec.n // 256), 1, 1), (256, 1, 1), 0)))


def scratch_constants(spec: TiledSpec) -> dict:
    """Device buffers the runtime allocates zeroed once per kernel (kind "scratch")."""
    ws = {"none": 0, "atomic": spec.m * spec.n, "two_step": spec.split_k * spec.m * spec.n}[spec.reduction]
    counters = spec.m_tiles * spec.n_tiles if spec.reduction == "atomic" else 0
    return {"workspace_bytes": 4 * ws, "counters_bytes": 4 * counters}


def operands(spec: TiledSpec, plan) -> tuple:
    return (Operand("x", (spec.k, spec.n), DTYPE_LONG[spec.dtype]),), Operand("y", (spec.m, spec.n), DTYPE_LONG[spec.out])


def emulate_operands(spec: TiledSpec, plan) -> tuple:
    """What the NumPy emulator takes: NumPy has no bfloat16, so bf16 X comes as float32 (rounded to
    bf16 on entry) and bf16 Y leaves as float32 holding bf16-rounded values."""
    (x,), y = operands(spec, plan)
    host = {"bfloat16": "float32"}
    return (Operand("x", x.shape, host.get(x.dtype, x.dtype)),), Operand("y", y.shape, host.get(y.dtype, y.dtype))


def alignment(spec: TiledSpec) -> int:
    """X is copied in `xv`-half pieces; Y written in pairs when N is even."""
    pair = 2 * (4 if spec.out == "f32" else 2) if spec.n % 2 == 0 else 1
    return max(2 * spec.xv, pair)


def with_scratch(plan, spec: TiledSpec):
    from ..formats import Plan

    return Plan(plan.format, plan.arrays, {**plan.constants, **scratch_constants(spec)})
