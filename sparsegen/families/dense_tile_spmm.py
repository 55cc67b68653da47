"""`dense_tile_spmm`: float32 SpMM by dense tiles of W on TF32 tensor cores, at float32 accuracy.

Y = W·X (+ bias per row, ReLU) with W (M × K) densified and X (K × N), Y (M × N) row-major float32.
A 50-90 % sparse float32 layer has too many stored entries for the CSR kernels, which fetch an X row
per entry and are bound by L2 (1-10 TFLOP/s of useful work on the H100), and cuBLAS SGEMM with TF32
off computes the zeros on CUDA cores (about 45 TFLOP/s of dense work). The tensor cores compute the
zeros too, faster even at three mma per product (about 53 TFLOP/s; 1.06-1.45x SGEMM on the DLMC
layers it takes): this kernel splits each operand into a TF32 high part and a TF32 remainder and
sums three mma per product in fp32 (3xTF32, as `dense_tile_sddmm`), about 22
significant bits per product against fp32's 24: errors of 2-4e-7 relative to Y on the DLMC layers;
where an output's terms cancel, its own relative error can pass SGEMM's, but relative to the
magnitude of its terms (|W| |X|) it stays under 1e-6 (tests/test_gpu_dense_tile_spmm.py).

3xFP16 (`mma="f16x3"`, spec suffix `.h3`): the same three products on FP16 tensor cores, twice
TF32's rate. fp16's range is narrow, so W's rows are scaled by powers of two when W is encoded (each
row's largest value into [2^14, 2^15), its hi and lo planes stored as fp16) and X's columns per slice
of K in the kernel, a slice ahead of the multiply (one barrier a slice); the sums are scaled back per
slice in fp32, so X and W anywhere in float32's range keep the accuracy of 3xTF32. Taken for >= 1
GFLOP of dense work at n >= 256, in 128 x 64 tiles: 1.02-1.23x faster than 3xTF32 there. Smaller
products do not gain (the kernel is bound by its slice pipeline, not the tensor cores: 3xFP16 halves
the mma and still runs 0.77-0.95x below 1 GFLOP), nor does n <= 128.

A block owns a `tile_m` × `tile_n` tile of Y, a warp 32 × 32 of it; K is walked in slices of
`slice_k`, `stages` in flight (cp.async, zero-filled past the matrix). Where the tiles alone would
leave SMs idle, K is split among `split_k` blocks per tile: their sums meet in an fp32 workspace (L2
atomics) and the last block of a tile, counted in at a per-tile counter, writes Y and leaves the
workspace and counter zeroed, all in one launch. The epilogue (bias, ReLU) is fused.
Selected (`select/policy.py`) where the fp32 cost model predicts this kernel ahead of both the CSR
kernels and cuBLAS SGEMM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..formats import dense as FORMAT  # noqa: N812 - the family's format module
from .base import Arg, KernelSpec, Launch, Operand, Request, accept, decline, epilogue_suffix, widest_vector
from .options import FamilyOptions, option

FAMILY = "dense_tile_spmm"
OPS = ("spmm",)
KERNEL = "dense_tile_spmm"
WARP_TILE = 32  # a warp computes 32 x 32 of the tile
TILE_MS = (64, 128)  # rows of a block's tile
TILE_NS = (32, 64, 128)  # columns: 32 for n <= 32, where a 64-column tile would compute as many zero columns
SLICE_K = 32  # elements of K per pipeline step
STAGES = 3  # slices in flight
# Resident blocks per SM asked of the register allocator, by threads per block: 4 blocks of 128
# threads cap a thread at 128 registers and spill; 3 ran 2-10 % faster in the first H100 probe.
MIN_BLOCKS = {64: 5, 128: 3, 256: 2, 512: 1}
# K splits fill one wave of resident blocks, each split walking at least MIN_SLICES_PER_SPLIT slices;
# once the tiles alone give more than half the SMs a block, at least FULL_GRID_SLICES_PER_SPLIT. In the
# H100 probe (probes/dense_tile_spmm_probe.txt) 128 tiles with K = 512 ran 1.2x faster unsplit than in
# 3 splits of 5-6 slices, while K = 2048-8192 (22-85 slices a split) still gained 1.04-1.11x from splitting.
MIN_SLICES_PER_SPLIT = 4
FULL_GRID_SLICES_PER_SPLIT = 16
MMAS = ("tf32x3", "f16x3")  # three TF32 products per product, or three FP16 ones on scaled operands
DEFAULT_MMA = "tf32x3"
# 3xFP16 in 128 x 64 tiles (two blocks of 256 threads per SM) from this much dense work at n >= 256: in
# the H100 sweeps of the split-ahead kernel (probes/spmm_sweep_dense_tile_f16x3_ahead.txt) 1.02-1.05x
# faster than 3xTF32's 64 x 64 tiles at 1.05-1.21 GFLOP (10 cases), 1.07-1.23x from 2.1 GFLOP (27),
# slower below (0.77-0.92x at 0.54); with 3xTF32, 128-row tiles were 0.89-0.95x
# (probes/spmm_sweep_dense_tile_f16x3_tiles.txt). Not at n <= 128, nor in 64 x 64 tiles: 0.91-0.95x.
F16X3_MIN_FLOP = 1e9
F16X3_MIN_N = 256
MAX_DENSE_BYTES = 8 << 30  # densified W past this is refused (the plan holds it on host and GPU)
MAX_GRID_YZ = 65535  # CUDA's limit on a grid's y (row tiles) and z (K splits) dimensions


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32"
    m: int
    k: int
    n: int
    tile_m: int  # rows of a block's output tile
    tile_n: int  # columns of a block's output tile
    slice_k: int  # elements of K staged per pipeline step
    stages: int  # slices in flight
    split_k: int  # blocks sharing one tile's K range
    min_blocks: int  # __launch_bounds__ minimum resident blocks per SM
    w_vec: int  # floats per cp.async copy of W
    x_vec: int  # floats per cp.async copy of X
    bias: bool = False
    relu: bool = False
    mma: str = DEFAULT_MMA  # "tf32x3" or "f16x3"

    @property
    def name(self) -> str:
        h3 = ".h3" if self.mma == "f16x3" else ""
        return (f"{FAMILY}.{self.dtype}.m{self.m}k{self.k}n{self.n}.t{self.tile_m}x{self.tile_n}.s{self.slice_k}"
                f"x{self.stages}.sk{self.split_k}.mb{self.min_blocks}{h3}{epilogue_suffix(self.bias, self.relu)}")

    @property
    def threads(self) -> int:
        return threads_for(self.tile_m, self.tile_n)

    @property
    def slices(self) -> int:
        return -(-self.k // self.slice_k)

    @property
    def slices_per_split(self) -> int:
        return -(-self.slices // self.split_k)

    @property
    def tiles(self) -> int:
        return -(-self.m // self.tile_m) * -(-self.n // self.tile_n)

    @property
    def shared_bytes(self) -> int:
        return shared_bytes(self.tile_m, self.tile_n, self.slice_k, self.stages, self.mma)

    @property
    def k_pad(self) -> int:
        """The f16x3 planes' row length: K padded to whole 16-byte copies."""
        return FORMAT.split_row_length(self.k)

    def fields(self) -> dict:
        d = super().fields()
        d.update(threads=self.threads, slices=self.slices, slices_per_split=self.slices_per_split, tiles=self.tiles,
                 k_pad=self.k_pad, shared_bytes=self.shared_bytes)
        return d

    def to_dict(self) -> dict:
        return {"family": self.family, "name": self.name, **KernelSpec.fields(self)}


@dataclass(frozen=True)
class Options(FamilyOptions):
    """Each overrides the rule's choice; None: the rule chooses."""

    tile_m: Literal[TILE_MS] | None = option()
    tile_n: Literal[TILE_NS] | None = option()
    split_k: int | None = option(expected="a positive integer", valid=lambda v: v >= 1)
    stages: Literal[2, 3, 4] | None = option(expected="2, 3 or 4")
    min_blocks: Literal[1, 2, 3, 4, 5, 6, 8] | None = option(
        expected="1-6 or 8 (resident blocks per SM asked of nvcc)")
    mma: Literal[MMAS] | None = option(expected=f"one of {', '.join(MMAS)}")
    out: Literal["float32"] | None = option(expected="'float32' (Y is float32)")

    def check(self) -> str | None:
        if self.stages == 2 and self.mma == "f16x3":
            return "stages=2 with mma='f16x3': its split runs a slice ahead, 3 or 4 stages"
        return None


def threads_for(tile_m: int, tile_n: int) -> int:
    return 32 * (tile_m // WARP_TILE) * (tile_n // WARP_TILE)


def shared_bytes(tile_m: int, tile_n: int, slice_k: int, stages: int, mma: str = DEFAULT_MMA) -> int:
    """tf32x3: `stages` stages of W's tile_m rows (slice_k + 4 floats apart) and X's slice_k rows (tile_n +
    8). f16x3: `stages` stages of W's two fp16 planes (slice_k + 8 halves apart), `stages` - 1 of X's
    float32 rows (tile_n + 32 / warps along M), and two of X's split slice (two sets of slice_k / 2 word
    rows, tile_n + 8 apart, 16 words between them, then tile_n column scales)."""
    if mma == "f16x3":
        warps_m = tile_m // WARP_TILE
        w_stage = 2 * 2 * tile_m * (slice_k + 8)
        x_stage = 4 * slice_k * (tile_n + 32 // warps_m)
        split = 4 * (2 * (slice_k // 2) * (tile_n + 8) + 16) + 4 * tile_n
        return stages * w_stage + (stages - 1) * x_stage + 2 * split
    return 4 * stages * (tile_m * (slice_k + 4) + slice_k * (tile_n + 8))


def resident_blocks(tile_m: int, tile_n: int, slice_k: int, stages: int, min_blocks: int, device,
                    mma: str = DEFAULT_MMA) -> int:
    """Blocks an SM of `device` holds: the register request (min_blocks) and shared memory (what a
    block may opt in to), whichever binds."""
    return max(1, min(min_blocks, device.shared_per_block_optin // shared_bytes(tile_m, tile_n, slice_k, stages, mma)))


def choose_split(m: int, n: int, tile_m: int, tile_n: int, slices: int, wave: int, sms: int) -> int:
    """Split K until the tiles fill one wave of resident blocks, keeping enough slices per split
    (MIN_SLICES_PER_SPLIT; FULL_GRID_SLICES_PER_SPLIT once the tiles alone cover half the SMs)."""
    tiles = -(-m // tile_m) * -(-n // tile_n)
    if tiles >= wave:
        return 1
    least = MIN_SLICES_PER_SPLIT if 2 * tiles <= sms else FULL_GRID_SLICES_PER_SPLIT
    return max(1, min(wave // tiles, slices // least))


def takes_f16x3(m: int, k: int, n: int, stages: int = STAGES) -> bool:
    """Whether the default choice multiplies with 3xFP16: >= F16X3_MIN_FLOP of dense work at n >=
    F16X3_MIN_N (and a pipeline deep enough for its split a slice ahead)."""
    return n >= F16X3_MIN_N and 2.0 * m * k * n >= F16X3_MIN_FLOP and stages >= 3


def choose(stats, request: Request) -> tuple[Spec, str]:
    """64 x 64 tiles (four warps; 64 x 32 for n <= 32); 128 rows where the tiles still fill two waves; K
    split to fill one. 3xTF32, but 3xFP16 in 128 x 64 tiles for >= F16X3_MIN_FLOP of dense work at n >=
    F16X3_MIN_N."""
    m, k = stats.shape
    n = request.n
    sms, device = request.device.sm_count, request.device
    slice_k, stages = SLICE_K, int(request.option("stages") or STAGES)
    big = takes_f16x3(m, k, n, stages)
    mma = request.option("mma") or ("f16x3" if big else DEFAULT_MMA)
    tile_n = int(request.option("tile_n") or (32 if n <= 32 else 64))
    tile_m = request.option("tile_m")
    if tile_m is None and big and mma == "f16x3":
        tile_m = 128
    elif tile_m is None:
        tall_tiles = -(-m // 128) * -(-n // tile_n)
        tall = MIN_BLOCKS[threads_for(128, tile_n)]
        tile_m = 128 if tall_tiles >= 2 * sms * resident_blocks(128, tile_n, slice_k, stages, tall, device, mma) else 64
    tile_m = int(tile_m)
    threads = threads_for(tile_m, tile_n)
    min_blocks = int(request.option("min_blocks") or MIN_BLOCKS[threads])
    wave = sms * resident_blocks(tile_m, tile_n, slice_k, stages, min_blocks, device, mma)
    slices = -(-k // slice_k)
    split = int(request.option("split_k") or choose_split(m, n, tile_m, tile_n, slices, wave, sms))
    split = max(1, min(split, slices, MAX_GRID_YZ))
    split = -(-slices // -(-slices // split))  # no split left without a slice
    spec = Spec("f32", m, k, n, tile_m, tile_n, slice_k, stages, split, min_blocks,
                widest_vector(k, 4), widest_vector(n, 4), request.bias, request.relu, mma)
    blocks = spec.tiles * split
    if mma == "tf32x3":
        how = "3xTF32 tensor cores"
    else:
        taken = (f"; taken from {F16X3_MIN_FLOP / 1e9:g} GFLOP of dense work at n >= {F16X3_MIN_N}"
                 if big and request.option("mma") is None else "")
        how = f"3xFP16 tensor cores (rows and columns scaled into fp16's range{taken})"
    reason = (f"{tile_m}x{tile_n} tiles of Y on {how}, W densified ({4 * m * k / 1e6:.1f} MB), "
              f"K in slices of {slice_k}, {stages} in flight")
    if split > 1:
        reason += (f"; K split {split} ways ({spec.tiles} tiles alone for {sms} SMs): {blocks} blocks, "
                   f"sums meet in an fp32 workspace")
    if request.bias or request.relu:
        reason += "; " + " + ".join(w for w, on in (("bias", request.bias), ("ReLU", request.relu)) if on) + " fused"
    return spec, reason


def offer(stats, request: Request):
    """The spec this family builds for the request (accepted, with what it does), or the decline
    that says why it cannot serve it; selection (`select/policy.py`) decides whether to take it."""
    if request.op != "spmm":
        return decline(f"op {request.op!r} is not spmm")
    if request.dtype != "float32":
        return decline(f"dtype {request.dtype}: float32 only (fp16 and bf16 have the tiled tensor-core families)")
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    m, k = stats.shape
    if m == 0 or k == 0 or not request.n:
        return decline(f"empty shape {m}x{k}, n={request.n}")
    if 4 * m * k > MAX_DENSE_BYTES:
        return decline(f"densified W would take {4 * m * k / 2**30:.0f} GiB (> {MAX_DENSE_BYTES >> 30} GiB)")
    if max(m * k, k * request.n, m * request.n) >= 2**31:
        return decline("an operand past 2^31 elements needs 64-bit offsets")
    spec, reason = choose(stats, request)
    if -(-m // spec.tile_m) > MAX_GRID_YZ:
        return decline(f"{-(-m // spec.tile_m)} row tiles of {spec.tile_m}: past the grid's {MAX_GRID_YZ} in y")
    return accept(spec, reason)


def encoding(spec: Spec) -> tuple:
    """The spec fields the encoding reads: the dense float32 W (or its fp16 planes) serves every n and tile."""
    return ("float32",) if spec.mma == "tf32x3" else ("f16x3",)


def encode_format(csr, spec: Spec, bias=None):
    if spec.mma == "f16x3":
        return FORMAT.encode_split_f16(csr, bias)
    return FORMAT.encode(csr, "float32", bias)


def specialize(plan, spec: Spec):
    """The split-K workspace (M x N floats) and tile counters, allocated zeroed once by the runtime."""
    from ..formats import Plan

    ws = spec.m * spec.n if spec.split_k > 1 else 0
    counters = spec.tiles if spec.split_k > 1 else 0
    return Plan(plan.format, plan.arrays, {**plan.constants, "workspace_bytes": 4 * ws, "counters_bytes": 4 * counters})


def encode(csr, spec: Spec, bias=None):
    return specialize(encode_format(csr, spec, bias), spec)


def arguments(spec: Spec) -> tuple[Arg, ...]:
    planes = ("w_hi", "w_lo", "w_inv") if spec.mma == "f16x3" else ("w",)
    args = [*(Arg(p, "plan") for p in planes), Arg("x", "input")]
    if spec.bias:
        args.append(Arg("bias", "plan"))
    args.append(Arg("y", "output"))
    if spec.split_k > 1:
        args += [Arg("workspace", "scratch"), Arg("counters", "scratch")]
    return tuple(args)


def launch(spec: Spec, plan) -> Launch:
    grid = (-(-spec.n // spec.tile_n), -(-spec.m // spec.tile_m), spec.split_k)
    return Launch(grid, (spec.threads, 1, 1), spec.shared_bytes)


def operands(spec: Spec, plan) -> tuple:
    return (Operand("x", (spec.k, spec.n), "float32"),), Operand("y", (spec.m, spec.n), "float32")


def alignment(spec: Spec) -> int:
    """X is copied x_vec floats at a time; Y written in float2 pairs when N is even."""
    return max(4 * spec.x_vec, 8 if spec.n % 2 == 0 else 4)


def emulate(spec: Spec, plan, inputs: dict):
    """tf32x3: W·X in float64 rounded to float32 (3xTF32 carries about fp32's precision), then bias, ReLU.
    f16x3: the kernel's split of both operands and its three products per slice, summed in float64."""
    if spec.mma == "f16x3":
        return FORMAT.spmm_split_f16(plan, inputs["x"], slice_k=spec.slice_k, bias=spec.bias, relu=spec.relu)
    return FORMAT.spmm(plan, inputs["x"], bias=spec.bias, relu=spec.relu)
