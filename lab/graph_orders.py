"""Row orders by networkx against the orders sparsegen had: footprints, padding, tile density, time.

    python lab/graph_orders.py                       # DLMC subset and the Graph Challenge networks
    python lab/graph_orders.py --only dlmc --limit 10
    python lab/graph_orders.py --only networks --big # adds n65536-l120 (about 4 GB of layers)
    python lab/graph_orders.py --gpu                 # also times the kernels (needs a GPU, PyCUDA, torch)

Orders of a matrix's rows (for a network: of every layer's rows, each layer's columns following the
previous layer's order, as SparseDNN relabels hidden neurons):

    given        as stored
    pattern      sorted by first column, last column, length (sparsegen.graph.pattern_order: the
                 order SparseDNN used before the graph orders)
    rcm          reverse Cuthill-McKee on the coarse row graph (sparsegen.graph.rcm_order, networkx)
    communities  Louvain communities of the coarse row graph (networkx, weights = shared columns,
                 seed 0), communities in the RCM order of their first node, nodes by RCM within one
    chosen       what the product does now: for a network what SparseDNN(relabel="auto") does
                 (each layer the smaller of pattern and rcm by footprint per 1024-row tile, without
                 more padding; or as given when relabeling does not pay); for a DLMC matrix the same
                 rule, sparsegen.spdnn.row_order, on 128-row tiles

Measures (those the analyzer and the relabeling use):

    fp@T    distinct columns per tile of T consecutive rows, summed over tiles (T = 1024, the
            SparseDNN block, for networks; the analyzer's 32- and 128-row blocks for all)
    pad     sliced-ELL storage over nonzeros, 32-row slices (sparsegen.analyze.ell_padding)
    tiles   nonempty 128 x 64 tiles, and the mean density of the nonempty ones
    s       seconds to compute the order (the whole network for a network)
    specs   networks: distinct layer kernels SparseDNN compiles (each an nvcc run), and how many
            layers get the fully unrolled one (every buffer of every tile the same size); from
            SparseDNN(backend="emulate"), which encodes every layer without nvcc or a GPU

With --gpu: DLMC matrices run sparsegen.compile(a[order], op="spmm", n=128, dtype="float32")
(median of CUDA-event timed launches); networks run SparseDNN on the relabeled layers with
relabel="never", MNIST-made inputs, best of 3 inference times.

Data: $SPARSEGEN_DATA, else ../shared/data (dlmc/, graphchallenge/, mnist/). Results: a JSON and a
markdown table under --out (default lab/results/graph_orders/, git-ignored).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import sparsegen
from sparsegen import graph
from sparsegen import graphchallenge as gc
from sparsegen.analyze import TILE_COLS, TILE_ROWS, ell_padding
from sparsegen.spdnn import choose_relabeling, relabeled, row_order

ROOT = Path(__file__).resolve().parents[1]
ORDERS = ("given", "pattern", "rcm", "communities", "chosen")
NETWORKS = (("official n1024-l120", 1024, 120, "official"), ("generated n4096-l120", 4096, 120, "generated"),
            ("generated n16384-l120", 16384, 120, "generated"))
BIG = (("generated n65536-l120", 65536, 120, "generated"),)
BLOCK = 1024  # SparseDNN's default tile of output neurons for networks of >= 1024 neurons (--block)


def data_dir() -> Path:
    env = os.environ.get("SPARSEGEN_DATA")
    p = Path(env) if env else ROOT.parent / "shared" / "data"
    if not p.is_dir():
        sys.exit(f"no data: {p} is not a folder (set SPARSEGEN_DATA)")
    return p


# ---- orders --------------------------------------------------------------------------------------

def communities_order(a) -> np.ndarray:
    import networkx as nx

    g = graph.row_graph(a)
    rows_by_rcm = graph.rcm_order(a, g)
    rcm_rank = np.full(g.nodes, a.shape[0], np.int64)  # a node's first position in the RCM order
    np.minimum.at(rcm_rank, g.node[rows_by_rcm], np.arange(rows_by_rcm.size))
    label = np.zeros(g.nodes, np.int64)
    if g.edges:
        for i, nodes in enumerate(nx.community.louvain_communities(nx.from_scipy_sparse_array(g.adjacency),
                                                                   weight="weight", seed=0)):
            label[list(nodes)] = i
    first = np.full(label.max() + 1, g.nodes, np.int64)
    np.minimum.at(first, label, rcm_rank)
    node_order = np.lexsort((rcm_rank, first[label]))
    return np.argsort(np.argsort(node_order)[g.node], kind="stable")


MATRIX_ORDERS = {
    "given": lambda a: np.arange(a.shape[0]),
    "pattern": graph.pattern_order,
    "rcm": graph.rcm_order,
    "communities": communities_order,
    "chosen": lambda a: row_order(a, 128),
}


def chain(layers, order_of):
    """Each layer's rows in order_of(layer), its columns in the previous layer's order."""
    out, previous = [], None
    for a in layers:
        if previous is not None:
            a = a[:, previous].tocsr()
            a.sort_indices()
        previous = order_of(a)
        out.append(a[previous].tocsr())
    return out


def network_orders(layers, block: int):
    """{name: (layers in that order, seconds)}, and SparseDNN's relabeling decision."""
    out = {"given": (layers, 0.0)}
    for name in ("pattern", "rcm", "communities"):
        t = time.perf_counter()
        ordered = chain(layers, MATRIX_ORDERS[name])
        out[name] = (ordered, time.perf_counter() - t)
    t = time.perf_counter()
    decision = choose_relabeling(layers, block, "auto")
    ordered = relabeled(layers, block)[0] if decision.applied else layers
    out["chosen"] = (ordered, time.perf_counter() - t)
    return out, decision.reason


# ---- measures ------------------------------------------------------------------------------------

def measures(layers, block: int | None) -> dict:
    nnz = sum(a.nnz for a in layers)
    tiles = sum(nonempty_tiles(a) for a in layers)
    stored = sum(ell_padding(np.diff(a.indptr)) * a.nnz for a in layers)
    d = {"fp32": sum(graph.footprint(a, 32) for a in layers), "fp128": sum(graph.footprint(a, 128) for a in layers),
         "pad": stored / nnz if nnz else 1.0, "tiles": tiles,
         "tile_density": nnz / (tiles * TILE_ROWS * TILE_COLS) if tiles else 0.0}
    if block:
        d[f"fp{block}"] = sum(graph.footprint(a, block) for a in layers)
    return d


def nonempty_tiles(a) -> int:
    """Nonempty TILE_ROWS x TILE_COLS tiles (the analyzer's TileStats.nonempty)."""
    rows = np.repeat(np.arange(a.shape[0], dtype=np.int64) // TILE_ROWS, np.diff(a.indptr))
    return int(np.unique(rows * -(-a.shape[1] // TILE_COLS) + a.indices // TILE_COLS).size)


# ---- GPU timing ----------------------------------------------------------------------------------

def time_spmm(a, n: int = 128) -> float:
    """Median ms of the spmm kernel sparsegen compiles for `a` (CUDA events around each launch)."""
    import torch

    kernel = sparsegen.compile(a.astype(np.float32), op="spmm", n=n, dtype="float32", backend="gpu")
    x = torch.randn(a.shape[1], n, device="cuda", dtype=torch.float32)
    y = torch.empty(a.shape[0], n, device="cuda", dtype=torch.float32)
    for _ in range(5):
        kernel(x, out=y)
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kernel(x, out=y)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def layer_specs(layers, block: int) -> tuple[int, int]:
    """Distinct layer-kernel specs of the network in this order, and layers with fixed trip counts."""
    net = sparsegen.SparseDNN([a.T.tocsr() for a in layers], bias=gc.bias_for(layers[0].shape[0]), cap=gc.CAP,
                              backend="emulate", relabel="never", block=block, progress=False)
    names = [k.spec.name for k in net.kernels]
    return len(set(names)), sum(".wrt." not in n for n in names)


def time_network(layers, inputs, block: int, backend: str = "gpu") -> tuple[float, int]:
    """Best-of-3 inference ms of SparseDNN on these A-convention layers (relabel off), survivors."""
    net = sparsegen.SparseDNN([a.T.tocsr() for a in layers], bias=gc.bias_for(layers[0].shape[0]), cap=gc.CAP,
                              backend=backend, relabel="never", block=block, progress=False)
    runs = [net.run(inputs) for _ in range(3)]
    best = min(runs, key=lambda r: r.timings_ms["inference"])
    return best.timings_ms["inference"], int(best.ids.size)


# ---- the two sets --------------------------------------------------------------------------------

def dlmc_rows(data: Path, limit: int | None, gpu: bool):
    files = sorted((data / "dlmc").rglob("*.smtx.gz"))[:limit]
    for f in files:
        a = sparsegen.load(f)
        rec = {"matrix": str(f.relative_to(data / "dlmc")).removesuffix(".smtx.gz"), "shape": list(a.shape),
               "nnz": int(a.nnz), "orders": {}}
        for name, fn in MATRIX_ORDERS.items():
            t = time.perf_counter()
            order = fn(a)
            seconds = time.perf_counter() - t
            ordered = a[order].tocsr()
            rec["orders"][name] = {**measures([ordered], None), "s": seconds}
            if gpu:
                rec["orders"][name]["ms"] = time_spmm(ordered)
        yield rec


def network_rows(data: Path, big: bool, gpu: bool, count: int, block: int, depth_override: int | None,
                 match: str | None = None):
    for label, neurons, depth, source in NETWORKS + (BIG if big else ()):
        if match and match not in label:
            continue
        if depth_override:
            label, depth = label.replace(f"-l{depth}", f"-l{depth_override}"), depth_override
        ws = gc.read_network(data / "graphchallenge", neurons, depth) if source == "official" \
            else gc.generate_network(neurons, depth, seed=1)
        layers = [w.T.tocsr() for w in ws]
        for a in layers:
            a.sort_indices()
        del ws
        orders, reason = network_orders(layers, block)
        rec = {"matrix": label, "shape": [neurons, neurons], "nnz": int(sum(a.nnz for a in layers)),
               "decision": reason, "orders": {}}
        inputs = gc.mnist_inputs(data / "mnist" / "train-images-idx3-ubyte.gz", int(neurons ** 0.5), count) \
            if gpu else None
        for name, (ordered, seconds) in orders.items():
            rec["orders"][name] = {**measures(ordered, block), "s": seconds}
            rec["orders"][name]["specs"], rec["orders"][name]["unrolled"] = layer_specs(ordered, block)
            if gpu:
                rec["orders"][name]["ms"], rec["orders"][name]["survivors"] = time_network(ordered, inputs, block)
        yield rec


# ---- report --------------------------------------------------------------------------------------

def table(records, block: int | None) -> list[str]:
    key = f"fp{block}" if block else "fp32"
    timed = any("ms" in o for r in records for o in r["orders"].values())
    specs = any("specs" in o for r in records for o in r["orders"].values())
    head = f"| matrix | {key} " + "".join(f"| {o} " for o in ORDERS[1:]) + "| fp128 given / rcm / chosen " \
           "| pad given / pattern / rcm / chosen | tiles given / rcm (density) | s pattern / rcm / communities / chosen " \
           + ("| specs (unrolled layers) given / pattern / chosen " if specs else "") \
           + ("| ms given / pattern / rcm / chosen " if timed else "") + "|"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        o = r["orders"]
        given = o["given"][key]
        cells = [f"{r['matrix']} ({r['shape'][0]}x{r['shape'][1]}, {r['nnz']:,} nnz)", f"{given:,}"]
        cells += [f"{o[n][key]:,} ({o[n][key] / given:.3f})" if given else "0" for n in ORDERS[1:]]
        cells.append(" / ".join(f"{o[n]['fp128']:,}" for n in ("given", "rcm", "chosen")))
        cells.append(" / ".join(f"{o[n]['pad']:.3f}" for n in ("given", "pattern", "rcm", "chosen")))
        cells.append(" / ".join(f"{o[n]['tiles']:,} ({o[n]['tile_density']:.3f})" for n in ("given", "rcm")))
        cells.append(" / ".join(f"{o[n]['s']:.2f}" for n in ORDERS[1:]))
        if specs:
            cells.append(" / ".join(f"{o[n]['specs']} ({o[n]['unrolled']})" for n in ("given", "pattern", "chosen")))
        if timed:
            cells.append(" / ".join(f"{o[n].get('ms', float('nan')):.3f}" for n in ("given", "pattern", "rcm", "chosen")))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(records, key: str) -> list[str]:
    """Geometric means of each order's footprint against the pattern order, and its wins."""
    out = []
    for name in ("rcm", "communities", "chosen"):
        ratios = [r["orders"][name][key] / r["orders"]["pattern"][key] for r in records if r["orders"]["pattern"][key]]
        if not ratios:
            continue
        wins = sum(x < 0.99 for x in ratios)
        losses = sum(x > 1.01 for x in ratios)
        out.append(f"- {name} / pattern, {key}: geomean {np.exp(np.mean(np.log(ratios))):.3f}, "
                   f"min {min(ratios):.3f}, max {max(ratios):.3f}; {wins} of {len(ratios)} more than 1 % smaller, "
                   f"{losses} more than 1 % larger")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["dlmc", "networks"], help="one set only")
    p.add_argument("--limit", type=int, default=None, help="the first N DLMC matrices")
    p.add_argument("--big", action="store_true", help="also n65536-l120")
    p.add_argument("--gpu", action="store_true", help="also time the kernels on the GPU")
    p.add_argument("--inputs", type=int, default=10000, help="--gpu: MNIST-made inputs per network")
    p.add_argument("--block", type=int, default=BLOCK, help="networks: SparseDNN's tile of output neurons")
    p.add_argument("--layers", type=int, default=None, help="networks: the first L layers of each")
    p.add_argument("--network", default=None, help="networks: only those whose name holds this (e.g. n4096)")
    p.add_argument("--out", type=Path, default=ROOT / "lab" / "results" / "graph_orders")
    args = p.parse_args(argv)
    if not args.gpu:  # the emulated networks that count specs need no plan cache: leave it as it is
        os.environ.setdefault("SPARSEGEN_DISABLE_CACHE", "1")
    data = data_dir()
    doc = {"sparsegen": sparsegen.__version__, "edge_limit": graph.EDGE_LIMIT, "block": args.block,
           "command": " ".join(sys.argv), "dlmc": [], "networks": []}
    if args.only != "networks":
        for rec in dlmc_rows(data, args.limit, args.gpu):
            doc["dlmc"].append(rec)
            print(rec["matrix"], {k: round(v["fp32"] / max(rec["orders"]["pattern"]["fp32"], 1), 3)
                                  for k, v in rec["orders"].items()}, flush=True)
    if args.only != "dlmc":
        for rec in network_rows(data, args.big, args.gpu, args.inputs, args.block, args.layers,
                                args.network):
            doc["networks"].append(rec)
            print(rec["matrix"], {k: v[f"fp{args.block}"] for k, v in rec["orders"].items()}, rec["decision"],
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_orders.json").write_text(json.dumps(doc, indent=1))
    md = []
    if doc["dlmc"]:
        md += ["## DLMC", "", *table(doc["dlmc"], None), "", *summary(doc["dlmc"], "fp32"),
               *summary(doc["dlmc"], "fp128"), ""]
    if doc["networks"]:
        md += [f"## Graph Challenge networks (sums over layers; SparseDNN tiles of {args.block})", "",
               *table(doc["networks"], args.block), "", *summary(doc["networks"], f"fp{args.block}"), ""]
        md += [f"- {r['matrix']}: SparseDNN decision: {r['decision']}" for r in doc["networks"]]
    (args.out / "graph_orders.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {args.out / 'graph_orders.json'} and graph_orders.md")


if __name__ == "__main__":
    main()
