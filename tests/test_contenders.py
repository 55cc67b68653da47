"""The candidates the cost model cannot tell apart (`Selection.contenders`), and compile() timing them
on the GPU by default (docs/decisions/004-measured-contenders.md)."""
from __future__ import annotations

import json

import pytest

import sparsegen
from sparsegen import api, tune
from sparsegen.analyze import analyze
from sparsegen.cache import Cache
from sparsegen.select import Selection, select
from sparsegen.select.device import DeviceModel
from sparsegen.select.ratesfile import Errors
from sparsegen.select.skinny_cost import Comparison, Prediction

from .helpers import random_csr

CSL, BITMAP, DENSE = "tiled_csl_spmm", "tiled_bitmap_spmm", "dense_gemm"
ERRORS = Errors(tiled_csl_spmm=0.06, tiled_bitmap_spmm=0.04, tiled_bitmap_spmm_g2=0.05, csr=0.2)


def comparison(*predictions) -> Comparison:
    ordered = tuple(sorted(predictions, key=lambda p: p.seconds))
    return Comparison(ordered, "spread", ERRORS, "test.json")


def families(c: Comparison) -> list:
    return [p.family for p in c.contenders()]


def test_dense_is_a_contender_within_the_sparse_error_and_not_past_it():
    sparse = Prediction(CSL, "Tiled-CSL", 100e-6, CSL)
    inside = Prediction(DENSE, "dense", 105.9e-6, DENSE)  # 100 * (1 + 0.06) = 106
    outside = Prediction(DENSE, "dense", 106.1e-6, DENSE)
    assert families(comparison(sparse, inside)) == [CSL, DENSE]
    assert comparison(sparse, outside).contenders() == ()


def test_two_sparse_candidates_are_contenders_within_the_sum_of_their_errors():
    csl = Prediction(CSL, "Tiled-CSL", 100e-6, CSL)
    g2_inside = Prediction(BITMAP, "bitmap", 110.9e-6, BITMAP + ".g2")  # 100 * (1 + 0.06 + 0.05) = 111
    g2_outside = Prediction(BITMAP, "bitmap", 111.1e-6, BITMAP + ".g2")
    assert families(comparison(csl, g2_inside)) == [CSL, BITMAP]
    assert comparison(csl, g2_outside).contenders() == ()


def test_the_band_is_measured_from_the_fastest_prediction_and_csr_is_never_a_contender():
    g1 = Prediction(BITMAP, "bitmap", 100e-6, BITMAP)  # error 0.04
    dense = Prediction(DENSE, "dense", 103e-6, DENSE)  # inside 4 %
    csl = Prediction(CSL, "Tiled-CSL", 109e-6, CSL)  # inside 4 + 6 %
    csr = Prediction("csr", "CSR kernels", 100.5e-6, "csr")
    assert families(comparison(g1, dense, csl, csr)) == [BITMAP, DENSE, CSL]
    assert comparison(Prediction(CSL, "Tiled-CSL", 1e-4, CSL), csr).contenders() == ()


def _fp16_request(n: int, options=None):
    request = api._request("spmm", n, None, "float16", "sm_90", None, False, None, "nonzero", options)
    import dataclasses

    return dataclasses.replace(request, device=DeviceModel.default())


@pytest.fixture(scope="module")
def near_tie_weight():
    a = random_csr(4096, 4096, 0.1, seed=1)
    return a, analyze(a)


@pytest.fixture
def near_tie(near_tie_weight):
    """A uniform 4096 x 4096 weight at 10 %, N = 16: on the default device's rates Tiled-CSL and
    bitmap are predicted within their errors of each other, with no dense binding (as without torch
    or CuPy: with one, dense cuBLAS joins the tie)."""
    from .tiled_helpers import pinned_library

    with pinned_library(None):
        yield near_tie_weight


def test_a_near_tie_lists_every_variant_to_time(near_tie):
    _, stats = near_tie
    s = select(stats, "spmm", n=16, dtype="float16", device=DeviceModel.default())
    assert s.spec.family == CSL
    assert [dict(c) for c in s.contenders] == [{"family": CSL}, {"family": BITMAP, "granule": 1},
                                                {"family": BITMAP, "granule": 2}]


def test_a_forced_family_or_a_fixed_encoding_narrows_the_contenders(near_tie):
    _, stats = near_tie
    forced = select(stats, "spmm", n=16, dtype="float16", device=DeviceModel.default(),
                    options=(("family", CSL),))
    assert forced.contenders == ()
    fixed = select(stats, "spmm", n=16, dtype="float16", device=DeviceModel.default(), options=(("granule", 2),))
    assert [dict(c) for c in fixed.contenders] == [{"family": CSL}, {"family": BITMAP}]


def test_float32_selections_have_no_contenders():
    a = random_csr(512, 512, 0.05, seed=3)
    assert select(analyze(a), "spmm", n=32, dtype="float32", device=DeviceModel.default()).contenders == ()


def test_contenders_survive_the_plan_cache_round_trip(near_tie):
    _, stats = near_tie
    s = select(stats, "spmm", n=16, dtype="float16", device=DeviceModel.default())
    again = Selection.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again.contenders == s.contenders and again == s


@pytest.mark.parametrize("tune_arg, backend, count, env, expected", [
    (None, "gpu", 2, None, True),
    (None, "gpu", 2, "off", False),
    (None, "gpu", 2, "0", False),
    (None, "gpu", 2, "on", True),
    (None, "gpu", 0, None, False),
    (None, "emulate", 2, None, False),
    (False, "gpu", 2, None, False),
    (True, "gpu", 2, None, False),  # tune=True times every family instead
])
def test_when_compile_times_the_contenders(monkeypatch, tune_arg, backend, count, env, expected):
    if env is None:
        monkeypatch.delenv(tune.ENV_TUNE, raising=False)
    else:
        monkeypatch.setenv(tune.ENV_TUNE, env)
    sel = Selection(spec=None, reason="", rule="r", contenders=((("family", CSL),), (("family", DENSE),))[:count])
    assert tune.measures_contenders(tune_arg, backend, sel) is expected


def test_tuned_times_only_the_contenders_and_the_winner_says_so(monkeypatch, near_tie):
    a, _ = near_tie
    model = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", device=DeviceModel.default())
    times = {CSL: 2.0, BITMAP: 1.0}  # bitmap measured faster than the model's Tiled-CSL
    timed = []

    def fake_time(kern, runs=tune.RUNS):
        timed.append((kern.spec.family, kern.spec.granule if kern.spec.family == BITMAP else None))
        return times[kern.spec.family] + (0.5 if timed[-1][1] == 2 else 0.0)

    monkeypatch.setattr(tune, "time_kernel", fake_time)
    monkeypatch.setattr(tune, "Cache", lambda: Cache(active=False))

    def compile_with(options):
        return sparsegen.compile(a, n=16, dtype="float16", backend="emulate", device=DeviceModel.default(),
                                 options=options)

    kern = tune.tuned(a, model.request, "gpu", compile_with, model.selection.contenders, model.selection)
    assert timed == [(CSL, None), (BITMAP, 1), (BITMAP, 2)]
    assert kern.spec.family == BITMAP and kern.spec.granule == 1
    assert kern.selection.rule == "measured"
    assert kern.selection.reason.startswith("measured fastest of the contenders the model could not tell apart")
    assert f"the model chose {CSL}" in kern.selection.reason
    assert kern.selection.contenders == model.selection.contenders
    assert [t.ms for t in kern.tuning] == [2.0, 1.0, 1.5]


def test_compile_hands_the_contenders_to_tuned_on_the_gpu_path(monkeypatch, near_tie):
    """compile() with tune=None: the model's kernel first, then `tuned` with its contenders and the
    structure already hashed (the matrix is hashed once)."""
    a, _ = near_tie
    monkeypatch.setattr(tune, "measures_contenders", lambda t, backend, sel: t is None and len(sel.contenders) > 1)
    seen = {}

    def fake_tuned(csr, request, backend, compile_with, variants=None, model=None, structure=None):
        seen.update(variants=variants, model=model, structure=structure, request=request)
        return compile_with(dict(variants[-1]))

    monkeypatch.setattr(tune, "tuned", fake_tuned)
    hashes = []
    real = api._hashes
    monkeypatch.setattr(api, "_hashes", lambda csr: hashes.append(1) or real(csr))
    kern = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", device=DeviceModel.default())
    assert seen["variants"] == seen["model"].contenders and len(seen["variants"]) == 3
    assert seen["structure"] == kern.structure_hash
    assert kern.spec.family == BITMAP and kern.spec.granule == 2  # what compile_with built, forced
    assert len(hashes) == 1
    none = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", device=DeviceModel.default(), tune=False)
    assert none.spec.family == CSL and none.selection.rule != "measured"


def test_tune_rejects_what_is_not_a_bool_or_none():
    with pytest.raises(sparsegen.SparsegenError, match="tune: expected None, True or False, got 'auto'"):
        sparsegen.compile(random_csr(8, 8, 0.5, seed=0), n=4, backend="emulate", tune="auto")


@pytest.mark.gpu
def test_on_the_gpu_the_fastest_contender_is_kept_and_cached(monkeypatch):
    """A near tie on this GPU's rates: every contender is timed, the fastest kept, the answer right,
    and a second compile reads the choice back instead of timing again."""
    import numpy as np

    from .helpers import reference, rel_error

    monkeypatch.delenv(tune.ENV_TUNE, raising=False)
    device = DeviceModel.current()
    for density, n in ((0.1, 16), (0.3, 16), (0.1, 8), (0.5, 64), (0.3, 64)):
        a = random_csr(4096, 4096, density, seed=1)
        model = select(analyze(a), "spmm", n=n, dtype="float16", device=device)
        if model.contenders:
            break
    else:
        pytest.skip(f"no near tie among the probed weights on {device.name}'s rates")
    kern = sparsegen.compile(a, n=n, dtype="float16", backend="gpu")
    assert kern.selection.rule == "measured" and kern.selection.contenders == model.contenders
    assert len(kern.tuning) >= 2 and {t.family for t in kern.tuning} == {dict(c)["family"] for c in model.contenders}
    best = min(kern.tuning, key=lambda t: t.ms)
    assert kern.spec.name == best.spec
    again = sparsegen.compile(a, n=n, dtype="float16", backend="gpu")
    assert again.tuning == kern.tuning and again.spec.name == kern.spec.name
    x = np.random.default_rng(0).standard_normal((4096, n)).astype(np.float16)
    assert rel_error(again(x).astype(np.float64), reference(a, x.astype(np.float64))) <= 2e-2
    kept = sparsegen.compile(a, n=n, dtype="float16", backend="gpu", tune=False)
    assert kept.spec.family == model.spec.family and kept.tuning == ()
