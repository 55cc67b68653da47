"""Sparse DNN inference (the Graph Challenge workload): compile every layer, run the network.

    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32)      # layers: W_l, inputs x outputs
    result = net.run(inputs)                                   # inputs: (count, neurons) sparse or dense
    result.ids, result.features, result.teraedges_per_s

Y_{l+1} = min(max(Y_l · W_l + b_l, 0), cap), layer after layer; inputs whose row became all zero are
dropped as the network goes. On the GPU the dropping happens on the device: each layer kernel
flags the rows that produced a nonzero, a pruning kernel compacts the alive list, and the next
layer reads the alive count from device memory, so the host launches all layers without waiting
for any of them (the 2020 code copied the flags back and compacted on the host every layer).

converge="auto" (the default) computes each distinct row once and stops where the network has
converged, exactly: the same ids and the same fp32 features, bit for bit (spdnn_converge.py).
"""
from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from . import api, graph
from .analyze import ell_padding
from . import graphchallenge as gc
from . import spdnn_converge as cv
from .errors import ShapeError
from .families.spdnn_sliced_ell import default_block, layer_bias
from .formats import sliced_ell
from .io import as_csr
from .spdnn_build import LayerJob, Progress, build as build_layers, layer_matrix, prove, workers_for
from .values import check_matrix, check_numbers


@dataclass(frozen=True)
class Result:
    """Surviving inputs (0-based ids, ascending), their final features, and how the run went.

    alive_per_layer: inputs alive after each layer (the challenge's count); distinct_per_layer: rows
    each layer computed (inputs with equal rows computed once; 0 where the layer was skipped);
    skipped: whether each layer was skipped (its rows were at a proven fixed point, or none was
    left); passes: the deduplication candidates and what each decided."""

    ids: np.ndarray
    features: np.ndarray
    alive_per_layer: tuple
    inputs: int
    edges: int  # sum over layers of nnz(W_l)
    timings_ms: dict = field(default_factory=dict)
    distinct_per_layer: tuple = ()
    skipped: tuple = ()
    passes: tuple = ()
    converge: str = "off"
    memory: dict = field(default_factory=dict)
    launches: dict = field(default_factory=dict)  # GPU: layers launched per batch, the tail's first layer
    layer_ms: tuple = ()  # GPU with split=True: per layer, ms of its kernel, deduplication and pruning

    @property
    def categories(self) -> np.ndarray:
        """1-based ids, as the challenge's answer files list them."""
        return self.ids + 1

    @property
    def teraedges_per_s(self) -> float | None:
        """inputs x sum(nnz) / inference time (kernels and pruning), as the challenge counts it: every
        layer's edges, skipped layers included."""
        ms = self.timings_ms.get("inference")
        return self.inputs * self.edges / (ms * 1e-3) / 1e12 if ms else None

    @property
    def rows_computed(self) -> int:
        """Rows computed over the run, summed over layers (inputs x layers without converge)."""
        return int(sum(self.distinct_per_layer))

    @property
    def layers_run(self) -> int:
        return int(sum(not s for s in self.skipped))

    def summary(self) -> str:
        """How many layers ran on how many distinct rows (one line)."""
        ran = [d for d, s in zip(self.distinct_per_layer, self.skipped) if not s]
        passes = [p for p in self.passes if p.ran]
        rows = f"{min(ran)}-{max(ran)}" if ran and min(ran) != max(ran) else f"{ran[0] if ran else 0}"
        tail = self.launches.get("tail_from")
        return (f"{self.layers_run} of {len(self.skipped)} layers ran, on {rows} distinct rows ({self.rows_computed} "
                f"row-layers in all); {len(passes)} deduplication pass(es) removed {sum(p.removed for p in passes)} "
                f"rows" + (f"; layers {min(tail) + 1} on in one launch" if tail else "") + f"; converge {self.converge}")

    def per_layer(self) -> list[dict]:
        """The per-layer table: alive inputs, distinct rows computed, skipped (and, timed with
        split=True, the GPU ms of the layer's launches)."""
        rows = [{"layer": l + 1, "alive_inputs": a, "distinct_rows": d, "skipped": s}
                for l, (a, d, s) in enumerate(zip(self.alive_per_layer, self.distinct_per_layer, self.skipped))]
        for row, ms in zip(rows, self.layer_ms):
            row["ms"] = ms
        return rows


class SparseDNN:
    """A compiled sparse network: one kernel per layer (layers with equal specs share a cubin).

    layers: W_1..W_L (challenge convention: inputs x outputs, so shapes chain as W_l.shape[1] ==
    W_{l+1}.shape[0]), a list or any sequence that makes them on demand (graphchallenge.GeneratedNetwork).
    bias: one number, or one entry per layer, each a number or an array over the layer's outputs.
    converge: "auto" (deduplicate rows, skip layers proven to fix the converged rows, run the last
    rows' layers in one launch) or "off"; exact either way. workers: processes that build the layers
    (None: one per CPU for large networks, 0: none). progress: None (a counter on a terminal), a bool,
    or a callable(done, total, seconds). build: "all" (every layer built now) or "lazy" (every
    layer's fixed-point proof now, the first LAZY_FIRST layers built, the others as a run reaches
    them: a converged run builds none of the layers it skips).
    """

    def __init__(self, layers, bias, cap: float | None = 32.0, *, bias_rule: str = "nonzero",
                 convention: str = "challenge", backend: str = "auto", arch: str | None = None,
                 minibatch: int = 16, block: int | None = None, unroll: bool = True,
                 relabel: str = "auto", converge: str = "auto", workers: int | None = None,
                 progress=None, build: str = "all"):
        count = len(layers)
        if build not in BUILDS:
            raise ShapeError(f"build must be one of {', '.join(map(repr, BUILDS))}, got {build!r}")
        if not count:
            raise ShapeError("a network needs at least one layer")
        if convention not in ("challenge", "rows_out"):
            raise ShapeError("convention must be 'challenge' (W: inputs x outputs) or 'rows_out' (A = W^T)")
        self.cap = None if cap is None else float(check_numbers(cap, "float32", "cap"))
        self.bias_rule = bias_rule
        self.converge = cv.check_mode(converge)
        biases = [check_numbers(b, "float32", "bias") for b in gc.layer_biases(bias, count)]
        t0 = time.perf_counter()
        lazy = not isinstance(layers, (list, tuple))
        if not lazy:
            _check_chain(layers, convention)
        options = {"minibatch": minibatch, "unroll": unroll, **({"block": block} if block else {})}
        sample = [layer_matrix(layers, i, convention) for i in range(min(RELABEL_SAMPLE, count))]
        tile = block or default_block(sample[0].shape[0])
        self.relabel = choose_relabeling(sample, tile, relabel)
        backend = api._resolve_backend(backend)
        edges = sum(a.nnz for a in sample) * count // len(sample)
        pool = workers_for(layers, edges, workers)
        request = {"cap": self.cap, "bias_rule": bias_rule, "options": options, "arch": api._resolve_arch(arch, backend),
                   "device": api._resolve_device(None, backend), "cubin": backend == "gpu" and pool > 0}

        def job(l, orders):
            return LayerJob(l, None if lazy else layers[l], layers if lazy else None, convention,
                            orders[l - 1] if l and self.relabel.applied else None,
                            orders[l] if self.relabel.applied else None, biases[l], request)

        self.count, self.build_mode, self.workers = count, build, pool
        self._job, self._backend = job, backend
        self._chain = (layers, convention, tile if relabel == "graph" else None) if self.relabel.applied else None
        self._show = sys.stderr.isatty() if progress is None else progress
        self._orders, self.kernels, self.output_order, self.compile_ms = [], [], None, 0.0
        if build == "lazy":
            proven = prove([LayerJob(l, None if lazy else layers[l], layers if lazy else None, convention, None, None,
                                     biases[l], request) for l in range(count)], pool)
            self.fixed = tuple(f for f, _, _ in proven)
            self._shapes, self._nnz = [s for _, s, _ in proven], [n for _, _, n in proven]
            _check_shapes(self._shapes)
        built = self._extend(count if build == "all" else min(count, LAZY_FIRST), t0)
        if build == "all":
            self.fixed = tuple(built)
            self._shapes = [tuple(k.shape) for k in self.kernels]
            self._nnz = [int(k.plan.constants["nnz"]) for k in self.kernels]
            _check_shapes(self._shapes)
        self.fixed_from = cv.fixed_from(self.fixed)
        self.backend = self.kernels[0].backend
        self._runs = {}  # (weights, prune) -> the GPU driver's per-network setup, reused by every run
        self._parts = {}  # (start, stop) -> the segment a lazy network's run takes

    def _extend(self, stop: int, t0: float | None = None) -> list:
        """Build layers len(kernels)..stop-1 (the relabeling chain continues from the last one built);
        returns their fixed-point flags. The time goes into compile_ms."""
        start = len(self.kernels)
        if stop <= start:
            return []
        t = time.perf_counter() if t0 is None else t0
        bar = Progress(stop - start, self._show, "compiled layer")
        built, _ = build_layers(self._job, stop, self._backend, self.workers, bar, self._chain, start, self._orders)
        bar.close()
        self.kernels = self.kernels + [k for k, _ in built]
        if len(self.kernels) == self.count and self.relabel.applied:
            self.output_order = self._orders[-1]
        self.compile_ms += 1e3 * (time.perf_counter() - t)
        self._runs = {}
        return [f for _, f in built]

    @property
    def layers_built(self) -> int:
        """Layers compiled so far (all of them with build="all")."""
        return len(self.kernels)

    def segment(self, start: int, stop: int) -> "SparseDNN":
        """Layers [start, stop) as a network of their own, sharing this one's compiled kernels.

        Its `run` takes the rows entering layer `start` and returns those leaving layer stop - 1,
        with ids that index the given rows. Between segments the rows are in the network's hidden
        neuron labels (relabeling renames them); only a segment that ends at the last layer puts
        its features back in the original labels. Running the segments one after the other on the
        surviving rows gives the whole network's ids and features, bit for bit: each row's layers
        read that row alone, deduplication merges only bitwise-equal rows, and a segment skips a
        layer only when the layer is proven to fix the all-cap row (its own suffix of `fixed`)."""
        count = self.count
        if not 0 <= start < stop <= count:
            raise ShapeError(f"segment [{start}, {stop}) of a {count}-layer network: expected 0 <= start < stop <= {count}")
        self._extend(stop)
        part = copy.copy(self)
        part.kernels = self.kernels[start:stop]
        part.count, part.build_mode = stop - start, "all"
        part._shapes, part._nnz = self._shapes[start:stop], self._nnz[start:stop]
        part.fixed = self.fixed[start:stop]
        part.fixed_from = cv.fixed_from(part.fixed)
        part.output_order = self.output_order if stop == count else None
        part._runs, part._parts = {}, {}
        return part

    def _part(self, start: int, stop: int) -> "SparseDNN":
        if (start, stop) not in self._parts:
            self._parts[start, stop] = self.segment(start, stop)
        return self._parts[start, stop]

    def prepare(self, weights: str = "resident") -> "SparseDNN":
        """Load the layer kernels and, with resident weights, copy every layer to the GPU now, so that
        the next run's time is the inference alone (a run does this itself when it has not been done).
        Nothing to do on the emulator."""
        if self.backend == "gpu":
            if self.layers_built < self.count:  # a lazy network runs its first window first
                self._part(0, self.layers_built).prepare(weights)
            else:
                self._gpu_run(weights, "device")
        return self

    def release(self) -> None:
        """Drop the layers' device copies now (a later GPU run uploads them again)."""
        self._runs = {}
        for part in self._parts.values():
            part._runs = {}
        for k in self.kernels:
            k._device_arrays = None

    def _gpu_run(self, weights: str, prune: str):
        """The GPU driver's setup for this network (functions loaded, launch geometry, the tail's layer
        table), made once per mode: a run then pays only for its own buffers and launches. A setup
        whose layers' device copies were since dropped (by this network or one sharing its kernels)
        is made again."""
        from . import runtime
        from .spdnn_gpu import GpuRun

        run = self._runs.get((weights, prune))
        if run is None or not run.current():
            run = self._runs[weights, prune] = GpuRun(self, runtime, weights, prune)
        return run

    @property
    def neurons(self) -> int:
        """Input neurons (the first layer's)."""
        return self._shapes[0][1]

    @property
    def outputs(self) -> int:
        """Output neurons (the last layer's)."""
        return self._shapes[-1][0]

    @property
    def width(self) -> int:
        """The widest layer, inputs or outputs: the row length of the activation buffers."""
        return max(max(shape) for shape in self._shapes)

    @property
    def edges(self) -> int:
        return int(sum(self._nnz))

    @property
    def specs(self) -> list[str]:
        """The distinct kernel specs of the layers built (often one for all of them)."""
        return sorted({k.spec.name for k in self.kernels})

    def run(self, inputs, batch: int | None = None, *, weights: str = "resident", prune: str = "device",
            converge: str | None = None, split: bool = False) -> Result:
        """Run every layer over `inputs` (count x neurons); returns the survivors.

        weights="streamed" copies each layer's weights to the GPU just ahead of its use (double
        buffered on a second stream) instead of keeping all layers resident. prune="device" prunes on
        the GPU (in the layer kernel itself where one tile holds the whole layer); "kernel" always in a
        pruning kernel of its own, and "host" with the 2020 code's per-layer host round trip, both kept
        for comparison (converge is off with "host"). converge: this run's mode (default: the
        network's). split=True also times every launch (layer kernels, deduplication, pruning, the
        tail; an event after each, which costs host time): `timings_ms` sums them by kind and
        `layer_ms` gives them per layer."""
        mode = cv.check_mode(self.converge if converge is None else converge)
        if prune == "host":
            mode = "off"
        x = as_csr(inputs)
        check_matrix(x, "float32", "<inputs>")
        x = x.astype(np.float32)
        if x.shape[1] != self.neurons:
            raise ShapeError(f"inputs: expected {self.neurons} columns (neurons), got {x.shape[1]}")
        if self.layers_built < self.count:
            if mode == "auto":
                return self._run_windows(x, batch, weights, prune, split)
            self._extend(self.count)  # converge off computes every layer
        if self.backend == "emulate":
            t0 = time.perf_counter()
            traces, parts = self._run_emulated(x, mode == "auto")
            timings, memory = {"compile": self.compile_ms, "inference": 1e3 * (time.perf_counter() - t0),
                               "emulated": True}, {}
            batch, launches = max(1, x.shape[0]), {}
        else:
            traces, parts, batch, timings, memory, launches = self._gpu_run(weights, prune).run(
                x, batch, mode == "auto", split)
        result = self._result(x, traces, parts, batch, mode)
        layer_ms = tuple(launches.pop("ms_per_layer", ()))
        return self._in_original_labels(replace(result, timings_ms=timings, memory=memory, launches=launches,
                                                layer_ms=layer_ms))

    def converged(self, rows, at: int) -> bool:
        """Whether `rows` (the rows entering layer `at`, dense) are all at the cap and every layer from
        `at` on is proven to keep them there: the rest of the network can be skipped."""
        return (self.cap is not None and at >= self.fixed_from and isinstance(rows, np.ndarray)
                and bool((rows == np.float32(self.cap)).all()))

    def _run_windows(self, x, batch, weights: str, prune: str, split: bool) -> Result:
        """A lazy network's converging run: windows of layers (LAZY_FIRST, then doubling), each built
        when reached and run as a segment on the rows the last one left. Once the rows are all at the
        cap past the proven-fixed layers, or none is left, the rest is skipped unbuilt. Exact as the
        whole run: segments chain bit for bit (`segment`)."""
        count = self.count
        ids, rows, at = np.arange(x.shape[0]), x, 0
        alive, distinct, skipped, passes, layer_ms, windows = [], [], [], [], [], []
        timings, memory = {}, {}
        while True:
            stop = min(count, max(LAZY_FIRST, 2 * at))
            r = self._part(at, stop).run(rows, batch, weights=weights, prune=prune, converge="auto", split=split)
            ids, rows = ids[r.ids], r.features
            alive += r.alive_per_layer
            distinct += r.distinct_per_layer
            skipped += r.skipped
            passes += [replace(p, layer=p.layer + at) for p in r.passes]
            layer_ms += r.layer_ms
            windows.append({"layers": [at + 1, stop], **r.launches})
            for key, value in r.timings_ms.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    timings[key] = timings.get(key, 0) + value
            for key, value in r.memory.items():
                memory[key] = max(memory.get(key, 0), value)
            at = stop
            if at == count:
                break
            if not ids.size or self.converged(rows, at):
                rest = count - at
                alive += [int(ids.size)] * rest
                distinct += [0] * rest
                skipped += [True] * rest
                rows = np.full((ids.size, self.outputs), self.cap or 0, np.float32)
                break
        timings["compile"] = self.compile_ms
        launches = {"windows": windows, "tail_from": [t + w["layers"][0] - 1 for w in windows for t in w.get("tail_from", ())]}
        return Result(ids.astype(np.int64), np.asarray(rows, np.float32), tuple(alive), x.shape[0], self.edges, timings,
                      tuple(distinct), tuple(skipped), tuple(passes), "auto", memory, launches, tuple(layer_ms))

    def _result(self, x, traces, parts, batch, mode) -> Result:
        ids, feats = [], []
        for b, (trace, reps) in enumerate(zip(traces, parts)):
            rows = min(batch, x.shape[0] - b * batch)
            i, f = cv.expand(trace, reps, rows)
            ids.append(i + b * batch)
            feats.append(f)
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        feats = np.concatenate(feats) if feats else np.zeros((0, self.outputs), np.float32)
        alive, distinct, skipped = cv.per_layer(traces, self.count)
        return Result(ids.astype(np.int64), feats.astype(np.float32, copy=False), alive, x.shape[0], self.edges,
                      {}, distinct, skipped, cv.pass_records(traces), mode)

    def _in_original_labels(self, result: Result) -> Result:
        """Relabeled networks compute the last layer's neurons in their new order: put them back."""
        if self.output_order is None:
            return result
        features = np.empty_like(result.features)
        features[:, self.output_order] = result.features
        return replace(result, features=features)

    def _run_emulated(self, x, converge: bool):
        """The GPU driver's run in NumPy: the same layers (as the plans hold them), the same converge
        decisions, so the same per-layer table."""
        def layer(l, y):
            k = self.kernels[l]
            return sliced_ell.layer(k.plan, y, layer_bias(k.spec, k.plan), self.cap, self.bias_rule)

        trace, rows = cv.run(layer, x.toarray(), self.count, self.cap, self.fixed_from, converge)
        reps = cv.final_rows(trace, rows, self.count, self.outputs, self.cap)
        return [trace], [reps]


def _check_shapes(shapes) -> None:
    """Each layer's (outputs, inputs) must take the previous layer's outputs."""
    for l in range(1, len(shapes)):
        if shapes[l][1] != shapes[l - 1][0]:
            raise ShapeError(f"layer {l + 1} takes {shapes[l][1]} inputs but layer {l} has {shapes[l - 1][0]} outputs")


def _check_chain(layers, convention: str) -> None:
    """Shapes must chain (checked before anything is built, where the layers tell their shapes)."""
    shapes = [getattr(w, "shape", None) for w in layers]
    if any(s is None or len(s) != 2 for s in shapes):
        return
    io = [(s[0], s[1]) if convention == "challenge" else (s[1], s[0]) for s in shapes]
    for l in range(1, len(io)):
        if io[l][0] != io[l - 1][1]:
            raise ShapeError(f"layer {l + 1} takes {io[l][0]} inputs but layer {l} has {io[l - 1][1]} outputs")


@dataclass(frozen=True)
class Relabeling:
    """Whether hidden neurons were relabeled, and the input footprints (distinct inputs summed over
    tiles) of the sampled layers that decided it."""

    applied: bool
    reason: str
    footprint_before: int = 0
    footprint_after: int = 0


BUILDS = ("all", "lazy")
LAZY_FIRST = 32  # layers a lazy network builds up front; a run's later windows double (the challenge's converge by ~26)
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
