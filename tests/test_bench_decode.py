"""The decode suite's CPU side: the case plan, its options, the run loop with a stand-in example
(synthetic timings: no torch, no GPU), the records and the reports. The real example on the CPU
is tests/test_sparse_decode.py's."""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from sparsegen import bench
from sparsegen.bench import BenchConfig, get_suite
from sparsegen.bench import decode as suite
from sparsegen.errors import SparsegenError


def config(**over):
    cfg = BenchConfig(suite="decode", data_dir=None)
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def test_registered_and_planned():
    assert get_suite("decode") is suite
    full = suite.plan(config())
    assert len(full) == 2 * 4 * 4  # models x sparsities x batches, fp16
    assert {c["batch"] for c in full} == {1, 8, 16, 32} and {c["sparsity"] for c in full} == {0.5, 0.7, 0.8, 0.9}
    assert all(c["prompt"] == 512 and c["new_tokens"] == 128 and c["layers"] is None for c in full)
    assert full[0]["id"] == "opt-1.3b/float16/s0.5/b1" and full[-1]["id"] == "opt-6.7b/float16/s0.9/b32"
    quick = suite.plan(config(quick=True))
    assert [c["id"] for c in quick] == ["opt-1.3b-l4/float16/s0.8/b1", "opt-1.3b-l4/float16/s0.8/b16"]
    both = suite.plan(config(dtypes=("float16", "bfloat16"), models=("opt-6.7b",), batches=(1, 16),
                             sparsities=(0.8,), layers=8, prompt=64, new_tokens=16))
    assert [c["id"] for c in both] == ["opt-6.7b-l8/float16/s0.8/b1", "opt-6.7b-l8/float16/s0.8/b16",
                                       "opt-6.7b-l8/bfloat16/s0.8/b1", "opt-6.7b-l8/bfloat16/s0.8/b16"]
    assert all(c["prompt"] == 64 and c["new_tokens"] == 16 for c in both)
    assert len(suite.plan(config(limit=3))) == 3


def test_options_parse_and_refuse():
    assert suite.parse_sparsities("0.5,80%,90") == (0.5, 0.8, 0.9)
    assert suite.parse_batches("1, 8,8") == (1, 8) and suite.parse_models("opt-6.7b") == ("opt-6.7b",)
    assert suite.parse_count("12", "layers") == 12
    with pytest.raises(SparsegenError, match=r"--sparsity: '1\.0' is not a sparsity in \(0, 1\)"):
        suite.parse_sparsities("0.5,1.0")
    with pytest.raises(SparsegenError, match="--batch: '0' is not a positive integer"):
        suite.parse_batches("0")
    with pytest.raises(SparsegenError, match="--models: 'opt-175b' is not one of the suite's models"):
        suite.parse_models("opt-175b")
    with pytest.raises(SparsegenError, match="--new-tokens: 'x'"):
        suite.parse_count("x", "new-tokens")


def parsed(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_options_reach_the_suite_and_other_suites_refuse_them(monkeypatch, tmp_path):
    seen = {}

    def stop(cfg, **kw):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(bench, "gpu_environment", lambda: {"gpu": "G", "cuda": "13.0"})
    monkeypatch.setattr(suite, "run", stop)
    with pytest.raises(SystemExit):
        bench.run(parsed("decode", "--batch", "1,32", "--layers", "6", "--new-tokens", "32", "--sparsity", "0.7",
                         "--models", "opt-6.7b", "--out", str(tmp_path)))
    cfg = seen["cfg"]
    assert (cfg.batches, cfg.layers, cfg.new_tokens, cfg.sparsities, cfg.models) == ((1, 32), 6, 32, (0.7,),
                                                                                     ("opt-6.7b",))
    with pytest.raises(SparsegenError, match=r"--layers: suite llm has no such filter \(decode has\)"):
        bench.run(parsed("llm", "--layers", "4"))
    with pytest.raises(SparsegenError, match="--dtypes: suite decode does not run float32"):
        bench.run(parsed("decode", "--dtypes", "float32"))


class FakeExample:
    """The example's interface with synthetic results: dense 100 tok/s-ish, sparse faster, one
    failing sparsity (0.9: logits off), one raising batch (32)."""

    def __init__(self):
        self.calls = []

    def build(self, model, dtype, device, layers):
        self.calls.append(("build", model, dtype, layers))
        return SimpleNamespace(model=model, config=SimpleNamespace(num_hidden_layers=layers or 24))

    def pruned_pair(self, base, sparsity, *, backend, workers, ns):
        self.calls.append(("prune", sparsity, tuple(ns)))
        self.sparsity = sparsity
        layers = (SimpleNamespace(name="model.decoder.layers.0.self_attn.q_proj"),)
        return "dense", "sparse", SimpleNamespace(layers=layers)

    def host_time(self, report):
        return {"eager": 6.5, "dispatcher": 11.0, "graph_replay": 0.02, "dense_linear": 9.25, "spec": "tiled_csl_spmm.x",
                "layer": "model.decoder.layers.0.self_attn.q_proj 2048x2048"}

    def measure(self, dense, sparse, report, *, batch, prompt, new_tokens, repeats, device, backend, graphs):
        self.calls.append(("measure", batch))
        if batch == 32:
            raise RuntimeError("CUDA out of memory")
        s = self.calls.count(("measure", batch))
        dense_s, sparse_s = [1.0, 1.2, 0.9], [0.5, 0.6, 0.4]
        error = 0.5 if self.sparsity == 0.9 else 3e-3
        return {"seconds": {"dense": dense_s, "sparse": sparse_s}, "pass": error <= 2e-2, "max_error": error,
                "mean_error": error / 2, "argmax_agreement": 0.99, "tolerance": 2e-2, "setup_s": {"dense": 1, "sparse": s},
                "bytes": {"dense": 4e9, "sparse": 1.5e9}, "specs": ["tiled_csl_spmm"]}


def test_run_records_every_case_and_goes_on_past_failures():
    example, lines, saved = FakeExample(), [], []
    cfg = config(models=("opt-1.3b",), sparsities=(0.8, 0.9), batches=(1, 32), workers=2)
    doc = suite.run(cfg, env={"gpu": "G"}, emit=lines.append, checkpoint=lambda d: saved.append(len(d["cases"])),
                    example=example)
    assert [c["id"] for c in doc["cases"]] == ["opt-1.3b/float16/s0.8/b1", "opt-1.3b/float16/s0.8/b32",
                                               "opt-1.3b/float16/s0.9/b1", "opt-1.3b/float16/s0.9/b32"]
    assert [c["status"] for c in doc["cases"]] == ["ok", "failed", "failed", "failed"]
    assert example.calls[:3] == [("build", "opt-1.3b", "float16", None), ("prune", 0.8, (1, 32)), ("measure", 1)]
    assert [c for c in example.calls if c[0] == "build"] == [example.calls[0]]  # one build for both sparsities
    first = doc["cases"][0]
    assert first["tokens_per_s"] == {"dense": 128 / 1.0, "sparse": 128 / 0.5}  # medians
    assert first["tokens_per_s_best"] == {"dense": 128 / 0.9, "sparse": 128 / 0.4}
    assert first["speedup"] == pytest.approx(2.0) and first["memory_saved"] == pytest.approx(0.625)
    assert first["ms_per_token"]["sparse"] == pytest.approx(1e3 * 0.5 / 128)
    assert "CUDA out of memory" in doc["cases"][1]["note"]
    assert "differ by 0.5 > tolerance 0.02" in doc["cases"][2]["note"]
    assert doc["host_us"]["eager"] == 6.5 and saved == [1, 2, 3, 4]
    assert any("eager 6.5 us" in line and "dense nn.Linear eager 9.2 us" in line for line in lines)
    assert any("2.00x" in line for line in lines)
    assert "the dense `nn.Linear` of that shape, eager, 9.2 µs" in suite.markdown(doc)
    assert any(line.startswith("opt-1.3b float16: built (24 decoder layers) in ") for line in lines)
    assert any(line.startswith("opt-1.3b s0.8: pruned 1 Linears and compiled their kernels for N = 1, 32 in ")
               for line in lines)
    assert suite.exit_status(doc) == 1


def test_resume_keeps_passed_cases_and_reruns_the_rest():
    example = FakeExample()
    cfg = config(models=("opt-1.3b",), sparsities=(0.8,), batches=(1, 16))
    previous = {"cases": [{"id": "opt-1.3b/float16/s0.8/b1", "status": "ok", "pass": True, "kept": True},
                          {"id": "opt-1.3b/float16/s0.8/b16", "status": "failed", "pass": False}],
                "host_us": {"eager": 5.0}}
    doc = suite.run(cfg, env={}, emit=lambda line: None, previous=previous, example=example)
    assert doc["cases"][0]["kept"] and doc["cases"][1]["status"] == "ok"
    assert ("measure", 1) not in example.calls and ("measure", 16) in example.calls
    assert doc["host_us"] == {"eager": 5.0} and suite.exit_status(doc) == 0
    assert suite.run(config(models=("opt-1.3b",), sparsities=(0.8,), batches=(1,)), env={}, emit=print,
                     previous=previous, example=None)["cases"][0]["kept"]  # nothing to run: no example loaded


def test_deadline_stops_before_the_next_sparsity():
    ticks = iter([0.0, 0.0, 1e9, 1e9, 1e9])
    cfg = config(models=("opt-1.3b",), sparsities=(0.8, 0.9), batches=(1,), max_minutes=1)
    lines = []
    doc = suite.run(cfg, env={}, emit=lines.append, example=FakeExample(), clock=lambda: next(ticks))
    assert doc["truncated"] and [c["id"] for c in doc["cases"]] == ["opt-1.3b/float16/s0.8/b1"]
    assert any("--max-minutes reached" in line for line in lines)


def test_reports(tmp_path):
    doc = suite.run(config(models=("opt-1.3b",), sparsities=(0.8, 0.9), batches=(1, 16, 32), layers=4),
                    env={"gpu": "NVIDIA H200", "driver": "580", "cuda": "13.0", "revision": "a" * 40,
                         "date": "2026-11-29", "command": "sparsegen bench decode"},
                    emit=lambda line: None, example=FakeExample())
    paths = suite.write_reports(doc, tmp_path)
    stored = json.loads(paths["json"].read_text())
    assert stored["suite"] == "decode" and len(stored["cases"]) == 6 and stored["host_us"]["dispatcher"] == 11.0
    md = paths["md"].read_text()
    assert "## opt-1.3b (first 4 layers) float16: speedup (sparse over dense tokens/s)" in md
    assert "| sparsity | batch 1 | batch 16 |" in md and "| 80% | 2.00× | 2.00× |" in md
    assert "| 80% | 1 | 256.0 | 128.0 | 2.00× | 4.00 | 1.50 | 62% | 3.00e-03 | 0.990 | tiled_csl_spmm |" in md
    assert "eager 6.5 µs" in md and "inside a replayed CUDA graph 0.020 µs" in md
    assert "- opt-1.3b-l4/float16/s0.8/b32: RuntimeError: CUDA out of memory" in md
    assert "| 90% |" not in md  # failed cases are in no table
    summary = suite.summary_lines(doc)
    assert summary[0] == "decode: 2 of 6 cases passed"
    assert "geomean speedup 2.00x over 2 cases, lowest 2.00x" in summary[1]
    assert paths["png"] is not None or "matplotlib" in paths["png_note"]
    doc["cases"][0]["max_error"] = float("nan")  # logits gone NaN: recorded as null, not a crash
    assert json.loads(suite.write_json(doc, tmp_path).read_text())["cases"][0]["max_error"] is None


def test_load_example_finds_the_checkouts_and_says_when_missing(tmp_path):
    assert suite.EXAMPLE.is_file()
    with pytest.raises(SparsegenError, match="run it from a checkout"):
        suite.load_example(tmp_path / "sparse_decode.py")
