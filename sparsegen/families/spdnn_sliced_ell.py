"""`spdnn_sliced_ell`: one fused sparse DNN layer (Hidayetoglu et al., Graph Challenge 2020).

Y_out = min(max(Y_in · Aᵀ + bias, 0), cap) for the inputs still alive, where A (rows = output
neurons) is the layer's weight matrix transposed from the challenge's W. Each thread block owns a
tile of output neurons, gathers the tile's input footprint for a minibatch of inputs into shared
memory, and accumulates the minibatch in registers over the tile's sliced-ELL weights. The trip
counts the plan fixes (minibatch, buffer size and count, ELL width) are template constants, so the
loops unroll; `unroll=False` builds the variant that reads them at run time.

Used through `sparsegen.SparseDNN` (the network driver), which also runs the support kernels of the
same source: pruning, exact deduplication of rows and the converged tail (docs/decisions/006-converge.md).
Where one tile holds every output neuron, the layer kernel also prunes: it appends the rows it keeps
to the next alive list itself (`compact`); and it takes fewer inputs per pass when the rows left are
too few to give every block a full minibatch (`passes_wanted`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from ..formats import sliced_ell as FORMAT  # noqa: N812
from .base import Arg, KernelSpec, Launch, Operand, Request, Rule, accept, decline, default_device
from .options import FamilyOptions, option

FAMILY = "spdnn_sliced_ell"
OPS = ("spdnn_layer",)
KERNEL = "spdnn_layer"
# Measured on the H100 (n1024-l120, 60,000 MNIST-made inputs): tiles of 1024 outputs with 16 inputs
# per pass ran 40.5 TeraEdges/s against 31.6 with 12 and 39.1 with 8 (docs/decisions/data/h100-80gb-hbm3/spdnn_block_minibatch_sweep.json).
DEFAULT_MINIBATCH = 16
# static shared memory of the layer kernel (the epilogue's per-warp votes, two rounds of two words per
# warp), kept out of the footprint buffer's share
EPILOGUE_SHARED_BYTES = 2 * 2 * 32 * 4


@dataclass(frozen=True)
class Spec(KernelSpec):
    family: ClassVar[str] = FAMILY
    neurons_in: int
    neurons_out: int
    block: int  # threads = output neurons per tile
    minibatch: int  # inputs per register pass (multiple of 4)
    stride: int  # floats per shared-memory slot
    buf: int  # slots per footprint buffer
    width: int = 0  # uniform ELL width per (buffer, warp); 0: read at run time
    nbuf: int = 0  # uniform buffers per tile; 0: read at run time
    index_bits: int = 16
    value: float | None = None  # every weight equal to this (no value array)
    bias: float = 0.0
    cap: float | None = None
    bias_rule: str = "nonzero"  # "nonzero": challenge rule; "all": every output
    bias_vector: bool = False  # one bias per output neuron (a plan array) instead of `bias`

    @property
    def name(self) -> str:
        trips = f"w{self.width}x{self.nbuf}" if self.width else "wrt"
        value = f".v{self.value:g}" if self.value is not None else ""
        cap = f".cap{self.cap:g}" if self.cap is not None else ""
        bias = "biasv" if self.bias_vector else f"bias{self.bias:g}"
        return (f"{FAMILY}.n{self.neurons_in}x{self.neurons_out}.b{self.block}.mb{self.minibatch}"
                f".s{self.stride}.buf{self.buf}.{trips}.i{self.index_bits}{value}.{bias}{cap}"
                f".{'nz' if self.bias_rule == 'nonzero' else 'all'}")

    @property
    def shared_bytes(self) -> int:
        return self.buf * self.stride * 4


@dataclass(frozen=True)
class Options(FamilyOptions):
    minibatch: int = option(DEFAULT_MINIBATCH, expected="a positive multiple of 4 (float4 shared-memory reads)",
                            valid=lambda v: v > 0 and v % 4 == 0)
    block: int | None = option(expected="a multiple of 32 from 32 to 1024 (threads, an output neuron each)",
                               valid=lambda v: v % 32 == 0 and 32 <= v <= 1024)  # None: default_block
    unroll: bool = option(True)  # False: the variant that reads the trip counts at run time
    # the layer's epilogue, from compile()'s bias, cap and bias_rule
    bias: float = option(0.0)
    cap: float | None = option()
    bias_rule: Literal["nonzero", "all"] = option("nonzero")
    bias_vector: bool = option(False)  # one bias per output neuron: the vector travels in the plan


def default_block(outputs: int) -> int:
    """Output neurons per tile: the whole layer up to 1024 (one thread each), in whole warps."""
    return min(1024, -(-outputs // 32) * 32 or 32)


def padded_stride(minibatch: int) -> int:
    """Slot stride in floats: float4 reads of slot s start at bank group (s*stride/4) mod 8, which
    cycles through all 8 groups only when stride/4 is odd."""
    return minibatch if (minibatch // 4) % 2 else minibatch + 4


def choose(stats, request: Request) -> tuple[Spec, str]:
    m, k = stats.shape
    minibatch = int(request.option("minibatch", DEFAULT_MINIBATCH))
    block = int(request.option("block", default_block(m)))
    stride = padded_stride(minibatch)
    # 1024-thread blocks are register-bound to one per SM: give that block all the shared memory
    blocks_per_sm = 1 if block >= 1024 else request.device.max_threads_per_sm // block
    capacity = min((request.device.shared_per_block_optin // blocks_per_sm - EPILOGUE_SHARED_BYTES) // (stride * 4),
                   65536)
    spec = Spec(k, m, block, minibatch, stride, capacity, 0, 0, 16 if capacity <= 65536 else 32, None,
                float(request.option("bias", 0.0)), request.option("cap"), request.option("bias_rule", "nonzero"),
                bool(request.option("bias_vector", False)))
    reason = (f"{m} output neurons in tiles of {block}; minibatch {minibatch} in registers; footprint buffers of "
              f"up to {capacity} slots ({stride} floats each) in shared memory, so slot indices fit "
              f"{spec.index_bits} bits")
    return spec, reason


def finalize(spec: Spec, plan, request: Request) -> Spec:
    """Fix the trip counts the encoded plan shows: buffer size, and width/buffer count when uniform."""
    c = plan.constants
    unroll = bool(request.option("unroll", True)) and c["uniform_width"] > 0 and c["uniform_buffers"] > 0
    return replace(spec, buf=max(c["slots_max"], 1), width=c["uniform_width"] if unroll else 0,
                   nbuf=c["uniform_buffers"] if unroll else 0, value=c["uniform_value"])


def _rule(stats, request: Request):
    if request.op != "spdnn_layer":
        return decline(f"op {request.op!r} is not spdnn_layer")
    if request.dtype != "float32":
        return decline(f"dtype {request.dtype}: the SpDNN layer kernel is fp32")
    bad = Options.problem(request)
    if bad:
        return decline(bad)
    return accept(*choose(stats, request))


RULES = (Rule("spdnn_sliced_ell", FAMILY, _rule),)

ARGUMENTS = (Arg("map", "plan"), Arg("map_disp", "plan"), Arg("buf_disp", "plan"), Arg("warp_disp", "plan"),
             Arg("index", "plan"), Arg("value", "plan"), Arg("bias", "plan"), Arg("y_in", "input"),
             Arg("y_out", "output"), Arg("alive", "state"), Arg("count_in", "state"), Arg("count_next", "state"),
             Arg("count_clear", "state"), Arg("alive_next", "state"), Arg("weight", "state"), Arg("flags", "state"),
             Arg("history", "state"), Arg("state", "state"), Arg("progress", "state"), Arg("layer", "layer"),
             Arg("fixed_from", "layer"), Arg("compact", "layer"), Arg("passes_wanted", "layer"))


def arguments(spec: Spec) -> tuple[Arg, ...]:
    return tuple(a for a in ARGUMENTS if (a.name != "value" or spec.value is None)
                 and (a.name != "bias" or spec.bias_vector))


def encode(csr, spec: Spec, bias=None):
    """The layer's sliced ELL; a per-neuron bias (`bias`, float32 per output neuron) rides along as
    plan array "bias" when the spec reads one."""
    import numpy as np

    plan = FORMAT.encode(csr, spec.block, spec.buf, np.uint16 if spec.index_bits == 16 else np.int32)
    if spec.bias_vector:
        plan.arrays["bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    return plan


DRIVER = "sparsegen.SparseDNN"  # on the GPU these kernels run inside the network driver


def operands(spec: Spec, plan):
    return (Operand("y_in", (None, spec.neurons_in), "float32"),), Operand("y_out", (None, spec.neurons_out), "float32")


def launch(spec: Spec, plan, sms: int | None = None) -> Launch:
    """Tiles across x; minibatch strides across y, enough blocks to fill every SM twice over (`sms`:
    the GPU's, which the driver reads; else the default device's)."""
    tiles = plan.constants["tiles"]
    device = default_device()
    resident = max(1, device.max_threads_per_sm // spec.block) * (sms or device.sm_count)
    return Launch((tiles, max(1, -(-2 * resident // max(tiles, 1))), 1), (spec.block, 1, 1), spec.shared_bytes)


def alignment(spec: Spec) -> int:
    return 4


def layer_bias(spec: Spec, plan):
    """The bias the layer adds: a number, or one float32 per output neuron."""
    return plan.arrays["bias"] if spec.bias_vector else spec.bias


def emulate(spec: Spec, plan, inputs: dict):
    return FORMAT.layer(plan, inputs["y_in"], layer_bias(spec, plan), spec.cap, spec.bias_rule)
