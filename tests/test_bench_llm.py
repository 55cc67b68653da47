"""CPU tests of the `llm` benchmark suite (sparsegen.bench.llm): no torch, no GPU.

Case enumeration and filters, the W generators, safetensors reading, the
sampled-row correctness check, bandwidth arithmetic, the run loop with a fake executor (resume,
deadline, failures), compiling ahead in worker processes, and the report tables.
"""
from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import bench
from sparsegen.bench import executor, llm, llm_gpu, llm_report, prefetch, report, weights
from sparsegen.errors import FormatError, SparsegenError


@pytest.fixture(autouse=True)
def no_installed_model(monkeypatch):
    """Runs must not pick up a model package that happens to be installed here."""
    monkeypatch.setattr(weights, "MODEL_PACKAGE", "sparsegen_no_such_model_package")
    monkeypatch.delenv(weights.MODEL_ENV, raising=False)


def cfg(**kw) -> bench.BenchConfig:
    return bench.BenchConfig(suite="llm", data_dir=None, **kw)


# --------------------------------------------------------------------------- case enumeration

def test_full_plan_counts_and_order():
    work = llm.plan(cfg())
    assert len(work.items) == 12 * 5
    assert len(work.cases) == 12 * 5 * 6
    assert {(w.rows, w.cols) for w, _ in work.items} == set(llm.SHAPES)
    assert all(w.source == "opt" for w, _ in work.items)
    # every W's N run back to back, in order, float16 only by default
    for w, cases in work.items:
        assert [(c.dtype, c.n) for c in cases] == [("float16", n) for n in (8, 16, 32, 64, 128, 256)]
        assert all(c.weight is w for c in cases)
    ids = [w.id for w, _ in work.items]
    assert len(set(ids)) == len(ids)
    assert ids[:5] == [f"opt/7168x28672/{s}" for s in ("0.5", "0.6", "0.7", "0.8", "0.9")]
    assert "no model given" in work.notes[0]
    keys = [c.key for c in work.cases]
    assert len(set(keys)) == len(keys) == 360


def test_quick_is_a_representative_slice():
    work = llm.plan(cfg(quick=True))
    assert [(w.rows, w.cols) for w, _ in work.items][::5] == list(llm.QUICK_SHAPES)
    assert {w.sparsity for w, _ in work.items} == set(llm.SPARSITIES)
    assert {c.n for c in work.cases} == {16, 64}
    assert len(work.cases) == 2 * 5 * 2


def test_filters_narrow_the_plan():
    shapes = llm.parse_shapes("7168x7168, 28672X7168,7168x7168")
    assert shapes == ((7168, 7168), (28672, 7168))
    sps = llm.parse_sparsities("0.5,70,0.9")
    assert sps == (0.5, 0.7, 0.9)
    work = llm.plan(cfg(shapes=shapes, sparsities=sps, ns=(8, 64), dtypes=("float16", "bfloat16")))
    # canonical order (the suite's), whatever order the filters gave
    assert [w.id for w, _ in work.items] == [f"opt/{sh}/{s}" for sh in ("28672x7168", "7168x7168")
                                             for s in ("0.5", "0.7", "0.9")]
    assert [(c.dtype, c.n) for c in work.items[0][1]] == [("float16", 8), ("float16", 64),
                                                          ("bfloat16", 8), ("bfloat16", 64)]
    assert len(llm.plan(cfg(limit=3)).items) == 3


@pytest.mark.parametrize("text,match", [
    ("7168x7169", "not one of the suite's shapes"), ("big", "not one of"), (",", "empty")])
def test_bad_shapes(text, match):
    with pytest.raises(SparsegenError, match=match):
        llm.parse_shapes(text)


@pytest.mark.parametrize("text,match", [("0.55", "not one of"), ("x", "not a number"),
                                        ("", "empty")])
def test_bad_sparsities(text, match):
    with pytest.raises(SparsegenError, match=match):
        llm.parse_sparsities(text)


def test_plan_rejects_other_dtypes_and_ops():
    with pytest.raises(SparsegenError, match="float32"):
        llm.plan(cfg(dtypes=("float32",)))
    with pytest.raises(SparsegenError, match="SpMM only"):
        llm.plan(cfg(ops=("sddmm",)))


# --------------------------------------------------------------------------- generators

def test_random_pattern_density_sorted_seeded():
    m, k = 300, 257
    indptr, idx = weights.random_pattern(m, k, 0.3, seed=11, chunk_elems=1000)  # many chunks
    assert indptr.shape == (m + 1,) and indptr[0] == 0 and indptr[-1] == idx.size
    assert idx.dtype == np.int32 and idx.min() >= 0 and idx.max() < k
    assert abs(idx.size / (m * k) - 0.3) < 0.01
    rows = np.repeat(np.arange(m), np.diff(indptr))
    key = rows.astype(np.int64) * k + idx
    assert (np.diff(key) > 0).all()          # sorted within rows, no duplicates
    again = weights.random_pattern(m, k, 0.3, seed=11, chunk_elems=1000)
    assert (again[0] == indptr).all() and (again[1] == idx).all()
    other = weights.random_pattern(m, k, 0.3, seed=12, chunk_elems=1000)
    assert other[1].size != idx.size or (other[1] != idx).any()
    # columns are used uniformly: no column left empty at this density
    assert np.bincount(idx, minlength=k).min() > 0


def test_random_pattern_edges():
    indptr, idx = weights.random_pattern(20, 30, 0.0, seed=1)
    assert idx.size == 0 and (indptr == 0).all()
    indptr, idx = weights.random_pattern(20, 30, 1.0, seed=1)
    assert idx.size == 600 and (idx.reshape(20, 30) == np.arange(30)).all()
    assert weights.random_pattern(0, 5, 0.5, seed=1)[1].size == 0


def test_random_weight_values_and_canonical():
    A = weights.random_weight(400, 500, 0.8, seed=3)
    assert A.shape == (400, 500) and A.dtype == np.float32 and A.has_canonical_format
    assert abs(1 - A.nnz / 2e5 - 0.8) < 0.01
    assert abs(A.data.mean()) < 0.05 and abs(A.data.std() - 1) < 0.05
    B = weights.random_weight(400, 500, 0.8, seed=3)
    assert (A.indices == B.indices).all() and (A.data == B.data).all()
    w = llm.Weight("opt/7168x7168/0.7", "opt", 7168, 7168, 0.7)
    assert w.seed == llm.Weight("opt/7168x7168/0.7", "opt", 7168, 7168, 0.7).seed
    assert w.seed != llm.Weight("opt/7168x7168/0.8", "opt", 7168, 7168, 0.8).seed


def test_as_dtype_rounds_values():
    A = sp.csr_matrix(np.array([[1.0001, 0.0], [0.0, 3.14159]], dtype=np.float32))
    h = weights.as_dtype(A, "float16")
    assert (h.data == A.data.astype(np.float16).astype(np.float32)).all()
    b = weights.as_dtype(A, "bfloat16")
    assert b.data[0] == 1.0 and b.data[1] == pytest.approx(3.140625)
    assert (h.indices == A.indices).all() and A.data[0] == np.float32(1.0001)  # A untouched


# --------------------------------------------------------------------------- model weights

def write_safetensors(path: Path, tensors: dict, raw_dtype: dict | None = None) -> Path:
    """A minimal .safetensors writer: JSON header, then the raw little-endian buffers."""
    raw_dtype = raw_dtype or {}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        code = raw_dtype.get(name) or {"float32": "F32", "float16": "F16", "int64": "I64"}[arr.dtype.name]
        data = arr.tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


@pytest.fixture
def model_dir(tmp_path):
    rng = np.random.default_rng(5)
    d = tmp_path / "minilm" / "model"
    d.mkdir(parents=True)
    t = {}
    for layer in (0, 2, 10):
        t[f"encoder.layer.{layer}.attention.self.query.weight"] = rng.standard_normal((8, 8)).astype(np.float32)
        t[f"encoder.layer.{layer}.intermediate.dense.weight"] = rng.standard_normal((16, 8)).astype(np.float32)
        t[f"encoder.layer.{layer}.output.dense.weight"] = rng.standard_normal((8, 16)).astype(np.float16)
        t[f"encoder.layer.{layer}.output.dense.bias"] = rng.standard_normal(8).astype(np.float32)
    t["embeddings.word_embeddings.weight"] = rng.standard_normal((50, 8)).astype(np.float32)
    t["embeddings.position_ids"] = np.arange(8, dtype=np.int64).reshape(1, 8)
    bf = (rng.standard_normal((8, 8)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    t["pooler.dense.weight"] = bf
    write_safetensors(d / "model.safetensors", t, {"pooler.dense.weight": "BF16"})
    return d, t


def test_model_weights_filter_and_order(model_dir):
    d, t = model_dir
    found = weights.model_weights(d.parent)  # found recursively
    names = [n for _, n, _ in found]
    assert names == [f"encoder.layer.{i}.{r}.weight" for i in (0, 2, 10)
                     for r in ("attention.self.query", "intermediate.dense", "output.dense")] + \
        ["pooler.dense.weight"]
    assert dict((n, s) for _, n, s in found)["encoder.layer.2.intermediate.dense.weight"] == (16, 8)
    with pytest.raises(SparsegenError, match="no .safetensors"):
        weights.model_weights(d.parent.parent / "nowhere")


def test_read_tensor_own_reader(model_dir, monkeypatch):
    d, t = model_dir
    f = d / "model.safetensors"
    real = weights.importlib.util.find_spec
    monkeypatch.setattr(weights.importlib.util, "find_spec",
                        lambda name, *a: None if name == "safetensors" else real(name, *a))
    q = weights.read_tensor(f, "encoder.layer.2.attention.self.query.weight")
    assert q.dtype == np.float32 and (q == t["encoder.layer.2.attention.self.query.weight"]).all()
    h = weights.read_tensor(f, "encoder.layer.0.output.dense.weight")
    assert (h == t["encoder.layer.0.output.dense.weight"].astype(np.float32)).all()
    b = weights.read_tensor(f, "pooler.dense.weight")
    assert (b == (t["pooler.dense.weight"].astype(np.uint32) << 16).view(np.float32)).all()
    with pytest.raises(FormatError, match="tensor 'nope'"):
        weights.read_tensor(f, "nope")


def test_read_tensor_with_safetensors_package(model_dir):
    pytest.importorskip("safetensors")
    d, t = model_dir
    q = weights.read_tensor(d / "model.safetensors", "encoder.layer.0.intermediate.dense.weight")
    assert (q == t["encoder.layer.0.intermediate.dense.weight"]).all()


def test_malformed_safetensors(tmp_path):
    (tmp_path / "short.safetensors").write_bytes(b"abc")
    with pytest.raises(FormatError, match="8-byte"):
        weights.safetensors_header(tmp_path / "short.safetensors")
    (tmp_path / "long.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(FormatError, match="header length"):
        weights.safetensors_header(tmp_path / "long.safetensors")
    (tmp_path / "json.safetensors").write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(FormatError, match="JSON"):
        weights.safetensors_header(tmp_path / "json.safetensors")


def test_resolve_model(tmp_path):
    p, why = weights.resolve_model(None, environ={})
    assert p is None and "skipped" in why
    assert weights.resolve_model(str(tmp_path), environ={}) == (tmp_path, "--model")
    assert weights.resolve_model(None, environ={weights.MODEL_ENV: str(tmp_path)})[0] == tmp_path
    with pytest.raises(SparsegenError, match="no such file"):
        weights.resolve_model(str(tmp_path / "absent"), environ={})


def test_plan_with_model(model_dir):
    d, _ = model_dir
    work = llm.plan(cfg(model=str(d), shapes=((7168, 7168),)))
    model = [(w, cs) for w, cs in work.items if w.source == "model"]
    assert len(model) == 10 * 5                       # 10 Linear weights x 5 sparsities
    assert all([c.n for c in cs] == [16, 64] for _, cs in model)
    w = model[0][0]
    assert w.id == "model/model/encoder.layer.0.attention.self.query.weight/0.5"
    A = w.load()
    assert A.shape == (8, 8) and A.nnz == 32
    quick = llm.plan(cfg(model=str(d), quick=True))
    assert {(w.rows, w.cols) for w, _ in quick.items if w.source == "model"} == {(8, 8), (16, 8), (8, 16)}
    assert "model weights from --model" in " ".join(quick.notes)


# --------------------------------------------------------------------------- correctness check

def small_case(n=8, m=500, k=300, s=0.7, dtype="float16"):
    w = llm.Weight(f"opt/{m}x{k}/{s:g}", "opt", m, k, s)
    return llm.Case(w, dtype, n)


def test_check_rows_and_operand_seeded():
    case = small_case()
    rows = llm_gpu.check_rows(case, 500)
    assert len(rows) == llm.CHECK_ROWS and (np.diff(rows) > 0).all() and rows.max() < 500
    assert (rows == llm_gpu.check_rows(case, 500)).all()
    assert (llm_gpu.check_rows(case, 100) == np.arange(100)).all()
    X = llm_gpu.operand(case, 300)
    assert X.shape == (300, 8) and X.dtype == np.float32
    assert (X == X.astype(np.float16).astype(np.float32)).all()  # rounded to the dtype
    assert (X == llm_gpu.operand(case, 300)).all()


def test_sample_error_passes_and_fails():
    case = small_case()
    A = weights.as_dtype(weights.random_weight(500, 300, 0.7, seed=1), "float16")
    X = llm_gpu.operand(case, 300)
    rows = llm_gpu.check_rows(case, 500)
    Y = (A @ X).astype(np.float16)                 # what a correct fp16 kernel returns
    err = llm_gpu.sample_error(Y[rows], A, X, rows)
    assert 0 < err < 1e-3
    bad = Y.astype(np.float32)
    bad[rows[3], :] += 10.0                        # one wrong sampled row
    assert llm_gpu.sample_error(bad[rows], A, X, rows) > llm.TOLERANCE
    assert llm_gpu.sample_error(np.zeros((len(rows), 8)), A, X, rows) == pytest.approx(1.0)


# --------------------------------------------------------------------------- bytes and bandwidth

def test_bytes_arithmetic():
    assert llm_gpu.operand_bytes(10, 20, 4) == 2 * (20 * 4 + 10 * 4)
    assert llm_gpu.dense_bytes(10, 20, 4) == 2 * 200 + 240
    assert llm_gpu.csr_bytes(10, 20, 4, nnz=50) == 4 * 11 + 6 * 50 + 240
    assert executor.fraction_of(3e9, 1.0, 3e12) == pytest.approx(1.0)
    assert executor.fraction_of(1.5e9, 1.0, 3e12) == pytest.approx(0.5)
    assert executor.fraction_of(None, 1.0, 3e12) is None and executor.fraction_of(1e9, 0, 3e12) is None
    assert executor.fraction_of(1e9, 1.0, None) is None
    bw = executor.CopyBandwidth(size=1 << 30, median_ms=0.725, min_ms=0.7, runs=30)
    assert bw.bytes_per_s == pytest.approx(2 * 2**30 / 0.725e-3)
    d = bw.to_dict()
    assert d["tb_per_s"] == pytest.approx(2.9618, abs=1e-3) and d["runs"] == 30


def record(case, *, error=1e-4, fam_err=None, ms=None, status=None, final=False, nbytes=None):
    info = {"shape": [case.weight.rows, case.weight.cols], "nnz": 1000, "sparsity": 0.7, "row_cov": 0.1}
    rec = llm.base_record(case, info)
    rec.update({"error": error, "ms": ms or {"sparsegen": 1.0, "cublas": 2.0, "cusparse": 20.0,
                                             llm.CSL: 1.5, llm.BITMAP: 1.0},
                "family_error": fam_err if fam_err is not None else {llm.CSL: 2e-4},
                "bytes": nbytes or {"sparsegen": 3e9, "cublas": 4e9}})
    if status:
        rec["status"] = status
    if final:
        rec["_final_status"] = True
    return rec


def test_finalize_speedups_fractions_status():
    case = small_case()
    ok = llm.finalize(record(case), copy_bytes_per_s=3e12)
    assert ok["pass"] and ok["status"] == "ok"
    assert ok["speedup"] == {"vs_cusparse": 20.0, "vs_cublas": 2.0, "csl_vs_cublas": 2 / 1.5,
                             "bitmap_vs_cublas": 2.0, "bitmap_vs_csl": 1.5}
    assert ok["bandwidth_fraction"]["sparsegen"] == pytest.approx(1.0)
    assert ok["bandwidth_fraction"]["cublas"] == pytest.approx(4e9 / 2e-3 / 3e12)
    assert set(report.REQUIRED_CASE_KEYS) <= set(ok)
    wrong = llm.finalize(record(case, error=0.5))
    assert not wrong["pass"] and wrong["status"] == "failed" and "sparsegen error 0.5" in wrong["note"]
    fam = llm.finalize(record(case, fam_err={llm.BITMAP: 0.2}))
    assert fam["status"] == "failed" and "tiled_bitmap_spmm error 0.2" in fam["note"]
    nan = llm.finalize(record(case, error=float("nan")))
    assert nan["status"] == "failed" and nan["error"] is None and "non-finite" in nan["note"]
    uns = llm.finalize(record(case, error=None, status="unsupported", final=True))
    assert uns["status"] == "unsupported" and not uns["pass"] and "_final_status" not in uns
    none = llm.finalize(record(case, error=None))
    assert none["status"] == "failed" and none["note"] == "no result"
    missing = llm.finalize(record(case, ms={"sparsegen": 1.0}))
    assert missing["speedup"]["vs_cublas"] is None and missing["ms"]["cublas"] is None


# --------------------------------------------------------------------------- the run loop

class FakeWeight:
    def __init__(self, ex, A):
        self.ex, self.A = ex, A

    def run(self, case, cache=None):
        self.ex.seen.append(case.key)
        self.ex.caches.append(cache)
        Path(cache).mkdir(parents=True, exist_ok=True)  # what compile() would leave there (all N)
        (Path(cache) / "plan.bin").write_bytes(b"x")
        if case.id == self.ex.boom:
            raise RuntimeError("kernel exploded\nsecond line")
        A = weights.as_dtype(self.A, case.dtype)
        M, K = A.shape
        X = llm_gpu.operand(case, K)
        rows = llm_gpu.check_rows(case, M)
        Y = (A @ X).astype(np.float16).astype(np.float32)
        if case.id == self.ex.wrong:
            Y[rows[0]] *= -1.0                        # a sign error in one sampled row
        err = llm_gpu.sample_error(Y[rows], A, X, rows)
        sel = llm.BITMAP if case.weight.sparsity <= 0.8 else "dense_gemm"
        ms = {"sparsegen": 1.0 / (1 + case.weight.sparsity), "cublas": 1.0, "cusparse": 10.0,
              llm.CSL: 1.3, llm.BITMAP: 1.0}
        return {"spec": f"{sel}.fake.n{case.n}", "family": sel, "reason": "fake", "ms": ms,
                "ms_min": dict(ms), "error": err, "family_error": {llm.CSL: err},
                "bytes": {"sparsegen": A.nnz * 2 + llm_gpu.operand_bytes(M, K, case.n),
                          "cublas": llm_gpu.dense_bytes(M, K, case.n)},
                "checked_rows": len(rows), "checked_columns": case.n}

    def close(self):
        self.ex.closed += 1


class FakeExecutor:
    baselines = {"cublas": "fake"}
    arch = "sm_90"

    def __init__(self, boom=None, wrong=None, lost=None):
        self.seen, self.caches, self.closed, self.bw_calls = [], [], 0, 0
        self.boom, self.wrong, self.lost = boom, wrong, lost

    def copy_bandwidth(self):
        self.bw_calls += 1
        return executor.CopyBandwidth(size=1 << 30, median_ms=0.75, min_ms=0.7, runs=20)

    def weight(self, A):
        return FakeWeight(self, A)

    def context_lost(self):
        return self.lost

    def close(self):
        pass


ENV = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "1", "cuda": "13.0", "revision": None,
       "date": "2025-01-01", "command": "sparsegen bench llm --quick", "torch": "x"}


@pytest.fixture
def small_weights(monkeypatch):
    """Every W loads as a small seeded random matrix of its sparsity (milliseconds)."""
    loaded = []

    def load(self):
        loaded.append(self.id)
        if self.id == "opt/7168x7168/0.6":
            raise OSError("disk full")
        return weights.random_weight(300, 200, self.sparsity, self.seed)

    monkeypatch.setattr(llm.Weight, "load", load)
    return loaded


def test_run_loop_records_every_case(tmp_path, small_weights):
    ex = FakeExecutor(boom="opt/28672x7168/0.5", wrong="opt/28672x7168/0.9")
    lines, checkpoints = [], []
    doc = llm.run(cfg(quick=True, workers=0), env=ENV, executor=ex, emit=lines.append,
                  checkpoint=lambda d: checkpoints.append(len(d["cases"])), scratch=tmp_path / "s")
    assert len(doc["cases"]) == doc["cases_planned"] == 20 and not doc["truncated"]
    assert ex.bw_calls == 1 and doc["copy_bandwidth"]["runs"] == 20
    assert "copy bandwidth" in lines[0] and len(lines) == 21
    by = {(c["id"], c["n"]): c for c in doc["cases"]}
    assert all(by[("opt/7168x7168/0.6", n)]["status"] == "failed"
               and "load failed: OSError: disk full" in by[("opt/7168x7168/0.6", n)]["note"]
               for n in (16, 64))
    boom = by[("opt/28672x7168/0.5", 16)]
    assert boom["status"] == "failed" and "kernel exploded" in boom["note"] and "second" not in boom["note"]
    wrong = by[("opt/28672x7168/0.9", 64)]
    assert wrong["status"] == "failed" and wrong["error"] > llm.TOLERANCE and "tolerance" in wrong["note"]
    good = [c for c in doc["cases"] if c["status"] == "ok"]
    assert len(good) == 20 - 2 - 2 - 2
    assert all(c["checked_rows"] == llm.CHECK_ROWS and c["checked_columns"] == c["n"] for c in good)
    assert all(0 < c["bandwidth_fraction"]["sparsegen"] for c in good)
    assert checkpoints and checkpoints[-1] == 20 and len(checkpoints) == 18  # after each measured case
    assert ex.closed == 9                                   # every loaded W released
    assert not any(Path(c).exists() for c in ex.caches)     # scratch folders removed
    # the same W's cases came back to back
    order = [k[0] for k in ex.seen]
    assert order == sorted(order, key=order.index)
    paths = llm.write_reports(doc, tmp_path / "out")
    saved = json.loads(paths["json"].read_text())
    assert saved["suite"] == "llm" and len(saved["cases"]) == 20
    for c in saved["cases"]:
        assert set(report.REQUIRED_CASE_KEYS) <= set(c)
    assert llm.exit_status(doc) == 1


def test_deadline_truncates_and_resume_finishes(tmp_path, small_weights):
    ticks = iter(range(0, 10**6, 7))

    first = FakeExecutor()
    doc1 = llm.run(cfg(quick=True, workers=0, max_minutes=1.0), env=ENV, executor=first,
                   emit=lambda s: None, clock=lambda: float(next(ticks)), scratch=tmp_path)
    assert doc1["truncated"] and 0 < len(doc1["cases"]) < doc1["cases_planned"]
    assert "Truncated run" in llm_report.markdown(doc1)
    saved = json.loads(llm.write_json(doc1, tmp_path / "r").read_text())
    second = FakeExecutor()
    env2 = dict(ENV, command="sparsegen bench llm --quick --resume")
    doc2 = llm.run(cfg(quick=True, workers=0), env=env2, executor=second, emit=lambda s: None,
                   previous=saved, scratch=tmp_path)
    assert not doc2["truncated"] and len(doc2["cases"]) == 20
    keys = [llm.case_key(c) for c in doc2["cases"]]
    assert keys == [c.key for c in llm.plan(cfg(quick=True)).cases]   # plan order restored
    assert len(first.seen) + len(second.seen) == 20 - 2                # the unloadable W's 2
    assert not set(first.seen) & set(second.seen)
    assert doc2["runs"] == ["sparsegen bench llm --quick", "sparsegen bench llm --quick --resume"]
    assert len(doc2["copy_bandwidth_runs"]) == 2
    # nothing left: no executor is made, nothing runs
    # a third sitting tries only the failed cases again: the unloadable W's 2, which fail again
    # before they reach the GPU
    lines, third = [], FakeExecutor()
    doc3 = llm.run(cfg(quick=True, workers=0), env=env2, executor=third, emit=lines.append,
                   previous=json.loads(llm.write_json(doc2, tmp_path / "r").read_text()),
                   scratch=tmp_path)
    assert len(doc3["cases"]) == 20 and not third.seen
    assert sum("load failed" in line for line in lines) == 2


def test_run_stops_when_context_lost(tmp_path, small_weights):
    ex = FakeExecutor(boom="opt/28672x7168/0.5", lost="illegal memory access")
    doc = llm.run(cfg(quick=True, workers=0), env=ENV, executor=ex, emit=lambda s: None,
                  scratch=tmp_path)
    assert doc["truncated"] and "illegal memory access" in doc["aborted"]
    assert len(doc["cases"]) == 1


# --------------------------------------------------------------------------- compiling ahead

def fake_job(job):
    Path(job.cache_dir).mkdir(parents=True, exist_ok=True)
    (Path(job.cache_dir) / "plan").write_text("x")
    return {c.key: {"seconds": 0.5, "errors": {}, "specs": {}} for c in job.cases}


def test_prefetcher_order_budget_release(tmp_path):
    cases = llm.plan(cfg(quick=True)).cases[:6]  # 3 weights x N = 16, 64
    assert [c.weight for c in cases[::2]] == [c.weight for c in cases[1::2]]
    pool = ThreadPoolExecutor(2)
    gate = threading.Event()
    running, most, lock = [0], [0], threading.Lock()

    def job(j):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(10)
        try:
            return fake_job(j)
        finally:
            with lock:
                running[0] -= 1

    # memory for one job at a time: the second waits for the first to finish
    one = llm.job_memory(cases[0]) * 1.5
    pf = llm.Prefetcher(cases, tmp_path, "sm_90", 2, pool=pool, memory=one, disk=1e15, job_fn=job)
    assert pf.stats["submitted"] == 1
    assert [cs for _, cs, _ in pf.jobs.values()] == [(cases[0], cases[1])]  # one job per weight
    gate.set()
    res = pf.take(cases[0])
    assert res["seconds"] == 0.5 and llm.case_dir(tmp_path, cases[0]).is_dir()
    assert pf.stats["submitted"] >= 2                # the next one started once the first was done
    pf.release(cases[0])
    assert llm.case_dir(tmp_path, cases[1]).is_dir()  # the weight's N = 64 still to measure
    assert pf.take(cases[1]) is not None
    pf.release(cases[1])
    assert not llm.case_dir(tmp_path, cases[0]).exists()
    for c in cases[2:]:
        assert pf.take(c) is not None
        pf.release(c)
    assert pf.summary()["completed"] == 6 and pf.summary()["seconds"] == 3.0
    assert most[0] == 1  # never two jobs at once: the budget held one job's memory
    pf.close()
    assert list(tmp_path.iterdir()) == []
    pool.shutdown()


def test_a_case_is_taken_when_its_job_marks_it_while_the_job_goes_on(tmp_path):
    cases = llm.plan(cfg(quick=True)).cases[:2]  # one weight, N = 16 and 64
    pool = ThreadPoolExecutor(1)
    gate = threading.Event()

    def job(j):
        first = {"seconds": 0.25, "errors": {}, "specs": {"sparsegen": "spec-16"}}
        prefetch.mark_done(j.cache_dir, j.cases[0].key, first)
        gate.wait(10)  # the N = 64 part still compiling
        return {j.cases[0].key: first, j.cases[1].key: {"seconds": 0.75, "errors": {}, "specs": {}}}

    pf = llm.Prefetcher(cases, tmp_path, "sm_90", 1, pool=pool, memory=1e18, disk=1e15, job_fn=job)
    future = next(iter(pf.jobs.values()))[0]
    assert pf.take(cases[0]) == {"seconds": 0.25, "errors": {}, "specs": {"sparsegen": "spec-16"}}
    assert not future.done()  # taken from the mark, the job still running
    pf.release(cases[0])
    assert llm.case_dir(tmp_path, cases[0]).is_dir()
    gate.set()
    assert pf.take(cases[1])["seconds"] == 0.75  # no mark: the job's own result
    pf.release(cases[1])
    assert pf.summary()["completed"] == 2 and not llm.case_dir(tmp_path, cases[0]).exists()
    pf.close()
    pool.shutdown()


def test_a_mark_of_another_case_or_a_damaged_one_is_not_taken(tmp_path):
    prefetch.mark_done(tmp_path, ("w", "float16", 16), {"seconds": 1.0})
    assert prefetch.marked(tmp_path, ("w", "float16", 16)) == {"seconds": 1.0}
    assert prefetch.marked(tmp_path, ("w", "float16", 64)) is None
    prefetch._mark(tmp_path, ("w", "float16", 64)).write_text('{"key": "(\'w\', \'float16\', 64)", "res')
    assert prefetch.marked(tmp_path, ("w", "float16", 64)) is None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_prefetcher_disk_budget_and_outstanding_limit(tmp_path):
    cases = llm.plan(cfg(quick=True)).cases
    pool = ThreadPoolExecutor(4)
    pf = llm.Prefetcher(cases, tmp_path, None, 2, pool=pool, memory=1e18, disk=1e18, job_fn=fake_job)
    assert len(pf.jobs) <= 2 * 2
    disk = llm.job_disk(cases[0]) * 1.5
    pf2 = llm.Prefetcher(cases, tmp_path / "b", None, 2, pool=pool, memory=1e18, disk=disk, job_fn=fake_job)
    assert len(pf2.jobs) == 1
    for p in (pf, pf2):
        p.close()
    pool.shutdown()


class BrokenPool:
    def submit(self, fn, job):
        from concurrent.futures.process import BrokenProcessPool

        f = Future()
        f.set_exception(BrokenProcessPool("a worker died (out of memory?)"))
        return f

    def shutdown(self, **kw):
        pass


def test_prefetcher_broken_pool_turns_itself_off(tmp_path):
    cases = llm.plan(cfg(quick=True)).cases[:3]
    pf = llm.Prefetcher(cases, tmp_path, None, 1, pool=BrokenPool(), memory=1e18, disk=1e18)
    assert pf.take(cases[0]) is None
    assert "compiling ahead stopped" in pf.note
    assert pf.take(cases[1]) is None and pf.stats["failed"] == 1
    pf.close()


def test_run_uses_the_prefetcher(tmp_path, small_weights):
    made = {}

    def factory(cases, root, arch):
        made["pf"] = llm.Prefetcher(cases, root, arch, 2, pool=ThreadPoolExecutor(2), memory=1e18,
                                    disk=1e18, job_fn=lambda job: {c.key: {"seconds": 1.0} for c in job.cases})
        return made["pf"]

    ex = FakeExecutor()
    doc = llm.run(cfg(quick=True, shapes=((7168, 7168),), sparsities=(0.5, 0.7)), env=ENV,
                  executor=ex, emit=lambda s: None, prefetch_factory=factory, scratch=tmp_path)
    assert doc["prefetch"]["completed"] == 4 and all(c["prefetch_s"] == 1.0 for c in doc["cases"])
    assert made["pf"].pool is None                     # closed
    made["pf"].jobs.clear()


def test_each_case_records_where_its_seconds_went(small_weights):
    ticks = iter(range(0, 10_000, 5))  # every clock reading 5 s after the last
    lines = []
    doc = llm.run(cfg(quick=True, shapes=((7168, 7168),), sparsities=(0.5,)), env=ENV,
                  executor=FakeExecutor(), emit=lines.append, clock=lambda: float(next(ticks)))
    first, second = doc["cases"]
    assert set(first["wall_s"]) == {"load", "wait", "measure"}
    assert first["wall_s"]["load"] == 5.0 and second["wall_s"]["load"] == 0.0  # W is made once
    assert first["wall_s"]["measure"] == 5.0
    assert "wall load 5.0s wait 5.0s measure 5.0s" in lines[-2]


def test_worker_compiles_what_the_parent_finds_warm(tmp_path, monkeypatch):
    """A real spawned worker process compiles both N of a weight: its plans land where the parent's
    compile() hits them, and the N share one encoding per family."""
    import sparsegen
    from sparsegen.cache import Cache

    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "user-cache"))
    monkeypatch.setattr(llm.Weight, "load", lambda self: weights.random_weight(256, 512, 0.7, self.seed))
    w = llm.Weight("opt/256x512/0.7", "opt", 256, 512, 0.7)
    cases = [llm.Case(w, "float16", 16), llm.Case(w, "float16", 8)]
    pf = llm.Prefetcher(cases, tmp_path / "scratch", "sm_90", 1, cubin=False)
    try:
        results = [pf.take(c) for c in cases]
    finally:
        pf_pool_alive = pf.pool is not None
    assert pf_pool_alive and all(r is not None and "sparsegen" in r["specs"] for r in results), results
    folder = llm.case_dir(tmp_path / "scratch", cases[0])
    assert folder == llm.case_dir(tmp_path / "scratch", cases[1])
    A = weights.as_dtype(weights.random_weight(256, 512, 0.7, w.seed), "float16")
    for case, res in zip(cases, results):
        # the worker tried every forced family not selected (errors there are the families' own)
        selected = res["specs"]["sparsegen"].split(".")[0]
        assert set(res["specs"]) | set(res["errors"]) == {"sparsegen", *llm.compile_requests(selected)}
        with prefetch.cache_dir(folder):
            k = sparsegen.compile(A, n=case.n, dtype="float16", arch="sm_90", backend="emulate")
            assert k.timings.cached.get("plan") is True and k.spec.name == res["specs"]["sparsegen"]
            for fam in llm.compile_requests(k.spec.family):
                if fam in res["specs"]:
                    kf = sparsegen.compile(A, n=case.n, dtype="float16", arch="sm_90", backend="emulate",
                                           options={"family": fam})
                    assert kf.timings.cached.get("plan") is True and kf.spec.name == res["specs"][fam]
    from sparsegen.families import FAMILIES

    encoded = {name.split(".")[0] for r in results for name in r["specs"].values()}
    encoded = {f for f in encoded if hasattr(FAMILIES[f].module, "encoding")}  # the tiles, the dense W
    assert encoded and len(Cache(folder).entries("format")) == len(encoded)  # one per family, both N
    assert not (tmp_path / "user-cache").exists()       # nothing went into the user's cache
    pf.release(cases[0])
    assert folder.exists()
    pf.release(cases[1])
    pf.close()
    assert not folder.exists()


def test_cache_dir_context_restores(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", "/before")
    with prefetch.cache_dir(tmp_path):
        import os
        assert os.environ["SPARSEGEN_CACHE_DIR"] == str(tmp_path)
    assert __import__("os").environ["SPARSEGEN_CACHE_DIR"] == "/before"
    monkeypatch.delenv("SPARSEGEN_CACHE_DIR")
    with prefetch.cache_dir(tmp_path):
        pass
    assert "SPARSEGEN_CACHE_DIR" not in __import__("os").environ


def test_clear_stale_keeps_pending_folders(tmp_path):
    cases = llm.plan(cfg(quick=True)).cases[:2]
    keep = llm.case_dir(tmp_path, cases[0])
    keep.mkdir(parents=True)
    stale = tmp_path / "deadbeef"
    stale.mkdir()
    prefetch.clear_stale(tmp_path, [llm.case_dir(tmp_path, c) for c in cases])
    assert keep.exists() and not stale.exists()


# --------------------------------------------------------------------------- tables

def table_case(s, n, vs_cublas, bitmap_vs_csl=1.3, status="ok", source="opt", dtype="float16",
               frac=0.5, shape="7168x7168"):
    ms = {"sparsegen": 1.0, "cublas": vs_cublas, "cusparse": 20.0, llm.BITMAP: 1.0,
          llm.CSL: bitmap_vs_csl}
    return {"id": f"{source}/{shape}/{s:g}", "source": source, "op": "spmm", "dtype": dtype, "n": n,
            "k": None, "shape": [7168, 7168], "nnz": 100, "sparsity": s + 1e-4, "nominal_sparsity": s,
            "row_cov": 0.01, "spec": "x", "reason": "r", "ms": ms, "ms_min": ms, "error": 1e-4,
            "pass": status == "ok", "status": status, "checked_columns": n, "checked_rows": 256,
            "speedup": {"vs_cublas": vs_cublas, "bitmap_vs_csl": bitmap_vs_csl, "vs_cusparse": 20.0},
            "bandwidth_fraction": {"sparsegen": frac, "cublas": 0.8}, "note": None}


def table_cases():
    cs = []
    for s, base in ((0.5, 1.0), (0.7, 1.6), (0.8, 2.5), (0.9, 2.0)):
        for n in (8, 16, 32, 64, 128):
            cs.append(table_case(s, n, base * (2.0 if n == 8 else 1.0), frac=0.4 + n / 1000))
    cs.append(table_case(0.9, 16, 1000.0, status="failed"))          # excluded from geomeans
    cs.append(table_case(0.7, 16, 50.0, source="model"))               # its own table
    cs.append(table_case(0.5, 16, 0.9, shape="9216x9216"))             # breaks the 0.95 floor
    return cs


def test_speedup_table_and_verdicts():
    t = llm_report.speedup_table(table_cases())["float16"]
    assert t["ns"] == [8, 16, 32, 64, 128]
    rows = {s: (vals, g, mn) for s, vals, g, mn in t["rows"]}
    vals, g, mn = rows[0.7]
    assert vals[8] == pytest.approx(3.2) and vals[16] == pytest.approx(1.6)
    assert g == pytest.approx((3.2 * 1.6 ** 3) ** 0.25)                # N 8..64 only, 128 left out
    assert llm_report.verdict(0.7, g, mn) == ("geomean ≥ 1.5×", "yes")
    assert rows[0.9][0][16] == pytest.approx(2.0)                     # the failed case left out
    assert llm_report.verdict(0.9, rows[0.9][1], rows[0.9][2])[1] == "no"    # 2.38 < 3.0
    vals5, g5, mn5 = rows[0.5]
    assert vals5[16] == pytest.approx(math.sqrt(0.9)) and mn5 == pytest.approx(0.9)
    assert llm_report.verdict(0.5, g5, mn5) == ("every case ≥ 0.95×", "no")
    assert llm_report.verdict(0.6, None, None) == ("–", "–")
    model = llm_report.speedup_table(table_cases(), source="model")["float16"]
    assert model["rows"][0][1][16] == pytest.approx(50.0)


def test_bitmap_and_bandwidth_tables():
    cs = table_cases()
    assert llm_report.bitmap_summary(cs)["float16"] == pytest.approx(1.3)
    cs[0]["speedup"]["bitmap_vs_csl"] = 1.3 ** -3                     # 0.5, N=8
    g = llm_report.bitmap_summary(cs)["float16"]
    assert g == pytest.approx(1.3 ** ((12 - 3) / 13))   # 13 cases at 0.5..0.8, N <= 64
    rows = llm_report.bandwidth_table(cs)
    r = {s: cell for _, s, cell in rows}
    assert r[0.7]["sparsegen"] == (pytest.approx(0.4 + 0.024), pytest.approx(0.464))
    assert r[0.7]["cublas"] == (0.8, 0.8) and r[0.7]["cusparse"] == (None, None)
    by_n = llm_report.bandwidth_by_n(cs)["float16"]
    assert by_n[128] == [(0.5, 0.528), (0.7, 0.528), (0.8, 0.528), (0.9, 0.528)]


def test_markdown_order_and_content():
    doc = {"suite": "llm", "gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "cuda": "13.0",
           "revision": None, "date": "2025-01-01", "command": "sparsegen bench llm", "cases": table_cases(),
           "copy_bandwidth": executor.CopyBandwidth(1 << 30, 0.725, 0.7, 30).to_dict(),
           "notes": ["no model given"]}
    md = llm_report.markdown(doc, png_note="matplotlib is not installed")
    i_geo = md.index("## Geomean speedup over cuBLAS")
    i_bm = md.index("## Bitmap ÷ Tiled-CSL")
    i_bw = md.index("## Fraction of the device copy bandwidth")
    i_model = md.index("## Real weights")
    i_cases = md.index("## Per-case results")
    assert i_geo < i_bm < i_bw < i_model < i_cases
    assert "2.962 TB/s" in md and "no model given" in md and "matplotlib is not installed" in md
    geo = md[i_geo:i_bm]
    assert "| 0.7 | 3.20× | 1.60× | 1.60× | 1.60× | 1.60× | **1.90×** | 1.60× | geomean ≥ 1.5× | yes |" in geo
    assert "every case ≥ 0.95× | no |" in geo
    assert "geomean **1.30×** (target ≥ 1.2×: yes)" in md[i_bm:i_bw]
    assert "| float16 | 0.7 | 42 % / 46 % |" in md[i_bw:i_model]
    body = md[i_cases:]
    assert body.count("**FAILED**") == 1
    assert len([l for l in body.splitlines() if l.startswith("| opt/") or l.startswith("| model/")]) == 23
    lines = llm.summary_lines(doc)
    assert any("sparsity 0.7" in l and "yes" in l for l in lines) and "23 cases, 1 failed" in lines[-1]


def test_markdown_cusparse_section_only_when_timed():
    doc = {"suite": "llm", "gpu": "g", "driver": None, "cuda": None, "revision": None, "date": "d",
           "command": "c", "cases": table_cases()}
    md = llm_report.markdown(doc)
    i_bw = md.index("## Fraction of the device copy bandwidth")
    i_cs = md.index("## Geomean speedup over cuSPARSE")
    i_model = md.index("## Real weights")
    assert i_bw < i_cs < i_model
    section = md[i_cs:i_model]
    assert "| 0.7 | 20.00× | 20.00× | 20.00× | 20.00× | 20.00× | **20.00×** | 20.00× |" in section
    # cuBLAS / cuSPARSE over the 17 passing OPT cases at N <= 64: 0.9 / 20 (the 9216 case) to 5.0 / 20
    assert "cuSPARSE itself (N ≤ 64): 0.045–0.250× cuBLAS" in section and "17 cases" in section
    for c in doc["cases"]:  # a --no-cusparse run: no section
        c["ms"]["cusparse"] = None
        c["speedup"]["vs_cusparse"] = None
    assert "over cuSPARSE" not in llm_report.markdown(doc)


def test_write_reports_png(tmp_path):
    pytest.importorskip("matplotlib")
    doc = {"suite": "llm", "gpu": "g", "driver": None, "cuda": None, "revision": None, "date": "d",
           "command": "c", "cases": table_cases()}
    paths = llm.write_reports(doc, tmp_path)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "llm.png" in paths["md"].read_text()


def test_write_reports_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    doc = {"suite": "llm", "gpu": "g", "driver": None, "cuda": None, "revision": None, "date": "d",
           "command": "c", "cases": []}
    paths = llm.write_reports(doc, tmp_path)
    assert paths["png"] is None and (tmp_path / "llm.md").is_file()
    assert "(no passing case)" in (tmp_path / "llm.md").read_text()


# --------------------------------------------------------------------------- CLI

def parser():
    p = argparse.ArgumentParser(prog="sparsegen bench")
    bench.add_arguments(p)
    return p


def test_cli_options_parse():
    a = parser().parse_args(["llm", "--shapes", "7168x7168", "--sparsity", "0.5,0.9", "--model", "m",
                             "--workers", "0", "--no-cusparse", "--dtypes", "bf16", "--n", "8"])
    assert a.shapes == "7168x7168" and a.sparsity == "0.5,0.9" and a.model == "m"
    assert a.workers == 0 and a.no_cusparse
    assert bench.parse_dtypes(a.dtypes) == ("bfloat16",)
    assert bench.get_suite("llm") is llm


def test_bench_run_end_to_end_with_fakes(tmp_path, small_weights, monkeypatch, capsys):
    monkeypatch.setattr(bench, "gpu_environment", lambda: {
        "gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "cuda": "13.0"})
    made = []

    def executor(cusparse=True):
        made.append(cusparse)
        return FakeExecutor()

    monkeypatch.setattr(llm, "GpuExecutor", executor)
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["llm", "--quick", "--shapes", "28672x7168", "--sparsity", "0.5,0.9", "--workers", "0",
            "--no-cusparse", "--out", str(out)]
    assert bench.run(parser().parse_args(argv), argv=["sparsegen", "bench"] + argv) == 0
    printed = capsys.readouterr().out
    assert "[1/4]" in printed and "geomean float16 sparsity 0.9" in printed
    assert made == [False]
    doc = json.loads((out / "llm.json").read_text())
    assert len(doc["cases"]) == 4 and doc["settings"]["shapes"] == ["28672x7168"]
    assert doc["settings"]["cusparse"] is False
    assert (out / "llm.md").is_file()
    # --resume with everything done measures nothing
    monkeypatch.setattr(llm, "GpuExecutor", lambda **kw: pytest.fail("nothing left to run"))
    assert bench.run(parser().parse_args(argv + ["--resume"])) == 0
    assert len(json.loads((out / "llm.json").read_text())["runs"]) == 2
    # a wrong answer: exit status 1
    monkeypatch.setattr(llm, "GpuExecutor", lambda **kw: FakeExecutor(wrong="opt/28672x7168/0.5"))
    assert bench.run(parser().parse_args(argv)) == 1


def test_bench_run_argument_errors(monkeypatch):
    monkeypatch.setattr(bench, "gpu_environment", lambda: pytest.fail("checked before the GPU"))
    with pytest.raises(SparsegenError, match="--shapes"):
        bench.run(parser().parse_args(["llm", "--shapes", "1x2"]))
    with pytest.raises(SparsegenError, match="--sparsity"):
        bench.run(parser().parse_args(["llm", "--sparsity", "0.99"]))
    with pytest.raises(SparsegenError, match="does not run bfloat16"):
        bench.run(parser().parse_args(["dlmc", "--dtypes", "bf16"]))
    with pytest.raises(SparsegenError, match="does not run float32"):
        bench.run(parser().parse_args(["llm", "--dtypes", "fp32"]))
    with pytest.raises(SparsegenError, match="no such filter"):
        bench.run(parser().parse_args(["dlmc", "--shapes", "7168x7168"]))
    with pytest.raises(SparsegenError, match="--workers"):
        bench.run(parser().parse_args(["llm", "--workers", "-1"]))


def test_gpu_executor_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SparsegenError, match="needs PyTorch with CUDA"):
        llm.GpuExecutor()


def test_module_imports_without_torch():
    import subprocess

    code = ("import sys, sparsegen.bench.llm; "
            "bad = [m for m in ('torch', 'cupy', 'matplotlib', 'pycuda') if m in sys.modules]; "
            "assert not bad, bad")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stderr


def test_order_key_matches_plan_order(model_dir):
    d, _ = model_dir
    work = llm.plan(cfg(model=str(d), ns=(64, 8), sparsities=(0.9, 0.5),
                        dtypes=("bfloat16", "float16")))
    keys = [llm.order_key(c) for c in work.cases]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert [(c.dtype, c.n) for c in work.items[0][1]] == [("float16", 8), ("float16", 64),
                                                          ("bfloat16", 8), ("bfloat16", 64)]
    case = work.cases[5]
    rec = llm.base_record(case, {"shape": [case.weight.rows, case.weight.cols]})
    assert llm.order_key(rec) == llm.order_key(case)


def test_resumed_slices_accumulate(tmp_path, small_weights):
    first = llm.run(cfg(quick=True, workers=0, sparsities=(0.9,)), env=ENV, executor=FakeExecutor(),
                    emit=lambda s: None, scratch=tmp_path)
    assert len(first["cases"]) == 4 and not first["truncated"]
    saved = json.loads(llm.write_json(first, tmp_path / "r").read_text())
    second = llm.run(cfg(quick=True, workers=0, shapes=((7168, 7168),), sparsities=(0.5, 0.7)),
                     env=ENV, executor=FakeExecutor(), emit=lambda s: None, previous=saved,
                     scratch=tmp_path)
    assert second["cases_planned"] == 4 + 4 and len(second["cases"]) == 8
    assert not second["truncated"]
    assert [(c["id"], c["n"]) for c in second["cases"]] == [
        ("opt/28672x7168/0.9", 16), ("opt/28672x7168/0.9", 64),
        ("opt/7168x7168/0.5", 16), ("opt/7168x7168/0.5", 64),
        ("opt/7168x7168/0.7", 16), ("opt/7168x7168/0.7", 64),
        ("opt/7168x7168/0.9", 16), ("opt/7168x7168/0.9", 64)]


def _timed(id_, n, family, **ms):
    return {"id": id_, "n": n, "family": family, "status": "ok", "source": "opt", "dtype": "float16", "ms": ms}


def test_selection_quality_counts_the_floor_and_the_five_percent_band_on_both_sides():
    from sparsegen.bench import llm_report

    cases = [
        _timed("a", 8, "tiled_csl_spmm", sparsegen=1.0, tiled_csl_spmm=1.0, tiled_bitmap_spmm=0.953, cublas=2.0),
        _timed("b", 8, "tiled_csl_spmm", sparsegen=1.0, tiled_csl_spmm=1.0, tiled_bitmap_spmm=0.95, cublas=2.0),
        _timed("c", 16, "dense_gemm", sparsegen=1.0, tiled_csl_spmm=None, tiled_bitmap_spmm=None, cublas=0.97),
        _timed("d", 16, "dense_gemm", sparsegen=1.0, cublas=0.969),
        _timed("e", 16, "dense_gemm", sparsegen=None, cublas=1.0),  # not timed: not counted
        _timed("f", 8, "tiled_bitmap_spmm", sparsegen=1.0, tiled_bitmap_spmm=1.0, tiled_lanes_spmm=0.9, cublas=2.0),
    ]
    n, floor, least, near, misses = llm_report.selection_quality(cases)["float16"]
    assert (n, floor, near) == (5, 4, 3)  # d is 1.0 / 0.969 = 1.032x the fastest: inside 5 %, under 0.97x
    assert least == pytest.approx(0.969)
    assert [(i, m, fam) for i, m, fam, _ in misses] == [("b", 8, "tiled_csl_spmm"), ("f", 8, "tiled_bitmap_spmm")]
    assert misses[0][3] == pytest.approx(1 / 0.95)
    md = "\n".join(llm_report._selection_section(cases))
    assert "selected ≥ 0.97× cuBLAS in **4 / 5** cases" in md and "in **3 / 5** (60.0%)" in md
    assert "- miss: f N=8 tiled_bitmap_spmm: 1.111× the fastest" in md  # forced tiled lanes ran faster
    assert "- miss: b N=8 tiled_csl_spmm: 1.053× the fastest" in md


def test_compile_ahead_builds_the_contenders_the_gpu_will_time():
    """A near tie on the default device: the worker compiles each contender with the options the
    measuring process's compile() will ask for, so that timing them finds every plan cached."""
    from types import SimpleNamespace

    from sparsegen.bench import llm
    from sparsegen.select.device import DeviceModel

    from .helpers import random_csr

    from .tiled_helpers import pinned_library

    a = random_csr(4096, 4096, 0.1, seed=1)
    case = SimpleNamespace(n=16, dtype="float16")
    job = SimpleNamespace(arch="sm_90", device=DeviceModel.default(), cubin=False)
    with pinned_library(None):  # the near tie is between the tile families: no dense binding, as without torch
        out = llm.compile_case(a, case, job)
    assert out["errors"] == {}
    assert {"family=tiled_csl_spmm", "family=tiled_bitmap_spmm,granule=1",
            "family=tiled_bitmap_spmm,granule=2"} <= set(out["specs"])
    assert out["specs"]["family=tiled_bitmap_spmm,granule=2"].endswith(".g2")
    assert {"sparsegen", "tiled_bitmap_spmm"} <= set(out["specs"]) and "tiled_csl_spmm" not in out["specs"]  # selected
