"""The table of picks the selection makes on the default device (the H100 80GB HBM3 and its shipped
rates), for a fixed set of synthetic requests: tests/fixtures/h100_picks.jsonl.gz holds the table as the
selection computed it before the cost models read their rates from a file, and
tests/test_select_device.py checks the selection still computes exactly that table.

    python -m tests.h100_picks | gzip -n > tests/fixtures/h100_picks.jsonl.gz

Each row: the request, the chosen spec's name, the rules that accepted (in table order), the
candidates' spec names, and for fp16/bf16 spmm the skinny cost model's predicted seconds per
candidate. Only `select_request`, `Request`, `analyze` and the test helpers are used, so the same
module computes the table on any revision.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import scipy.sparse as sp

from sparsegen.analyze import analyze
from sparsegen.families.base import Request
from sparsegen.select import select_request

from .helpers import random_csr
from .tiled_helpers import pinned_library, uniform_stats

OPT_SHAPES = ((7168, 28672), (28672, 7168), (21504, 7168), (7168, 7168), (9216, 36864), (36864, 9216),
              (27648, 9216), (9216, 9216), (12288, 49152), (49152, 12288), (36864, 12288), (12288, 12288))
SPARSITIES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
SKINNY_NS = (8, 16, 32, 64, 128, 256, 512)
CSR_NS = (8, 32, 128, 256, 1024)


def _clustered(seed: int = 0):
    rng = np.random.default_rng(seed)
    mask = sp.csr_matrix(rng.random((48, 96)) < 0.25, dtype=np.float32)
    a = sp.kron(mask, sp.csr_matrix(np.ones((128, 64), np.float32)), format="csr")
    a.data = rng.standard_normal(a.nnz).astype(np.float32)
    return a


def _stats_cases():
    """(label, stats) of every matrix the table asks about."""
    out = [(f"uniform {m}x{k} s{s}", uniform_stats(m, k, round(1 - s, 4)))
           for m, k in OPT_SHAPES for s in SPARSITIES]
    out += [(f"uniform {m}x{k} s{s}", uniform_stats(m, k, round(1 - s, 4)))
            for m, k in ((512, 2048), (2048, 2048), (4096, 4096), (8192, 8192), (1024, 4096))
            for s in (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)]
    out += [(f"random {m}x{k} d{d} seed{seed}", analyze(random_csr(m, k, d, seed=seed)))
            for m, k, d, seed in ((300, 500, 0.3, 1), (2000, 1000, 0.01, 2), (512, 2048, 0.2, 3),
                                  (2048, 512, 0.1, 4), (1024, 1024, 0.5, 5), (4096, 4096, 0.05, 6),
                                  (1000, 3000, 0.02, 7), (64, 64, 0.5, 8), (4096, 1024, 0.3, 9))]
    out += [("skewed 2000x2000", analyze(random_csr(2000, 2000, 0.02, seed=10, empty_rows=0.6))),
            ("clustered 6144x6144", analyze(_clustered()))]
    return out


def _requests(label: str, stats):
    m, k = stats.shape
    big = m * k > 16_000_000
    for dtype in ("float16", "bfloat16"):
        for n in SKINNY_NS:
            if dtype == "bfloat16" and n not in (16, 64):
                continue
            yield Request("spmm", n=n, dtype=dtype)
        yield Request("spmm", n=64, dtype=dtype, bias=True, relu=True)
    yield Request("spmm", n=32, dtype="float16", options=(("out", "float32"),))
    if big:
        return
    for n in CSR_NS:
        yield Request("spmm", n=n, dtype="float32")
    yield Request("spmm", n=128, dtype="float32", bias=True, relu=True)
    for kk in (32, 128):
        yield Request("sddmm", k=kk, dtype="float32")
    yield Request("sddmm", k=64, dtype="float16")


def _row(label: str, stats, request: Request, library) -> dict:
    with pinned_library(library):
        try:
            sel = select_request(stats, request)
        except Exception as exc:  # noqa: BLE001 - the table records refusals too
            return {"case": label, "request": _request_text(request), "library": library,
                    "error": type(exc).__name__}
        predicted = _predicted(stats, request)
    return {"case": label, "request": _request_text(request), "library": library, "spec": sel.spec.name,
            "accepted": [r for r, ok, _ in sel.tried if ok],
            "candidates": [s.name for _, s, _ in sel.candidates], "predicted": predicted}


def _predicted(stats, request: Request) -> dict:
    if request.op != "spmm" or request.dtype not in ("float16", "bfloat16"):
        return {}
    try:
        from sparsegen.select import skinny_cost
    except ImportError:  # the revision the table was first computed on
        from sparsegen.families import skinny_cost
    return {p.family: p.seconds for p in skinny_cost.compare(stats, request).predictions}


def _request_text(request: Request) -> str:
    return (f"{request.op} n={request.n} k={request.k} {request.dtype} bias={request.bias} relu={request.relu} "
            f"options={dict(request.options)}")


def _compiled_cases():
    """(label, matrix, compile keywords): whole compiles on the emulator, so the specs include what
    `finalize` fixes from the encoded plan (ring depth, residency, stream-K grid)."""
    from .conftest import REPO

    dlmc = str(REPO / "examples" / "data" / "dlmc-transformer-mp0.9-encoder0-ffn1.smtx.gz")
    small = random_csr(512, 2048, 0.2, seed=3)
    tall = random_csr(4096, 1024, 0.3, seed=9)
    return [("dlmc n32 f16", dlmc, dict(n=32, dtype="float16")),
            ("dlmc n128 f32", dlmc, dict(n=128, dtype="float32")),
            ("dlmc sddmm k128", dlmc, dict(op="sddmm", k=128, dtype="float32")),
            ("random 512x2048 n16 f16", small, dict(n=16, dtype="float16")),
            ("random 512x2048 n64 f16 csl", small, dict(n=64, dtype="float16", options={"family": "tiled_csl_spmm"})),
            ("random 512x2048 n32 f16 bitmap", small, dict(n=32, dtype="float16",
                                                            options={"family": "tiled_bitmap_spmm"})),
            ("random 4096x1024 n256 f32", tall, dict(n=256, dtype="float32")),
            ("random 4096x1024 n8 f16 stream", tall, dict(n=8, dtype="float16",
                                                           options={"family": "tiled_csl_spmm", "reduction": "stream"}))]


def compiled_table() -> list:
    import sparsegen

    rows = []
    for label, matrix, kw in _compiled_cases():
        with pinned_library("torch"):
            kernel = sparsegen.compile(matrix, backend="emulate", **kw)
        rows.append({"case": label, "compiled": kernel.spec.name})
    return rows


def pick_table() -> list:
    rows = []
    for label, stats in _stats_cases():
        for request in _requests(label, stats):
            for library in ("torch", None):
                if library is None and (request.op != "spmm" or request.n not in (16, 64)):
                    continue
                rows.append(_row(label, stats, request, library))
    return rows


if __name__ == "__main__":
    for row in pick_table() + compiled_table():
        sys.stdout.write(json.dumps(row, sort_keys=True) + "\n")
