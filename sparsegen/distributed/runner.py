"""The run of a distributed sparse network on one rank: segments of layers between boundaries, the
rebalancing rule at each boundary, rows moved by an MPI all-to-all (host-staged), the answer gathered.

Every input is its own row when a segment starts: deduplication (exact: bitwise-equal rows) runs
within each segment on each rank, so the per-layer table counts inputs exactly. A rank whose rows
are all at the cap past the network's proven-fixed layers skips the rest without computing it, as
one process does (spdnn_converge). Each rank runs the same boundaries and the same collective
calls in the same order: the rule decides from numbers every rank shares.
"""
from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from .. import spdnn_converge as cv
from .comm import ROOT, collective, host, library, node
from .rebalance import Boundary, decide
from .result import DistributedResult


class Runner:
    def __init__(self, net, part, comm, rule, converge, weights: str):
        self.net, self.part, self.comm, self.rule, self.weights = net, part, comm, rule, weights
        self.mode = cv.check_mode(net.converge if converge is None else converge)
        layers = self.layers = len(net.kernels)
        self.alive, self.distinct = np.zeros(layers, np.int64), np.zeros(layers, np.int64)
        self.skipped, self.passes = np.ones(layers, np.int8), []
        self.ids = np.arange(part.start, part.start + part.rows.shape[0], dtype=np.int64)
        self.rows = part.rows
        self.seconds = {"compute": 0.0, "staging": 0.0, "exchange": 0.0}
        self.counts = {"rows_computed": 0, "rows_sent": 0, "rows_received": 0, "segments": 0}
        self.boundary = None
        self.parts = {}

    def run(self, features: bool, extra: dict) -> DistributedResult:
        comm, layers = self.comm, self.layers
        place = collective(comm, self._placement)
        batch = collective(comm, self._batch, place["sharing"])
        bounds, decisions = self.rule.boundaries(layers, comm.size), []
        collective(comm, self._prepare, bounds)  # kernels loaded and weights on the GPU: setup, untimed
        comm.Barrier()
        t0 = time.perf_counter()
        at = 0
        while at < layers:  # over segments (a handful: the boundaries double)
            stop = next((b for b in bounds if b > at), layers)
            collective(comm, self._segment, at, stop, batch)
            at = stop
            if at < layers:
                t = time.perf_counter()
                decision = decide(at, layers, comm.allgather(self.boundary), self.rule,
                                  next((b for b in bounds if b > at), None))
                if decision.move:
                    self._exchange(decision.transfers)
                if not decision.go_on:
                    bounds = []
                decisions.append(decision.to_dict())
                self.seconds["exchange"] += time.perf_counter() - t
        elapsed = self.done - t0  # up to this rank's last row, not the agreement that follows it
        return self._gather(features, elapsed, {**place, **extra}, decisions)

    # ------------------------------------------------------------------------------------ segments

    def _placement(self) -> dict:
        local, local_rank = node(self.comm)
        device = None
        if self.net.backend == "gpu":
            from .. import runtime

            device = runtime.device_ordinal()
        sharing = local.allgather(device).count(device) if device is not None else 0
        local.Free()
        return {"local_rank": local_rank, "device": "emulate" if device is None else device, "sharing": sharing}

    def _batch(self, sharing: int):
        """Rows per device batch when ranks share a GPU: each takes its share of the device's memory
        (alone, a rank lets the driver size its batch from the free memory)."""
        if self.net.backend != "gpu" or sharing < 2:
            return None
        from .. import runtime
        from ..spdnn_gpu import GpuRun

        runtime.ensure_context()
        free, total = runtime._driver().mem_get_info()
        per_row = GpuRun.bytes_per_row(SimpleNamespace(net=self.net))
        return max(1, int(0.6 * min(free, total / sharing)) // per_row)

    def _prepare(self, bounds):
        """Every segment the run may take set up on the device: those between boundaries, and from
        each boundary to the end (where the rule stops rebalancing)."""
        self.net.prepare(self.weights)
        edges = [0, *bounds, self.layers]
        spans = set(zip(edges, edges[1:])) | {(b, self.layers) for b in bounds}
        for at, stop in sorted(spans):
            self._part(at, stop).prepare(self.weights)

    def _part(self, at: int, stop: int):
        """Layers [at, stop) as a network (the whole network itself for [0, layers)), made once."""
        if (at, stop) == (0, self.layers):
            return self.net
        if (at, stop) not in self.parts:
            self.parts[at, stop] = self.net.segment(at, stop)
        return self.parts[at, stop]

    def _segment(self, at: int, stop: int, batch):
        try:
            self._compute(at, stop, batch)
        finally:
            self.done = time.perf_counter()

    def _compute(self, at: int, stop: int, batch):
        width = self.net.kernels[stop - 1].shape[0]
        k = self.ids.size
        if k == 0 or self._converged(at):
            if k:
                self.alive[at:stop] = k
            self.rows = np.full((k, width), np.float32(self.net.cap or 0), np.float32)
            self.boundary = Boundary(k, width, 0.0, 0, 0.0)
            return
        part = self._part(at, stop)
        t = time.perf_counter()
        r = part.run(self.rows, batch=batch, converge=self.mode, weights=self.weights)
        wall = time.perf_counter() - t
        compute = r.timings_ms["inference"] / 1e3
        self.ids, self.rows = self.ids[r.ids], r.features
        self.alive[at:stop], self.distinct[at:stop] = r.alive_per_layer, r.distinct_per_layer
        self.skipped[at:stop] = r.skipped
        self.passes += [replace(p, layer=p.layer + at) for p in r.passes]
        self.seconds["compute"] += compute
        self.seconds["staging"] += max(0.0, wall - compute)
        self.counts["rows_computed"] += r.rows_computed
        self.counts["segments"] += 1
        self.boundary = Boundary(self.ids.size, width, compute, r.rows_computed, max(0.0, wall - compute))

    def _converged(self, at: int) -> bool:
        """Every row at the cap, and every layer from `at` on proven to keep it there."""
        return self.mode == "auto" and at > 0 and self.net.converged(self.rows, at)

    # -------------------------------------------------------------------------------------- moving

    def _exchange(self, transfers: np.ndarray):
        """Rows and their ids to where `transfers` says: each rank keeps its first rows and sends the
        rest, in rank order (MPI all-to-all of whole rows, through host memory)."""
        from mpi4py import MPI

        me = self.comm.rank
        send, recv = transfers[me], transfers[:, me]
        keep = self.ids.size - int(send.sum())
        rows = np.ascontiguousarray(self.rows, np.float32)
        sends = (send.tolist(), (keep + np.concatenate([[0], np.cumsum(send)[:-1]])).tolist())
        recvs = (recv.tolist(), np.concatenate([[0], np.cumsum(recv)[:-1]]).tolist())
        got = np.empty((int(recv.sum()), rows.shape[1]), np.float32)
        got_ids = np.empty(int(recv.sum()), np.int64)
        row = MPI.FLOAT.Create_contiguous(rows.shape[1]).Commit()
        try:
            self.comm.Alltoallv([rows, sends, row], [got, recvs, row])
        finally:
            row.Free()
        self.comm.Alltoallv([self.ids, sends, MPI.INT64_T], [got_ids, recvs, MPI.INT64_T])
        self.rows = np.concatenate([rows[:keep], got])
        self.ids = np.concatenate([self.ids[:keep], got_ids])
        self.counts["rows_sent"] += int(send.sum())
        self.counts["rows_received"] += int(recv.sum())

    # ------------------------------------------------------------------------------------ gathering

    def _gather(self, features: bool, elapsed: float, extra: dict, decisions) -> DistributedResult:
        from mpi4py import MPI

        comm = self.comm
        for table, op in ((self.alive, MPI.SUM), (self.distinct, MPI.SUM), (self.skipped, MPI.MIN)):
            comm.Allreduce(MPI.IN_PLACE, table, op=op)
        record = {"rank": comm.rank, "host": host(), **extra, "inputs": int(self.part.rows.shape[0]),
                  "first_input": self.part.start + 1, "survivors": int(self.ids.size), **self.counts,
                  "time_ms": 1e3 * elapsed, **{f"{k}_ms": 1e3 * v for k, v in self.seconds.items()}}
        ranks = tuple(comm.allgather(record))
        passes = comm.gather(self.passes, root=ROOT)
        ids = self._gatherv(self.ids, MPI.INT64_T)
        feats = self._gatherv(np.ascontiguousarray(self.rows, np.float32), None) if features else None
        if comm.rank == ROOT:
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
            feats = feats[order] if feats is not None else None
            passes = tuple(sorted((p for ps in passes for p in ps), key=lambda p: (p.layer, p.batch)))
        else:
            ids, passes = np.zeros(0, np.int64), ()
        slowest = max(r["time_ms"] for r in ranks)
        timings = {"inference": slowest, "compute": max(r["compute_ms"] for r in ranks)}
        return DistributedResult(ids=ids, features=feats, alive_per_layer=tuple(int(a) for a in self.alive),
                                 inputs=self.part.total, edges=self.net.edges, timings_ms=timings,
                                 distinct_per_layer=tuple(int(d) for d in self.distinct),
                                 skipped=tuple(bool(s) for s in self.skipped), passes=passes, converge=self.mode,
                                 ranks=ranks, boundaries=tuple(decisions), size=comm.size, rebalance=self.rule.mode,
                                 library=library())

    def _gatherv(self, array: np.ndarray, mpi_type):
        """`array`'s rows from every rank, on rank 0 in rank order (None elsewhere)."""
        from mpi4py import MPI

        comm = self.comm
        counts = comm.gather(int(array.shape[0]), root=ROOT)
        width = array.shape[1] if array.ndim == 2 else 0
        kind = MPI.FLOAT.Create_contiguous(width).Commit() if width else mpi_type
        try:
            if comm.rank != ROOT:
                comm.Gatherv([array, kind], None, root=ROOT)
                return None
            out = np.empty((sum(counts), width) if width else sum(counts), array.dtype)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
            comm.Gatherv([array, kind], [out, (counts, displs), kind], root=ROOT)
            return out
        finally:
            if width:
                kind.Free()
