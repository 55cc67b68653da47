"""The `sparsegen` command: inspect, compile, demo, cache, bench.

Every failure is one line on stderr, `sparsegen: error: ...`, and exit status 2: bad input, a
request no kernel takes, a usage error (an unknown command or option, a value argparse rejects), and
an unexpected exception too, which the line names as a bug. `--debug` (before or after the command)
prints the traceback first, then the same line. Ctrl-C exits 130 (128 + SIGINT, as shells report an
interrupted command) with `sparsegen: interrupted`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
import warnings
from pathlib import Path

from ._version import __version__
from .dtypes import NAMES
from .errors import SparsegenError


class UsageError(SparsegenError):
    """The command line itself is wrong (what argparse reports)."""


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors fail as every other error does (one line, exit status 2) instead
    of printing the usage block; subcommand parsers are made of this class too."""

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _request_args(p: argparse.ArgumentParser, n_default: int | None = 128):
    p.add_argument("--op", default="spmm", help="operation (default spmm)")
    p.add_argument("--n", type=int, default=n_default, help="columns of the dense operand (default %(default)s)")
    p.add_argument("--k", type=int, default=None, help="sddmm: the inner dimension (columns of A and B)")
    p.add_argument("--dtype", default="float32", choices=NAMES,
                   help="storage dtype of the values and operands; accumulation is float32 (default %(default)s)")
    p.add_argument("--bias", type=float, default=None, help="fuse a bias (one value for every row)")
    p.add_argument("--relu", action="store_true", help="fuse ReLU after the bias")
    p.add_argument("--format", default=None, help="input format (default: from the extension)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sparsegen", description="CUDA kernels written for one sparse matrix.")
    parser.add_argument("--version", action="version", version=f"sparsegen {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of a failure")
    # --debug after the command too; SUPPRESS keeps a subcommand from resetting the one given before it
    debug = Parser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of a failure")
    sub = _Subcommands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), debug)

    p = sub.add_parser("inspect", help="print a matrix's statistics and the kernel selection with its reason")
    p.add_argument("file", help="a matrix file: .tsv, .mtx, .npz, .smtx or MNIST IDX, optionally .gz")
    _request_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.add_argument("--source", action="store_true", help="also print the generated CUDA source")
    p.add_argument("--plot", metavar="PNG", help="draw the row-length histogram and a spy plot")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("compile", help="generate, compile and dump the kernel for a matrix")
    p.add_argument("file", help="a matrix file: .tsv, .mtx, .npz, .smtx or MNIST IDX, optionally .gz")
    _request_args(p)
    p.add_argument("--arch", default=None, help="sm_XY (default: SPARSEGEN_ARCH, this GPU's, else sm_90)")
    p.add_argument("--dump", metavar="DIR", required=True, help="write <spec>.cu, <spec>.cubin, selection.json")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("demo", help="compile and run the shipped examples, check against scipy, time them")
    p.add_argument("--backend", default="auto", choices=["auto", "gpu", "emulate"],
                   help="gpu, the NumPy emulator, or auto: the GPU where there is one (default auto)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("spdnn", help="sparse DNN inference (Graph Challenge): run a network, generate one, "
                                     "make inputs from MNIST")
    p.add_argument("action", nargs="?", default="run", choices=["run", "generate", "mnist"],
                   help="run a network on inputs (default), generate a network, or make inputs from MNIST")
    p.add_argument("--weights", metavar="DIR", help="run: directory of n{N}-l{l}.tsv[.gz] layers")
    p.add_argument("--inputs", metavar="FILE", help="run: inputs as TSV/MTX (image pixel value), or MNIST IDX "
                                                    "images (made into challenge inputs of the network's size)")
    p.add_argument("--categories", metavar="FILE", help="run: the answer file to check against")
    p.add_argument("--bias", type=float, default=None, help="default: the challenge's bias for the network size")
    p.add_argument("--cap", type=float, default=32.0, help="run: the activation's upper clamp (default %(default)s)")
    p.add_argument("--layers", type=int, default=None, help="run: the first L layers; generate: how many")
    p.add_argument("--count", type=int, default=None, help="use the first COUNT inputs / images")
    p.add_argument("--backend", default="auto", choices=["auto", "gpu", "emulate"],
                   help="run: gpu, the NumPy emulator, or auto: the GPU where there is one (default auto)")
    p.add_argument("--runtime-trips", action="store_true",
                   help="run: the kernel variant that reads widths and buffer counts at run time (not unrolled)")
    p.add_argument("--minibatch", type=int, default=16, help="run: inputs per register pass (multiple of 4)")
    p.add_argument("--stream-weights", action="store_true",
                   help="run: copy each layer's weights just ahead of use (double buffered) instead of all resident")
    p.add_argument("--host-pruning", action="store_true",
                   help="run: compact the alive list on the host every layer (the 2020 code's way; for comparison)")
    p.add_argument("--relabel", default="auto", choices=["auto", "graph", "always", "never"],
                   help="run: relabel hidden neurons to shrink footprints (auto: when the first layers show it pays; "
                        "graph: likewise, each layer taking networkx's reverse Cuthill-McKee order where it "
                        "touches fewer inputs)")
    p.add_argument("--block", type=int, default=None, help="run: output neurons per thread block (multiple of 32)")
    p.add_argument("--converge", default="auto", choices=["auto", "off"],
                   help="run: compute each distinct row once and skip layers proven to fix the converged rows; "
                        "exact (default auto)")
    p.add_argument("--json", action="store_true",
                   help="run: one JSON object (the per-layer table too: alive inputs, distinct rows, skipped; on "
                        "MPI the per-rank table and each rebalancing decision)")
    p.add_argument("--rebalance", default="off", choices=["off", "auto", "always"],
                   help="run on MPI: never stop between layers (off, the default), or stop at layers 4, 8, 16, ... and "
                        "move surviving rows between ranks when the predicted saving pays for the move (auto) or "
                        "whenever the ranks are uneven (always)")
    p.add_argument("--mpi", action="store_true",
                   help="run over MPI ranks (mpi4py) under a launcher that sets neither PMI_SIZE nor "
                        "OMPI_COMM_WORLD_SIZE; under mpiexec -n P > 1 it is on by itself")
    p.add_argument("--neurons", type=int, default=1024, help="generate: neurons (16 * a power of two >= 512)")
    p.add_argument("--seed", type=int, default=0, help="generate: seed of the row permutations")
    p.add_argument("--images", metavar="IDX", help="mnist: MNIST images file (idx3-ubyte[.gz])")
    p.add_argument("--side", type=int, default=32, help="mnist: output image side (32, 64, 128, 256)")
    p.add_argument("--out", metavar="PATH", help="generate: directory; mnist: TSV file")
    p.set_defaults(func=cmd_spdnn)

    p = sub.add_parser("cache", help="show or clear the kernel cache")
    p.add_argument("action", choices=["info", "list", "clear"],
                   help="info: where it is and what it holds; list: every entry; clear: remove them all")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("calibrate", help="measure this GPU and write the rates its selection uses (needs a GPU, "
                                         "PyTorch and nvcc; about 2 minutes)")
    p.add_argument("--quick", action="store_true", help="fewer shapes, about 20 s")
    p.add_argument("--out", metavar="PATH", help="write the rates file here (default: the cache, where "
                                                 "selection on this GPU reads it)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("bench", help="run a benchmark suite against cuSPARSE and cuBLAS (needs a GPU)")
    from . import bench

    bench.add_arguments(p)
    p.set_defaults(func=lambda args: bench.run(args))
    return parser


class _Subcommands:
    """add_subparsers' action, giving every subcommand the --debug option."""

    def __init__(self, action, common):
        self.action, self.common = action, common

    def add_parser(self, name, **kwargs):
        return self.action.add_parser(name, parents=[self.common], **kwargs)


def _load(args):
    from .io import load

    options = {"format": args.format} if args.format else {}
    return load(args.file, **options)


def inspect_device():
    """The device `inspect` and `compile` select for: the GPU here, else the default device."""
    from .select.device import DeviceModel

    return DeviceModel.current() if _gpu_here() else DeviceModel.default()


def _gpu_here() -> bool:
    from . import runtime

    return runtime.available()


def _stats_and_selection(args):
    import dataclasses

    from .analyze import analyze
    from .api import _request
    from .families.base import Request
    from .io import as_csr
    from .select import select_request

    _check_k(args)
    request = _request(args.op, _n(args), args.k, args.dtype, Request.arch, args.bias, args.relu, cap=None,
                       bias_rule="nonzero", options=None)
    request = dataclasses.replace(request, device=inspect_device())
    csr = as_csr(_load(args))
    stats = analyze(csr)
    return csr, stats, request, select_request(stats, request)


def _check_k(args) -> None:
    """--k belongs to sddmm and sddmm needs it: say so before reading the matrix."""
    if args.op == "sddmm" and not args.k:
        raise SparsegenError("--op sddmm needs --k (the inner dimension: columns of A and B)")
    if args.op != "sddmm" and args.k is not None:
        raise SparsegenError(f"--k is the inner dimension of sddmm; --op {args.op} takes --n")


def _n(args) -> int | None:
    """--n, which sddmm does not take (its size is --k)."""
    return None if args.op == "sddmm" else args.n


def _request_flags(args) -> str:
    from .api import request_flags

    return request_flags(args.op, args.n, args.k, args.dtype)


def skinny_predictions(stats, request) -> tuple:
    """The cost model's predicted times behind an fp16/bf16 spmm selection, fastest first, else ()."""
    if request.op != "spmm" or request.dtype not in ("float16", "bfloat16"):
        return ()
    from .select import skinny_cost

    return skinny_cost.compare(stats, request).predictions


def inspect_record(args, stats, selection, predicted=(), device=None, graph=None) -> dict:
    d = stats.to_dict()
    record = {"file": str(args.file)}
    record.update(d)
    if graph is not None:
        record["graph"] = graph.to_dict()
    if device is not None:
        record["device"] = device.describe()
    record["request"] = {"op": args.op, "n": _n(args), "k": args.k,
                         "dtype": args.dtype, "bias": args.bias, "relu": args.relu}
    record["selection"] = {"family": selection.spec.family, "spec": selection.spec.name,
                           "reason": selection.reason, "rule": selection.rule,
                           "candidates": [s.name for _, s, _ in selection.candidates],
                           "tried": [{"rule": r, "accepted": ok, "reason": why} for r, ok, why in selection.tried],
                           "predicted": [{"family": p.family, "label": p.label, "ms": p.seconds * 1e3}
                                         for p in predicted]}
    return record


def graph_lines(g) -> list[str]:
    """The graph section of `inspect`: components, and the row graph's bandwidth (sparsegen/graph.py)."""
    count = f"{g.components} component{'' if g.components == 1 else 's'}"
    if g.component_tile > 1:
        count = f"at least {count} (found on {g.component_tile}x{g.component_tile} tiles)"
    coarse = f", {g.group} patterns per node" if g.group > 1 else ""
    return [
        f"graph       {count} of rows and columns linked by nonzeros; largest {g.largest_rows} rows x "
        f"{g.largest_cols} columns; {g.empty_rows} empty rows, {g.empty_cols} empty columns",
        f"bandwidth   row graph (rows sharing a column): {g.bandwidth} as stored, {g.bandwidth_rcm} in reverse "
        f"Cuthill-McKee order ({g.row_classes} distinct rows; networkx on {g.nodes} nodes, {g.edges} edges"
        f"{coarse}; {g.seconds:.2f} s)",
    ]


def format_stats(path, stats, selection, predicted=(), device=None, graph=None) -> str:
    r, c = stats.row_lengths, stats.col_lengths
    pct = stats.row_length_percentiles
    fp = "; ".join(f"{f.block_rows} rows: mean {f.mean:.1f} max {f.max}" for f in stats.footprint)
    t = stats.tiles
    lines = [
        f"matrix      {path}",
        f"shape       {stats.shape[0]} x {stats.shape[1]}   nnz {stats.nnz}   density {100 * stats.density:.4g} %",
        f"rows        min {r.min}  max {r.max}  mean {r.mean:.2f}  std {r.std:.2f}  CoV {r.cov:.3f}  empty {r.empty}"
        + "".join(f"  {k} {v:g}" for k, v in pct.items()),
        f"columns     min {c.min}  max {c.max}  mean {c.mean:.2f}  std {c.std:.2f}  CoV {c.cov:.3f}  empty {c.empty}",
        f"footprint   distinct columns per block of rows: {fp}",
        f"ell pad     {stats.ell_padding:.3f} (sliced ELL, 32-row slices: stored / nonzero)",
        f"tiles       {t.tile_rows}x{t.tile_cols}: {t.tiles} tiles, {t.nonempty} nonempty, max nnz {t.max_nnz}, "
        f"mean nnz {t.mean_nnz:.2f}, {100 * t.dense_share:.2f} % over half dense",
        *(graph_lines(graph) if graph is not None else []),
        f"structure   sha256:{stats.structure_hash}",
        *([f"device      {device.text}{'' if _gpu_here() else '  (no GPU here: the default device)'}"]
          if device is not None else []),
        f"selection   {selection.spec.name}  (rule {selection.rule})",
        f"reason      {selection.reason}",
    ]
    if predicted:
        lines.append(f"predicted   {', '.join(p.text for p in predicted)}  (cost model: select/skinny_cost.py)")
    for rule, ok, why in selection.tried:
        if rule != selection.rule:
            lines.append(f"  {'accepts' if ok else 'declines'} {rule}: {why}")
    return "\n".join(lines)


def cmd_inspect(args) -> int:
    from .graph import graph_stats

    csr, stats, request, selection = _stats_and_selection(args)
    predicted = skinny_predictions(stats, request)
    graph = graph_stats(csr)
    if args.json:
        record = inspect_record(args, stats, selection, predicted, request.device, graph)
        if args.source:
            record["source"] = _source(selection, stats, args)
        print(json.dumps(record, indent=2))
    else:
        print(format_stats(args.file, stats, selection, predicted, request.device, graph))
        if args.source:
            print()
            print(_source(selection, stats, args))
    if args.plot:
        from .plot import plot_matrix

        plot_matrix(csr, stats, args.plot, title=str(args.file))
        if not args.json:
            print(f"plot        {args.plot}")
    return 0


def _source(selection, stats, args) -> str:
    from .render import Provenance, render

    reproduce = f"sparsegen inspect {args.file} {_request_flags(args)} --source"
    return render(selection.spec, Provenance(stats.structure_hash, reproduce))


def cmd_compile(args) -> int:
    from . import api, runtime

    arch = args.arch
    if arch is None and runtime.available():
        arch = runtime.current_arch()
    _check_k(args)
    reproduce = f"sparsegen compile {args.file} {_request_flags(args)}"
    kernel = api.compile(_load(args), op=args.op, n=_n(args), k=args.k, dtype=args.dtype, bias=args.bias,
                         relu=args.relu, arch=arch, backend="emulate", reproduce=reproduce, device=inspect_device())
    written = kernel.dump(args.dump)
    print(f"{kernel.spec.name}  ({kernel.arch})")
    print(f"reason  {kernel.selection.reason}")
    for what, path in written.items():
        print(f"wrote   {path}  ({what})")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.backend)


def cmd_spdnn(args) -> int:
    from . import graphchallenge as gc

    if args.action != "run" and _mpi_job() > 1:
        raise SparsegenError(f"sparsegen spdnn {args.action} runs in one process: run it without mpiexec")
    if args.action == "generate":
        _need(args, "out", "layers")
        paths = gc.write_network(gc.generate_network(args.neurons, args.layers, seed=args.seed), args.out)
        print(f"wrote {len(paths)} layers of {args.neurons} neurons to {args.out}")
        return 0
    if args.action == "mnist":
        _need(args, "images", "out")
        x = gc.mnist_inputs(args.images, side=args.side, count=args.count)
        gc.write_inputs(x, args.out)
        print(f"wrote {x.shape[0]} inputs of {x.shape[1]} pixels ({x.nnz} nonzeros) to {args.out}")
        return 0
    _need(args, "weights", "inputs")
    if args.mpi or _mpi_job() > 1:
        from .distributed import cli as mpi

        def show(record):
            print(json.dumps(record, indent=2) if args.json else format_spdnn(record) + "\n" + mpi.format_ranks(record))

        return mpi.main(args, gc, show, lambda line, debug: _fail(line, debug))
    record = run_spdnn(args, gc)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(format_spdnn(record))
    return 0 if record["check"] in ("PASSED", "SKIPPED", None) else 1


def _mpi_job() -> int:
    from .distributed.comm import launched

    return launched()


def _need(args, *names):
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is None]
    if missing:
        raise SparsegenError(f"sparsegen spdnn {args.action} needs {' and '.join(missing)}")


def _first(inputs, count):
    """The first `count` inputs (all of them when None)."""
    return inputs if count is None else inputs[:count]


def _say_if_narrow(inputs, neurons: int, path) -> None:
    """Inputs whose widest neuron is a quarter of the network's or less were most likely made for a
    smaller network: they run, and usually die in the first layers, so say so."""
    width = int(inputs.indices.max()) + 1 if inputs.nnz else 0
    if width and width <= neurons // 4:
        warnings.warn(f"{path}: the inputs use neurons 1..{width} of the network's {neurons}: "
                      f"inputs made for a smaller network?", RuntimeWarning, stacklevel=2)


def _is_idx(path) -> bool:
    name = Path(path).name.lower().removesuffix(".gz")
    return name.endswith(("idx3-ubyte", ".idx"))


def run_spdnn(args, gc) -> dict:
    import time

    import numpy as np

    from .spdnn import SparseDNN

    t = time.perf_counter()
    layers = gc.read_network(args.weights, layers=args.layers)
    neurons = layers[0].shape[0]
    if _is_idx(args.inputs):
        side = int(round(neurons ** 0.5))
        if side * side != neurons:
            raise SparsegenError(f"MNIST inputs need a square neuron count, the network has {neurons}")
        inputs = gc.mnist_inputs(args.inputs, side=side, count=args.count)
    else:
        inputs = _first(gc.read_inputs(args.inputs, neurons), args.count)
        _say_if_narrow(inputs, neurons, args.inputs)
    read_ms = 1e3 * (time.perf_counter() - t)
    bias = args.bias if args.bias is not None else gc.bias_for(neurons)
    net = SparseDNN(layers, bias=bias, cap=args.cap, backend=args.backend, minibatch=args.minibatch,
                    block=args.block, unroll=not args.runtime_trips, relabel=args.relabel, converge=args.converge)
    result = net.run(inputs, weights="streamed" if args.stream_weights else "resident",
                     prune="host" if args.host_pruning else "device")
    check, expected, note = None, None, None
    if args.categories and args.layers is not None:
        check, note = "SKIPPED", f"the answer file is the whole network's; --layers {args.layers} ran part of it"
    elif args.categories:
        expected = gc.read_categories(args.categories)
        if args.count is not None:
            expected = expected[expected <= args.count]
        check = "PASSED" if np.array_equal(result.categories, expected) else "FAILED"
        if _is_idx(args.inputs):
            note = "inputs made from MNIST approximate the official ones, so a few categories may differ"
    return {
        "neurons": neurons, "layers": len(layers), "inputs": int(inputs.shape[0]), "input_nnz": int(inputs.nnz),
        "edges": net.edges, "bias": bias, "cap": args.cap, "backend": net.backend, "specs": net.specs,
        "weights": "streamed" if args.stream_weights else "resident",
        "relabeling": {"applied": net.relabel.applied, "reason": net.relabel.reason},
        "pruning": "host" if args.host_pruning else "device",
        "survivors": int(result.ids.size), "categories": result.categories.tolist(),
        "check": check, "check_note": note, "expected": None if expected is None else int(expected.size),
        "alive_per_layer": list(result.alive_per_layer),
        "converge": result.converge, "converge_summary": result.summary(), "rows_computed": result.rows_computed,
        "per_layer": result.per_layer(), "passes": [p.to_dict() for p in result.passes],
        "memory": result.memory,
        "teraedges_per_s": result.teraedges_per_s,
        "split_ms": {"read": read_ms, **{k: v for k, v in result.timings_ms.items() if k != "emulated"}},
    }


def format_spdnn(r: dict) -> str:
    s = r["split_ms"]
    lines = [
        f"network     {r['layers']} layers x {r['neurons']} neurons, {r['edges']} edges, "
        f"{len(r['specs'])} kernel spec(s): {', '.join(r['specs'])}",
        f"inputs      {r['inputs']} ({r['input_nnz']} nonzeros), bias {r['bias']:g}, cap {r['cap']:g}, "
        f"backend {r['backend']}",
        *([f"converge    {r['converge_summary']}"] if "converge_summary" in r else []),
        f"survivors   {r['survivors']}"
        + (f"   check {r['check']}" if r["check"] else "")
        + (f" ({r['expected']} expected categories)" if r["expected"] is not None else "")
        + (f"; {r['check_note']}" if r["check_note"] else ""),
        f"time        inference {s['inference']:.3f} ms"
        + (f" (layers {s['layers']:.3f} ms, pruning {s['pruning']:.3f} ms)" if "layers" in s else "")
        + (f", transfers {s['transfer']:.3f} ms" if "transfer" in s else "")
        + f"; read {s['read']:.0f} ms, compile {s['compile']:.0f} ms",
    ]
    if r["backend"] != "gpu":  # the emulator's time says nothing of a GPU's throughput
        lines.append("rate        none: the emulator ran it (TeraEdges/s are measured on the GPU)")
    elif r["teraedges_per_s"]:
        lines.append(f"rate        {r['teraedges_per_s']:.2f} TeraEdges/s (inputs x edges / inference time)")
    return "\n".join(lines)


def cmd_calibrate(args) -> int:
    from .calibration import calibrate

    calibrate(quick=args.quick, out=args.out)
    return 0


def cmd_cache(args) -> int:
    from .cache import Cache

    cache = Cache()
    if args.action == "info":
        entries = cache.entries()
        print(f"directory  {cache.root}")
        print(f"enabled    {cache.active}  (SPARSEGEN_DISABLE_CACHE=1 turns it off)")
        if cache.refusal():
            print(f"refused    {cache.refusal()}")
        for kind in ("plan", "format", "stats", "cubin"):
            mine = [e for e in entries if e.kind == kind]
            print(f"{kind:<10} {len(mine)} entries, {sum(e.size for e in mine) / 1e6:.2f} MB")
    elif args.action == "list":
        for e in cache.entries():
            print(f"{e.kind}\t{e.key}\t{e.size}\t{e.path}")
    else:
        print(f"removed {cache.clear()} entries from {cache.root}")
    return 0


def main(argv=None) -> int:
    """Run the command line `argv` (default sys.argv[1:]); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # known before parsing, for a usage error's traceback
    try:
        args = build_parser().parse_args(argv)
        debug = args.debug
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return _fail("interrupted", debug, status=130)
    except (SparsegenError, OSError, ValueError) as exc:
        return _fail(f"error: {exc}", debug)
    except Exception as exc:  # a bug in sparsegen: still one line, and how to see more
        return _fail(f"error: internal error {type(exc).__name__}: {exc} (a bug in sparsegen: rerun with "
                     f"--debug for the traceback and report it)", debug)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning on the command line is one line for the user, not a pointer into sparsegen's source."""
    print(f"sparsegen: warning: {one_line(str(message))}", file=sys.stderr if file is None else file)


def _fail(line: str, debug: bool, status: int = 2) -> int:
    if debug:
        traceback.print_exc()
    print(f"sparsegen: {one_line(line)}", file=sys.stderr)
    return status


_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters (from file names, say) escaped, so the
    message is one line and writes nothing to the terminal but text."""
    return _BREAKS.sub(lambda m: f"\\x{ord(m.group()):02x}" if m.group() < "\u0100" else f"\\u{ord(m.group()):04x}",
                       text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
