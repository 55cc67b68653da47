"""Sparse DNN inference (the Graph Challenge workload): compile every layer, run the network.

    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32)      # layers: W_l, inputs x outputs
    result = net.run(inputs)                                   # inputs: (count, neurons) sparse or dense
    result.ids, result.features, result.teraedges_per_s

Y_{l+1} = min(max(Y_l · W_l + b, 0), cap), layer after layer; inputs whose row became all zero are
dropped as the network goes. On the GPU the dropping happens on the device: each layer kernel
flags the inputs that produced a nonzero, a pruning kernel compacts the alive list, and the next
layer reads the alive count from device memory, so the host launches all layers without waiting
for any of them (the 2020 code copied the flags back and compacted on the host every layer).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from . import api, graph
from .analyze import ell_padding
from .errors import ShapeError
from .families.spdnn_sliced_ell import default_block
from .formats import sliced_ell
from .io import as_csr
from .values import check_matrix, check_numbers

SUPPORT_BLOCK = 256


@dataclass(frozen=True)
class Result:
    """Surviving inputs (0-based ids, ascending), their final features, and how the run went."""

    ids: np.ndarray
    features: np.ndarray
    alive_per_layer: tuple
    inputs: int
    edges: int  # sum over layers of nnz(W_l)
    timings_ms: dict = field(default_factory=dict)

    @property
    def categories(self) -> np.ndarray:
        """1-based ids, as the challenge's answer files list them."""
        return self.ids + 1

    @property
    def teraedges_per_s(self) -> float | None:
        """inputs x sum(nnz) / inference time (kernels and pruning), as the challenge counts it."""
        ms = self.timings_ms.get("inference")
        return self.inputs * self.edges / (ms * 1e-3) / 1e12 if ms else None


class SparseDNN:
    """A compiled sparse network: one kernel per layer (layers with equal specs share a cubin)."""

    def __init__(self, layers, bias: float, cap: float | None = 32.0, *, bias_rule: str = "nonzero",
                 convention: str = "challenge", backend: str = "auto", arch: str | None = None,
                 minibatch: int = 16, block: int | None = None, unroll: bool = True,
                 relabel: str = "auto", progress: bool | None = None):
        if not len(layers):
            raise ShapeError("a network needs at least one layer")
        if convention not in ("challenge", "rows_out"):
            raise ShapeError("convention must be 'challenge' (W: inputs x outputs) or 'rows_out' (A = W^T)")
        self.bias = float(check_numbers(bias, "float32", "bias"))
        self.cap = None if cap is None else float(check_numbers(cap, "float32", "cap"))
        self.bias_rule = bias_rule
        t0 = time.perf_counter()
        show = sys.stderr.isatty() if progress is None else progress
        options = {"minibatch": minibatch, "unroll": unroll, **({"block": block} if block else {})}
        matrices = []
        for i, layer in enumerate(layers):
            w = as_csr(layer)
            check_matrix(w, "float32", f"<layer {i + 1}>")  # the layer kernel stores weights as float32
            a = w.T.tocsr() if convention == "challenge" else w
            a.sort_indices()
            if matrices and a.shape[1] != matrices[-1].shape[0]:
                raise ShapeError(f"layer {i + 1} takes {a.shape[1]} inputs but layer {i} has "
                                 f"{matrices[-1].shape[0]} outputs")
            matrices.append(a)
        tile = block or default_block(matrices[0].shape[0])
        self.relabel = choose_relabeling(matrices, tile, relabel)
        if self.relabel.applied:
            matrices, self.output_order = relabeled(matrices, tile, by_graph=relabel == "graph")
        else:
            self.output_order = None
        self.kernels = []
        for i, a in enumerate(matrices):
            self.kernels.append(api.compile(a, op="spdnn_layer", bias=bias, cap=cap, bias_rule=bias_rule,
                                            options=options, backend=backend, arch=arch))
            if show and time.perf_counter() - t0 > 1.0:
                print(f"\rsparsegen: compiled layer {i + 1}/{len(layers)}", end="", file=sys.stderr, flush=True)
        if show and time.perf_counter() - t0 > 1.0:
            print(file=sys.stderr)
        self.compile_ms = 1e3 * (time.perf_counter() - t0)
        self.backend = self.kernels[0].backend

    @property
    def neurons(self) -> int:
        return self.kernels[0].shape[1]

    @property
    def edges(self) -> int:
        return int(sum(k.plan.constants["nnz"] for k in self.kernels))

    @property
    def specs(self) -> list[str]:
        """The distinct kernel specs of the network (often one for all its layers)."""
        return sorted({k.spec.name for k in self.kernels})

    def run(self, inputs, batch: int | None = None, *, weights: str = "resident", prune: str = "device") -> Result:
        """Run every layer over `inputs` (count x neurons); returns the survivors.

        weights="streamed" copies each layer's weights to the GPU just ahead of its use (double
        buffered on a second stream) instead of keeping all layers resident; prune="host" is the
        2020 code's per-layer host round trip, kept for comparison."""
        x = as_csr(inputs)
        check_matrix(x, "float32", "<inputs>")
        x = x.astype(np.float32)
        if x.shape[1] != self.neurons:
            raise ShapeError(f"inputs: expected {self.neurons} columns (neurons), got {x.shape[1]}")
        if self.backend == "emulate":
            result = self._run_emulated(x)
        else:
            from . import runtime

            result = _GpuRun(self, runtime, weights, prune).run(x, batch)
        return self._in_original_labels(result)

    def _in_original_labels(self, result: Result) -> Result:
        """Relabeled networks compute the last layer's neurons in their new order: put them back."""
        if self.output_order is None:
            return result
        features = np.empty_like(result.features)
        features[:, self.output_order] = result.features
        return replace(result, features=features)

    def _run_emulated(self, x) -> Result:
        t0 = time.perf_counter()
        ids = np.arange(x.shape[0])
        y = x.toarray()
        alive = []
        for kernel in self.kernels:
            y = sliced_ell.layer(kernel.plan, y, self.bias, self.cap, self.bias_rule)
            keep = (y > 0).any(axis=1)
            ids, y = ids[keep], y[keep]
            alive.append(int(ids.size))
        ms = 1e3 * (time.perf_counter() - t0)
        return Result(ids, y, tuple(alive), x.shape[0], self.edges,
                      {"compile": self.compile_ms, "inference": ms, "emulated": True})


@dataclass(frozen=True)
class Relabeling:
    """Whether hidden neurons were relabeled, and the input footprints (distinct inputs summed over
    tiles) of the sampled layers that decided it."""

    applied: bool
    reason: str
    footprint_before: int = 0
    footprint_after: int = 0


RELABEL_GAIN = 0.9  # relabel when the sampled footprints shrink to 90 % or less
RELABEL_SAMPLE = 3  # layers sampled for the decision (a network repeats its kinds of layers)


def row_order(a: sp.csr_matrix, tile: int | None = None, by_graph: bool = False) -> np.ndarray:
    """The layer's rows in the order whose tiles of `tile` rows touch the fewest inputs: sorted by
    pattern (first column, last column, length); with `by_graph` (relabel="graph"), the reverse
    Cuthill-McKee order of the row graph where that shrinks the summed tile footprint without adding
    sliced-ELL padding (rule, probe data and why it is asked for, not the default:
    docs/decisions/008-graph-orders.md).

    Relabeling a layer's output neurons is free: it permutes the next layer's inputs too, and a
    tile's footprint -- how many distinct inputs its rows touch -- does not change when inputs are
    renamed. So each layer's rows can be ordered for its own footprints alone."""
    pattern = graph.pattern_order(a)
    if not by_graph:
        return pattern
    tile = tile or default_block(a.shape[0])
    rcm = graph.rcm_order(a)
    lengths = np.diff(a.indptr)
    if (graph.footprint(a, tile, rcm) < graph.footprint(a, tile, pattern)
            and ell_padding(lengths[rcm]) <= ell_padding(lengths[pattern])):
        return rcm
    return pattern


def tile_footprint(a: sp.csr_matrix, tile: int) -> int:
    """Distinct inputs per tile of `tile` rows, summed over tiles (what the gather loads per pass)."""
    rows = np.repeat(np.arange(a.shape[0], dtype=np.int64), np.diff(a.indptr))
    return int(np.unique(rows // tile * a.shape[1] + a.indices).size)


def choose_relabeling(matrices, tile: int, mode) -> Relabeling:
    if mode in (False, "never", "off"):
        return Relabeling(False, "relabeling off")
    sample = matrices[:RELABEL_SAMPLE]
    before = sum(tile_footprint(a, tile) for a in sample)
    if mode not in (True, "always", "on", "auto", "graph"):
        raise ShapeError(f"relabel must be 'auto', 'graph', 'always' or 'never', got {mode!r}")
    after = sum(tile_footprint(a[row_order(a, tile, mode == "graph")], tile) for a in sample)
    if mode in (True, "always", "on"):
        return Relabeling(True, "relabeling asked for", before, after)
    if len(matrices) > 1 and after <= RELABEL_GAIN * before:
        return Relabeling(True, f"footprints of the first {len(sample)} layers shrink {before} -> {after}",
                          before, after)
    return Relabeling(False, f"footprints would go {before} -> {after}: not worth it", before, after)


def relabeled(matrices, tile: int | None = None, by_graph: bool = False):
    """Each layer's rows in `row_order` for tiles of `tile` rows (default: the family's block), and
    the next layer's columns in the same order. Returns the new matrices and the final layer's order
    (new neuron i is original neuron order[i])."""
    out, previous = [], None
    for a in matrices:
        if previous is not None:
            a = a[:, previous].tocsr()
            a.sort_indices()
        order = row_order(a, tile, by_graph)
        a = a[order].tocsr()
        out.append(a)
        previous = order
    return out, previous


class _GpuRun:
    """One run of a network on the GPU: buffers, launches, timing.

    weights="resident": every layer's plan stays on the device. weights="streamed": each layer's
    arrays live in one pinned host buffer and are copied on a second stream into one of two device
    slots while the previous layer computes (double buffering). prune="device" compacts the alive
    list on the GPU; prune="host" copies the flags back and compacts on the host every layer, as
    the 2020 code did (kept to measure the difference).
    """

    def __init__(self, net: SparseDNN, runtime, weights: str = "resident", prune: str = "device"):
        if weights not in ("resident", "streamed") or prune not in ("device", "host"):
            raise ShapeError("weights must be 'resident' or 'streamed', prune 'device' or 'host'")
        self.net, self.rt, self.weights, self.prune_on = net, runtime, weights, prune
        self.drv = runtime._driver()
        runtime.ensure_context()
        self.sms = runtime.device().get_attribute(self.drv.device_attribute.MULTIPROCESSOR_COUNT)
        first = net.kernels[0]
        load = lambda name: runtime.load_function(first.cubin_key, first.cubin, name)  # noqa: E731
        self.prune, self.scatter, self.iota, self.gather = (load(n) for n in
                                                            ("spdnn_prune", "spdnn_scatter", "spdnn_iota", "spdnn_gather"))
        self.layers = []
        for k in net.kernels:
            geometry = k.family.launch(k.spec, k.plan, self.sms)
            func = runtime.load_function(k.cubin_key, k.cubin, k.family.KERNEL, geometry.shared_bytes)
            args = k.family.arguments(k.spec)
            names = [a.name for a in args if a.kind == "plan"]  # in the kernel's parameter order
            # prepared: packing 14 arguments by format string, not by inspection, on every launch
            func.prepare(runtime.arg_format(args))
            if weights == "resident":
                plan = k.device_arrays()
                self.layers.append((func, geometry, [int(plan[n]) for n in names]))
            else:
                self.layers.append((func, geometry, _pack(k.plan.arrays, names, self.drv)))
        self.prune.prepare("PPPPP")
        if weights == "streamed":
            size = max(packed.nbytes for _, _, (packed, _) in self.layers)
            self.slots = [self.drv.mem_alloc(size) for _ in range(2)]
            self.copy_stream, self.stream = self.drv.Stream(), self.drv.Stream()
        else:
            self.stream = None

    def run(self, x: sp.csr_matrix, batch: int | None) -> Result:
        drv, n = self.drv, self.net.neurons
        t_all = time.perf_counter()
        per_input = 2 * n * 4 + 3 * 4
        free, _ = drv.mem_get_info()
        batch = batch or max(1, min(x.shape[0], int(0.6 * free) // per_input))
        parts, timings = [], {"transfer": 0.0, "kernels": 0.0, "pruning": 0.0, "inference": 0.0}
        alive_total = np.zeros(len(self.layers), np.int64)
        for start in range(0, x.shape[0], batch):
            ids, feats, alive, t = self._run_batch(x[start:start + batch])
            parts.append((ids + start, feats))
            alive_total += alive
            for key_ in timings:
                timings[key_] += t[key_]
        ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        feats = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, n), np.float32)
        timings["compile"] = self.net.compile_ms
        timings["total_run"] = 1e3 * (time.perf_counter() - t_all)
        timings["batches"] = -(-x.shape[0] // batch) if x.shape[0] else 0
        return Result(ids, feats, tuple(int(a) for a in alive_total), x.shape[0], self.net.edges, timings)

    def _run_batch(self, x: sp.csr_matrix):
        drv, n, rows = self.drv, self.net.neurons, x.shape[0]
        layers = len(self.layers)
        t = time.perf_counter()
        y = [drv.mem_alloc(max(rows * n * 4, 4)) for _ in range(2)]
        alive = [drv.mem_alloc(max(rows * 4, 4)) for _ in range(2)]
        counts = drv.mem_alloc(8)
        flags = drv.mem_alloc(max(rows * 4, 4))
        history = drv.mem_alloc(max(layers * 4, 4))
        drv.memset_d32(y[0], 0, rows * n)
        drv.memset_d32(flags, 0, rows)
        indptr = drv.to_device(x.indptr.astype(np.int32))
        cols = drv.to_device(x.indices.astype(np.int32) if x.nnz else np.zeros(1, np.int32))
        vals = drv.to_device(x.data.astype(np.float32) if x.nnz else np.zeros(1, np.float32))
        grid = (min(max(rows, 1), 65535), 1, 1)
        self.scatter(indptr, cols, vals, y[0], np.int32(rows), np.int32(n), block=(SUPPORT_BLOCK, 1, 1), grid=grid)
        self.iota(alive[0], counts, np.int32(rows), block=(SUPPORT_BLOCK, 1, 1),
                  grid=(min(-(-max(rows, 1) // SUPPORT_BLOCK), 4096), 1, 1))
        drv.Context.synchronize()
        upload_ms = 1e3 * (time.perf_counter() - t)

        marks = [drv.Event() for _ in range(2 * layers + 1)]
        prune_grid = (min(-(-max(rows, 1) // SUPPORT_BLOCK), 8 * self.sms), 1, 1)
        c0, c1 = int(counts), int(counts) + 4
        ys, alives, flag_ptr, hist_ptr = [int(p) for p in y], [int(p) for p in alive], int(flags), int(history)
        stream = self.stream
        copied = self._prefetch(0, None) if self.weights == "streamed" else None
        host_alive = np.arange(rows, dtype=np.int32)
        marks[0].record(stream)
        for l, (func, geometry, fixed) in enumerate(self.layers):
            cur, nxt = (c0, c1) if l % 2 == 0 else (c1, c0)
            if self.weights == "streamed":
                stream.wait_for_event(copied)  # layer l's weights are in slot l % 2
                base, offsets = int(self.slots[l % 2]), fixed[1]
                fixed = [base + o for o in offsets]
            func.prepared_async_call(geometry.grid, geometry.block, stream, *fixed, ys[l % 2], ys[(l + 1) % 2],
                                     alives[l % 2], cur, nxt, flag_ptr, hist_ptr, l,
                                     shared_size=geometry.shared_bytes)
            marks[2 * l + 1].record(stream)
            if self.weights == "streamed" and l + 1 < layers:
                copied = self._prefetch(l + 1, marks[2 * l - 1] if l else None)
            if self.prune_on == "device":
                self.prune.prepared_async_call(prune_grid, (SUPPORT_BLOCK, 1, 1), stream, alives[l % 2], cur,
                                               flag_ptr, alives[(l + 1) % 2], nxt)
            else:
                host_alive = self._prune_on_host(host_alive, flag_ptr, alives[(l + 1) % 2], nxt)
            marks[2 * l + 2].record(stream)
        marks[-1].synchronize()
        kernels = sum(marks[2 * l].time_till(marks[2 * l + 1]) for l in range(layers))
        pruning = sum(marks[2 * l + 1].time_till(marks[2 * l + 2]) for l in range(layers))
        inference = marks[0].time_till(marks[-1])

        t = time.perf_counter()
        final = layers % 2
        count = np.zeros(1, np.int32)
        drv.memcpy_dtoh(count, c0 if final == 0 else c1)
        survivors = int(count[0])
        out = drv.mem_alloc(max(survivors * n * 4, 4))
        self.gather(y[final], alive[final], np.uintp(c0 if final == 0 else c1), out, np.int32(n),
                    block=(SUPPORT_BLOCK, 1, 1), grid=(min(max(survivors, 1), 65535), 1, 1))
        feats = np.empty((survivors, n), np.float32)
        ids = np.empty(survivors, np.int32)
        hist = np.empty(layers, np.int32)
        if survivors:
            drv.memcpy_dtoh(feats, out)
            drv.memcpy_dtoh(ids, alive[final])
        drv.memcpy_dtoh(hist, history)
        download_ms = 1e3 * (time.perf_counter() - t)
        order = np.argsort(ids, kind="stable")  # the pruning kernel appends in no fixed order
        alive_after = np.r_[hist[1:], survivors]
        timing = {"transfer": upload_ms + download_ms, "kernels": kernels, "pruning": pruning, "inference": inference}
        return ids[order].astype(np.int64), feats[order], alive_after, timing

    def _prefetch(self, l: int, slot_free):
        """Copy layer l's packed weights into slot l % 2 on the copy stream, once the layer that
        last used that slot (l - 2) is done; returns the event that marks the copy complete."""
        packed, _ = self.layers[l][2]
        if slot_free is not None:
            self.copy_stream.wait_for_event(slot_free)
        self.drv.memcpy_htod_async(self.slots[l % 2], packed, self.copy_stream)
        done = self.drv.Event()
        done.record(self.copy_stream)
        return done

    def _prune_on_host(self, host_alive, flag_ptr, alive_out, count_out):
        """The 2020 way: flags to the host, compact there, alive list and count back (a round trip)."""
        drv = self.drv
        flags = np.empty(host_alive.size, np.int32)
        if host_alive.size:
            drv.memcpy_dtoh(flags, flag_ptr)
        kept = np.ascontiguousarray(host_alive[flags != 0])
        if kept.size:
            drv.memcpy_htod(alive_out, kept)
        drv.memcpy_htod(count_out, np.array([kept.size], np.int32))
        if host_alive.size:
            drv.memset_d32(flag_ptr, 0, host_alive.size)
        return kept


ALIGN = 256


def _pack(arrays: dict, names, drv):
    """A layer's arrays in one pinned host buffer (256-byte aligned pieces) and their offsets."""
    offsets, total = [], 0
    for n in names:
        offsets.append(total)
        total += -(-arrays[n].nbytes // ALIGN) * ALIGN
    packed = drv.pagelocked_empty(max(total, ALIGN), np.uint8)
    for n, o in zip(names, offsets):
        raw = np.ascontiguousarray(arrays[n]).view(np.uint8).ravel()
        packed[o:o + raw.size] = raw
    return packed, offsets
