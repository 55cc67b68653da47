"""Writers of benchmark results: DIR/<suite>.json, DIR/<suite>.md, DIR/<suite>.png.

The JSON keys are the ones ../shared/BENCHMARKS.md fixes (other tools read them); more are added
freely. Geomeans are per (op, dtype, n) over the cases that passed (status "ok") and have both
times; the tables still count every case, and failed and unsupported cases are listed in full.
matplotlib is optional: without it the PNG is skipped and the .md says so.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from ..dtypes import ORDER

REQUIRED_TOP_KEYS = ("suite", "gpu", "driver", "cuda", "revision", "date", "command", "cases")
REQUIRED_CASE_KEYS = ("id", "op", "dtype", "n", "k", "shape", "nnz", "sparsity", "row_cov",
                      "spec", "reason", "ms", "ms_min", "error", "pass", "status",
                      "checked_columns", "speedup")

OP_ORDER = {"spmm": 0, "sddmm": 1}
DTYPE_ORDER = ORDER
SUBSETS = (("all", "All cases"), ("dlmc", "DLMC only"), ("random", "Random only"))


# --------------------------------------------------------------------------- numbers

def geomean(values):
    """Geometric mean of the positive finite values; None when there are none."""
    vals = [float(v) for v in values
            if v is not None and isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def width_of(case):
    return case.get("n") if case.get("op") == "spmm" else case.get("k")


def summarize(cases, subset: str = "all") -> list[dict]:
    """Rows per (op, dtype, n/k) and one 'all' row per (op, dtype).

    cases/passed/unsupported/failed count every case of the group; the geomeans of
    speedup.vs_cusparse and speedup.vs_cublas run over passing cases that have the speedup.
    """
    if subset != "all":
        cases = [c for c in cases if c.get("source") == subset]
    groups: dict = {}
    for c in cases:
        w = width_of(c)
        for key in ((c["op"], c["dtype"], w), (c["op"], c["dtype"], "all")):
            groups.setdefault(key, []).append(c)

    def order(key):
        op, dtype, w = key
        return (OP_ORDER.get(op, 9), op, DTYPE_ORDER.get(dtype, 9), dtype,
                1 if w == "all" else 0, w if isinstance(w, int) else 0)

    rows = []
    for key in sorted(groups, key=order):
        op, dtype, w = key
        if w == "all" and len({width_of(c) for c in groups[key]}) < 2:
            continue  # a single width: its row already says it
        g = groups[key]
        ok = [c for c in g if c.get("status") == "ok"]
        rows.append({
            "op": op, "dtype": dtype, "width": w, "cases": len(g), "passed": len(ok),
            "unsupported": sum(c.get("status") == "unsupported" for c in g),
            "failed": sum(c.get("status") == "failed" for c in g),
            "vs_cusparse": geomean((c.get("speedup") or {}).get("vs_cusparse") for c in ok),
            "vs_cublas": geomean((c.get("speedup") or {}).get("vs_cublas") for c in ok),
            "wins_vs_cusparse": sum(((c.get("speedup") or {}).get("vs_cusparse") or 0) > 1
                                    for c in ok),
        })
    return rows


# --------------------------------------------------------------------------- JSON

def _clean(x):
    """JSON-safe copy: non-finite floats become null, numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except Exception:
            return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def check_document(doc: dict) -> None:
    missing = [k for k in REQUIRED_TOP_KEYS if k not in doc]
    if missing:
        raise ValueError(f"benchmark document lacks {missing}")
    for c in doc["cases"]:
        lack = [k for k in REQUIRED_CASE_KEYS if k not in c]
        if lack:
            raise ValueError(f"case {c.get('id')!r} lacks {lack}")


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(doc: dict, path) -> Path:
    check_document(doc)
    path = Path(path)
    _atomic_write(path, json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n")
    return path


# --------------------------------------------------------------------------- Markdown

def _f(v, fmt="{:.4f}", none="–"):
    return none if v is None else fmt.format(v)


def _x(v):
    return _f(v, "{:.2f}×")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _width_label(w):
    return "all" if w == "all" else str(w)


def markdown(doc: dict, *, png_name: str | None = None, png_note: str | None = None) -> str:
    cases = doc["cases"]
    L = header_lines(doc)
    L += ["Times are medians of single launches timed with CUDA events (GPU time only; "
          "see `sparsegen/bench/timing.py`). Speedup = baseline time ÷ sparsegen time. "
          "cuSPARSE = `torch.mm` of a `torch.sparse_csr_tensor` with int32 indices "
          "(SDDMM: the faster passing one of `torch.sparse.sampled_addmm` and CuPy's); "
          "cuBLAS = dense `torch.matmul`, TF32 off for float32. "
          "Geomeans run over the cases that passed the correctness check; "
          "`cases` counts every case, failed and unsupported included.", ""]
    if png_name:
        L += [f"Plot: [`{png_name}`]({png_name})", ""]
    elif png_note:
        L += [f"Plot: skipped ({png_note}).", ""]

    L += ["## Geometric-mean speedups", ""]
    for subset, title in SUBSETS:
        rows = summarize(cases, subset)
        if subset != "all" and not rows:
            continue
        L += [f"### {title}", "",
              "| op | dtype | n/k | cases | passed | unsupported | failed | "
              "vs cuSPARSE | vs cuBLAS | faster than cuSPARSE |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            L.append(f"| {r['op']} | {r['dtype']} | {_width_label(r['width'])} | {r['cases']} | "
                     f"{r['passed']} | {r['unsupported']} | {r['failed']} | "
                     f"{_x(r['vs_cusparse'])} | {_x(r['vs_cublas'])} | "
                     f"{r['wins_vs_cusparse']}/{r['passed']} |")
        if not rows:
            L.append("| – | – | – | 0 | 0 | 0 | 0 | – | – | – |")
        L.append("")

    extra = sorted({k for c in cases for k in (c.get("ms") or {})
                    if k not in ("sparsegen", "cusparse", "cublas")})
    L += ["## Per-case results", ""]
    head = ["id", "op", "dtype", "n/k", "shape", "sparsity", "spec", "sparsegen ms",
            "cuSPARSE ms", "cuBLAS ms"] + [f"{k} ms" for k in extra] + \
           ["vs cuSPARSE", "vs cuBLAS", "error", "pass", "note"]
    L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cases:
        ms = c.get("ms") or {}
        sp = c.get("speedup") or {}
        shape = c.get("shape")
        status = c.get("status")
        verdict = "yes" if status == "ok" else ("unsupported" if status == "unsupported"
                                                else "**FAILED**")
        cells = [c["id"], c["op"], c["dtype"], _width_label(width_of(c)),
                 "×".join(str(s) for s in shape) if shape else "–",
                 _f(c.get("sparsity"), "{:.4f}"), f"`{c['spec']}`" if c.get("spec") else "–",
                 _f(ms.get("sparsegen")), _f(ms.get("cusparse")), _f(ms.get("cublas"))]
        cells += [_f(ms.get(k)) for k in extra]
        cells += [_x(sp.get("vs_cusparse")), _x(sp.get("vs_cublas")),
                  _f(c.get("error"), "{:.2e}"), verdict, (c.get("note") or "")[:120]]
        L.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    L.append("")
    return "\n".join(L)


def write_markdown(doc: dict, path, **kw) -> Path:
    path = Path(path)
    _atomic_write(path, markdown(doc, **kw))
    return path


# --------------------------------------------------------------------------- PNG

def write_png(doc: dict, path):
    """Plot speedups against sparsity; returns (path, None), or (None, why) when skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        return None, "matplotlib is not installed; `pip install -e '.[plot]'` to get the plot"
    cases = [c for c in doc["cases"] if c.get("status") == "ok"]
    if not cases:
        return None, "no passing case to plot"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({(c["op"], c["dtype"]) for c in cases},
                  key=lambda k: (OP_ORDER.get(k[0], 9), DTYPE_ORDER.get(k[1], 9)))
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0", "C1", "C2", "C3"])
    colour = {k: colours[i % len(colours)] for i, k in enumerate(keys)}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    plotted1 = False
    for key in keys:
        g = [c for c in cases if (c["op"], c["dtype"]) == key]
        pts = [(c["sparsity"], c["speedup"]["vs_cublas"]) for c in g
               if (c.get("speedup") or {}).get("vs_cublas")]
        if pts:
            plotted1 = True
            ax1.scatter(*zip(*pts), s=14, color=colour[key], label=f"sparsegen {key[0]} {key[1]}")
            base = [(c["sparsity"], c["ms"]["cublas"] / c["ms"]["cusparse"]) for c in g
                    if (c.get("ms") or {}).get("cublas") and (c.get("ms") or {}).get("cusparse")]
            if base:
                ax1.scatter(*zip(*base), s=14, facecolors="none", edgecolors=colour[key],
                            label=f"cuSPARSE {key[0]} {key[1]}")
        pts2 = [(c["sparsity"], c["speedup"]["vs_cusparse"]) for c in g
                if (c.get("speedup") or {}).get("vs_cusparse")]
        if pts2:
            ax2.scatter(*zip(*pts2), s=14, color=colour[key], label=f"{key[0]} {key[1]}")
    for ax, title, ylabel in (
            (ax1, "speedup over dense cuBLAS (hollow: cuSPARSE)", "cuBLAS time ÷ time"),
            (ax2, "sparsegen speedup over cuSPARSE", "cuSPARSE time ÷ sparsegen time")):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("sparsity")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, loc="best")
    if not plotted1:
        ax1.text(0.5, 0.5, "no case with a cuBLAS baseline", ha="center",
                 transform=ax1.transAxes)
    fig.suptitle(f"sparsegen {doc['suite']} on {doc.get('gpu')} ({doc.get('date')})")
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path, None


# --------------------------------------------------------------------------- all three

def write_all(doc: dict, out_dir) -> dict:
    """Write <suite>.json, <suite>.png (when matplotlib is there) and <suite>.md into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suite = doc["suite"]
    paths = {"json": write_json(doc, out / f"{suite}.json")}
    png, why = write_png(doc, out / f"{suite}.png")
    if png is None:
        stale = out / f"{suite}.png"
        if stale.exists() and why and "matplotlib" in why:
            why += f"; {stale.name} here is from an earlier run"
    paths["png"] = png
    paths["md"] = write_markdown(doc, out / f"{suite}.md",
                                 png_name=png.name if png else None, png_note=why)
    paths["png_note"] = why
    return paths


# --------------------------------------------------------------------------- shared by suites

def header_lines(doc: dict) -> list[str]:
    """The head every suite's .md starts with: title, command, GPU table, runs, truncation."""
    L = [f"# sparsegen benchmark: `{doc['suite']}`", "", f"Command: `{doc.get('command')}`", ""]
    rev = doc.get("revision")
    rev = f"`{rev[:12]}`" if rev else "none (no commit)"
    if (doc.get("environment") or {}).get("revision_dirty"):
        rev += " + local changes"
    L += ["| GPU | driver | CUDA | revision | date |", "|---|---|---|---|---|",
          f"| {doc.get('gpu')} | {doc.get('driver') or '–'} | {doc.get('cuda') or '–'} | "
          f"{rev} | {doc.get('date')} |", ""]
    if doc.get("runs"):
        L += [f"Assembled from {len(doc['runs'])} runs (`--resume`): "
              + "; ".join(f"`{r}`" for r in doc["runs"]), ""]
    if doc.get("truncated"):
        why = doc.get("aborted") or ("interrupted" if doc.get("interrupted")
                                     else "stopped at the --max-minutes deadline; "
                                          "`--resume` runs the rest")
        L += [f"**Truncated run** ({why}): {len(doc['cases'])} of {doc.get('cases_planned', '?')} "
              "planned cases ran.", ""]
    return L
