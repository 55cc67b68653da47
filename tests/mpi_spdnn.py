"""Run under mpiexec by tests/test_distributed.py: a network over MPI ranks through the public API of
sparsegen.distributed, on the emulator unless --backend gpu; rank 0 writes the answer and the tables to an .npz."""
from __future__ import annotations

import argparse
import json

import numpy as np

from sparsegen import distributed as dist
from sparsegen import graphchallenge as gc


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--weights", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--bias", type=float, default=-0.3)
    p.add_argument("--rebalance", default="off")
    p.add_argument("--converge", default="auto")
    p.add_argument("--backend", default="emulate")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    comm = dist.world()
    layers = gc.read_network(a.weights, layers=a.layers)
    part = dist.read_inputs(a.inputs, layers[0].shape[0], comm)
    net = dist.build(layers, comm, bias=a.bias, cap=32, backend=a.backend, converge=a.converge)
    r = dist.run(net, part, comm, rule=dist.RebalanceRule(mode=a.rebalance), features=True)
    if comm.rank == 0:
        np.savez(a.out, ids=r.ids, features=r.features, alive=np.array(r.alive_per_layer),
                 distinct=np.array(r.distinct_per_layer), ranks=json.dumps(r.per_rank()),
                 boundaries=json.dumps(list(r.boundaries)), how=part.how, size=r.size)


if __name__ == "__main__":
    main()
