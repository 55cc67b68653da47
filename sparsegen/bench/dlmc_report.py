"""The `dlmc` suite's report: geomeans per op, dtype and n/k (all, DLMC only, random only), the
selected kernel against the fastest family where `--families` timed them, every case, and a plot.

Geomeans run over the cases that passed (status "ok") and have both times; the tables still count
every case, and failed and unsupported cases are listed in full.
"""
from __future__ import annotations

from pathlib import Path

from sparsegen.bench import report
from sparsegen.bench.report import (DTYPE_ORDER, OP_ORDER, _cell, _f, _x, geomean, header_lines,
                                    plot_line, pyplot, save_figure)

NAME = "dlmc"
SUBSETS = (("all", "All cases"), ("dlmc", "DLMC only"), ("random", "Random only"))
# The selected kernel counts as the fastest family's equal when within this fraction of its time.
WITHIN = 0.05


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




# --------------------------------------------------------------------------- Markdown

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
    L += plot_line(png_name, png_note)
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

    L += family_section(cases)
    L += _case_table(cases)
    return "\n".join(L)


def _case_table(cases) -> list[str]:
    extra = sorted({k for c in cases for k in (c.get("ms") or {})
                    if k not in ("sparsegen", "cusparse", "cublas")})
    fams = any(c.get("fastest_family") for c in cases)
    L = ["## Per-case results", ""]
    head = ["id", "op", "dtype", "n/k", "shape", "sparsity", "spec", "sparsegen ms",
            "cuSPARSE ms", "cuBLAS ms"] + [f"{k} ms" for k in extra] + \
           ["vs cuSPARSE", "vs cuBLAS"] + (["fastest family", "selected ÷ fastest"] if fams else []) + \
           ["error", "pass", "note"]
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
        cells += [_x(sp.get("vs_cusparse")), _x(sp.get("vs_cublas"))]
        if fams:
            cells += [c.get("fastest_family") or "–", _f(c.get("selected_vs_fastest"), "{:.3f}")]
        cells += [_f(c.get("error"), "{:.2e}"), verdict, (c.get("note") or "")[:120]]
        L.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return L + [""]


# --------------------------------------------------------------------------- PNG

def write_png(doc: dict, path):
    """Plot speedups against sparsity; returns (path, None), or (None, why) when skipped."""
    plt, why = pyplot()
    if plt is None:
        return None, why
    from matplotlib import ticker

    cases = [c for c in doc["cases"] if c.get("status") == "ok"]
    if not cases:
        return None, "no passing case to plot"
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
    return save_figure(fig, path, dpi=120), None


# --------------------------------------------------------------------------- against the fastest family

def fastest_family(rec: dict, tolerance: float) -> tuple:
    """(family, ms) of the fastest kernel timed for the case: each forced family whose answer passed
    (`family_error` within `tolerance`) and the selected kernel under its own family; (None, None)
    when no family was timed."""
    times = rec.get("family_ms") or {}
    errors = rec.get("family_error") or {}
    own, own_ms = rec.get("family"), (rec.get("ms") or {}).get("sparsegen")
    ok = {f: ms for f, ms in times.items()
          if ms and (f == own or (errors.get(f) is not None and errors[f] <= tolerance))}
    if own and own_ms:
        ok[own] = min(own_ms, ok.get(own, own_ms))
    if not times or not ok:
        return None, None
    best = min(ok, key=ok.get)
    return best, ok[best]


def family_summary(cases) -> list[dict]:
    """Per (op, dtype), over the passing cases whose families were timed: how many, how many ran the
    selected kernel within WITHIN of the fastest family, the geomean and worst selected ÷ fastest,
    which families were fastest; and over every passing case with a cuSPARSE time, how many ran
    slower than cuSPARSE."""
    groups: dict = {}
    for c in cases:
        if c.get("status") == "ok":
            groups.setdefault((c["op"], c["dtype"]), []).append(c)
    rows = []
    for (op, dtype) in sorted(groups, key=lambda k: (OP_ORDER.get(k[0], 9), DTYPE_ORDER.get(k[1], 9))):
        g = groups[(op, dtype)]
        timed = [c for c in g if c.get("selected_vs_fastest") is not None]
        vs = [(c.get("speedup") or {}).get("vs_cusparse") for c in g]
        vs = [v for v in vs if v is not None]
        if not timed and not vs:
            continue
        worst = max(timed, key=lambda c: c["selected_vs_fastest"], default=None)
        fastest: dict = {}
        for c in timed:
            fastest[c["fastest_family"]] = fastest.get(c["fastest_family"], 0) + 1
        rows.append({
            "op": op, "dtype": dtype, "cases": len(timed),
            "within": sum(c["selected_vs_fastest"] <= 1.0 + WITHIN + 1e-12 for c in timed),
            "geomean_vs_fastest": geomean(c["selected_vs_fastest"] for c in timed),
            "worst": worst["selected_vs_fastest"] if worst else None,
            "worst_case": f"{worst['id']} {'n' if op == 'spmm' else 'k'}={width_of(worst)}" if worst else None,
            "fastest": dict(sorted(fastest.items(), key=lambda kv: (-kv[1], kv[0]))),
            "with_cusparse": len(vs), "slower_than_cusparse": sum(v < 1.0 for v in vs),
        })
    return rows


def _share(part, whole) -> str:
    return "–" if not whole else f"{part}/{whole} ({100.0 * part / whole:.0f} %)"


def family_section(cases) -> list[str]:
    """The Markdown section on the selected kernel against the fastest family (none when no case
    timed its families)."""
    rows = [r for r in family_summary(cases) if r["cases"]]
    if not rows:
        return []
    L = ["## Selected kernel against the fastest family", "",
         "Each family that accepts the request forced (`options={\"family\": ...}`) and timed like the "
         "selected kernel; the fastest is the fastest whose answer passed. Within "
         f"{WITHIN:.0%}: selected time ≤ {1 + WITHIN:g} × the fastest family's.", "",
         f"| op | dtype | cases | within {WITHIN:.0%} of the fastest | geomean selected ÷ fastest | worst | "
         "fastest family (cases) | slower than cuSPARSE |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fastest = ", ".join(f"`{f}` {n}" for f, n in r["fastest"].items())
        L.append(f"| {r['op']} | {r['dtype']} | {r['cases']} | {_share(r['within'], r['cases'])} | "
                 f"{_f(r['geomean_vs_fastest'], '{:.3f}')} | {_f(r['worst'], '{:.3f}')} ({r['worst_case']}) | "
                 f"{fastest} | {_share(r['slower_than_cusparse'], r['with_cusparse'])} |")
    return L + [""]


# --------------------------------------------------------------------------- the suite's files

def write_reports(doc: dict, out_dir) -> dict:
    return report.write_reports(doc, out_dir, markdown=markdown, png=write_png)


def write_json(doc: dict, out_dir) -> Path:
    return report.write_json(doc, Path(out_dir) / f"{NAME}.json")


exit_status = report.exit_status


def summary_lines(doc: dict) -> list[str]:
    lines = [f"geomean {r['op']} {r['dtype']} {r['width']}: {r['passed']}/{r['cases']} passed, vs cuSPARSE "
             f"{_x(r['vs_cusparse'])}, vs cuBLAS {_x(r['vs_cublas'])}" for r in summarize(doc["cases"])]
    for r in family_summary(doc["cases"]):
        if r["cases"]:
            lines.append(f"{r['op']} {r['dtype']}: selected within {WITHIN:.0%} of the fastest family in "
                         f"{_share(r['within'], r['cases'])} cases, geomean selected / fastest "
                         f"{_f(r['geomean_vs_fastest'], '{:.3f}')}, worst {_f(r['worst'], '{:.3f}')} ({r['worst_case']})")
        if r["with_cusparse"]:
            lines.append(f"{r['op']} {r['dtype']}: slower than cuSPARSE in {_share(r['slower_than_cusparse'], r['with_cusparse'])} cases")
    return lines
