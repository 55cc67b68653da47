"""`sparsegen bench graphchallenge`: sparse DNN inference against a cuSPARSE layer loop.

Every case runs the network with sparsegen's SparseDNN (best of 3 runs, after a warm-up run) and
with a cuSPARSE (torch.sparse, int32 CSR) loop that does the same pruning, in the same process.
The answer -- which inputs survive -- is checked against the scipy reference of the same run
(on a seeded prefix of the inputs for the large cases, since scipy is single-threaded) and, for
the official images, against the official categories. Throughput is the challenge's:
inputs x sum(nnz(W_l)) / inference time.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import graphchallenge as gc
from ..spdnn import SparseDNN
from .report import atomic_write

RUNS = 3


@dataclass(frozen=True)
class Case:
    id: str
    neurons: int
    layers: int
    inputs: str  # "official" (the 1200 official images) or "mnist" (MNIST-made, side = sqrt(neurons))
    count: int | None  # inputs used (None: all)
    reference_count: int | None  # inputs the scipy reference checks (None: all)
    runtime_variant: bool = False  # also time the kernel that reads its trip counts at run time
    modes: bool = False  # also time streamed weights and host-side pruning
    relabel_variant: bool = False  # also time the network without relabeled hidden neurons


CASES = (
    Case("official/n1024-l120/1200-official-images", 1024, 120, "official", None, None),
    Case("official/n1024-l120/60000-mnist", 1024, 120, "mnist", 60000, None, runtime_variant=True, modes=True),
    Case("generated/n4096-l120/60000-mnist", 4096, 120, "mnist", 60000, 2000, relabel_variant=True),
    Case("generated/n1024-l1920/60000-mnist", 1024, 1920, "mnist", 60000, 2000),
    Case("generated/n16384-l120/10000-mnist", 16384, 120, "mnist", 10000, 500, relabel_variant=True),
    Case("generated/n4096-l1920/10000-mnist", 4096, 1920, "mnist", 10000, 500),
    Case("generated/n65536-l120/2000-mnist", 65536, 120, "mnist", 2000, 100),
)
QUICK = CASES[:2]


def run(cfg, *, env: dict, emit=print, checkpoint=None, previous=None, clock=time.monotonic) -> dict:
    doc = {"suite": "graphchallenge", **{k: env.get(k) for k in ("gpu", "driver", "cuda", "revision", "date",
                                                                   "command")},
           "environment": {k: env.get(k) for k in ("compute_capability", "torch", "python", "revision_dirty")},
           "truncated": False, "cases": []}
    done = {c["id"]: c for c in (previous or {}).get("cases", [])}
    deadline = clock() + 60 * cfg.max_minutes if cfg.max_minutes else None
    cases = QUICK if cfg.quick else CASES
    if cfg.limit:
        cases = cases[: cfg.limit]
    for case in cases:
        if case.id in done:
            doc["cases"].append(done[case.id])
            continue
        if deadline is not None and clock() > deadline:
            doc["truncated"] = True
            emit(f"stopping before {case.id}: --max-minutes reached")
            break
        try:
            rec = run_case(case, Path(cfg.data_dir), emit)
        except Exception as exc:  # a failed case is reported, and the suite goes on
            rec = {"id": case.id, "pass": False, "status": "failed", "note": f"{type(exc).__name__}: {exc}"}
        doc["cases"].append(rec)
        emit(progress_line(rec))
        if checkpoint:
            checkpoint(doc)
    return doc


def load_case(case: Case, data: Path):
    gcdir = data / "graphchallenge"
    if case.neurons == 1024 and case.layers == 120:
        layers = gc.read_network(gcdir, neurons=1024, layers=120)
    else:
        layers = gc.generate_network(case.neurons, case.layers, seed=1)
    if case.inputs == "official":
        x = gc.read_inputs(gcdir / "sparse-images-1024-first1200.tsv.gz", 1024)
    else:
        side = int(round(case.neurons ** 0.5))
        x = gc.mnist_inputs(data / "mnist" / "train-images-idx3-ubyte.gz", side=side, count=case.count)
    return layers, x


def best_run(net, x, **mode):
    net.run(x[: min(x.shape[0], 64)], **mode)  # warm-up: load modules, first launches
    runs = [net.run(x, **mode) for _ in range(RUNS)]
    return min(runs, key=lambda r: r.timings_ms["inference"]), runs


def cusparse_loop(layers, x, bias: float, cap: float = gc.CAP):
    """Per layer: cuSPARSE SpMM (torch.sparse CSR, int32), bias on nonzeros, clamp, prune dead inputs."""
    import torch

    a = []
    for w in layers:
        t = w.T.tocsr()
        a.append(torch.sparse_csr_tensor(torch.from_numpy(t.indptr.astype(np.int32)),
                                         torch.from_numpy(t.indices.astype(np.int32)),
                                         torch.from_numpy(t.data.astype(np.float32)), size=t.shape, device="cuda"))

    def once():
        yt = torch.from_numpy(np.ascontiguousarray(x.T.toarray(), dtype=np.float32)).cuda()
        ids = torch.arange(x.shape[0], device="cuda")
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for m in a:
            z = torch.mm(m, yt)
            z = torch.where(z != 0, z + bias, z).clamp_(0, cap)
            keep = (z > 0).any(0)
            yt, ids = z[:, keep], ids[keep]
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), np.sort(ids.cpu().numpy())

    once()
    runs = [once() for _ in range(RUNS)]
    return min(r[0] for r in runs), runs[0][1]


def run_case(case: Case, data: Path, emit) -> dict:
    t = time.perf_counter()
    layers, x = load_case(case, data)
    preprocess_ms = 1e3 * (time.perf_counter() - t)
    bias = gc.bias_for(case.neurons)
    net = SparseDNN(layers, bias=bias, cap=gc.CAP, backend="gpu", progress=False)
    best, runs = best_run(net, x)
    rec = {"id": case.id, "neurons": case.neurons, "layers": case.layers, "inputs": int(x.shape[0]),
           "input_nnz": int(x.nnz), "edges": net.edges, "specs": net.specs, "survivors": int(best.ids.size),
           "alive_per_layer": list(best.alive_per_layer),
           "relabeling": {"applied": net.relabel.applied, "reason": net.relabel.reason},
           "ms": {"sparsegen": best.timings_ms["inference"]},
           "ms_runs": {"sparsegen": [r.timings_ms["inference"] for r in runs]},
           "teraedges_per_s": {"sparsegen": best.teraedges_per_s},
           "split_ms": {"preprocess": preprocess_ms, "compile": net.compile_ms,
                        **{k: best.timings_ms[k] for k in ("transfer", "kernels", "pruning")}}}
    if case.runtime_variant:
        rt = SparseDNN(layers, bias=bias, cap=gc.CAP, backend="gpu", unroll=False, progress=False)
        rt_best, _ = best_run(rt, x)
        rec["ms"]["sparsegen_runtime_trips"] = rt_best.timings_ms["inference"]
        rec["teraedges_per_s"]["sparsegen_runtime_trips"] = rt_best.teraedges_per_s
        rec["runtime_trips_specs"] = rt.specs
        rec["runtime_trips_same_answer"] = bool(np.array_equal(rt_best.ids, best.ids))
    if case.relabel_variant:
        plain = SparseDNN(layers, bias=bias, cap=gc.CAP, backend="gpu", relabel="never", progress=False)
        plain_best, _ = best_run(plain, x)
        rec["ms"]["sparsegen_not_relabeled"] = plain_best.timings_ms["inference"]
        rec["teraedges_per_s"]["sparsegen_not_relabeled"] = plain_best.teraedges_per_s
        rec["not_relabeled_same_answer"] = bool(np.array_equal(plain_best.ids, best.ids))
    if case.modes:
        for name, mode in (("sparsegen_streamed_weights", {"weights": "streamed"}),
                           ("sparsegen_host_pruning", {"prune": "host"})):
            other, _ = best_run(net, x, **mode)
            rec["ms"][name] = other.timings_ms["inference"]
            rec["teraedges_per_s"][name] = other.teraedges_per_s
            rec[f"{name}_same_answer"] = bool(np.array_equal(other.ids, best.ids))
    loop_ms, loop_ids = cusparse_loop(layers, x, bias)
    rec["ms"]["cusparse_loop"] = loop_ms
    rec["teraedges_per_s"]["cusparse_loop"] = x.shape[0] * net.edges / (loop_ms * 1e-3) / 1e12
    rec["speedup_vs_cusparse_loop"] = loop_ms / best.timings_ms["inference"]
    rec["cusparse_loop_same_answer"] = bool(np.array_equal(loop_ids, best.ids))
    # the scipy reference of the same run (on a prefix of the inputs for the large cases)
    k = x.shape[0] if case.reference_count is None else min(case.reference_count, x.shape[0])
    ref = gc.reference_inference(layers, x[:k], bias)
    rec["reference_inputs"] = int(k)
    rec["reference_check"] = bool(np.array_equal(best.ids[best.ids < k], ref.ids))
    rec["official_check"] = None
    if case.inputs == "official":
        expected = gc.read_categories(data / "graphchallenge" / "categories-first1200.tsv")
        rec["official_check"] = "PASSED" if np.array_equal(best.categories, expected) else "FAILED"
    rec["pass"] = rec["reference_check"] and rec["official_check"] in (None, "PASSED")
    rec["status"] = "ok" if rec["pass"] else "failed"
    return rec


def progress_line(rec: dict) -> str:
    if rec.get("status") == "failed" and "ms" not in rec:
        return f"{rec['id']}  FAILED  {rec.get('note')}"
    te = rec["teraedges_per_s"]
    return (f"{rec['id']}  sparsegen {rec['ms']['sparsegen']:.3f} ms ({te['sparsegen']:.2f} TE/s)  "
            f"cuSPARSE loop {rec['ms']['cusparse_loop']:.3f} ms ({te['cusparse_loop']:.2f} TE/s)  "
            f"{rec['speedup_vs_cusparse_loop']:.2f}x  survivors {rec['survivors']}  "
            f"reference {'ok' if rec['reference_check'] else 'MISMATCH'} ({rec['reference_inputs']} inputs)"
            + (f"  official {rec['official_check']}" if rec["official_check"] else ""))


def summary_lines(doc: dict) -> list[str]:
    return [progress_line(c) for c in doc["cases"]]


def markdown(doc: dict) -> str:
    lines = ["# sparsegen benchmark: `graphchallenge`", "", f"Command: `{doc.get('command')}`", "",
             "| GPU | driver | CUDA | revision | date |", "|---|---|---|---|---|",
             f"| {doc.get('gpu')} | {doc.get('driver')} | {doc.get('cuda')} | `{(doc.get('revision') or 'none')[:12]}` "
             f"| {doc.get('date')} |", "",
             "Inference time = GPU time from the first layer to the last pruning step (CUDA events; best of "
             f"{RUNS} runs after a warm-up). TeraEdges/s = inputs x sum(nnz(W_l)) / inference time. The cuSPARSE "
             "loop is torch.sparse CSR SpMM per layer with the same bias, clamp and pruning. `reference` compares "
             "the surviving inputs with scipy's on the first `ref. inputs` inputs.", "",
             "| case | inputs | edges | sparsegen ms | TE/s | cuSPARSE loop ms | TE/s | speedup | kernels ms | "
             "pruning ms | transfer ms | compile ms | survivors | reference | official |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        if "ms" not in c:
            lines.append(f"| {c['id']} | failed: {c.get('note')} |" + " |" * 13)
            continue
        s, te = c["split_ms"], c["teraedges_per_s"]
        lines.append(
            f"| {c['id']} | {c['inputs']} | {c['edges']} | {c['ms']['sparsegen']:.3f} | {te['sparsegen']:.2f} | "
            f"{c['ms']['cusparse_loop']:.3f} | {te['cusparse_loop']:.2f} | {c['speedup_vs_cusparse_loop']:.2f}x | "
            f"{s['kernels']:.3f} | {s['pruning']:.3f} | {s['transfer']:.1f} | {s['compile']:.0f} | {c['survivors']} | "
            f"{'ok' if c['reference_check'] else 'MISMATCH'} ({c['reference_inputs']}) | {c['official_check'] or '-'} |")
    rt = [c for c in doc["cases"] if "sparsegen_runtime_trips" in c.get("ms", {})]
    if rt:
        lines += ["", "Unrolled (trip counts as template constants) against the variant that reads them at run time:", "",
                  "| case | unrolled ms | runtime-trips ms | unrolled speedup | same answer |", "|---|---|---|---|---|"]
        for c in rt:
            lines.append(f"| {c['id']} | {c['ms']['sparsegen']:.3f} | {c['ms']['sparsegen_runtime_trips']:.3f} | "
                         f"{c['ms']['sparsegen_runtime_trips'] / c['ms']['sparsegen']:.3f}x | "
                         f"{c['runtime_trips_same_answer']} |")
    modes = [c for c in doc["cases"] if "sparsegen_streamed_weights" in c.get("ms", {})]
    if modes:
        lines += ["", "Resident against streamed weights, and pruning on the device against a host round trip "
                  "per layer (the 2020 code's way):", "",
                  "| case | resident, device pruning ms | streamed weights ms | host pruning ms | same answers |",
                  "|---|---|---|---|---|"]
        for c in modes:
            lines.append(f"| {c['id']} | {c['ms']['sparsegen']:.3f} | {c['ms']['sparsegen_streamed_weights']:.3f} | "
                         f"{c['ms']['sparsegen_host_pruning']:.3f} | "
                         f"{c['sparsegen_streamed_weights_same_answer'] and c['sparsegen_host_pruning_same_answer']} |")
    rel = [c for c in doc["cases"] if "sparsegen_not_relabeled" in c.get("ms", {})]
    if rel:
        lines += ["", "Hidden neurons relabeled (rows of each layer grouped so tiles touch fewer inputs) against the "
                  "network as given:", "", "| case | relabeled ms | as given ms | speedup | same answer | decision |",
                  "|---|---|---|---|---|---|"]
        for c in rel:
            lines.append(f"| {c['id']} | {c['ms']['sparsegen']:.3f} | {c['ms']['sparsegen_not_relabeled']:.3f} | "
                         f"{c['ms']['sparsegen_not_relabeled'] / c['ms']['sparsegen']:.2f}x | "
                         f"{c['not_relabeled_same_answer']} | {c['relabeling']['reason']} |")
    if doc.get("truncated"):
        lines += ["", "**Truncated**: the run stopped at its --max-minutes limit."]
    lines += ["", "Specs:", ""] + [f"- {c['id']}: {', '.join(c.get('specs', []))}" for c in doc["cases"]]
    return "\n".join(lines) + "\n"


def exit_status(doc: dict) -> int:
    """0 when every case passed, else 1."""
    return 0 if all(c.get("pass") for c in doc["cases"]) else 1


def write_json(doc: dict, out_dir) -> Path:
    path = Path(out_dir) / "graphchallenge.json"
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    return path


def write_reports(doc: dict, out_dir) -> dict:
    out = Path(out_dir)
    paths = {"json": write_json(doc, out), "md": out / "graphchallenge.md", "png": None}
    atomic_write(paths["md"], markdown(doc))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        paths["png_note"] = "matplotlib not installed"
        return paths
    cases = [c for c in doc["cases"] if "ms" in c]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = np.arange(len(cases))
    ax.bar(xs - 0.2, [c["teraedges_per_s"]["sparsegen"] for c in cases], 0.4, label="sparsegen")
    ax.bar(xs + 0.2, [c["teraedges_per_s"]["cusparse_loop"] for c in cases], 0.4, label="cuSPARSE loop")
    ax.set_xticks(xs, [c["id"].split("/", 1)[1].replace("/", "\n") for c in cases], fontsize=8)
    ax.set_ylabel("TeraEdges/s")
    ax.set_title(f"Sparse DNN inference on {doc.get('gpu')} by size and depth")
    ax.legend()
    fig.tight_layout()
    paths["png"] = out / "graphchallenge.png"
    fig.savefig(paths["png"], dpi=110)
    plt.close(fig)
    return paths
