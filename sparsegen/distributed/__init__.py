"""Sparse DNN inference over MPI ranks (mpi4py): weights replicated, inputs partitioned, the surviving
rows rebalanced between ranks, the answer gathered on rank 0.

    mpiexec -n 4 sparsegen spdnn --weights DIR --inputs FILE [--categories FILE]

    from sparsegen import distributed as dist
    comm = dist.world()                                        # MPI.COMM_WORLD
    part = dist.read_inputs("inputs.tsv", 1024, comm)          # this rank's inputs, read by this rank
    net = dist.build(layers, comm, bias=-0.3, cap=32)          # a SparseDNN on every rank
    result = dist.run(net, part, comm, features=True)          # ids, categories, features on rank 0

One GPU per rank: local rank (MPI's shared-memory communicator) mod the node's device count, so
several ranks may share a GPU. Every rank builds the network, the node's first rank before the
others (they then load its kernels from the cache). A failure on any rank is raised on every rank
at the next point where the ranks agree, never a hang: the failing rank raises its own error, the
others `RankError` naming it. inputs.py says how each input format is shared out, rebalance.py when
rows move, runner.py how a run goes.
"""
from __future__ import annotations

from ..spdnn import SparseDNN
from .comm import RankError, collective, launched, mpiexec_command, world
from .inputs import InputSlice, read_inputs
from .network import build
from .rebalance import RebalanceRule
from .result import DistributedResult
from .runner import Runner

__all__ = ["world", "launched", "mpiexec_command", "read_inputs", "build", "run", "collective", "RankError",
           "InputSlice", "RebalanceRule", "DistributedResult"]


def run(net: SparseDNN, part: InputSlice, comm, *, rule: RebalanceRule | None = None, features: bool = False,
        converge: str | None = None, weights: str = "resident", extra: dict | None = None) -> DistributedResult:
    """Every rank's inputs through the network, rebalanced by `rule` (default RebalanceRule()), the
    answer gathered on rank 0; features=True gathers the survivors' features too. Call it on every
    rank. extra: this rank's numbers for its row of the per-rank table (read and build times)."""
    return Runner(net, part, comm, rule or RebalanceRule(), converge, weights).run(features, extra or {})
