"""The graphchallenge suite's CPU side: case plan, reports (no GPU here)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from sparsegen.bench import SUITES, get_suite
from sparsegen.bench import graphchallenge as suite


def fake_case(**over):
    c = {"id": "official/n1024-l120/60000-mnist", "neurons": 1024, "layers": 120, "inputs": 60000,
         "input_nnz": 6379488, "edges": 3932160, "specs": ["spdnn_sliced_ell.x"], "survivors": 1833,
         "alive_per_layer": [1833], "distinct_per_layer": [60000], "layers_run": 31, "fixed_from": 0,
         "rows_computed": {"converge_on": 90000, "converge_off": 300000},
         "converge_summary": "31 of 120 layers ran, on 1-60000 distinct rows",
         "ms": {"sparsegen": 2.0, "sparsegen_converge_off": 5.8, "cusparse_loop": 49.9,
                "sparsegen_runtime_trips": 5.9},
         "teraedges_per_s": {"sparsegen": 117.9, "sparsegen_converge_off": 40.7, "cusparse_loop": 4.7,
                             "sparsegen_runtime_trips": 40.0},
         "split_ms": {"preprocess": 4000.0, "compile": 2000.0, "transfer": 20.0,
                      "converge_on": {"inference": 2.1, "layers": 1.6, "dedup": 0.1, "pruning": 0.2, "tail": 0.0,
                                      "host_launch": 0.9}},
         "memory": {"device_peak_bytes": 2.5e9}, "speedup_vs_cusparse_loop": 24.95,
         "speedup_vs_cusparse_loop_converge_off": 8.6, "cusparse_loop_same_answer": True,
         "converge_off_same_answer": True, "runtime_trips_same_answer": True,
         "reference_inputs": 60000, "reference_check": True, "official_check": None, "pass": True, "status": "ok"}
    c.update(over)
    return c


def test_registered_and_planned():
    assert "graphchallenge" in SUITES and get_suite("graphchallenge") is suite
    sizes = {(c.neurons, c.layers) for c in suite.CASES}
    assert {(1024, 120), (1024, 1920), (4096, 1920), (16384, 1920), (65536, 120), (65536, 1920)} <= sizes
    assert all(c.count == 60000 for c in suite.CASES if c.inputs == "mnist")  # the challenge's count
    assert suite.QUICK[0].inputs == "official" and any(c.runtime_variant for c in suite.QUICK)


def test_reference_subset_is_seeded_and_all_when_small():
    case = suite.CASES[-1]
    a, b = suite.reference_subset(case, 60000), suite.reference_subset(case, 60000)
    assert np.array_equal(a, b) and a.size == case.reference_count and np.all(np.diff(a) > 0)
    assert a.max() > 30000  # a random subset, not a prefix
    assert np.array_equal(suite.reference_subset(suite.CASES[1], 60000), np.arange(60000))


def test_reports(tmp_path):
    doc = {"suite": "graphchallenge", "gpu": "G", "driver": "d", "cuda": "13.0", "revision": "a" * 40,
           "date": "2026-11-22", "command": "sparsegen bench graphchallenge", "truncated": False,
           "cases": [fake_case(), fake_case(id="official/n1024-l120/1200-official-images", official_check="PASSED"),
                     {"id": "generated/n65536-l120/2000-mnist", "pass": False, "status": "failed", "note": "boom"}]}
    paths = suite.write_reports(doc, tmp_path)
    assert json.loads(paths["json"].read_text())["cases"][0]["teraedges_per_s"]["sparsegen"] == 117.9
    md = paths["md"].read_text()
    assert ("| official/n1024-l120/60000-mnist | 60000 | 3932160 | 2.000 | 117.90 | 5.800 | 40.70 | 49.900 | 4.70 | "
            "24.95x / 8.60x | 31/120 | 90000 / 300000 | 2.0 | 2.5 |") in md
    assert "runtime-trips ms" in md and "failed: boom" in md and "| PASSED |" in md
    assert "- official/n1024-l120/60000-mnist: 31 of 120 layers ran" in md
    assert any("24.95x" in line and "31/120 layers ran" in line for line in suite.summary_lines(doc))
    split = ("split: converge on 2.100 ms = layers 1.600 + dedup 0.100 + pruning 0.200 + tail 0.000 "
             "(host launches 0.900)")
    assert any(line.endswith(split) for line in suite.summary_lines(doc)) and split in md
    assert suite.split_line(fake_case(split_ms={})) is None


def test_failing_case_is_recorded_and_the_suite_goes_on(monkeypatch, tmp_path):
    def boom(case, data, emit):
        raise RuntimeError(f"no GPU for {case.id}")

    monkeypatch.setattr(suite, "run_case", boom)
    cfg = SimpleNamespace(max_minutes=None, quick=True, limit=None, data_dir=tmp_path)
    lines = []
    doc = suite.run(cfg, env={}, emit=lines.append)
    assert [c["status"] for c in doc["cases"]] == ["failed", "failed"]
    assert "no GPU" in doc["cases"][0]["note"] and len(lines) == 2


def test_a_case_runs_end_to_end_with_the_emulator(monkeypatch, data_dir):
    """run_case's bookkeeping on the CPU: the emulator stands in for the GPU, scipy for cuSPARSE."""
    from sparsegen import graphchallenge as gc
    from sparsegen.spdnn import SparseDNN

    case = suite.Case("generated/n1024-l24/600-mnist", 1024, 24, "mnist", 600, 200)
    monkeypatch.setattr(suite, "SparseDNN", lambda *a, **k: SparseDNN(*a, **{**k, "backend": "emulate"}))
    monkeypatch.setattr(suite, "RUNS", 1)

    def fake_loop(layers, x, bias):
        return 10.0, gc.reference_inference(layers, x, bias).ids, 0

    monkeypatch.setattr(suite, "cusparse_loop", fake_loop)
    lines = []
    rec = suite.run_case(case, data_dir, lines.append)
    assert rec["pass"] and rec["reference"] == {"inputs": 200, "seed": 1, "survivors": rec["reference"]["survivors"],
                                                "ids": True, "features": True}
    assert rec["reference"]["survivors"] > 0 and rec["converge_off_same_answer"] and rec["cusparse_loop_same_answer"]
    assert rec["rows_computed"]["converge_on"] < rec["rows_computed"]["converge_off"]
    assert len(rec["distinct_per_layer"]) == 24 and rec["layers_run"] <= 24
    assert any("600 inputs" in line for line in lines) and any("proved 24 layers and compiled 24" in line for line in lines)
    assert rec["split_ms"]["layers_built_converge_on"] == 24 and rec["split_ms"]["compile_converge_on"] <= rec["split_ms"]["compile"]
    json.dumps(rec)
    assert "reference ok (200 inputs)" in suite.progress_line(rec)


def test_resume_keeps_the_passed_cases_and_runs_the_failed_ones_again(monkeypatch, tmp_path):
    ran = []

    def measured(case, data, emit):
        ran.append(case.id)
        return fake_case(id=case.id)

    monkeypatch.setattr(suite, "run_case", measured)
    first, second = (c.id for c in suite.QUICK)
    previous = {"cases": [{"id": first, "pass": True, "status": "ok", "kept": True},
                          {"id": second, "pass": False, "status": "failed", "note": "boom"}]}
    cfg = SimpleNamespace(max_minutes=None, quick=True, limit=None, data_dir=tmp_path)
    previous["command"] = "sparsegen bench graphchallenge"
    doc = suite.run(cfg, env={"command": "sparsegen bench graphchallenge --resume"}, emit=lambda line: None,
                    previous=previous)
    assert ran == [second]
    assert doc["runs"] == ["sparsegen bench graphchallenge", "sparsegen bench graphchallenge --resume"]
    assert doc["cases"][0]["kept"] and doc["cases"][1]["status"] == fake_case()["status"]
