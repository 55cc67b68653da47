"""`dense_tile_sddmm`: SDDMM by dense output tiles on tensor cores, for patterns too dense for Sputnik's gather.

out[j] = A[row_j] · B[col_j] for every stored entry j of a CSR pattern P (m × n), in P's CSR
order; A (m × k) and B (n × k) row-major, float32. Sputnik's SDDMM (`sputnik_sddmm`) loads a row
of B per stored entry: its cost grows with nnz × k and is bound by those loads. Past some density
it is cheaper to compute every product of a tile the way a GEMM does, with A's and B's rows staged
once in shared memory and reused by the whole tile, and to drop the ones the pattern does not
sample; on tensor cores that density is low.

The pattern is cut into `tile_m` × 64 tiles (formats/sampled_tiles); one block per tile that holds
an entry, a warp per 32 × 32 of it. k is walked in slices of `slice_k`, `stages` in flight
(cp.async, zero-filled past the matrix). Products run on TF32 tensor cores at float32 accuracy
(3xTF32: each operand split into a TF32 high part and a TF32 remainder, three mma per product,
fp32 sums; about 22 significant bits per product). The epilogue stages the finished tile in shared
memory, and a warp per row stores the entries its 64-bit mask keeps at the row's base plus the
popcount of the mask below each: one run of consecutive output positions. float32 only:
fp16 SDDMM stays on `sputnik_sddmm`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..dtypes import long_name
from ..formats import sampled_tiles as FORMAT  # noqa: N812 - the family's format module
from .base import Arg, KernelSpec, Launch, Operand, Request, Rule, accept, decline, widest_vector
from .options import FamilyOptions, option

FAMILY = "dense_tile_sddmm"
OPS = ("sddmm",)
KERNEL = "dense_tile_sddmm"
TILE_N = FORMAT.TILE_N
WARP_TILE = 32  # a warp computes 32 x 32 of the tile
OUT_STRIDE = TILE_N + 8  # floats between rows of the finished tile in shared memory
TILE_MS = (128, 64, 32)  # rows of an output tile, largest first
SLICE_K = 32  # elements of k per pipeline step (k < 32: k rounded up to 8, one mma step)
STAGES = 3  # slices in flight
REGISTERS = 128  # per-thread register budget, through __launch_bounds__' minimum blocks per SM
# Where whole tiles beat sputnik_sddmm's gather, measured on the H100 with 128-row tiles over every
# DLMC matrix at k = 32/128/256 (docs/decisions/data/h100-80gb-hbm3/sddmm_sweep_dense_tile_v3.txt,
# the kernel with its compacted stores). At k >= 128: from 28 % fill (0.25-0.28: 1.03-1.08x, below
# that a wash or a loss: 512 x 4608 at 20 % ran 0.81-0.89x) with at least half a tile per SM (the
# 512 x 512 layers, 32 tiles, ran 0.70-0.92x; 256 x 2304, 72 tiles, 1.20-1.55x). At k = 32 one slice
# leaves less to amortise a tile's fixed cost: from 33 % fill (1.08-1.47x) and only with about a tile
# per SM (72 tiles ran 0.89-0.93x, 128 tiles 1.08-1.29x; 30 % fill on 128 tiles 0.92-0.99x). k between
# 32 and 128 takes k = 32's stricter bounds; below 32 (not measured) stays with sputnik_sddmm.
MIN_K = 32
LONG_K = 128
# (least fill of the nonempty tiles, least tiles per SM): a matrix qualifies by meeting either pair.
# Lower fill pays on grids of more tiles (probes/sddmm_sweep_f16x3_v1.txt, its family=auto and 3xTF32
# columns): at 25 % fill with about a tile per SM (the 512 x 2048 l0 layer at 80 %, 128 tiles) 1.07-1.08x
# at k = 128/256, as the 0.25-0.28 row above; at 20 % fill on the 4096^2 and 8192^2 squares (15 and 62
# tiles per SM) 1.07-1.14x, where 2.2 tiles per SM (512 x 4608) still ran 0.83-0.89x and a tile per SM
# (2048 x 512, 512 x 2048) 0.91-1.02x. 3 tiles per SM takes in the 2048^2 square (3.9), not in the
# sweep: its tiles cost about what they cost at 30 % fill, which in dlmc.json ran 1.05-1.10x ahead of
# the gather at 20 % (30.9 against 32.4 us at k = 128, 50.4 against 55.6 at 256).
LONG_K_BOUNDS = ((0.28, 0.5), (0.25, 0.9), (0.19, 3.0))  # k >= LONG_K (the 80 % squares fill 19.995 %)
# MIN_K <= k < LONG_K. The second pair: in the crossover sweep (probes/sddmm_sweep_crossover.txt)
# 30 % fill at k = 32 ran 1.12-1.38x faster than sputnik_sddmm on grids of 1.9-31 tiles per SM (the
# 1000 x 2048 layers, the 2048-8192 squares) and 0.92-0.97x on grids of 0.97.
SHORT_K_BOUNDS = ((0.33, 0.9), (0.28, 1.5))
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32"
    k: int  # inner dimension (columns of A and B), a compile-time constant
    vec: int  # floats per cp.async copy
    tile_m: int  # rows of an output tile (columns: 64)
    slice_k: int  # elements of k staged per pipeline step
    stages: int  # slices in flight
    min_blocks: int  # __launch_bounds__ minimum resident blocks per SM

    @property
    def name(self) -> str:
        return (f"{FAMILY}.{self.dtype}.k{self.k}.v{self.vec}.t{self.tile_m}x{TILE_N}.s{self.slice_k}"
                f"x{self.stages}.m{self.min_blocks}")

    @property
    def threads(self) -> int:
        return threads_for(self.tile_m)

    @property
    def shared_bytes(self) -> int:
        """`stages` stages of tile_m + 64 staged rows of slice_k + 4 floats, or the finished tile
        (rows of 64 + 8 floats) where that is more, then the tile's row masks and bases (12 bytes a row)."""
        stages = self.stages * (self.tile_m + TILE_N) * (self.slice_k + 4)
        return max(stages, self.tile_m * OUT_STRIDE) * 4 + self.tile_m * 12


@dataclass(frozen=True)
class Options(FamilyOptions):
    """Each overrides the rule's choice; None: the rule chooses."""

    tile_m: Literal[TILE_MS] | None = option()
    slice_k: Literal[8, 16, 32, 64] | None = option(expected="8, 16, 32 or 64")
    stages: Literal[2, 3, 4] | None = option(expected="2, 3 or 4")
    min_blocks: Literal[1, 2, 4, 8] | None = option(expected="1, 2, 4 or 8 (resident blocks per SM asked of nvcc)")


def bounds(k: int) -> tuple[tuple[float, float], ...]:
    """The (least fill, least tiles per SM) pairs where whole tiles were measured ahead at this k."""
    return LONG_K_BOUNDS if k >= LONG_K else SHORT_K_BOUNDS


def bounds_met(k: int, fill: float, tiles: int, sms: int) -> list[tuple[float, float]]:
    """The pairs of `bounds(k)` that `fill` and `tiles` meet on `sms` SMs."""
    return [(f, per_sm) for f, per_sm in bounds(k) if fill >= f and tiles >= per_sm * sms]


def threads_for(tile_m: int) -> int:
    """A warp per 32 x 32 of a tile_m x 64 tile."""
    return 32 * (tile_m // WARP_TILE) * (TILE_N // WARP_TILE)


def active_fill(stats) -> float:
    """Stored entries over the area of the analyzer's tiles that hold one (its 128 x 64 tiles):
    the share of a dense tile's products that the pattern keeps."""
    t = stats.tiles
    if not t.nonempty:
        return 0.0
    m, n = stats.shape
    return stats.nnz / (t.nonempty * min(t.tile_rows, m) * min(t.tile_cols, n))  # a small matrix's tile is smaller


def grid_tiles(m: int, n: int, tile_m: int) -> int:
    return -(-m // tile_m) * -(-n // TILE_N)


def choose(stats, request: Request) -> tuple[Spec, str]:
    """128-row tiles (the fastest in the sweep, even where they leave SMs idle: each staged row of B
    serves more outputs), fewer rows when the matrix has fewer; slices of 32, three in flight."""
    k = request.k
    m, n = stats.shape
    sms = request.device.sm_count
    tile_m = request.option("tile_m") or next((t for t in reversed(TILE_MS) if t >= m), TILE_MS[0])
    slice_k = int(request.option("slice_k") or min(SLICE_K, -(-k // 8) * 8))
    stages = int(request.option("stages") or STAGES)
    vec = widest_vector(k, 4)
    min_blocks = int(request.option("min_blocks") or max(1, min(16, request.device.registers_per_sm // (threads_for(int(tile_m)) * REGISTERS))))
    spec = Spec("f32", k, vec, int(tile_m), slice_k, stages, min_blocks)
    fill = active_fill(stats)
    tiles = grid_tiles(m, n, spec.tile_m)
    min_fill = (bounds_met(k, fill, tiles, sms) or bounds(k))[0][0]  # forced outside them: the first pair
    reason = (f"fill of the nonempty tiles {fill:.0%} >= {min_fill:.0%} at k={k}: whole "
              f"{spec.tile_m}x{TILE_N} tiles of A.B^T (up to {tiles} blocks, {tiles / sms:.1f} per SM) cost less "
              f"than a B row per entry; k in slices of {slice_k}, {stages} in flight, {vec}-float copies; "
              f"3xTF32 tensor cores")
    return spec, reason


def _rule(stats, request: Request):
    if request.op != "sddmm":
        return decline(f"op {request.op!r} is not sddmm")
    if not request.k:
        return decline("sddmm needs k (the inner dimension)")
    if request.dtype != "float32":
        return decline(f"dtype {request.dtype}: float32 only (fp16 would want tensor cores)")
    m, n = stats.shape
    if stats.nnz > INT32_MAX or max(m, n) > INT32_MAX or max(m, n) * request.k > 2**40:
        return decline("matrix needs 64-bit indices")
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    spec, reason = choose(stats, request)
    if request.option("family") != FAMILY:  # forced (tuning, tests): no measured-region declines
        why = _outside_measured(stats, request, spec)
        if why:
            return decline(why)
    return accept(spec, reason)


def _outside_measured(stats, request: Request, spec: Spec) -> str | None:
    """Why the H100 sweep has sputnik_sddmm ahead here, or None."""
    m, n = stats.shape
    if request.k < MIN_K:
        return f"k={request.k} < {MIN_K}: one short slice does not pay for staging whole tiles"
    fill = active_fill(stats)
    blocks, sms = grid_tiles(m, n, spec.tile_m), request.device.sm_count
    if bounds_met(request.k, fill, blocks, sms):
        return None
    pairs = bounds(request.k)
    lowest = min(f for f, _ in pairs)
    if fill < lowest:
        return f"fill of the nonempty tiles {fill:.1%} < {lowest:.0%} at k={request.k}: a B row per entry is cheaper"
    need = " or ".join(f"{per_sm} per SM from {f:.0%} fill" for f, per_sm in pairs if fill >= f)
    return (f"{blocks} tiles of {spec.tile_m}x{TILE_N} for {sms} SMs at {fill:.0%} fill (< {need} at k={request.k}): "
            "each block walks all of k alone")


RULES = (Rule("dense_tile_sddmm", FAMILY, _rule),)

ARGUMENTS = (Arg("tiles", "plan"), Arg("masks", "plan"), Arg("bases", "plan"), Arg("a", "input"),
             Arg("b", "input"), Arg("out", "output"), Arg("m", "int"), Arg("n", "int"))


def arguments(spec: Spec) -> tuple[Arg, ...]:
    return ARGUMENTS


def encode(csr, spec: Spec, bias=None):
    if bias is not None:
        raise ValueError("sddmm takes no bias")
    return FORMAT.encode(csr, tile_m=spec.tile_m)


def operands(spec: Spec, plan) -> tuple[tuple[Operand, ...], Operand]:
    c, dtype = plan.constants, long_name(spec.dtype)
    return ((Operand("a", (c["m"], spec.k), dtype), Operand("b", (c["n"], spec.k), dtype)),
            Operand("out", (c["nnz"],), dtype))


def launch(spec: Spec, plan) -> Launch:
    """One block per active tile (an empty pattern has none)."""
    return Launch((plan.constants["tiles"], 1, 1), (spec.threads, 1, 1), spec.shared_bytes)


def alignment(spec: Spec) -> int:
    """Bytes the A and B pointers must be aligned to (cp.async copies)."""
    return spec.vec * 4


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.sddmm(plan, inputs["a"], inputs["b"])
