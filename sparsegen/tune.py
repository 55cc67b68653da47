"""Measured selection (`compile(..., tune=True)`): time every family that accepts, keep the fastest.

The rule table predicts; tuning measures. Each family that accepts the request (forced through
`options={"family": name}`), in each of the variants it offers for tuning (`tune_variants`:
tiled_bitmap_spmm's two encodings, sputnik_spmm's row splits), is compiled and timed once on the GPU
with random operands (a variant that compiles to a spec already timed is not timed again);
the winner's family and options are cached under the matrix structure and the request, so a later
`tune=True` compile of the same structure goes straight to it.
"""
from __future__ import annotations

import json
import logging
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


@dataclass(frozen=True)
class Trial:
    """One candidate's measurement: family, spec name, mean milliseconds per launch, and the variant's
    options beyond the family ("granule=2"; empty for a family's only variant)."""

    family: str
    spec: str
    ms: float
    options: str = ""


def tune_key(csr, request) -> str:
    fields = sorted((k, v) for k, v in vars(request).items() if k != "options")
    options = sorted((k, v) for k, v in request.options if k != "family")
    return key("tune", __version__, generator_fingerprint(), structure_hash(csr), repr(fields), repr(options))


def tuned(csr, request, backend: str, compile_with):
    """The fastest accepting family's kernel; `compile_with(options)` compiles one candidate."""
    base = {k: v for k, v in request.options if k != "family"}
    if backend != "gpu":
        warnings.warn("tune=True measures on the GPU; with the emulator the rule table's choice is used",
                      RuntimeWarning, stacklevel=3)
        return compile_with(dict(request.options) or None)
    cache = Cache()
    k = tune_key(csr, request)
    hit = cache.get("tune", k)
    if hit is not None:
        record = json.loads(bytes(hit))
        kernel = compile_with({**base, "family": record["family"], **record.get("options", {})})
        kernel.tuning = tuple(Trial(**t) for t in record["trials"])
        return kernel
    built = {}  # spec name -> (kernel, its variant's options)
    trials = []
    for family, variant in candidates(request):
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
    kernel.tuning = tuple(trials)
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
    """Mean GPU milliseconds of one launch on random operands of the kernel's shapes."""
    from . import runtime

    inputs, output = kernel.family.operands(kernel.spec, kernel.plan)
    rng = np.random.default_rng(0)
    args = [runtime.to_gpu(rng.standard_normal(op.shape).astype(op.dtype)) for op in inputs]
    import pycuda.gpuarray as gpuarray

    out = gpuarray.empty(output.shape, dtype=output.dtype)
    return runtime.time_ms(lambda: kernel(*args, out=out), runs=runs)
