"""Building a sparse network: each layer prepared, relabeled, encoded, compiled and proven (or not) to
fix the all-cap row -- in worker processes when the network is large.

A layer's build is independent of the others except for relabeling, whose chain (each layer's row
order renames the next layer's inputs) is cheap and stays in the calling process. Small networks go
through `api.compile`, layer by layer, with its plan cache. Large ones go to a process pool that
composes the stages itself with specs shared: each worker selects once per layer shape (the layer
family's choice reads the shape only), encodes and finalizes each layer's spec, and proves the
fixed point; nvcc runs once per distinct kernel body, in the pool too (the cubin cache shares it).
Their plans skip the plan cache: thousands of large layers would only evict each other there.
Workers make lazy layers themselves (`graphchallenge.GeneratedNetwork` pickles as three numbers),
so a network of 4 G edges never sits in memory as matrices.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import api
from .analyze import structure_hash
from .families import family_of
from .render import Provenance, header, render_body
from .io import as_csr
from .spdnn_converge import fixed_layer
from .values import check_matrix, check_numbers

PARALLEL_EDGES = 1 << 24  # below this many edges in all, worker start-up costs more than it saves
WINDOW = 64  # layers in flight between the relabeling chain and the pool


@dataclass(frozen=True)
class LayerJob:
    """What building layer `index` needs: its weights (`matrix`, or `source[index]` for a lazy source),
    the relabeling around it (input order = the previous layer's row order, and its own), its bias
    (in the given labels) and the compile request."""

    index: int
    matrix: object
    source: object
    convention: str
    columns: np.ndarray | None
    rows: np.ndarray | None
    bias: np.ndarray
    request: dict

    def prepared(self) -> sp.csr_matrix:
        if self.matrix is not None:
            return prepare(self.matrix, self.index, self.convention)
        return layer_matrix(self.source, self.index, self.convention)


def prepare(w, index: int, convention: str) -> sp.csr_matrix:
    """Layer `index` (0-based) as the kernels take it: float32 CSR, rows = output neurons, sorted."""
    w = as_csr(w)
    check_matrix(w, "float32", f"<layer {index + 1}>")  # the layer kernel stores weights as float32
    a = w.T.tocsr() if convention == "challenge" else w.tocsr()
    a.sort_indices()
    return a


def layer_matrix(source, index: int, convention: str) -> sp.csr_matrix:
    """Layer `index` of a sequence of layers, prepared; a lazy network that makes its layers'
    transposes itself (graphchallenge.GeneratedNetwork.transposed) is asked for that instead."""
    if convention == "challenge" and hasattr(source, "transposed"):
        a = source.transposed(index)
        check_matrix(a, "float32", f"<layer {index + 1}>")
        return a
    return prepare(source[index], index, convention)


def layer_bias(bias, index: int, outputs: int) -> np.ndarray:
    """The layer's bias as float32: 0-d, or one per output neuron (ShapeError naming the layer)."""
    from .graphchallenge import check_layer_bias

    b = check_layer_bias(np.asarray(bias), index + 1, outputs)
    return check_numbers(b, "float32", f"bias of layer {index + 1}").astype(np.float32)


def relabeled_layer(job: LayerJob):
    """The layer's matrix (rows = outputs) and float32 bias, relabeled as the job says."""
    a = job.prepared()
    b = layer_bias(job.bias, job.index, a.shape[0])
    if job.columns is not None:
        a = a[:, job.columns].tocsr()
        a.sort_indices()
    if job.rows is not None:
        a = a[job.rows].tocsr()
        if b.ndim:
            b = b[job.rows]
    return a, b


def build_layer(job: LayerJob, backend: str):
    """(kernel, fixed) for one layer through `api.compile`: relabeled, encoded and compiled; `fixed`
    says whether it provably maps the all-cap row to itself (spdnn_converge.fixed_layer)."""
    a, b = relabeled_layer(job)
    r = job.request
    kernel = api.compile(a, op="spdnn_layer", bias=b if b.ndim else float(b), cap=r["cap"],
                         bias_rule=r["bias_rule"], options=r["options"], backend=backend, arch=r["arch"],
                         device=r["device"])
    return kernel, fixed_layer(a, b, r["cap"], r["bias_rule"])


def layer_request(r: dict, b: np.ndarray):
    """The compile request of a layer whose bias is `b` (what api.compile would make of it)."""
    from dataclasses import replace

    request = api._request("spdnn_layer", None, None, "float32", r["arch"], b if b.ndim else float(b), False,
                           r["cap"], r["bias_rule"], r["options"])
    return replace(request, device=r["device"])


_SELECTIONS: dict = {}  # per worker process: (shape, request) -> the selection every such layer shares


def _encode_in_worker(job: LayerJob):
    """One layer, composed here without the plan cache: (spec, selection, plan, structure hash, fixed)."""
    from dataclasses import replace

    from .analyze import analyze
    from .select import select_request

    a, b = relabeled_layer(job)
    request = layer_request(job.request, b)
    memo = (a.shape, repr(request))
    if memo not in _SELECTIONS:
        _SELECTIONS[memo] = select_request(analyze(a), request)
    selection = _SELECTIONS[memo]
    family = family_of(selection.spec)
    plan = family.encode(a, selection.spec, b if b.ndim else None)
    spec = family.finalize(selection.spec, plan, request) if hasattr(family, "finalize") else selection.spec
    r = job.request
    return spec, replace(selection, spec=spec), plan, structure_hash(a), fixed_layer(a, b, r["cap"], r["bias_rule"])


def _prove_in_worker(job: LayerJob):
    """(fixed, (outputs, inputs), nnz) of the job's layer as given (its job carries no relabeling)."""
    a, b = relabeled_layer(job)
    r = job.request
    return fixed_layer(a, b, r["cap"], r["bias_rule"]), tuple(a.shape), int(a.nnz)


def prove(jobs: list, workers: int) -> list:
    """(fixed, (outputs, inputs), nnz) of every layer, from its weights as given: whether a layer maps
    the all-cap row to itself does not depend on what its neurons are called, so this needs no
    relabeling chain, encoding or compiling (in worker processes when there are any)."""
    if not workers:
        return [_prove_in_worker(j) for j in jobs]
    import multiprocessing

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_prove_in_worker, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


def _cubin_in_worker(body: str, arch: str, name: str) -> bytes:
    from .cache import Cache

    return api._cubin_for(body, arch, name, Cache(), api.Timings())


def _kernel(job: LayerJob, encoded, backend: str, bodies: dict):
    """A Kernel from a worker's encoding; the body is rendered once per distinct spec."""
    spec, selection, plan, structure, fixed = encoded
    b = layer_bias(job.bias, job.index, plan.constants["m"])
    arch = spec.compile_arch(job.request["arch"])
    if spec not in bodies:
        bodies[spec] = render_body(spec)
    reproduce = f"layer {job.index + 1} of a sparsegen.SparseDNN"
    source = header(spec, Provenance(structure, reproduce)) + bodies[spec]
    kernel = api.Kernel(spec=spec, selection=selection, plan=plan, source=source, request=layer_request(job.request, b),
                        backend=backend, arch=job.request["arch"], structure=structure)
    return kernel, fixed, arch


def _structure_in_worker(source, index: int, convention: str):
    """The layer's pattern (indptr, indices), for the relabeling chain in the calling process."""
    a = layer_matrix(source, index, convention)
    return a.indptr, a.indices, a.shape


def next_order(indptr, indices, shape, previous, graph_tile: int | None = None) -> np.ndarray:
    """The row order relabeling gives a layer whose inputs were renamed by `previous` (spdnn.row_order
    of A[:, previous], built without scipy's column indexing); `graph_tile`: relabel="graph"'s tile."""
    from .spdnn import row_order

    rows = np.diff(indptr)
    if previous is not None:
        inverse = np.empty_like(previous)
        inverse[previous] = np.arange(previous.size, dtype=previous.dtype)
        indices = inverse[indices]
    if graph_tile is None:  # the pattern order reads each row's smallest and largest column: no sort
        from .graph import pattern_order_of

        return pattern_order_of(indptr, indices, shape[1])
    a = sp.csr_matrix((np.ones(indices.size, np.float32), indices, indptr), shape=shape)
    a.has_sorted_indices = previous is None
    a.sort_indices()
    assert np.array_equal(np.diff(a.indptr), rows)
    return row_order(a, graph_tile, by_graph=graph_tile is not None)


class Progress:
    """`sparsegen: built layer i/L (s)` on stderr once a build has taken a second; or, when `show` is
    a callable, show(done, total, seconds) every tenth of the way."""

    def __init__(self, total: int, show, what: str = "built layer"):
        self.total, self.show, self.what, self.t0 = total, show, what, time.perf_counter()
        self.shown = False

    def __call__(self, done: int):
        elapsed = time.perf_counter() - self.t0
        if callable(self.show):
            if done == self.total or done % max(1, self.total // 10) == 0:
                self.show(done, self.total, elapsed)
        elif self.show and elapsed > 1.0 and (done == self.total or done % max(1, self.total // 100) == 0):
            print(f"\rsparsegen: {self.what} {done}/{self.total} ({elapsed:.0f} s)", end="", file=sys.stderr,
                  flush=True)
            self.shown = True

    def close(self):
        if self.shown:
            print(file=sys.stderr)


def workers_for(layers, edges: int, workers: int | None) -> int:
    """Processes for the build: `workers` when given, else one per CPU (at most 32) for large networks."""
    if workers is not None:
        return max(0, int(workers))
    if edges < PARALLEL_EDGES:
        return 0
    return min(32, max(0, (os.cpu_count() or 1) - 1))


def build(jobs_of, stop: int, backend: str, workers: int, progress: Progress, chain=None, start: int = 0,
          orders: list | None = None):
    """The (kernel, fixed) of layers start..stop-1 in order, and the relabeling orders up to stop.
    `jobs_of(l, orders)` makes layer l's job once the relabeling chain has given `orders` up to l;
    `chain` (None: no relabeling) is (source, convention, the tile of relabel="graph" or None);
    `orders` holds the chain's orders of the layers before `start` (it is extended in place)."""
    orders = [] if orders is None else orders
    if not workers:
        results = []
        for l in range(start, stop):  # plans here, in order; nvcc afterwards, every distinct body at once
            if chain is not None:
                orders.append(next_order(*_structure_in_worker(chain[0], l, chain[1]), orders[-1] if orders else None,
                                         chain[2]))
            results.append(build_layer(jobs_of(l, orders), "emulate" if backend == "gpu" else backend))
            progress(l + 1 - start)
        if backend == "gpu":
            compile_cubins([kernel for kernel, _ in results])
        return results, orders
    import multiprocessing

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = _build_in_pool(pool, jobs_of, start, stop, orders, backend, progress, chain)
    return results, orders


def compile_cubins(kernels, threads: int | None = None) -> None:
    """Give each kernel its cubin and the GPU backend: nvcc once per distinct body (kernels of one
    spec share a cubin), the bodies compiled side by side in threads, since nvcc runs as a process
    of its own and a network's layers can make a few dozen specs."""
    from concurrent.futures import ThreadPoolExecutor

    first = {}
    for kernel in kernels:
        first.setdefault(kernel.cubin_key, kernel)
    threads = threads or max(1, min(16, os.cpu_count() or 1, len(first)))
    with ThreadPoolExecutor(threads) as pool:
        cubins = dict(zip(first, pool.map(lambda k: k.cubin, first.values())))
    for kernel in kernels:
        kernel._cubin = cubins[kernel.cubin_key]
        kernel.backend = "gpu"


def _build_in_pool(pool, jobs_of, start, stop, orders, backend, progress, chain):
    """The pool's part of `build`: the relabeling chain here, in order, a window of layers ahead of
    the encodes; nvcc in the pool as each new kernel body appears."""
    results, jobs = {}, {}
    encoded, structures, cubins, bodies = {}, {}, {}, {}
    done = 0

    def collect(j):
        nonlocal done
        kernel, fixed, arch = _kernel(jobs.pop(j), encoded.pop(j).result(), backend, bodies)
        body = kernel.source.split("*/\n", 1)[1]
        if backend == "gpu" and (body, arch) not in cubins:
            cubins[body, arch] = pool.submit(_cubin_in_worker, body, arch, kernel.spec.name)
        results[j] = (kernel, fixed, (body, arch))
        done += 1
        progress(done)

    for l in range(start, stop):  # over layers: the chain in order, the encodes in the pool
        if chain is not None:
            for j in range(l, min(stop, l + WINDOW)):
                if j not in structures:
                    structures[j] = pool.submit(_structure_in_worker, chain[0], j, chain[1])
            orders.append(next_order(*structures.pop(l).result(), orders[-1] if orders else None, chain[2]))
        jobs[l] = jobs_of(l, orders)
        encoded[l] = pool.submit(_encode_in_worker, jobs[l])
        while encoded and (encoded[min(encoded)].done() or len(encoded) > 4 * WINDOW):
            collect(min(encoded))
    while encoded:
        collect(min(encoded))
    out = []
    for l in range(start, stop):
        kernel, fixed, body = results[l]
        if backend == "gpu":
            kernel._cubin = cubins[body].result()
        out.append((kernel, fixed))
    return out
