"""Measured selection: time candidates on the GPU, keep the fastest.

`compile(..., tune=True)` times every family that accepts the request (forced through
`options={"family": name}`), in each of the variants it offers for tuning (`tune_variants`:
tiled_bitmap_spmm's two encodings, sputnik_spmm's row splits). By default (`tune=None`) only the
selection's contenders are timed: the candidates the cost model cannot tell apart within its
measured error (`Selection.contenders`, docs/decisions/004-measured-contenders.md);
`SPARSEGEN_TUNE=off` keeps the model's choice instead. A variant that compiles to a spec already
timed is not timed again; the winner's family and options are cached under the matrix structure,
the request and which candidates were timed, so a later compile goes straight to it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import warnings
from dataclasses import dataclass

import numpy as np

from ._version import __version__
from .analyze import structure_hash
from .cache import Cache, key
from .errors import UnsupportedError
from .fingerprint import generator_fingerprint

log = logging.getLogger("sparsegen")
RUNS = 20
BATCHES = 5  # without PyTorch, time_kernel's median is over this many batches of RUNS // BATCHES launches
SPIN_TIMED_MS = 2.0  # with PyTorch, time_kernel times at least RUNS launches and this much GPU time
ENV_TUNE = "SPARSEGEN_TUNE"
OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class Trial:
    """One candidate's measurement: family, spec name, mean milliseconds per launch, and the variant's
    options beyond the family ("granule=2"; empty for a family's only variant)."""

    family: str
    spec: str
    ms: float
    options: str = ""


def tune_key(csr, request, variants=None, structure: str | None = None) -> str:
    """The cache key of a measured choice: the structure (`structure`, when the caller has hashed it
    already), the request but for its family option, and which candidates were timed."""
    fields = sorted((k, v) for k, v in vars(request).items() if k != "options")
    options = sorted((k, v) for k, v in request.options if k != "family")
    scope = "every family" if variants is None else repr(sorted(variants))
    return key("tune", __version__, generator_fingerprint(), structure or structure_hash(csr), repr(fields), repr(options), scope)


def measures_contenders(tune, backend: str, selection) -> bool:
    """Whether compile() times the selection's contenders: by default (tune=None) on the GPU, where
    the model left more than one, unless SPARSEGEN_TUNE turns it off."""
    return (tune is None and backend == "gpu" and len(selection.contenders) > 1
            and os.environ.get(ENV_TUNE, "").strip().lower() not in OFF)


def tuned(csr, request, backend: str, compile_with, variants=None, model=None, structure: str | None = None):
    """The fastest candidate's kernel; `compile_with(options)` compiles one candidate. The candidates
    are every accepting family (`variants` None) or the given forced options (the selection's
    contenders; `model` is that selection, whose reason the winner's reason quotes)."""
    base = {k: v for k, v in request.options if k != "family"}
    if backend != "gpu":
        warnings.warn("tune=True measures on the GPU; with the emulator the rule table's choice is used",
                      RuntimeWarning, stacklevel=3)
        return compile_with(dict(request.options) or None)
    cache = Cache()
    k = tune_key(csr, request, variants, structure)
    hit = cache.get("tune", k)
    if hit is not None:
        record = json.loads(bytes(hit))
        kernel = compile_with({**base, "family": record["family"], **record.get("options", {})})
        return _measured(kernel, tuple(Trial(**t) for t in record["trials"]), model)
    built = {}  # spec name -> (kernel, its variant's options)
    trials = []
    listed = candidates(request) if variants is None else [_split(v) for v in variants]
    for family, variant in listed:
        try:
            kern = compile_with({**base, "family": family, **variant})
        except UnsupportedError:
            continue
        if kern.spec.name in built:  # a variant that is the rule's own choice: timed once
            continue
        built[kern.spec.name] = (kern, variant)
        trials.append(Trial(family, kern.spec.name, time_kernel(kern), variant_label(variant)))
    if not trials:
        raise UnsupportedError(f"tune=True: no kernel family accepts op={request.op} dtype={request.dtype}")
    best = min(trials, key=lambda t: t.ms)
    log.info("tune: %s", ", ".join(f"{t.family}{' ' + t.options if t.options else ''} {t.ms:.4f} ms" for t in trials))
    kernel, variant = built[best.spec]
    cache.put("tune", k, json.dumps({"family": best.family, "options": variant,
                                     "trials": [vars(t) for t in trials]}).encode())
    return _measured(kernel, tuple(trials), model)


def _split(variant) -> tuple[str, dict]:
    """(family, other options) of a contender's forced options."""
    options = dict(variant)
    return options.pop("family"), options


def _measured(kernel, trials: tuple, model):
    """The winner with its trials; after timing contenders, its selection says so and quotes the
    model's reason."""
    kernel.tuning = trials
    if model is not None:
        times = ", ".join(f"{t.family}{' ' + t.options if t.options else ''} {t.ms * 1e3:.1f} us" for t in trials)
        kernel.selection = dataclasses.replace(
            kernel.selection, rule="measured", contenders=model.contenders,
            reason=f"measured fastest of the contenders the model could not tell apart ({times}); "
                   f"the model chose {model.spec.family}: {model.reason}")
    return kernel


def variant_label(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(options.items()))


def candidates(request) -> list[tuple[str, dict]]:
    """(family, variant options) of every candidate: each callable family (or the requested one), in
    each variant its `tune_variants(request)` offers (one, with no options, by default)."""
    out = []
    for fam in _callable_families(request):
        out += [(fam.name, dict(v)) for v in fam.tune_variants(request)]
    return out


def candidate_families(request) -> list[str]:
    return [fam.name for fam in _callable_families(request)]


def _callable_families(request) -> list:
    from .families import ORDER

    only = request.option("family")
    given = {k for k, _ in request.options if k != "family"}
    # Families run by a driver of their own cannot be timed as a single call, a family that says it
    # cannot run here (`unavailable`: the dense fallback without torch or CuPy) is skipped, and so is
    # one that does not take the options given.
    return [fam for fam in ORDER
            if (only is None or fam.name == only) and request.op in fam.ops and not fam.driver
            and given <= set(fam.Options.names()) and not fam.unavailable(request)]


def time_kernel(kernel, runs: int = RUNS) -> float:
    """GPU milliseconds of one launch on random operands of the kernel's shapes. With PyTorch, the
    median of `runs` launches each timed alone behind a GPU spin (`bench.timing.time_cuda`), so a
    library call's host time (the dense fallback's) is not counted as GPU time; without it, the
    median of BATCHES batches' means of back-to-back launches."""
    from . import runtime

    args, out = random_operands(kernel)

    def call():
        kernel(*args, out=out)

    try:
        import torch  # noqa: F401  (the spin and the events)

        from .bench.timing import time_cuda
    except ImportError:
        per_batch = max(1, runs // BATCHES)
        return statistics.median(runtime.time_ms(call, runs=per_batch) for _ in range(BATCHES))
    return time_cuda(call, min_runs=runs, min_ms=SPIN_TIMED_MS, flush_l2=True)["median_ms"]  # as calibration times


def random_operands(kernel) -> tuple[list, object]:
    """Device inputs of standard normal values and an output buffer, of the kernel's shapes and
    dtypes: PyCUDA arrays, or torch tensors where an operand is bfloat16 (NumPy has none)."""
    from . import runtime

    inputs, output = kernel.family.operands(kernel.spec, kernel.plan)
    rng = np.random.default_rng(0)
    names = [op.dtype if isinstance(op.dtype, str) else np.dtype(op.dtype).name for op in (*inputs, output)]
    if "bfloat16" not in names:
        import pycuda.gpuarray as gpuarray

        args = [runtime.to_gpu(rng.standard_normal(op.shape).astype(op.dtype)) for op in inputs]
        return args, gpuarray.empty(output.shape, dtype=output.dtype)
    import torch

    def tensor(shape, name):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).cuda().to(runtime.torch_dtype(name))

    args = [tensor(op.shape, name) for op, name in zip(inputs, names)]
    return args, torch.empty(output.shape, dtype=runtime.torch_dtype(names[-1]), device="cuda")
