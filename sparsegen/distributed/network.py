"""The network on every rank, and the rank's GPU."""
from __future__ import annotations

import os

from ..spdnn import SparseDNN
from .comm import collective, node


def choose_device(local_rank: int, backend: str) -> int | None:
    """The CUDA device of this rank: SPARSEGEN_DEVICE when set, else local rank mod the node's device
    count (so ranks beyond the node's GPUs share them); None for the emulator."""
    from .. import api, runtime

    if api._resolve_backend(backend) != "gpu":
        return None
    if runtime.ENV_DEVICE not in os.environ:
        os.environ[runtime.ENV_DEVICE] = str(local_rank % runtime._driver().Device.count())
    return runtime.device_ordinal()


def build(layers, comm, bias, cap: float | None = 32.0, *, backend: str = "auto", **options) -> SparseDNN:
    """The network on every rank (options: SparseDNN's). The node's first rank builds first; the
    others then find its kernels and plans in the cache (whose writes are atomic renames, so
    concurrent builders would be safe too, only each paying nvcc)."""
    local, local_rank = node(comm)
    ranks_here = local.size
    local.Free()
    collective(comm, choose_device, local_rank, backend)
    kw = {"progress": False, **options}
    if ranks_here > 1 and kw.get("workers") is None:
        kw["workers"] = workers(layers, ranks_here)

    def make(mine: bool):
        return SparseDNN(layers, bias, cap, backend=backend, **kw) if mine else None

    first = collective(comm, make, local_rank == 0)
    rest = collective(comm, make, local_rank != 0)
    return first or rest


def workers(layers, ranks_here: int) -> int:
    """Build processes per rank: none for a network SparseDNN builds in-process, else the node's CPUs
    shared among its ranks."""
    from ..spdnn_build import PARALLEL_EDGES

    edges = 32 * layers.neurons if hasattr(layers, "transposed") else getattr(layers[0], "nnz", 0)
    if edges * len(layers) < PARALLEL_EDGES:
        return 0
    return max(0, (os.cpu_count() or 1) // ranks_here - 1)
