"""`compile(..., tune=True)`: measured choice among the accepting families, cached by structure."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sparsegen
from sparsegen import tune
from sparsegen.cache import Cache

from .helpers import random_csr, reference, rel_error


def test_emulator_falls_back_to_the_rule_table_with_a_warning():
    a = random_csr(50, 60, 0.1, seed=1)
    with pytest.warns(RuntimeWarning, match="tune=True measures on the GPU"):
        k = sparsegen.compile(a, n=8, backend="emulate", tune=True)
    assert k.spec == sparsegen.compile(a, n=8, backend="emulate").spec
    assert k.tuning == ()


def test_candidates_are_every_callable_family_or_the_requested_one():
    req = sparsegen.api._request("spmm", 8, None, "float32", "sm_90", None, False, None, "nonzero", None)
    names = tune.candidate_families(req)
    assert "csr_rowsplit" in names and "sputnik_spmm" in names and "spdnn_sliced_ell" not in names
    forced = sparsegen.api._request("spmm", 8, None, "float32", "sm_90", None, False, None, "nonzero",
                                    {"family": "csr_rowsplit"})
    assert tune.candidate_families(forced) == ["csr_rowsplit"]


def test_bitmap_offers_both_encodings_unless_one_is_asked_for():
    req = sparsegen.api._request("spmm", 16, None, "float16", "sm_90", None, False, None, "nonzero", None)
    bitmap = [v for f, v in tune.candidates(req) if f == "tiled_bitmap_spmm"]
    assert bitmap == [{"granule": 1}, {"granule": 2}]
    assert all(v == {} for f, v in tune.candidates(req) if f != "tiled_bitmap_spmm")
    fixed = sparsegen.api._request("spmm", 16, None, "float16", "sm_90", None, False, None, "nonzero",
                                   {"family": "tiled_bitmap_spmm", "granule": 2})
    assert tune.candidates(fixed) == [("tiled_bitmap_spmm", {})]
    assert tune.variant_label({"granule": 2, "a": 1}) == "a=1,granule=2"


def test_sputnik_offers_row_splits_in_float32_unless_one_is_asked_for():
    req = sparsegen.api._request("spmm", 128, None, "float32", "sm_90", None, False, None, "nonzero", None)
    sputnik = [v for f, v in tune.candidates(req) if f == "sputnik_spmm"]
    assert sputnik == [{}, {"ksplit": 4}, {"ksplit": 8}]
    half = sparsegen.api._request("spmm", 128, None, "float16", "sm_90", None, False, None, "nonzero", None)
    assert [v for f, v in tune.candidates(half) if f == "sputnik_spmm"] == [{}]
    for fixed in ({"ksplit": 2}, {"balance": 1}, {"piece": 64}):
        req = sparsegen.api._request("spmm", 128, None, "float32", "sm_90", None, False, None, "nonzero",
                                     {"family": "sputnik_spmm", **fixed})
        assert tune.candidates(req) == [("sputnik_spmm", {})]


def test_variants_that_compile_to_a_spec_already_built_are_timed_once(monkeypatch):
    """The rule's own split among the variants (a 512-row layer splits 8 ways at n = 128): no second trial."""
    from sparsegen import runtime

    a = random_csr(512, 2048, 0.2, seed=4)
    monkeypatch.setattr(runtime, "current_arch", lambda: "sm_90")
    timed = []
    monkeypatch.setattr(tune, "time_kernel", lambda kern, runs=tune.RUNS: timed.append(kern.spec.name) or 1.0)
    calls = []

    def compile_with(options):
        calls.append(options)
        return sparsegen.compile(a, n=128, backend="emulate", options=options)

    req = sparsegen.api._request("spmm", 128, None, "float32", "sm_90", None, False, None, "nonzero",
                                 {"family": "sputnik_spmm"})
    monkeypatch.setattr(tune, "Cache", lambda: Cache(active=False))
    kern = tune.tuned(a, req, "gpu", compile_with)
    assert len(calls) == 3 and len(timed) == len(set(timed)) == 2  # {} and ksplit=8 are one spec
    assert kern.spec.family == "sputnik_spmm"


def test_tune_key_ignores_values_and_the_family_option_but_not_n():
    a = random_csr(50, 60, 0.1, seed=2)
    b = a.copy()
    b.data = b.data * 3
    req = sparsegen.api._request("spmm", 8, None, "float32", "sm_90", None, False, None, "nonzero", None)
    req16 = sparsegen.api._request("spmm", 16, None, "float32", "sm_90", None, False, None, "nonzero", None)
    assert tune.tune_key(a, req) == tune.tune_key(b, req)
    assert tune.tune_key(a, req) != tune.tune_key(a, req16)


@pytest.mark.gpu
def test_tune_times_every_family_keeps_the_fastest_and_caches_it():
    a = random_csr(3000, 2048, 0.1, seed=3)
    k = sparsegen.compile(a, n=128, backend="gpu", tune=True)
    assert len(k.tuning) >= 2
    splits = {t.spec for t in k.tuning if t.family == "sputnik_spmm"}
    assert len(splits) >= 2  # the rule's row split and at least one of ksplit 4 / 8 (float32)
    best = min(k.tuning, key=lambda t: t.ms)
    assert k.spec.family == best.family and k.spec.name == best.spec
    again = sparsegen.compile(a, n=128, backend="gpu", tune=True)
    assert again.tuning == k.tuning  # read from the cache, not re-measured
    # stored under the request as asked (the winner's own request carries its family and variant)
    asked = sparsegen.api._request("spmm", 128, None, "float32", k.request.arch, None, False, None, "nonzero", None)
    asked = dataclasses.replace(asked, device=k.request.device)  # the GPU in use, which the key holds
    assert Cache().get("tune", tune.tune_key(a, asked)) is not None
    x = np.random.default_rng(0).standard_normal((2048, 128)).astype(np.float32)
    assert rel_error(again(x), reference(a, x)) <= 1e-5


def test_timed_candidates_read_w_from_dram_as_the_calibration_does(monkeypatch):
    pytest.importorskip("torch")  # without it a candidate is timed by back-to-back batches, L2 warm
    from sparsegen.bench import timing

    asked = {}

    def fake_time_cuda(fn, **kw):
        fn()
        asked.update(kw)
        return {"median_ms": 0.5}

    calls = []
    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    monkeypatch.setattr(tune, "random_operands", lambda kernel: ((1, 2), "y"))
    assert tune.time_kernel(lambda *args, out: calls.append((args, out)), runs=7) == 0.5
    assert asked == {"min_runs": 7, "min_ms": tune.SPIN_TIMED_MS, "flush_l2": True} and calls == [((1, 2), "y")]
