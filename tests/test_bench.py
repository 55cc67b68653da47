"""CPU tests of the benchmark harness (sparsegen.bench): no torch, no GPU.

Case generation, the random matrix generator, slugs and paths, geomeans, the JSON / Markdown /
PNG writers, the run loop (with a fake executor) and the timing method (with a simulated GPU).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import bench
from sparsegen.bench import dlmc, dlmc_gpu, dlmc_report, records, report, timing
from sparsegen.errors import SparsegenError

SHARED_INDEX = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dlmc" / "index.tsv"

INDEX_HEADER = ["path", "model", "method", "sparsity", "rows", "cols", "nnz", "actual_sparsity",
                "rowlen_mean", "rowlen_max", "rowlen_cov"]


def write_index(root: Path, count: int) -> Path:
    """A fake DATA/dlmc/index.tsv with `count` rows, deliberately not sorted by path."""
    d = root / "dlmc"
    d.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(INDEX_HEADER)]
    for i in reversed(range(count)):
        model = "rn50" if i % 2 else "transformer"
        path = f"{model}/magnitude_pruning/0.{5 + i % 5}/layer_{i:03d}.smtx.gz"
        lines.append("\t".join([path, model, "magnitude_pruning", f"0.{5 + i % 5}", "64", "32",
                                "100", "0.95", "1.5", "4", "0.3"]))
    (d / "index.tsv").write_text("\n".join(lines) + "\n")
    return root


def cfg(data_dir, **kw) -> bench.BenchConfig:
    return bench.BenchConfig(suite="dlmc", data_dir=Path(data_dir), **kw)


# --------------------------------------------------------------------------- case generation

def test_full_case_counts(tmp_path):
    write_index(tmp_path, 25)
    work = dlmc.plan(cfg(tmp_path))
    matrices = [m for m, _ in work]
    assert len(matrices) == 25 + 12
    assert [m.source for m in matrices] == ["dlmc"] * 25 + ["random"] * 12
    per_matrix = 2 * (4 + 3)          # dtypes x (n in 32,128,256,1024 + k in 32,128,256)
    assert all(len(c) == per_matrix for _, c in work)
    cases = [c for _, cs in work for c in cs]
    assert len(cases) == 37 * per_matrix
    spmm = [c for c in cases if c.op == "spmm"]
    assert sorted({c.n for c in spmm}) == [32, 128, 256, 1024]
    assert all(c.k is None for c in spmm)
    sddmm = [c for c in cases if c.op == "sddmm"]
    assert sorted({c.k for c in sddmm}) == [32, 128, 256]
    assert all(c.n is None for c in sddmm)
    assert {c.dtype for c in cases} == {"float32", "float16"}
    rnd = {m.id for m in matrices if m.source == "random"}
    assert rnd == {f"random/{m}/{s:g}" for m in (2048, 4096, 8192) for s in (0.7, 0.8, 0.9, 0.95)}
    assert "random/4096/0.8" in rnd


def test_quick_case_counts_and_selection(tmp_path):
    write_index(tmp_path, 25)
    work = dlmc.plan(cfg(tmp_path, quick=True))
    dl = [m for m, _ in work if m.source == "dlmc"]
    # every 10th matrix sorted by path: indices 0, 10, 20 of the sorted list
    assert [m.id for m in dl] == [f"rn50/magnitude_pruning/0.{5 + i % 5}/layer_{i:03d}"
                                  if i % 2 else
                                  f"transformer/magnitude_pruning/0.{5 + i % 5}/layer_{i:03d}"
                                  for i in sorted(range(25), key=lambda i: (
                                      ("rn50" if i % 2 else "transformer"),
                                      f"0.{5 + i % 5}", i))][::10]
    assert [m.id for m, _ in work if m.source == "random"] == ["random/4096/0.8",
                                                               "random/4096/0.9"]
    cases = [c for _, cs in work for c in cs]
    assert len(cases) == (3 + 2) * 2 * 2  # matrices x dtypes x (spmm n=128, sddmm k=128)
    assert {c.width for c in cases} == {128}


def test_dlmc_ids_paths_and_fields(tmp_path):
    write_index(tmp_path, 3)
    ms = dlmc.dlmc_matrices(tmp_path)
    assert ms[0].id == "rn50/magnitude_pruning/0.6/layer_001"
    assert ms[0].path == str(tmp_path / "dlmc" / "rn50/magnitude_pruning/0.6/layer_001.smtx.gz")
    assert (ms[0].rows, ms[0].cols, ms[0].nnz, ms[0].sparsity) == (64, 32, 100, 0.6)
    assert ms[0].seed == dlmc.dlmc_matrices(tmp_path)[0].seed  # stable across calls


def test_options_narrow_the_plan(tmp_path):
    write_index(tmp_path, 12)
    work = dlmc.plan(cfg(tmp_path, ops=("spmm",), dtypes=("float16",), ns=(64,), limit=2))
    assert [m.source for m, _ in work] == ["dlmc", "dlmc", "random", "random"]
    cases = [c for _, cs in work for c in cs]
    assert [(c.op, c.dtype, c.n) for c in cases] == [("spmm", "float16", 64)] * 4


def test_cases_grouped_by_dtype():
    m = dlmc.random_matrices(quick=True)[0]
    cases = dlmc.cases_for(m, ("spmm", "sddmm"), ("float32", "float16"), (32, 128), (32,))
    dts = [c.dtype for c in cases]
    assert dts == ["float32"] * 3 + ["float16"] * 3
    with pytest.raises(SparsegenError, match="unknown op"):
        dlmc.cases_for(m, ("spmv",), ("float32",), (32,), (32,))


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(SparsegenError, match="index.tsv"):
        dlmc.plan(cfg(tmp_path))


@pytest.mark.skipif(not SHARED_INDEX.is_file(), reason="shared DLMC data not present")
def test_real_index_counts():
    data = SHARED_INDEX.parents[1]
    full = [c for _, cs in dlmc.plan(cfg(data)) for c in cs]
    quick = [c for _, cs in dlmc.plan(cfg(data, quick=True)) for c in cs]
    n_dlmc = len(dlmc.read_index(SHARED_INDEX))
    assert len(full) == (n_dlmc + 12) * 14
    assert len(quick) == (math.ceil(n_dlmc / 10) + 2) * 4


# --------------------------------------------------------------------------- random matrices

@pytest.mark.parametrize("m,s", [(256, 0.7), (300, 0.8), (512, 0.9), (1000, 0.95), (64, 0.5)])
def test_random_square_shape_sparsity_sorted(m, s):
    A = dlmc.random_square(m, s, seed=7, chunk_elems=4096)  # small chunks: several per matrix
    assert A.shape == (m, m)
    assert A.dtype == np.float32
    sparsity = 1 - A.nnz / (m * m)
    assert abs(sparsity - s) <= 0.005
    lengths = np.diff(A.indptr)
    assert (lengths == lengths[0]).all()
    for r in range(m):
        row = A.indices[A.indptr[r]:A.indptr[r + 1]]
        assert (np.diff(row) > 0).all()          # sorted, unique
        assert row.min() >= 0 and row.max() < m
    assert A.has_canonical_format


def test_random_square_is_seeded():
    a = dlmc.random_square(500, 0.9, seed=3)
    b = dlmc.random_square(500, 0.9, seed=3)
    c = dlmc.random_square(500, 0.9, seed=4)
    assert (a.indptr == b.indptr).all() and (a.indices == b.indices).all()
    assert (a.data == b.data).all()
    assert not (a.indices == c.indices).all()
    # values are N(0, 1)
    assert abs(a.data.mean()) < 0.05 and abs(a.data.std() - 1) < 0.05


def test_random_square_edges():
    assert dlmc.random_square(10, 1.0, seed=1).nnz == 0
    full = dlmc.random_square(10, 0.0, seed=1)
    assert full.nnz == 100 and (full.indices.reshape(10, 10) == np.arange(10)).all()


def test_random_source_loads_seeded():
    src = dlmc.random_matrices(quick=True)[0]
    assert src.rows == 4096 and src.nnz == 4096 * round(4096 * 0.2)
    assert src.seed == records.seed_for("random/4096/0.8", "values")


# --------------------------------------------------------------------------- references

def test_relative_error_and_sddmm_reference():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((5, 4))
    assert records.relative_error(ref, ref) == 0
    assert records.relative_error(ref * 1.01, ref) == pytest.approx(0.01)
    assert records.relative_error(np.ones(3), np.zeros(3)) == pytest.approx(math.sqrt(3))
    A = rng.standard_normal((6, 3))
    B = rng.standard_normal((5, 3))
    rows = np.array([0, 0, 2, 5, 5])
    cols = np.array([1, 4, 0, 2, 3])
    got = dlmc_gpu.sddmm_reference(A, B, rows, cols, chunk_elems=4)
    assert np.allclose(got, (A @ B.T)[rows, cols])


def test_finalize_status_and_tolerance():
    m = dlmc.random_matrices(quick=True)[0]
    info = {"shape": [4, 4], "nnz": 3, "sparsity": 0.8, "row_cov": 0.1}

    def rec(dtype, err, **kw):
        r = dlmc.base_record(dlmc.Case(m, "spmm", dtype, n=32), info)
        r.update({"error": err, "ms": {"sparsegen": 1.0, "cusparse": 3.0, "cublas": 0.5}}, **kw)
        return dlmc.finalize(r)

    ok = rec("float16", 5e-3)
    assert ok["pass"] and ok["status"] == "ok"
    assert ok["speedup"] == {"vs_cusparse": 3.0, "vs_cublas": 0.5}
    bad = rec("float32", 5e-3)
    assert not bad["pass"] and bad["status"] == "failed" and "tolerance" in bad["note"]
    nan = rec("float32", float("nan"))
    assert nan["status"] == "failed" and nan["error"] is None and "non-finite" in nan["note"]
    uns = rec("float32", None, status="unsupported", _final_status=True, note="unsupported: x")
    assert uns["status"] == "unsupported" and not uns["pass"] and "_final_status" not in uns
    none = rec("float32", None)
    assert none["status"] == "failed"


# --------------------------------------------------------------------------- paths, slugs, CLI

@pytest.mark.parametrize("name,slug", [
    ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
    ("Tesla V100-SXM2-16GB", "tesla-v100-sxm2-16gb"),
    ("  NVIDIA  A100-SXM4-80GB ", "a100-sxm4-80gb"),
    ("", "unknown-gpu"),
])
def test_gpu_slug(name, slug):
    assert bench.gpu_slug(name) == slug


def test_default_out_dir(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    assert bench.default_out_dir("NVIDIA H100 80GB HBM3", repo) == \
        repo / "benchmarks" / "results" / "h100-80gb-hbm3"


def test_resolve_data_dir(tmp_path):
    (tmp_path / "d").mkdir()
    assert bench.resolve_data_dir(str(tmp_path / "d"), environ={}) == tmp_path / "d"
    assert bench.resolve_data_dir(None, environ={"SPARSEGEN_DATA": str(tmp_path / "d")}) == \
        tmp_path / "d"
    repo = tmp_path / "main"
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert bench.resolve_data_dir(None, environ={}, repo=repo) == tmp_path / "shared" / "data"
    with pytest.raises(SparsegenError) as e:
        bench.resolve_data_dir(None, environ={}, repo=tmp_path / "x" / "main")
    assert "SPARSEGEN_DATA" in str(e.value) and "shared" in str(e.value)
    with pytest.raises(SparsegenError, match="no such folder"):
        bench.resolve_data_dir(str(tmp_path / "nope"), environ={})


def parser():
    p = argparse.ArgumentParser(prog="sparsegen bench")
    bench.add_arguments(p)
    return p


def test_add_arguments_parses_everything():
    a = parser().parse_args(["dlmc", "--quick", "--out", "o", "--data", "d", "--ops", "spmm",
                             "--dtypes", "fp16,float32", "--n", "32,128", "--limit", "3",
                             "--max-minutes", "1.5", "--resume"])
    assert a.resume
    assert a.suite == "dlmc" and a.quick and a.out == "o" and a.data == "d"
    assert bench.parse_ops(a.ops) == ("spmm",)
    assert bench.parse_dtypes(a.dtypes) == ("float16", "float32")
    assert bench.parse_ints(a.n, "--n") == (32, 128)
    assert a.limit == 3 and a.max_minutes == 1.5 and a.k is None
    with pytest.raises(SparsegenError, match="known: spmm, sddmm"):
        bench.parse_ops("spmm,spmv")
    with pytest.raises(SparsegenError):
        bench.parse_dtypes("int8")
    with pytest.raises(SparsegenError):
        bench.parse_ints("32,x", "--n")


def test_unknown_suite_error():
    with pytest.raises(SparsegenError) as e:
        bench.get_suite("nope")
    assert "dlmc" in str(e.value) and "nope" in str(e.value)
    with pytest.raises(SparsegenError, match="known suites: decode, dlmc"):
        bench.run(parser().parse_args(["nope"]))
    assert bench.get_suite("dlmc") is dlmc


def test_run_without_torch_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(SparsegenError, match="needs PyTorch with CUDA"):
        bench.run(parser().parse_args(["dlmc", "--quick", "--data", str(tmp_path)]))
    with pytest.raises(SparsegenError, match="needs PyTorch with CUDA"):
        dlmc.GpuExecutor()


def test_command_line():
    assert bench.command_line(["/usr/bin/sparsegen", "bench", "dlmc", "--quick"]) == \
        "sparsegen bench dlmc --quick"
    assert bench.command_line(["/x/sparsegen/__main__.py", "bench", "dlmc", "--out", "a b"]) == \
        "python -m sparsegen bench dlmc --out 'a b'"


def test_package_imports_without_torch():
    import subprocess

    code = ("import sys, sparsegen.bench, sparsegen.bench.dlmc, sparsegen.bench.report, "
            "sparsegen.bench.timing; "
            "bad = [m for m in ('torch', 'cupy', 'matplotlib', 'pycuda') if m in sys.modules]; "
            "assert not bad, bad")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- geomeans, writers

def test_geomean_hand_values():
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert report.geomean([1.0, 10.0, 100.0]) == pytest.approx(10.0)
    assert report.geomean([3.0]) == pytest.approx(3.0)
    assert report.geomean([2.0, None, 0.0, -1.0, float("nan"), 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None
    assert report.geomean([None]) is None


def make_case(id_, op="spmm", dtype="float32", n=128, status="ok", sg=1.0, cs=2.0, cb=4.0,
              source="dlmc", error=1e-7, sparsity=0.9):
    k = None
    if op == "sddmm":
        n, k = None, n
    ms = {"sparsegen": sg, "cusparse": cs}
    if op == "spmm":
        ms["cublas"] = cb
    return {
        "id": id_, "source": source, "op": op, "dtype": dtype, "n": n, "k": k,
        "shape": [512, 2048], "nnz": 1000, "sparsity": sparsity, "row_cov": 0.2,
        "spec": None if status == "unsupported" else "csr_rowsplit.f32.n128",
        "reason": "because", "ms": ms if sg else {"cusparse": cs}, "ms_min": ms,
        "error": error, "pass": status == "ok", "status": status,
        "checked_columns": n, "baseline_error": {"cusparse": 1e-7},
        "speedup": {"vs_cusparse": cs / sg if sg else None,
                    "vs_cublas": cb / sg if sg and op == "spmm" else None},
        "note": {"ok": None, "failed": "error 0.1 > tolerance 1e-05",
                 "unsupported": "unsupported: no family"}[status],
    }


def make_doc(cases, **kw):
    doc = {"suite": "dlmc", "gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1", "cuda": "13.0",
           "revision": None, "date": "2025-01-01", "command": "sparsegen bench dlmc --quick",
           "cases": cases}
    doc.update(kw)
    return doc


def sample_cases():
    return [
        make_case("a", sg=1.0, cs=2.0, cb=4.0),
        make_case("b", sg=1.0, cs=8.0, cb=1.0),
        make_case("c", status="failed", sg=1.0, cs=100.0, cb=100.0, error=0.1),
        make_case("random/4096/0.8", source="random", sg=2.0, cs=1.0, cb=1.0),
        make_case("d", op="sddmm", status="unsupported", sg=None, cs=1.0, error=None),
        make_case("e", dtype="float16", n=32, sg=1.0, cs=3.0, cb=0.5),
        make_case("f", dtype="float16", n=256, sg=1.0, cs=12.0, cb=2.0),
    ]


def test_summarize_groups_and_geomeans():
    rows = dlmc_report.summarize(sample_cases())
    by = {(r["op"], r["dtype"], r["width"]): r for r in rows}
    r = by[("spmm", "float32", 128)]
    assert (r["cases"], r["passed"], r["failed"], r["unsupported"]) == (4, 3, 1, 0)
    # passing cases only: vs cuSPARSE 2, 8, 0.5 -> 2; vs cuBLAS 4, 1, 0.5 -> (2)^(1/3)
    assert r["vs_cusparse"] == pytest.approx(2.0)
    assert r["vs_cublas"] == pytest.approx(2 ** (1 / 3))
    assert r["wins_vs_cusparse"] == 2
    s = by[("sddmm", "float32", 128)]
    assert (s["cases"], s["passed"], s["unsupported"]) == (1, 0, 1)
    assert s["vs_cusparse"] is None and s["vs_cublas"] is None
    allrow = by[("spmm", "float16", "all")]
    assert allrow["cases"] == 2 and allrow["vs_cusparse"] == pytest.approx(6.0)
    assert ("spmm", "float32", "all") not in by        # one width only: no extra row
    order = [(r["op"], r["dtype"], r["width"]) for r in rows]
    assert order.index(("spmm", "float32", 128)) < order.index(("spmm", "float16", 32)) \
        < order.index(("spmm", "float16", 256)) < order.index(("spmm", "float16", "all")) \
        < order.index(("sddmm", "float32", 128))
    dl = {(r["op"], r["dtype"], r["width"]): r for r in dlmc_report.summarize(sample_cases(), "dlmc")}
    assert dl[("spmm", "float32", 128)]["cases"] == 3
    assert dl[("spmm", "float32", 128)]["vs_cusparse"] == pytest.approx(4.0)
    rnd = dlmc_report.summarize(sample_cases(), "random")
    assert len(rnd) == 1 and rnd[0]["vs_cusparse"] == pytest.approx(0.5)


def test_json_writer_keys(tmp_path):
    cases = sample_cases()
    cases[0]["error"] = float("nan")
    cases[0]["_private"] = 1
    p = report.write_json(make_doc(cases, truncated=False), tmp_path / "x" / "dlmc.json")
    doc = json.loads(p.read_text())  # strict JSON: no NaN
    assert list(doc)[:8] == ["suite", "gpu", "driver", "cuda", "revision", "date", "command",
                             "cases"]
    assert set(report.REQUIRED_TOP_KEYS) <= set(doc)
    for c in doc["cases"]:
        assert set(report.REQUIRED_CASE_KEYS) <= set(c)
        assert set(c["speedup"]) == {"vs_cusparse", "vs_cublas"}
        assert "_private" not in c
    assert doc["cases"][0]["error"] is None
    assert set(report.REQUIRED_CASE_KEYS) >= {
        "id", "op", "dtype", "n", "k", "shape", "nnz", "sparsity", "row_cov", "spec", "reason",
        "ms", "ms_min", "error", "pass"}                 # BENCHMARKS.md's list
    with pytest.raises(ValueError, match="lacks"):
        report.write_json({"suite": "dlmc", "cases": []}, tmp_path / "bad.json")
    bad = make_doc([{"id": "z"}])
    with pytest.raises(ValueError, match="lacks"):
        report.write_json(bad, tmp_path / "bad.json")


def test_markdown_order_and_failed_cases():
    md = dlmc_report.markdown(make_doc(sample_cases(), truncated=True, cases_planned=99),
                         png_note="matplotlib is not installed")
    geo = md.index("## Geometric-mean speedups")
    table = md.index("## Per-case results")
    assert geo < table
    assert md.index("### All cases") < md.index("### DLMC only") < md.index("### Random only") \
        < table
    body = md[table:]
    failed = [l for l in body.splitlines() if l.startswith("| c |")]
    assert failed and "FAILED" in failed[0]
    assert any(l.startswith("| d |") and "unsupported" in l for l in body.splitlines())
    assert "sparsegen bench dlmc --quick" in md
    assert "NVIDIA H100 80GB HBM3" in md and "580.1" in md and "2025-01-01" in md
    assert "Truncated run" in md and "7 of 99" in md
    assert "matplotlib is not installed" in md
    head = md[geo:table]
    assert "| spmm | float32 | 128 | 4 | 3 | 0 | 1 | 2.00× |" in head


def test_png_skipped_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    path, why = dlmc_report.write_png(make_doc(sample_cases()), tmp_path / "dlmc.png")
    assert path is None and "matplotlib" in why
    assert not (tmp_path / "dlmc.png").exists()
    paths = dlmc_report.write_reports(make_doc(sample_cases()), tmp_path)
    assert paths["png"] is None
    assert (tmp_path / "dlmc.json").is_file() and (tmp_path / "dlmc.md").is_file()
    assert "matplotlib is not installed" in (tmp_path / "dlmc.md").read_text()


def test_png_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    paths = dlmc_report.write_reports(make_doc(sample_cases()), tmp_path)
    assert paths["png"] == tmp_path / "dlmc.png"
    assert (tmp_path / "dlmc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "dlmc.png" in (tmp_path / "dlmc.md").read_text()


# --------------------------------------------------------------------------- the run loop

class FakeMatrixCtx:
    def __init__(self, ex, A):
        self.ex, self.A = ex, A

    def run(self, case):
        self.ex.seen.append((case.id, case.op, case.dtype, case.width))
        if case.op == "sddmm":
            from sparsegen.errors import UnsupportedError
            raise_ = self.ex.sddmm_mode
            if raise_ == "unsupported":
                return {"status": "unsupported", "_final_status": True,
                        "note": "unsupported: no sddmm family", "ms": {"cusparse": 1.0}}
            raise UnsupportedError("should have been caught by the executor")
        if case.id == self.ex.boom:
            raise RuntimeError("kernel exploded\nsecond line")
        err = 1e-7 if case.dtype == "float32" else 1e-3
        if case.id == self.ex.wrong:
            err = 0.5
        return {"spec": f"fake.{case.dtype}.n{case.n}", "reason": "fake",
                "ms": {"sparsegen": 1.0, "cusparse": 2.0, "cublas": 1.5},
                "ms_min": {"sparsegen": 0.9, "cusparse": 1.9, "cublas": 1.4},
                "error": err, "checked_columns": case.n, "baseline_error": {"cusparse": 1e-7}}

    def close(self):
        self.ex.closed += 1


class FakeExecutor:
    baselines = {"cusparse": "fake"}

    def __init__(self, boom=None, wrong=None, lost=None):
        self.seen, self.closed = [], 0
        self.boom, self.wrong, self.lost = boom, wrong, lost
        self.sddmm_mode = "unsupported"

    def matrix(self, A):
        return FakeMatrixCtx(self, A)

    def context_lost(self):
        return self.lost

    def close(self):
        pass


ENV = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "1", "cuda": "13.0", "revision": None,
       "date": "2025-01-01", "command": "sparsegen bench dlmc", "torch": "x"}


@pytest.fixture
def small_random(monkeypatch):
    """Shrink the random matrices so the loop test loads them in milliseconds."""
    monkeypatch.setattr(dlmc, "QUICK_RANDOM", ((64, 0.8), (96, 0.9)))


def test_run_loop_records_every_case(tmp_path, small_random, monkeypatch):
    write_index(tmp_path, 12)
    import scipy.sparse as sp

    loaded = []
    unreadable = dlmc.dlmc_matrices(tmp_path, quick=True)[1].id

    def fake_load(self):
        loaded.append(self.id)
        if self.source == "random":
            return dlmc.random_square(self.rows, self.sparsity, self.seed)
        if self.id == unreadable:
            raise OSError("gzip: truncated")
        return sp.random(self.rows, self.cols, density=0.05, format="csr", dtype=np.float32,
                         random_state=1)

    monkeypatch.setattr(dlmc.MatrixSource, "load", fake_load)
    ex = FakeExecutor(boom="random/64/0.8", wrong="random/96/0.9")
    lines, checkpoints = [], []
    doc = dlmc.run(cfg(tmp_path, quick=True), env=ENV, executor=ex, emit=lines.append,
                   checkpoint=lambda d: checkpoints.append(len(d["cases"])))
    assert len(doc["cases"]) == doc["cases_planned"] == (2 + 2) * 4
    assert len(lines) == len(doc["cases"]) and doc["truncated"] is False
    # matrix that failed to load: all its cases failed, with the reason
    bad = [c for c in doc["cases"] if c["id"] == unreadable]
    assert len(bad) == 4 and all(c["status"] == "failed" and "load failed" in c["note"]
                                 for c in bad)
    # exception in a case: failed, message kept (first line), run went on
    boom = [c for c in doc["cases"] if c["id"] == "random/64/0.8" and c["op"] == "spmm"]
    assert all(c["status"] == "failed" and "kernel exploded" in c["note"] for c in boom)
    assert all("second line" not in c["note"] for c in boom)
    wrong = [c for c in doc["cases"] if c["id"] == "random/96/0.9" and c["op"] == "spmm"]
    assert all(c["status"] == "failed" and not c["pass"] for c in wrong)
    sd = [c for c in doc["cases"] if c["op"] == "sddmm" and "load failed" not in (c["note"] or "")]
    assert sd and all(c["status"] == "unsupported" for c in sd)
    good = [c for c in doc["cases"] if c["status"] == "ok"]
    assert len(good) == 2 and all(c["speedup"]["vs_cusparse"] == 2.0 for c in good)
    assert ex.closed == 3                        # every loaded matrix released
    assert checkpoints and checkpoints[-1] == len(doc["cases"])
    for c in doc["cases"]:
        assert set(report.REQUIRED_CASE_KEYS) <= set(c)
    # and the whole document goes through the writers
    paths = dlmc_report.write_reports(doc, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["cases"][0]["id"] == doc["cases"][0]["id"]
    assert "FAIL" in " ".join(lines) and "UNSUPPORTED" in " ".join(lines)


def test_run_loop_deadline_truncates(tmp_path, small_random):
    write_index(tmp_path, 12)
    ticks = iter(range(0, 10_000, 20))             # every clock() call: 20 s later

    def clock():
        return float(next(ticks))

    ex = FakeExecutor()
    c = cfg(tmp_path, quick=True, max_minutes=1.0)
    c.ops = ("spmm",)
    import scipy.sparse as sp
    orig = dlmc.MatrixSource.load
    try:
        dlmc.MatrixSource.load = lambda self: sp.identity(self.rows, dtype=np.float32,
                                                          format="csr")
        doc = dlmc.run(c, env=ENV, executor=ex, emit=lambda s: None, clock=clock)
    finally:
        dlmc.MatrixSource.load = orig
    assert doc["truncated"] is True
    assert 0 < len(doc["cases"]) < doc["cases_planned"]
    md = dlmc_report.markdown(doc)
    assert "Truncated run" in md


def test_resume_runs_only_missing_cases(tmp_path, small_random, monkeypatch):
    write_index(tmp_path, 12)
    import scipy.sparse as sp

    monkeypatch.setattr(dlmc.MatrixSource, "load",
                        lambda self: sp.identity(self.rows, dtype=np.float32, format="csr"))
    ticks = iter(range(0, 10_000, 20))
    first = FakeExecutor()
    c = cfg(tmp_path, quick=True, max_minutes=1.0)
    doc1 = dlmc.run(c, env=ENV, executor=first, emit=lambda s: None,
                    clock=lambda: float(next(ticks)))
    assert doc1["truncated"] and 0 < len(doc1["cases"]) < doc1["cases_planned"]
    saved = json.loads(report.write_json(doc1, tmp_path / "r" / "dlmc.json").read_text())
    second = FakeExecutor()
    env2 = dict(ENV, command="sparsegen bench dlmc --quick --resume")
    doc2 = dlmc.run(cfg(tmp_path, quick=True), env=env2, executor=second, emit=lambda s: None,
                    previous=saved)
    assert doc2["truncated"] is False
    assert len(doc2["cases"]) == doc2["cases_planned"]
    keys = [dlmc.case_key(x) for x in doc2["cases"]]
    assert len(set(keys)) == len(keys)
    assert len(first.seen) + len(second.seen) == doc2["cases_planned"]
    planned = [dlmc.case_key(x) for _, cs in dlmc.plan(cfg(tmp_path, quick=True)) for x in cs]
    assert keys == planned                                # plan order restored
    assert doc2["runs"] == ["sparsegen bench dlmc", "sparsegen bench dlmc --quick --resume"]
    assert "Assembled from 2 runs" in dlmc_report.markdown(doc2)


def test_bench_run_end_to_end_with_fakes(tmp_path, small_random, monkeypatch, capsys):
    """sparsegen bench's run(): arguments -> suite -> reports, exit status, --resume."""
    write_index(tmp_path / "data", 12)
    import scipy.sparse as sp

    monkeypatch.setattr(dlmc.MatrixSource, "load",
                        lambda self: sp.identity(self.rows, dtype=np.float32, format="csr"))
    monkeypatch.setattr(bench, "gpu_environment", lambda: {
        "gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "cuda": "13.0"})
    monkeypatch.setattr(dlmc, "GpuExecutor", FakeExecutor)
    out = tmp_path / "out"
    argv = ["dlmc", "--quick", "--data", str(tmp_path / "data"), "--out", str(out)]
    assert bench.run(parser().parse_args(argv), argv=["sparsegen", "bench"] + argv) == 0
    printed = capsys.readouterr().out
    assert "[1/16]" in printed and "geomean spmm float32 128" in printed
    doc = json.loads((out / "dlmc.json").read_text())
    assert doc["command"].startswith("sparsegen bench dlmc --quick")
    assert len(doc["cases"]) == 16 and not doc["truncated"]
    assert (out / "dlmc.md").is_file()
    # --resume with everything done runs nothing and keeps every case
    monkeypatch.setattr(dlmc, "GpuExecutor", lambda: pytest.fail("nothing left to run"))
    real_run = FakeMatrixCtx.run
    monkeypatch.setattr(FakeMatrixCtx, "run", lambda self, case: pytest.fail("ran a case"))
    assert bench.run(parser().parse_args(argv + ["--resume"])) == 0
    doc2 = json.loads((out / "dlmc.json").read_text())
    assert len(doc2["cases"]) == 16 and len(doc2["runs"]) == 2
    monkeypatch.setattr(FakeMatrixCtx, "run", real_run)
    # a wrong answer makes the exit status 1
    monkeypatch.setattr(dlmc, "GpuExecutor", lambda: FakeExecutor(wrong="random/64/0.8"))
    assert bench.run(parser().parse_args(argv)) == 1
    # resuming onto results of another GPU is refused
    monkeypatch.setattr(bench, "gpu_environment", lambda: {"gpu": "NVIDIA H200", "driver": "1",
                                                           "cuda": "13.0"})
    with pytest.raises(SparsegenError, match="--resume"):
        bench.run(parser().parse_args(argv + ["--resume"]))


def test_run_loop_stops_when_context_lost(tmp_path, small_random, monkeypatch):
    write_index(tmp_path, 12)
    import scipy.sparse as sp

    monkeypatch.setattr(dlmc.MatrixSource, "load",
                        lambda self: sp.identity(self.rows, dtype=np.float32, format="csr"))
    ex = FakeExecutor(boom="random/64/0.8", lost="illegal memory access")
    doc = dlmc.run(cfg(tmp_path, quick=True, ops=("spmm",)), env=ENV, executor=ex,
                   emit=lambda s: None)
    assert doc["truncated"] and "illegal memory access" in doc["aborted"]
    assert doc["cases"][-1]["id"] == "random/64/0.8"


# --------------------------------------------------------------------------- timing (simulated GPU)

class SimGpu:
    """A one-stream GPU timeline driven by a host clock, in microseconds.

    Every enqueued item starts when both the GPU is free and the host has submitted it; an event
    is stamped when the GPU reaches it. Host calls cost host time.
    """

    def __init__(self, kernel_us, host_us, cycles_per_us=1500.0, enqueue_us=2.0):
        self.host = 0.0
        self.gpu_free = 0.0
        self.kernel_us, self.host_us = kernel_us, host_us
        self.cycles_per_us, self.enqueue_us = cycles_per_us, enqueue_us
        self.log = []
        self.key = ("sim", id(self))

    def _enqueue(self, dur_us, host_cost):
        self.host += host_cost
        start = max(self.gpu_free, self.host)
        self.gpu_free = start + dur_us
        return start

    # backend protocol
    def event(self):
        gpu = self

        class Ev:
            t = None

            def record(self):
                gpu.log.append("event")
                self.t = gpu._enqueue(0.0, gpu.enqueue_us)

            def elapsed_time(self, other):
                return (other.t - self.t) / 1000.0

        return Ev()

    def synchronize(self):
        self.host = max(self.host, self.gpu_free)

    def sleep(self, cycles):
        self.log.append("sleep")
        self._enqueue(cycles / self.cycles_per_us, self.enqueue_us)

    def clock(self):
        return self.host / 1e6

    def fn(self):
        self.log.append("fn")
        self._enqueue(self.kernel_us, self.host_us)


def test_timing_excludes_host_launch_overhead():
    gpu = SimGpu(kernel_us=10.0, host_us=40.0)       # launch costs the host 4x the kernel
    r = timing.time_cuda(gpu.fn, backend=gpu)
    assert r["median_ms"] == pytest.approx(0.010, rel=1e-6)
    assert r["min_ms"] == pytest.approx(0.010, rel=1e-6)
    assert r["runs"] >= 20
    assert r["sleep_us"] >= 1.5 * 40 + 20 - 1          # spin sized from measured host time
    assert r["host_ms"] == pytest.approx(0.040 + 0.002 * 2, rel=0.01)


def test_timing_without_spin_would_count_host_time():
    gpu = SimGpu(kernel_us=10.0, host_us=40.0)
    r = timing.time_cuda(gpu.fn, backend=gpu, sleep_us=0)
    assert r["median_ms"] > 0.040                      # what the spin is there to avoid


def test_timing_runs_and_span():
    gpu = SimGpu(kernel_us=10.0, host_us=5.0)
    r = timing.time_cuda(gpu.fn, backend=gpu, min_runs=20, min_ms=100)
    per_iter_ms = (r["sleep_us"] + 10.0) / 1000
    assert r["runs"] * per_iter_ms >= 100 * 0.99        # covers >= 100 ms of GPU time
    assert r["runs"] < 2 * 100 / per_iter_ms
    long = SimGpu(kernel_us=20_000.0, host_us=5.0)      # 20 ms kernel: min_runs dominates
    r2 = timing.time_cuda(long.fn, backend=long, min_runs=20, min_ms=100)
    assert r2["runs"] == 20 and r2["median_ms"] == pytest.approx(20.0)
    assert r2["warmup_runs"] >= 3


def test_timing_order_spin_then_event_then_launch():
    gpu = SimGpu(kernel_us=10.0, host_us=5.0)
    timing.time_cuda(gpu.fn, backend=gpu, min_runs=20, min_ms=1)
    log = gpu.log
    first_sleep = log.index("sleep")
    # skip the calibration spins (sleep, event, sleep, event ...) and the warm-up (no spins)
    seq = log[first_sleep:]
    timed = [i for i in range(len(seq) - 3) if seq[i:i + 4] == ["sleep", "event", "fn", "event"]]
    assert len(timed) >= 20
    assert seq[-4:] == ["sleep", "event", "fn", "event"]
    warm = log[:first_sleep]
    assert warm.count("fn") >= 3


class FlushingSimGpu(SimGpu):
    """SimGpu with the cold-L2 read: a GPU item of `flush_us` that stands before the spin."""

    def __init__(self, *a, flush_us=30.0, **kw):
        super().__init__(*a, **kw)
        self.flush_us = flush_us

    def flush_l2(self):
        self.log.append("flush")
        self._enqueue(self.flush_us, self.enqueue_us)


def test_timing_flushes_l2_before_every_timed_launch_outside_the_events():
    gpu = FlushingSimGpu(kernel_us=10.0, host_us=5.0, flush_us=300.0)
    r = timing.time_cuda(gpu.fn, backend=gpu, min_runs=20, min_ms=1, flush_l2=True)
    assert r["median_ms"] == pytest.approx(0.010, rel=1e-6)   # the flush is not timed
    assert r["l2"] == "flushed" and "l2" in timing.recorded(r)
    seq = gpu.log[gpu.log.index("flush"):]
    timed = [i for i in range(len(seq) - 4) if seq[i:i + 5] == ["flush", "sleep", "event", "fn", "event"]]
    assert len(timed) == seq.count("flush") == r["runs"] + r["set_aside"]
    warm = SimGpu(kernel_us=10.0, host_us=5.0)
    assert timing.time_cuda(warm.fn, backend=warm, min_runs=20, min_ms=1)["l2"] == "warm"


def test_timing_warmup_at_least_25ms():
    gpu = SimGpu(kernel_us=1000.0, host_us=5.0)         # 1 ms kernels: >= 25 warm-up launches
    r = timing.time_cuda(gpu.fn, backend=gpu)
    assert r["warmup_runs"] >= 24


def test_sleep_calibration_cached():
    gpu = SimGpu(kernel_us=1.0, host_us=1.0, cycles_per_us=1234.0)
    rate = timing.calibrate_sleep(gpu)
    assert rate == pytest.approx(1234.0, rel=0.01)   # the sim's event enqueue gap: 2 us per ms
    n = len(gpu.log)
    assert timing.calibrate_sleep(gpu) == rate
    assert len(gpu.log) == n


class StallingSimGpu(SimGpu):
    """A SimGpu whose host turns slow after warm-up (once the first spin is enqueued): every
    `every`-th call of fn then costs `stall_us` of host time instead of host_us (another process
    on the core, a thread holding the GIL)."""

    def __init__(self, *args, every: int, stall_us: float, **kw):
        super().__init__(*args, **kw)
        self.every, self.stall_us, self.calls = every, stall_us, 0

    def fn(self):
        self.calls += 1
        self.log.append("fn")
        stalls = "sleep" in self.log and self.calls % self.every == 0
        host = self.stall_us if stalls else self.host_us
        self._enqueue(self.kernel_us, host)


def test_timing_sets_aside_samples_whose_submit_outlasted_the_spin():
    # The warm-up sees a 40 us submit; later every second call takes 400 us of host time, longer
    # than the spin sized from warm-up, so half the samples would hold host time.
    gpu = StallingSimGpu(kernel_us=10.0, host_us=40.0, every=2, stall_us=400.0)
    r = timing.time_cuda(gpu.fn, backend=gpu)
    assert r["median_ms"] == pytest.approx(0.010, rel=1e-6)
    assert r["runs"] >= 20 and r["set_aside"] > 0
    assert r["host_ms"] == pytest.approx(0.044, rel=0.01)  # warm-up saw no stall
    assert r["sleep_us"] > 1.5 * 44 + 20 + 1            # the spin grew past the warm-up's size
    assert not r["host_bound"]


def test_timing_keeps_covered_samples_and_flags_a_host_slower_than_any_spin():
    gpu = StallingSimGpu(kernel_us=10.0, host_us=40.0, every=2, stall_us=400.0)
    r = timing.time_cuda(gpu.fn, backend=gpu, sleep_us=timing.MAX_SLEEP_US)
    assert r["median_ms"] == pytest.approx(0.010, rel=1e-6) and r["set_aside"] == 0
    slow = StallingSimGpu(kernel_us=10.0, host_us=40.0, every=1, stall_us=20_000.0)
    r2 = timing.time_cuda(slow.fn, backend=slow, min_runs=5, min_ms=1)
    assert r2["host_bound"] and r2["sleep_us"] == timing.MAX_SLEEP_US


def test_run_loop_compiles_ahead_and_measures_in_each_matrix_folder(tmp_path, small_random, monkeypatch):
    """Each matrix's job is taken before its cases are measured, the measuring runs with sparsegen's
    cache pointed at the matrix's folder, and every folder is gone once its cases are done."""
    from concurrent.futures import ThreadPoolExecutor

    from sparsegen.bench import prefetch
    from sparsegen.cache import ENV_DIR

    write_index(tmp_path, 12)
    monkeypatch.setattr(dlmc.MatrixSource, "load",
                        lambda self: dlmc.random_square(self.rows, self.sparsity, self.seed) if self.source == "random"
                        else sp.random(self.rows, self.cols, density=0.05, format="csr", dtype=np.float32, random_state=1))
    seen_dirs, made = [], {}

    class Watching(FakeExecutor):
        def matrix(self, A):
            ctx = super().matrix(A)
            run = ctx.run

            def run_here(case):
                seen_dirs.append((case.id, os.environ.get(ENV_DIR)))
                return run(case)
            ctx.run = run_here
            return ctx

    def factory(cases, root, arch):
        made["pf"] = dlmc.Prefetcher(cases, root, arch, 2, pool=ThreadPoolExecutor(2), memory=1e18, disk=1e18,
                                     job_fn=lambda job: {c.key: {"seconds": 0.5} for c in job.cases})
        return made["pf"]

    scratch = tmp_path / "scratch"
    doc = dlmc.run(cfg(tmp_path, quick=True), env=ENV, executor=Watching(), emit=lambda s: None,
                   prefetch_factory=factory, scratch=scratch)
    assert doc["prefetch"]["completed"] == len(doc["cases"]) and all(c["prefetch_s"] == 0.5 for c in doc["cases"])
    assert all(folder == str(dlmc.case_dir(scratch, next(c for _, cs in dlmc.plan(cfg(tmp_path, quick=True))
                                                         for c in cs if c.id == i)))
               for i, folder in seen_dirs)
    assert os.environ.get(ENV_DIR) != str(scratch) and made["pf"].pool is None
    assert not any(scratch.iterdir()) if scratch.exists() else True


def test_a_dlmc_worker_compiles_what_the_parent_finds_warm(tmp_path, monkeypatch):
    """A real spawned worker compiles a matrix's cases (fp32 and fp16 SpMM, SDDMM, forced families):
    the parent's compile() of each then hits the plan in the matrix's folder."""
    import sparsegen
    from sparsegen.bench import prefetch
    from sparsegen.bench.dlmc_gpu import as_stored

    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "user-cache"))
    source = dlmc.MatrixSource("random/96/0.9", "random", 96, 96, 0.9, nnz=96 * 10)
    cases = [dlmc.Case(source, "spmm", "float32", n=32, families=("csr_rowsplit", "sputnik_spmm")),
             dlmc.Case(source, "spmm", "float16", n=32), dlmc.Case(source, "sddmm", "float32", k=32)]
    pf = dlmc.Prefetcher(cases, tmp_path / "scratch", "sm_90", 1, cubin=False)
    results = [pf.take(c) for c in cases]
    assert all(r is not None and "sparsegen" in r["specs"] for r in results), results
    folder = dlmc.case_dir(tmp_path / "scratch", cases[0])
    A = source.load()
    with prefetch.cache_dir(folder):
        for case, res in zip(cases, results):
            k = sparsegen.compile(as_stored(A, case.dtype), arch="sm_90", backend="emulate", **case.request)
            assert k.timings.cached.get("plan") is True and k.spec.name == res["specs"]["sparsegen"]
        forced = sparsegen.compile(as_stored(A, "float32"), arch="sm_90", backend="emulate",
                                   options={"family": "sputnik_spmm"}, **cases[0].request)
        assert forced.timings.cached.get("plan") is True
    assert not (tmp_path / "user-cache").exists()
    for case in cases:
        pf.release(case)
    pf.close()
    assert not folder.exists()


def test_the_inference_suites_time_with_l2_flushed_and_dlmc_warm(monkeypatch):
    """llm and the calibration time a W read once from DRAM, as a forward pass reads it; dlmc's
    operands stay in L2, as a layer's do when it runs in a loop (docs/decisions/012-cold-l2.md)."""
    from sparsegen import calibration
    from sparsegen.bench import dlmc_gpu, executor, llm_gpu

    assert llm_gpu.GpuExecutor.default_timer().keywords == {"flush_l2": True}
    assert dlmc_gpu.GpuExecutor.default_timer().keywords == {"flush_l2": False}
    assert executor.GpuExecutor.default_timer().func is timing.time_cuda
    asked = {}

    def fake_time_cuda(fn, **kw):
        asked.update(kw)
        return {"median_ms": 2.0}

    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    probe = object.__new__(calibration.GpuProbe)
    assert calibration.GpuProbe.time(probe, lambda: None, calibration.QUICK) == pytest.approx(2e-3)
    assert asked["flush_l2"] is True
