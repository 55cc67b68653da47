"""A scaling model for sparse DNN inference over P GPUs (weights replicated, inputs partitioned), and
its check against runs over MPI ranks.

    python lab/mpi_scaling.py predict [--cases JSON ...] [--ranks 1 8 64 768] [--bandwidth GBs] [--latency us]
    python lab/mpi_scaling.py validate [--ranks 1 2 3] [--backend emulate|gpu] [--count N]
    python lab/mpi_scaling.py imbalance [--ranks 2 3] [--layers 32] [--converge off|auto] [--backend emulate|gpu]

The model. One GPU runs layer l on r rows in t(r) = floor + r · per_row (the launch floor and the
cost of a row-layer: fitted from one-GPU runs, `fit_times`). On P GPUs each rank gets inputs/P
inputs; after layer l a rank holds its share of the rows the one-GPU run computed there, R_l / P on
average, and the slowest rank its share plus the spread of P binomial draws (`slowest_rows`). Its
time is the sum over layers of t(slowest rows), plus, with rebalancing, what each boundary costs
(rows staged to the host and back, the excess moved over the interconnect, latency) and what it
saves (the slowest rank drops to the mean), plus the final gather of the survivors' ids. TeraEdges/s
= inputs · edges / that time, as the challenge counts it.

It uses only sparsegen's public API (the benchmark JSON files' keys, sparsegen.distributed for the
runs it checks against).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = [REPO / "benchmarks" / "results" / "h200" / "graphchallenge" / "graphchallenge.json"]
CHALLENGE_INPUTS = 60000
# Hidayetoglu et al., HPEC 2020 (arXiv 2007.14152): up to 180 TeraEdges/s on 768 V100s of Summit
SUMMIT = {"gpus": 768, "teraedges_per_s": 180.0}


@dataclass(frozen=True)
class Times:
    """t(rows) = floor_s + rows · per_row_s for one layer on one GPU; segment_s: a rank's host time
    for each segment it runs (its device buffers, its rows to the device and back, the result)."""

    floor_s: float
    per_row_s: float
    segment_s: float = 0.0


@dataclass(frozen=True)
class Link:
    """The interconnect as the model sees it: bytes/s and seconds per message between ranks, and
    bytes/s between device and host (the rows are staged through host memory)."""

    bandwidth: float = 50e9  # NDR InfiniBand, 400 Gb/s per GPU
    latency: float = 5e-6
    staging: float = 50e9  # PCIe 5 x16


def fit_times(runs) -> Times:
    """Least squares of seconds = layers · floor + row_layers · per_row over (layers, row_layers,
    seconds) triples (two or more runs of different shapes: converge on and off, or two input counts)."""
    a = np.array([[l, r] for l, r, _ in runs], np.float64)
    s = np.array([t for _, _, t in runs], np.float64)
    (floor, per_row), *_ = np.linalg.lstsq(a, s, rcond=None)
    return Times(max(float(floor), 0.0), max(float(per_row), 0.0))


def expected_max_normal(p: int) -> float:
    """E[max of p standard normals] (Blom's approximation; 0 for one)."""
    if p < 2:
        return 0.0
    from statistics import NormalDist

    return NormalDist().inv_cdf((p - 0.375) / (p + 0.25))


def slowest_rows(rows: np.ndarray, inputs: int, p: int, since=None) -> np.ndarray:
    """The slowest rank's rows per layer when each rank holds an equal share at layer `since` (the
    start, or the last rebalancing) and each row lives on with the one-GPU run's odds."""
    base = np.full(rows.shape, inputs, np.float64) if since is None else since
    mean = rows / p
    q = np.divide(rows, base, out=np.zeros_like(mean), where=base > 0)
    spread = expected_max_normal(p) * np.sqrt(np.maximum(mean * (1 - q), 0))
    return np.minimum(np.ceil(mean + spread), np.ceil(base / p))


def predict(rows, width: int, inputs: int, edges: int, p: int, times: Times, link: Link,
            rebalance: bool = False, first: int = 4, threshold: float = 1.1, margin: float = 2.0) -> dict:
    """The slowest rank's time over p GPUs and what it comes to. rows: rows computed per layer on one GPU."""
    rows = np.asarray(rows, np.float64)
    layers = rows.size
    slow = slowest_rows(rows, inputs, p)
    boundary_s, moves, segments = 0.0, 0, 1
    b = first
    while rebalance and p > 1 and b < layers:  # over the doubling boundaries
        segments += 1
        excess = slow[b - 1] - math.ceil(rows[b - 1] / p)
        saving = excess * (layers - b) * times.per_row_s
        cost = excess * (4 * width + 8) / link.bandwidth + link.latency * (math.log2(p) + 2)
        staging = 2 * slow[b - 1] * 4 * width / link.staging + link.latency * math.log2(p)
        boundary_s += staging
        if slow[b - 1] > threshold * rows[b - 1] / p and saving > margin * cost:
            since = np.full(rows.shape, rows[b - 1], np.float64)
            slow[b:] = slowest_rows(rows[b:], inputs, p, since[b:])
            boundary_s += cost
            moves += 1
        bound = slow[b - 1] * (1 - 1 / p) * (layers - 2 * b) * times.per_row_s  # the rule's go-on test
        if bound <= margin * staging:
            break
        b *= 2
    compute = float(np.sum(np.where(rows > 0, times.floor_s, 0.0) + slow * times.per_row_s))
    gather = link.latency * math.log2(max(p, 2)) + 8 * rows[-1] / link.bandwidth if p > 1 else 0.0
    host = segments * times.segment_s
    total = compute + boundary_s + gather + host
    return {"ranks": p, "time_ms": 1e3 * total, "slowest_row_layers": float(slow.sum()), "compute_ms": 1e3 * compute,
            "host_ms": 1e3 * host, "segments": segments,
            "boundaries_ms": 1e3 * boundary_s, "gather_ms": 1e3 * gather, "moves": moves, "teraedges_per_s": inputs * edges / total / 1e12,
            "slowest_rows_first_layer": int(slow[0])}


# ------------------------------------------------------------------------------- the official cases

def cases(paths, deepen=(), floor_s: float = 10e-6):
    """The cases of benchmark JSON files: converge-off time and alive curve (the one-GPU run computed
    every alive input at every layer). deepen: layer counts to extrapolate 120-layer cases to (the
    survivors stay as after layer 120, as the measured 1920-layer networks' do)."""
    out = []
    for path in paths:
        for c in json.loads(Path(path).read_text())["cases"]:
            ms = c.get("ms", {})
            # a file from before converge has one time (converge off); a later one has both
            off = ms.get("sparsegen_converge_off", ms.get("sparsegen"))
            on = ms["sparsegen"] if "sparsegen_converge_off" in ms else None
            if not off or "alive_per_layer" not in c or c["inputs"] < 2000:
                continue
            alive = np.array(c["alive_per_layer"], np.float64)
            rows = np.concatenate([[c["inputs"]], alive[:-1]])
            split = c.get("layer_ms", {}).get("converge_off") if isinstance(c.get("layer_ms"), dict) else None
            layer_s = np.array([sum(d.values()) for d in split]) / 1e3 if split and len(split) == rows.size else None
            out.append({"name": c["id"], "rows": rows, "inputs": c["inputs"], "width": c["neurons"],
                        "edges": c["edges"], "seconds": off / 1e3, "converge_on": on,
                        "distinct": c.get("distinct_per_layer"), "layers_run": c.get("layers_run"),
                        "layer_s": layer_s})
    for case in [c for c in out if len(c["rows"]) == 120]:
        for layers in deepen:
            rows = np.concatenate([case["rows"], np.full(layers - 120, case["rows"][-1])])
            t = times_of(case, floor_s)
            out.append({**case, "name": case["name"].replace("-l120", f"-l{layers}") + " (extrapolated)", "rows": rows,
                        "edges": case["edges"] * layers // 120, "converge_on": None,
                        "seconds": len(rows) * t.floor_s + rows.sum() * t.per_row_s})
    return out


def times_of(case, floor_s: float) -> Times:
    """The case's floor and per-row cost: fitted to its layers one by one where the run timed each
    (converge off: every alive row computed), else to its converge on and off totals, else its
    per-row cost under a given floor."""
    if case.get("layer_s") is not None:
        return fit_times([(1, r, t) for r, t in zip(case["rows"], case["layer_s"])])
    if case["converge_on"] and case["distinct"]:
        return fit_times([(len(case["rows"]), case["rows"].sum(), case["seconds"]),
                          (case["layers_run"], sum(case["distinct"]), case["converge_on"] / 1e3)])
    per_row = (case["seconds"] - floor_s * len(case["rows"])) / case["rows"].sum()
    return Times(floor_s, per_row)


def cmd_predict(a) -> int:
    link = Link(a.bandwidth * 1e9, a.latency * 1e-6, a.staging * 1e9)
    print(f"link: {a.bandwidth:g} GB/s, {a.latency:g} us, staging {a.staging:g} GB/s; host {a.segment:g} us a "
          f"segment; inputs scaled to {CHALLENGE_INPUTS}; Summit (768 V100, HPEC 2020): up to "
          f"{SUMMIT['teraedges_per_s']:g} TeraEdges/s\n")
    print("| network | floor us | per row-layer ns | P | converge off ms | TE/s | efficiency | TE/s rebalanced | "
          "moves | converge on ms | TE/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases(a.cases, a.deepen, a.floor * 1e-6):
        t = replace(times_of(case, a.floor * 1e-6), segment_s=a.segment * 1e-6)
        scale = CHALLENGE_INPUTS / case["inputs"]
        rows = case["rows"] * scale
        # converge on, per rank: the layers the one-GPU run computed, on the rank's share of the alive
        # rows (the copies it would find among its own rows are not counted: an upper bound)
        ran = np.asarray(case["distinct"] or [1] * rows.size) > 0
        rows_on = np.where(ran, rows, 0.0)
        base = predict(rows, case["width"], CHALLENGE_INPUTS, case["edges"], 1, t, link)
        for p in a.ranks:
            off = predict(rows, case["width"], CHALLENGE_INPUTS, case["edges"], p, t, link)
            moved = predict(rows, case["width"], CHALLENGE_INPUTS, case["edges"], p, t, link, rebalance=True)
            on = predict(rows_on, case["width"], CHALLENGE_INPUTS, case["edges"], p, t, link)
            eff = base["time_ms"] / (p * off["time_ms"])
            print(f"| {case['name']} | {1e6 * t.floor_s:.1f} | {1e9 * t.per_row_s:.2f} | {p} | {off['time_ms']:.3f} | "
                  f"{off['teraedges_per_s']:.1f} | {100 * eff:.1f} % | {moved['teraedges_per_s']:.1f} | "
                  f"{moved['moves']} | {on['time_ms']:.3f} | {on['teraedges_per_s']:.1f} |")
    return 0


# --------------------------------------------------------------------------------- checking it here

def mpirun(ranks: int, args, timeout: int = 900) -> dict:
    from sparsegen.distributed import mpiexec_command

    cmd = [*mpiexec_command(ranks), sys.executable, "-m", "sparsegen", "spdnn", *args, "--mpi", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def cmd_validate(a) -> int:
    """Fit t(rows) from one rank at two input counts, predict P ranks, run them, compare: the slowest
    rank's row-layers (what the model's imbalance term predicts; independent of the machine's load)
    and its time (which, on a machine shared with other work, is not)."""
    data = Path(a.data) / "graphchallenge"
    inputs = Path(tempfile.mkdtemp(prefix="sparsegen-scaling-")) / "inputs.tsv"
    import gzip

    inputs.write_bytes(gzip.decompress((data / "sparse-images-1024-first1200.tsv.gz").read_bytes()))
    common = ["--weights", str(data), "--inputs", str(inputs), "--backend", a.backend, "--converge", "off",
              "--rebalance", a.rebalance, "--layers", str(a.layers)]
    fits, hosts = [], []
    for count in (a.count // 2, a.count):
        r = mpirun(1, [*common, "--count", str(count)])
        fits.append((r["layers"], r["rows_computed"], r["ranks"][0]["compute_ms"] / 1e3))
        hosts.append(r["ranks"][0]["staging_ms"] / 1e3 / max(1, r["ranks"][0]["segments"]))
    t = replace(fit_times(fits), segment_s=float(np.mean(hosts)))
    r1 = mpirun(1, [*common, "--count", str(a.count)])
    rows = np.concatenate([[a.count], np.array(r1["alive_per_layer"][:-1], np.float64)])
    link = Link(a.bandwidth * 1e9, a.latency * 1e-6, a.staging * 1e9)
    print(f"fit from 1 rank at {a.count // 2} and {a.count} inputs: floor {1e6 * t.floor_s:.1f} us, "
          f"per row-layer {1e6 * t.per_row_s:.2f} us, host {1e6 * t.segment_s:.0f} us a segment ({a.backend})")
    print("| ranks | slowest rank's row-layers predicted | measured (max over ranks) | predicted ms | measured ms "
          "(slowest rank) | compute ms predicted / measured | host ms predicted / measured | T1/TP predicted | "
          "T1/TP measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    t1p = t1m = None
    for p in a.ranks:
        pred = predict(rows, 1024, a.count, r1["edges"], p, t, link, rebalance=a.rebalance != "off")
        run = r1 if p == 1 else mpirun(p, [*common, "--count", str(a.count)])
        slowest = max(run["ranks"], key=lambda k: k["time_ms"])
        t1p, t1m = t1p or pred["time_ms"], t1m or slowest["time_ms"]
        most = max(k["rows_computed"] for k in run["ranks"])
        print(f"| {p} | {pred['slowest_row_layers']:.0f} | {most} | {pred['time_ms']:.1f} | {slowest['time_ms']:.1f} | "
              f"{pred['compute_ms']:.1f} / {slowest['compute_ms']:.1f} | {pred['host_ms']:.1f} / "
              f"{slowest['staging_ms']:.1f} | {t1p / pred['time_ms']:.2f} | {t1m / slowest['time_ms']:.2f} |")
    return 0


def skewed_inputs(out: Path, layers: int, scale: int = 1, seed: int = 0) -> tuple[Path, Path]:
    """A generated network of the official kind and 300·scale inputs whose survivors all come first
    (a fifth on 4 to 32 of the 64 residue classes; the rest sparse, dying early): the ranks holding
    the first inputs keep nearly all the rows."""
    import scipy.sparse as sp

    from sparsegen import graphchallenge as gc

    rng = np.random.default_rng(seed)
    live, dead = 60 * scale, 240 * scale
    x = np.zeros((live + dead, 1024), np.float32)
    blocks = np.arange(16)[:, None] * 64
    for i in range(live):  # over the survivors' rows (a few thousand at most)
        x[i, (blocks + rng.choice(64, int(rng.integers(4, 33)), replace=False)[None, :]).ravel()] = 1
    x[live:][np.arange(dead)[:, None], rng.integers(0, 1024, (dead, 40))] = 1
    gc.write_network(gc.generate_network(1024, layers, seed=1), out / "net")
    gc.write_inputs(sp.csr_matrix(x), out / "skewed.tsv")
    return out / "net", out / "skewed.tsv"


def cmd_imbalance(a) -> int:
    """Row-layers and time per rank with rebalancing off, auto and always, on the skewed inputs."""
    weights, inputs = skewed_inputs(Path(tempfile.mkdtemp(prefix="sparsegen-skewed-")), a.layers, a.scale)
    print(f"{300 * a.scale} skewed inputs, n1024 x {a.layers} layers, converge {a.converge}, {a.backend}")
    print("| ranks | rebalance | rows moved | row-layers per rank | max/mean | time per rank ms | slowest ms |")
    print("|---|---|---|---|---|---|---|")
    for p in a.ranks:
        for mode in ("off", "auto", "always"):
            r = mpirun(p, ["--weights", str(weights), "--inputs", str(inputs), "--backend", a.backend, "--bias", "-0.3",
                           "--converge", a.converge, "--rebalance", mode])
            rl = [k["rows_computed"] for k in r["ranks"]]
            ms = [k["time_ms"] for k in r["ranks"]]
            print(f"| {p} | {mode} | {r['mpi']['rows_moved']} | {' / '.join(map(str, rl))} | "
                  f"{r['mpi']['imbalance_rows_computed']:.2f} | {' / '.join(f'{t:.0f}' for t in ms)} | {max(ms):.0f} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("predict", "validate", "imbalance"):
        p = sub.add_parser(name)
        p.add_argument("--ranks", type=int, nargs="+", default=[1, 6, 8, 64, 768] if name == "predict" else [1, 2, 3])
        p.add_argument("--bandwidth", type=float, default=50.0 if name == "predict" else 5.0,
                       help="GB/s between ranks (default: NDR 400 Gb/s; validate: shared memory here)")
        p.add_argument("--latency", type=float, default=5.0, help="us per message")
        p.add_argument("--staging", type=float, default=50.0, help="GB/s device <-> host")
    sub.choices["predict"].add_argument("--cases", nargs="+", default=DEFAULT_CASES,
                                        help="benchmark JSON files (bench graphchallenge's)")
    sub.choices["predict"].add_argument("--deepen", type=int, nargs="*", default=[],
                                        help="also extrapolate the 120-layer cases to these layer counts")
    sub.choices["predict"].add_argument("--floor", type=float, default=10.0,
                                        help="us per layer launch floor where a case cannot fit it")
    sub.choices["predict"].add_argument("--segment", type=float, default=0.0,
                                        help="us of host time per segment a rank runs (validate measures it)")
    v = sub.choices["validate"]
    v.add_argument("--backend", default="emulate", choices=["emulate", "gpu"])
    v.add_argument("--count", type=int, default=1200)
    v.add_argument("--layers", type=int, default=120)
    v.add_argument("--rebalance", default="off", choices=["off", "always", "auto"])
    v.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    m = sub.choices["imbalance"]
    m.add_argument("--backend", default="emulate", choices=["emulate", "gpu"])
    m.add_argument("--layers", type=int, default=32)
    m.add_argument("--converge", default="off", choices=["auto", "off"])
    m.add_argument("--scale", type=int, default=1, help="300 x SCALE inputs")
    a = ap.parse_args(argv)
    return {"predict": cmd_predict, "validate": cmd_validate, "imbalance": cmd_imbalance}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
