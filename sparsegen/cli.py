"""The `sparsegen` command: inspect, compile, demo, cache, bench."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .errors import SparsegenError


def _request_args(p: argparse.ArgumentParser, n_default: int | None = 128):
    p.add_argument("--op", default="spmm", help="operation (default spmm)")
    p.add_argument("--n", type=int, default=n_default, help="columns of the dense operand (default %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--bias", type=float, default=None, help="fuse a bias (one value for every row)")
    p.add_argument("--relu", action="store_true", help="fuse ReLU after the bias")
    p.add_argument("--format", default=None, help="input format (default: from the extension)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparsegen", description="CUDA kernels written for one sparse matrix.")
    parser.add_argument("--version", action="version", version=f"sparsegen {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="print a matrix's statistics and the kernel selection with its reason")
    p.add_argument("file")
    _request_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.add_argument("--source", action="store_true", help="also print the generated CUDA source")
    p.add_argument("--plot", metavar="PNG", help="draw the row-length histogram and a spy plot")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("compile", help="generate, compile and dump the kernel for a matrix")
    p.add_argument("file")
    _request_args(p)
    p.add_argument("--arch", default=None, help="sm_XY (default: SPARSEGEN_ARCH, this GPU's, else sm_90)")
    p.add_argument("--dump", metavar="DIR", required=True, help="write <spec>.cu, <spec>.cubin, selection.json")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("demo", help="compile and run the shipped examples, check against scipy, time them")
    p.add_argument("--backend", default="auto", choices=["auto", "gpu", "emulate"])
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("cache", help="show or clear the kernel cache")
    p.add_argument("action", choices=["info", "list", "clear"])
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("bench", help="run a benchmark suite against cuSPARSE and cuBLAS (needs a GPU)")
    from . import bench

    bench.add_arguments(p)
    p.set_defaults(func=lambda args: bench.run(args))
    return parser


def _load(args):
    from .io import load

    options = {"format": args.format} if args.format else {}
    return load(args.file, **options)


def _stats_and_selection(args):
    from .analyze import analyze
    from .families.base import Request
    from .io import as_csr
    from .select import select_request

    csr = as_csr(_load(args))
    stats = analyze(csr)
    request = Request(op=args.op, n=args.n, dtype=args.dtype, bias=args.bias is not None, relu=args.relu)
    return csr, stats, select_request(stats, request)


def inspect_record(args, stats, selection) -> dict:
    d = stats.to_dict()
    record = {"file": str(args.file)}
    record.update(d)
    record["selection"] = {"family": selection.spec.family, "spec": selection.spec.name,
                           "reason": selection.reason, "rule": selection.rule,
                           "candidates": [s.name for _, s, _ in selection.candidates],
                           "tried": [{"rule": r, "accepted": ok, "reason": why} for r, ok, why in selection.tried]}
    return record


def format_stats(path, stats, selection) -> str:
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
        f"structure   sha256:{stats.structure_hash}",
        f"selection   {selection.spec.name}  (rule {selection.rule})",
        f"reason      {selection.reason}",
    ]
    for rule, ok, why in selection.tried:
        if rule != selection.rule:
            lines.append(f"  {'accepts' if ok else 'declines'} {rule}: {why}")
    return "\n".join(lines)


def cmd_inspect(args) -> int:
    csr, stats, selection = _stats_and_selection(args)
    if args.json:
        record = inspect_record(args, stats, selection)
        if args.source:
            record["source"] = _source(selection, stats, args)
        print(json.dumps(record, indent=2))
    else:
        print(format_stats(args.file, stats, selection))
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

    reproduce = f"sparsegen inspect {args.file} --op {args.op} --n {args.n} --dtype {args.dtype} --source"
    return render(selection.spec, Provenance(stats.structure_hash, reproduce))


def cmd_compile(args) -> int:
    from . import api, runtime

    arch = args.arch
    if arch is None and runtime.available():
        arch = runtime.current_arch()
    reproduce = f"sparsegen compile {args.file} --op {args.op} --n {args.n} --dtype {args.dtype}"
    kernel = api.compile(_load(args), op=args.op, n=args.n, dtype=args.dtype, bias=args.bias, relu=args.relu,
                         arch=arch, backend="emulate", reproduce=reproduce)
    written = kernel.dump(args.dump)
    print(f"{kernel.spec.name}  ({kernel.arch})")
    print(f"reason  {kernel.selection.reason}")
    for what, path in written.items():
        print(f"wrote   {path}  ({what})")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.backend)


def cmd_cache(args) -> int:
    from .cache import Cache

    cache = Cache()
    if args.action == "info":
        entries = cache.entries()
        print(f"directory  {cache.root}")
        print(f"enabled    {cache.active}  (SPARSEGEN_DISABLE_CACHE=1 turns it off)")
        for kind in ("plan", "cubin"):
            mine = [e for e in entries if e.kind == kind]
            print(f"{kind:<10} {len(mine)} entries, {sum(e.size for e in mine) / 1e6:.2f} MB")
    elif args.action == "list":
        for e in cache.entries():
            print(f"{e.kind}\t{e.key}\t{e.size}\t{e.path}")
    else:
        print(f"removed {cache.clear()} entries from {cache.root}")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SparsegenError as exc:
        if args.debug:
            raise
        print(f"sparsegen: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        if args.debug:
            raise
        print(f"sparsegen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sparsegen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
