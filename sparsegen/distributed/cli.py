"""`sparsegen spdnn run` over MPI ranks: the same answer and record as one process, with the per-rank
table and the rebalancing decisions added; rank 0 prints.

It runs over MPI when the launcher says the job has more than one rank (comm.launched: mpiexec
sets PMI_SIZE or OMPI_COMM_WORLD_SIZE) or when --mpi asks for it. A failure every rank knows of
(comm.collective) is printed once, by rank 0, naming the failing rank; anything else aborts the
job (MPI_Abort) after the failing rank prints its error, so no rank is left waiting.
"""
from __future__ import annotations

import math
import sys
import time
import traceback

import numpy as np

from ..errors import SparsegenError
from ..io import detect_format
from .comm import ROOT, collective, library, one_line, world
from .inputs import read_inputs
from .network import build
from .rebalance import RebalanceRule


def main(args, gc, show, fail) -> int:
    """Run, print with show(record) on rank 0; returns the exit status (the same on every rank).
    fail(line, debug) prints a failure's one line the CLI's way."""
    comm = world()
    try:
        record = run(args, gc, comm)
        status = 0 if record is None or record["check"] in ("PASSED", "SKIPPED", None) else 1
        if record is not None:
            show(record)
        return comm.bcast(status, root=ROOT)
    except KeyboardInterrupt:
        comm.Abort(130)
    except Exception as exc:  # noqa: BLE001 - every failure ends the job with one line
        if getattr(exc, "agreed", False):
            if exc.__class__.__name__ != "RankError" and args.debug:
                traceback.print_exc()
            if comm.rank == ROOT:
                mine = exc.__class__.__name__ != "RankError"
                fail(f"error: {'rank 0: ' if mine else ''}{one_line(exc)}", False)
            return 2
        fail(f"error: rank {comm.rank} of {comm.size}: {one_line(exc)}", args.debug)
        sys.stderr.flush()
        comm.Abort(2)
    return 2


def run(args, gc, comm) -> dict | None:
    """The run; the record (run_spdnn's keys, plus ranks, boundaries and mpi) on rank 0, else None."""
    if args.host_pruning:
        raise SparsegenError("--host-pruning compares one process with the 2020 code's way; it does not run on MPI")
    rule = RebalanceRule(mode=args.rebalance)
    t = time.perf_counter()
    layers = collective(comm, gc.read_network, args.weights, layers=args.layers)
    neurons = layers[0].shape[0]
    part = read_inputs(args.inputs, neurons, comm, count=args.count, side=collective(comm, _side, args.inputs, neurons))
    read_ms = 1e3 * (time.perf_counter() - t)
    bias = args.bias if args.bias is not None else collective(comm, gc.bias_for, neurons)
    t = time.perf_counter()
    net = build(layers, comm, bias=bias, cap=args.cap, backend=args.backend, minibatch=args.minibatch,
                block=args.block, unroll=not args.runtime_trips, relabel=args.relabel, converge=args.converge)
    build_ms = 1e3 * (time.perf_counter() - t)
    weights = "streamed" if args.stream_weights else "resident"
    from . import run as run_network

    result = run_network(net, part, comm, rule=rule, weights=weights,
                         extra={"read_ms": read_ms, "build_ms": build_ms})
    input_nnz = comm.allreduce(int(part.rows.nnz))
    if comm.rank != ROOT:
        return None
    check, expected, note = _check(args, gc, result)
    return {
        "neurons": neurons, "layers": len(layers), "inputs": int(part.total), "input_nnz": input_nnz,
        "edges": net.edges, "bias": bias, "cap": args.cap, "backend": net.backend, "specs": net.specs,
        "weights": weights, "relabeling": {"applied": net.relabel.applied, "reason": net.relabel.reason},
        "pruning": "device", "survivors": int(result.ids.size), "categories": result.categories.tolist(),
        "check": check, "check_note": note, "expected": None if expected is None else int(expected.size),
        "alive_per_layer": list(result.alive_per_layer), "converge": result.converge,
        "converge_summary": result.summary(), "rows_computed": result.rows_computed,
        "per_layer": result.per_layer(), "passes": [p.to_dict() for p in result.passes],
        "teraedges_per_s": result.teraedges_per_s,
        "split_ms": {"read": read_ms, "compile": build_ms, **result.timings_ms},
        "mpi": {"ranks": comm.size, "library": library(), "rebalance": rule.mode, "inputs_read": part.how,
                "rows_moved": result.rows_moved, "imbalance_rows_computed": result.imbalance(),
                "imbalance_time": result.imbalance("time_ms")},
        "ranks": [_plain(r) for r in result.ranks], "boundaries": [_plain(b) for b in result.boundaries],
    }


def _side(path, neurons: int):
    """The image side MNIST IDX inputs are made at (None for other inputs)."""
    if detect_format(path) != "idx":
        return None
    side = math.isqrt(neurons)
    if side * side != neurons:
        raise SparsegenError(f"MNIST inputs need a square neuron count, the network has {neurons}")
    return side


def _check(args, gc, result):
    if not args.categories:
        return None, None, None
    if args.layers is not None:
        return "SKIPPED", None, f"the answer file is the whole network's; --layers {args.layers} ran part of it"
    expected = gc.read_categories(args.categories)
    if args.count is not None:
        expected = expected[expected <= args.count]
    note = ("inputs made from MNIST approximate the official ones, so a few categories may differ"
            if detect_format(args.inputs) == "idx" else None)
    return ("PASSED" if np.array_equal(result.categories, expected) else "FAILED"), expected, note


def _plain(d: dict) -> dict:
    """JSON-ready: NumPy scalars as Python numbers."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in d.items()}


def format_ranks(r: dict) -> str:
    """The text lines that follow format_spdnn's for a run over MPI: one per rank."""
    m = r["mpi"]
    lines = [f"mpi         {m['ranks']} ranks ({m['library']}), inputs {m['inputs_read'].split(':')[0]}; rebalance "
             f"{m['rebalance']}: {sum(b['move'] for b in r['boundaries'])} move(s), {m['rows_moved']} rows moved; "
             f"row-layers per rank max/mean {m['imbalance_rows_computed']:.2f}"]
    for k in r["ranks"]:
        lines.append(f"  rank {k['rank']:<3} {k['host']} device {k['device']}: inputs {k['inputs']} from "
                     f"{k['first_input']}, survivors {k['survivors']}, row-layers {k['rows_computed']}, rows sent "
                     f"{k['rows_sent']} received {k['rows_received']}; {k['time_ms']:.1f} ms (compute "
                     f"{k['compute_ms']:.1f}, staging {k['staging_ms']:.1f}, exchange {k['exchange_ms']:.1f})")
    return "\n".join(lines)
