"""`sparsegen bench graphchallenge`: sparse DNN inference at the challenge's 60,000 inputs, with
converge on and off, against a cuSPARSE layer loop.

Every case but the official images runs 60,000 inputs -- MNIST's 60,000 training images made into
challenge inputs of the network's size (`graphchallenge.mnist_inputs`, side = sqrt(neurons); the
official 60,000-image file is not available, and the recipe matches its first 1200 images on 99.95 %
of pixels) -- through one SparseDNN with converge="auto" and with converge="off" (best of 3 runs
after a warm-up each), and through a cuSPARSE loop (torch.sparse CSR int32 SpMM per layer, the same
bias, clamp and pruning), in the same process. The official 1200 images are a case of their own,
checked against the official categories.

Answers: converge on and off must give the same ids and bitwise the same features; the cuSPARSE
loop the same ids; and a seeded random subset of the inputs goes through the scipy reference (in a
worker process, while the GPU works), whose ids and features must equal sparsegen's exactly.
Throughput is the challenge's: inputs x sum(nnz(W_l)) / inference time, every layer's edges counted,
skipped or not. Generated networks are made layer by layer (`graphchallenge.GeneratedNetwork`), in
the build's worker processes: the 65536-neuron, 1920-layer network (4.0 G edges) never sits in host
memory as matrices, and on the GPU takes its plans (about 8.6 GB) plus two 60,000-row activation
buffers (31.5 GB); the case reports the peak.
"""
from __future__ import annotations

import gc as garbage
import json
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .. import graphchallenge as gc
from ..spdnn import SparseDNN
from ..spdnn_build import layer_matrix
from .report import atomic_write, header_lines

RUNS = 3
INPUTS = 60000
REFERENCE_SEED = 1
MNIST_CHUNK = 2048  # images per worker task when making the inputs


@dataclass(frozen=True)
class Case:
    id: str
    neurons: int
    layers: int
    inputs: str  # "official" (the 1200 official images) or "mnist" (MNIST-made, side = sqrt(neurons))
    count: int | None  # inputs used (None: all)
    reference_count: int | None  # inputs (a seeded random subset) the scipy reference checks (None: all)
    runtime_variant: bool = False  # also time the kernel that reads its trip counts at run time
    modes: bool = False  # also time streamed weights and host-side pruning
    relabel_variant: bool = False  # also time the network without relabeled hidden neurons


CASES = (
    Case("official/n1024-l120/1200-official-images", 1024, 120, "official", None, None),
    Case("official/n1024-l120/60000-mnist", 1024, 120, "mnist", INPUTS, None, runtime_variant=True, modes=True),
    Case("generated/n4096-l120/60000-mnist", 4096, 120, "mnist", INPUTS, 2000, relabel_variant=True),
    Case("generated/n16384-l120/60000-mnist", 16384, 120, "mnist", INPUTS, 1000),
    Case("generated/n65536-l120/60000-mnist", 65536, 120, "mnist", INPUTS, 300),
    Case("generated/n1024-l1920/60000-mnist", 1024, 1920, "mnist", INPUTS, 2000),
    Case("generated/n4096-l1920/60000-mnist", 4096, 1920, "mnist", INPUTS, 1000),
    Case("generated/n16384-l1920/60000-mnist", 16384, 1920, "mnist", INPUTS, 300),
    Case("generated/n65536-l1920/60000-mnist", 65536, 1920, "mnist", INPUTS, 128),
)
QUICK = CASES[:2]


def run(cfg, *, env: dict, emit=print, checkpoint=None, previous=None, clock=time.monotonic) -> dict:
    doc = {"suite": "graphchallenge", **{k: env.get(k) for k in ("gpu", "driver", "cuda", "revision", "date",
                                                                   "command")},
           "environment": {k: env.get(k) for k in ("compute_capability", "torch", "python", "revision_dirty")},
           "truncated": False, "cases": []}
    done = {c["id"]: c for c in (previous or {}).get("cases", []) if c.get("status") != "failed"}  # failed: again
    if previous:
        doc["runs"] = list(previous.get("runs") or [previous.get("command")]) + [doc["command"]]
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
        if split_line(rec):
            emit(split_line(rec))
        if checkpoint:
            checkpoint(doc)
    return doc


# ------------------------------------------------------------------------------------- the inputs

def load_network(case: Case, data: Path):
    """The official network's 120 layers (read), or a generated one (made layer by layer on demand)."""
    if case.neurons == 1024 and case.layers == 120:
        return gc.read_network(data / "graphchallenge", neurons=1024, layers=120)
    return gc.GeneratedNetwork(case.neurons, case.layers, seed=1)


def _mnist_chunk(path, side: int, start: int, stop: int):
    return gc.mnist_inputs(path, side=side, count=stop, start=start)


def load_inputs(case: Case, data: Path, workers: int) -> sp.csr_matrix:
    """The official images, or `case.count` MNIST-made inputs (made in `workers` processes)."""
    if case.inputs == "official":
        return gc.read_inputs(data / "graphchallenge" / "sparse-images-1024-first1200.tsv.gz", 1024)
    side = int(round(case.neurons ** 0.5))
    path = data / "mnist" / "train-images-idx3-ubyte.gz"
    if workers < 2:
        return gc.mnist_inputs(path, side=side, count=case.count)
    import multiprocessing

    bounds = [(a, min(a + MNIST_CHUNK, case.count)) for a in range(0, case.count, MNIST_CHUNK)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(_mnist_chunk, *zip(*[(path, side, a, b) for a, b in bounds])))
    return sp.vstack(parts, format="csr")


def reference_subset(case: Case, count: int) -> np.ndarray:
    """The inputs the scipy reference checks: all, or a seeded random subset (ascending)."""
    if case.reference_count is None or case.reference_count >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(REFERENCE_SEED).choice(count, case.reference_count, replace=False))


def _reference(layers, x, bias):
    r = gc.reference_inference(layers, x, bias)
    return r.ids, r.features.toarray()


# ---------------------------------------------------------------------------------------- timing

def best_run(net, x, **mode):
    net.run(x[: min(x.shape[0], 64)], **mode)  # warm-up: load modules, first launches
    runs = [net.run(x, **mode) for _ in range(RUNS)]
    return min(runs, key=lambda r: r.timings_ms["inference"]), runs


def cusparse_loop(layers, x, bias: float, cap: float = gc.CAP):
    """Per layer: cuSPARSE SpMM (torch.sparse CSR, int32), bias on nonzeros, clamp, prune dead inputs.
    Inputs go in batches whose dense operand stays under 2**31 elements (cuSPARSE's 32-bit index
    range). Returns (best ms, summed over batches; surviving ids; peak device bytes)."""
    import torch

    a = []
    for l in range(len(layers)):  # over layers
        t = layer_matrix(layers, l, "challenge")
        a.append(torch.sparse_csr_tensor(torch.from_numpy(t.indptr.astype(np.int32)),
                                         torch.from_numpy(t.indices.astype(np.int32)),
                                         torch.from_numpy(t.data.astype(np.float32)), size=t.shape, device="cuda"))
    batch = max(1, min(x.shape[0], (2**31 - 1) // x.shape[1]))
    parts = []
    for start in range(0, x.shape[0], batch):  # over input batches
        xt = x[start:start + batch].T.tocsr()
        parts.append((start, torch.sparse_csr_tensor(torch.from_numpy(xt.indptr.astype(np.int64)),
                                                     torch.from_numpy(xt.indices.astype(np.int32)),
                                                     torch.from_numpy(xt.data.astype(np.float32)), size=xt.shape,
                                                     device="cuda")))
    torch.cuda.reset_peak_memory_stats()

    def once(start, x_dev):
        yt = x_dev.to_dense()
        ids = torch.arange(start, start + x_dev.shape[1], device="cuda")
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for m in a:
            z = torch.mm(m, yt)
            if bias <= 0:  # equal to where(z != 0, z + b, z) then clamp: an absent product gives max(b, 0) = 0
                z.add_(bias).clamp_(0, cap)
            else:
                z = torch.where(z != 0, z + bias, z).clamp_(0, cap)
            keep = (z > 0).any(0)
            yt, ids = z[:, keep], ids[keep]
            del z
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end), ids.cpu().numpy()

    def all_batches():
        times, ids = zip(*(once(s, d) for s, d in parts))
        return sum(times), np.sort(np.concatenate(ids))

    all_batches()
    runs = [all_batches() for _ in range(RUNS)]
    peak = torch.cuda.max_memory_allocated()
    a.clear()  # the layers and inputs leave the device before the next case
    parts.clear()
    torch.cuda.empty_cache()
    return min(r[0] for r in runs), runs[0][1], peak


# ------------------------------------------------------------------------------------------ a case

def run_case(case: Case, data: Path, emit) -> dict:
    import multiprocessing
    import os

    name = case.id.split("/")[1]
    t = time.perf_counter()
    layers = load_network(case, data)
    network_ms = 1e3 * (time.perf_counter() - t)
    t = time.perf_counter()
    workers = max(1, min(32, (os.cpu_count() or 2) - 2))
    x = load_inputs(case, data, workers)
    inputs_ms = 1e3 * (time.perf_counter() - t)
    emit(f"{name}: {x.shape[0]} inputs ({x.nnz} nonzeros) in {inputs_ms / 1e3:.1f} s")
    bias = gc.bias_for(case.neurons)
    subset = reference_subset(case, x.shape[0])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as scipy_worker:
        reference = scipy_worker.submit(_reference, layers, x[subset], bias)  # runs while the GPU works
        t = time.perf_counter()
        net = SparseDNN(layers, bias=bias, cap=gc.CAP, backend="gpu", progress=_emit_progress(emit, name),
                        build="lazy")
        emit(f"{name}: proved {case.layers} layers and compiled {net.layers_built} in "
             f"{(time.perf_counter() - t):.1f} s ({len(net.specs)} specs, {net.workers} worker processes)")
        rec = _measure(case, layers, x, bias, net, network_ms, inputs_ms)
        _variants(case, layers, x, bias, net, rec)
        on_ids = np.asarray(rec.pop("_ids"))
        on_features = rec.pop("_features")
        net.release()
        garbage.collect()
        loop_ms, loop_ids, loop_peak = cusparse_loop(layers, x, bias)
        ref_ids, ref_features = reference.result()
    rec["ms"]["cusparse_loop"] = loop_ms
    rec["teraedges_per_s"]["cusparse_loop"] = x.shape[0] * net.edges / (loop_ms * 1e-3) / 1e12
    rec["speedup_vs_cusparse_loop"] = loop_ms / rec["ms"]["sparsegen"]
    rec["speedup_vs_cusparse_loop_converge_off"] = loop_ms / rec["ms"]["sparsegen_converge_off"]
    rec["cusparse_loop_same_answer"] = bool(np.array_equal(loop_ids, on_ids))
    rec["memory"]["cusparse_loop_peak_bytes"] = int(loop_peak)
    rec["memory"]["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mine = np.isin(on_ids, subset)
    rec["reference"] = {"inputs": int(subset.size), "seed": REFERENCE_SEED if subset.size < x.shape[0] else None,
                        "survivors": int(ref_ids.size), "ids": bool(np.array_equal(on_ids[mine], subset[ref_ids])),
                        "features": bool(np.array_equal(on_features[mine], ref_features))}
    rec["reference_inputs"] = int(subset.size)
    rec["reference_check"] = rec["reference"]["ids"] and rec["reference"]["features"]
    rec["official_check"] = None
    if case.inputs == "official":
        expected = gc.read_categories(data / "graphchallenge" / "categories-first1200.tsv")
        rec["official_check"] = "PASSED" if np.array_equal(on_ids + 1, expected) else "FAILED"
    rec["pass"] = bool(rec["reference_check"] and rec["converge_off_same_answer"]
                       and rec["official_check"] in (None, "PASSED"))
    rec["status"] = "ok" if rec["pass"] else "failed"
    return rec


def _compile_cell(split: dict) -> str:
    """Compile seconds: what converge on needed (proofs of every layer, the layers it built), then
    every layer (converge off builds the rest); one figure for results from before lazy builds."""
    if "compile_converge_on" not in split:
        return f"{split['compile'] / 1e3:.1f}"
    return (f"{split['compile_converge_on'] / 1e3:.1f} ({split['layers_built_converge_on']}) / "
            f"{split['compile'] / 1e3:.1f}")


def _emit_progress(emit, name):
    def show(done, total, elapsed):
        emit(f"{name}: compiled layer {done}/{total} ({elapsed:.0f} s)")
    return show


SPLIT = ("inference", "layers", "dedup", "pruning", "tail", "host_launch")


def split_of(r) -> dict:
    """Where a split run's GPU time went, by kind of launch, and the host's time to make the launches."""
    return {k: r.timings_ms.get(k) for k in SPLIT}


def _measure(case: Case, layers, x, bias, net, network_ms, inputs_ms) -> dict:
    """Converge on and off, best of RUNS each, and one split run of each (an event after every launch)."""
    on, on_runs = best_run(net, x, converge="auto")
    compile_on, built_on = net.compile_ms, net.layers_built  # what the converge-on runs needed built
    off, off_runs = best_run(net, x, converge="off")
    split_on, split_off = net.run(x, converge="auto", split=True), net.run(x, converge="off", split=True)
    passes = [p for p in on.passes if p.ran]
    return {
        "id": case.id, "neurons": case.neurons, "layers": case.layers, "inputs": int(x.shape[0]),
        "input_nnz": int(x.nnz), "edges": net.edges, "specs": net.specs, "survivors": int(on.ids.size),
        "alive_per_layer": list(on.alive_per_layer), "distinct_per_layer": list(on.distinct_per_layer),
        "layers_run": on.layers_run, "fixed_from": net.fixed_from,
        "rows_computed": {"converge_on": on.rows_computed, "converge_off": off.rows_computed},
        "passes": [p.to_dict() for p in passes], "converge_summary": on.summary(),
        "launches": on.launches,
        "relabeling": {"applied": net.relabel.applied, "reason": net.relabel.reason},
        "ms": {"sparsegen": on.timings_ms["inference"], "sparsegen_converge_off": off.timings_ms["inference"]},
        "ms_runs": {"sparsegen": [r.timings_ms["inference"] for r in on_runs],
                    "sparsegen_converge_off": [r.timings_ms["inference"] for r in off_runs]},
        "teraedges_per_s": {"sparsegen": on.teraedges_per_s, "sparsegen_converge_off": off.teraedges_per_s},
        "converge_off_same_answer": bool(np.array_equal(on.ids, off.ids) and np.array_equal(
            on.features.view(np.uint32), off.features.view(np.uint32))),
        "split_ms": {"preprocess": network_ms + inputs_ms, "network": network_ms, "inputs": inputs_ms,
                     "compile": net.compile_ms, "compile_converge_on": compile_on, "layers_built_converge_on": built_on,
                     "transfer": on.timings_ms.get("transfer"),
                     "converge_on": split_of(split_on), "converge_off": split_of(split_off)},
        "layer_ms": {"converge_on": list(split_on.layer_ms), "converge_off": list(split_off.layer_ms)},
        "memory": {**max((on.memory, off.memory), key=lambda m: m.get("device_peak_bytes", 0))},
        "_ids": on.ids, "_features": on.features,
    }


def _variants(case: Case, layers, x, bias, net, rec: dict) -> None:
    """The extra timings some cases carry (converge off, where the kernels' own differences show)."""
    if case.runtime_variant:
        rt = SparseDNN(layers, bias=bias, cap=gc.CAP, backend="gpu", unroll=False, progress=False)
        rt_best, _ = best_run(rt, x, converge="off")
        rec["ms"]["sparsegen_runtime_trips"] = rt_best.timings_ms["inference"]
        rec["teraedges_per_s"]["sparsegen_runtime_trips"] = rt_best.teraedges_per_s
        rec["runtime_trips_specs"] = rt.specs
        rec["runtime_trips_same_answer"] = bool(np.array_equal(rt_best.ids, rec["_ids"]))
        rt.release()
    if case.relabel_variant:
        plain = SparseDNN(layers, bias=bias, cap=gc.CAP, backend="gpu", relabel="never", progress=False)
        plain_best, _ = best_run(plain, x, converge="off")
        rec["ms"]["sparsegen_not_relabeled"] = plain_best.timings_ms["inference"]
        rec["teraedges_per_s"]["sparsegen_not_relabeled"] = plain_best.teraedges_per_s
        rec["not_relabeled_same_answer"] = bool(np.array_equal(plain_best.ids, rec["_ids"]))
        plain.release()
    if case.modes:
        for name, mode in (("sparsegen_streamed_weights", {"weights": "streamed"}),
                           ("sparsegen_pruning_kernel", {"prune": "kernel"}),
                           ("sparsegen_host_pruning", {"prune": "host"})):
            other, _ = best_run(net, x, converge="off", **mode)
            rec["ms"][name] = other.timings_ms["inference"]
            rec["teraedges_per_s"][name] = other.teraedges_per_s
            rec[f"{name}_same_answer"] = bool(np.array_equal(other.ids, rec["_ids"]))


# ----------------------------------------------------------------------------------------- reports

def progress_line(rec: dict) -> str:
    if rec.get("status") == "failed" and "ms" not in rec:
        return f"{rec['id']}  FAILED  {rec.get('note')}"
    te, ms = rec["teraedges_per_s"], rec["ms"]
    return (f"{rec['id']}  converge on {ms['sparsegen']:.3f} ms ({te['sparsegen']:.2f} TE/s)  "
            f"off {ms['sparsegen_converge_off']:.3f} ms ({te['sparsegen_converge_off']:.2f} TE/s)  "
            f"cuSPARSE loop {ms['cusparse_loop']:.3f} ms ({te['cusparse_loop']:.2f} TE/s)  "
            f"{rec['speedup_vs_cusparse_loop']:.2f}x  {rec['layers_run']}/{rec['layers']} layers ran, "
            f"{rec['rows_computed']['converge_on']} rows computed  survivors {rec['survivors']}  "
            f"reference {'ok' if rec['reference_check'] else 'MISMATCH'} ({rec['reference_inputs']} inputs)"
            + (f"  official {rec['official_check']}" if rec["official_check"] else ""))


def split_line(rec: dict) -> str | None:
    """Where each split run's time went (ms): layer kernels, deduplication, pruning, tail; and the host's
    time to make the launches, which the GPU waits on when it is the larger."""
    split = rec.get("split_ms", {})
    parts = []
    for mode in ("converge_on", "converge_off"):
        t = split.get(mode)
        if t and t.get("layers") is not None:
            parts.append(f"{mode.replace('_', ' ')} {t['inference']:.3f} ms = layers {t['layers']:.3f} + dedup "
                         f"{t['dedup']:.3f} + pruning {t['pruning']:.3f} + tail {t['tail']:.3f} (host launches "
                         f"{t['host_launch']:.3f})")
    return f"{rec['id']}  split: " + "; ".join(parts) if parts else None


def summary_lines(doc: dict) -> list[str]:
    lines = []
    for c in doc["cases"]:
        lines.append(progress_line(c))
        if split_line(c):
            lines.append(split_line(c))
    return lines


def _ms(v) -> str:
    return f"{v:.3f}" if v is not None else "-"


def _gb(v) -> str:
    return f"{v / 1e9:.1f}" if v else "-"


def markdown(doc: dict) -> str:
    lines = header_lines({"suite": "graphchallenge", **doc}) + [
             "Inference time = GPU time from the first layer to the last pruning step (CUDA events; best of "
             f"{RUNS} runs after a warm-up). TeraEdges/s = inputs x sum(nnz(W_l)) / inference time, every layer "
             "counted, skipped or not. Converge on: each distinct row computed once, layers skipped where the "
             "rows sit at a proven fixed point, the last row's layers in one launch; exact (same ids, same "
             "features bit for bit as converge off, checked in every case). The cuSPARSE loop is torch.sparse "
             "CSR SpMM per layer with the same bias, clamp and pruning. `rows computed` sums the rows every "
             "layer computed. `reference` compares ids and features with scipy's on a seeded random subset of "
             "`ref. inputs` inputs.", "",
             "| case | inputs | edges | converge on ms | TE/s | converge off ms | TE/s | cuSPARSE loop ms | TE/s | "
             "speedup on / off | layers run | rows computed on / off | compile s: on (layers built) / all | "
             "device peak GB | survivors | "
             "reference | official |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        if "ms" not in c:
            lines.append(f"| {c['id']} | failed: {c.get('note')} |" + " |" * 15)
            continue
        te, ms, rows = c["teraedges_per_s"], c["ms"], c["rows_computed"]
        lines.append(
            f"| {c['id']} | {c['inputs']} | {c['edges']} | {ms['sparsegen']:.3f} | {te['sparsegen']:.2f} | "
            f"{ms['sparsegen_converge_off']:.3f} | {te['sparsegen_converge_off']:.2f} | {ms['cusparse_loop']:.3f} | "
            f"{te['cusparse_loop']:.2f} | {c['speedup_vs_cusparse_loop']:.2f}x / "
            f"{c['speedup_vs_cusparse_loop_converge_off']:.2f}x | {c['layers_run']}/{c['layers']} | "
            f"{rows['converge_on']} / {rows['converge_off']} | {_compile_cell(c['split_ms'])} | "
            f"{_gb(c['memory'].get('device_peak_bytes'))} | {c['survivors']} | "
            f"{'ok' if c['reference_check'] else 'MISMATCH'} ({c['reference_inputs']}) | {c['official_check'] or '-'} |")
    lines += _variant_tables(doc)
    if doc.get("truncated"):
        lines += ["", "**Truncated**: the run stopped at its --max-minutes limit."]
    lines += ["", "Converge, per case:", ""] + [f"- {c['id']}: {c['converge_summary']}" for c in doc["cases"]
                                                if "converge_summary" in c]
    lines += ["", "Specs:", ""] + [f"- {c['id']}: {len(c.get('specs', []))} spec(s), e.g. "
                                   f"{(c.get('specs') or ['-'])[0]}" for c in doc["cases"] if "ms" in c]
    return "\n".join(lines) + "\n"


def _variant_tables(doc: dict) -> list[str]:
    lines = []
    rt = [c for c in doc["cases"] if "sparsegen_runtime_trips" in c.get("ms", {})]
    if rt:
        lines += ["", "Unrolled (trip counts as template constants) against the variant that reads them at run time "
                  "(converge off):", "",
                  "| case | unrolled ms | runtime-trips ms | unrolled speedup | same answer |", "|---|---|---|---|---|"]
        for c in rt:
            lines.append(f"| {c['id']} | {c['ms']['sparsegen_converge_off']:.3f} | "
                         f"{c['ms']['sparsegen_runtime_trips']:.3f} | "
                         f"{c['ms']['sparsegen_runtime_trips'] / c['ms']['sparsegen_converge_off']:.3f}x | "
                         f"{c['runtime_trips_same_answer']} |")
    modes = [c for c in doc["cases"] if "sparsegen_streamed_weights" in c.get("ms", {})]
    if modes:
        lines += ["", "Resident against streamed weights, and pruning in the layer kernel against a pruning kernel "
                  "per layer and a host round trip per layer (the 2020 code's way), converge off:", "",
                  "| case | resident, pruning in the layer ms | streamed weights ms | pruning kernel ms | "
                  "host pruning ms | same answers |", "|---|---|---|---|---|---|"]
        for c in modes:
            same = all(c.get(f"{k}_same_answer", True)
                       for k in ("sparsegen_streamed_weights", "sparsegen_pruning_kernel", "sparsegen_host_pruning"))
            lines.append(f"| {c['id']} | {c['ms']['sparsegen_converge_off']:.3f} | "
                         f"{c['ms']['sparsegen_streamed_weights']:.3f} | "
                         f"{_ms(c['ms'].get('sparsegen_pruning_kernel'))} | {c['ms']['sparsegen_host_pruning']:.3f} | "
                         f"{same} |")
    split = [c for c in doc["cases"] if split_line(c)]
    if split:
        lines += ["", "Where the time goes (one run of each mode with an event after every launch, which adds a "
                  "little time; ms): layer kernels, deduplication candidates, pruning, the converged tail, and the "
                  "host's time to make the launches:", ""] + [f"- {split_line(c)}" for c in split]
    rel = [c for c in doc["cases"] if "sparsegen_not_relabeled" in c.get("ms", {})]
    if rel:
        lines += ["", "Hidden neurons relabeled (rows of each layer grouped so tiles touch fewer inputs) against the "
                  "network as given, converge off:", "",
                  "| case | relabeled ms | as given ms | speedup | same answer | decision |", "|---|---|---|---|---|---|"]
        for c in rel:
            lines.append(f"| {c['id']} | {c['ms']['sparsegen_converge_off']:.3f} | "
                         f"{c['ms']['sparsegen_not_relabeled']:.3f} | "
                         f"{c['ms']['sparsegen_not_relabeled'] / c['ms']['sparsegen_converge_off']:.2f}x | "
                         f"{c['not_relabeled_same_answer']} | {c['relabeling']['reason']} |")
    return lines


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
    fig, ax = plt.subplots(figsize=(11, 4.5))
    xs = np.arange(len(cases))
    for i, (key, label) in enumerate((("sparsegen", "sparsegen, converge on"),
                                      ("sparsegen_converge_off", "sparsegen, converge off"),
                                      ("cusparse_loop", "cuSPARSE loop"))):
        ax.bar(xs + (i - 1) * 0.27, [c["teraedges_per_s"][key] for c in cases], 0.27, label=label)
    ax.set_yscale("log")
    ax.set_xticks(xs, [c["id"].split("/", 1)[1].replace("/", "\n") for c in cases], fontsize=8)
    ax.set_ylabel("TeraEdges/s (log)")
    ax.set_title(f"Sparse DNN inference on {doc.get('gpu')} by size and depth")
    ax.legend()
    fig.tight_layout()
    paths["png"] = out / "graphchallenge.png"
    fig.savefig(paths["png"], dpi=110)
    plt.close(fig)
    return paths
