"""`ell_coo_spmm`: ELL head + COO tail SpMM (Kashid et al.), Y = A·X (+ bias, ReLU).

For matrices whose row lengths vary widely (magnitude-pruned MiniLM rows hold 4 to 874
nonzeros), where one long row would keep its block, and the end of the grid, waiting. Three
launches in stream order, one generated source:

1. `ell_coo_spmm_ell`: a group of `lanes` threads per row, each thread `vec` columns of a
   `lanes × vec` column tile, walks the row's first min(len, W) ELL slots and writes every row of
   Y (bias included; ReLU too for rows that have no tail). W is the median row length, so no row
   takes more than W steps.
2. `ell_coo_spmm_tail`: one group per COO chunk (at most `chunk` entries of one row) sums the
   chunk in fp32 and adds it to its row of Y with one atomic per column.
3. `ell_coo_spmm_relu` (ReLU only, when a row has a tail): ReLU of the rows the tail touched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..dtypes import long_name, short_name
from ..formats import ell_coo as FORMAT  # noqa: N812 - the family's format module
from .base import (Arg, KernelSpec, Launch, Request, Rule, Step, accept, decline, epilogue_suffix,
                   next_pow2, spmm_gate, spmm_operands, widest_vector)

FAMILY = "ell_coo_spmm"
OPS = ("spmm",)
KERNEL = "ell_coo_spmm_ell"  # the first step (tools that print one kernel name show this one)
TAIL_KERNEL = "ell_coo_spmm_tail"
RELU_KERNEL = "ell_coo_spmm_relu"
WARP = 32
BLOCK = 128  # threads per block in every step
# Row-length CoV from which the hybrid beats swizzled CSR (sputnik_spmm) on the H100: 4096 x 4096,
# 10 % dense, lognormal row lengths (docs/decisions/data/h100-80gb-hbm3/spmm_sweep_skewed_f32.json):
# at n = 128 it wins from CoV 0.74 (0.127 vs 0.136 ms; 0.122 vs 0.175 at 0.97); at n = 32 sputnik
# still wins at 1.17 (0.081 vs 0.094 ms), they tie at 1.33, and the hybrid wins at 1.57 (0.069 vs 0.084).
COV_MIN = 0.75  # n >= WIDE_N
COV_MIN_NARROW = 1.3  # n < WIDE_N
WIDE_N = 128
# float32, re-measured once sputnik_spmm split rows per row and split skewed many-row matrices alike
# (probes/spmm_sweep_skewed_ell_coo.txt: 8 lognormal matrices of 512-8192 rows and the high-CoV DLMC
# layer, n = 32-1024, against the kernel the table picks without this one). Rows of >= 160 nonzeros
# on average: sputnik_spmm's splits ran 1.2-4.0x faster (11 of 12; 1024 x 4096 at n = 1024 ran 0.72x,
# 0.154 against 0.111 ms). Short rows (24-40 on average): the hybrid ran 1.0-3.7x faster at n >= 256
# (12 of 12, within 2 %) and on >= 4096 rows at n = 128 (3 of 3) and n = 32 (2 of 3; 4096 x 1024 ran
# 0.85x csr_rowsplit); on 2048 rows at n <= 128 csr_rowsplit and sputnik_spmm's per-row split ran
# 1.26-1.55x faster (6 of 6). The 4096 x 4096 squares at 10 % (rows of 360-400) were the crossovers
# above; split rows now beat the hybrid there at every n, 1.15-4.2x (probes/spmm_sweep_skewed_sputnik.txt).
# float16 keeps the CoV bounds alone (not re-measured).
SHORT_ROWS_MEAN = 64  # float32: rows of at most this many nonzeros on average
ROWS_N = 256  # float32: below this n, at least MIN_ROWS_NARROW rows
MIN_ROWS_NARROW = 4096
FULL_UNROLL_MAX = 16  # ELL widths up to this unroll completely (every slot's loads issued at once)
UNROLL = 4  # otherwise the ELL and chunk loops unroll by this much


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    dtype: str  # "f32" | "f16": storage of A's values, X and Y; accumulation is always fp32
    n: int  # dense columns
    vec: int  # elements of X and Y per vector load
    lanes: int  # threads of a row (or chunk) group across output columns
    width: int  # ELL width W: slots per row in the ELL pass
    chunk: int  # COO entries per chunk, at most
    unroll: int  # ELL slots per unrolled step; == width: fully unrolled
    block: int = BLOCK
    bias: bool = False
    relu: bool = False

    @property
    def name(self) -> str:
        epi = epilogue_suffix(self.bias, self.relu)
        return (f"{FAMILY}.{self.dtype}.n{self.n}.v{self.vec}.c{self.lanes}.w{self.width}.ch{self.chunk}"
                f".u{self.unroll}.b{self.block}{epi}")

    @property
    def tile_n(self) -> int:
        return self.lanes * self.vec

    @property
    def groups_per_block(self) -> int:
        return self.block // self.lanes

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "f32" else 2


def make_spec(dtype: str, n: int, width: int, *, bias: bool = False, relu: bool = False) -> Spec:
    """The spec for a storage dtype ("float32" / "float16"), n and ELL width: vector width and
    lanes from n (as csr_rowsplit: the widest vector dividing n, lanes to cover n up to a warp)."""
    itemsize = 4 if dtype == "float32" else 2
    vec = widest_vector(n, itemsize)
    lanes = min(WARP, next_pow2(-(-n // vec)))
    unroll = width if width <= FULL_UNROLL_MAX else UNROLL
    return Spec(short_name(dtype), n, vec, lanes, width, FORMAT.chunk_size(width), unroll, BLOCK, bias, relu)


def _rule(stats, request: Request):
    gate = spmm_gate(stats, request)
    if gate:
        return gate
    rl = stats.row_lengths
    cov_min = COV_MIN if request.n >= WIDE_N else COV_MIN_NARROW
    forced = request.option("family") == FAMILY  # asked for by name: measure it anyway
    if rl.cov < cov_min and not forced:
        return decline(f"row-length CoV {rl.cov:.2f} < {cov_min} (n={request.n}): rows {rl.min}..{rl.max} nnz are "
                       f"even enough for one pass")
    if request.dtype == "float32" and not forced:
        why = _outside_measured_f32(stats, request)
        if why:
            return decline(why)
    p50 = stats.row_length_percentiles["p50"]
    width = FORMAT.width_from_median(p50)
    if rl.max <= width:
        return decline(f"row-length CoV {rl.cov:.2f} but no tail: the longest row ({rl.max} nnz) fits the "
                       f"ELL width {width} (median row)")
    if width * FORMAT.ell_stride(stats.shape[0]) >= 2**31:
        return decline(f"ELL block of {width} x {stats.shape[0]} slots needs 64-bit offsets")
    spec = make_spec(request.dtype, request.n, width, bias=request.bias, relu=request.relu)
    loop = "fully unrolled" if spec.unroll == width else f"unrolled by {spec.unroll}"
    compare = ">=" if rl.cov >= cov_min else "< (asked for by name)"
    reason = (f"row-length CoV {rl.cov:.2f} {compare} {cov_min} (rows {rl.min}..{rl.max} nnz, median {p50:g}): "
              f"ELL width {width} = median row, at least {FORMAT.MIN_WIDTH} (fewest padded slots + tail "
              f"entries; at least half the rows fit whole, {loop}); rows over {width} spill to COO chunks of "
              f"<= {spec.chunk}; "
              f"n={spec.n}: {spec.vec}-wide loads, {spec.lanes} lanes per row")
    return accept(spec, reason)


def _outside_measured_f32(stats, request: Request) -> str | None:
    """Why the split CSR kernels were measured ahead of the hybrid here (float32), or None."""
    m, mean = stats.shape[0], stats.row_lengths.mean
    if mean > SHORT_ROWS_MEAN:
        return (f"row-length CoV {stats.row_lengths.cov:.2f}, but rows avg {mean:.1f} nnz > {SHORT_ROWS_MEAN}: "
                "sputnik_spmm's row splits were measured faster on long skewed rows")
    if request.n < ROWS_N and m < MIN_ROWS_NARROW:
        return (f"row-length CoV {stats.row_lengths.cov:.2f}, but {m} rows < {MIN_ROWS_NARROW} at n={request.n} < "
                f"{ROWS_N}: csr_rowsplit and sputnik_spmm's per-row split were measured faster")
    return None


RULES = (Rule("ell_coo_spmm", FAMILY, _rule),)

TAIL_ARGUMENTS = (Arg("chunk_row", "plan"), Arg("chunk_ptr", "plan"), Arg("tail_cols", "plan"),
                  Arg("tail_vals", "plan"), Arg("x", "input"), Arg("y", "output"), Arg("chunks", "int"))
RELU_ARGUMENTS = (Arg("tail_rows", "plan"), Arg("y", "output"), Arg("tail_count", "int"))


def arguments(spec: Spec) -> tuple[Arg, ...]:
    """The ELL kernel's parameters (the first step)."""
    args = [Arg("ell_cols", "plan"), Arg("ell_vals", "plan"), Arg("row_len", "plan"), Arg("x", "input")]
    if spec.bias:
        args.append(Arg("bias", "plan"))
    return tuple(args) + (Arg("y", "output"), Arg("m", "int"), Arg("stride", "int"))


def _grid(spec: Spec, items: int) -> tuple:
    """Groups of `lanes` threads, one per item (row, chunk, tail row), across the column tiles."""
    return (-(-items // spec.groups_per_block), -(-spec.n // spec.tile_n), 1)


def steps(spec: Spec, plan) -> tuple[Step, ...]:
    """ELL pass over every row; COO pass when there is a tail; ReLU of the tail rows when asked."""
    c = plan.constants
    block = (spec.block, 1, 1)
    out = [Step(KERNEL, arguments(spec), Launch(_grid(spec, c["m"]), block))]
    if c["chunks"]:
        out.append(Step(TAIL_KERNEL, TAIL_ARGUMENTS, Launch(_grid(spec, c["chunks"]), block)))
    if spec.relu and c["tail_count"]:
        out.append(Step(RELU_KERNEL, RELU_ARGUMENTS, Launch(_grid(spec, c["tail_count"]), block)))
    return tuple(out)


def encode(csr, spec: Spec, bias=None):
    return FORMAT.encode(csr, long_name(spec.dtype), spec.width, spec.chunk, bias)


operands = spmm_operands


def alignment(spec: Spec) -> int:
    """Bytes every X and Y pointer must be aligned to (vector loads, vector atomics)."""
    return spec.vec * spec.itemsize


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.spmm(plan, inputs["x"], relu=spec.relu)
