"""The `llm` suite's report: the selected kernel over cuBLAS per sparsity and N against the done
criterion, bitmap ÷ Tiled-CSL, the fraction of the copy bandwidth, cuSPARSE, real weights, every
case; and the plot.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from sparsegen.bench import report

NAME = "llm"
CSL, BITMAP, LANES = "tiled_csl_spmm", "tiled_bitmap_spmm", "tiled_lanes_spmm"  # the tile families every case forces
TOLERANCE = 1e-2  # relative Frobenius error of every sparsegen kernel's sampled rows
CHECK_ROWS = 256  # output rows sampled per case

# The issue's done criterion, over the OPT shapes at N in CRITERION_N.
CRITERION_N = (8, 16, 32, 64)
GEOMEAN_TARGETS = {0.7: 1.5, 0.8: 2.0, 0.9: 3.0}
FLOOR_TARGETS = {0.5: 0.95}  # every case, not the geomean
BITMAP_RANGE = (0.5, 0.8)
BITMAP_TARGET = 1.2


# --------------------------------------------------------------------------- tables

def _ok(cases, source="opt"):
    return [c for c in cases if c.get("status") == "ok" and c.get("source") == source]


def nominal(c):
    """The sparsity a case was asked for (its W's measured sparsity differs by sampling)."""
    return c.get("nominal_sparsity", c.get("sparsity"))


def speedup_table(cases, key="vs_cublas", source="opt") -> dict:
    """{dtype: {"rows": [(sparsity, {n: geomean}, criterion geomean, criterion min)], "ns": [...]}}
    over passing cases; criterion columns over N in CRITERION_N."""
    out = {}
    ok = _ok(cases, source)
    for dtype in sorted({c["dtype"] for c in ok}, key=lambda d: report.DTYPE_ORDER.get(d, 9)):
        g = [c for c in ok if c["dtype"] == dtype]
        ns = sorted({c["n"] for c in g})
        rows = []
        for s in sorted({nominal(c) for c in g}):
            at = [c for c in g if nominal(c) == s]
            vals = {n: report.geomean(c["speedup"].get(key) for c in at if c["n"] == n) for n in ns}
            crit = [c["speedup"].get(key) for c in at if c["n"] in CRITERION_N and c["speedup"].get(key)]
            rows.append((s, vals, report.geomean(crit), min(crit) if crit else None))
        out[dtype] = {"ns": ns, "rows": rows}
    return out


def verdict(s, crit_geomean, crit_min) -> tuple[str, str]:
    """(target text, 'yes'/'no'/'–') of the done criterion at sparsity s."""
    if s in GEOMEAN_TARGETS:
        t = GEOMEAN_TARGETS[s]
        return f"geomean ≥ {t:g}×", "–" if crit_geomean is None else ("yes" if crit_geomean >= t else "no")
    if s in FLOOR_TARGETS:
        t = FLOOR_TARGETS[s]
        return f"every case ≥ {t:g}×", "–" if crit_min is None else ("yes" if crit_min >= t else "no")
    return "–", "–"


def bitmap_summary(cases, source="opt") -> dict:
    """{dtype: geomean of bitmap_vs_csl over passing cases at BITMAP_RANGE and N in CRITERION_N}."""
    lo, hi = BITMAP_RANGE
    out = {}
    for c in _ok(cases, source):
        if lo - 1e-9 <= nominal(c) <= hi + 1e-9 and c["n"] in CRITERION_N:
            out.setdefault(c["dtype"], []).append(c["speedup"].get("bitmap_vs_csl"))
    return {d: report.geomean(v) for d, v in out.items()}


SELECTION_FLOOR = 0.97  # the selected kernel vs cuBLAS, every case
FASTEST_SLACK = 0.05  # the selected kernel within this of the fastest timed


def selection_quality(cases, source="opt") -> dict:
    """{dtype: (cases, at or past SELECTION_FLOOR x cuBLAS, the least ratio, within FASTEST_SLACK of
    the fastest of {selected, forced Tiled-CSL, forced bitmap, forced tiled lanes, cuBLAS}, [misses])} over passing cases
    with the selected kernel and cuBLAS timed; a miss is (id, n, family, selected / fastest)."""
    out = {}
    for c in _ok(cases, source):
        ms = c.get("ms") or {}
        mine, dense = ms.get("sparsegen"), ms.get("cublas")
        if not mine or not dense:
            continue
        fastest = min(v for v in (mine, ms.get(CSL), ms.get(BITMAP), ms.get(LANES), dense) if v)
        n, floor, least, near, misses = out.get(c["dtype"], (0, 0, None, 0, []))
        ratio = dense / mine
        near_now = mine <= fastest * (1 + FASTEST_SLACK)
        if not near_now:
            misses = misses + [(c["id"], c["n"], c.get("family"), mine / fastest)]
        out[c["dtype"]] = (n + 1, floor + (ratio >= SELECTION_FLOOR), ratio if least is None else min(least, ratio),
                           near + near_now, misses)
    return out


def _selection_section(cases) -> list[str]:
    out = []
    for dtype, (n, floor, least, near, misses) in selection_quality(cases).items():
        out += [f"{dtype}: selected ≥ {SELECTION_FLOOR:g}× cuBLAS in **{floor} / {n}** cases (least "
                f"{report._x(least)}); within {FASTEST_SLACK:.0%} of the fastest of {{selected, Tiled-CSL, bitmap, "
                f"tiled lanes, cuBLAS}} in **{near} / {n}** ({near / n:.1%}).", ""]
        out += [f"- miss: {i} N={m} {fam}: {r:.3f}× the fastest" for i, m, fam, r in misses]
        out += [""] if misses else []
    return out or ["(no passing case with the selected kernel and cuBLAS timed)", ""]


def bandwidth_table(cases, source="opt") -> list[tuple]:
    """Rows (dtype, sparsity, {name: (median, max) fraction}) over passing cases with N <= 64."""
    names = ("sparsegen", CSL, BITMAP, LANES, "cublas", "cusparse")
    rows = []
    ok = [c for c in _ok(cases, source) if c["n"] in CRITERION_N]
    for dtype in sorted({c["dtype"] for c in ok}, key=lambda d: report.DTYPE_ORDER.get(d, 9)):
        for s in sorted({nominal(c) for c in ok if c["dtype"] == dtype}):
            at = [c for c in ok if c["dtype"] == dtype and nominal(c) == s]
            cell = {}
            for name in names:
                vals = [v for c in at if (v := (c.get("bandwidth_fraction") or {}).get(name)) is not None]
                cell[name] = (statistics.median(vals), max(vals)) if vals else (None, None)
            rows.append((dtype, s, cell))
    return rows


def _pct(v):
    return "–" if v is None else f"{100 * v:.0f} %"


def markdown(doc: dict, *, png_name=None, png_note=None) -> str:
    cases = doc["cases"]
    L = report.header_lines(doc)
    bw = doc.get("copy_bandwidth") or {}
    L += ["W (M×K, pruned) × X (K×N): the 12 OPT layer shapes of BENCHMARKS.md with a random "
          "unstructured pattern (and real model weights, magnitude-pruned, when a model was given). "
          "`sparsegen` = the kernel `sparsegen.compile` selects by default; `tiled_csl_spmm` and "
          "`tiled_bitmap_spmm` = that family forced. cuBLAS = dense `torch.matmul` (tensor cores), "
          "cuSPARSE = `torch.mm` of an int32 CSR tensor. Times are medians of single launches "
          "timed with CUDA events, L2 flushed before each (`sparsegen/bench/timing.py`: a model reads "
          "each W once, from DRAM); speedup = cuBLAS time ÷ time. "
          f"Correctness: {CHECK_ROWS} seeded output rows (all N columns) against float64 scipy, "
          f"relative Frobenius error ≤ {TOLERANCE:g}, for every sparsegen kernel timed. "
          "Geomeans run over the passing cases.", ""]
    if bw:
        L += [f"Device copy bandwidth (read + write, `dst.copy_(src)` of {bw.get('size', 0) >> 20} MiB, "
              f"median of {bw.get('runs')}): **{bw.get('bytes_per_s', 0) / 1e12:.3f} TB/s**. "
              "Bytes moved = the kernel's plan (its sparse encoding) + X + Y; cuBLAS: dense W + X + Y; "
              "cuSPARSE: int32 CSR + X + Y (split-K partial sums and re-reads not counted).", ""]
    for note in doc.get("notes") or []:
        L += [f"Note: {note}", ""]
    if (doc.get("prefetch") or {}).get("note"):
        L += [f"Note: {doc['prefetch']['note']}", ""]
    L += report.plot_line(png_name, png_note)

    n_ok = sum(c.get("status") == "ok" for c in cases)
    L += [f"{len(cases)} cases: {n_ok} passed, "
          f"{sum(c.get('status') == 'failed' for c in cases)} failed, "
          f"{sum(c.get('status') == 'unsupported' for c in cases)} unsupported.", ""]
    L += ["## Geomean speedup over cuBLAS of the selected kernel (OPT shapes)", ""]
    L += _speedup_section(cases, "opt", with_targets=True)
    L += ["## How well selection chose (OPT shapes)", ""]
    L += _selection_section(cases)
    L += ["## Bitmap ÷ Tiled-CSL (both forced; Tiled-CSL time ÷ bitmap time)", ""]
    table = speedup_table(cases, "bitmap_vs_csl")
    for dtype, t in table.items():
        L += _grid(dtype, t, target=False)
    summary = bitmap_summary(cases)
    lo, hi = BITMAP_RANGE
    for dtype, g in summary.items():
        met = "–" if g is None else ("yes" if g >= BITMAP_TARGET else "no")
        L += [f"{dtype}, {lo:.0%}–{hi:.0%} sparse, N ∈ {{{', '.join(map(str, CRITERION_N))}}}: "
              f"geomean **{report._x(g)}** (target ≥ {BITMAP_TARGET:g}×: {met})", ""]
    if not table:
        L += ["(no passing case with both families timed)", ""]
    L += ["## Fraction of the device copy bandwidth (N ≤ 64; median / max over cases)", ""]
    rows = bandwidth_table(cases)
    names = ("sparsegen", CSL, BITMAP, LANES, "cublas", "cusparse")
    L += ["| dtype | sparsity | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for dtype, s, cell in rows:
        L.append(f"| {dtype} | {s:g} | " + " | ".join(
            f"{_pct(cell[n][0])} / {_pct(cell[n][1])}" for n in names) + " |")
    if not rows:
        L.append("| – | – |" + " – |" * len(names))
    L.append("")
    L += _cusparse_section(cases)
    if any(c.get("source") == "model" for c in cases):
        L += ["## Real weights (magnitude-pruned): geomean speedup over cuBLAS", ""]
        L += _speedup_section(cases, "model", with_targets=False)
    L += _case_table(cases)
    return "\n".join(L)


def _speedup_section(cases, source, with_targets) -> list[str]:
    table = speedup_table(cases, "vs_cublas", source)
    out = []
    for dtype, t in table.items():
        out += _grid(dtype, t, target=with_targets)
    if not table:
        out += ["(no passing case)", ""]
    return out


def _cusparse_section(cases) -> list[str]:
    """The selected kernel over cuSPARSE, and cuSPARSE's own standing against cuBLAS, from the cases
    that timed cuSPARSE in this run (none: the section is left out)."""
    table = speedup_table(cases, "vs_cusparse")
    if not any(g is not None for t in table.values() for _, _, g, _ in t["rows"]):
        return []
    out = ["## Geomean speedup over cuSPARSE of the selected kernel (OPT shapes)", ""]
    for dtype, t in table.items():
        out += _grid(dtype, t, target=False)
    ratios = [c["ms"]["cublas"] / c["ms"]["cusparse"] for c in _ok(cases, "opt")
              if c["n"] in CRITERION_N and (c.get("ms") or {}).get("cublas") and (c.get("ms") or {}).get("cusparse")]
    if ratios:
        out += [f"cuSPARSE itself (N ≤ 64): {min(ratios):.3f}–{max(ratios):.3f}× cuBLAS "
                f"(geomean {report._x(report.geomean(ratios))}, {len(ratios)} cases).", ""]
    return out


def _grid(dtype, t, target) -> list[str]:
    ns = t["ns"]
    crit = f"N {CRITERION_N[0]}–{CRITERION_N[-1]}"
    head = ["sparsity"] + [f"N={n}" for n in ns] + [f"{crit} geomean", f"{crit} min"]
    if target:
        head += ["target", "met"]
    L = [f"### {dtype}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s, vals, g, mn in t["rows"]:
        cells = [f"{s:g}"] + [report._x(vals[n]) for n in ns] + [f"**{report._x(g)}**", report._x(mn)]
        if target:
            cells += list(verdict(s, g, mn))
        L.append("| " + " | ".join(cells) + " |")
    return L + [""]


def _case_table(cases) -> list[str]:
    head = ["id", "dtype", "N", "nnz", "spec", "sparsegen ms", "csl ms", "bitmap ms", "lanes ms", "cuBLAS ms",
            "cuSPARSE ms", "vs cuBLAS", "bitmap÷csl", "bw sparsegen", "bw cuBLAS", "error", "pass", "note"]
    L = ["## Per-case results", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cases:
        ms, sp_, fr = c.get("ms") or {}, c.get("speedup") or {}, c.get("bandwidth_fraction") or {}
        status = c.get("status")
        verdict_ = "yes" if status == "ok" else ("unsupported" if status == "unsupported" else "**FAILED**")
        cells = [c["id"], c["dtype"], c.get("n"), c.get("nnz") if c.get("nnz") is not None else "–",
                 f"`{c['spec']}`" if c.get("spec") else "–",
                 report._f(ms.get("sparsegen")), report._f(ms.get(CSL)), report._f(ms.get(BITMAP)),
                 report._f(ms.get(LANES)), report._f(ms.get("cublas")), report._f(ms.get("cusparse")),
                 report._x(sp_.get("vs_cublas")), report._x(sp_.get("bitmap_vs_csl")),
                 _pct(fr.get("sparsegen")), _pct(fr.get("cublas")),
                 report._f(c.get("error"), "{:.2e}"), verdict_, (c.get("note") or "")[:120]]
        L.append("| " + " | ".join(report._cell(x) for x in cells) + " |")
    return L + [""]


# --------------------------------------------------------------------------- plot and files

def write_png(doc: dict, path):
    """Speedup over cuBLAS against sparsity, one line per N (geomean over the OPT shapes), one
    panel per dtype; and the fraction of copy bandwidth. (None, why) when skipped."""
    plt, why = report.pyplot()
    if plt is None:
        return None, why
    from matplotlib import ticker

    table = speedup_table(doc["cases"])
    if not table:
        return None, "no passing case to plot"
    bw = bandwidth_by_n(doc["cases"])
    fig, axes = plt.subplots(len(table), 2, figsize=(13, 4.8 * len(table)), squeeze=False,
                             constrained_layout=True)
    for (dtype, t), (ax, ax2) in zip(table.items(), axes):
        for n in t["ns"]:
            pts = [(s, vals[n]) for s, vals, _, _ in t["rows"] if vals.get(n)]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"N={n}")
        tg = sorted(GEOMEAN_TARGETS.items()) + sorted(FLOOR_TARGETS.items())
        ax.scatter([s for s, _ in tg], [v for _, v in tg], marker="_", s=300, color="black",
                   label="target (N ≤ 64)")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        times = ticker.FuncFormatter(lambda v, _: f"{v:g}×")
        ax.yaxis.set_major_formatter(times)
        ax.yaxis.set_minor_formatter(times)
        ax.set_xlabel("sparsity")
        ax.set_ylabel("cuBLAS time ÷ sparsegen time")
        ax.set_title(f"{dtype}: selected kernel over cuBLAS (geomean over OPT shapes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        for n, pts in sorted(bw.get(dtype, {}).items()):
            ax2.plot(*zip(*pts), marker="o", label=f"N={n}")
        ax2.set_ylim(0, 1.1)
        ax2.set_xlabel("sparsity")
        ax2.set_ylabel("fraction of copy bandwidth (median)")
        ax2.set_title(f"{dtype}: sparsegen bytes moved ÷ time ÷ copy bandwidth")
        ax2.grid(True, alpha=0.3)
        if bw.get(dtype):
            ax2.legend(fontsize=8)
    fig.suptitle(f"sparsegen llm on {doc.get('gpu')} ({doc.get('date')})")
    return report.save_figure(fig, path, dpi=110), None


def bandwidth_by_n(cases) -> dict:
    """{dtype: {n: [(sparsity, median fraction)]}} of the selected kernel, OPT shapes."""
    out: dict = {}
    for c in _ok(cases):
        f = (c.get("bandwidth_fraction") or {}).get("sparsegen")
        if f is not None:
            out.setdefault(c["dtype"], {}).setdefault(c["n"], {}).setdefault(nominal(c), []).append(f)
    return {d: {n: [(s, statistics.median(v)) for s, v in sorted(by.items())] for n, by in g.items()}
            for d, g in out.items()}


def write_json(doc: dict, out_dir) -> Path:
    return report.write_json(doc, Path(out_dir) / f"{NAME}.json")


def write_reports(doc: dict, out_dir) -> dict:
    return report.write_reports(doc, out_dir, markdown=markdown, png=write_png)


exit_status = report.exit_status


def summary_lines(doc: dict) -> list[str]:
    lines = []
    for dtype, t in speedup_table(doc["cases"]).items():
        for s, _, g, mn in t["rows"]:
            target, met = verdict(s, g, mn)
            lines.append(f"geomean {dtype} sparsity {s:g} N {CRITERION_N[0]}-{CRITERION_N[-1]} vs cuBLAS "
                         f"{report._x(g)} (min {report._x(mn)}; target {target}: {met})")
    for dtype, g in bitmap_summary(doc["cases"]).items():
        lines.append(f"bitmap / Tiled-CSL {dtype} at {BITMAP_RANGE[0]:g}-{BITMAP_RANGE[1]:g}: {report._x(g)}")
    for dtype, (n, floor, least, near, _) in selection_quality(doc["cases"]).items():
        lines.append(f"selection {dtype}: >= {SELECTION_FLOOR:g}x cuBLAS {floor}/{n} (least {report._x(least)}); "
                     f"within {FASTEST_SLACK:.0%} of the fastest {near}/{n} ({near / n:.1%})")
    bad = [c for c in doc["cases"] if c.get("status") == "failed"]
    lines.append(f"{len(doc['cases'])} cases, {len(bad)} failed")
    return lines
