"""The report writer every suite uses: DIR/<suite>.json, DIR/<suite>.md, DIR/<suite>.png.

`write_reports(doc, out_dir, markdown=..., png=...)` writes the three files atomically, the suite
giving its Markdown and plot functions; the JSON keys every suite's cases carry are the ones
../shared/BENCHMARKS.md fixes (other tools read them), more are added freely. Shared pieces: the
header every .md starts with, geomeans, number formats, the exit status. matplotlib is optional:
`pyplot()` says why there is no plot, and the .md says so.
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


# --------------------------------------------------------------------------- numbers

def geomean(values):
    """Geometric mean of the positive finite values; None when there are none."""
    vals = [float(v) for v in values
            if v is not None and isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# --------------------------------------------------------------------------- JSON

def json_safe(x):
    """JSON-safe copy: non-finite floats become null, numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
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


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`."""
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
    atomic_write(path, json.dumps(json_safe(doc), indent=1, allow_nan=False) + "\n")
    return path


# --------------------------------------------------------------------------- Markdown

def _f(v, fmt="{:.4f}", none="–"):
    return none if v is None else fmt.format(v)


def _x(v):
    return _f(v, "{:.2f}×")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


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


# --------------------------------------------------------------------------- the three files

def pyplot():
    """(matplotlib.pyplot, None) with the Agg backend, or (None, why) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed; `pip install -e '.[plot]'` to get the plot"
    return plt, None


def save_figure(fig, path, dpi: int = 110) -> Path:
    """Save `fig` to `path` through a temporary file, and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi)
    import matplotlib.pyplot as plt

    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_reports(doc: dict, out_dir, *, markdown, png=None) -> dict:
    """Write <suite>.json, <suite>.png (`png(doc, path) -> (path, None) or (None, why)`) and
    <suite>.md (`markdown(doc, png_name=..., png_note=...)`) into out_dir; their paths, and why
    there is no PNG (`png_note`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suite = doc["suite"]
    paths = {"json": write_json(doc, out / f"{suite}.json")}
    png_path, why = png(doc, out / f"{suite}.png") if png is not None else (None, "no plot for this suite")
    if png_path is None:
        stale = out / f"{suite}.png"
        if stale.exists() and why and "matplotlib" in why:
            why += f"; {stale.name} here is from an earlier run"
    paths["png"], paths["png_note"] = png_path, why
    paths["md"] = out / f"{suite}.md"
    atomic_write(paths["md"], markdown(doc, png_name=png_path.name if png_path else None, png_note=why))
    return paths


def plot_line(png_name, png_note) -> list[str]:
    """The .md line that links the plot, or says why there is none."""
    if png_name:
        return [f"Plot: [`{png_name}`]({png_name})", ""]
    if png_note:
        return [f"Plot: skipped ({png_note}).", ""]
    return []


def exit_status(doc: dict) -> int:
    """130 when interrupted, 1 when a case failed, else 0 (unsupported cases are not failures)."""
    if doc.get("interrupted"):
        return 130
    return 1 if any(c.get("status") == "failed" for c in doc["cases"]) else 0
