"""The graphchallenge suite's CPU side: case plan, reports (no GPU here)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from sparsegen.bench import SUITES, get_suite
from sparsegen.bench import graphchallenge as suite


def fake_case(**over):
    c = {"id": "official/n1024-l120/60000-mnist", "neurons": 1024, "layers": 120, "inputs": 60000,
         "input_nnz": 6379488, "edges": 3932160, "specs": ["spdnn_sliced_ell.x"], "survivors": 1833,
         "alive_per_layer": [1833], "ms": {"sparsegen": 5.8, "cusparse_loop": 49.9, "sparsegen_runtime_trips": 5.9},
         "teraedges_per_s": {"sparsegen": 40.7, "cusparse_loop": 4.7, "sparsegen_runtime_trips": 40.0},
         "split_ms": {"preprocess": 4000.0, "compile": 200.0, "transfer": 20.0, "kernels": 5.2, "pruning": 0.6},
         "speedup_vs_cusparse_loop": 8.6, "cusparse_loop_same_answer": True, "runtime_trips_same_answer": True,
         "reference_inputs": 60000, "reference_check": True, "official_check": None, "pass": True, "status": "ok"}
    c.update(over)
    return c


def test_registered_and_planned():
    assert "graphchallenge" in SUITES and get_suite("graphchallenge") is suite
    sizes = {(c.neurons, c.layers) for c in suite.CASES}
    assert {(1024, 120), (4096, 120), (16384, 120), (65536, 120), (1024, 1920), (4096, 1920)} <= sizes
    assert suite.QUICK[0].inputs == "official" and any(c.runtime_variant for c in suite.QUICK)


def test_reports(tmp_path):
    doc = {"suite": "graphchallenge", "gpu": "G", "driver": "d", "cuda": "13.0", "revision": "a" * 40,
           "date": "2026-11-22", "command": "sparsegen bench graphchallenge", "truncated": False,
           "cases": [fake_case(), fake_case(id="official/n1024-l120/1200-official-images", official_check="PASSED"),
                     {"id": "generated/n65536-l120/2000-mnist", "pass": False, "status": "failed", "note": "boom"}]}
    paths = suite.write_reports(doc, tmp_path)
    assert json.loads(paths["json"].read_text())["cases"][0]["teraedges_per_s"]["sparsegen"] == 40.7
    md = paths["md"].read_text()
    assert "| official/n1024-l120/60000-mnist | 60000 | 3932160 | 5.800 | 40.70 | 49.900 | 4.70 | 8.60x |" in md
    assert "runtime-trips ms" in md and "failed: boom" in md and "| PASSED |" in md
    assert any("8.60x" in line for line in suite.summary_lines(doc))


def test_failing_case_is_recorded_and_the_suite_goes_on(monkeypatch, tmp_path):
    def boom(case, data, emit):
        raise RuntimeError(f"no GPU for {case.id}")

    monkeypatch.setattr(suite, "run_case", boom)
    cfg = SimpleNamespace(max_minutes=None, quick=True, limit=None, data_dir=tmp_path)
    lines = []
    doc = suite.run(cfg, env={}, emit=lines.append)
    assert [c["status"] for c in doc["cases"]] == ["failed", "failed"]
    assert "no GPU" in doc["cases"][0]["note"] and len(lines) == 2
