"""The `decode` benchmark suite: tokens/s of an OPT decoder with sparsegen's SparseLinear layers
against the same pruned model dense, both under torch.compile and CUDA graphs.

    sparsegen bench decode [--quick] [--models opt-1.3b,opt-6.7b] [--dtypes float16,bfloat16]
                           [--sparsity 0.5,0.7,0.8,0.9] [--batch 1,8,16,32] [--layers L]
                           [--prompt 512] [--new-tokens 128] [--workers J] [--max-minutes M] [--resume]

It runs examples/sparse_decode.py of the checkout (`load_example`): per model shape and dtype the
model is built once (random weights, nothing downloaded); per sparsity its decoder Linears are
pruned into a dense and a sparse model, the sparse layers' kernels for every batch compiled ahead
in `--workers` processes; per batch size the example's `measure` prefills a 512-token prompt
(dense), decodes 128 new tokens with each model (compiled step, one CUDA graph replay per token,
median of 5 timed passes) and checks every step's logits of the sparse model against the dense
model's. A case is "<model>/<dtype>/s<sparsity>/b<batch>"; it fails when a step's relative logits
error passes the dtype's tolerance, or when it raises.

`--quick`: OPT-1.3B's shapes with its first 4 decoder layers, 80 %, batch 1 and 16, fp16: the
case the issue's targets name, small enough to run in a few minutes.

Once per run, `host_us` records the host time per call of one SparseLinear at batch 1 (the model's
first layer that runs a sparse kernel there, not F.linear): eager through forward, through the
dispatcher, and inside a replayed CUDA graph; and the dense nn.Linear of its shape, eager.

The records and reports are plain functions of dicts: the CPU tests drive them with synthetic
timings. Torch and transformers are imported only by the example, when a suite runs.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import time
from pathlib import Path

from sparsegen.bench.records import message
from sparsegen.bench.report import atomic_write, geomean, header_lines, json_safe, plot_line, pyplot, save_figure
from sparsegen.errors import SparsegenError

NAME = "decode"
NEEDS_DATA = False
SUPPORTED_DTYPES = ("float16", "bfloat16")
MODELS = ("opt-1.3b", "opt-6.7b")
SPARSITIES = (0.5, 0.7, 0.8, 0.9)
BATCHES = (1, 8, 16, 32)
PROMPT, NEW_TOKENS, REPEATS = 512, 128, 5
QUICK = {"models": ("opt-1.3b",), "layers": 4, "sparsities": (0.8,), "batches": (1, 16)}
RUN = {"device": "cuda", "backend": "inductor", "graphs": True}  # how the example measures (tests: the CPU)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sparse_decode.py"


# --------------------------------------------------------------------------- the plan

def _list(text, what, convert):
    out = []
    for t in (s.strip() for s in str(text).split(",") if s.strip()):
        try:
            out.append(convert(t))
        except ValueError as exc:
            raise SparsegenError(f"--{what}: {t!r} {exc}") from None
    if not out:
        raise SparsegenError(f"--{what}: empty list")
    return tuple(dict.fromkeys(out))


def _sparsity(t):
    v = float(t.rstrip("%"))
    v = v / 100 if v > 1 else v
    if not 0 < v < 1:
        raise ValueError("is not a sparsity in (0, 1) (or a percentage)")
    return v


def _positive(t):
    v = int(t)
    if v < 1:
        raise ValueError("is not a positive integer")
    return v


def _model(t):
    if t not in MODELS:
        raise ValueError(f"is not one of the suite's models ({', '.join(MODELS)})")
    return t


def parse_sparsities(text):
    return None if text is None else _list(text, "sparsity", _sparsity)


def parse_batches(text):
    return None if text is None else _list(text, "batch", _positive)


def parse_models(text):
    return None if text is None else _list(text, "models", _model)


def parse_count(text, what):
    return None if text is None else _list(text, what, _positive)[0]


def plan(cfg) -> list[dict]:
    """The cases in run order: model, dtype, sparsity, batch (a model is built once per dtype, and
    pruned once per sparsity). Each: id, model, layers, dtype, sparsity, batch, prompt, new_tokens."""
    quick = QUICK if cfg.quick else {}
    models = cfg.models or quick.get("models", MODELS)
    sparsities = cfg.sparsities or quick.get("sparsities", SPARSITIES)
    batches = cfg.batches or quick.get("batches", BATCHES)
    layers = cfg.layers or quick.get("layers")
    prompt, new = cfg.prompt or PROMPT, cfg.new_tokens or NEW_TOKENS
    cases = []
    for model in models:
        for dtype in cfg.dtypes or ("float16",):
            for s in sparsities:
                for b in batches:
                    cases.append({"id": case_id(model, layers, dtype, s, b), "model": model, "layers": layers,
                                  "dtype": dtype, "sparsity": s, "batch": b, "prompt": prompt, "new_tokens": new})
    return cases[: cfg.limit] if cfg.limit else cases


def case_id(model, layers, dtype, sparsity, batch) -> str:
    depth = f"-l{layers}" if layers else ""
    return f"{model}{depth}/{dtype}/s{sparsity:g}/b{batch}"


# --------------------------------------------------------------------------- running

def load_example(path: Path = EXAMPLE):
    """examples/sparse_decode.py of the checkout, imported as a module."""
    if not path.is_file():
        raise SparsegenError(f"sparsegen bench decode runs {path}, which is not here: run it from a checkout")
    spec = importlib.util.spec_from_file_location("sparse_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(cfg, *, env: dict, emit=print, checkpoint=None, previous=None, example=None, clock=time.monotonic) -> dict:
    """Every planned case (the passed ones of `previous` kept); a case that raises is recorded failed."""
    cases = plan(cfg)
    doc = {"suite": NAME, **{k: env.get(k) for k in ("gpu", "driver", "cuda", "revision", "date", "command")},
           "environment": {k: env.get(k) for k in ("compute_capability", "torch", "python", "revision_dirty")},
           "truncated": False, "cases_planned": len(cases), "cases": [], "host_us": (previous or {}).get("host_us")}
    results = {c["id"]: c for c in (previous or {}).get("cases", []) if c.get("status") == "ok"}

    def done(rec):
        results[rec["id"]] = rec
        doc["cases"] = [results[c["id"]] for c in cases if c["id"] in results]
        emit(progress_line(rec))
        if checkpoint:
            checkpoint(doc)

    todo = [c for c in cases if c["id"] not in results]
    groups = {}
    for c in todo:  # one model build per (model, depth, dtype), one pruning per sparsity
        groups.setdefault((c["model"], c["layers"], c["dtype"]), {}).setdefault(c["sparsity"], []).append(c)
    example = example or (load_example() if todo else None)
    deadline = clock() + 60 * cfg.max_minutes if cfg.max_minutes else None
    for (model_name, layers, dtype), by_sparsity in groups.items():
        try:
            started = time.perf_counter()
            base = example.build(model_name, dtype, RUN["device"], layers)
            emit(f"{model_name} {dtype}: built ({base.config.num_hidden_layers} decoder layers) in "
                 f"{time.perf_counter() - started:.1f} s")
        except Exception as exc:  # every case of the model fails, and the suite goes on
            for c in (c for cs in by_sparsity.values() for c in cs):
                done(failed(c, exc))
            continue
        for cs in by_sparsity.values():
            if deadline is not None and clock() > deadline:
                doc["truncated"] = True
                emit(f"stopping before {cs[0]['id']}: --max-minutes reached")
                break
            _run_sparsity(example, base, cs, cfg, doc, emit, done)
        del base
        if doc["truncated"]:
            break
    doc["cases"] = [results[c["id"]] for c in cases if c["id"] in results]
    return doc


def _run_sparsity(example, base, cases, cfg, doc, emit, done) -> None:
    """One sparsity of one model: prune, compile ahead, then every batch size."""
    from sparsegen.bench.prefetch import default_workers

    try:
        started = time.perf_counter()
        dense, sparse, report = example.pruned_pair(
            copy.deepcopy(base), cases[0]["sparsity"], backend="gpu" if RUN["device"] == "cuda" else "emulate",
            workers=default_workers() if cfg.workers is None else cfg.workers, ns=[c["batch"] for c in cases])
        prepared_s = time.perf_counter() - started
        emit(f"{cases[0]['model']} s{cases[0]['sparsity']:g}: pruned {len(report.layers)} Linears and compiled their "
             f"kernels for N = {', '.join(str(c['batch']) for c in cases)} in {prepared_s:.1f} s")
    except Exception as exc:
        for c in cases:
            done(failed(c, exc))
        return
    if doc.get("host_us") is None:
        doc["host_us"] = _host_time(example, report, emit)
    for c in cases:
        try:
            emit(f"{c['id']}: measuring (each model's step compiled, captured and replayed)")
            r = example.measure(dense, sparse, report, batch=c["batch"], prompt=c["prompt"],
                                new_tokens=c["new_tokens"], repeats=REPEATS, **RUN)
            done(record(c, r, report, prepared_s))
        except Exception as exc:
            done(failed(c, exc))


def _host_time(example, report, emit) -> dict:
    try:
        out = example.host_time(report)
    except Exception as exc:
        out = {"note": message(exc)}
    if "eager" in out:
        emit(f"host time per call ({out['layer']}, N = 1, {out.get('spec')}): eager {out['eager']:.1f} us, dispatcher "
             f"{out['dispatcher']:.1f} us, inside a CUDA graph {out['graph_replay']:.3f} us; dense nn.Linear eager "
             f"{out.get('dense_linear', float('nan')):.1f} us")
    else:
        emit(f"host time per call not measured: {out.get('note')}")
    return out


def record(case: dict, r: dict, report, prepared_s: float) -> dict:
    """A case's JSON record from the example's `measure` result."""
    seconds = r["seconds"]
    tokens = case["batch"] * case["new_tokens"]
    rec = {**case, "status": "ok" if r["pass"] else "failed", "pass": bool(r["pass"]),
           "tokens_per_s": {k: tokens / _median(v) for k, v in seconds.items()},
           "tokens_per_s_best": {k: tokens / min(v) for k, v in seconds.items()},
           "ms_per_token": {k: 1e3 * _median(v) / case["new_tokens"] for k, v in seconds.items()},
           "seconds": seconds, "max_error": r["max_error"], "mean_error": r["mean_error"],
           "argmax_agreement": r["argmax_agreement"], "tolerance": r["tolerance"], "bytes": r["bytes"],
           "families": r["specs"], "setup_s": {**r["setup_s"], "prune_and_compile": round(prepared_s, 2)},
           "linears": len(report.layers)}
    rec["speedup"] = rec["tokens_per_s"]["sparse"] / rec["tokens_per_s"]["dense"]
    dense_b, sparse_b = r["bytes"]["dense"], r["bytes"]["sparse"]
    rec["memory_saved"] = 1 - sparse_b / dense_b if dense_b and sparse_b else None
    if not r["pass"]:
        rec["note"] = f"a step's logits differ by {r['max_error']:.3g} > tolerance {r['tolerance']:g}"
    return rec


def failed(case: dict, exc: BaseException) -> dict:
    return {**case, "status": "failed", "pass": False, "note": message(exc)}


def _median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


# --------------------------------------------------------------------------- reports

def progress_line(rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"{rec['id']}: FAILED {rec.get('note', '')}"
    tps = rec["tokens_per_s"]
    saved = f", {rec['memory_saved']:.0%} of the weights' memory saved" if rec.get("memory_saved") is not None else ""
    return (f"{rec['id']}: sparse {tps['sparse']:.1f} tok/s, dense {tps['dense']:.1f} tok/s, "
            f"{rec['speedup']:.2f}x{saved}; max logits error {rec['max_error']:.2e}")


def summary_lines(doc: dict) -> list[str]:
    ok = [c for c in doc["cases"] if c.get("status") == "ok"]
    lines = [f"decode: {len(ok)} of {len(doc['cases'])} cases passed"]
    for key, cs in _groups(ok).items():
        lines.append(f"  {key}: geomean speedup {geomean(c['speedup'] for c in cs):.2f}x over {len(cs)} cases, "
                     f"lowest {min(c['speedup'] for c in cs):.2f}x")
    return lines


def _groups(cases) -> dict:
    """Cases by model (and depth, when cut) and dtype, in run order."""
    out = {}
    for c in cases:
        depth = f" (first {c['layers']} layers)" if c.get("layers") else ""
        out.setdefault(f"{c['model']}{depth} {c['dtype']}", []).append(c)
    return out


def _gb(v) -> str:
    return "–" if v is None else f"{v / 1e9:.2f}"


def markdown(doc: dict, png_name=None, png_note=None) -> str:
    L = header_lines(doc)
    L += ["Decode throughput of an OPT decoder (transformers' OPTForCausalLM from a config, random weights) "
          "whose decoder-layer Linears are magnitude-pruned: sparsegen's SparseLinear (`torch.ops.sparsegen.linear`) "
          "against the same pruned weights in dense `nn.Linear`s. Both decode with one step compiled "
          "(torch.compile, inductor, fullgraph) and captured in a CUDA graph, replayed per token; the prompt's "
          "KV cache is made once (dense) and both decode the same new tokens. tokens/s = batch x new tokens / "
          "median decode time (CUDA events, 5 passes). Memory: the decoder Linears' weights and biases dense, "
          "against what the sparse layers hold on the GPU (plans and workspaces). Error: the largest relative "
          "difference of one step's logits, sparse against dense.", ""]
    L += plot_line(png_name, png_note)
    host = doc.get("host_us")
    if host and "eager" in host:
        L += [f"Host time per call of one SparseLinear ({host['layer']}, N = 1, `{host.get('spec')}`): "
              f"eager {host['eager']:.1f} µs, through the dispatcher (`torch.ops.sparsegen.linear`) "
              f"{host['dispatcher']:.1f} µs, inside a replayed CUDA graph {host['graph_replay']:.3f} µs"
              + (f"; the dense `nn.Linear` of that shape, eager, {host['dense_linear']:.1f} µs" if "dense_linear" in host
                 else "") + ".", ""]
    ok = [c for c in doc["cases"] if c.get("status") == "ok"]
    for key, cs in _groups(ok).items():
        batches = sorted({c["batch"] for c in cs})
        L += [f"## {key}: speedup (sparse over dense tokens/s)", "",
              "| sparsity | " + " | ".join(f"batch {b}" for b in batches) + " |",
              "|---|" + "---|" * len(batches)]
        for s in sorted({c["sparsity"] for c in cs}):
            row = {c["batch"]: c["speedup"] for c in cs if c["sparsity"] == s}
            L.append(f"| {s:.0%} | " + " | ".join(f"{row[b]:.2f}×" if b in row else "–" for b in batches) + " |")
        L += ["", "| sparsity | batch | sparse tok/s | dense tok/s | speedup | weights dense GB | sparse GB | saved "
              "| max error | argmax agree | kernels |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in cs:
            saved = "–" if c.get("memory_saved") is None else f"{c['memory_saved']:.0%}"
            L.append(f"| {c['sparsity']:.0%} | {c['batch']} | {c['tokens_per_s']['sparse']:.1f} | "
                     f"{c['tokens_per_s']['dense']:.1f} | {c['speedup']:.2f}× | {_gb(c['bytes']['dense'])} | "
                     f"{_gb(c['bytes']['sparse'])} | {saved} | {c['max_error']:.2e} | {c['argmax_agreement']:.3f} | "
                     f"{', '.join(c.get('families', []))} |")
        L.append("")
    bad = [c for c in doc["cases"] if c.get("status") != "ok"]
    if bad:
        L += ["## Failed", ""] + [f"- {c['id']}: {c.get('note', '')}" for c in bad] + [""]
    return "\n".join(L)


def write_json(doc: dict, out_dir) -> Path:
    path = Path(out_dir) / f"{NAME}.json"
    atomic_write(path, json.dumps(json_safe(doc), indent=1, allow_nan=False) + "\n")  # NaN (a broken step) as null
    return path


def write_png(doc: dict, path):
    plt, why = pyplot()
    if plt is None:
        return None, why
    groups = _groups([c for c in doc["cases"] if c.get("status") == "ok"])
    if not groups:
        return None, "no passing case to plot"
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    for ax, (key, cs) in zip(axes[0], groups.items()):
        for s in sorted({c["sparsity"] for c in cs}):
            pts = sorted((c["batch"], c["speedup"]) for c in cs if c["sparsity"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{s:.0%}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("decode tokens/s, sparse / dense")
        ax.set_title(key)
        ax.legend(title="sparsity")
    fig.tight_layout()
    return save_figure(fig, path), None


def write_reports(doc: dict, out_dir) -> dict:
    out = Path(out_dir)
    paths = {"json": write_json(doc, out)}
    paths["png"], paths["png_note"] = write_png(doc, out / f"{NAME}.png")
    paths["md"] = out / f"{NAME}.md"
    atomic_write(paths["md"], markdown(doc, png_name=paths["png"].name if paths["png"] else None,
                                       png_note=paths["png_note"]))
    return paths


def exit_status(doc: dict) -> int:
    if doc.get("interrupted"):
        return 130
    return 0 if all(c.get("pass") for c in doc["cases"]) else 1

