"""CPU tests of `sparsegen bench dlmc --families`: which families a case forces, the forcing itself
(the shared executor with a fake compile), the fastest family per case, and the summary of how often
the selected kernel is within 5 % of it, all on synthetic timings: no torch, no GPU."""
from __future__ import annotations

import argparse
import types

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import bench
from sparsegen.bench import dlmc, dlmc_report, executor
from sparsegen.errors import SparsegenError, UnsupportedError


def cfg(**kw) -> bench.BenchConfig:
    return bench.BenchConfig(suite="dlmc", data_dir=None, **kw)


# --------------------------------------------------------------------------- which families

def test_op_families_cover_every_family_but_the_network_drivers():
    from sparsegen.families import FAMILIES

    listed = [f for fams in dlmc.OP_FAMILIES.values() for f in fams]
    assert len(listed) == len(set(listed))
    drivers = {name for name, fam in FAMILIES.items() if getattr(fam, "DRIVER", None)}
    assert set(listed) == set(FAMILIES) - drivers


def test_parse_families():
    assert dlmc.parse_families(None) is None
    assert dlmc.parse_families("all") == "all"
    assert dlmc.parse_families("sputnik_spmm, csr_rowsplit,sputnik_spmm") == ("sputnik_spmm", "csr_rowsplit")
    with pytest.raises(SparsegenError, match="unknown family nope; known: all, csr_rowsplit"):
        dlmc.parse_families("csr_rowsplit,nope")
    with pytest.raises(SparsegenError, match="unknown"):
        dlmc.parse_families(",")


def test_cases_carry_the_families_of_their_op():
    m = dlmc.MatrixSource(id="random/64/0.8", source="random", rows=64, cols=64, sparsity=0.8)
    cases = dlmc.cases_for(m, ("spmm", "sddmm"), ("float32",), (32,), (32,), "all")
    assert cases[0].families == dlmc.OP_FAMILIES["spmm"] and cases[1].families == dlmc.OP_FAMILIES["sddmm"]
    some = dlmc.cases_for(m, ("spmm", "sddmm"), ("float32",), (32,), (32,), ("sputnik_spmm", "sputnik_sddmm"))
    assert [c.families for c in some] == [("sputnik_spmm",), ("sputnik_sddmm",)]
    assert all(c.families == () for c in dlmc.cases_for(m, ("spmm",), ("float32",), (32,), (32,)))
    # the families never change a case's identity (--resume matches records by it)
    assert cases[0] == dlmc.Case(m, "spmm", "float32", n=32)


def test_cli_families_option(monkeypatch):
    p = argparse.ArgumentParser(prog="sparsegen bench")
    bench.add_arguments(p)
    assert p.parse_args(["dlmc", "--families"]).families == "all"
    assert p.parse_args(["dlmc", "--families", "csr_rowsplit"]).families == "csr_rowsplit"
    assert p.parse_args(["dlmc"]).families is None
    monkeypatch.setattr(bench, "gpu_environment", lambda: pytest.fail("checked before any GPU"))
    with pytest.raises(SparsegenError, match="--families: suite llm has no such filter"):
        bench.run(p.parse_args(["llm", "--families"]))
    with pytest.raises(SparsegenError, match="--families: unknown family"):
        bench.run(p.parse_args(["dlmc", "--families", "nope"]))


# --------------------------------------------------------------------------- forcing them

class FakeKernel:
    def __init__(self, family, name=None):
        self.spec = types.SimpleNamespace(family=family, name=name or f"{family}.spec")
        self.timings = types.SimpleNamespace(cached={"plan": False})


def fake_executor(declines=(), fails=()):
    """The shared executor without its GPU: compile answers from the options, times are given."""
    ex = object.__new__(executor.GpuExecutor)
    ex.arch, ex.device_model, ex.compiled = "sm_90", None, []

    def compile_(A, *, options=None, **kw):
        fam = (options or {}).get("family", "sputnik_spmm")
        ex.compiled.append(fam)
        if fam in declines:
            raise UnsupportedError(f"{fam} declines: no")
        if fam in fails:
            raise RuntimeError("nvcc exploded\nmore")
        return FakeKernel(fam)

    ex.sparsegen = types.SimpleNamespace(compile=compile_)
    return ex


def test_time_families_forces_each_and_reuses_the_selected_one():
    ex = fake_executor(declines=("ell_coo_spmm",))
    rec = {"ms": {"sparsegen": 1.0}, "ms_min": {"sparsegen": 0.9}}
    selected = ex.compile(rec, "sparsegen", None, op="spmm", n=32, dtype="float32")
    times = {"csr_rowsplit": 1.5, "panel_spmm": 0.8}
    seen = []

    def measure(name, kern):
        rec.setdefault("family_ms", {})[name] = times[name]
        return 1e-7

    ex.time_families(rec, None, {"op": "spmm", "n": 32, "dtype": "float32"},
                     ("csr_rowsplit", "sputnik_spmm", "ell_coo_spmm", "panel_spmm"), selected, measure,
                     times=("family_ms", "family_ms_min"), quiet_decline=True,
                     on_kernel=lambda name, k: seen.append((name, k.spec.family)))
    assert ex.compiled == ["sputnik_spmm", "csr_rowsplit", "ell_coo_spmm", "panel_spmm"]  # selected: not again
    assert rec["family_ms"] == {"csr_rowsplit": 1.5, "sputnik_spmm": 1.0, "panel_spmm": 0.8}
    assert rec["family_ms_min"] == {"sputnik_spmm": 0.9}
    assert rec["family_spec"] == {f: f"{f}.spec" for f in ("csr_rowsplit", "sputnik_spmm", "panel_spmm")}
    assert set(rec["family_error"]) == {"csr_rowsplit", "panel_spmm"}
    assert rec["family_declined"] == {"ell_coo_spmm": "ell_coo_spmm declines: no"} and "note" not in rec
    assert seen == [("csr_rowsplit", "csr_rowsplit"), ("sputnik_spmm", "sputnik_spmm"), ("panel_spmm", "panel_spmm")]


def test_a_family_that_fails_to_compile_fails_the_case():
    ex = fake_executor(fails=("panel_spmm",))
    rec = {"ms": {}, "ms_min": {}}
    ex.time_families(rec, None, {}, ("panel_spmm",), None, lambda n, k: pytest.fail("not measured"),
                     quiet_decline=True)
    assert rec["status"] == "failed" and rec["_final_status"]
    assert rec["note"] == "panel_spmm compile failed: RuntimeError: nvcc exploded"
    loud = {"ms": {}, "ms_min": {}}
    fake_executor(declines=("panel_spmm",)).time_families(loud, None, {}, ("panel_spmm",), None, None)
    assert loud["note"] == "panel_spmm unsupported: panel_spmm declines: no" and "status" not in loud


# --------------------------------------------------------------------------- the fastest family

def record(sel=1.0, family="sputnik_spmm", fams=None, errors=None, cs=2.0, dtype="float32", op="spmm",
           error=1e-7, id_="m"):
    info = {"shape": [64, 64], "nnz": 100, "sparsity": 0.97, "row_cov": 0.1}
    m = dlmc.MatrixSource(id=id_, source="dlmc", rows=64, cols=64, sparsity=0.97)
    case = dlmc.Case(m, op, dtype, n=32 if op == "spmm" else None, k=32 if op == "sddmm" else None)
    rec = dlmc.base_record(case, info)
    rec.update({"family": family, "error": error, "ms": {"sparsegen": sel, "cusparse": cs, "cublas": 3.0},
                "ms_min": {}, "family_error": dict(errors or {})})
    if fams is not None:
        rec["family_ms"] = {family: sel, **fams}
    return dlmc.finalize(rec)


def test_selected_is_the_fastest():
    r = record(fams={"csr_rowsplit": 1.2, "panel_spmm": 1.01}, errors={"csr_rowsplit": 0, "panel_spmm": 0})
    assert r["status"] == "ok" and r["fastest_family"] == "sputnik_spmm" and r["selected_vs_fastest"] == 1.0


def test_another_family_is_faster():
    r = record(sel=1.2, fams={"csr_rowsplit": 1.0, "panel_spmm": 1.1}, errors={"csr_rowsplit": 0, "panel_spmm": 0})
    assert r["fastest_family"] == "csr_rowsplit" and r["selected_vs_fastest"] == pytest.approx(1.2)


def test_a_wrong_family_is_not_the_fastest_and_fails_the_case():
    r = record(sel=1.2, fams={"csr_rowsplit": 0.5}, errors={"csr_rowsplit": 0.3})
    assert r["fastest_family"] == "sputnik_spmm" and r["selected_vs_fastest"] == 1.0
    assert r["status"] == "failed" and "csr_rowsplit error 0.3 > tolerance 1e-05" in r["note"]
    nan = record(fams={"csr_rowsplit": 0.5}, errors={"csr_rowsplit": float("nan")})
    assert nan["status"] == "failed" and nan["fastest_family"] == "sputnik_spmm"


def test_no_families_timed_leaves_the_record_as_before():
    r = record()
    assert r["status"] == "ok" and "fastest_family" not in r and "selected_vs_fastest" not in r
    assert dlmc_report.family_section([r]) == []


def test_family_summary_counts_within_five_percent_and_cusparse():
    ok = {"csr_rowsplit": 0.0}
    cases = [
        record(id_="a", sel=1.0, fams={"csr_rowsplit": 1.0}, errors=ok),             # 1.00: within
        record(id_="b", sel=1.05, fams={"csr_rowsplit": 1.0}, errors=ok),            # 1.05: within (boundary)
        record(id_="c", sel=1.2, fams={"csr_rowsplit": 1.0}, errors=ok, cs=1.1),     # 1.20, slower than cuSPARSE
        record(id_="d", sel=1.0, cs=4.0),                                            # no families: cuSPARSE only
        record(id_="e", sel=1.0, fams={"csr_rowsplit": 0.5}, errors=ok, error=0.5),  # failed: left out
        record(id_="f", sel=2.0, fams={"tiled_csl_spmm": 1.0}, family="dense_gemm",
               errors={"tiled_csl_spmm": 0.0}, dtype="float16"),
    ]
    rows = {(r["op"], r["dtype"]): r for r in dlmc_report.family_summary(cases)}
    f32 = rows[("spmm", "float32")]
    assert (f32["cases"], f32["within"]) == (3, 2)
    assert f32["geomean_vs_fastest"] == pytest.approx((1.05 * 1.2) ** (1 / 3))
    assert f32["worst"] == pytest.approx(1.2) and f32["worst_case"] == "c n=32"
    assert f32["fastest"] == {"csr_rowsplit": 2, "sputnik_spmm": 1}
    assert (f32["with_cusparse"], f32["slower_than_cusparse"]) == (4, 1)
    f16 = rows[("spmm", "float16")]
    assert (f16["cases"], f16["within"], f16["fastest"]) == (1, 0, {"tiled_csl_spmm": 1})
    md = "\n".join(dlmc_report.family_section(cases))
    assert "| spmm | float32 | 3 | 2/3 (67 %) | 1.080 | 1.200 (c n=32) | `csr_rowsplit` 2, `sputnik_spmm` 1 | 1/4 (25 %) |" in md
    lines = dlmc_report.summary_lines({"cases": cases})
    assert any("spmm float32: selected within 5% of the fastest family in 2/3 (67 %) cases" in x for x in lines)
    assert any("spmm float32: slower than cuSPARSE in 1/4 (25 %) cases" in x for x in lines)


def test_markdown_shows_the_family_columns_only_when_timed():
    doc = {"suite": "dlmc", "gpu": "g", "driver": "1", "cuda": "13", "revision": None, "date": "d",
           "command": "sparsegen bench dlmc --families", "cases": [record(sel=1.2, fams={"csr_rowsplit": 1.0},
                                                                            errors={"csr_rowsplit": 0})]}
    md = dlmc_report.markdown(doc)
    assert "## Selected kernel against the fastest family" in md and "| fastest family | selected ÷ fastest |" in md
    assert "| csr_rowsplit | 1.200 |" in md
    doc["cases"] = [record()]
    md = dlmc_report.markdown(doc)
    assert "fastest family" not in md


# --------------------------------------------------------------------------- through the run loop

class FamiliesCtx:
    def __init__(self, A):
        self.A = A

    def run(self, case):
        fams = {f: 1.0 + 0.1 * i for i, f in enumerate(case.families)}
        return {"spec": "sputnik_spmm.x", "family": "sputnik_spmm", "error": 1e-7,
                "ms": {"sparsegen": 1.02, "cusparse": 2.0, "cublas": 1.5}, "ms_min": {},
                "family_ms": fams, "family_error": {f: 0.0 for f in fams}, "checked_columns": case.n}

    def close(self):
        pass


class FamiliesExecutor:
    baselines = {}

    def matrix(self, A):
        return FamiliesCtx(A)

    def context_lost(self):
        return None

    def close(self):
        pass


def test_run_loop_records_the_fastest_family(monkeypatch):
    monkeypatch.setattr(dlmc, "QUICK_RANDOM", ((64, 0.8),))
    monkeypatch.setattr(dlmc, "dlmc_matrices", lambda data, quick=False: [])
    monkeypatch.setattr(dlmc.MatrixSource, "load", lambda self: sp.random(64, 64, 0.2, format="csr",
                                                                            dtype=np.float32, random_state=0))
    lines = []
    env = {"gpu": "g", "driver": "1", "cuda": "13", "revision": None, "date": "d", "command": "c"}
    doc = dlmc.run(cfg(quick=True, ops=("spmm",), dtypes=("float32",), families=("csr_rowsplit", "panel_spmm")),
                   env=env, executor=FamiliesExecutor(), emit=lines.append)
    (c,) = doc["cases"]
    assert c["status"] == "ok" and c["fastest_family"] == "csr_rowsplit"
    assert c["selected_vs_fastest"] == pytest.approx(1.02) and doc["settings"]["families"] == ["csr_rowsplit", "panel_spmm"]
    assert "fastest csr_rowsplit (selected 1.02x its time)" in lines[0]
